//! The control plane's REST API (actix-web), versioned under `/api/v1`.
//!
//! Handlers translate HTTP to calls on the store's repositories and the [`ControlEvents`] the
//! control plane provides; they hold no business rules of their own beyond authorization.
//! Every error is an RFC 9457 problem (see [`problem`]); the OpenAPI document is generated
//! from the handlers' annotations and served at `/api/v1/openapi.json`.

pub mod admission;
pub mod auth;
pub mod client;
pub mod crypto;
mod denials;
pub mod extract;
mod handlers;
pub mod introspection;
pub mod jwt;
pub mod limiter;
pub mod openapi;
pub mod problem;
pub mod secret;
pub mod signin;
pub mod views;

use std::sync::Arc;

use actix_web::http::Method;
use actix_web::{FromRequest, Handler, HttpRequest, HttpResponse, Responder, ResponseError, web};
use allot_domain::Job;
use allot_store::Store;

pub use denials::record_denials;
pub use extract::BodyLimit;
pub use handlers::audit::{
    AuditLogView, AuditOrder, AuditSearchPage, Evidence, EvidenceFile, readable_logs, search_page,
};
pub use handlers::enrollment::{
    BOOTSTRAP_TOKEN_PREFIX, DEFAULT_BOOTSTRAP_TTL, TokenFor, issue_bootstrap_token,
};
pub use handlers::job_logs::{LogTail, log_tail};
pub use handlers::jobs::{job_view, read_views, unfinished, visible_job};
pub use handlers::tokens::TOKEN_PREFIX;
pub use problem::ApiError;

/// What the API tells the rest of the control plane.
pub trait ControlEvents: Send + Sync + 'static {
    /// A job was submitted: run a scheduling pass soon.
    fn job_submitted(&self);
    /// A scheduled or running job should stop: tell its node.
    fn job_cancel_requested(&self, job: &Job);
    /// A node's certificates were revoked: end its open calls.
    fn node_revoked(&self, node_id: &str);
    /// The ids of jobs whose log grew, or which ended, by what nodes told this replica. A
    /// follower also looks every second, for what was told another replica.
    fn job_logs(&self) -> tokio::sync::broadcast::Receiver<String>;
    /// Resize a running job on shares of GPUs, if the new share fits beside the other jobs
    /// on its GPUs and within its tenant's limits (`Conflict` otherwise), and tell its node.
    /// Serialized with scheduling, so no placement races it for the room.
    fn resize_job(
        &self,
        ctx: allot_domain::AuditContext,
        job: Job,
        share: allot_domain::Share,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Job, ApiError>> + Send + '_>>;
    /// Why this replica is not ready beyond its database (another running replica has its
    /// name), if it is not.
    fn not_ready(&self) -> Option<String> {
        None
    }
}

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// The Cedar policies every action is authorized by.
    pub policies: Arc<allot_authz::Policies>,
    /// Sign audit checkpoints and export manifests (the key in force at the time); their
    /// verifier keys are public.
    pub audit_keys: Arc<allot_audit::SigningKeys>,
    /// Checkpoint origins are `<audit_origin>/<log>`.
    pub audit_origin: String,
    pub events: Arc<dyn ControlEvents>,
    /// Group-commits events that change nothing else (refusals, audit reads and exports),
    /// so a burst of them costs one transaction per log, not one each.
    pub audit_batcher: allot_store::AuditBatcher,
    /// Group-commits submits: a burst of them costs one transaction per tenant.
    pub submits: allot_store::SubmitBatcher,
    /// Reads API tokens in groups: a burst of requests costs one statement per group.
    pub tokens: allot_store::TokenReader,
    /// The fleet submits are admitted against, as this replica last read it.
    pub admission: Arc<admission::Admission>,
    /// Verifies bearer JWTs from the OpenID Connect provider, when one is configured.
    pub jwt: Option<Arc<jwt::JwtVerifier>>,
    /// The tenants as this replica last read them (see [`auth::TenantTrees`]).
    pub tenant_trees: Arc<auth::TenantTrees>,
    /// Failed authentication per client address.
    pub auth_failures: Arc<limiter::FailureLimiter>,
    /// The reverse proxies whose `Forwarded` and `X-Forwarded-For` are believed.
    pub trusted_proxies: client::TrustedProxies,
    /// Web sign-in through the OpenID Connect provider, when configured.
    pub web_sign_in: Option<Arc<signin::WebSignIn>>,
    /// How long sessions (from web or development sign-in) last.
    pub sessions: signin::SessionPolicy,
    /// The development sign-in page (`allot dev` only, on loopback).
    pub dev_sign_in: bool,
}

