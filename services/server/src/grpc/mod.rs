//! The gRPC service agents talk to, over mutual TLS. The calling node is always derived from
//! the certificate it presented (checked against the certificates the CA issued and has not
//! revoked), never from a field in the message.

mod checks;
mod heartbeat;
mod identity;
mod reports;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use allot_domain::JobState;
use allot_pki::Authority;
use allot_proto::v1::{
    Assignment, HeartbeatRequest, HeartbeatResponse, JobLogs, JobLogsAck, JobStatusAck,
    JobStatusReport, RegisterRequest, RegisterResponse, RenewCertificateRequest,
    RenewCertificateResponse, WatchAssignmentsRequest,
};
use allot_store::{EnrollmentRepo, NewNodeCertificate, Store, StoreError};
use tokio::sync::Notify;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status};

use crate::hub::{self, Hub};
use crate::node_limits::NodeCall;
use checks::*;
use identity::*;

pub use crate::node_limits::NodeLimits;

pub struct NodeSvc {
    /// Agents are served by the leading replica only; the others point them there.
    pub leadership: Arc<crate::leadership::Leadership>,
    pub store: Store,
    pub hub: Arc<Hub>,
    pub notify: Arc<Notify>,
    /// Signs node certificates.
    pub ca: Arc<Authority>,
    /// How long a node certificate is valid (agents renew at two thirds).
    pub node_cert_ttl: Duration,
    /// The heartbeat interval and lease handed out, stretched for a large fleet.
    pub pacing: Arc<crate::pacing::Pacing>,
    /// How long agents keep their jobs while they reach no replica (at least the lease).
    pub outage_tolerance: Duration,
    /// When each node's GPU samples were last stored, and when old samples were last pruned.
    pub samples: SampleClock,
    /// Failed node authentication per client address, as on the HTTP side.
    pub auth_failures: Arc<allot_api::limiter::FailureLimiter>,
    /// Where refused calls are recorded.
    pub audit: allot_store::AuditBatcher,
    /// Group-commits what heartbeats write.
    pub beats: allot_store::BeatBatcher,
    /// Says which job's log grew (or which job ended), to those following it here.
    pub job_logs: tokio::sync::broadcast::Sender<String>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// How often each node may call, and when its refusals were last audited.
    pub limits: NodeLimits,
    /// The auto-sized jobs' sizers, fed by heartbeats.
    pub sizing: Arc<crate::sizing::Sizing>,
}

/// A duration in whole milliseconds, as the protocol carries it.
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// How often GPU samples are stored per node, and old ones pruned.
#[derive(Debug, Default)]
pub struct SampleClock {
    stored: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    pruned: std::sync::Mutex<Option<std::time::Instant>>,
}

/// A node's GPU samples are stored at most this often (the finest bucket).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);

impl SampleClock {
    /// Whether `node`'s samples are due now (and, if so, they count as stored).
    fn due(&self, node: &str) -> bool {
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match stored.get(node) {
            Some(at) if now.duration_since(*at) < SAMPLE_EVERY => false,
            _ => {
                stored.insert(node.to_owned(), now);
                true
            }
        }
    }

    /// Whether pruning is due (every ten minutes).
    fn prune_due(&self) -> bool {
        let mut pruned = self.pruned.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if pruned.is_some_and(|at| now.duration_since(at) < Duration::from_secs(600)) {
            return false;
        }
        *pruned = Some(now);
        true
    }
}

fn status(e: StoreError) -> Status {
    match e {
        StoreError::NotFound(what) => Status::not_found(format!("{what} does not exist")),
        StoreError::Conflict(msg) => Status::failed_precondition(msg),
        StoreError::Refused(msg) => Status::unauthenticated(msg),
        StoreError::Unavailable(detail) => {
            tracing::warn!(%detail, "database unavailable in gRPC call");
            Status::unavailable("the database is unavailable; retry")
        }
        // This replica's term ended under the call: nothing was written, and the agent
        // finds the leader.
        StoreError::Fenced(why) => Status::unavailable(format!("{why}; retry with the leader")),
        e => {
            tracing::error!(error = %e, "store error in gRPC call");
            Status::internal("internal error")
        }
    }
}

/// How long a new subscription waits for the node's earlier stream to close (its agent
/// dropped it to open this one) before it is refused.
const STREAM_CLOSE_GRACE: Duration = Duration::from_millis(500);

