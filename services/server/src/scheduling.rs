//! The scheduling loop: snapshot the store, run the scheduling engine, persist its decisions
//! (placements, preemptions, reasons) and tell the nodes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use allot_domain::{AuditContext, AuditEvent, JobState, SYSTEM_LOG};
use allot_domain::{Job, PendingReason};
use allot_scheduler::{LiveDecision, LiveError, LiveScheduler, Snapshot};
use allot_store::{
    AuditRepo, Fenced, JobFilter, JobRepo, JobUpdate, LeaderRepo, NodeRepo, PendingJobs, Store,
    StoreError, TenantRepo, TenantScope,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::elastic::ElasticShares;
use crate::hub::{self, Hub};

/// Why a pass did not finish.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Scheduler(#[from] LiveError),
}

/// When a node is lost, as the passes judge it (`crate::leases`): unheard for the outage
/// tolerance, counted from its last heartbeat or this leader's taking office (`since`),
/// whichever is later.
#[derive(Debug, Clone, Copy)]
pub struct NodeLoss {
    pub since: chrono::DateTime<chrono::Utc>,
    pub outage_tolerance: Duration,
}

/// Runs passes whenever notified, and every `interval` regardless (leases lapse silently).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    store: Fenced,
    hub: Arc<Hub>,
    mut scheduler: LiveScheduler,
    loss: NodeLoss,
    sizing: Arc<crate::sizing::Sizing>,
    elastic: Option<Arc<ElasticShares>>,
    turn: Arc<tokio::sync::Mutex<()>>,
    notify: Arc<Notify>,
    interval: Duration,
    metrics: Arc<crate::metrics::Metrics>,
    stop: CancellationToken,
) {
    let mut saved = crate::memory::take_up(
        &store,
        &mut scheduler,
        elastic.as_deref(),
        loss.outage_tolerance,
    )
    .await;
    let mut pending = PassState::new(loss);
    let mut last_took = Duration::ZERO;
    loop {
        let stopping = tokio::select! {
            () = stop.cancelled() => true,
            () = notify.notified() => {
                // A pass woken by work waits twice as long as the last one took: under a
                // stream of submits, scheduling takes at most about a third of a core (the
                // rest serves the submits), and each pass takes all that came meanwhile.
                tokio::select! {
                    () = stop.cancelled() => true,
                    () = tokio::time::sleep((last_took * 2).min(MAX_PASS_GAP)) => false,
                }
            }
            () = tokio::time::sleep(interval) => false,
        };
        if stopping {
            return;
        }
        let started = std::time::Instant::now();
        let result = {
            // Resizes wait for the pass, and the pass for them.
            let _turn = turn.lock().await;
            pass(
                &store,
                &hub,
                &mut scheduler,
                &mut pending,
                elastic.as_deref(),
                Some(&sizing),
            )
            .await
        };
        last_took = started.elapsed();
        metrics.scheduling_pass(result.is_ok(), last_took);
        if let Ok(Passed::Stale) = result {
            // Its placements met changed quotas: decide again on a fresh read.
            notify.notify_one();
        }
        if let Some((plan, error)) = elastic.as_ref().and_then(|e| e.last()) {
            metrics.elastic(&plan, &error);
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "scheduling pass failed; retrying on the next tick");
        }
        // What the pass changed of the scheduler's memory is kept before the next: a new
        // leader carries on from it.
        let now = crate::memory::Remembered::of(&scheduler, elastic.as_deref());
        crate::memory::save(&store, now, &mut saved).await;
    }
}

/// The longest a pass woken by work waits after the previous one.
const MAX_PASS_GAP: Duration = Duration::from_millis(500);

async fn jobs_in(store: &Store, states: &[JobState]) -> Result<Vec<allot_domain::Job>, StoreError> {
    Ok(store
        .list_jobs(JobFilter {
            states: states.to_vec(),
            ..JobFilter::new(TenantScope::All)
        })
        .await?
        .jobs)
}

