//! Resizing a running job's share of its GPU: checked against what the GPUs and its
//! tenants' quotas hold, under the scheduling passes' lock (which only the leader takes),
//! stored with its history event and audit entry, and sent to its node. Asked by the API
//! (`POST /api/v1/jobs/{id}/resize`) and by the sizing of auto-sized jobs
//! ([`crate::sizing`]).

use std::sync::Arc;

use allot_domain::{AuditContext, Job, JobState, Share};
use allot_scheduler::engine::GpuLimits;
use allot_store::{
    Fenced, JobFilter, JobRepo, LeaderRepo, NodeRepo, StoreError, TenantRepo, TenantScope,
};
use tokio::sync::{Mutex, Notify};

use crate::hub::{self, Hub};

/// Why a resize was not made.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The job no longer holds GPUs (it ended, or was requeued).
    #[error("job {0} no longer holds GPUs")]
    NotHolding(String),
    /// None of the shares asked for fits: why the first does not.
    #[error("{0}")]
    NoRoom(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a resize needs.
pub struct Resizer {
    pub hub: Arc<Hub>,
    /// Held by each scheduling pass and each resize: one decides at a time.
    pub turn: Arc<Mutex<()>>,
    /// Wakes the scheduling loop: a smaller share frees room for what waits.
    pub notify: Arc<Notify>,
    pub gpu_limits: GpuLimits,
}

impl Resizer {
    /// Gives `job_id` the first of `asks` that fits beside the GPUs' other jobs and within
    /// its tenants' hard limits, recording its reason; `store` is the leader's (fenced in
    /// its term). The job resized, and which of `asks` it got.
    pub async fn resize(
        &self,
        store: &Fenced,
        ctx: &AuditContext,
        job_id: &str,
        asks: &[(Share, Option<String>)],
    ) -> Result<(Job, usize), Refused> {
        let _turn = self.turn.lock().await;
        let holding = store
            .list_jobs(JobFilter {
                states: vec![JobState::Scheduled, JobState::Running],
                ..JobFilter::new(TenantScope::All)
            })
            .await?
            .jobs;
        let Some(current) = holding.iter().find(|j| j.id == job_id) else {
            return Err(Refused::NotHolding(job_id.to_owned()));
        };
        let nodes = store.list_nodes().await?;
        let tenants = store.list_tenants().await?;
        let mut first_refusal = None;
        let fitting = asks.iter().position(|(share, _)| {
            match allot_scheduler::resize::check(
                current,
                *share,
                &holding,
                &nodes,
                &tenants,
                &self.gpu_limits,
            ) {
                Ok(()) => true,
                Err(why) => {
                    first_refusal.get_or_insert(why);
                    false
                }
            }
        });
        let Some(i) = fitting else {
            return Err(Refused::NoRoom(
                first_refusal.unwrap_or_else(|| "no share was asked for".to_owned()),
            ));
        };
        let (share, why) = &asks[i];
        let resized = store
            .resize_job(ctx, job_id, *share, why.as_deref())
            .await?;
        if let Some(node) = &resized.node_id {
            self.hub.send(node, hub::resize(&resized));
        }
        self.notify.notify_one();
        Ok((resized, i))
    }
}
