//! A node's heartbeat: its lease renewed, its GPUs and samples stored, what it runs held
//! against the record, and what it should stop or launch again.

use std::time::Duration;

use allot_domain::{AuditContext, JobState, Node};
use allot_proto::v1::{HeartbeatRequest, HeartbeatResponse};
use allot_store::{Fenced, JobFilter, JobRepo, JobUpdate, SampleRepo, StoreError, TenantScope};
use tonic::{Request, Response, Status};

use crate::hub::{self};
use crate::node_limits::NodeCall;

use super::*;

impl NodeSvc {
    /// A heartbeat: the node's lease renewed, its GPUs and samples stored, what it should
    /// stop answered.
    pub(super) async fn handle_heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        // Its lease renewal (through the group commit), samples and requeues are written
        // through the leader's term.
        let store = self.leading()?;
        let node = self.node(&req, "Heartbeat").await?;
        let ctx = node_ctx(&req, &node.id);
        self.within_rate(&ctx, &node, NodeCall::Heartbeat).await?;
        let was_ready = self.store.clock().now() < node.lease_expires_at;
        let r = req.into_inner();
        bounded("running_job_ids", r.running_job_ids.len(), MAX_RUNNING_JOBS)?;
        bounded(
            "running_attempts",
            r.running_attempts.len(),
            MAX_RUNNING_JOBS,
        )?;
        let gpus = gpus_from_proto(r.gpus.clone())?;
        if let Err(refused) = approved(&node, &gpus) {
            return Err(self.denied(ctx, "Heartbeat", refused).await);
        }
        let changed = gpus != node.gpus;
        // Whether the node takes new work, as its agent says (low on disk).
        let unavailable = allot_domain::node::unavailable_reason(&r.unavailable);
        let became = (unavailable != node.unavailable).then(|| unavailable.clone());
        if let Some(why) = &became {
            if why.is_empty() {
                tracing::info!(node = %node.name, "node takes new work again");
            } else {
                tracing::warn!(node = %node.name, reason = %why, "node takes no new work");
            }
        }
        let (interval, lease) = self.pacing.current();
        let until = self.lease_until(lease);
        let samples: Vec<(String, allot_domain::GpuSample)> = r
            .gpus
            .iter()
            // Only this node's own GPUs, as just checked and stored: a node writes no
            // other node's metrics.
            .filter(|g| gpus.iter().any(|d| d.uuid == g.uuid))
            .filter_map(|g| {
                let s = g.sample.as_ref().filter(|s| {
                    [s.utilization, s.power_watts, s.temperature_c]
                        .iter()
                        .all(|v| v.is_finite())
                        && [
                            s.pcie_rx_bytes_per_s,
                            s.pcie_tx_bytes_per_s,
                            s.nvlink_rx_bytes_per_s,
                            s.nvlink_tx_bytes_per_s,
                        ]
                        .iter()
                        .all(|v| v.is_finite())
                })?;
                let rate = |v: f64| v.max(0.0);
                Some((
                    g.uuid.clone(),
                    allot_domain::GpuSample {
                        utilization: f64::from(s.utilization).clamp(0.0, 1.0),
                        memory_used_bytes: s.memory_used_bytes,
                        power_watts: f64::from(s.power_watts).max(0.0),
                        temperature_c: f64::from(s.temperature_c),
                        pcie_rx_bytes_per_s: rate(s.pcie_rx_bytes_per_s),
                        pcie_tx_bytes_per_s: rate(s.pcie_tx_bytes_per_s),
                        nvlink_rx_bytes_per_s: rate(s.nvlink_rx_bytes_per_s),
                        nvlink_tx_bytes_per_s: rate(s.nvlink_tx_bytes_per_s),
                        throttle_mask: allot_domain::node::throttle_mask(&s.throttle_reasons),
                        ecc_corrected: s.ecc_corrected,
                        ecc_uncorrected: s.ecc_uncorrected,
                    },
                ))
            })
            .collect();
        // What the record places on this node, read once for the job samples and the
        // reconciliation below (and not at all for a node that runs and reports nothing).
        let on_node = if r.running_job_ids.is_empty() && r.job_samples.is_empty() {
            Vec::new()
        } else {
            self.jobs_on(&node.id, &[JobState::Scheduled, JobState::Running])
                .await?
        };
        let sampled =
            (!samples.is_empty() || !r.job_samples.is_empty()) && self.samples.due(&node.id);
        let now = self.store.clock().now();
        // The lease, a changed inventory and the GPU samples, in the next group commit.
        let written = self
            .beats
            .write(allot_store::Beat {
                node_id: node.id.clone(),
                lease_expires_at: until,
                gpus: changed.then(|| gpus.clone()),
                samples: (sampled && !samples.is_empty()).then_some((now, samples)),
                unavailable: became.clone(),
            })
            .await
            .map_err(status);
        if let Err(e) = written {
            // A GPU another node holds (approved to this one too, say after it moved).
            return Err(if e.code() == tonic::Code::FailedPrecondition {
                self.denied(ctx, "Heartbeat", e).await
            } else {
                e
            });
        }
        self.sizing
            .observe(&on_node, &r.job_samples, std::time::Instant::now());
        if sampled {
            if let Err(e) = self
                .record_job_samples(&store, now, &r.job_samples, &on_node)
                .await
            {
                tracing::warn!(error = %e, node = %node.name, "job samples not stored");
            }
            if self.samples.prune_due() {
                match store.prune_gpu_samples(now).await {
                    Ok(n) if n > 0 => tracing::debug!(buckets = n, "old GPU samples pruned"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "GPU samples not pruned"),
                }
            }
        }
        if !was_ready || changed || became.is_some() {
            self.notify.notify_one();
        }
        self.reconcile_running(
            &node,
            &r.running_job_ids,
            &r.running_attempts,
            &on_node,
            ctx,
        )
        .await?;
        // Jobs it runs that are being stopped: the stop may have been asked through another
        // replica, whose message reached no stream. Sent again now and then (agents act on
        // the first stop of an attempt only).
        let stopping: Vec<(String, u32)> = on_node
            .iter()
            .filter(|j| j.cancel_requested || j.preempt_reason.is_some())
            .filter(|j| r.running_job_ids.contains(&j.id))
            .map(|j| (j.id.clone(), j.attempt))
            .collect();
        for id in self.hub.stops_due(&node.id, &stopping, interval * 2) {
            if let Some(job) = on_node.iter().find(|j| j.id == id) {
                self.hub.send(&node.id, hub::cancel(job));
            }
        }
        // Launches the agent should be running by now but is not: the stream that carried
        // them may have died unnoticed. Send again those still current (agents launch each
        // attempt once, so a duplicate is harmless).
        for (job_id, attempt) in self.hub.overdue(&node.id, &r.running_job_ids, interval * 2) {
            match self.store.job(&TenantScope::All, &job_id).await {
                Ok(job)
                    if job.state == JobState::Scheduled
                        && job.attempt == attempt
                        && job.node_id.as_deref() == Some(node.id.as_str()) =>
                {
                    // Being stopped meanwhile: what it needs now is the stop, not the launch.
                    if let Some(again) = crate::launches::resend(&self.store, &job).await {
                        tracing::info!(job = %job.id, node = %node.name, "launch not confirmed; sending it again");
                        self.hub.send(&node.id, again);
                    }
                }
                _ => self.hub.confirmed(&node.id, &job_id),
            }
        }
        let mut answer = Response::new(HeartbeatResponse {
            lease_expires_at_ms: until.timestamp_millis(),
            heartbeat_interval_ms: millis(interval),
            lease_duration_ms: millis(lease),
            outage_tolerance_ms: millis(self.outage_tolerance.max(lease)),
        });
        // The term this leader serves under: the agent knows a hint naming it, once this
        // replica stops answering, for the stale hint it is.
        if let crate::leadership::Role::Leader { epoch } = self.leadership.role() {
            allot_proto::leader::set_epoch(answer.metadata_mut(), epoch);
        }
        Ok(answer)
    }

    /// When a lease of `lease` granted now ends, on the record's clock (at most a year
    /// ahead: no pace stretches a lease so far).
    pub(super) fn lease_until(&self, lease: Duration) -> chrono::DateTime<chrono::Utc> {
        self.store.clock().now()
            + chrono::Duration::from_std(lease)
                .unwrap_or(chrono::Duration::MAX)
                .min(chrono::Duration::days(365))
    }

    /// The jobs the record places on `node_id`, in `states`.
    pub(super) async fn jobs_on(
        &self,
        node_id: &str,
        states: &[JobState],
    ) -> Result<Vec<allot_domain::Job>, Status> {
        self.store
            .list_jobs(JobFilter {
                node_id: Some(node_id.to_owned()),
                states: states.to_vec(),
                ..JobFilter::new(TenantScope::All)
            })
            .await
            .map(|page| page.jobs)
            .map_err(status)
    }

    /// Stores the samples of jobs running on this node (`on_node`: what the record places
    /// there; a node speaks for its own jobs only).
    pub(super) async fn record_job_samples(
        &self,
        store: &Fenced,
        now: chrono::DateTime<chrono::Utc>,
        reported: &[allot_proto::v1::JobSample],
        on_node: &[allot_domain::Job],
    ) -> Result<(), allot_store::StoreError> {
        use allot_store::SampleRepo;
        if reported.is_empty() {
            return Ok(());
        }
        let running = |id: &str| {
            on_node
                .iter()
                .any(|j| j.id == id && j.state == JobState::Running)
        };
        let samples: Vec<(String, allot_store::JobSample)> = reported
            .iter()
            .filter(|s| s.utilization.is_finite() && running(&s.job_id))
            .map(|s| {
                (
                    s.job_id.clone(),
                    allot_store::JobSample {
                        utilization: f64::from(s.utilization).clamp(0.0, 1.0),
                        memory_used_bytes: s.memory_used_bytes,
                    },
                )
            })
            .collect();
        store.record_job_samples(now, &samples).await
    }

    /// What the heartbeat's list of running jobs says against the record. GPUs held back
    /// for a job whose end was reported are released once the node no longer runs it. A
    /// job the node runs that the control plane holds ended, or never gave this node (past
    /// a grace of two heartbeats, for a heartbeat that crossed the report), is stopped on
    /// the node, its GPUs held back meanwhile, and the discrepancy recorded once.
    /// `assigned` is what the record places on the node, scheduled or running.
    pub(super) async fn reconcile_running(
        &self,
        node: &Node,
        running: &[String],
        attempts: &[allot_proto::v1::RunningAttempt],
        assigned: &[allot_domain::Job],
        ctx: AuditContext,
    ) -> Result<(), Status> {
        let with_attempts: Vec<(String, Option<u32>)> = running
            .iter()
            .map(|id| {
                let attempt = attempts.iter().find(|a| a.job_id == *id).map(|a| a.attempt);
                (id.clone(), attempt)
            })
            .collect();
        let (released, held) = self.hub.reconcile(&node.id, &with_attempts);
        if released {
            self.notify.notify_one();
        }
        let grace = self.pacing.current().0 * 2;
        for id in running {
            if assigned.iter().any(|j| &j.id == id) {
                continue;
            }
            let Some((_, w)) = held.iter().find(|(h, _)| h == id) else {
                // First seen: held back (with the GPUs the record gives it on this node),
                // and judged once the grace has passed.
                let gpus = match self.store.job(&TenantScope::All, id).await {
                    Ok(j) if j.node_id.as_deref() == Some(node.id.as_str()) => {
                        gpu_parents(node, &j.gpu_uuids)
                    }
                    _ => Vec::new(),
                };
                // Until that attempt is gone (whichever, from an agent that does not say).
                let attempt = with_attempts
                    .iter()
                    .find(|(j, _)| j == id)
                    .and_then(|(_, a)| *a)
                    .unwrap_or(0);
                self.hub.withhold(&node.id, id, attempt, gpus);
                continue;
            };
            if w.since.elapsed() < grace {
                continue;
            }
            let (state, reason) = match self.store.job(&TenantScope::All, id).await {
                Ok(j) if j.node_id.as_deref() != Some(node.id.as_str()) => (
                    j.state.to_string(),
                    format!(
                        "node {} runs job {id}, which the control plane holds {} and not on \
                         this node; stopping it there",
                        node.name, j.state
                    ),
                ),
                Ok(j) => (
                    j.state.to_string(),
                    format!(
                        "node {} runs job {id}, which the control plane holds {}; stopping \
                         it there, its GPUs held back until it is gone",
                        node.name, j.state
                    ),
                ),
                Err(_) => (
                    "unknown".to_owned(),
                    format!(
                        "node {} runs job {id}, which the control plane does not know; \
                         stopping it there",
                        node.name
                    ),
                ),
            };
            self.hub.send(
                &node.id,
                allot_proto::v1::Assignment {
                    kind: Some(allot_proto::v1::assignment::Kind::Cancel(
                        allot_proto::v1::Cancel {
                            job_id: id.clone(),
                            attempt: 0,
                            reason: "the control plane holds this job ended".into(),
                            grace_seconds: 0,
                        },
                    )),
                },
            );
            if self.hub.audit_once(&node.id, id) {
                tracing::warn!(node = %node.name, job = %id, %reason, "node runs a job against the record");
                let event = allot_domain::AuditEvent {
                    log: allot_domain::SYSTEM_LOG.to_owned(),
                    action: "node.job_discrepancy".to_owned(),
                    target: format!("job/{id}"),
                    outcome: allot_domain::Outcome::Denied,
                    reason: Some(reason),
                    before: Some(serde_json::json!({ "state": state })),
                    after: Some(serde_json::json!({ "node_id": node.id, "running": true })),
                };
                if let Err(e) = self.audit.record(ctx.clone(), event).await {
                    tracing::error!(error = %e, "could not audit a job discrepancy");
                }
            }
        }
        Ok(())
    }

    /// Jobs the control plane thinks run on `node` but the agent does not: their processes
    /// are gone (the agent restarted), through no fault of theirs, so they are requeued.
    pub(super) async fn requeue_lost_jobs(
        &self,
        store: &Fenced,
        ctx: &AuditContext,
        node_id: &str,
        running: &[String],
    ) -> Result<(), Status> {
        let held = self.jobs_on(node_id, &[JobState::Running]).await?;
        for job in held.into_iter().filter(|j| !running.contains(&j.id)) {
            let (to, requeue_code, message) = allot_domain::report::lost_with_its_agent(&job);
            let update = JobUpdate {
                message: Some(message.to_owned()),
                requeue_code,
                ..Default::default()
            };
            match store
                .transition_job(ctx, &job.id, JobState::Running, to, update)
                .await
            {
                Ok(_) | Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(status(e)),
            }
        }
        Ok(())
    }
}
