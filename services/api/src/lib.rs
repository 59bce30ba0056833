//! The control plane's REST API (actix-web), versioned under `/api/v1`.
//!
//! Handlers translate HTTP to calls on the store's repositories and the [`ControlEvents`] the
//! control plane provides; they hold no business rules of their own beyond authorization.
//! Every error is an RFC 9457 problem (see [`problem`]); the OpenAPI document is generated
//! from the handlers' annotations and served at `/api/v1/openapi.json`.

pub mod auth;
mod denials;
pub mod extract;
mod handlers;
pub mod openapi;
pub mod problem;
pub mod secret;
pub mod views;

use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use allot_domain::Job;
use allot_store::Store;

pub use denials::record_denials;
pub use extract::BodyLimit;
pub use handlers::tokens::TOKEN_PREFIX;
pub use problem::ApiError;

/// What the API tells the rest of the control plane.
pub trait ControlEvents: Send + Sync + 'static {
    /// A job was submitted: run a scheduling pass soon.
    fn job_submitted(&self);
    /// A scheduled or running job should stop: tell its node.
    fn job_cancel_requested(&self, job: &Job);
}

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// Sign audit checkpoints and export manifests (the key in force at the time); their
    /// verifier keys are public.
    pub audit_keys: Arc<allot_audit::SigningKeys>,
    /// Checkpoint origins are `<audit_origin>/<log>`.
    pub audit_origin: String,
    pub events: Arc<dyn ControlEvents>,
    /// Group-commits events that change nothing else (refusals, audit reads and exports),
    /// so a burst of them costs one transaction per log, not one each.
    pub audit_batcher: allot_store::AuditBatcher,
}

/// Registers every route. Call from `App::configure` after adding `web::Data<AppState>`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(handlers::health::healthz))
        .route("/readyz", web::get().to(handlers::health::readyz))
        .service(
            web::scope("/api/v1")
                .route("/openapi.json", web::get().to(openapi::serve))
                .service(resource("/audit/key").get(handlers::audit::key))
                .service(resource("/audit/logs").get(handlers::audit::logs))
                .service(resource("/audit/entries").get(handlers::audit::search))
                .service(resource("/audit/holds").get(handlers::audit::holds))
                .service(
                    resource("/audit/logs/{log}/hold")
                        .put(handlers::audit::set_hold)
                        .delete(handlers::audit::release_hold),
                )
                .service(resource("/audit/logs/{log}/prune").post(handlers::audit::prune))
                .service(resource("/audit/logs/{log}/entries").get(handlers::audit::entries))
                .service(resource("/audit/logs/{log}/checkpoint").get(handlers::audit::checkpoint))
                .service(resource("/audit/logs/{log}/export").get(handlers::audit::export))
                .service(
                    resource("/audit/logs/{log}/proof/inclusion").get(handlers::audit::inclusion),
                )
                .service(
                    resource("/audit/logs/{log}/proof/consistency")
                        .get(handlers::audit::consistency),
                )
                .service(
                    resource("/tenants")
                        .get(handlers::tenants::list)
                        .post(handlers::tenants::create),
                )
                .service(resource("/tenants/{name}").get(handlers::tenants::get))
                .service(
                    resource("/tenants/{name}/quota")
                        .get(handlers::tenants::get_quota)
                        .put(handlers::tenants::set_quota),
                )
                .service(
                    resource("/jobs")
                        .get(handlers::jobs::list)
                        .post(handlers::jobs::submit),
                )
                .service(resource("/jobs/{id}").get(handlers::jobs::get))
                .service(resource("/jobs/{id}/cancel").post(handlers::jobs::cancel))
                .service(resource("/jobs/{id}/log").get(handlers::jobs::log))
                .service(resource("/nodes").get(handlers::nodes::list))
                .service(resource("/nodes/{id}").get(handlers::nodes::get))
                .service(resource("/nodes/{id}/cordon").post(handlers::nodes::cordon))
                .service(resource("/nodes/{id}/uncordon").post(handlers::nodes::uncordon))
                .service(resource("/nodes/{id}/drain").post(handlers::nodes::drain))
                .service(resource("/nodes/{id}/gpus/{uuid}/drain").post(handlers::nodes::drain_gpu))
                .service(
                    resource("/nodes/{id}/gpus/{uuid}/return").post(handlers::nodes::return_gpu),
                )
                .service(
                    resource("/tokens")
                        .get(handlers::tokens::list)
                        .post(handlers::tokens::create),
                )
                .service(
                    resource("/tokens/{id}")
                        .get(handlers::tokens::get)
                        .delete(handlers::tokens::revoke),
                ),
        )
        .default_service(web::to(not_found));
}

/// A resource whose unsupported methods answer 405 as a problem.
fn resource(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::NotFound(format!("no resource at {}", req.path())).error_response()
}

async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::MethodNotAllowed(format!("{} is not allowed on {}", req.method(), req.path()))
        .error_response()
}

/// A JSON response with the given status.
pub(crate) fn json<T: serde::Serialize>(
    status: actix_web::http::StatusCode,
    body: &T,
) -> HttpResponse {
    HttpResponse::build(status).json(body)
}
