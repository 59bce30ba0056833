//! Reading the audit logs: heads with their latest signed checkpoint, entries, and
//! inclusion and consistency proofs. Platform admins read every log; tenant admins read
//! their own tenant's. Every read of entries or proofs is itself recorded.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_domain::{AuditEvent, Role, SYSTEM_LOG};
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

/// Checks that the caller may read `log`: the system log needs a platform admin, a tenant's
/// log a tenant admin of that tenant. Unknown or invisible logs are 404.
async fn readable(state: &AppState, who: &Principal, log: &str) -> Result<(), ApiError> {
    let what = format!("audit log `{log}`");
    if log == SYSTEM_LOG {
        return who.require_admin();
    }
    state
        .store
        .tenant_by_id(log)
        .await
        .map_err(|_| ApiError::NotFound(format!("{what} does not exist")))?;
    who.require(log, Role::TenantAdmin, &what)
}

async fn record_read(
    state: &AppState,
    who: &Principal,
    log: &str,
    what: &str,
) -> Result<(), ApiError> {
    let event = AuditEvent::success(SYSTEM_LOG, "audit.read", format!("audit-log/{log}"))
        .after(serde_json::json!({ "read": what }));
    state.store.record_event(&who.audit(), event).await?;
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
    if who.role < Role::TenantAdmin {
        return Err(ApiError::Forbidden(
            "reading audit logs needs the tenant-admin or admin role".into(),
        ));
    }
    let mut out = Vec::new();
    for head in state.store.audit_heads().await? {
        let tenant = if head.log == SYSTEM_LOG {
            if !who.is_admin() {
                continue;
            }
            None
        } else {
            if !who.can_see(&head.log) {
                continue;
            }
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
    Ok(json(StatusCode::OK, &out))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EntriesQuery {
    /// First sequence number (default 0).
    pub from: Option<u64>,
    /// At most this many entries, 1–1000 (default 100).
    pub limit: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditEntryView {
    pub seq: u64,
    /// Hex SHA-256 of `0x00 || body`.
    pub leaf_hash: String,
    /// The exact bytes that were hashed (canonical JSON, as a string).
    pub body: String,
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
    record_read(&state, &who, &log, "entries").await?;
    let rows = state.store.audit_entries(&log, from, limit).await?;
    let head = state.store.audit_head(&log).await?;
    let next_from = rows.last().map(|e| e.seq + 1).filter(|n| *n < head.size);
    let entries = rows
        .into_iter()
        .map(|e| AuditEntryView {
            seq: e.seq,
            leaf_hash: e.leaf_hash.iter().map(|b| format!("{b:02x}")).collect(),
            body: e.body,
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

/// Export a whole log as a bundle that `allot audit verify` checks offline: a tar of the
/// signed manifest, every entry as hashed, every checkpoint, and the verifier key.
#[utoipa::path(get, path = "/api/v1/audit/logs/{log}/export", tag = "audit",
    params(("log" = String, Path)), security(("bearer" = [])),
    responses((status = 200, content_type = "application/x-tar", body = Vec<u8>),
        (status = 404, body = Problem)))]
pub async fn export(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    readable(&state, &who, &log).await?;
    let mut bodies = Vec::new();
    loop {
        let page = state
            .store
            .audit_entries(&log, bodies.len() as u64, MAX_ENTRIES)
            .await?;
        let done = (page.len() as u64) < MAX_ENTRIES;
        bodies.extend(page.into_iter().map(|e| e.body));
        if done {
            break;
        }
    }
    let checkpoints = state
        .store
        .checkpoints(&log, 0, u64::MAX >> 1)
        .await?
        .into_iter()
        .map(|c| (c.size, c.note))
        .collect();
    let now = allot_domain::AuditEntry::format_time(state.store.clock().now());
    let origin = format!("{}/{log}", state.audit_origin);
    let bundle = allot_audit::bundle::Bundle::build(
        &state.audit_signer,
        &log,
        &origin,
        &bodies,
        checkpoints,
        &now,
    )
    .and_then(|b| b.to_tar())
    .map_err(|e| ApiError::Internal(format!("building the audit bundle: {e}")))?;
    let event = AuditEvent::success(SYSTEM_LOG, "audit.export", format!("audit-log/{log}"))
        .after(serde_json::json!({ "entries": bodies.len() }));
    state.store.record_event(&who.audit(), event).await?;
    Ok(HttpResponse::Ok()
        .content_type("application/x-tar")
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"allot-audit-{log}.tar\""),
        ))
        .body(bundle))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct InclusionQuery {
    /// The entry's sequence number.
    pub seq: u64,
    /// The tree size to prove against (e.g. a checkpoint's); default the current size.
    pub size: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InclusionProofView {
    pub seq: u64,
    pub size: u64,
    /// Base64 leaf hash of the entry.
    pub leaf_hash: String,
    /// Base64 sibling hashes, leaf first (RFC 9162 §2.1.3).
    pub proof: Vec<String>,
    /// Base64 root of the tree of `size` entries.
    pub root: String,
}

/// Prove that an entry is in the log at a given size.
#[utoipa::path(get, path = "/api/v1/audit/logs/{log}/proof/inclusion", tag = "audit",
    params(("log" = String, Path), InclusionQuery), security(("bearer" = [])),
    responses((status = 200, body = InclusionProofView), (status = 400, body = Problem),
        (status = 404, body = Problem)))]
pub async fn inclusion(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
    Query(q): Query<InclusionQuery>,
) -> Result<HttpResponse, ApiError> {
    readable(&state, &who, &log).await?;
    let head = state.store.audit_head(&log).await?;
    let size = q.size.unwrap_or(head.size);
    if size > head.size {
        return Err(ApiError::malformed(
            "size",
            format!("the log has only {} entries", head.size),
        ));
    }
    if q.seq >= size {
        return Err(ApiError::malformed(
            "seq",
            format!("must be below the tree size {size}"),
        ));
    }
    record_read(&state, &who, &log, "inclusion proof").await?;
    let leaves = state.store.audit_leaf_hashes(&log, size).await?;
    let index = usize::try_from(q.seq).map_err(|_| ApiError::malformed("seq", "too large"))?;
    let proof = allot_audit::merkle::inclusion_proof(&leaves, index)
        .map_err(|e| ApiError::malformed("seq", e.to_string()))?;
    Ok(json(
        StatusCode::OK,
        &InclusionProofView {
            seq: q.seq,
            size,
            leaf_hash: B64.encode(leaves[index]),
            proof: proof.iter().map(|h| B64.encode(h)).collect(),
            root: B64.encode(allot_audit::merkle::root(&leaves)),
        },
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ConsistencyQuery {
    /// The older tree size.
    pub from: u64,
    /// The newer tree size; default the current size.
    pub to: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsistencyProofView {
    pub from: u64,
    pub to: u64,
    /// Base64 hashes (RFC 9162 §2.1.4).
    pub proof: Vec<String>,
}

/// Prove that the log at one size is a prefix of the log at a later size.
#[utoipa::path(get, path = "/api/v1/audit/logs/{log}/proof/consistency", tag = "audit",
    params(("log" = String, Path), ConsistencyQuery), security(("bearer" = [])),
    responses((status = 200, body = ConsistencyProofView), (status = 400, body = Problem),
        (status = 404, body = Problem)))]
pub async fn consistency(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
    Query(q): Query<ConsistencyQuery>,
) -> Result<HttpResponse, ApiError> {
    readable(&state, &who, &log).await?;
    let head = state.store.audit_head(&log).await?;
    let to = q.to.unwrap_or(head.size);
    if to > head.size {
        return Err(ApiError::malformed(
            "to",
            format!("the log has only {} entries", head.size),
        ));
    }
    if q.from > to {
        return Err(ApiError::malformed(
            "from",
            format!("must not exceed `to` ({to})"),
        ));
    }
    record_read(&state, &who, &log, "consistency proof").await?;
    let leaves = state.store.audit_leaf_hashes(&log, to).await?;
    let old = usize::try_from(q.from).map_err(|_| ApiError::malformed("from", "too large"))?;
    let proof = allot_audit::merkle::consistency_proof(&leaves, old)
        .map_err(|e| ApiError::malformed("from", e.to_string()))?;
    Ok(json(
        StatusCode::OK,
        &ConsistencyProofView {
            from: q.from,
            to,
            proof: proof.iter().map(|h| B64.encode(h)).collect(),
        },
    ))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditKeyView {
    /// The C2SP verifier key that signs every checkpoint.
    pub vkey: String,
}

/// The public key checkpoints are signed with.
#[utoipa::path(get, path = "/api/v1/audit/key", tag = "audit", security(("bearer" = [])),
    responses((status = 200, body = AuditKeyView)))]
pub async fn key(state: web::Data<AppState>, _who: Principal) -> HttpResponse {
    json(
        StatusCode::OK,
        &AuditKeyView {
            vkey: state.audit_signer.verifier().vkey(),
        },
    )
}
