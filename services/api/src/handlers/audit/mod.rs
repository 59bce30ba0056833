//! The audit API: log heads with their latest signed checkpoint, entries, search, proofs,
//! exports, legal holds and pruning. Admins and auditors read every log; tenant admins read
//! their own tenant's. Every read of entries, proofs or exports is itself recorded.

mod evidence;
mod export;
mod names;
mod proofs;
mod retention;
mod search;

pub use evidence::*;
pub use export::*;
pub use names::Names;
pub use proofs::*;
pub use retention::*;
pub use search::*;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_authz::{Action, Resource};
use allot_domain::{AuditEvent, SYSTEM_LOG};
use allot_store::{AuditRepo, TenantRepo};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Principal;
use crate::extract::Query;
use crate::problem::Problem;
use crate::{ApiError, AppState, json};

const MAX_ENTRIES: u64 = 1000;

pub(super) fn log_resource(log: &str) -> Resource<'_> {
    Resource::AuditLog {
        log,
        tenant: (log != SYSTEM_LOG).then_some(log),
    }
}

/// Checks that the caller may read `log`. Unknown logs, and logs of tenants the caller
/// cannot see, are 404.
async fn readable(state: &AppState, who: &Principal, log: &str) -> Result<(), ApiError> {
    let what = format!("audit log `{log}`");
    if log != SYSTEM_LOG {
        state.store.tenant_by_id(log).await.map_err(|e| {
            ApiError::unless_not_found(e, || ApiError::NotFound(format!("{what} does not exist")))
        })?;
    }
    who.authorize(Action::AuditRead, log_resource(log), &what)
}

/// The logs the caller may read: `None` for all of them; refused when none.
/// The audit logs the caller may read (`None`: every one), or 403 when none.
pub fn readable_logs(who: &Principal) -> Result<Option<Vec<String>>, ApiError> {
    let mut logs = who.permitted_in_tenants(Action::AuditRead, log_resource)?;
    let system = who.allows(Action::AuditRead, log_resource(SYSTEM_LOG))?;
    if system && logs.len() == who.tenant_count() {
        return Ok(None);
    }
    if system {
        logs.push(SYSTEM_LOG.to_owned());
    }
    if logs.is_empty() {
        return Err(ApiError::Forbidden(
            "the policies let this caller read no audit log".into(),
        ));
    }
    Ok(Some(logs))
}

async fn record_read(
    state: &AppState,
    who: &Principal,
    log: &str,
    what: &str,
) -> Result<(), ApiError> {
    let event = AuditEvent::success(SYSTEM_LOG, "audit.read", format!("audit-log/{log}"))
        .after(serde_json::json!({ "read": what }));
    state.audit_batcher.record(who.audit(), event).await?;
    Ok(())
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditLogView {
    /// `system`, or the tenant's id.
    pub log: String,
    /// The tenant's name for tenant logs.
    pub tenant: Option<String>,
    pub size: u64,
    /// Base64 of the Merkle tree head over all entries.
    pub root: String,
    /// The latest signed checkpoint (a C2SP signed note), if one was made yet.
    pub checkpoint: Option<String>,
}

/// List the audit logs the caller may read, with their heads and latest checkpoints.
#[utoipa::path(get, path = "/api/v1/audit/logs", tag = "audit", security(("bearer" = [])),
    responses((status = 200, body = Vec<AuditLogView>), (status = 403, body = Problem)))]
pub async fn logs(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    let visible = readable_logs(&who)?;
    Ok(json(
        StatusCode::OK,
        &log_views(&state, visible.as_deref()).await?,
    ))
}

