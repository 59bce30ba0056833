use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};

use crate::views::Health;
use crate::{ApiError, AppState, json};

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, body = Health)))]
pub async fn healthz() -> HttpResponse {
    json(
        StatusCode::OK,
        &Health {
            status: "ok".into(),
        },
    )
}

/// Readiness: the database answers, and nothing else keeps this replica from its part
/// (another running replica has its name).
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = Health), (status = 503, body = crate::problem::Problem)))]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state
        .store
        .ping()
        .await
        .map_err(|e| ApiError::Unavailable(format!("the database does not answer: {e}")))?;
    if let Some(why) = state.events.not_ready() {
        return Err(ApiError::Unavailable(why));
    }
    Ok(json(
        StatusCode::OK,
        &Health {
            status: "ready".into(),
        },
    ))
}
