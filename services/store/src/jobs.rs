//! Jobs and their persisted state history.

use std::collections::{BTreeMap, HashMap};

use allot_domain::report::RequeueCode;
use allot_domain::{
    AuditContext, AuditEvent, Job, JobEvent, JobSpec, JobState, PendingReason, Share, TenantName,
};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, Func};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect,
};

use crate::audit::{record, record_batch};
use crate::convert::{chunks, json, parse, to_i64, to_json, to_u32, to_u64};
use crate::entities::{job_events, jobs, tenants};
use crate::{Store, StoreError, TenantScope, new_id};

#[derive(Debug, Clone)]
pub struct NewJob {
    pub tenant_id: String,
    pub spec: JobSpec,
    /// The submitting request's W3C trace context, when it was traced.
    pub traceparent: Option<String>,
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
    /// gang, in one transaction; the job returned is the one named.
    fn request_cancel(
        &self,
        ctx: &AuditContext,
        id: &str,
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
    /// Places pending jobs (a gang's replicas) in one transaction: every one moves from
    /// Pending to Scheduled with its update, or none does (`Conflict`).
    fn place_together(
        &self,
        ctx: &AuditContext,
        placements: Vec<(String, JobUpdate)>,
    ) -> impl Future<Output = Result<Vec<Job>, StoreError>> + Send;
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

/// Writes `row` on job `id` if it holds capacity, is not being cancelled and is not
/// already stopping (the leader's request that it stop, for a preemption or a move);
/// returns the job as it is then.
async fn mark_stopping<C: ConnectionTrait>(
    txn: &C,
    id: &str,
    row: jobs::ActiveModel,
) -> Result<Job, StoreError> {
    let res = jobs::Entity::update_many()
        .set(row)
        .filter(jobs::Column::Id.eq(id))
        .filter(holding_capacity())
        .filter(jobs::Column::CancelRequested.eq(false))
        .filter(jobs::Column::PreemptReason.is_null())
        .exec(txn)
        .await?;
    if res.rows_affected == 0 {
        return Err(StoreError::Conflict(format!(
            "job {id} is not running, or is already stopping"
        )));
    }
    load(txn, id).await
}

/// Scheduled or running: the jobs that hold capacity.
fn holding_capacity() -> Condition {
    Condition::all()
        .add(jobs::Column::State.is_in([JobState::Scheduled.as_str(), JobState::Running.as_str()]))
}

fn event_to_domain(e: job_events::Model) -> Result<JobEvent, StoreError> {
    Ok(JobEvent {
        from: e
            .from_state
            .as_deref()
            .map(|s| parse("from_state", s))
            .transpose()?,
        to: parse("to_state", &e.to_state)?,
        at: e.at,
        message: e.message,
        share: match e.gpu_milli {
            Some(milli) => Some(Share {
                gpu_milli: to_u32("gpu_milli", milli.into())?,
                gpu_memory_bytes: to_u64("gpu_memory_bytes", e.gpu_memory_bytes.unwrap_or(0))?,
            }),
            None => None,
        },
    })
}

fn to_domain(m: jobs::Model, tenant: &str) -> Result<Job, StoreError> {
    let command: Vec<String> = json("command", &m.command)?;
    let env: BTreeMap<String, String> = json("env", &m.env)?;
    Ok(Job {
        spec: JobSpec {
            tenant: TenantName::parse("tenant", tenant)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            name: m.name,
            cpu_milli: to_u32("cpu_milli", m.cpu_milli.into())?,
            memory_bytes: to_u64("memory_bytes", m.memory_bytes)?,
            gpus: to_u32("gpus", m.gpus.into())?,
            gpu_milli: m
                .gpu_milli
                .map(|g| to_u32("gpu_milli", g.into()))
                .transpose()?,
            gpu_memory_bytes: m
                .gpu_memory_bytes
                .map(|b| to_u64("gpu_memory_bytes", b))
                .transpose()?,
            gpu_models: json("gpu_models", &m.gpu_models)?,
            priority: m.priority,
            preemptible: m.preemptible,
            isolation: m
                .isolation
                .as_deref()
                .map(|i| parse("isolation", i))
                .transpose()?,
            class: m
                .workload_class
                .as_deref()
                .map(|c| parse("workload_class", c))
                .transpose()?,
            max_retries: to_u32("max_retries", m.max_retries.into())?,
            command,
            env,
            workdir: m.workdir,
            checkpoint_dir: m.checkpoint_dir,
            volumes: json("volumes", &m.volumes)?,
            secrets: json("secrets", &m.secrets)?,
            mig_profile: m.mig_profile,
            gpu_compute: m
                .gpu_compute
                .as_deref()
                .map(|c| parse("gpu_compute", c))
                .transpose()?,
            gpu_resizable: m.gpu_resizable,
            gpu_sizing: allot_domain::GpuSizing {
                max_milli: m
                    .gpu_auto_max_milli
                    .map(|v| to_u32("gpu_auto_max_milli", v.into()))
                    .transpose()?,
                memory: m.gpu_memory_auto,
            },
            image: m.image,
            network: parse("network", &m.network)?,
            time_limit_secs: m
                .time_limit_secs
                .map(|s| to_u64("time_limit_secs", s))
                .transpose()?,
            replicas: to_u32("replicas", m.replicas.into())?,
            pack: m.pack.as_deref().map(|p| json("pack", p)).transpose()?,
        },
        replica: match m.gang_id {
            Some(gang_id) => Some(allot_domain::Replica {
                gang_id,
                rank: to_u32("replica_rank", m.replica_rank.into())?,
            }),
            None => None,
        },
        image_digest: m.image_digest,
        state: parse("state", &m.state)?,
        pending_reason: match (m.pending_code, m.pending_message) {
            (Some(code), Some(message)) => Some(PendingReason { code, message }),
            _ => None,
        },
        gpu_uuids: json("gpu_uuids", &m.gpu_uuids)?,
        pid: m.pid.map(|p| to_u32("pid", p)).transpose()?,
        id: m.id,
        tenant_id: m.tenant_id,
        node_id: m.node_id,
        held_gpu_milli: m
            .held_gpu_milli
            .map(|g| to_u32("held_gpu_milli", g.into()))
            .transpose()?,
        borrowing: m.borrowing,
        attempt: to_u32("attempt", m.attempt.into())?,
        cancel_requested: m.cancel_requested,
        preempt_reason: m.preempt_reason,
        failures: to_u32("failures", m.failures.into())?,
        retry_at: m.retry_at,
        exit_code: m.exit_code,
        message: m.message,
        log_tail: m.log_tail,
        created_at: m.created_at,
        updated_at: m.updated_at,
        scheduled_at: m.scheduled_at,
        started_at: m.started_at,
        finished_at: m.finished_at,
        traceparent: m.traceparent,
        avoid: match m.avoid_until {
            Some(until) => Some(allot_domain::Avoid {
                node_id: m.avoid_node_id,
                gpu_uuids: m
                    .avoid_gpus
                    .as_deref()
                    .map(|g| json("avoid_gpus", g))
                    .transpose()?
                    .unwrap_or_default(),
                until,
            }),
            None => None,
        },
    })
}

fn i32_of(v: u32) -> Result<i32, StoreError> {
    i32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} exceeds i32")))
}

async fn tenant_names<C: ConnectionTrait>(db: &C) -> Result<HashMap<String, String>, StoreError> {
    Ok(tenants::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .map(|t| (t.id, t.name))
        .collect())
}

/// What a job back in the queue no longer has: its placement and its run.
fn clear_placement(row: &mut jobs::ActiveModel) {
    row.node_id = Set(None);
    row.gpu_uuids = Set("[]".to_owned());
    row.pid = Set(None);
    row.held_gpu_milli = Set(None);
    row.borrowing = Set(false);
    row.preempt_reason = Set(None);
    row.scheduled_at = Set(None);
    row.started_at = Set(None);
}

/// The rows of gang `gang_id`, in rank order.
async fn gang_rows<C: ConnectionTrait>(
    db: &C,
    gang_id: &str,
) -> Result<Vec<jobs::Model>, StoreError> {
    Ok(jobs::Entity::find()
        .filter(jobs::Column::GangId.eq(gang_id))
        .order_by_asc(jobs::Column::ReplicaRank)
        .all(db)
        .await?)
}

/// Rows as jobs, their tenants' names looked up in `names`.
fn with_tenants(
    rows: Vec<jobs::Model>,
    names: &HashMap<String, String>,
) -> Result<Vec<Job>, StoreError> {
    rows.into_iter()
        .map(|m| {
            let tenant = names
                .get(&m.tenant_id)
                .ok_or_else(|| StoreError::Corrupt(format!("job {} has no tenant", m.id)))?;
            to_domain(m, tenant)
        })
        .collect()
}

async fn load<C: ConnectionTrait>(db: &C, id: &str) -> Result<Job, StoreError> {
    let m = jobs::Entity::find_by_id(id.to_owned())
        .one(db)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
    let tenant = tenants::Entity::find_by_id(m.tenant_id.clone())
        .one(db)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("job {id} has no tenant")))?;
    to_domain(m, &tenant.name)
}

