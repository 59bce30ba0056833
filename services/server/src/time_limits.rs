//! Time limits: an attempt still running when its job's time limit is reached is stopped,
//! as a cancel is (its node signals it, with the agent's grace, and reports it cancelled),
//! and the job ends saying why. Checked on every scheduling pass.

use allot_domain::{AuditContext, Job, JobState};
use allot_store::{JobFilter, JobRepo, Store, StoreError, TenantScope};
use chrono::{DateTime, Utc};

use crate::hub::Hub;

/// When `job`'s attempt reaches its time limit, if it has one and has started.
pub fn deadline(job: &Job) -> Option<DateTime<Utc>> {
    Some(job.started_at? + job.spec.time_limit()?)
}

/// The end message of a job stopped at its time limit: "time limit of 2h 0m reached".
pub fn reached(job: &Job) -> Option<String> {
    Some(format!(
        "time limit of {} reached",
        allot_domain::format_duration(job.spec.time_limit()?.num_seconds())
    ))
}

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
        if job.cancel_requested || deadline(&job).is_none_or(|d| d > now) {
            continue;
        }
        tracing::info!(job = %job.id, node = ?job.node_id, "stopping a job at its time limit");
        crate::gangs::cancel(store, hub, &ctx, &job.id).await?;
    }
    Ok(())
}