/// Every route of the API, in one place: [`configure`] serves them and [`route_table`]
/// lists them (the authorization matrix test walks that list, so a route cannot be added
/// without deciding who may call it).
fn routes<R: Routes>(r: &mut R) {
    use Method as M;
    use handlers::{
        audit, bindings, enrollment, job_logs, jobs, nodes, tenants, tokens, usage, users, volumes,
    };
    r.add(M::GET, "/healthz", handlers::health::healthz);
    r.add(M::GET, "/readyz", handlers::health::readyz);
    r.add(M::GET, "/api/v1/openapi.json", openapi::serve);
    r.add(M::GET, "/auth/login", signin::login);
    r.add(M::GET, "/auth/callback", signin::callback);
    r.add(M::GET, "/auth/session", signin::whoami);
    r.add(M::POST, "/auth/logout", signin::logout);
    r.add(M::GET, "/auth/dev", signin::dev_page);
    r.add(M::POST, "/auth/dev", signin::dev_sign_in);
    r.add(M::GET, "/api/v1/audit/key", audit::key);
    r.add(M::GET, "/api/v1/audit/logs", audit::logs);
    r.add(M::GET, "/api/v1/audit/entries", audit::search);
    r.add(M::GET, "/api/v1/audit/holds", audit::holds);
    r.add(M::GET, "/api/v1/audit/evidence", audit::evidence);
    r.add(M::PUT, "/api/v1/audit/logs/{log}/hold", audit::set_hold);
    r.add(
        M::DELETE,
        "/api/v1/audit/logs/{log}/hold",
        audit::release_hold,
    );
    r.add(M::POST, "/api/v1/audit/logs/{log}/prune", audit::prune);
    r.add(M::GET, "/api/v1/audit/logs/{log}/entries", audit::entries);
    r.add(
        M::GET,
        "/api/v1/audit/logs/{log}/checkpoint",
        audit::checkpoint,
    );
    r.add(M::GET, "/api/v1/audit/logs/{log}/export", audit::export);
    r.add(
        M::GET,
        "/api/v1/audit/logs/{log}/proof/inclusion",
        audit::inclusion,
    );
    r.add(
        M::GET,
        "/api/v1/audit/logs/{log}/proof/consistency",
        audit::consistency,
    );
    r.add(M::GET, "/api/v1/tenants", tenants::list);
    r.add(M::POST, "/api/v1/tenants", tenants::create);
    r.add(M::GET, "/api/v1/tenants/{name}", tenants::get);
    r.add(M::DELETE, "/api/v1/tenants/{name}", tenants::delete);
    r.add(M::GET, "/api/v1/tenants/{name}/quota", tenants::get_quota);
    r.add(M::PUT, "/api/v1/tenants/{name}/quota", tenants::set_quota);
    r.add(
        M::PATCH,
        "/api/v1/tenants/{name}/quota",
        tenants::patch_quota,
    );
    r.add(M::GET, "/api/v1/tenants/{name}/policy", tenants::get_policy);
    r.add(M::PUT, "/api/v1/tenants/{name}/policy", tenants::set_policy);
    r.add(
        M::GET,
        "/api/v1/tenants/{name}/job-limits",
        tenants::get_job_limits,
    );
    r.add(
        M::PUT,
        "/api/v1/tenants/{name}/job-limits",
        tenants::set_job_limits,
    );
    r.add(
        M::PATCH,
        "/api/v1/tenants/{name}/job-limits",
        tenants::patch_job_limits,
    );
    r.add(
        M::GET,
        "/api/v1/tenants/{name}/registry-credentials",
        tenants::list_credentials,
    );
    r.add(
        M::PUT,
        "/api/v1/tenants/{name}/registry-credentials/{registry}",
        tenants::set_credential,
    );
    r.add(
        M::DELETE,
        "/api/v1/tenants/{name}/registry-credentials/{registry}",
        tenants::delete_credential,
    );
    r.add(
        M::GET,
        "/api/v1/tenants/{name}/secrets",
        tenants::list_secrets,
    );
    r.add(
        M::PUT,
        "/api/v1/tenants/{name}/secrets/{secret}",
        tenants::set_secret,
    );
    r.add(
        M::DELETE,
        "/api/v1/tenants/{name}/secrets/{secret}",
        tenants::delete_secret,
    );
    r.add(M::GET, "/api/v1/volumes", volumes::list);
    r.add(M::PUT, "/api/v1/volumes/{name}", volumes::put);
    r.add(M::DELETE, "/api/v1/volumes/{name}", volumes::delete);
    r.add(M::GET, "/api/v1/jobs", jobs::list);
    r.add(M::POST, "/api/v1/jobs", jobs::submit);
    r.add(M::GET, "/api/v1/jobs/{id}", jobs::get);
    r.add(M::POST, "/api/v1/jobs/{id}/cancel", jobs::cancel);
    r.add(M::POST, "/api/v1/jobs/{id}/resize", jobs::resize);
    r.add(M::GET, "/api/v1/jobs/{id}/log", job_logs::log);
    r.add(M::GET, "/api/v1/jobs/{id}/samples", jobs::samples);
    r.add(M::GET, "/api/v1/usage", usage::usage);
    r.add(M::GET, "/api/v1/nodes", nodes::list);
    r.add(M::GET, "/api/v1/nodes/{id}", nodes::get);
    r.add(
        M::GET,
        "/api/v1/nodes/{id}/gpus/{uuid}/samples",
        nodes::samples,
    );
    r.add(M::POST, "/api/v1/nodes/{id}/cordon", nodes::cordon);
    r.add(M::PATCH, "/api/v1/nodes/{id}/labels", nodes::label);
    r.add(M::POST, "/api/v1/nodes/{id}/uncordon", nodes::uncordon);
    r.add(M::POST, "/api/v1/nodes/{id}/drain", nodes::drain);
    r.add(
        M::POST,
        "/api/v1/nodes/{id}/revoke",
        enrollment::revoke_node,
    );
    r.add(M::GET, "/api/v1/bootstrap-tokens", enrollment::list);
    r.add(M::POST, "/api/v1/bootstrap-tokens", enrollment::create);
    r.add(
        M::DELETE,
        "/api/v1/bootstrap-tokens/{id}",
        enrollment::delete,
    );
    r.add(
        M::POST,
        "/api/v1/nodes/{id}/gpus/{uuid}/drain",
        nodes::drain_gpu,
    );
    r.add(
        M::POST,
        "/api/v1/nodes/{id}/gpus/{uuid}/return",
        nodes::return_gpu,
    );
    r.add(M::GET, "/api/v1/tokens", tokens::list);
    r.add(M::POST, "/api/v1/tokens", tokens::create);
    r.add(M::GET, "/api/v1/tokens/{id}", tokens::get);
    r.add(M::DELETE, "/api/v1/tokens/{id}", tokens::revoke);
    r.add(M::GET, "/api/v1/users", users::list);
    r.add(M::GET, "/api/v1/users/{id}", users::get);
    r.add(M::DELETE, "/api/v1/users/{id}", users::delete);
    r.add(M::GET, "/api/v1/role-bindings", bindings::list);
    r.add(M::POST, "/api/v1/role-bindings", bindings::create);
    r.add(M::GET, "/api/v1/role-bindings/{id}", bindings::get);
    r.add(M::DELETE, "/api/v1/role-bindings/{id}", bindings::revoke);
}

