//! The scheduling loop: snapshot the store, run the pure scheduler, persist its decisions and
//! tell the chosen nodes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use allot_domain::{AuditContext, JobState, NodeStatus};
use allot_scheduler::{Allocation, Decision, GpuView, NodeView, Placement, Request, Snapshot};
use allot_store::{JobFilter, JobRepo, JobUpdate, NodeRepo, Store, StoreError, TenantRepo};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::hub::{self, Hub};

/// Runs passes whenever notified, and every `interval` regardless (leases lapse silently).
pub async fn run(
    store: Store,
    hub: Arc<Hub>,
    policy: Arc<dyn Placement + Send + Sync>,
    notify: Arc<Notify>,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = notify.notified() => {}
            () = tokio::time::sleep(interval) => {}
        }
        if let Err(e) = pass(&store, &hub, policy.as_ref()).await {
            tracing::warn!(error = %e, "scheduling pass failed; retrying on the next tick");
        }
    }
}

async fn jobs_in(store: &Store, states: &[JobState]) -> Result<Vec<allot_domain::Job>, StoreError> {
    Ok(store
        .list_jobs(JobFilter {
            states: states.to_vec(),
            ..Default::default()
        })
        .await?
        .jobs)
}

/// One pass. Public so tests can drive scheduling step by step.
pub async fn pass(
    store: &Store,
    hub: &Hub,
    policy: &(dyn Placement + Send + Sync),
) -> Result<(), StoreError> {
    let mut pending = jobs_in(store, &[JobState::Pending]).await?;
    if pending.is_empty() {
        return Ok(());
    }
    pending.reverse(); // oldest first
    let now = store.clock().now();
    let nodes = store
        .list_nodes()
        .await?
        .into_iter()
        .filter(|n| n.status(now) == NodeStatus::Ready)
        .map(|n| NodeView {
            id: n.id,
            name: n.name,
            gpus: n
                .gpus
                .into_iter()
                .map(|g| GpuView {
                    uuid: g.uuid,
                    model: g.model,
                    memory_bytes: g.memory_bytes,
                    healthy: g.healthy,
                })
                .collect(),
        })
        .collect();
    let allocations = jobs_in(store, &[JobState::Scheduled, JobState::Running])
        .await?
        .into_iter()
        .filter_map(|j| {
            Some(Allocation {
                node_id: j.node_id?,
                tenant_id: j.tenant_id,
                gpu_uuids: j.gpu_uuids,
            })
        })
        .collect();
    let tenants = store.list_tenants().await?;
    let names: HashMap<_, _> = tenants
        .iter()
        .map(|t| (t.id.clone(), t.name.to_string()))
        .collect();
    let snapshot = Snapshot {
        nodes,
        allocations,
        quotas: tenants.iter().map(|t| (t.id.clone(), t.quota)).collect(),
        pending: pending
            .iter()
            .map(|j| Request {
                job_id: j.id.clone(),
                tenant_id: j.tenant_id.clone(),
                tenant_name: names.get(&j.tenant_id).cloned().unwrap_or_default(),
                gpus: j.spec.gpus,
                gpu_memory_bytes: j.spec.gpu_memory_bytes,
            })
            .collect(),
    };
    let current: HashMap<_, _> = pending
        .into_iter()
        .map(|j| (j.id.clone(), j.pending_reason))
        .collect();
    let ctx = AuditContext::system("scheduler");
    for decision in allot_scheduler::schedule(policy, &snapshot) {
        match decision {
            Decision::Place { job_id, placed } => {
                let node_id = placed.node_id.clone();
                let update = JobUpdate {
                    node_id: Some(placed.node_id),
                    gpu_uuids: Some(placed.gpu_uuids),
                    ..Default::default()
                };
                match store
                    .transition_job(
                        &ctx,
                        &job_id,
                        JobState::Pending,
                        JobState::Scheduled,
                        update,
                    )
                    .await
                {
                    Ok(job) => {
                        tracing::info!(job = %job.id, node = %node_id, gpus = ?job.gpu_uuids, "scheduled");
                        hub.send(&node_id, hub::launch(&job));
                    }
                    // Cancelled while we decided: its capacity simply stays free.
                    Err(StoreError::Conflict(msg)) => tracing::debug!(%msg, "placement skipped"),
                    Err(e) => return Err(e),
                }
            }
            Decision::Wait { job_id, reason } => {
                if current.get(&job_id).and_then(Option::as_ref) != Some(&reason) {
                    store.set_pending_reason(&job_id, Some(reason)).await?;
                }
            }
        }
    }
    Ok(())
}
