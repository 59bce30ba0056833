//! Drains with a grace (`allot node drain NODE --grace 10m`): a drained node's jobs may run
//! on until the drain's deadline; on the first pass after it, what still holds capacity
//! there is stopped and requeued elsewhere as its next attempt (a preemption, not counted
//! as a failure), as a drain without a grace does at once.

use allot_domain::{AuditContext, JobState, Node};
use allot_store::{JobFilter, JobRepo, Store, StoreError, TenantScope};

use crate::hub::{self, Hub};

/// Asks the nodes whose drain's grace is over to stop what they still run; how many jobs
/// were asked.
pub async fn requeue_past_grace(
    store: &Store,
    hub: &Hub,
    nodes: &[Node],
) -> Result<usize, StoreError> {
    let now = store.clock().now();
    let mut asked = 0;
    let ctx = AuditContext::system("drain");
    for node in nodes {
        let Some(drain) = node.drain.as_ref().filter(|d| d.deadline <= now) else {
            continue;
        };
        let held = store
            .list_jobs(JobFilter {
                node_id: Some(node.id.clone()),
                states: vec![JobState::Scheduled, JobState::Running],
                ..JobFilter::new(TenantScope::All)
            })
            .await?
            .jobs;
        let why = if drain.reason.is_empty() {
            format!("node {} drained by an operator; its grace ended", node.name)
        } else {
            format!(
                "node {} drained by an operator ({}); its grace ended",
                node.name, drain.reason
            )
        };
        for job in held
            .iter()
            .filter(|j| j.preempt_reason.is_none() && !j.cancel_requested)
        {
            match store.request_preemption(&ctx, &job.id, &why).await {
                Ok(job) => {
                    asked += 1;
                    tracing::info!(job = %job.id, node = %node.name, "drain's grace over: moving the job");
                    hub.send(&node.id, hub::cancel(&job));
                }
                // Finishing or already stopping: it leaves anyway.
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(asked)
}
