//! Time limits: an attempt still running when its job's time limit is reached is stopped,
//! as a cancel is (its node signals it, with the agent's grace, and reports it cancelled),
//! and the job ends saying why. Checked on every scheduling pass.

use allot_domain::{AuditContext, JobState};
use allot_store::{JobFilter, JobRepo, Store, StoreError, TenantScope};

use crate::hub::Hub;

/// Asks the nodes of running jobs past their time limit to stop them.
pub async fn stop_overdue(store: &Store, hub: &Hub) -> Result<(), StoreError> {
    let now = store.clock().now();
    let running = store
        .list_jobs(JobFilter {
            states: vec![JobState::Running],
            ..JobFilter::new(TenantScope::All)
        })
        .await?
        .jobs;
    let ctx = AuditContext::system("time-limit");
    for job in running {
        if job.cancel_requested || allot_domain::report::deadline(&job).is_none_or(|d| d > now) {
            continue;
        }
        tracing::info!(job = %job.id, node = ?job.node_id, "stopping a job at its time limit");
        crate::gangs::cancel(store, hub, &ctx, &job.id, "its time limit").await?;
    }
    Ok(())
}
