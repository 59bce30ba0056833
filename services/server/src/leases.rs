//! Lost nodes: their jobs are requeued.
//!
//! A node whose lease lapsed takes no new work; it is *lost* only once nothing was heard
//! from it for the outage tolerance (`ServerConfig::outage_tolerance`, minutes), counted
//! from its last heartbeat or from when this leader took office, whichever is later
//! ([`allot_domain::Node::lost`]): a control plane that nobody reached for a while (an
//! upgrade, a database failover, a network blip) finds the fleet's work still running.
//! Positive evidence declares it sooner: its agent registering again without the jobs
//! (`grpc.rs`), or reporting a job gone or faulted; and a node an operator revoked (no
//! current certificate) is lost as soon as its lease lapses, since its agent cannot be
//! heard from again under that identity (an agent told so stops its jobs at once; one cut
//! off when it was revoked may still run them until its own fence).
//!
//! An agent kills its own jobs a fifth of the tolerance before it would lapse without an
//! accepted heartbeat (on its monotonic clock, counted from when it *sent* the last one),
//! and the control plane requeues them only once the tolerance has passed on its side
//! (counted from when that heartbeat *arrived*). So a requeued attempt never overlaps the
//! attempt it replaces, and any report the old attempt still sends carries a stale fencing
//! token (its attempt number) and is refused.

use allot_domain::{AuditContext, JobState, Node, NodeStatus};
use allot_store::{EnrollmentRepo, JobFilter, JobRepo, JobUpdate, Store, StoreError, TenantScope};
use chrono::{DateTime, Utc};

/// Requeues the jobs held on those of `nodes` that are lost after `tolerance`, this leader
/// having taken office at `since` (cancels those being cancelled). Returns how many jobs
/// moved.
pub async fn requeue_from_lost_nodes(
    store: &Store,
    nodes: &[Node],
    tolerance: std::time::Duration,
    since: DateTime<Utc>,
) -> Result<usize, StoreError> {
    let now = store.clock().now();
    let tolerance = chrono::Duration::from_std(tolerance).unwrap_or(chrono::Duration::MAX);
    let not_ready: Vec<String> = nodes
        .iter()
        .filter(|n| n.status(now) == NodeStatus::NotReady && !n.lost(now, tolerance, since))
        .map(|n| n.id.clone())
        .collect();
    let revoked = store.nodes_without_current_certificate(&not_ready).await?;
    let lapsed: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.lost(now, tolerance, since) || revoked.contains(&n.id))
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
        let lost = if revoked.contains(&node.id) {
            format!(
                "node {} lost: its certificates were revoked, lease lapsed at {}",
                node.name,
                node.lease_expires_at.format("%H:%M:%S%.3f"),
            )
        } else {
            format!(
                "node {} lost: no heartbeat since {} ({} s, the outage tolerance {} s), \
                 lease lapsed at {}",
                node.name,
                node.last_heartbeat_at.format("%H:%M:%S%.3f"),
                (now - node.last_heartbeat_at).num_seconds(),
                tolerance.num_seconds(),
                node.lease_expires_at.format("%H:%M:%S%.3f"),
            )
        };
        let (to, message) = if job.cancel_requested {
            (JobState::Cancelled, lost)
        } else {
            (JobState::Pending, format!("{lost}; requeued"))
        };
        let update = JobUpdate {
            message: Some(message),
            requeue_code: Some(allot_domain::report::RequeueCode::NodeLost),
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