/// Every log's head and latest checkpoint (of those in `visible`, when given).
pub(super) async fn log_views(
    state: &AppState,
    visible: Option<&[String]>,
) -> Result<Vec<AuditLogView>, ApiError> {
    let mut out = Vec::new();
    for head in state.store.audit_heads().await? {
        if visible.is_some_and(|v| !v.contains(&head.log)) {
            continue;
        }
        let tenant = if head.log == SYSTEM_LOG {
            None
        } else {
            Some(state.store.tenant_by_id(&head.log).await?.name.to_string())
        };
        let checkpoint = state
            .store
            .latest_checkpoint(&head.log)
            .await?
            .map(|c| c.note);
        out.push(AuditLogView {
            root: B64.encode(head.root),
            log: head.log,
            tenant,
            size: head.size,
            checkpoint,
        });
    }
    Ok(out)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EntriesQuery {
    /// First sequence number (default 0).
    #[param(maximum = 9_223_372_036_854_775_807_u64)]
    pub from: Option<u64>,
    /// At most this many entries, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditEntryView {
    pub log: String,
    pub seq: u64,
    /// When it was recorded (RFC 3339).
    pub time: String,
    pub action: String,
    /// `success`, `denied` or `failed`.
    pub outcome: String,
    /// Hex SHA-256 of `0x00 || body`.
    pub leaf_hash: String,
    /// The exact bytes that were hashed (canonical JSON, as a string); absent once pruned.
    pub body: Option<String>,
    /// Whether the payload was removed under the retention policy (the leaf hash stays).
    pub pruned: bool,
    /// The name of the tenant whose log it is, as it is named now (not part of the entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_name: Option<String>,
    /// The name of the actor (a token's name, a user's email, a node's name), as it is
    /// now; absent where the actor is gone or is the system (not part of the entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_name: Option<String>,
    /// The target's name where it is a tenant, its log, a node, a token or a user, as it
    /// is now (not part of the entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_name: Option<String>,
}

impl From<allot_store::StoredEntry> for AuditEntryView {
    fn from(e: allot_store::StoredEntry) -> Self {
        Self {
            pruned: e.body.is_none(),
            time: allot_domain::AuditEntry::format_time(e.at),
            leaf_hash: hex::encode(e.leaf_hash),
            log: e.log,
            seq: e.seq,
            action: e.action,
            outcome: e.outcome,
            body: e.body,
            log_name: None,
            actor_name: None,
            target_name: None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditEntries {
    pub entries: Vec<AuditEntryView>,
    /// Pass as `from` for the next page; absent at the end of the log.
    pub next_from: Option<u64>,
}

/// Read a log's entries in order.
#[utoipa::path(get, path = "/api/v1/audit/logs/{log}/entries", tag = "audit",
    params(("log" = String, Path), EntriesQuery), security(("bearer" = [])),
    responses((status = 200, body = AuditEntries), (status = 400, body = Problem),
        (status = 404, body = Problem)))]
pub async fn entries(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
    Query(q): Query<EntriesQuery>,
) -> Result<HttpResponse, ApiError> {
    readable(&state, &who, &log).await?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_ENTRIES).contains(&limit) {
        return Err(ApiError::malformed(
            "limit",
            format!("must be between 1 and {MAX_ENTRIES}"),
        ));
    }
    let from = q.from.unwrap_or(0);
    if i64::try_from(from).is_err() {
        return Err(ApiError::malformed("from", "must be at most 2^63 - 1"));
    }
    record_read(&state, &who, &log, "entries").await?;
    let head = state.store.audit_head(&log).await?;
    // Past the end there is nothing (and nothing the database need be asked).
    let rows = if from < head.size {
        state.store.audit_entries(&log, from, limit).await?
    } else {
        Vec::new()
    };
    let next_from = rows.last().map(|e| e.seq + 1).filter(|n| *n < head.size);
    let names = Names::load(&state, &who).await?;
    let entries = rows
        .into_iter()
        .map(|r| {
            let mut e = AuditEntryView::from(r);
            names.name(&mut e);
            e
        })
        .collect();
    Ok(json(StatusCode::OK, &AuditEntries { entries, next_from }))
}

/// The latest signed checkpoint of a log, as a C2SP signed note.
#[utoipa::path(get, path = "/api/v1/audit/logs/{log}/checkpoint", tag = "audit",
    params(("log" = String, Path)), security(("bearer" = [])),
    responses((status = 200, content_type = "text/plain", body = String),
        (status = 404, body = Problem)))]
pub async fn checkpoint(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    readable(&state, &who, &log).await?;
    let cp =
        state.store.latest_checkpoint(&log).await?.ok_or_else(|| {
            ApiError::NotFound(format!("audit log `{log}` has no checkpoint yet"))
        })?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(cp.note))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditKeyView {
    /// The C2SP verifier key of the signing key in force now.
    pub vkey: String,
    /// Every verifier key with its validity period, one per line, in the format
    /// `allot audit verify --trusted-key` reads.
    pub keys: String,
}

/// The public keys checkpoints and exports are signed with.
#[utoipa::path(get, path = "/api/v1/audit/key", tag = "audit", security(("bearer" = [])),
    responses((status = 200, body = AuditKeyView), (status = 500, body = Problem)))]
pub async fn key(state: web::Data<AppState>, who: Principal) -> Result<HttpResponse, ApiError> {
    who.authorize(Action::AuditKey, Resource::Platform, "the audit keys")?;
    let now = state.store.clock().now();
    let active = state
        .audit_keys
        .active(now)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(json(
        StatusCode::OK,
        &AuditKeyView {
            vkey: active.verifier().vkey(),
            keys: state.audit_keys.public().to_text(),
        },
    ))
}