/// Creates the jobs of `submits` (each a job, or a gang's replicas) in `db`'s transaction:
/// their rows and first events in a few statements, and one `job.submit` audit entry per
/// job on its tenant's log (heads locked in log order). Returns each submit's job (a
/// gang's replica 0), in order.
pub(crate) async fn create_jobs_in<C: ConnectionTrait>(
    db: &C,
    store: &Store,
    submits: Vec<(AuditContext, NewJob)>,
) -> Result<Vec<Job>, StoreError> {
    let now = store.clock.now();
    let (mut rows, mut events, mut firsts) = (Vec::new(), Vec::new(), Vec::new());
    let mut audited: Vec<(AuditContext, String)> = Vec::new();
    for (ctx, new) in &submits {
        let spec = &new.spec;
        // A gang's replicas are created together; replica 0's id is the gang's.
        let first = new_id(store.clock.as_ref());
        let gang = (spec.replicas > 1).then(|| first.clone());
        for rank in 0..std::cmp::max(spec.replicas, 1) {
            let id = if rank == 0 {
                first.clone()
            } else {
                new_id(store.clock.as_ref())
            };
            rows.push(jobs::ActiveModel {
                replicas: Set(i32_of(std::cmp::max(spec.replicas, 1))?),
                gang_id: Set(gang.clone()),
                replica_rank: Set(i32_of(rank)?),
                pack: Set(spec.pack.as_ref().map(|p| to_json("pack", p)).transpose()?),
                id: Set(id.clone()),
                tenant_id: Set(new.tenant_id.clone()),
                name: Set(spec.name.clone()),
                state: Set(JobState::Pending.as_str().to_owned()),
                gpus: Set(i32_of(spec.gpus)?),
                cpu_milli: Set(i32_of(spec.cpu_milli)?),
                memory_bytes: Set(to_i64("memory_bytes", spec.memory_bytes)?),
                gpu_milli: Set(spec.gpu_milli.map(i32_of).transpose()?),
                gpu_models: Set(to_json("gpu_models", &spec.gpu_models)?),
                priority: Set(spec.priority),
                preemptible: Set(spec.preemptible),
                isolation: Set(spec.isolation.map(|i| i.as_str().to_owned())),
                workload_class: Set(spec.class.map(|c| c.as_str().to_owned())),
                held_gpu_milli: Set(None),
                borrowing: Set(false),
                attempt: Set(1),
                preempt_reason: Set(None),
                max_retries: Set(i32_of(spec.max_retries)?),
                failures: Set(0),
                retry_at: Set(None),
                checkpoint_dir: Set(spec.checkpoint_dir.clone()),
                volumes: Set(to_json("volumes", &spec.volumes)?),
                secrets: Set(to_json("secrets", &spec.secrets)?),
                mig_profile: Set(spec.mig_profile.clone()),
                gpu_compute: Set(spec.gpu_compute.map(|c| c.as_str().to_owned())),
                gpu_resizable: Set(spec.gpu_resizable),
                gpu_auto_max_milli: Set(spec.gpu_sizing.max_milli.map(i32_of).transpose()?),
                gpu_memory_auto: Set(spec.gpu_sizing.memory),
                image: Set(spec.image.clone()),
                image_digest: Set(None),
                network: Set(spec.network.as_str().to_owned()),
                traceparent: Set(new.traceparent.clone()),
                avoid_node_id: Set(None),
                avoid_gpus: Set(None),
                avoid_until: Set(None),
                time_limit_secs: Set(spec
                    .time_limit_secs
                    .map(|s| to_i64("time_limit_secs", s))
                    .transpose()?),
                gpu_memory_bytes: Set(spec
                    .gpu_memory_bytes
                    .map(|b| to_i64("gpu_memory_bytes", b))
                    .transpose()?),
                command: Set(to_json("command", &spec.command)?),
                env: Set(to_json("env", &spec.env)?),
                workdir: Set(spec.workdir.clone()),
                pending_code: Set(None),
                pending_message: Set(None),
                node_id: Set(None),
                gpu_uuids: Set("[]".to_owned()),
                cancel_requested: Set(false),
                pid: Set(None),
                exit_code: Set(None),
                message: Set(None),
                log_tail: Set(None),
                created_at: Set(now),
                updated_at: Set(now),
                scheduled_at: Set(None),
                started_at: Set(None),
                finished_at: Set(None),
            });
            events.push(job_events::ActiveModel {
                job_id: Set(id.clone()),
                from_state: Set(None),
                to_state: Set(JobState::Pending.as_str().to_owned()),
                at: Set(now),
                message: Set(None),
                ..Default::default()
            });
            audited.push((ctx.clone(), id));
        }
        firsts.push(first);
    }
    // Bounded statements: PostgreSQL takes at most 65535 bind parameters. Where the
    // database returns inserted rows, they are the jobs as stored; elsewhere they are read.
    let mut inserted = Vec::new();
    let returning = db.support_returning();
    for chunk in chunks(rows, 500) {
        let insert = jobs::Entity::insert_many(chunk);
        if returning {
            inserted.extend(insert.exec_with_returning(db).await?);
        } else {
            insert.exec_without_returning(db).await?;
        }
    }
    for chunk in chunks(events, 2000) {
        job_events::Entity::insert_many(chunk)
            .exec_without_returning(db)
            .await?;
    }
    let names: HashMap<String, String> = submits
        .iter()
        .map(|(_, n)| (n.tenant_id.clone(), n.spec.tenant.as_str().to_owned()))
        .collect();
    let mut created: HashMap<String, Job> = HashMap::new();
    if !returning {
        for chunk in audited.chunks(1000) {
            inserted.extend(
                jobs::Entity::find()
                    .filter(jobs::Column::Id.is_in(chunk.iter().map(|(_, id)| id.clone())))
                    .all(db)
                    .await?,
            );
        }
    }
    for job in with_tenants(inserted, &names)? {
        created.insert(job.id.clone(), job);
    }
    // One entry per job (each replica of a gang too), on its tenant's log.
    let mut by_log: BTreeMap<String, Vec<(AuditContext, AuditEvent)>> = BTreeMap::new();
    for (ctx, id) in audited {
        let job = created
            .get(&id)
            .ok_or_else(|| StoreError::Corrupt(format!("job {id} was not created")))?;
        // Names of `env`, never its values: the entry commits to them instead.
        let event = AuditEvent::success(job.tenant_id.clone(), "job.submit", format!("job/{id}"))
            .after(allot_domain::secret::audited_spec(&id, &job.spec));
        let entries = by_log.entry(event.log.clone()).or_default();
        entries.push((ctx.clone(), event));
        // A job on the node's own network reaches all of it: recorded as such, beside its
        // submit, so a search for `job.host_network` finds every one.
        if job.spec.network == allot_domain::JobNetwork::Host {
            entries.push((
                ctx,
                AuditEvent::success(
                    job.tenant_id.clone(),
                    "job.host_network",
                    format!("job/{id}"),
                )
                .after(serde_json::json!({ "network": "host", "image": job.spec.image })),
            ));
        }
    }
    for (log, events) in by_log {
        record_batch(db, store, &log, events).await?;
    }
    firsts
        .into_iter()
        .map(|id| {
            created
                .remove(&id)
                .ok_or_else(|| StoreError::Corrupt(format!("job {id} was not created")))
        })
        .collect()
}

