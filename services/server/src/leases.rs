//! Nodes whose lease lapsed: their jobs are requeued.
//!
//! An agent kills its own jobs a fifth of a lease before the lease would lapse without
//! renewal (on its monotonic clock, counted from when it *sent* the last accepted
//! heartbeat), and the control plane requeues them only once the lease has lapsed on its
//! side (counted from when that heartbeat *arrived*). So a requeued attempt never overlaps
//! the attempt it replaces, and any report the old attempt still sends carries a stale
//! fencing token (its attempt number) and is refused.

use allot_domain::{AuditContext, JobState, Node, NodeStatus};
use allot_store::{JobFilter, JobRepo, JobUpdate, Store, StoreError, TenantScope};

/// Requeues the jobs held on those of `nodes` whose lease lapsed (cancels those being
/// cancelled). Returns how many jobs moved.
pub async fn requeue_from_lapsed_nodes(store: &Store, nodes: &[Node]) -> Result<usize, StoreError> {
    let now = store.clock().now();
    let lapsed: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.status(now) == NodeStatus::NotReady)
        .collect();
    if lapsed.is_empty() {
        return Ok(0);
    }
    let held = store
        .list_jobs(JobFilter {
            states: vec![JobState::Scheduled, JobState::Running],
            ..JobFilter::new(TenantScope::All)
        })
        .await?
        .jobs;
    let ctx = AuditContext::system("lease-monitor");
    let mut moved = 0;
    for job in held {
        let Some(node) = lapsed
            .iter()
            .find(|n| job.node_id.as_deref() == Some(n.id.as_str()))
        else {
            continue;
        };
        let lost = format!(
            "node {} lost: no heartbeat since {}, lease lapsed at {}",
            node.name,
            node.last_heartbeat_at.format("%H:%M:%S%.3f"),
            node.lease_expires_at.format("%H:%M:%S%.3f"),
        );
        let (to, message) = if job.cancel_requested {
            (JobState::Cancelled, lost)
        } else {
            (JobState::Pending, format!("{lost}; requeued"))
        };
        let update = JobUpdate {
            message: Some(message),
            requeue_code: Some("NodeLost".to_owned()),
            ..Default::default()
        };
        match store
            .transition_job(&ctx, &job.id, job.state, to, update)
            .await
        {
            Ok(job) => {
                tracing::warn!(job = %job.id, node = %node.name, attempt = job.attempt, state = %job.state, "job moved off a lapsed node");
                moved += 1;
            }
            // Reported or cancelled meanwhile: nothing to move.
            Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(moved)
}
