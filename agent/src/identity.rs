//! The node's identity: its private key and the certificate the control plane's CA signed
//! for it, kept in `<data dir>/identity/` (the key readable by its owner only), and the TLS
//! channels to the control plane that trust that CA and present that certificate.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use allot_pki::NodeCert;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};

use crate::AgentError;

/// A node key and its certificate.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub key_pem: String,
    pub cert_pem: String,
    pub cert: NodeCert,
}

impl Credentials {
    pub fn new(key_pem: String, cert_pem: String) -> Result<Self, AgentError> {
        let cert = NodeCert::from_pem(&cert_pem)
            .map_err(|e| AgentError::Credentials(format!("the node certificate: {e}")))?;
        Ok(Self {
            key_pem,
            cert_pem,
            cert,
        })
    }
}

fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("identity")
}

/// The saved credentials of `node`, if any (those of another node name are ignored).
pub fn load(data_dir: &Path, node: &str) -> Result<Option<Credentials>, AgentError> {
    let dir = dir(data_dir);
    let (key, cert) = (dir.join("node.key"), dir.join("node.crt"));
    if !key.exists() || !cert.exists() {
        return Ok(None);
    }
    let creds = Credentials::new(
        std::fs::read_to_string(key)?,
        std::fs::read_to_string(cert)?,
    )?;
    if creds.cert.node != node {
        tracing::warn!(saved = %creds.cert.node, node, "saved node certificate is another node's; ignoring it");
        return Ok(None);
    }
    Ok(Some(creds))
}

/// Saves the credentials, replacing the earlier ones whole (write, then rename).
pub fn save(data_dir: &Path, creds: &Credentials) -> Result<(), AgentError> {
    let dir = dir(data_dir);
    std::fs::create_dir_all(&dir)?;
    allot_pki::write_private(&dir.join("node.key.new"), &creds.key_pem)?;
    allot_pki::write_private(&dir.join("node.crt.new"), &creds.cert_pem)?;
    std::fs::rename(dir.join("node.key.new"), dir.join("node.key"))?;
    std::fs::rename(dir.join("node.crt.new"), dir.join("node.crt"))?;
    Ok(())
}

/// The connections to the control plane's replicas, one at a time: each replica's channel
/// that presents the node certificate (swapped when the certificate is renewed) and one that
/// presents none (to register with a bootstrap token). Calls go to the current replica;
/// one that cannot be reached, or that answers it does not lead, moves the link on: to the
/// leader it names when that is one of the configured endpoints, else to the next.
pub struct Link {
    servers: Vec<Endpoint>,
    ca: Certificate,
    current: AtomicUsize,
    /// Bumped at every move: what was opened on the replica before (the assignment
    /// stream) re-opens on the current one.
    moves: watch::Sender<u64>,
    /// Spreads retries (backoff jitter): seeded once from the OS.
    rng: Mutex<StdRng>,
    /// What the link knows of each replica, and where its last moves went.
    known: Mutex<Known>,
}

/// What a link knows of its replicas.
struct Known {
    replicas: Vec<Replica>,
    /// The replica calls went to after each of the last moves (move count, index): a call's
    /// failure is held against the replica it was made on, even after another call moved on.
    history: std::collections::VecDeque<(u64, usize)>,
}

/// What a link knows of one replica.
#[derive(Clone, Default)]
struct Replica {
    /// When it last could not be reached or did not answer: a follower's hint naming one
    /// that has just failed is not taken (a leader that died holds its lease a while yet).
    unreachable_at: Option<std::time::Instant>,
    /// The leader epoch it was last known to serve under (a hint that sent calls there, or
    /// its heartbeat answers).
    epoch: Option<i64>,
    /// The epoch it had when it then failed: a hint naming that same term again is stale
    /// (a leader that stopped answering keeps its lease a while), one naming a later term
    /// is not.
    failed_epoch: Option<i64>,
}

/// How long a replica that could not be reached is passed over for hints.
const PASS_OVER: Duration = Duration::from_secs(2);

/// One replica's endpoint and channels.
struct Endpoint {
    url: String,
    endpoint: tonic::transport::Endpoint,
    node: RwLock<Option<Channel>>,
    anonymous: Channel,
}

