//! Export bundles that `allot audit verify` checks offline: a whole log (complete up to its
//! latest checkpoint, pruned entries as leaf hashes), or the entries matching a filter, each
//! with its inclusion proof in the latest checkpoint.

use actix_web::{HttpResponse, web};
use allot_audit::bundle::{Bundle, Export, Line};
use allot_authz::Action;
use allot_domain::{AuditEntry, AuditEvent, SYSTEM_LOG};
use allot_store::AuditRepo;

use super::{AuditFilter, MAX_ENTRIES};
use crate::auth::Principal;
use crate::extract::Query;
use crate::problem::Problem;
use crate::{ApiError, AppState};

/// What goes into a bundle, gathered from the store before the CPU work starts.
enum Contents {
    Full {
        lines: Vec<Line>,
        checkpoints: Vec<(u64, String)>,
    },
    Filtered {
        query: allot_audit::bundle::Query,
        covering: (u64, String),
        entries: Vec<(String, Vec<allot_audit::Hash>)>,
    },
}

/// Export a log as a bundle: without filters the whole log, else the matching entries with
/// inclusion proofs in the latest checkpoint.
#[utoipa::path(get, path = "/api/v1/audit/logs/{log}/export", tag = "audit",
    params(("log" = String, Path), AuditFilter), security(("bearer" = [])),
    responses((status = 200, content_type = "application/x-tar", body = Vec<u8>),
        (status = 400, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)))]
pub async fn export(
    state: web::Data<AppState>,
    who: Principal,
    log: web::Path<String>,
    Query(filter): Query<AuditFilter>,
) -> Result<HttpResponse, ApiError> {
    let named = super::resolve_log(&state, &log).await?;
    named.authorize(&who, Action::AuditRead)?;
    let log = named.id;
    filter.check()?;
    let now = state.store.clock().now();
    let signing_keys = state.audit_keys.clone();
    let exported_at = AuditEntry::format_time(now);
    let origin = format!("{}/{log}", state.audit_origin);
    // Signing and rendering a large log is CPU work: off the async workers.
    let build = |contents: Contents| {
        let (log, origin, exported_at) = (log.clone(), origin.clone(), exported_at.clone());
        web::block(move || -> Result<Vec<u8>, String> {
            let signer = signing_keys.active(now).map_err(|e| e.to_string())?;
            let keys = signing_keys.public();
            let export = |checkpoints| Export {
                log: &log,
                origin: &origin,
                exported_at: &exported_at,
                checkpoints,
                keys: &keys,
            };
            let bundle = match contents {
                Contents::Full { lines, checkpoints } => {
                    Bundle::full(signer, export(checkpoints), &lines)
                }
                Contents::Filtered {
                    query,
                    covering,
                    entries,
                } => Bundle::filtered(
                    signer,
                    export(vec![covering.clone()]),
                    query,
                    covering.0,
                    &entries,
                ),
            };
            bundle.and_then(|b| b.to_tar()).map_err(|e| e.to_string())
        })
    };
    let internal = |e: String| ApiError::Internal(format!("building the audit bundle: {e}"));
    let (contents, count) = if filter.is_empty() {
        let mut lines = Vec::new();
        loop {
            let page = state
                .store
                .audit_entries(&log, lines.len() as u64, MAX_ENTRIES)
                .await?;
            let done = (page.len() as u64) < MAX_ENTRIES;
            lines.extend(page.into_iter().map(|e| match e.body {
                Some(body) => Line::Entry(body),
                None => Line::Pruned {
                    seq: e.seq,
                    leaf_hash: e.leaf_hash,
                },
            }));
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
        let count = lines.len();
        (Contents::Full { lines, checkpoints }, count)
    } else {
        let covering = state.store.latest_checkpoint(&log).await?.ok_or_else(|| {
            ApiError::Conflict(format!(
                "audit log `{log}` has no signed checkpoint yet; try again in a few seconds"
            ))
        })?;
        let tree =
            allot_audit::Tree::new(state.store.audit_leaf_hashes(&log, covering.size).await?);
        let mut search = filter.search(Some(vec![log.clone()]), MAX_ENTRIES);
        let mut picked = Vec::new();
        loop {
            let page = state.store.search_audit(&search).await?;
            let done = (page.len() as u64) < MAX_ENTRIES;
            search.after = page.last().map(|e| (e.at, e.log.clone(), e.seq));
            for e in page {
                // Newer than the covering checkpoint, or pruned: nothing to prove or show.
                let Some(body) = e.body.filter(|_| e.seq < covering.size) else {
                    continue;
                };
                let proof = tree.inclusion_proof(e.seq).map_err(|err| {
                    ApiError::Internal(format!("proof for entry {}: {err}", e.seq))
                })?;
                picked.push((e.seq, body, proof));
            }
            if done {
                break;
            }
        }
        // Search pages come in time order; a bundle lists entries by position.
        picked.sort_by_key(|(seq, _, _)| *seq);
        let entries: Vec<_> = picked.into_iter().map(|(_, b, p)| (b, p)).collect();
        let count = entries.len();
        let contents = Contents::Filtered {
            query: filter.bundle_query(),
            covering: (covering.size, covering.note),
            entries,
        };
        (contents, count)
    };
    let tar = build(contents)
        .await
        .map_err(|e| internal(e.to_string()))?
        .map_err(internal)?;
    let event = AuditEvent::success(SYSTEM_LOG, "audit.export", format!("audit-log/{log}")).after(
        serde_json::json!({
            "entries": count,
            "query": (!filter.is_empty()).then(|| filter.bundle_query()),
        }),
    );
    state.audit_batcher.record(who.audit(), event).await?;
    Ok(HttpResponse::Ok()
        .content_type("application/x-tar")
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"allot-audit-{log}.tar\""),
        ))
        .body(tar))
}
