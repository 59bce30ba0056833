//! Retention: pruning a log's old payloads (leaf hashes stay, so proofs hold) and legal
//! holds that stop it. Platform admins only; every change is recorded in the system log.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_domain::LegalHold;
use allot_store::AuditRepo;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::resolve_log;
use crate::auth::Principal;
use crate::extract::Json;
use crate::problem::Problem;
use crate::{ApiError, AppState, json};
use allot_authz::{Action, Resource};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LegalHoldView {
    pub log: String,
    pub reason: String,
    /// Who set it, as `<kind>:<id>`.
    pub set_by: String,
    pub set_at: DateTime<Utc>,
}

impl From<LegalHold> for LegalHoldView {
    fn from(h: LegalHold) -> Self {
        Self {
            log: h.log,
            reason: h.reason,
            set_by: h.set_by,
            set_at: h.set_at,
        }
    }
}

/// List the logs under legal hold.
#[utoipa::path(get, path = "/api/v1/audit/holds", tag = "audit", security(("bearer" = [])),
    responses((status = 200, body = Vec<LegalHoldView>), (status = 403, body = Problem)))]
pub async fn holds(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::AuditHolds, Resource::Platform, "legal holds")?;
    let holds: Vec<LegalHoldView> = state
        .store
        .legal_holds()
        .await?
        .into_iter()
        .map(LegalHoldView::from)
        .collect();
    Ok(json(StatusCode::OK, &holds))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetHold {
    /// Why, e.g. the matter or ticket it serves (1–500 characters).
    #[schema(min_length = 1, max_length = 500, pattern = "\\S")]
    pub reason: String,
}

/// Place a log under legal hold: nothing in it is pruned until the hold is released.
#[utoipa::path(put, path = "/api/v1/audit/logs/{log}/hold", tag = "audit",
    params(("log" = String, Path)), request_body = SetHold, security(("bearer" = [])),
    responses((status = 201, body = LegalHoldView), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)))]
pub async fn set_hold(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
    Json(body): Json<SetHold>,
) -> Result<HttpResponse, ApiError> {
    let reason = body.reason.trim();
    if reason.is_empty() || reason.len() > 500 {
        return Err(ApiError::malformed("reason", "must be 1–500 characters"));
    }
    let named = resolve_log(&state, &log).await?;
    named.authorize(&who, Action::AuditHold)?;
    let log = named.id;
    let hold = state
        .store
        .set_legal_hold(&who.audit(), &log, reason)
        .await?;
    Ok(json(StatusCode::CREATED, &LegalHoldView::from(hold)))
}

/// Release a log's legal hold.
#[utoipa::path(delete, path = "/api/v1/audit/logs/{log}/hold", tag = "audit",
    params(("log" = String, Path)), security(("bearer" = [])),
    responses((status = 200, body = LegalHoldView), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn release_hold(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let named = resolve_log(&state, &log).await?;
    named.authorize(&who, Action::AuditHold)?;
    let log = named.id;
    let hold = state.store.release_legal_hold(&who.audit(), &log).await?;
    Ok(json(StatusCode::OK, &LegalHoldView::from(hold)))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Prune {
    /// Remove the payload of entries recorded before this time (RFC 3339).
    pub before: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Pruned {
    pub log: String,
    /// How many entries lost their payload.
    pub pruned: u64,
}

/// Prune a log: entries recorded before `before` keep their position, time, leaf hash,
/// action and outcome; actor, target and the rest of the payload are removed.
#[utoipa::path(post, path = "/api/v1/audit/logs/{log}/prune", tag = "audit",
    params(("log" = String, Path)), request_body = Prune, security(("bearer" = [])),
    responses((status = 200, body = Pruned), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)))]
pub async fn prune(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
    Json(body): Json<Prune>,
) -> Result<HttpResponse, ApiError> {
    if body.before > state.store.clock().now() {
        return Err(ApiError::invalid("before", "must not be in the future"));
    }
    let named = resolve_log(&state, &log).await?;
    named.authorize(&who, Action::AuditPrune)?;
    let log = named.id;
    let pruned = state
        .store
        .prune_audit(&who.audit(), &log, body.before)
        .await?;
    Ok(json(StatusCode::OK, &Pruned { log, pruned }))
}
