//! Inclusion and consistency proofs, for checking entries and checkpoints against each other.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use allot_store::AuditRepo;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{readable, record_read};
use crate::auth::Principal;
use crate::extract::Query;
use crate::problem::Problem;
use crate::{ApiError, AppState, json};

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
        return Err(ApiError::invalid(
            "size",
            format!("the log has only {} entries", head.size),
        ));
    }
    if q.seq >= size {
        return Err(ApiError::invalid(
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
        return Err(ApiError::invalid(
            "to",
            format!("the log has only {} entries", head.size),
        ));
    }
    if q.from > to {
        return Err(ApiError::invalid(
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
