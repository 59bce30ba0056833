//! Keeping gangs whole (see `allot_domain::gang`): on every scheduling pass, the replicas
//! of a gang whose attempt ended elsewhere are stopped (and requeued as the gang's next
//! attempt when their nodes report them stopped), and those of a gang that ended are
//! cancelled.

use allot_domain::gang::{self, Action};
use allot_domain::{AuditContext, Job};
use allot_store::{JobRepo, Store, StoreError};

use crate::hub::{self, Hub};

/// Cancels job `id` (a replica of a gang: the whole gang) and tells the nodes running
/// what was cancelled. Returns the job named.
pub async fn cancel(
    store: &Store,
    hub: &Hub,
    ctx: &AuditContext,
    id: &str,
    by: &str,
) -> Result<Job, StoreError> {
    let job = store.request_cancel(ctx, id, by).await?;
    for j in store.replicas_of(&job).await? {
        if j.state.holds_resources()
            && let Some(node) = &j.node_id
        {
            hub.send(node, hub::cancel(&j));
        }
    }
    Ok(job)
}

/// One round over every unfinished gang. Returns how many replicas it stopped or
/// cancelled.
pub async fn keep_whole(store: &Store, hub: &Hub) -> Result<usize, StoreError> {
    let ctx = AuditContext::system("gangs");
    let mut acted = 0;
    for members in store.unfinished_gangs().await? {
        for action in gang::reconcile(&members) {
            match action {
                Action::Stop { job_id, reason } => {
                    match store.request_preemption(&ctx, &job_id, &reason).await {
                        Ok(job) => {
                            tracing::info!(job = %job.id, %reason, "stopping a replica for its gang");
                            if let Some(node) = &job.node_id {
                                hub.send(node, hub::cancel(&job));
                            }
                            acted += 1;
                        }
                        // Ended or stopping meanwhile.
                        Err(StoreError::Conflict(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                Action::Rerun {
                    job_id,
                    attempt,
                    reason,
                } => match store.rerun_replica(&ctx, &job_id, attempt, &reason).await {
                    Ok(job) => {
                        tracing::info!(job = %job.id, attempt = job.attempt, "a finished replica runs again with its gang");
                        acted += 1;
                    }
                    Err(StoreError::Conflict(_)) => {}
                    Err(e) => return Err(e),
                },
                Action::Cancel { job_id, reason } => {
                    tracing::info!(job = %job_id, %reason, "cancelling a gang");
                    cancel(store, hub, &ctx, &job_id, &format!("its gang ({reason})")).await?;
                    acted += 1;
                    // The whole gang is cancelled at once.
                    break;
                }
            }
        }
    }
    Ok(acted)
}
