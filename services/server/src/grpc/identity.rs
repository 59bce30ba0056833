//! Who is calling: the node its certificate names, refusals audited and rate-limited,
//! whether this replica leads, and registration (a bootstrap token or a current
//! certificate) with the certificate it issues.

use std::time::Duration;

use allot_api::secret;
use allot_domain::{Actor, ActorKind, AuditContext, Node};
use allot_pki::{Issued, NodeCert};
use allot_proto::v1::{RegisterRequest, RegisterResponse};
use allot_store::{Admission, Fenced, NewNodeCertificate, NodeRegistration, NodeRepo};
use tonic::{Request, Response, Status};

use crate::node_limits::NodeCall;

use super::*;

/// The node certificate the caller connected with, if any. The TLS handshake has checked
/// that the CA signed it and that it is within its validity.
pub(super) fn presented<T>(req: &Request<T>) -> Result<Option<NodeCert>, Status> {
    let Some(leaf) = req.peer_certs().and_then(|c| c.first().cloned()) else {
        return Ok(None);
    };
    NodeCert::from_der(&leaf)
        .map(Some)
        .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))
}

pub(super) fn node_ctx<T>(req: &Request<T>, node_id: &str) -> AuditContext {
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

/// A renewal (or a re-registration with a certificate) must be for the key the node
/// already holds: a stolen certificate cannot be renewed onto a key of the thief's.
pub(super) fn same_key(cert: &NodeCert, csr_pem: &str) -> Result<(), Status> {
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

/// The audit context of a call by `node_id` (or, while registering, the claimed name).
/// How a node authenticated, for its audit entries: `bootstrap-token`, or
/// `node-certificate <serial>` naming the very certificate it called with.
pub(super) fn node_auth<T>(req: &Request<T>) -> String {
    match presented(req) {
        Ok(Some(cert)) => format!("node-certificate {}", cert.serial),
        _ => "bootstrap-token".to_owned(),
    }
}

impl NodeSvc {
    /// Refuses the call unless this replica leads: `UNAVAILABLE`, naming the leader's
    /// endpoint and epoch (`allot_proto::leader`) when they are known, so the agent goes there.
    /// The leader's handle, through which every write a node's call makes goes, so it
    /// commits only while this replica's term holds; `UNAVAILABLE` naming the leader (when
    /// known) unless this replica leads.
    pub(super) fn leading(&self) -> Result<Fenced, Status> {
        match self.leadership.role() {
            crate::leadership::Role::Leader { .. } => self
                .leadership
                .fenced()
                .ok_or_else(|| Status::unavailable("this replica's term is ending; retry")),
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
    pub(super) async fn denied(&self, ctx: AuditContext, call: &str, status: Status) -> Status {
        self.record_refusal(ctx, "node.denied", call, &status).await;
        status
    }

    /// Records a refused call of `call` in the system audit log as `action`.
    pub(super) async fn record_refusal(
        &self,
        ctx: AuditContext,
        action: &str,
        call: &str,
        status: &Status,
    ) {
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
    pub(super) async fn within_rate(
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
    pub(super) async fn refused(&self, ctx: AuditContext, call: &str, status: Status) -> Status {
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

    pub(super) async fn register_node(
        &self,
        store: &Fenced,
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
        let node = store
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
        self.requeue_lost_jobs(store, &ctx, &node.id, &r.running_job_ids)
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
    pub(super) async fn stream_closes(&self, node_id: &str) -> bool {
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
    pub(super) async fn node<T>(&self, req: &Request<T>, call: &str) -> Result<Node, Status> {
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
    pub(super) async fn authenticated_node<T>(&self, req: &Request<T>) -> Result<Node, Status> {
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
    pub(super) fn issue(&self, csr_pem: &str, node: &str) -> Result<Issued, Status> {
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
}
