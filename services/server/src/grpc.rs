//! The gRPC service agents talk to, over mutual TLS. The calling node is always derived from
//! the certificate it presented (checked against the certificates the CA issued and has not
//! revoked), never from a field in the message.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use allot_api::secret;
use allot_domain::report::{Report, Reported, Requeue, RequeueCode, Verdict};
use allot_domain::{Actor, ActorKind, AuditContext, GpuDevice, JobState, MigSlot, Node};
use allot_pki::{Authority, Issued, NodeCert};
use allot_proto::v1::{
    Assignment, Gpu, HeartbeatRequest, HeartbeatResponse, JobLogs, JobLogsAck, JobPhase,
    JobStatusAck, JobStatusReport, RegisterRequest, RegisterResponse, RenewCertificateRequest,
    RenewCertificateResponse, WatchAssignmentsRequest,
};
use allot_store::{
    Admission, EnrollmentRepo, JobFilter, JobRepo, JobUpdate, LogRepo, NewNodeCertificate,
    NodeRegistration, NodeRepo, SampleRepo, Store, StoreError, TenantScope,
};
use tokio::sync::Notify;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status};

use crate::hub::{self, Hub};
use crate::node_limits::NodeCall;
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
        e => {
            tracing::error!(error = %e, "store error in gRPC call");
            Status::internal("internal error")
        }
    }
}

/// Refuses an inventory naming GPUs the node was never approved for: a node's GPUs never
/// grow past those it registered with by a bootstrap token (`Node::unapproved`), so a
/// stolen key cannot invent GPUs to draw every tenant's work (and secrets).
fn approved(node: &Node, gpus: &[GpuDevice]) -> Result<(), Status> {
    let extra = node.unapproved(gpus);
    if extra.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = extra.iter().take(8).copied().collect();
    Err(Status::permission_denied(format!(
        "{} GPU(s) ({}{}) are not among those node {} registered with; an admin approves \
         more by a bootstrap token made to replace it (allot node bootstrap-token create \
         --node {} --replace)",
        extra.len(),
        shown.join(", "),
        if extra.len() > shown.len() {
            ", …"
        } else {
            ""
        },
        node.name,
        node.name
    )))
}

/// How long a new subscription waits for the node's earlier stream to close (its agent
/// dropped it to open this one) before it is refused.
const STREAM_CLOSE_GRACE: Duration = Duration::from_millis(500);

/// Most jobs a node may say it runs at once.
const MAX_RUNNING_JOBS: usize = 4096;

