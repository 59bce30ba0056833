//! The OpenAPI 3 document, generated from the handlers' annotations.

use actix_web::HttpResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::handlers::{
    audit, bindings, enrollment, health, jobs, nodes, tenants, tokens, usage, users, volumes,
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
        tenants::create, tenants::list, tenants::get, tenants::get_quota, tenants::set_quota,
        tenants::get_policy, tenants::set_policy,
        tenants::list_credentials, tenants::set_credential, tenants::delete_credential,
        tenants::list_secrets, tenants::set_secret, tenants::delete_secret,
        volumes::list, volumes::put, volumes::delete,
        jobs::submit, jobs::list, jobs::get, jobs::cancel, jobs::log, jobs::samples, jobs::resize, usage::usage,
        nodes::list, nodes::get, nodes::cordon, nodes::uncordon, nodes::drain, nodes::drain_gpu,
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

/// `GET /api/v1/openapi.json`
pub async fn serve() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}
