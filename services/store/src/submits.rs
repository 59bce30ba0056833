//! Submits in groups: the jobs submitted to one replica while the previous group commits
//! are created together, one transaction per tenant (its audit log), so a busy tenant pays
//! one commit and one lock of its log's head per group instead of one per job.

use allot_domain::{AuditContext, Job};

use crate::group_commit::GroupCommit;
use crate::jobs::create_jobs_in;
use crate::{NewJob, Store, StoreError};

/// The queue submits go through; [`crate::JobRepo::create_job`] is the same write for one.
#[derive(Clone)]
pub struct SubmitBatcher {
    queue: GroupCommit<(AuditContext, NewJob), Job>,
}

impl SubmitBatcher {
    /// Starts the committing task; it ends when every clone of the batcher is dropped.
    pub fn start(store: Store, max_batch: usize) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, task) = GroupCommit::start(
            max_batch,
            |(_, new): &(AuditContext, NewJob)| new.tenant_id.clone(),
            move |_, submits| {
                let store = store.clone();
                async move { commit(&store, submits).await }
            },
        );
        (Self { queue }, task)
    }

    /// Creates the job (or the gang) once its group has committed.
    pub async fn create(&self, ctx: AuditContext, new: NewJob) -> Result<Job, StoreError> {
        self.queue.submit((ctx, new)).await
    }
}

/// One group in one transaction; when that fails for something other than an unreachable
/// database, each submit again on its own, so one that cannot be written fails alone, with
/// its own error.
async fn commit(
    store: &Store,
    submits: Vec<(AuditContext, NewJob)>,
) -> Vec<Result<Job, StoreError>> {
    let n = submits.len();
    let together = async {
        let txn = store.begin().await?;
        let jobs = create_jobs_in(&txn, store, submits.clone()).await?;
        store.commit(txn).await?;
        Ok::<_, StoreError>(jobs)
    }
    .await;
    match together {
        Ok(jobs) => jobs.into_iter().map(Ok).collect(),
        Err(e) if n == 1 => vec![Err(e)],
        Err(e @ StoreError::Unavailable(_)) => (0..n).map(|_| Err(e.retold())).collect(),
        Err(_) => {
            let mut out = Vec::with_capacity(n);
            for (ctx, new) in submits {
                out.push(crate::JobRepo::create_job(store, &ctx, new).await);
            }
            out
        }
    }
}
