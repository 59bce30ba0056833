//! Jobs and their persisted state history: the repository's types and trait here, its
//! reads, state changes and the leader's placement writes each in a module of their own.

mod placement;
mod reads;
mod rows;
mod transitions;

pub(crate) use transitions::create_jobs_in;

use allot_domain::{AuditContext, Job, JobEvent, JobSpec, JobState, PendingReason, Share};
use chrono::{DateTime, Utc};

use crate::{Fenced, Store, StoreError, TenantScope};

#[derive(Debug, Clone)]
pub struct NewJob {
    pub tenant_id: String,
    pub spec: JobSpec,
    /// The submitting request's W3C trace context, when it was traced.
    pub traceparent: Option<String>,
    /// Who submitted it: the person's or the token's name.
    pub submitted_by: Option<String>,
}

/// Which jobs to list. Results are newest first; `before` is the id of the last job of the
/// previous page.
#[derive(Debug, Clone)]
pub struct JobFilter {
    /// Whose jobs: there is no default.
    pub scope: TenantScope,
    pub states: Vec<JobState>,
    pub node_id: Option<String>,
    /// Only jobs of this name.
    pub name: Option<String>,
    /// Only jobs whose id starts with this (hex digits and `-`).
    pub id_prefix: Option<String>,
    /// Only the jobs with this short id ([`allot_domain::job::short_id`]; index
    /// `idx_jobs_short_id`).
    pub short_id: Option<String>,
    /// Only jobs whose name contains this (as typed: no wildcards).
    pub name_contains: Option<String>,
    /// Only jobs whose name matches this glob: `*` any run of characters, `?` any one.
    pub name_glob: Option<String>,
    /// Only the tasks of this array.
    pub array_id: Option<String>,
    /// Each array as one job: of its tasks, only its first (whose id is the array's).
    pub arrays_whole: bool,
    /// Only jobs submitted by this person or token (by name).
    pub submitted_by: Option<String>,
    /// Only jobs submitted before the one with this id.
    pub before: Option<String>,
    /// Only jobs submitted after the one with this id.
    pub after: Option<String>,
    /// Oldest first (else newest first); a page's `next` goes on in the same order.
    pub oldest_first: bool,
    /// Jobs as their submitters see them: of a gang, only its replica 0 (the gang's
    /// record).
    pub gangs_whole: bool,
    pub limit: Option<u64>,
}