/// Makes the elastic policy's preemptions (with its grace period) and holds back the
/// pending jobs of classes it says wait (their reasons into `reasons`); returns the pending
/// jobs left to place.
async fn apply_elastic<'a>(
    store: &Store,
    hub: &Hub,
    elastic: &ElasticShares,
    nodes: &[allot_domain::Node],
    holding: &[Job],
    pending: Cow<'a, [Job]>,
    reasons: &mut Vec<(String, Option<PendingReason>)>,
) -> Result<Cow<'a, [Job]>, StoreError> {
    let plan = elastic.plan(store.clock().now(), nodes, holding, &pending);
    let ctx = AuditContext::system("elastic");
    for (job_id, reason) in &plan.preempt {
        let node_id = holding
            .iter()
            .find(|j| j.id == *job_id)
            .and_then(|j| j.node_id.clone())
            .unwrap_or_default();
        match store.request_preemption(&ctx, job_id, reason).await {
            Ok(job) => {
                tracing::info!(job = %job.id, node = %node_id, %reason, "elastic preemption");
                hub.send(&node_id, hub::cancel_within(&job, elastic.grace_seconds()));
            }
            Err(StoreError::Conflict(msg)) => tracing::debug!(%msg, "elastic preemption skipped"),
            Err(e) => return Err(e),
        }
    }
    let held = |j: &Job| j.spec.class.and_then(|c| plan.held_back.get(c.as_str()));
    Ok(hold_back(pending, "ElasticShare", held, reasons))
}

/// `pending` less the jobs `held` gives a message for: each of those waits with `code` and
/// the message (into `reasons` where that is new). Borrowed still when none is held.
fn hold_back<'a, 'm>(
    pending: Cow<'a, [Job]>,
    code: &str,
    held: impl Fn(&Job) -> Option<&'m String>,
    reasons: &mut Vec<(String, Option<PendingReason>)>,
) -> Cow<'a, [Job]> {
    if !pending.iter().any(|j| held(j).is_some()) {
        return pending;
    }
    let mut left = Vec::with_capacity(pending.len());
    for j in pending.iter() {
        match held(j) {
            Some(message) => note_wait(j, code, message.clone(), reasons),
            None => left.push(j.clone()),
        }
    }
    Cow::Owned(left)
}

/// Says why `j` waits (`code`, `message`), unless it says so already.
pub(crate) fn note_wait(
    j: &Job,
    code: &str,
    message: String,
    reasons: &mut Vec<(String, Option<PendingReason>)>,
) {
    let reason = PendingReason {
        code: code.into(),
        message,
    };
    if j.pending_reason.as_ref() != Some(&reason) {
        reasons.push((j.id.clone(), Some(reason)));
    }
}

/// The nodes as recorded, less the GPUs of jobs whose end is not yet confirmed by their
/// node or that a node runs against the record (not handed out).
async fn fleet(store: &Store, hub: &Hub) -> Result<Vec<allot_domain::Node>, StoreError> {
    let mut nodes = store.list_nodes().await?;
    for n in &mut nodes {
        n.drained_gpus.extend(hub.withheld_gpus(&n.id));
    }
    Ok(nodes)
}

/// The span of placing job `job_id` (on `node_id`): it joins the trace of the request that
/// submitted the job, and the launch it sends carries it on to the agent.
fn schedule_span(
    job_id: &str,
    node_id: Option<&str>,
    traces: &HashMap<String, String>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "job.schedule",
        otel.name = "job.schedule",
        job.id = %job_id,
        node.id = node_id.unwrap_or_default(),
        trace_id = tracing::field::Empty,
    );
    if let Some(tp) = traces.get(job_id) {
        allot_telemetry::set_parent(&span, tp);
    }
    if let Some(id) = allot_telemetry::trace_id(&span) {
        span.record("trace_id", id);
    }
    span
}

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    /// Every decision was applied (or had moved on: a job cancelled meanwhile).
    Done,
    /// A tenant changed after the pass read the quotas: the placements not yet written were
    /// left (a placement is held to the quotas in force when it commits).
    Stale,
}