impl Store {
    async fn transition_in<C: ConnectionTrait>(
        &self,
        db: &C,
        ctx: &AuditContext,
        id: &str,
        from: JobState,
        to: JobState,
        update: JobUpdate,
    ) -> Result<Job, StoreError> {
        from.transition(to)?;
        if let Some(read) = update.tenants_version {
            crate::tenants::check_tenants_version(db, read).await?;
        }
        let now = self.clock.now();
        let mut row = jobs::ActiveModel {
            state: Set(to.as_str().to_owned()),
            updated_at: Set(now),
            pending_code: Set(None),
            pending_message: Set(None),
            ..Default::default()
        };
        match to {
            JobState::Scheduled => {
                // A new attempt: how the last one ended (a preemption, a lost node) is its
                // history now, not what the running job says.
                row.message = Set(None);
                row.exit_code = Set(None);
                row.scheduled_at = Set(Some(now));
                row.held_gpu_milli = Set(update.held_gpu_milli.map(i32_of).transpose()?);
                row.borrowing = Set(update.borrowing.unwrap_or(false));
            }
            JobState::Running => row.started_at = Set(Some(now)),
            JobState::Pending => {
                // Requeued after a preemption: the placement is gone, the next run is a
                // new attempt, and the reason it waits is the preemption until the
                // scheduler says otherwise.
                clear_placement(&mut row);
                row.pending_code = Set(Some(
                    update
                        .requeue_code
                        .map_or("Requeued", |c| c.as_str())
                        .to_owned(),
                ));
                row.pending_message = Set(update.message.clone());
                row.retry_at = Set(update.retry_at);
            }
            s if s.is_terminal() => row.finished_at = Set(Some(now)),
            _ => {}
        }
        if let Some(node) = update.node_id {
            row.node_id = Set(Some(node));
        }
        if let Some(gpus) = &update.gpu_uuids {
            row.gpu_uuids = Set(to_json("gpu_uuids", gpus)?);
        }
        if let Some(pid) = update.pid {
            row.pid = Set(Some(pid.into()));
        }
        if let Some(code) = update.exit_code {
            row.exit_code = Set(Some(code));
        }
        if let Some(msg) = &update.message {
            row.message = Set(Some(msg.clone()));
        }
        if let Some(tail) = update.log_tail {
            row.log_tail = Set(Some(tail));
        }
        let mut query = jobs::Entity::update_many().set(row);
        // A fault's anti-affinity: copied from the placement being given up (the SET
        // clauses read the row as it was).
        match (to, update.requeue_code) {
            (JobState::Pending, Some(RequeueCode::DeviceFault)) => {
                query = query
                    .col_expr(jobs::Column::AvoidGpus, Expr::col(jobs::Column::GpuUuids))
                    .col_expr(
                        jobs::Column::AvoidNodeId,
                        Expr::value(Option::<String>::None),
                    )
                    .col_expr(
                        jobs::Column::AvoidUntil,
                        Expr::value(now + chrono::Duration::seconds(allot_domain::AVOID_FOR_SECS)),
                    );
            }
            (JobState::Pending, Some(RequeueCode::NodeLost)) => {
                query = query
                    .col_expr(jobs::Column::AvoidNodeId, Expr::col(jobs::Column::NodeId))
                    .col_expr(jobs::Column::AvoidGpus, Expr::value(Option::<String>::None))
                    .col_expr(
                        jobs::Column::AvoidUntil,
                        Expr::value(now + chrono::Duration::seconds(allot_domain::AVOID_FOR_SECS)),
                    );
            }
            _ => {}
        }
        if let Some(digest) = &update.image_digest {
            query = query.col_expr(
                jobs::Column::ImageDigest,
                Func::coalesce([
                    Expr::col(jobs::Column::ImageDigest),
                    Expr::value(digest.clone()),
                ])
                .into(),
            );
        }
        if to == JobState::Pending {
            query = query.col_expr(
                jobs::Column::Attempt,
                Expr::col(jobs::Column::Attempt).add(1),
            );
            if update.retry_at.is_some() {
                query = query.col_expr(
                    jobs::Column::Failures,
                    Expr::col(jobs::Column::Failures).add(1),
                );
            }
        }
        let res = query
            .filter(jobs::Column::Id.eq(id))
            .filter(jobs::Column::State.eq(from.as_str()))
            .exec(db)
            .await?;
        if res.rows_affected == 0 {
            let current = load(db, id).await?;
            return Err(StoreError::Conflict(format!(
                "job {id} is {}, not {from}",
                current.state
            )));
        }
        let placed = update.held_gpu_milli;
        let job = load(db, id).await?;
        // A placement records the share the job holds from now on (accounting follows it).
        let share = placed.map(|milli| Share {
            gpu_milli: milli,
            gpu_memory_bytes: job.spec.gpu_memory_bytes.unwrap_or(0),
        });
        job_events::Entity::insert(job_events::ActiveModel {
            job_id: Set(id.to_owned()),
            from_state: Set(Some(from.as_str().to_owned())),
            to_state: Set(to.as_str().to_owned()),
            at: Set(now),
            message: Set(update.message),
            gpu_milli: Set(share.map(|s| i32_of(s.gpu_milli)).transpose()?),
            gpu_memory_bytes: Set(share
                .map(|s| to_i64("gpu_memory_bytes", s.gpu_memory_bytes))
                .transpose()?),
            ..Default::default()
        })
        .exec(db)
        .await?;
        let event =
            AuditEvent::success(job.tenant_id.clone(), "job.transition", format!("job/{id}"))
                .before(serde_json::json!({ "state": from }))
                .after(serde_json::json!({
                    "state": to,
                    "node_id": job.node_id,
                    "gpu_uuids": job.gpu_uuids,
                    "held_gpu_milli": job.held_gpu_milli,
                    "borrowing": job.borrowing,
                    "attempt": job.attempt,
                    "pid": job.pid,
                    "exit_code": job.exit_code,
                    "message": job.message,
                    "image_digest": job.image_digest,
                }));
        record(db, self, ctx, event).await?;
        Ok(job)
    }
    /// `request_cancel` of one job, inside the caller's transaction.
    async fn cancel_in<C: ConnectionTrait>(
        &self,
        txn: &C,
        ctx: &AuditContext,
        id: &str,
    ) -> Result<(), StoreError> {
        let job = load(txn, id).await?;
        if job.cancel_requested {
            return Ok(());
        }
        match job.state {
            s if s.is_terminal() => {}
            JobState::Pending => {
                self.transition_in(
                    txn,
                    ctx,
                    id,
                    JobState::Pending,
                    JobState::Cancelled,
                    JobUpdate {
                        message: Some("cancelled before it was scheduled".into()),
                        ..Default::default()
                    },
                )
                .await?;
            }
            _ => {
                jobs::Entity::update(jobs::ActiveModel {
                    id: Set(id.to_owned()),
                    cancel_requested: Set(true),
                    updated_at: Set(self.clock.now()),
                    ..Default::default()
                })
                .exec(txn)
                .await?;
                let event = AuditEvent::success(
                    job.tenant_id.clone(),
                    "job.cancel.request",
                    format!("job/{id}"),
                )
                .before(serde_json::json!({ "state": job.state, "cancel_requested": false }))
                .after(serde_json::json!({ "state": job.state, "cancel_requested": true }));
                record(txn, self, ctx, event).await?;
            }
        }
        Ok(())
    }
}

