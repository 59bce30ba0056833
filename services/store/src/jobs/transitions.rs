//! Jobs' state changes: created, moved along the state machine (each change one event and
//! one audit entry in the same transaction), cancelled, their pending reasons, and a gang's
//! replica run again.

use std::collections::{BTreeMap, HashMap};

use allot_domain::report::RequeueCode;
use allot_domain::{AuditContext, AuditEvent, Job, JobState, PendingReason, Share};
use sea_orm::sea_query::{Expr, ExprTrait, Func};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use crate::audit::{record, record_batch};
use crate::convert::{chunks, to_i64, to_json};
use crate::entities::{job_events, jobs};
use crate::{Store, StoreError, new_id};

use super::rows::{clear_placement, gang_rows, i32_of, load, with_tenants};
use super::{JobRepo, JobUpdate, NewJob};

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
        let tasks: Vec<Option<u32>> = match &spec.array {
            Some(a) => a
                .tasks()
                .map_err(|e| StoreError::Refused(format!("array: {e}")))?
                .into_iter()
                .map(Some)
                .collect(),
            None => vec![None],
        };
        let units: Vec<(Option<u32>, u32)> = tasks
            .iter()
            .flat_map(|task| (0..std::cmp::max(spec.replicas, 1)).map(move |rank| (*task, rank)))
            .collect();
        // A gang's replicas are created together; replica 0's id is the gang's. An array's
        // tasks too (one replica each): the first task's id is the array's. Ids in the
        // order of the tasks and replicas (time-ordered ids drawn in one millisecond are
        // not), so that a listing by id lists them in order.
        let mut ids: Vec<String> = units.iter().map(|_| new_id(store.clock.as_ref())).collect();
        ids.sort();
        let first = ids
            .first()
            .cloned()
            .ok_or_else(|| StoreError::Refused("a submit of no job".into()))?;
        let gang = (spec.replicas > 1).then(|| first.clone());
        for ((task, rank), id) in units.into_iter().zip(ids) {
            rows.push(jobs::ActiveModel {
                submitted_by: Set(new.submitted_by.clone()),
                array_id: Set(task.map(|_| first.clone())),
                array_index: Set(task.map(i32_of).transpose()?),
                array_spec: Set(spec.array.as_ref().map(ToString::to_string)),
                dependencies: Set(to_json("dependencies", &spec.dependencies)?),
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
                writer_epoch: Set(store.writer_epoch()),
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
    pub(super) async fn transition_in<C: ConnectionTrait>(
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
            writer_epoch: Set(self.writer_epoch()),
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
    pub(super) async fn cancel_in<C: ConnectionTrait>(
        &self,
        txn: &C,
        ctx: &AuditContext,
        id: &str,
        by: &str,
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
                        message: Some(format!("cancelled by {by} before it was scheduled")),
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
                    writer_epoch: Set(self.writer_epoch()),
                    ..Default::default()
                })
                .exec(txn)
                .await?;
                // Who asked, in the job's events (its end is the node's to report).
                job_events::Entity::insert(job_events::ActiveModel {
                    job_id: Set(id.to_owned()),
                    from_state: Set(Some(job.state.as_str().to_owned())),
                    to_state: Set(job.state.as_str().to_owned()),
                    at: Set(self.clock.now()),
                    message: Set(Some(format!("cancel requested by {by}"))),
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

pub(super) async fn create_job(
    store: &Store,
    ctx: &AuditContext,
    new: NewJob,
) -> Result<Job, StoreError> {
    let txn = store.begin().await?;
    let mut jobs = create_jobs_in(&txn, store, vec![(ctx.clone(), new)]).await?;
    store.commit(txn).await?;
    jobs.pop()
        .ok_or_else(|| StoreError::Corrupt("a submit created no job".into()))
}

pub(super) async fn transition_job(
    store: &Store,
    ctx: &AuditContext,
    id: &str,
    from: JobState,
    to: JobState,
    update: JobUpdate,
) -> Result<Job, StoreError> {
    let txn = store.begin().await?;
    let job = store.transition_in(&txn, ctx, id, from, to, update).await?;
    store.commit(txn).await?;
    Ok(job)
}

pub(super) async fn set_pending_reason(
    store: &Store,
    id: &str,
    reason: Option<PendingReason>,
) -> Result<(), StoreError> {
    store
        .set_pending_reasons(vec![(id.to_owned(), reason)])
        .await
}

/// Writes each job's pending reason. It leaves `updated_at` alone (a reason is no change of
/// the job's record its watchers follow) but stamps `writer_epoch` like every job write, so
/// the column always names the last writer; such a write is therefore not dated, and
/// [`crate::LeadershipRepo::deposed_job_writes`] sees a deposed one only if the row was
/// last dated after the later term began.
pub(super) async fn set_pending_reasons(
    store: &Store,
    reasons: Vec<(String, Option<PendingReason>)>,
) -> Result<(), StoreError> {
    let mut by_reason: BTreeMap<(Option<String>, Option<String>), Vec<String>> = BTreeMap::new();
    for (id, reason) in reasons {
        let key = match reason {
            Some(r) => (Some(r.code), Some(r.message)),
            None => (None, None),
        };
        by_reason.entry(key).or_default().push(id);
    }
    let txn = store.begin().await?;
    for ((code, message), ids) in by_reason {
        for chunk in ids.chunks(1000) {
            jobs::Entity::update_many()
                .set(jobs::ActiveModel {
                    pending_code: Set(code.clone()),
                    pending_message: Set(message.clone()),
                    writer_epoch: Set(store.writer_epoch()),
                    ..Default::default()
                })
                .filter(jobs::Column::Id.is_in(chunk.iter().cloned()))
                .filter(jobs::Column::State.eq(JobState::Pending.as_str()))
                .exec(&txn)
                .await?;
        }
    }
    // The scheduler writes this as leader: committed through the fence.
    store.commit(txn).await
}

pub(super) async fn request_cancel(
    store: &Store,
    ctx: &AuditContext,
    id: &str,
    by: &str,
) -> Result<Job, StoreError> {
    let txn = store.begin().await?;
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
        store.cancel_in(&txn, ctx, id, by).await?;
    }
    let job = load(&txn, id).await?;
    store.commit(txn).await?;
    Ok(job)
}

pub(super) async fn rerun_replica(
    store: &Store,
    ctx: &AuditContext,
    id: &str,
    attempt: u32,
    reason: &str,
) -> Result<Job, StoreError> {
    let now = store.clock.now();
    let txn = store.begin().await?;
    let mut row = jobs::ActiveModel {
        state: Set(JobState::Pending.as_str().to_owned()),
        updated_at: Set(now),
        finished_at: Set(None),
        pending_code: Set(Some("GangRequeued".to_owned())),
        pending_message: Set(Some(reason.to_owned())),
        message: Set(Some(reason.to_owned())),
        writer_epoch: Set(store.writer_epoch()),
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
    let event = AuditEvent::success(job.tenant_id.clone(), "job.transition", format!("job/{id}"))
        .before(serde_json::json!({ "state": JobState::Succeeded, "attempt": attempt }))
        .after(serde_json::json!({
            "state": JobState::Pending,
            "attempt": job.attempt,
            "message": reason,
        }));
    record(&txn, store, ctx, event).await?;
    store.commit(txn).await?;
    Ok(job)
}
