//! A node's reports about its jobs: mapped to the domain's verdict
//! (`allot_domain::report::judge`) and the verdict written; and the jobs' output it ships.

use allot_domain::report::{Report, Reported, Requeue, Verdict};
use allot_domain::{AuditContext, JobState, Node};
use allot_proto::v1::{JobLogs, JobLogsAck, JobPhase, JobStatusAck, JobStatusReport};
use allot_store::{Fenced, JobRepo, JobUpdate, LogRepo, StoreError, TenantScope};
use tonic::{Request, Response, Status};

use crate::hub::{self};
use crate::node_limits::NodeCall;

use super::*;

impl NodeSvc {
    /// Puts a stopped attempt back in the queue as its next attempt (the verdict of its
    /// report); its GPUs come back once a heartbeat shows the attempt gone from the node.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn requeue(
        &self,
        store: &Fenced,
        ctx: &AuditContext,
        node: &Node,
        job: &allot_domain::Job,
        requeue: Requeue,
        exit_code: Option<i32>,
        log_tail: String,
    ) -> Result<(), Status> {
        let update = JobUpdate {
            message: Some(requeue.message.chars().take(4096).collect()),
            log_tail: (!log_tail.is_empty()).then_some(log_tail),
            exit_code,
            requeue_code: Some(requeue.code),
            retry_at: requeue.retry_at,
            ..Default::default()
        };
        let (gpus, ended) = (gpu_parents(node, &job.gpu_uuids), job.attempt);
        let job = store
            .transition_job(ctx, &job.id, job.state, JobState::Pending, update)
            .await
            .map_err(status)?;
        self.hub.withhold(&node.id, &job.id, ended, gpus);
        tracing::info!(job = %job.id, attempt = job.attempt, code = %requeue.code, "job requeued");
        self.notify.notify_one();
        // Those following its log go on to its next attempt.
        let _ = self.job_logs.send(job.id);
        Ok(())
    }

    pub(super) async fn report(
        &self,
        req: Request<JobStatusReport>,
    ) -> Result<Response<JobStatusAck>, Status> {
        // What it writes goes through the leader's term: a leader paused past its lease
        // writes nothing when it wakes.
        let store = self.leading()?;
        let node = self.node(&req, "ReportJobStatus").await?;
        let ctx = node_ctx(&req, &node.id);
        self.within_rate(&ctx, &node, NodeCall::ReportJobStatus)
            .await?;
        let r = req.into_inner();
        let job = self
            .store
            .job(&TenantScope::All, &r.job_id)
            .await
            .map_err(status)?;
        // A launch is confirmed by any report on its job but a refused start (then it is
        // sent again while it is current, and asked about again).
        let starting = r.phase == i32::from(JobPhase::Starting);
        if !starting {
            self.hub.confirmed(&node.id, &job.id);
        }
        let phase = match JobPhase::try_from(r.phase) {
            Ok(JobPhase::Starting) => Reported::Starting,
            Ok(JobPhase::Running) => Reported::Running,
            Ok(JobPhase::Succeeded) => Reported::Succeeded,
            Ok(JobPhase::Failed) => Reported::Failed,
            Ok(JobPhase::Cancelled) => Reported::Cancelled,
            Ok(JobPhase::Lost) => Reported::Lost,
            Ok(JobPhase::DeviceFault) => Reported::DeviceFault,
            Ok(JobPhase::AgentShutdown) => Reported::AgentShutdown,
            Ok(JobPhase::Unspecified) => return Err(Status::invalid_argument("phase is required")),
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown phase {}",
                    r.phase
                )));
            }
        };
        let report = Report {
            node_id: &node.id,
            node_name: &node.name,
            lease_expires_at: node.lease_expires_at,
            attempt: r.attempt,
            phase,
            message: &r.message,
        };
        // A replica of a gang that stopped: what the gang's other replicas did decides.
        let gang = match allot_domain::report::gang_to_read(&job, &report) {
            Some(id) => Some(self.store.gang(id).await.map_err(status)?),
            None => None,
        };
        let now = self.store.clock().now();
        let verdict = allot_domain::report::judge(&job, gang.as_deref(), &report, now);
        match &verdict {
            // The attempt is the report's fencing token: a report about an attempt that
            // was requeued (the node lost its lease, or was preempted) changes nothing.
            Verdict::Stale { current } => {
                return Err(Status::failed_precondition(format!(
                    "stale report: it is about attempt {} of job {}, which is on attempt {current}",
                    r.attempt, job.id
                )));
            }
            Verdict::NotAssigned => {
                let refused = Status::permission_denied(format!(
                    "job {} is not assigned to this node",
                    job.id
                ));
                return Err(self.denied(ctx, "ReportJobStatus", refused).await);
            }
            Verdict::MayNotStart(why) => return Err(Status::failed_precondition(why.clone())),
            Verdict::MayStart => {
                self.hub.confirmed(&node.id, &job.id);
                return Ok(Response::new(JobStatusAck {}));
            }
            Verdict::AlreadyLanded | Verdict::Requeue(_) | Verdict::Record { .. } => {}
        }
        // Checked for any report that may write, even one that already landed.
        let image_digest = image_digest(&job, &r.image_digest)?;
        let (via_running, to, message) = match verdict {
            Verdict::Requeue(requeue) => {
                self.requeue(&store, &ctx, &node, &job, requeue, r.exit_code, r.log_tail)
                    .await?;
                return Ok(Response::new(JobStatusAck {}));
            }
            Verdict::Record {
                via_running,
                to,
                message,
            } => (via_running, to, message),
            // A retried report that already landed.
            _ => return Ok(Response::new(JobStatusAck {})),
        };
        let mut from = job.state;
        if via_running {
            // The process ran and exited before its start was recorded.
            store
                .transition_job(
                    &ctx,
                    &job.id,
                    from,
                    JobState::Running,
                    JobUpdate {
                        pid: r.pid,
                        image_digest: image_digest.clone(),
                        ..Default::default()
                    },
                )
                .await
                .map_err(status)?;
            from = JobState::Running;
        }
        let update = JobUpdate {
            pid: r.pid,
            exit_code: r.exit_code,
            message: message.map(|m| m.chars().take(4096).collect()),
            log_tail: (!r.log_tail.is_empty()).then_some(r.log_tail),
            image_digest,
            ..Default::default()
        };
        let gpus = gpu_parents(&node, &job.gpu_uuids);
        let job = store
            .transition_job(&ctx, &job.id, from, to, update)
            .await
            .map_err(status)?;
        tracing::info!(job = %job.id, state = %job.state, exit_code = ?job.exit_code, "job status");
        if job.state.is_terminal() {
            // Its GPUs come back once a heartbeat shows it gone from the node.
            self.hub.withhold(&node.id, &job.id, job.attempt, gpus);
            self.notify.notify_one();
            // Its output arrived before this report: those following its log are done.
            let _ = self.job_logs.send(job.id.clone());
        } else if job.cancel_requested || job.preempt_reason.is_some() {
            // Stopped while its launch was in flight: say it again now that it runs.
            self.hub.send(&node.id, hub::cancel(&job));
        }
        Ok(Response::new(JobStatusAck {}))
    }

    pub(super) async fn append_logs(
        &self,
        req: Request<JobLogs>,
    ) -> Result<Response<JobLogsAck>, Status> {
        let store = self.leading()?;
        let node = self.node(&req, "AppendJobLogs").await?;
        let ctx = node_ctx(&req, &node.id);
        self.within_rate(&ctx, &node, NodeCall::AppendJobLogs)
            .await?;
        let chunks = req.into_inner().chunks;
        let mut refused = 0u32;
        // Jobs of the message that are not this node's at all (not merely an attempt since
        // requeued): what a stolen key writing another node's jobs' logs leaves.
        let mut theirs = std::collections::BTreeSet::new();
        let mut grew = std::collections::BTreeSet::new();
        // Which attempts of each job this node may write the log of, read once per job of
        // the message.
        let mut writable: std::collections::HashMap<String, Vec<u32>> =
            std::collections::HashMap::new();
        for c in chunks {
            if !writable.contains_key(&c.job_id) {
                let attempts = match self.store.job(&TenantScope::All, &c.job_id).await {
                    Ok(job) => log_writable_attempts(&job, &node.id),
                    Err(StoreError::NotFound(_)) => Vec::new(),
                    Err(e) => return Err(status(e)),
                };
                writable.insert(c.job_id.clone(), attempts);
            }
            // Only the node that ran an attempt writes its log: a node's key cannot write
            // (or flood) the log of a job elsewhere, nor of an attempt it did not run.
            let attempts = writable.get(&c.job_id);
            if attempts.is_none_or(Vec::is_empty) {
                theirs.insert(c.job_id.chars().take(64).collect::<String>());
            }
            let ours = attempts.is_some_and(|a| a.contains(&c.attempt));
            let well_formed = !c.data.is_empty()
                && c.data.len() as u64 <= allot_domain::joblog::CHUNK_MAX_BYTES
                && c.offset
                    .checked_add(c.data.len() as u64)
                    .is_some_and(|end| i64::try_from(end).is_ok());
            if !(ours && well_formed) {
                refused += 1;
                continue;
            }
            store
                .append_job_log(&c.job_id, c.attempt, c.offset, &c.data)
                .await
                .map_err(status)?;
            grew.insert(c.job_id);
        }
        if refused > 0 {
            tracing::info!(node = %node.name, refused, "log chunks refused");
        }
        if !theirs.is_empty() {
            let shown: Vec<String> = theirs.iter().take(8).cloned().collect();
            let why = Status::permission_denied(format!(
                "log chunks for {} job(s) not assigned to node {} refused: {}",
                theirs.len(),
                node.name,
                shown.join(", ")
            ));
            self.denied(ctx, "AppendJobLogs", why).await;
        }
        for job in grew {
            // No one may be following.
            let _ = self.job_logs.send(job);
        }
        Ok(Response::new(JobLogsAck { refused }))
    }
}
