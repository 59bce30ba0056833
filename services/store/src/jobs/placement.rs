//! The leader's placement writes: a gang placed whole, preemptions and moves (a running job
//! asked to stop, once), and a share resized in place.

use allot_domain::{AuditContext, AuditEvent, Job, JobState, Share};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use crate::audit::record;
use crate::convert::{to_i64, to_json};
use crate::entities::{job_events, jobs};
use crate::{Store, StoreError};

use super::JobUpdate;
use super::rows::{holding_capacity, i32_of, load};

/// Writes `row` on job `id` if it holds capacity, is not being cancelled and is not
/// already stopping (the leader's request that it stop, for a preemption or a move);
/// returns the job as it is then.
async fn mark_stopping<C: ConnectionTrait>(
    txn: &C,
    id: &str,
    row: jobs::ActiveModel,
) -> Result<Job, StoreError> {
    let res = jobs::Entity::update_many()
        .set(row)
        .filter(jobs::Column::Id.eq(id))
        .filter(holding_capacity())
        .filter(jobs::Column::CancelRequested.eq(false))
        .filter(jobs::Column::PreemptReason.is_null())
        .exec(txn)
        .await?;
    if res.rows_affected == 0 {
        return Err(StoreError::Conflict(format!(
            "job {id} is not running, or is already stopping"
        )));
    }
    load(txn, id).await
}

pub(super) async fn place_together(
    store: &Store,
    ctx: &AuditContext,
    placements: Vec<(String, JobUpdate)>,
) -> Result<Vec<Job>, StoreError> {
    let txn = store.begin().await?;
    let mut placed = Vec::with_capacity(placements.len());
    for (id, update) in placements {
        placed.push(
            store
                .transition_in(
                    &txn,
                    ctx,
                    &id,
                    JobState::Pending,
                    JobState::Scheduled,
                    update,
                )
                .await?,
        );
    }
    store.commit(txn).await?;
    Ok(placed)
}
pub(super) async fn request_preemption(
    store: &Store,
    ctx: &AuditContext,
    id: &str,
    reason: &str,
) -> Result<Job, StoreError> {
    let txn = store.begin().await?;
    let row = jobs::ActiveModel {
        preempt_reason: Set(Some(reason.to_owned())),
        updated_at: Set(store.clock.now()),
        writer_epoch: Set(store.writer_epoch()),
        ..Default::default()
    };
    let job = mark_stopping(&txn, id, row).await?;
    let event = AuditEvent::success(job.tenant_id.clone(), "job.preempt", format!("job/{id}"))
        .before(serde_json::json!({ "state": job.state, "preempt_reason": null }))
        .after(serde_json::json!({ "state": job.state, "preempt_reason": reason }));
    record(&txn, store, ctx, event).await?;
    store.commit(txn).await?;
    Ok(job)
}
pub(super) async fn request_move(
    store: &Store,
    ctx: &AuditContext,
    id: &str,
    reason: &str,
    avoid_gpus: &[String],
    share_milli: Option<u32>,
) -> Result<Job, StoreError> {
    let txn = store.begin().await?;
    let before = load(&txn, id).await?;
    let now = store.clock.now();
    let mut row = jobs::ActiveModel {
        preempt_reason: Set(Some(reason.to_owned())),
        avoid_node_id: Set(None),
        avoid_gpus: Set(Some(to_json("avoid_gpus", &avoid_gpus)?)),
        avoid_until: Set(Some(
            now + chrono::Duration::seconds(allot_domain::MOVE_AVOID_SECS),
        )),
        updated_at: Set(now),
        writer_epoch: Set(store.writer_epoch()),
        ..Default::default()
    };
    if let Some(milli) = share_milli {
        row.gpu_milli = Set(Some(i32_of(milli)?));
    }
    let job = mark_stopping(&txn, id, row).await?;
    let mut event = AuditEvent::success(job.tenant_id.clone(), "job.move", format!("job/{id}"));
    event.reason = Some(reason.chars().take(500).collect());
    let event = event
        .before(serde_json::json!({
            "node_id": before.node_id,
            "gpu_uuids": before.gpu_uuids,
            "gpu_milli": before.held_gpu_milli.or(before.spec.gpu_milli),
        }))
        .after(serde_json::json!({
            "preempt_reason": reason,
            "gpu_milli": job.spec.gpu_milli,
            "avoid_gpus": avoid_gpus,
        }));
    record(&txn, store, ctx, event).await?;
    store.commit(txn).await?;
    Ok(job)
}
pub(super) async fn resize_job(
    store: &Store,
    ctx: &AuditContext,
    id: &str,
    share: Share,
    why: Option<&str>,
) -> Result<Job, StoreError> {
    let txn = store.begin().await?;
    let before = load(&txn, id).await?;
    let memory = (share.gpu_memory_bytes > 0)
        .then(|| to_i64("gpu_memory_bytes", share.gpu_memory_bytes))
        .transpose()?;
    let res = jobs::Entity::update_many()
        .set(jobs::ActiveModel {
            gpu_milli: Set(Some(i32_of(share.gpu_milli)?)),
            held_gpu_milli: Set(Some(i32_of(share.gpu_milli)?)),
            gpu_memory_bytes: Set(memory),
            updated_at: Set(store.clock.now()),
            writer_epoch: Set(store.writer_epoch()),
            ..Default::default()
        })
        .filter(jobs::Column::Id.eq(id))
        .filter(holding_capacity())
        .exec(&txn)
        .await?;
    if res.rows_affected == 0 {
        return Err(StoreError::Conflict(format!(
            "job {id} is {}: only a scheduled or running job is resized",
            before.state
        )));
    }
    job_events::Entity::insert(job_events::ActiveModel {
        job_id: Set(id.to_owned()),
        from_state: Set(Some(before.state.as_str().to_owned())),
        to_state: Set(before.state.as_str().to_owned()),
        at: Set(store.clock.now()),
        message: Set(Some(format!(
            "resized to {} of each GPU{}{}",
            allot_domain::format_milli(u64::from(share.gpu_milli)),
            if share.gpu_memory_bytes > 0 {
                format!(
                    ", {} of GPU memory",
                    allot_domain::format_bytes(share.gpu_memory_bytes)
                )
            } else {
                String::new()
            },
            why.map(|w| format!(" ({w})")).unwrap_or_default()
        ))),
        gpu_milli: Set(Some(i32_of(share.gpu_milli)?)),
        gpu_memory_bytes: Set(Some(to_i64("gpu_memory_bytes", share.gpu_memory_bytes)?)),
        ..Default::default()
    })
    .exec(&txn)
    .await?;
    let job = load(&txn, id).await?;
    let mut event = AuditEvent::success(job.tenant_id.clone(), "job.resize", format!("job/{id}"));
    event.reason = why.map(|w| w.chars().take(500).collect());
    let event = event
        .before(serde_json::json!({
            "gpu_milli": before.held_gpu_milli.or(before.spec.gpu_milli),
            "gpu_memory_bytes": before.spec.gpu_memory_bytes,
        }))
        .after(serde_json::json!({
            "gpu_milli": share.gpu_milli,
            "gpu_memory_bytes": job.spec.gpu_memory_bytes,
        }));
    record(&txn, store, ctx, event).await?;
    store.commit(txn).await?;
    Ok(job)
}