/// Most jobs a node may say it runs at once.
const MAX_RUNNING_JOBS: usize = 4096;

type AssignmentStream = Pin<Box<dyn Stream<Item = Result<Assignment, Status>> + Send>>;

#[tonic::async_trait]
impl allot_proto::NodeService for NodeSvc {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let store = self.leading()?;
        let claimed: String = req.get_ref().node_name.chars().take(253).collect();
        let ctx = node_ctx(&req, &claimed);
        match self.register_node(&store, req).await {
            Ok(r) => Ok(r),
            Err(e) => Err(self.refused(ctx, "Register", e).await),
        }
    }

    async fn renew_certificate(
        &self,
        req: Request<RenewCertificateRequest>,
    ) -> Result<Response<RenewCertificateResponse>, Status> {
        let store = self.leading()?;
        let node = self.node(&req, "RenewCertificate").await?;
        let ctx = node_ctx(&req, &node.id);
        self.within_rate(&ctx, &node, NodeCall::RenewCertificate)
            .await?;
        let cert = presented(&req)?
            .ok_or_else(|| Status::unauthenticated("connect with the node certificate"))?;
        if let Err(e) = same_key(&cert, &req.get_ref().csr_pem) {
            return Err(self.denied(ctx, "RenewCertificate", e).await);
        }
        let issued = self.issue(&req.get_ref().csr_pem, &node.name)?;
        store
            .add_node_certificate(
                &ctx,
                &node.id,
                NewNodeCertificate {
                    serial: issued.serial,
                    issued_at: issued.not_before,
                    expires_at: issued.not_after,
                },
            )
            .await
            .map_err(status)?;
        tracing::info!(node = %node.name, until = %issued.not_after, "node certificate renewed");
        Ok(Response::new(RenewCertificateResponse {
            certificate_pem: issued.cert_pem,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let started = std::time::Instant::now();
        let answer = self.handle_heartbeat(req).await;
        self.metrics.heartbeat(answer.is_ok(), started.elapsed());
        answer
    }

    type WatchAssignmentsStream = AssignmentStream;

    async fn watch_assignments(
        &self,
        req: Request<WatchAssignmentsRequest>,
    ) -> Result<Response<Self::WatchAssignmentsStream>, Status> {
        self.leading()?;
        let node = self.node(&req, "WatchAssignments").await?;
        let ctx = node_ctx(&req, &node.id);
        self.within_rate(&ctx, &node, NodeCall::WatchAssignments)
            .await?;
        // Subscribe first, then replay what the node holds: a job scheduled in between is
        // sent twice, which agents ignore, rather than not at all. A stream still open is
        // the node's: given a moment to close (an agent that dropped it to open another),
        // and else kept, this one refused.
        let opened = match self.hub.subscribe(&node.id) {
            Err(hub::AlreadyOpen) if self.stream_closes(&node.id).await => {
                self.hub.subscribe(&node.id)
            }
            opened => opened,
        };
        let Ok((tx, rx, again)) = opened else {
            let refused = Status::already_exists(format!(
                "node {} has an open assignment stream already: one at a time",
                node.name
            ));
            return Err(self.denied(ctx, "WatchAssignments", refused).await);
        };
        if again {
            let event = allot_domain::AuditEvent::success(
                allot_domain::SYSTEM_LOG,
                "node.resubscribe",
                format!("node/{}", node.id),
            );
            if let Err(e) = self.audit.record(ctx, event).await {
                tracing::error!(error = %e, "could not audit a re-subscription");
            }
        }
        let held = self
            .jobs_on(&node.id, &[JobState::Scheduled, JobState::Running])
            .await?;
        for job in held.iter().rev() {
            let Some(assignment) = crate::launches::resend(&self.store, job).await else {
                continue;
            };
            if job.state == JobState::Scheduled {
                self.hub.resent(&node.id, job);
            }
            // The receiver is ours and alive until returned below.
            let _ = tx.send(Ok(assignment));
        }
        // The node can take new work again.
        self.notify.notify_one();
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }

    async fn append_job_logs(&self, req: Request<JobLogs>) -> Result<Response<JobLogsAck>, Status> {
        self.append_logs(req).await
    }

    async fn report_job_status(
        &self,
        req: Request<JobStatusReport>,
    ) -> Result<Response<JobStatusAck>, Status> {
        self.report(req).await
    }
}
