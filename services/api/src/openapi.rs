//! The OpenAPI 3 document, generated from the handlers' annotations.

use actix_web::HttpResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::handlers::{
    audit, bindings, enrollment, health, job_logs, jobs, nodes, tenants, tokens, usage, users,
    volumes,
};
use crate::signin;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Allot API", description = "Multi-tenant GPU cluster control plane."),
    paths(
        health::healthz, health::readyz,
        tenants::create, tenants::list, tenants::get, tenants::delete, tenants::get_quota, tenants::set_quota, tenants::patch_quota,
        tenants::get_policy, tenants::set_policy,
        tenants::get_job_limits, tenants::set_job_limits, tenants::patch_job_limits,
        tenants::list_credentials, tenants::set_credential, tenants::delete_credential,
        tenants::list_secrets, tenants::set_secret, tenants::delete_secret,
        volumes::list, volumes::put, volumes::delete,
        jobs::submit, jobs::list, jobs::get, jobs::cancel, job_logs::log, jobs::samples, jobs::resize, usage::usage,
        nodes::list, nodes::get, nodes::label, nodes::cordon, nodes::uncordon, nodes::drain, nodes::drain_gpu,
        nodes::return_gpu, nodes::samples, enrollment::revoke_node, enrollment::create, enrollment::list,
        enrollment::delete,
        tokens::create, tokens::list, tokens::get, tokens::revoke,
        audit::key, audit::logs, audit::entries, audit::checkpoint, audit::export, audit::inclusion,
        audit::consistency, audit::search, audit::holds, audit::evidence, audit::set_hold,
        audit::release_hold,
        audit::prune,
        users::list, users::get, users::delete,
        bindings::create, bindings::list, bindings::get, bindings::revoke,
        signin::login, signin::callback, signin::whoami, signin::logout, signin::dev_page,
        signin::dev_sign_in,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "tenants", description = "Tenants and their quotas"),
        (name = "jobs", description = "Submit, inspect and cancel jobs"),
        (name = "nodes", description = "Nodes and their GPUs"),
        (name = "volumes", description = "Named volumes: shared storage jobs mount by name"),
        (name = "tokens", description = "API tokens for automation"),
        (name = "access", description = "Users who sign in through the identity provider, and the roles granted to them or to their claims"),
        (name = "audit", description = "The tamper-evident audit logs, checkpoints and proofs"),
        (name = "health", description = "Liveness and readiness"),
        (name = "sign-in", description = "Web sign-in through the OpenID Connect provider, sessions and sign-out"),
    )
)]
pub struct ApiDoc;

/// The document as served: the handlers' annotations, plus what every operation can
/// answer whatever its handler does, so that a client generated from it (or a fuzzer
/// checking answers against it) is never surprised — problems as
/// `application/problem+json`; 401, 403 and 429 wherever a bearer token is needed; 400
/// wherever there are parameters or a body; 413, 415 and 422 wherever there is a body.
pub fn document() -> serde_json::Value {
    use serde_json::{Value, json};
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or(Value::Null);
    let problem = || {
        json!({ "application/problem+json": {
            "schema": { "$ref": "#/components/schemas/Problem" } } })
    };
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return doc;
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        let path_params = item.get("parameters").is_some();
        for (method, op) in item.iter_mut() {
            if !["get", "put", "post", "delete", "patch"].contains(&method.as_str()) {
                continue;
            }
            let secured = op
                .get("security")
                .is_some_and(|s| s.as_array().is_some_and(|a| !a.is_empty()));
            let params = path_params
                || op
                    .get("parameters")
                    .is_some_and(|p| p.as_array().is_some_and(|a| !a.is_empty()));
            let body = op.get("requestBody").is_some();
            let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
                continue;
            };
            for r in responses.values_mut() {
                let is_problem = r
                    .pointer("/content/application~1json/schema/$ref")
                    .and_then(Value::as_str)
                    == Some("#/components/schemas/Problem");
                if is_problem {
                    r["content"] = problem();
                }
            }
            let mut add = |code: &str, description: &str| {
                responses
                    .entry(code.to_owned())
                    .or_insert_with(|| json!({ "description": description, "content": problem() }));
            };
            if secured {
                add("401", "no valid credential");
                add("403", "the policies do not permit this");
                add("429", "too many failed authentications from this client");
            }
            if params || body {
                add("400", "a malformed parameter or body");
            }
            if params || body {
                add(
                    "422",
                    "well-formed, but not valid here (a cross-field rule, or beyond what exists)",
                );
            }
            if body {
                add("413", "the body is too large");
                add("415", "the body is not JSON");
            }
        }
    }
    doc
}

/// `GET /api/v1/openapi.json`
pub async fn serve() -> HttpResponse {
    HttpResponse::Ok().json(document())
}