impl Link {
    /// A link to the replicas at `servers` (`https://` URLs; at least one).
    pub fn new(servers: &[String], ca_pem: &str) -> Result<Arc<Self>, AgentError> {
        let ca = Certificate::from_pem(ca_pem);
        let mut endpoints = Vec::with_capacity(servers.len());
        for server in servers {
            let server = server.trim().trim_end_matches('/');
            if !server.starts_with("https://") {
                return Err(AgentError::Endpoint(
                    server.to_owned(),
                    "agents speak to the control plane over TLS: use https://".into(),
                ));
            }
            let endpoint = tonic::transport::Endpoint::from_shared(server.to_owned())
                .map_err(|e| AgentError::Endpoint(server.to_owned(), e.to_string()))?
                .connect_timeout(Duration::from_secs(3))
                .tcp_nodelay(true)
                // A replica that stops answering (frozen, cut off) has its connection closed
                // within seconds, failing what waits on it, rather than holding every call
                // queued behind it until TCP gives up.
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(2))
                .keep_alive_while_idle(true);
            let anonymous = endpoint
                .clone()
                .tls_config(ClientTlsConfig::new().ca_certificate(ca.clone()))
                .map_err(|e| AgentError::Endpoint(server.to_owned(), e.to_string()))?
                .connect_lazy();
            endpoints.push(Endpoint {
                url: server.to_owned(),
                endpoint,
                node: RwLock::new(None),
                anonymous,
            });
        }
        if endpoints.is_empty() {
            return Err(AgentError::Endpoint(
                String::new(),
                "no control-plane endpoint given".into(),
            ));
        }
        Ok(Arc::new(Self {
            known: Mutex::new(Known {
                replicas: vec![Replica::default(); endpoints.len()],
                history: std::collections::VecDeque::from([(0, 0)]),
            }),
            servers: endpoints,
            ca,
            current: AtomicUsize::new(0),
            moves: watch::Sender::new(0),
            rng: Mutex::new(StdRng::from_os_rng()),
        }))
    }

    fn now(&self) -> &Endpoint {
        let i = self.current.load(Ordering::Acquire) % self.servers.len();
        &self.servers[i]
    }

    /// The URL of the replica calls go to now.
    pub fn server(&self) -> &str {
        &self.now().url
    }

    /// From now on, calls present these credentials (new connections; calls in flight finish
    /// on the old one).
    pub fn present(&self, creds: &Credentials) -> Result<(), AgentError> {
        for server in &self.servers {
            let tls = ClientTlsConfig::new()
                .ca_certificate(self.ca.clone())
                .identity(Identity::from_pem(&creds.cert_pem, &creds.key_pem));
            let channel = server
                .endpoint
                .clone()
                .tls_config(tls)
                .map_err(|e| AgentError::Credentials(e.to_string()))?
                .connect_lazy();
            *server.node.write().unwrap_or_else(|e| e.into_inner()) = Some(channel);
        }
        Ok(())
    }

    /// Stops presenting the node certificate (the control plane refused it).
    pub fn forget(&self) {
        for server in &self.servers {
            *server.node.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// The channel that presents the node certificate, if there is one yet.
    pub fn node(&self) -> Option<Channel> {
        self.now()
            .node
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// [`Link::node`], or the anonymous channel (whose calls the control plane refuses, as
    /// it should, until the node has registered).
    pub fn channel(&self) -> Channel {
        self.node().unwrap_or_else(|| self.anonymous())
    }

    pub fn anonymous(&self) -> Channel {
        self.now().anonymous.clone()
    }

    /// How many times the link has moved: pass it to [`Link::failed`] with the answer of a
    /// call made on the replica current then.
    pub fn moved(&self) -> u64 {
        *self.moves.borrow()
    }

    /// Follows the link's moves.
    pub fn moves(&self) -> watch::Receiver<u64> {
        self.moves.subscribe()
    }

    /// A call made when the link had moved `seen` times failed with `status`: when the
    /// replica could not be reached, or said it does not lead, calls move on (unless another
    /// call moved them already): to the leader it names, when that is one of ours, else
    /// to the next replica. Returns whether the link moved.
    pub fn failed(&self, seen: u64, status: &Status) -> bool {
        if self.servers.len() < 2 || !moves_on(status) {
            return false;
        }
        let named = allot_proto::leader::endpoint(status.metadata());
        let named_epoch = allot_proto::leader::epoch(status.metadata());
        let mut moved = false;
        let now = std::time::Instant::now();
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let Known { replicas, history } = &mut *known;
        let n = self.servers.len();
        // The replica the failed call went to.
        let called = history
            .iter()
            .rev()
            .find(|(count, _)| *count <= seen)
            .map(|(_, i)| *i);
        if let Some(r) = called.and_then(|i| replicas.get_mut(i))
            && (status.code() != Code::Unavailable || named.is_none())
        {
            // Not a follower's answer: it did not answer at all.
            r.unreachable_at = Some(now);
            r.failed_epoch = r.epoch;
        }
        self.moves.send_if_modified(|count| {
            if *count != seen {
                return false;
            }
            let at = self.current.load(Ordering::Acquire) % n;
            let passed_over = |i: usize| {
                replicas[i]
                    .unreachable_at
                    .is_some_and(|t| now.duration_since(t) < PASS_OVER)
            };
            // A hint naming the term that already failed here is stale.
            let stale = |i: usize| {
                matches!((replicas[i].failed_epoch, named_epoch), (Some(failed), Some(e)) if e <= failed)
            };
            let hinted = named
                .and_then(|url| self.servers.iter().position(|s| s.url == url))
                .filter(|i| *i != at && !passed_over(*i) && !stale(*i));
            let next = hinted
                .or_else(|| (1..n).map(|k| (at + k) % n).find(|i| !passed_over(*i)))
                .unwrap_or((at + 1) % n);
            if let Some(i) = hinted {
                replicas[i].epoch = named_epoch;
            }
            self.current.store(next, Ordering::Release);
            *count += 1;
            history.push_back((*count, next));
            if history.len() > 64 {
                history.pop_front();
            }
            moved = true;
            true
        });
        if moved {
            tracing::info!(to = %self.server(), why = %status.message(), "moving to another control-plane replica");
        }
        moved
    }

    /// `call`, given up after `limit` where there is another replica to go to: a request
    /// still waiting for its connection (a stalled replica completes no handshake) is
    /// beyond the request's own deadline.
    pub async fn within<T>(
        &self,
        limit: Duration,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        if !self.has_replicas() {
            return call.await;
        }
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(
                "no answer from this control-plane replica",
            ))
        })
    }

    /// A call made when the link had moved `seen` times was answered by a leader serving
    /// under `epoch` (its heartbeat answers say).
    pub fn answered_by_leader(&self, seen: u64, epoch: Option<i64>) {
        let Some(epoch) = epoch else {
            return;
        };
        if self.moved() != seen {
            return;
        }
        let at = self.current.load(Ordering::Acquire) % self.servers.len();
        if let Some(r) = self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replicas
            .get_mut(at)
        {
            r.epoch = Some(epoch);
        }
    }

    /// Whether there is another replica to move to.
    pub fn has_replicas(&self) -> bool {
        self.servers.len() > 1
    }

    /// `d` spread by ±50%, so agents that lost the same replica do not come back at once.
    pub fn jitter(&self, d: Duration) -> Duration {
        let factor = self
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random_range(0.5..1.5);
        d.mul_f64(factor)
    }
}