impl JobRepo for Store {
    async fn create_job(&self, ctx: &AuditContext, new: NewJob) -> Result<Job, StoreError> {
        let txn = self.begin().await?;
        let mut jobs = create_jobs_in(&txn, self, vec![(ctx.clone(), new)]).await?;
        self.commit(txn).await?;
        jobs.pop()
            .ok_or_else(|| StoreError::Corrupt("a submit created no job".into()))
    }

    async fn job(&self, scope: &TenantScope, id: &str) -> Result<Job, StoreError> {
        let job = load(&self.db, id).await?;
        if !scope.includes(Some(&job.tenant_id)) {
            return Err(StoreError::NotFound(format!("job {id}")));
        }
        Ok(job)
    }

    async fn list_jobs(&self, f: JobFilter) -> Result<JobPage, StoreError> {
        let Some(mut q) = filtered(&f) else {
            return Ok(JobPage {
                jobs: Vec::new(),
                next: None,
            });
        };
        q = if f.oldest_first {
            q.order_by_asc(jobs::Column::Id)
        } else {
            q.order_by_desc(jobs::Column::Id)
        };
        if let Some(before) = &f.before {
            q = q.filter(jobs::Column::Id.lt(before.as_str()));
        }
        if let Some(after) = &f.after {
            q = q.filter(jobs::Column::Id.gt(after.as_str()));
        }
        if let Some(limit) = f.limit {
            // One extra row tells whether another page follows.
            q = q.limit(limit + 1);
        }
        let mut rows = q.all(&self.db).await?;
        let next = match f.limit {
            Some(limit) if rows.len() as u64 > limit => {
                rows.truncate(limit as usize);
                rows.last().map(|r| r.id.clone())
            }
            _ => None,
        };
        let names = tenant_names(&self.db).await?;
        let jobs = with_tenants(rows, &names)?;
        Ok(JobPage { jobs, next })
    }