/// The GPUs (never MIG instances) that `uuids`, a job's placement on `node`, are on.
fn gpu_parents(node: &Node, uuids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = uuids
        .iter()
        .map(|u| {
            node.gpus
                .iter()
                .find(|g| g.holds(u))
                .map_or_else(|| u.clone(), |g| g.uuid.clone())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `value`, refused naming `field` when above `max`.
fn bounded<T: PartialOrd + std::fmt::Display>(field: &str, value: T, max: T) -> Result<T, Status> {
    if value > max {
        return Err(Status::invalid_argument(format!(
            "{field}: must be at most {max}"
        )));
    }
    Ok(value)
}

/// A validation error as the gRPC status naming its fields.
fn invalid(e: allot_domain::ValidationError) -> Status {
    let what: Vec<String> =
        e.0.iter()
            .take(8)
            .map(|f| format!("{}: {}", f.field, f.reason))
            .collect();
    Status::invalid_argument(what.join("; "))
}

/// The reported inventory, checked (`allot_domain::node::check_inventory`).
fn gpus_from_proto(gpus: Vec<Gpu>) -> Result<Vec<GpuDevice>, Status> {
    let devices = gpus
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            if g.uuid.is_empty() || g.uuid.len() > 128 {
                return Err(Status::invalid_argument(format!(
                    "gpus[{i}].uuid must be 1 to 128 characters"
                )));
            }
            let mig = if g.mig_enabled {
                let mut slots = Vec::with_capacity(g.mig_instances.len());
                for (j, m) in g.mig_instances.into_iter().enumerate() {
                    if m.uuid.is_empty() || m.uuid.len() > 128 || m.start > 7 {
                        return Err(Status::invalid_argument(format!(
                            "gpus[{i}].mig_instances[{j}]: uuid must be 1 to 128 characters and start at most 7"
                        )));
                    }
                    slots.push(MigSlot {
                        profile: m.profile,
                        start: u8::try_from(m.start).unwrap_or(u8::MAX),
                        uuid: m.uuid,
                    });
                }
                Some(slots)
            } else {
                None
            };
            Ok(GpuDevice {
                uuid: g.uuid,
                index: g.index,
                model: g.model,
                memory_bytes: g.memory_bytes,
                healthy: g.healthy,
                degraded: g.degraded,
                mig,
                memory_enforcement: g.memory_enforcement.parse().map_err(|e: String| {
                    Status::invalid_argument(format!("gpus[{i}].memory_enforcement: {e}"))
                })?,
                nvlink_domain: match g.nvlink_domain {
                    Some(d) if d as usize >= allot_domain::node::MAX_NODE_GPUS => {
                        return Err(Status::invalid_argument(format!(
                            "gpus[{i}].nvlink_domain must be below {}",
                            allot_domain::node::MAX_NODE_GPUS
                        )));
                    }
                    d => d,
                },
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    allot_domain::node::check_inventory(&devices).map_err(invalid)?;
    Ok(devices)
}

/// A node's address as it says it: empty, an IP address, or a DNS name (what other nodes'
/// jobs are told to connect to, so nothing else: no ports, paths or spaces).
fn valid_address(address: &str) -> Result<String, Status> {
    let dns = |a: &str| {
        a.len() <= 253
            && a.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    };
    if address.is_empty() || address.parse::<std::net::IpAddr>().is_ok() || dns(address) {
        Ok(address.to_owned())
    } else {
        Err(Status::invalid_argument(
            "address: must be an IP address or a DNS name",
        ))
    }
}

fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

/// The audit context of a call by `node_id` (or, while registering, the claimed name).
/// How a node authenticated, for its audit entries: `bootstrap-token`, or
/// `node-certificate <serial>` naming the very certificate it called with.
fn node_auth<T>(req: &Request<T>) -> String {
    match presented(req) {
        Ok(Some(cert)) => format!("node-certificate {}", cert.serial),
        _ => "bootstrap-token".to_owned(),
    }
}

/// A renewal (or a re-registration with a certificate) must be for the key the node
/// already holds: a stolen certificate cannot be renewed onto a key of the thief's.
fn same_key(cert: &NodeCert, csr_pem: &str) -> Result<(), Status> {
    let asked = allot_pki::csr_public_key(csr_pem)
        .map_err(|e| Status::invalid_argument(format!("csr_pem: {e}")))?;
    if asked == cert.public_key {
        Ok(())
    } else {
        Err(Status::permission_denied(
            "a renewal must be for the key this node's certificate holds; a new key needs a \
             bootstrap token",
        ))
    }
}

fn node_ctx<T>(req: &Request<T>, node_id: &str) -> AuditContext {
    AuditContext {
        actor: Actor {
            kind: ActorKind::Node,
            id: node_id.to_owned(),
            tenant_id: None,
            auth_method: node_auth(req),
            source: req.remote_addr().map(|a| a.ip().to_string()),
        },
        request_id: None,
    }
}

/// The node certificate the caller connected with, if any. The TLS handshake has checked
/// that the CA signed it and that it is within its validity.
fn presented<T>(req: &Request<T>) -> Result<Option<NodeCert>, Status> {
    let Some(leaf) = req.peer_certs().and_then(|c| c.first().cloned()) else {
        return Ok(None);
    };
    NodeCert::from_der(&leaf)
        .map(Some)
        .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))
}

impl NodeSvc {
    /// A heartbeat: the node's lease renewed, its GPUs and samples stored, what it should
    /// stop answered.
    async fn handle_heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        self.leading()?;
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
            if let Err(e) = self.record_job_samples(now, &r.job_samples, &on_node).await {
                tracing::warn!(error = %e, node = %node.name, "job samples not stored");
            }
            if self.samples.prune_due() {
                match self.store.prune_gpu_samples(now).await {
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

    /// Refuses the call unless this replica leads: `UNAVAILABLE`, naming the leader's
    /// endpoint and epoch (`allot_proto::leader`) when they are known, so the agent goes there.
    fn leading(&self) -> Result<(), Status> {
        match self.leadership.role() {
            crate::leadership::Role::Leader { .. } => Ok(()),
            crate::leadership::Role::Follower { leader } => {
                let mut status = Status::unavailable(match &leader {
                    Some((at, _)) => format!("this replica does not lead; the leader is at {at}"),
                    None => "this replica does not lead, and no replica leads yet".to_owned(),
                });
                if let Some((at, epoch)) = leader {
                    allot_proto::leader::set(status.metadata_mut(), &at, epoch);
                }
                Err(status)
            }
        }
    }

    /// A call of an authenticated node refused for what it asked (another node's job or
    /// GPU, GPUs it was never approved for, a new key, a second stream), recorded in the
    /// system audit log as `node.denied`. Not counted against its address: the node is
    /// known, and its own limits ([`NodeLimits`]) bound how often it can ask.
    async fn denied(&self, ctx: AuditContext, call: &str, status: Status) -> Status {
        self.record_refusal(ctx, "node.denied", call, &status).await;
        status
    }

    /// Records a refused call of `call` in the system audit log as `action`.
    async fn record_refusal(&self, ctx: AuditContext, action: &str, call: &str, status: &Status) {
        let event = allot_domain::AuditEvent {
            log: allot_domain::SYSTEM_LOG.to_owned(),
            action: action.to_owned(),
            target: format!("grpc/{call}"),
            outcome: allot_domain::Outcome::Denied,
            reason: Some(status.message().chars().take(500).collect()),
            before: None,
            after: None,
        };
        if let Err(e) = self.audit.record(ctx, event).await {
            tracing::error!(error = %e, "could not audit a refused node call");
        }
    }

    /// Takes one of `node`'s calls of `call` ([`NodeLimits`]): past its rate,
    /// `RESOURCE_EXHAUSTED`, the first refusal in each ten seconds audited as
    /// `node.rate_limited`.
    async fn within_rate(
        &self,
        ctx: &AuditContext,
        node: &Node,
        call: NodeCall,
    ) -> Result<(), Status> {
        let now = std::time::Instant::now();
        let Err(wait) = self.limits.take(&node.id, call, now) else {
            return Ok(());
        };
        let status = Status::resource_exhausted(format!(
            "node {} calls {} more often than an agent does: retry in {} ms",
            node.name,
            call.name(),
            wait.as_millis().max(1)
        ));
        if self.limits.note(&node.id, call.name(), now) {
            self.record_refusal(ctx.clone(), "node.rate_limited", call.name(), &status)
                .await;
        }
        Err(status)
    }

    /// A call refused for who made it (a bad token, a revoked certificate, a certificate of
    /// another node): counted against its address, past the limit answered
    /// `RESOURCE_EXHAUSTED`, and recorded in the system audit log either way.
    async fn refused(&self, ctx: AuditContext, call: &str, status: Status) -> Status {
        if !matches!(
            status.code(),
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
        ) {
            return status;
        }
        let from = ctx
            .actor
            .source
            .clone()
            .unwrap_or_else(|| "unknown".to_owned());
        let (action, answer) = match self.auth_failures.failed(&from).await {
            Some(retry) => (
                "node.rate_limited",
                Status::resource_exhausted(format!(
                    "too many failed authentications from this address: retry in {retry} s"
                )),
            ),
            None if status.code() == tonic::Code::Unauthenticated => {
                ("node.unauthenticated", status.clone())
            }
            None => ("node.denied", status.clone()),
        };
        self.record_refusal(ctx, action, call, &status).await;
        answer
    }

    async fn register_node(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let presented = presented(&req)?;
        let ctx = node_ctx(&req, &req.get_ref().node_name);
        let r = req.into_inner();
        if !valid_node_name(&r.node_name) {
            return Err(Status::invalid_argument(
                "node_name must be 1 to 253 characters of letters, digits, `-`, `.` and `_`",
            ));
        }
        // A certificate speaks for its own node only; without one, the token must.
        let admission = match presented {
            Some(cert) if cert.node != r.node_name => {
                return Err(Status::permission_denied(format!(
                    "this certificate is node {}'s: it cannot register node {}",
                    cert.node, r.node_name
                )));
            }
            Some(cert) => {
                same_key(&cert, &r.csr_pem)?;
                // A certificate's holder re-registers the GPUs it was approved for, no more.
                if let Some(node) = self
                    .store
                    .node_by_certificate(&cert.serial, self.store.clock().now())
                    .await
                    .map_err(status)?
                {
                    // Refused (and recorded) as any registration refused for its caller.
                    approved(&node, &gpus_from_proto(r.gpus.clone())?)?;
                    // While its agent is connected the node is its agent's: a second holder
                    // of its key registering would requeue its jobs and take its address
                    // over. An agent that restarted had its stream closed with its
                    // process; one whose stream is still closing is given a moment, and
                    // else retries.
                    if !self.stream_closes(&node.id).await {
                        let refused = Status::already_exists(format!(
                            "node {} is connected (its agent's assignment stream is open): \
                             it is registered again only once that stream is closed",
                            node.name
                        ));
                        return Err(self.denied(ctx, "Register", refused).await);
                    }
                }
                Admission::Certificate {
                    serial: cert.serial,
                }
            }
            None if r.bootstrap_token.is_empty() => {
                return Err(Status::unauthenticated(
                    "present a bootstrap token, or connect with the node certificate",
                ));
            }
            None => Admission::BootstrapToken {
                secret_hash: secret::hash(&r.bootstrap_token),
                key: allot_pki::csr_key_fingerprint(&r.csr_pem)
                    .map_err(|e| Status::invalid_argument(format!("csr_pem: {e}")))?,
            },
        };
        let issued = self.issue(&r.csr_pem, &r.node_name)?;
        let (interval, lease) = self.pacing.current();
        let node = self
            .store
            .register_node(
                &ctx,
                NodeRegistration {
                    name: r.node_name,
                    admission,
                    certificate: NewNodeCertificate {
                        serial: issued.serial,
                        issued_at: issued.not_before,
                        expires_at: issued.not_after,
                    },
                    address: valid_address(&r.address)?,
                    agent_version: r.agent_version.chars().take(64).collect(),
                    gpu_backend: r.gpu_backend.chars().take(32).collect(),
                    runtime: match r.runtime.as_str() {
                        "oci" | "process" | "" => r.runtime.clone(),
                        other => {
                            return Err(Status::invalid_argument(format!(
                                "runtime `{}` is neither oci nor process",
                                other.chars().take(32).collect::<String>()
                            )));
                        }
                    },
                    cpu_milli: bounded("cpu_milli", r.cpu_milli, 100_000_000)?,
                    memory_bytes: bounded("memory_bytes", r.memory_bytes, 1 << 50)?,
                    gpus: gpus_from_proto(r.gpus)?,
                    lease_expires_at: self.lease_until(lease),
                },
            )
            .await
            .map_err(status)?;
        let ctx = AuditContext {
            actor: Actor {
                id: node.id.clone(),
                ..ctx.actor
            },
            ..ctx
        };
        self.requeue_lost_jobs(&ctx, &node.id, &r.running_job_ids)
            .await?;
        tracing::info!(node = %node.name, id = %node.id, gpus = node.gpus.len(), "node registered");
        self.notify.notify_one();
        Ok(Response::new(RegisterResponse {
            node_id: node.id,
            certificate_pem: issued.cert_pem,
            heartbeat_interval_ms: millis(interval),
            lease_duration_ms: millis(lease),
            outage_tolerance_ms: millis(self.outage_tolerance.max(lease)),
        }))
    }

    /// Whether the node's assignment stream is closed here, or closes within
    /// [`STREAM_CLOSE_GRACE`] (an agent that dropped it to open another, or to register).
    async fn stream_closes(&self, node_id: &str) -> bool {
        let mut waited = Duration::ZERO;
        while self.hub.is_open(node_id) {
            if waited >= STREAM_CLOSE_GRACE {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += Duration::from_millis(50);
        }
        true
    }

    /// The calling node ([`Self::authenticated_node`]), refusals recorded.
    async fn node<T>(&self, req: &Request<T>, call: &str) -> Result<Node, Status> {
        match self.authenticated_node(req).await {
            Ok(node) => Ok(node),
            Err(e) => {
                let claimed = presented(req)
                    .ok()
                    .flatten()
                    .map_or_else(|| "unknown".to_owned(), |c| c.node);
                Err(self.refused(node_ctx(req, &claimed), call, e).await)
            }
        }
    }

    /// The calling node: the one its certificate was issued to, while that certificate is
    /// current (known, unexpired by the control plane's clock, unrevoked).
    async fn authenticated_node<T>(&self, req: &Request<T>) -> Result<Node, Status> {
        let cert = presented(req)?.ok_or_else(|| {
            Status::unauthenticated("connect with the node certificate (mutual TLS)")
        })?;
        let node = self
            .store
            .node_by_certificate(&cert.serial, self.store.clock().now())
            .await
            .map_err(status)?
            .ok_or_else(|| {
                Status::unauthenticated(
                    "the node certificate is revoked, expired or unknown; register with a new bootstrap token",
                )
            })?;
        if node.name != cert.node {
            return Err(Status::unauthenticated(
                "the certificate does not name the node it was issued to",
            ));
        }
        Ok(node)
    }

    /// Signs `csr_pem` into a certificate for `node`, valid from now for the configured
    /// lifetime.
    fn issue(&self, csr_pem: &str, node: &str) -> Result<Issued, Status> {
        if csr_pem.is_empty() || csr_pem.len() > 16 * 1024 {
            return Err(Status::invalid_argument(
                "csr_pem must be a PEM certificate signing request of at most 16 KiB",
            ));
        }
        let now = self.store.clock().now();
        let ttl =
            chrono::Duration::from_std(self.node_cert_ttl).unwrap_or(chrono::Duration::hours(24));
        self.ca
            .sign_node(csr_pem, node, now, now + ttl, crate::pki::random16())
            .map_err(|e| Status::invalid_argument(format!("csr_pem: {e}")))
    }

    /// When a lease of `lease` granted now ends, on the record's clock (at most a year
    /// ahead: no pace stretches a lease so far).
    fn lease_until(&self, lease: Duration) -> chrono::DateTime<chrono::Utc> {
        self.store.clock().now()
            + chrono::Duration::from_std(lease)
                .unwrap_or(chrono::Duration::MAX)
                .min(chrono::Duration::days(365))
    }

    /// The jobs the record places on `node_id`, in `states`.
    async fn jobs_on(
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
    async fn record_job_samples(
        &self,
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
        self.store.record_job_samples(now, &samples).await
    }

    /// Puts a stopped attempt back in the queue as its next attempt (the verdict of its
    /// report); its GPUs come back once a heartbeat shows the attempt gone from the node.
    async fn requeue(
        &self,
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
        let job = self
            .store
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

    /// What the heartbeat's list of running jobs says against the record. GPUs held back
    /// for a job whose end was reported are released once the node no longer runs it. A
    /// job the node runs that the control plane holds ended, or never gave this node (past
    /// a grace of two heartbeats, for a heartbeat that crossed the report), is stopped on
    /// the node, its GPUs held back meanwhile, and the discrepancy recorded once.
    /// `assigned` is what the record places on the node, scheduled or running.
    async fn reconcile_running(
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
    async fn requeue_lost_jobs(
        &self,
        ctx: &AuditContext,
        node_id: &str,
        running: &[String],
    ) -> Result<(), Status> {
        let held = self.jobs_on(node_id, &[JobState::Running]).await?;
        for job in held.into_iter().filter(|j| !running.contains(&j.id)) {
            let (to, message) = allot_domain::report::lost_with_its_agent(&job);
            let update = JobUpdate {
                message: Some(message.to_owned()),
                requeue_code: Some(RequeueCode::NodeLost),
                ..Default::default()
            };
            match self
                .store
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

/// The digest a report says the job's image resolved to: only for a job with an image,
/// only a sha256 digest, and only the one its reference names if it names one.
fn image_digest(job: &allot_domain::Job, reported: &str) -> Result<Option<String>, Status> {
    if reported.is_empty() {
        return Ok(None);
    }
    let well_formed = reported
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let named = job
        .spec
        .image
        .as_deref()
        .and_then(|i| allot_domain::ImageRef::parse(i).ok());
    match named {
        Some(named) if well_formed && named.digest.as_deref().is_none_or(|d| d == reported) => {
            Ok(Some(reported.to_owned()))
        }
        _ => Err(Status::invalid_argument(
            "image_digest: not a sha256 digest of this job's image",
        )),
    }
}

/// The attempts of `job` whose log node `node_id` may write: the one it runs now, and the
/// one before when the job was requeued because this node was lost (an agent killed and
/// started again ships what its attempt wrote meanwhile). Anything else is refused.
fn log_writable_attempts(job: &allot_domain::Job, node_id: &str) -> Vec<u32> {
    let mut attempts = Vec::new();
    if job.node_id.as_deref() == Some(node_id) {
        attempts.push(job.attempt);
    }
    let lost_here = job
        .avoid
        .as_ref()
        .is_some_and(|a| a.node_id.as_deref() == Some(node_id));
    if lost_here && job.attempt > 1 {
        attempts.push(job.attempt - 1);
    }
    attempts
}

type AssignmentStream = Pin<Box<dyn Stream<Item = Result<Assignment, Status>> + Send>>;

#[tonic::async_trait]
impl allot_proto::NodeService for NodeSvc {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        self.leading()?;
        let claimed: String = req.get_ref().node_name.chars().take(253).collect();
        let ctx = node_ctx(&req, &claimed);
        match self.register_node(req).await {
            Ok(r) => Ok(r),
            Err(e) => Err(self.refused(ctx, "Register", e).await),
        }
    }

    async fn renew_certificate(
        &self,
        req: Request<RenewCertificateRequest>,
    ) -> Result<Response<RenewCertificateResponse>, Status> {
        self.leading()?;
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
        self.store
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
            // The receiver is ours and alive until returned below.
            let _ = tx.send(Ok(assignment));
        }
        // The node can take new work again.
        self.notify.notify_one();
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }

    async fn append_job_logs(&self, req: Request<JobLogs>) -> Result<Response<JobLogsAck>, Status> {
        self.leading()?;
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
            self.store
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

    async fn report_job_status(
        &self,
        req: Request<JobStatusReport>,
    ) -> Result<Response<JobStatusAck>, Status> {
        self.leading()?;
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
        let gang = match &job.replica {
            Some(g)
                if phase.stopped()
                    && r.attempt == job.attempt
                    && job.node_id.as_deref() == Some(node.id.as_str()) =>
            {
                Some(self.store.gang(&g.gang_id).await.map_err(status)?)
            }
            _ => None,
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
                self.requeue(&ctx, &node, &job, requeue, r.exit_code, r.log_tail)
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
            self.store
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
        let job = self
            .store
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
}