/// Answers after which calls move to another replica: it cannot be reached, timed out, or
/// does not lead.
pub fn moves_on(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(leader: Option<(&str, i64)>) -> Status {
        let mut s = Status::unavailable("this replica does not lead");
        if let Some((url, epoch)) = leader {
            allot_proto::leader::set(s.metadata_mut(), url, epoch);
        }
        s
    }

    #[tokio::test]
    async fn calls_follow_the_leader_and_pass_over_a_stale_hint() {
        let urls = ["https://a:7070", "https://b:7070", "https://c:7070"].map(String::from);
        let link = Link::new(&urls, "not checked until a connection is made").expect("link");
        assert_eq!(link.server(), "https://a:7070");
        // a is a follower naming c, epoch 4: calls go to c.
        assert!(link.failed(link.moved(), &refused(Some(("https://c:7070", 4)))));
        assert_eq!(link.server(), "https://c:7070");
        // c stops answering: on to the next, a.
        assert!(link.failed(link.moved(), &Status::deadline_exceeded("no answer")));
        assert_eq!(link.server(), "https://a:7070");
        // a still names c under epoch 4 (its lease has not run out): stale, so b.
        assert!(link.failed(link.moved(), &refused(Some(("https://c:7070", 4)))));
        assert_eq!(link.server(), "https://b:7070");
        // b names a later term of c (started again): taken, once the pass-over is over.
        std::thread::sleep(PASS_OVER);
        assert!(link.failed(link.moved(), &refused(Some(("https://c:7070", 5)))));
        assert_eq!(link.server(), "https://c:7070");
        // Errors that are answers do not move calls.
        assert!(!link.failed(link.moved(), &Status::permission_denied("no")));
        assert_eq!(link.server(), "https://c:7070");
        // A call made on b before the last move fails late: calls stay on c, but b is
        // passed over a while (c's next failure sends calls to a, not b).
        let on_b = link.moved() - 1;
        assert!(!link.failed(on_b, &Status::unavailable("late")));
        assert_eq!(link.server(), "https://c:7070");
        assert!(link.failed(link.moved(), &Status::deadline_exceeded("no answer")));
        assert_eq!(link.server(), "https://a:7070");
    }

    #[tokio::test]
    async fn one_endpoint_never_moves() {
        let link = Link::new(&["https://a:7070".to_owned()], "pem").expect("link");
        assert!(!link.failed(link.moved(), &Status::unavailable("gone")));
        assert_eq!(link.moved(), 0);
        assert!(Link::new(&[], "pem").is_err());
        assert!(Link::new(&["http://a:7070".to_owned()], "pem").is_err());
    }
}