/// What the scheduling loop keeps between passes.
pub struct PassState {
    /// When a node is lost.
    loss: NodeLoss,
    /// The pending jobs, brought up to date at each pass.
    pending: PendingJobs,
    /// The tenants' version the last pass that ran the engine decided on: a pass with
    /// nothing pending still decides when the quotas changed since (a lowered limit is
    /// enforced on what runs).
    quotas_seen: Option<i64>,
    /// When a pass last ran the engine (the store's clock).
    decided_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl PassState {
    pub fn new(loss: NodeLoss) -> Self {
        Self {
            loss,
            pending: PendingJobs::default(),
            quotas_seen: None,
            decided_at: None,
        }
    }
}

/// With nothing pending, a pass still runs the engine this often: room may have appeared
/// for what runs (best-effort work stacked on one GPU spreads into it).
const DECIDE_AT_LEAST_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// One pass over the pending jobs (refreshed first). Public so tests can drive scheduling
/// step by step.
pub async fn pass(
    store: &Fenced,
    hub: &Hub,
    scheduler: &mut LiveScheduler,
    state: &mut PassState,
    elastic: Option<&ElasticShares>,
    sizing: Option<&crate::sizing::Sizing>,
) -> Result<Passed, PassError> {
    let mut reasons = Vec::new();
    let result =
        decide_and_apply(store, hub, scheduler, state, elastic, sizing, &mut reasons).await;
    // Why jobs wait, in one transaction, whatever else the pass got to.
    if !reasons.is_empty() {
        store.set_pending_reasons(reasons.clone()).await?;
        state.pending.reasons_written(reasons);
    }
    result
}

async fn decide_and_apply(
    store: &Fenced,
    hub: &Hub,
    scheduler: &mut LiveScheduler,
    state: &mut PassState,
    elastic: Option<&ElasticShares>,
    sizing: Option<&crate::sizing::Sizing>,
    reasons: &mut Vec<(String, Option<PendingReason>)>,
) -> Result<Passed, PassError> {
    let view = &mut state.pending;
    // The jobs first, then the fleet they are decided on: an operator's change made before
    // a submit (a cordon, a drain) is in what decides it.
    view.refresh(store).await?;
    let fleet_read_at = store.clock().now();
    let mut nodes = fleet(store, hub).await?;
    let requeued = crate::leases::requeue_from_lost_nodes(
        store,
        &nodes,
        state.loss.outage_tolerance,
        state.loss.since,
    )
    .await?;
    crate::time_limits::stop_overdue(store, hub).await?;
    crate::drains::requeue_past_grace(store, hub, &nodes).await?;
    let regrouped = crate::gangs::keep_whole(store, hub).await?;
    if requeued + regrouped > 0 {
        // What they put back in the queue is placed in this pass, on a fleet read after it
        // (and after anything else that changed meanwhile).
        view.refresh(store).await?;
        if view.jobs().iter().any(|j| j.updated_at >= fleet_read_at) {
            nodes = fleet(store, hub).await?;
        }
    }
    // With nothing to place, a pass still decides when the quotas changed (what runs is
    // held to a limit lowered meanwhile), and every DECIDE_AT_LEAST_EVERY.
    let now = store.clock().now();
    // Auto-sized jobs wanting room, or settled (to be consolidated), are weighed at once.
    let sized_due = sizing.is_some_and(|s| s.due(std::time::Instant::now()));
    let must_decide = sized_due
        || state.quotas_seen != Some(store.tenants_version().await?)
        || state
            .decided_at
            .is_none_or(|at| now - at >= DECIDE_AT_LEAST_EVERY);
    let pending = Cow::Borrowed(view.jobs());
    if pending.is_empty() && elastic.is_none() && !must_decide {
        return Ok(Passed::Done);
    }
    let holding = jobs_in(store, &[JobState::Scheduled, JobState::Running]).await?;
    let pending = match elastic {
        Some(e) => apply_elastic(store, hub, e, &nodes, &holding, pending, reasons).await?,
        None => pending,
    };
    if pending.is_empty() && !must_decide {
        return Ok(Passed::Done);
    }
    // The version first: placements are written only while no tenant changed since.
    let (tenants_version, tenants) = store.versioned_tenants().await?;
    // Tenants that spent their monthly GPU-hour budget wait for the next month.
    let spent = crate::budgets::spent(store, &tenants, store.clock().now()).await?;
    let pending = hold_back(
        pending,
        "BudgetExhausted",
        |j| spent.get(&j.tenant_id),
        reasons,
    );
    // Arrays beyond their caps and jobs whose dependencies are not met wait.
    let pending = crate::workflows::hold_back(store, &holding, pending, reasons).await?;
    if pending.is_empty() && !must_decide {
        return Ok(Passed::Done);
    }
    let reachable = hub.placeable();
    let forecasts = sizing.and_then(|s| s.forecasts(std::time::Instant::now()));
    let decisions = scheduler.decide(&Snapshot {
        nodes: &nodes,
        tenants: &tenants,
        holding: &holding,
        pending: &pending,
        now: store.clock().now(),
        reachable: Some(&reachable),
        forecasts: forecasts.as_ref(),
    })?;
    let traces: HashMap<String, String> = pending
        .iter()
        .filter_map(|j| Some((j.id.clone(), j.traceparent.clone()?)))
        .collect();
    let current: HashMap<&str, Option<&PendingReason>> = pending
        .iter()
        .map(|j| (j.id.as_str(), j.pending_reason.as_ref()))
        .collect();
    let ctx = AuditContext::system("scheduler");
    // Set once a placement meets a tenant changed since the quotas were read: the rest of
    // the pass's placements are left for the next pass.
    let mut stale = false;
    // Preemptions first: a placement that needs a victim's room waits for it anyway.
    let (preempts, others): (Vec<_>, Vec<_>) = decisions
        .into_iter()
        .partition(|d| matches!(d, LiveDecision::Preempt { .. } | LiveDecision::Move { .. }));
    for decision in preempts.into_iter().chain(others) {
        match decision {
            LiveDecision::Preempt {
                job_id,
                node_id,
                reason,
            } => match store.request_preemption(&ctx, &job_id, &reason).await {
                Ok(job) => {
                    tracing::info!(job = %job.id, node = %node_id, %reason, "preempting");
                    hub.send(&node_id, hub::cancel(&job));
                }
                // Finished or cancelled while we decided: its capacity frees anyway.
                Err(StoreError::Conflict(msg)) => tracing::debug!(%msg, "preemption skipped"),
                Err(e) => return Err(e.into()),
            },
            LiveDecision::Move {
                job_id,
                node_id,
                gpu_uuids,
                share_milli,
                reason,
            } => match store
                .request_move(&ctx, &job_id, &reason, &gpu_uuids, Some(share_milli))
                .await
            {
                Ok(job) => {
                    tracing::info!(job = %job.id, node = %node_id, %reason, "moving");
                    hub.send(&node_id, hub::cancel(&job));
                }
                Err(StoreError::Conflict(msg)) => tracing::debug!(%msg, "move skipped"),
                Err(e) => return Err(e.into()),
            },
            LiveDecision::Place {
                job_id,
                node_id,
                gpu_uuids,
                held_gpu_milli,
                borrowing,
            } => {
                let span = schedule_span(&job_id, Some(&node_id), &traces);
                if stale {
                    continue;
                }
                let update = JobUpdate {
                    node_id: Some(node_id.clone()),
                    gpu_uuids: Some(gpu_uuids),
                    held_gpu_milli: Some(held_gpu_milli),
                    borrowing: Some(borrowing),
                    tenants_version: Some(tenants_version),
                    ..Default::default()
                };
                let placed = store
                    .transition_job(
                        &ctx,
                        &job_id,
                        JobState::Pending,
                        JobState::Scheduled,
                        update,
                    )
                    .instrument(span.clone())
                    .await;
                match placed {
                    Ok(job) => {
                        span.in_scope(|| {
                            tracing::info!(job = %job.id, node = %node_id, gpus = ?job.gpu_uuids,
                                gpu_milli = held_gpu_milli, borrowing, "scheduled");
                        });
                        // The launch carries the decision's trace context: built inside its
                        // span, which the future enters on whichever thread polls it (a
                        // guard held across the await would leave it on the first).
                        let launch = crate::launches::launch(store, &job)
                            .instrument(span.clone())
                            .await;
                        hub.launch(&node_id, &job, launch);
                    }
                    // Cancelled while we decided: its capacity simply stays free.
                    Err(StoreError::Conflict(msg)) => tracing::debug!(%msg, "placement skipped"),
                    Err(StoreError::Stale(msg)) => {
                        tracing::info!(%msg, "quotas changed during the pass; deciding again");
                        stale = true;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            LiveDecision::PlaceGang {
                gang_id,
                replicas,
                held_gpu_milli,
                borrowing,
            } => {
                if stale {
                    continue;
                }
                let span = schedule_span(&gang_id, None, &traces);
                let updates = replicas
                    .iter()
                    .map(|r| {
                        (
                            r.job_id.clone(),
                            JobUpdate {
                                node_id: Some(r.node_id.clone()),
                                gpu_uuids: Some(r.gpu_uuids.clone()),
                                held_gpu_milli: Some(held_gpu_milli),
                                borrowing: Some(borrowing),
                                tenants_version: Some(tenants_version),
                                ..Default::default()
                            },
                        )
                    })
                    .collect();
                // All replicas, or (cancelled meanwhile) none.
                match store
                    .place_together(&ctx, updates)
                    .instrument(span.clone())
                    .await
                {
                    Ok(placed) => {
                        span.in_scope(|| {
                            tracing::info!(gang = %gang_id, replicas = placed.len(),
                                gpu_milli = held_gpu_milli, borrowing, "gang scheduled");
                        });
                        for job in &placed {
                            let launch = crate::launches::launch(store, job)
                                .instrument(span.clone())
                                .await;
                            if let Some(node) = &job.node_id {
                                hub.launch(node, job, launch);
                            }
                        }
                    }
                    Err(StoreError::Conflict(msg)) => {
                        tracing::debug!(%msg, "gang placement skipped")
                    }
                    Err(StoreError::Stale(msg)) => {
                        tracing::info!(%msg, "quotas changed during the pass; deciding again");
                        stale = true;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            LiveDecision::Repartition {
                node_id,
                gpu_uuid,
                layout,
            } => {
                // Sent again while the node has not reported the layout: applying it twice
                // is harmless, and a lost message is simply sent again.
                if !hub.partition_due(&gpu_uuid, &layout) {
                    continue;
                }
                let event = AuditEvent::success(
                    SYSTEM_LOG,
                    "node.gpu.repartition",
                    format!("node/{node_id}/gpu/{gpu_uuid}"),
                )
                .after(serde_json::json!({ "layout": layout }));
                store.record_event(&ctx, event).await?;
                tracing::info!(node = %node_id, gpu = %gpu_uuid, ?layout, "repartitioning a MIG GPU");
                hub.send(&node_id, hub::partition(&gpu_uuid, &layout));
            }
            LiveDecision::Wait { job_id, reason } => {
                if current.get(job_id.as_str()).copied().flatten() != Some(&reason) {
                    reasons.push((job_id, Some(reason)));
                }
            }
        }
    }
    if stale {
        return Ok(Passed::Stale);
    }
    state.quotas_seen = Some(tenants_version);
    state.decided_at = Some(now);
    Ok(Passed::Done)
}