/// Where [`routes`] puts what it lists.
trait Routes {
    fn add<F, Args>(&mut self, method: Method, path: &'static str, handler: F)
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static;
}

/// One served route: a method on a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    pub method: Method,
    pub path: &'static str,
}

/// Every route the API serves.
pub fn route_table() -> Vec<RouteEntry> {
    struct Table(Vec<RouteEntry>);
    impl Routes for Table {
        fn add<F, Args>(&mut self, method: Method, path: &'static str, _: F)
        where
            F: Handler<Args>,
            Args: FromRequest + 'static,
            F::Output: Responder + 'static,
        {
            self.0.push(RouteEntry { method, path });
        }
    }
    let mut t = Table(Vec::new());
    routes(&mut t);
    t.0
}

/// Registers every route. Call from `App::configure` after adding `web::Data<AppState>`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    /// Resources by path, in order, with their methods: one resource carries every method
    /// of its path, so an unsupported method answers 405 (with `Allow`) rather than falling
    /// through.
    type Entry = (&'static str, Vec<Method>, Option<actix_web::Resource>);
    struct Actix(Vec<Entry>);
    impl Routes for Actix {
        fn add<F, Args>(&mut self, method: Method, path: &'static str, handler: F)
        where
            F: Handler<Args>,
            Args: FromRequest + 'static,
            F::Output: Responder + 'static,
        {
            let slot = match self.0.iter().position(|(p, _, _)| *p == path) {
                Some(i) => i,
                None => {
                    self.0.push((path, Vec::new(), Some(web::resource(path))));
                    self.0.len() - 1
                }
            };
            let (_, methods, entry) = &mut self.0[slot];
            methods.push(method.clone());
            *entry = entry
                .take()
                .map(|r| r.route(web::method(method).to(handler)));
        }
    }
    let mut a = Actix(Vec::new());
    routes(&mut a);
    // Fixed paths first: a request to one is matched by comparing strings, without running
    // the pattern of every templated path listed before it (a submit passed fifteen). No
    // path is matched by another's template (tested), so the order decides nothing else.
    a.0.sort_by_key(|(path, _, _)| path.contains('{'));
    for (_, methods, resource) in a.0 {
        if let Some(r) = resource {
            let allow: String = methods
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            cfg.service(r.default_service(web::to(move |req: HttpRequest| {
                let allow = allow.clone();
                async move { method_not_allowed(&req, &allow) }
            })));
        }
    }
    cfg.default_service(web::to(not_found));
}

async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::NotFound(format!("no resource at {}", req.path())).error_response()
}

/// 405, with the methods the path has in `Allow` (RFC 9110, 15.5.6).
fn method_not_allowed(req: &HttpRequest, allow: &str) -> HttpResponse {
    let mut res =
        ApiError::MethodNotAllowed(format!("{} is not allowed on {}", req.method(), req.path()))
            .error_response();
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(allow) {
        res.headers_mut().insert(actix_web::http::header::ALLOW, v);
    }
    res
}

/// A JSON response with the given status.
pub(crate) fn json<T: serde::Serialize>(
    status: actix_web::http::StatusCode,
    body: &T,
) -> HttpResponse {
    HttpResponse::build(status).json(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `configure` serves fixed paths before templated ones: that changes nothing only while
    /// no path of the table is matched by another path's template.
    #[test]
    fn no_path_is_matched_by_another_paths_template() {
        let mut paths: Vec<&str> = route_table().iter().map(|r| r.path).collect();
        paths.dedup();
        for template in paths.iter().filter(|p| p.contains('{')) {
            let def = actix_web::dev::ResourceDef::new(*template);
            for path in paths.iter().filter(|p| *p != template) {
                assert!(!def.is_match(path), "{template} matches {path}");
            }
        }
        // The check can fail: a template matches what it should.
        assert!(actix_web::dev::ResourceDef::new("/api/v1/jobs/{id}").is_match("/api/v1/jobs/j1"));
    }
}