impl JobFilter {
    /// Every job in `scope`, with no other filter.
    pub fn new(scope: TenantScope) -> Self {
        Self {
            scope,
            states: Vec::new(),
            node_id: None,
            name: None,
            id_prefix: None,
            short_id: None,
            name_contains: None,
            name_glob: None,
            array_id: None,
            arrays_whole: false,
            submitted_by: None,
            before: None,
            after: None,
            oldest_first: false,
            gangs_whole: false,
            limit: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Pass as `before` to get the next page; `None` on the last page.
    pub next: Option<String>,
}

/// Fields a transition may set alongside the new state.
#[derive(Debug, Clone, Default)]
pub struct JobUpdate {
    pub node_id: Option<String>,
    pub gpu_uuids: Option<Vec<String>>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
    pub log_tail: Option<String>,
    /// On placement: the share of each GPU held, and whether it borrows.
    pub held_gpu_milli: Option<u32>,
    pub borrowing: Option<bool>,
    /// On a requeue (back to Pending): the pending reason's code (`Preempted`, `NodeLost`,
    /// `DeviceFault`, `RetryBackoff`; `Requeued` when absent), and for a retry after a
    /// failure, when it may start (the failure is counted).
    pub requeue_code: Option<allot_domain::report::RequeueCode>,
    pub retry_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The manifest digest the job's image resolved to (kept from the first report that
    /// gives one: a job's digest never changes).
    pub image_digest: Option<String>,
    /// On placement: the tenants' version the decision read their quotas at. The placement
    /// is written only if no tenant changed since (checked in its transaction, the version
    /// row share-locked on PostgreSQL, so a quota change waits for it or it sees the
    /// change), else [`StoreError::Stale`]: a placement is held to the quotas in force when
    /// it commits.
    pub tenants_version: Option<i64>,
}

pub trait JobRepo {
    fn create_job(
        &self,
        ctx: &AuditContext,
        new: NewJob,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
    /// The job, if it exists and is in `scope` (else `NotFound`).
    fn job(
        &self,
        scope: &TenantScope,
        id: &str,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
    fn list_jobs(&self, f: JobFilter) -> impl Future<Output = Result<JobPage, StoreError>> + Send;
    /// How many jobs the filter matches, its cursors and limit aside.
    fn count_jobs(&self, f: JobFilter) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// How many jobs each tenant (by id) has in each state, a gang once (its replica 0), counted by the database (what
    /// the metrics report, without reading every job ever submitted).
    fn count_jobs_by_state(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, JobState, u64)>, StoreError>> + Send;
    /// How many tasks of each of these arrays (by id) are in each state, counted by the
    /// database: one read for a page of arrays.
    fn array_task_counts(
        &self,
        array_ids: &[String],
    ) -> impl Future<Output = Result<Vec<(String, JobState, u64)>, StoreError>> + Send;
    /// Moves a job from `from` to `to` if it is still in `from`, recording the transition.
    /// Fails with `Conflict` when another change got there first.
    fn transition_job(
        &self,
        ctx: &AuditContext,
        id: &str,
        from: JobState,
        to: JobState,
        update: JobUpdate,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
    /// Records why a pending job waits (or clears it); a no-op once the job left Pending.
    fn set_pending_reason(
        &self,
        id: &str,
        reason: Option<PendingReason>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// [`JobRepo::set_pending_reason`] for many jobs, in one transaction (a statement per
    /// distinct reason).
    fn set_pending_reasons(
        &self,
        reasons: Vec<(String, Option<PendingReason>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The ids of jobs in any state whose record changed at or after `since`, each with
    /// when it last changed (`updated_at`; pending reasons change no `updated_at`).
    fn job_changes_since(
        &self,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<(String, DateTime<Utc>)>, StoreError>> + Send;
    /// The jobs of `ids` that exist, as they are now, in no particular order.
    fn jobs_by_id(
        &self,
        ids: Vec<String>,
    ) -> impl Future<Output = Result<Vec<Job>, StoreError>> + Send;
    /// Cancels a pending job at once; marks a scheduled or running one for the agent to stop.
    /// Idempotent, and a no-op on a finished job. A replica of a gang cancels the whole
    /// gang, in one transaction; the job returned is the one named. `by` is who asked (a
    /// person's or token's name, or what of the control plane did), said in the job's events.
    fn request_cancel(
        &self,
        ctx: &AuditContext,
        id: &str,
        by: &str,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
    fn job_events(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Vec<JobEvent>, StoreError>> + Send;
    /// The replicas of gang `gang_id`, in rank order (empty for no such gang).
    fn gang(&self, gang_id: &str) -> impl Future<Output = Result<Vec<Job>, StoreError>> + Send;
    /// `job`'s gang's replicas, in rank order, or `job` alone.
    fn replicas_of(&self, job: &Job) -> impl Future<Output = Result<Vec<Job>, StoreError>> + Send;
    /// A replica of a gang that finished (`attempt`, succeeded) while its gang's attempt did
    /// not, back to Pending as the gang's next attempt, saying `reason`: the one way out of
    /// a terminal state, and only for a gang's replica (`Conflict` otherwise, or when it
    /// moved meanwhile).
    fn rerun_replica(
        &self,
        ctx: &AuditContext,
        id: &str,
        attempt: u32,
        reason: &str,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
    /// Every gang with a replica not yet finished, each in rank order.
    fn unfinished_gangs(&self) -> impl Future<Output = Result<Vec<Vec<Job>>, StoreError>> + Send;
    /// Jobs in `scope` that ran at some time since `since` (started, and not finished
    /// before it), each with its state history: what usage accounting reads.
    fn jobs_run_since(
        &self,
        scope: &TenantScope,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<(Job, Vec<JobEvent>)>, StoreError>> + Send;
    /// Marks a scheduled or running job for the agent to stop so that reclaim can give its
    /// capacity to another; once stopped it is requeued (`transition_job` to Pending).
    /// `Conflict` when the job no longer holds capacity, is being cancelled, or is already
    /// being preempted.
    fn request_preemption(
        &self,
        ctx: &AuditContext,
        id: &str,
        reason: &str,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
}

impl JobRepo for Store {
    async fn create_job(&self, ctx: &AuditContext, new: NewJob) -> Result<Job, StoreError> {
        transitions::create_job(self, ctx, new).await
    }

    async fn job(&self, scope: &TenantScope, id: &str) -> Result<Job, StoreError> {
        reads::job(self, scope, id).await
    }

    async fn list_jobs(&self, f: JobFilter) -> Result<JobPage, StoreError> {
        reads::list_jobs(self, f).await
    }

    async fn count_jobs(&self, f: JobFilter) -> Result<u64, StoreError> {
        reads::count_jobs(self, f).await
    }

    async fn count_jobs_by_state(&self) -> Result<Vec<(String, JobState, u64)>, StoreError> {
        reads::count_jobs_by_state(self).await
    }

    async fn array_task_counts(
        &self,
        array_ids: &[String],
    ) -> Result<Vec<(String, JobState, u64)>, StoreError> {
        reads::array_task_counts(self, array_ids).await
    }

    async fn transition_job(
        &self,
        ctx: &AuditContext,
        id: &str,
        from: JobState,
        to: JobState,
        update: JobUpdate,
    ) -> Result<Job, StoreError> {
        transitions::transition_job(self, ctx, id, from, to, update).await
    }

    async fn set_pending_reason(
        &self,
        id: &str,
        reason: Option<PendingReason>,
    ) -> Result<(), StoreError> {
        transitions::set_pending_reason(self, id, reason).await
    }

    async fn set_pending_reasons(
        &self,
        reasons: Vec<(String, Option<PendingReason>)>,
    ) -> Result<(), StoreError> {
        transitions::set_pending_reasons(self, reasons).await
    }

    async fn job_changes_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        reads::job_changes_since(self, since).await
    }

    async fn jobs_by_id(&self, ids: Vec<String>) -> Result<Vec<Job>, StoreError> {
        reads::jobs_by_id(self, ids).await
    }

    async fn request_cancel(
        &self,
        ctx: &AuditContext,
        id: &str,
        by: &str,
    ) -> Result<Job, StoreError> {
        transitions::request_cancel(self, ctx, id, by).await
    }

    async fn rerun_replica(
        &self,
        ctx: &AuditContext,
        id: &str,
        attempt: u32,
        reason: &str,
    ) -> Result<Job, StoreError> {
        transitions::rerun_replica(self, ctx, id, attempt, reason).await
    }

    async fn gang(&self, gang_id: &str) -> Result<Vec<Job>, StoreError> {
        reads::gang(self, gang_id).await
    }

    async fn replicas_of(&self, job: &Job) -> Result<Vec<Job>, StoreError> {
        reads::replicas_of(self, job).await
    }

    async fn unfinished_gangs(&self) -> Result<Vec<Vec<Job>>, StoreError> {
        reads::unfinished_gangs(self).await
    }

    async fn request_preemption(
        &self,
        ctx: &AuditContext,
        id: &str,
        reason: &str,
    ) -> Result<Job, StoreError> {
        placement::request_preemption(self, ctx, id, reason).await
    }

    async fn jobs_run_since(
        &self,
        scope: &TenantScope,
        since: DateTime<Utc>,
    ) -> Result<Vec<(Job, Vec<JobEvent>)>, StoreError> {
        reads::jobs_run_since(self, scope, since).await
    }

    async fn job_events(&self, id: &str) -> Result<Vec<JobEvent>, StoreError> {
        reads::job_events(self, id).await
    }
}

/// The writes only a leader makes, on its [`Fenced`] handle alone: each commits only while
/// the leader's term holds, so a leader paused past its lease (or a replica that never
/// led) has no way to place, move or resize anything.
pub trait LeaderRepo {
    /// Places pending jobs (a gang's replicas) in one transaction: every one moves from
    /// Pending to Scheduled with its update, or none does (`Conflict`).
    fn place_together(
        &self,
        ctx: &AuditContext,
        placements: Vec<(String, JobUpdate)>,
    ) -> impl Future<Output = Result<Vec<Job>, StoreError>> + Send;
    /// Marks a scheduled or running job to be stopped and placed again elsewhere (an
    /// auto-sized job moved by its forecast, or best-effort work giving way): as
    /// [`JobRepo::request_preemption`], and its next attempt avoids `avoid_gpus` for a while
    /// and, when `share_milli` is given, asks for that share of a GPU.
    fn request_move(
        &self,
        ctx: &AuditContext,
        id: &str,
        reason: &str,
        avoid_gpus: &[String],
        share_milli: Option<u32>,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
    /// Gives a scheduled or running job on shares of GPUs a new share of each: its request,
    /// what it holds, and a history event accounting follows, saying `why` when given (an
    /// auto-sized job's reason and figures). `Conflict` when it no longer holds capacity.
    fn resize_job(
        &self,
        ctx: &AuditContext,
        id: &str,
        share: Share,
        why: Option<&str>,
    ) -> impl Future<Output = Result<Job, StoreError>> + Send;
}

impl LeaderRepo for Fenced {
    async fn place_together(
        &self,
        ctx: &AuditContext,
        placements: Vec<(String, JobUpdate)>,
    ) -> Result<Vec<Job>, StoreError> {
        placement::place_together(self, ctx, placements).await
    }

    async fn request_move(
        &self,
        ctx: &AuditContext,
        id: &str,
        reason: &str,
        avoid_gpus: &[String],
        share_milli: Option<u32>,
    ) -> Result<Job, StoreError> {
        placement::request_move(self, ctx, id, reason, avoid_gpus, share_milli).await
    }

    async fn resize_job(
        &self,
        ctx: &AuditContext,
        id: &str,
        share: Share,
        why: Option<&str>,
    ) -> Result<Job, StoreError> {
        placement::resize_job(self, ctx, id, share, why).await
    }
}