    async fn count_jobs(&self, f: JobFilter) -> Result<u64, StoreError> {
        use sea_orm::PaginatorTrait;
        match filtered(&f) {
            Some(q) => Ok(q.count(&self.db).await?),
            None => Ok(0),
        }
    }

    async fn count_jobs_by_state(&self) -> Result<Vec<(String, JobState, u64)>, StoreError> {
        #[derive(sea_orm::FromQueryResult)]
        struct Count {
            tenant_id: String,
            state: String,
            n: i64,
        }
        let counts = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::TenantId)
            .column(jobs::Column::State)
            .column_as(jobs::Column::Id.count(), "n")
            // A gang counts once, by its record (replica 0), as lists and tenants count it.
            .filter(jobs::Column::ReplicaRank.eq(0))
            .group_by(jobs::Column::TenantId)
            .group_by(jobs::Column::State)
            .into_model::<Count>()
            .all(&self.db)
            .await?;
        counts
            .into_iter()
            .map(|c| {
                Ok((
                    c.tenant_id,
                    parse("job state", &c.state)?,
                    to_u64("count", c.n)?,
                ))
            })
            .collect()
    }

    async fn transition_job(
        &self,
        ctx: &AuditContext,
        id: &str,
        from: JobState,
        to: JobState,
        update: JobUpdate,
    ) -> Result<Job, StoreError> {
        let txn = self.begin().await?;
        let job = self.transition_in(&txn, ctx, id, from, to, update).await?;
        self.commit(txn).await?;
        Ok(job)
    }

    async fn set_pending_reason(
        &self,
        id: &str,
        reason: Option<PendingReason>,
    ) -> Result<(), StoreError> {
        self.set_pending_reasons(vec![(id.to_owned(), reason)])
            .await
    }

    async fn set_pending_reasons(
        &self,
        reasons: Vec<(String, Option<PendingReason>)>,
    ) -> Result<(), StoreError> {
        let mut by_reason: BTreeMap<(Option<String>, Option<String>), Vec<String>> =
            BTreeMap::new();
        for (id, reason) in reasons {
            let key = match reason {
                Some(r) => (Some(r.code), Some(r.message)),
                None => (None, None),
            };
            by_reason.entry(key).or_default().push(id);
        }
        let txn = self.begin().await?;
        for ((code, message), ids) in by_reason {
            for chunk in ids.chunks(1000) {
                jobs::Entity::update_many()
                    .set(jobs::ActiveModel {
                        pending_code: Set(code.clone()),
                        pending_message: Set(message.clone()),
                        ..Default::default()
                    })
                    .filter(jobs::Column::Id.is_in(chunk.iter().cloned()))
                    .filter(jobs::Column::State.eq(JobState::Pending.as_str()))
                    .exec(&txn)
                    .await?;
            }
        }
        // The scheduler writes this as leader: committed through the fence.
        self.commit(txn).await
    }

    async fn job_changes_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        Ok(jobs::Entity::find()
            .select_only()
            .column(jobs::Column::Id)
            .column(jobs::Column::UpdatedAt)
            .filter(jobs::Column::UpdatedAt.gte(since))
            .into_tuple()
            .all(&self.db)
            .await?)
    }

    async fn jobs_by_id(&self, ids: Vec<String>) -> Result<Vec<Job>, StoreError> {
        let names = tenant_names(&self.db).await?;
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1000) {
            let rows = jobs::Entity::find()
                .filter(jobs::Column::Id.is_in(chunk.iter().cloned()))
                .all(&self.db)
                .await?;
            out.extend(with_tenants(rows, &names)?);
        }
        Ok(out)
    }

    async fn request_cancel(&self, ctx: &AuditContext, id: &str) -> Result<Job, StoreError> {
        let txn = self.begin().await?;
        let named = load(&txn, id).await?;
        let ids = match &named.replica {
            Some(r) => gang_rows(&txn, &r.gang_id)
                .await?
                .into_iter()
                .map(|m| m.id)
                .collect(),
            None => vec![id.to_owned()],
        };
        for id in &ids {
            self.cancel_in(&txn, ctx, id).await?;
        }
        let job = load(&txn, id).await?;
        self.commit(txn).await?;
        Ok(job)
    }

    async fn rerun_replica(
        &self,
        ctx: &AuditContext,
        id: &str,
        attempt: u32,
        reason: &str,
    ) -> Result<Job, StoreError> {
        let now = self.clock.now();
        let txn = self.begin().await?;
        let mut row = jobs::ActiveModel {
            state: Set(JobState::Pending.as_str().to_owned()),
            updated_at: Set(now),
            finished_at: Set(None),
            pending_code: Set(Some("GangRequeued".to_owned())),
            pending_message: Set(Some(reason.to_owned())),
            message: Set(Some(reason.to_owned())),
            ..Default::default()
        };
        clear_placement(&mut row);
        let res = jobs::Entity::update_many()
            .set(row)
            .col_expr(
                jobs::Column::Attempt,
                Expr::col(jobs::Column::Attempt).add(1),
            )
            .filter(jobs::Column::Id.eq(id))
            .filter(jobs::Column::State.eq(JobState::Succeeded.as_str()))
            .filter(jobs::Column::Attempt.eq(i32_of(attempt)?))
            .filter(jobs::Column::GangId.is_not_null())
            .exec(&txn)
            .await?;
        if res.rows_affected == 0 {
            return Err(StoreError::Conflict(format!(
                "job {id} is not a finished replica of a gang at attempt {attempt}"
            )));
        }
        job_events::Entity::insert(job_events::ActiveModel {
            job_id: Set(id.to_owned()),
            from_state: Set(Some(JobState::Succeeded.as_str().to_owned())),
            to_state: Set(JobState::Pending.as_str().to_owned()),
            at: Set(now),
            message: Set(Some(reason.to_owned())),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        let job = load(&txn, id).await?;
        let event =
            AuditEvent::success(job.tenant_id.clone(), "job.transition", format!("job/{id}"))
                .before(serde_json::json!({ "state": JobState::Succeeded, "attempt": attempt }))
                .after(serde_json::json!({
                    "state": JobState::Pending,
                    "attempt": job.attempt,
                    "message": reason,
                }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(job)
    }

    async fn gang(&self, gang_id: &str) -> Result<Vec<Job>, StoreError> {
        let names = tenant_names(&self.db).await?;
        with_tenants(gang_rows(&self.db, gang_id).await?, &names)
    }

    async fn replicas_of(&self, job: &Job) -> Result<Vec<Job>, StoreError> {
        match &job.replica {
            Some(r) => self.gang(&r.gang_id).await,
            None => Ok(vec![job.clone()]),
        }
    }

    async fn unfinished_gangs(&self) -> Result<Vec<Vec<Job>>, StoreError> {
        let unfinished = [
            JobState::Pending.as_str(),
            JobState::Scheduled.as_str(),
            JobState::Running.as_str(),
        ];
        let ids: Vec<String> = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::GangId)
            .distinct()
            .filter(jobs::Column::GangId.is_not_null())
            .filter(jobs::Column::State.is_in(unfinished))
            .into_tuple::<Option<String>>()
            .all(&self.db)
            .await?
            .into_iter()
            .flatten()
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let names = tenant_names(&self.db).await?;
        let rows = jobs::Entity::find()
            .filter(jobs::Column::GangId.is_in(ids))
            .order_by_asc(jobs::Column::GangId)
            .order_by_asc(jobs::Column::ReplicaRank)
            .all(&self.db)
            .await?;
        let mut gangs: Vec<Vec<Job>> = Vec::new();
        for job in with_tenants(rows, &names)? {
            let gang_of = |j: &Job| j.replica.as_ref().map(|r| r.gang_id.clone());
            let same = gangs
                .last()
                .is_some_and(|g| gang_of(&g[0]) == gang_of(&job));
            match gangs.last_mut() {
                Some(g) if same => g.push(job),
                _ => gangs.push(vec![job]),
            }
        }
        Ok(gangs)
    }

    async fn place_together(
        &self,
        ctx: &AuditContext,
        placements: Vec<(String, JobUpdate)>,
    ) -> Result<Vec<Job>, StoreError> {
        let txn = self.begin().await?;
        let mut placed = Vec::with_capacity(placements.len());
        for (id, update) in placements {
            placed.push(
                self.transition_in(
                    &txn,
                    ctx,
                    &id,
                    JobState::Pending,
                    JobState::Scheduled,
                    update,
                )
                .await?,
            );
        }
        self.commit(txn).await?;
        Ok(placed)
    }

    async fn request_preemption(
        &self,
        ctx: &AuditContext,
        id: &str,
        reason: &str,
    ) -> Result<Job, StoreError> {
        let txn = self.begin().await?;
        let row = jobs::ActiveModel {
            preempt_reason: Set(Some(reason.to_owned())),
            updated_at: Set(self.clock.now()),
            ..Default::default()
        };
        let job = mark_stopping(&txn, id, row).await?;
        let event = AuditEvent::success(job.tenant_id.clone(), "job.preempt", format!("job/{id}"))
            .before(serde_json::json!({ "state": job.state, "preempt_reason": null }))
            .after(serde_json::json!({ "state": job.state, "preempt_reason": reason }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(job)
    }

    async fn request_move(
        &self,
        ctx: &AuditContext,
        id: &str,
        reason: &str,
        avoid_gpus: &[String],
        share_milli: Option<u32>,
    ) -> Result<Job, StoreError> {
        let txn = self.begin().await?;
        let before = load(&txn, id).await?;
        let now = self.clock.now();
        let mut row = jobs::ActiveModel {
            preempt_reason: Set(Some(reason.to_owned())),
            avoid_node_id: Set(None),
            avoid_gpus: Set(Some(to_json("avoid_gpus", &avoid_gpus)?)),
            avoid_until: Set(Some(
                now + chrono::Duration::seconds(allot_domain::MOVE_AVOID_SECS),
            )),
            updated_at: Set(now),
            ..Default::default()
        };
        if let Some(milli) = share_milli {
            row.gpu_milli = Set(Some(i32_of(milli)?));
        }
        let job = mark_stopping(&txn, id, row).await?;
        let mut event = AuditEvent::success(job.tenant_id.clone(), "job.move", format!("job/{id}"));
        event.reason = Some(reason.chars().take(500).collect());
        let event = event
            .before(serde_json::json!({
                "node_id": before.node_id,
                "gpu_uuids": before.gpu_uuids,
                "gpu_milli": before.held_gpu_milli.or(before.spec.gpu_milli),
            }))
            .after(serde_json::json!({
                "preempt_reason": reason,
                "gpu_milli": job.spec.gpu_milli,
                "avoid_gpus": avoid_gpus,
            }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(job)
    }

    async fn resize_job(
        &self,
        ctx: &AuditContext,
        id: &str,
        share: Share,
        why: Option<&str>,
    ) -> Result<Job, StoreError> {
        let txn = self.begin().await?;
        let before = load(&txn, id).await?;
        let memory = (share.gpu_memory_bytes > 0)
            .then(|| to_i64("gpu_memory_bytes", share.gpu_memory_bytes))
            .transpose()?;
        let res = jobs::Entity::update_many()
            .set(jobs::ActiveModel {
                gpu_milli: Set(Some(i32_of(share.gpu_milli)?)),
                held_gpu_milli: Set(Some(i32_of(share.gpu_milli)?)),
                gpu_memory_bytes: Set(memory),
                updated_at: Set(self.clock.now()),
                ..Default::default()
            })
            .filter(jobs::Column::Id.eq(id))
            .filter(holding_capacity())
            .exec(&txn)
            .await?;
        if res.rows_affected == 0 {
            return Err(StoreError::Conflict(format!(
                "job {id} is {}: only a scheduled or running job is resized",
                before.state
            )));
        }
        job_events::Entity::insert(job_events::ActiveModel {
            job_id: Set(id.to_owned()),
            from_state: Set(Some(before.state.as_str().to_owned())),
            to_state: Set(before.state.as_str().to_owned()),
            at: Set(self.clock.now()),
            message: Set(Some(format!(
                "resized to {} of each GPU{}{}",
                allot_domain::format_milli(u64::from(share.gpu_milli)),
                if share.gpu_memory_bytes > 0 {
                    format!(
                        ", {} of GPU memory",
                        allot_domain::format_bytes(share.gpu_memory_bytes)
                    )
                } else {
                    String::new()
                },
                why.map(|w| format!(" ({w})")).unwrap_or_default()
            ))),
            gpu_milli: Set(Some(i32_of(share.gpu_milli)?)),
            gpu_memory_bytes: Set(Some(to_i64("gpu_memory_bytes", share.gpu_memory_bytes)?)),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        let job = load(&txn, id).await?;
        let mut event =
            AuditEvent::success(job.tenant_id.clone(), "job.resize", format!("job/{id}"));
        event.reason = why.map(|w| w.chars().take(500).collect());
        let event = event
            .before(serde_json::json!({
                "gpu_milli": before.held_gpu_milli.or(before.spec.gpu_milli),
                "gpu_memory_bytes": before.spec.gpu_memory_bytes,
            }))
            .after(serde_json::json!({
                "gpu_milli": share.gpu_milli,
                "gpu_memory_bytes": job.spec.gpu_memory_bytes,
            }));
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(job)
    }

    async fn jobs_run_since(
        &self,
        scope: &TenantScope,
        since: DateTime<Utc>,
    ) -> Result<Vec<(Job, Vec<JobEvent>)>, StoreError> {
        let rows = jobs::Entity::find()
            .filter(scope.condition(jobs::Column::TenantId))
            .filter(jobs::Column::StartedAt.is_not_null())
            .filter(
                Condition::any()
                    .add(jobs::Column::FinishedAt.is_null())
                    .add(jobs::Column::FinishedAt.gte(since)),
            )
            .order_by_asc(jobs::Column::Id)
            .all(&self.db)
            .await?;
        let names = tenant_names(&self.db).await?;
        let mut events: HashMap<String, Vec<JobEvent>> = HashMap::new();
        for ids in rows.chunks(500) {
            let found = job_events::Entity::find()
                .filter(job_events::Column::JobId.is_in(ids.iter().map(|j| j.id.as_str())))
                .order_by_asc(job_events::Column::Id)
                .all(&self.db)
                .await?;
            for e in found {
                let job = e.job_id.clone();
                events.entry(job).or_default().push(event_to_domain(e)?);
            }
        }
        rows.into_iter()
            .map(|m| {
                let tenant = names
                    .get(&m.tenant_id)
                    .ok_or_else(|| StoreError::Corrupt(format!("job {} has no tenant", m.id)))?;
                let history = events.remove(&m.id).unwrap_or_default();
                Ok((to_domain(m, tenant)?, history))
            })
            .collect()
    }

    async fn job_events(&self, id: &str) -> Result<Vec<JobEvent>, StoreError> {
        job_events::Entity::find()
            .filter(job_events::Column::JobId.eq(id))
            .order_by_asc(job_events::Column::Id)
            .all(&self.db)
            .await?
            .into_iter()
            .map(event_to_domain)
            .collect()
    }
}

/// The jobs a filter's conditions match (its cursors, order and limit aside); `None` when it
/// can match none.
fn filtered(f: &JobFilter) -> Option<sea_orm::Select<jobs::Entity>> {
    let mut q = jobs::Entity::find().filter(f.scope.condition(jobs::Column::TenantId));
    if !f.states.is_empty() {
        q = q.filter(jobs::Column::State.is_in(f.states.iter().map(|s| s.as_str())));
    }
    if let Some(n) = &f.node_id {
        q = q.filter(jobs::Column::NodeId.eq(n.as_str()));
    }
    if f.gangs_whole {
        q = q.filter(jobs::Column::ReplicaRank.eq(0));
    }
    if let Some(name) = &f.name {
        q = q.filter(jobs::Column::Name.eq(name.as_str()));
    }
    if let Some(part) = &f.name_contains {
        // What was typed, literally: `%`, `_` and the escape itself are escaped.
        let escaped: String = part
            .chars()
            .flat_map(|c| match c {
                '%' | '_' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        // Either case, on either database (SQLite's LIKE ignores ASCII case, PostgreSQL's
        // does not).
        let pattern = format!("%{}%", escaped.to_lowercase());
        q = q.filter(
            Expr::expr(Func::lower(Expr::col(jobs::Column::Name)))
                .like(sea_orm::sea_query::LikeExpr::new(pattern).escape('\\')),
        );
    }
    if let Some(prefix) = &f.id_prefix {
        // An id's characters only: nothing a LIKE pattern would read as a wildcard.
        if !prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return None;
        }
        q = q.filter(jobs::Column::Id.starts_with(prefix.to_ascii_lowercase()));
    }
    if let Some(short) = &f.short_id {
        if !allot_domain::job::is_short_id(short) {
            return None;
        }
        // The expression of the index, character for character (a bound position would not
        // match it on PostgreSQL).
        q = q.filter(Expr::cust(r#"substr("id", 25)"#).eq(short.to_ascii_lowercase()));
    }
    Some(q)
}
