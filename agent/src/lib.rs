//! The node agent: registers with the control plane over gRPC, heartbeats its inventory,
//! follows its assignment stream, runs each job through its runtime (a confined OCI
//! container, or an unconfined process where the operator chose that), and reports every
//! status change until the control plane has acknowledged it.

pub mod cdi;
pub mod cuda_checkpoint;
pub mod gpu;
pub mod identity;
pub mod image;
pub mod job_samples;
mod metrics;
pub mod mig;
pub mod runtime;
pub mod sharing;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_proto::NodeServiceClient;
use allot_proto::v1::{
    Cancel, Gpu, HeartbeatRequest, JobPhase, JobStatusReport, Launch, Partition, RegisterRequest,
    RenewCertificateRequest, Resize, WatchAssignmentsRequest, assignment::Kind,
};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tracing::Instrument;

use allot_domain::XidClass;

use crate::gpu::{GpuBackend, GpuEvent};
use crate::identity::{Credentials, Link};
use crate::runtime::{
    AssignedGpu, JobRuntime, LaunchSpec, Network, Outcome, PullCredentials, StopReason, StopSignal,
    Tracker,
};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The control plane's gRPC endpoint, e.g. `https://cp.example:7070`.
    pub server: String,
    /// The control plane's node CA (PEM): the agent trusts the server certificate it signed.
    pub ca_cert_pem: String,
    /// A one-time bootstrap token, needed to register when the node has no certificate yet
    /// (or its certificate was revoked).
    pub bootstrap_token: Option<String>,
    pub node_name: String,
    /// Job directories and logs live under `<data_dir>/jobs/`, the node's key and
    /// certificate under `<data_dir>/identity/`.
    pub data_dir: PathBuf,
    /// How long a stopped job gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// The CPU and memory this node offers to jobs.
    pub offer: NodeResources,
    /// Serve Prometheus metrics at `/metrics` here (unauthenticated: loopback or an
    /// internal network).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How jobs on shares of GPUs are held to them.
    pub sharing: sharing::SharingConfig,
    /// What runs jobs here.
    pub runtime: RuntimeChoice,
}

/// The runtime an agent runs its jobs with (see [`runtime`]).
#[derive(Debug, Clone, Default)]
pub enum RuntimeChoice {
    /// Unconfined processes (`--runtime process`): `allot dev`, or an operator's explicit
    /// choice.
    #[default]
    Process,
    /// OCI containers (`--runtime oci`, the default on real nodes).
    Oci(runtime::oci::OciConfig),
}

/// CPU (milli) and memory (bytes) a node offers to jobs; 0 is "unknown" (not a constraint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeResources {
    pub cpu_milli: u64,
    pub memory_bytes: u64,
}

impl NodeResources {
    /// What this machine has: its usable CPUs, and `MemTotal` of `/proc/meminfo`.
    pub fn detect() -> Self {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get() as u64);
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().strip_suffix("kB"))
                    .and_then(|kb| kb.trim().parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024);
        Self {
            cpu_milli: cpus * 1000,
            memory_bytes: memory,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid control plane address `{0}`: {1}")]
    Endpoint(String, String),
    #[error("GPU backend: {0}")]
    Backend(#[from] gpu::BackendError),
    #[error(
        "no node certificate in {0} and no bootstrap token: create one with `allot node bootstrap-token create` and pass it with --bootstrap-token"
    )]
    NoCredentials(PathBuf),
    #[error(
        "the control plane refused to register this node ({0}): create a new bootstrap token with `allot node bootstrap-token create` and pass it with --bootstrap-token"
    )]
    Refused(String),
    #[error("node credentials: {0}")]
    Credentials(String),
    #[error("job runtime: {0}")]
    Runtime(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Why following the assignment stream ended.
enum StreamEnd {
    /// The agent is shutting down.
    Stopped,
    /// The stream was open and broke (or the control plane closed it).
    Broke,
    /// It could not be opened.
    Unreachable,
    /// The control plane refused the node's credentials: register again.
    Unauthenticated,
}

/// A running job on shares of GPUs, as the sharing police sees it: its id, how its
/// processes are recognised, its limits and how to stop it.
type PolicedJob = (
    String,
    Option<Tracker>,
    Arc<sharing::JobSharing>,
    Arc<StopSignal>,
);

/// A job running here.
struct RunningJob {
    attempt: u32,
    signal: Arc<StopSignal>,
    /// The GPUs it holds (a fault on one of them stops it).
    gpus: Vec<String>,
    /// The share of each it holds, in milli.
    gpu_milli: u32,
    /// Its limits, when it holds shares of GPUs.
    sharing: Option<Arc<sharing::JobSharing>>,
    /// How its processes are recognised, once started.
    tracker: Arc<Mutex<Option<Tracker>>>,
}

impl RunningJob {
    fn tracker(&self) -> Option<Tracker> {
        self.tracker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Jobs this agent process has seen, and the ones still running.
#[derive(Default)]
struct Jobs {
    /// By job id.
    running: HashMap<String, RunningJob>,
    /// Every (job id, attempt) ever assigned here, so a replayed launch never runs an
    /// attempt twice (a preempted job comes back as its next attempt).
    seen: HashSet<(String, u32)>,
}

/// The lease as this agent knows it, on its own monotonic clock: it runs from the moment a
/// registration or heartbeat that the control plane accepted was *sent*, so it never
/// outlasts the control plane's view of it (which starts when the call arrived).
#[derive(Debug, Default, Clone, Copy)]
struct Lease {
    valid_until: Option<Instant>,
    duration: Duration,
}

impl Lease {
    /// When jobs must be gone: a fifth of the lease before it lapses, so that killing them
    /// and a late clock tick still finish before the control plane may requeue them.
    fn fence_at(&self) -> Option<Instant> {
        self.valid_until.map(|u| u - self.duration / 5)
    }
}

struct Agent {
    cfg: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    link: Arc<Link>,
    /// The node certificate presented now, once registered.
    creds: Mutex<Option<Credentials>>,
    jobs: Mutex<Jobs>,
    reports: mpsc::UnboundedSender<JobStatusReport>,
    lease: Mutex<Lease>,
    /// GPUs that had an XID needing a drain: unhealthy until the agent starts again (an
    /// operator resets the GPU meanwhile).
    drained: Mutex<HashSet<String>>,
    /// GPUs that had an informational XID (page retirement, a high single-bit ECC rate):
    /// degraded until the agent starts again.
    degraded: Mutex<HashSet<String>>,
    metrics: metrics::AgentMetrics,
    /// `cuda-checkpoint`, where the driver and the utility are both here.
    cuda_checkpoint: Option<PathBuf>,
    /// What runs its jobs.
    runtime: Arc<dyn JobRuntime>,
}

/// A client on the channel that presents the node certificate.
fn client(link: &Link) -> NodeServiceClient<Channel> {
    NodeServiceClient::new(link.channel())
}

/// Errors worth retrying: the control plane is away or restarting.
fn transient(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unauthenticated
    )
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((100u64 << attempt.min(5)).min(3_000))
}

impl Agent {
    /// The assigned GPUs (or MIG instances), each with its GPU's index.
    fn assigned(&self, uuids: &[String], inventory: &[gpu::GpuInfo]) -> Vec<AssignedGpu> {
        uuids
            .iter()
            .filter_map(|u| {
                if let Some(g) = inventory.iter().find(|g| &g.uuid == u) {
                    return Some(AssignedGpu {
                        uuid: u.clone(),
                        index: g.index,
                    });
                }
                let mig = self.backend.mig()?;
                inventory
                    .iter()
                    .find(|g| {
                        mig.mig_instances(g.index)
                            .ok()
                            .flatten()
                            .is_some_and(|is| is.iter().any(|i| &i.uuid == u))
                    })
                    .map(|g| AssignedGpu {
                        uuid: u.clone(),
                        index: g.index,
                    })
            })
            .collect()
    }

    fn gpus(&self) -> Result<Vec<Gpu>, AgentError> {
        let drained = self.lock_drained().clone();
        let degraded = self.lock_degraded().clone();
        let held: Vec<(Vec<String>, u32)> = self
            .lock_jobs()
            .running
            .values()
            .map(|j| (j.gpus.clone(), j.gpu_milli))
            .collect();
        let mut out = Vec::new();
        for g in self.backend.inventory()? {
            let mig = match self.backend.mig() {
                Some(m) => m.mig_instances(g.index)?,
                None => None,
            };
            // The share of this GPU (or of its MIG instances) the running jobs hold.
            let load: f64 = held
                .iter()
                .filter(|(uuids, _)| {
                    uuids
                        .iter()
                        .any(|u| *u == g.uuid || mig.iter().flatten().any(|i| i.uuid == *u))
                })
                .map(|(_, milli)| f64::from(*milli) / 1000.0)
                .sum();
            let sample = self
                .backend
                .sample(g.index, load)
                .map(|s| allot_proto::v1::GpuSample {
                    utilization: s.utilization as f32,
                    memory_used_bytes: s.memory_used_bytes,
                    power_watts: s.power_watts as f32,
                    temperature_c: s.temperature_c as f32,
                    pcie_rx_bytes_per_s: s.pcie_rx_bytes_per_s,
                    pcie_tx_bytes_per_s: s.pcie_tx_bytes_per_s,
                    nvlink_rx_bytes_per_s: s.nvlink_rx_bytes_per_s,
                    nvlink_tx_bytes_per_s: s.nvlink_tx_bytes_per_s,
                    throttle_reasons: s.throttle_reasons,
                    ecc_corrected: s.ecc_corrected,
                    ecc_uncorrected: s.ecc_uncorrected,
                });
            out.push(Gpu {
                sample,
                healthy: g.healthy && !drained.contains(&g.uuid),
                degraded: g.degraded || degraded.contains(&g.uuid),
                mig_enabled: mig.is_some(),
                mig_instances: mig
                    .unwrap_or_default()
                    .into_iter()
                    .map(|i| allot_proto::v1::MigInstance {
                        profile: i.profile,
                        start: u32::from(i.start),
                        uuid: i.uuid,
                    })
                    .collect(),
                uuid: g.uuid,
                index: g.index,
                model: g.model,
                memory_bytes: g.memory_bytes,
            });
        }
        Ok(out)
    }

    /// The MIG instance UUIDs on the GPU with this index (a fault there stops their jobs).
    /// What each running job is doing, from the GPU samples in `gpus` (see
    /// [`job_samples`]).
    fn job_samples(&self, gpus: &[Gpu]) -> Vec<allot_proto::v1::JobSample> {
        let mut readings = HashMap::new();
        // A GPU or MIG instance UUID → its GPU's.
        let mut physical: HashMap<&str, &str> = HashMap::new();
        for g in gpus {
            physical.insert(&g.uuid, &g.uuid);
            for i in &g.mig_instances {
                physical.insert(&i.uuid, &g.uuid);
            }
            if let Some(s) = &g.sample {
                readings.insert(
                    g.uuid.clone(),
                    job_samples::GpuReading {
                        utilization: f64::from(s.utilization),
                        memory_used_bytes: s.memory_used_bytes,
                    },
                );
            }
        }
        struct Running {
            id: String,
            gpus: Vec<String>,
            gpu_milli: u32,
            shared: Option<Arc<sharing::JobSharing>>,
            tracker: Option<Tracker>,
        }
        let running: Vec<Running> = self
            .lock_jobs()
            .running
            .iter()
            .map(|(id, j)| Running {
                id: id.clone(),
                gpus: j.gpus.clone(),
                gpu_milli: j.gpu_milli,
                shared: j.sharing.clone(),
                tracker: j.tracker(),
            })
            .collect();
        if running.is_empty() {
            return Vec::new();
        }
        // The driver's count of each job's processes' memory, where it gives one.
        let owners: Vec<(String, Tracker)> = running
            .iter()
            .filter_map(|r| Some((r.id.clone(), r.tracker.clone()?)))
            .collect();
        let mut counted: HashMap<String, u64> = HashMap::new();
        for g in gpus {
            for (pid, bytes) in self.backend.process_memory(g.index).unwrap_or_default() {
                if let Some(job) = sharing::job_of(pid, &owners) {
                    *counted.entry(job.to_owned()).or_default() += bytes;
                }
            }
        }
        let jobs: Vec<job_samples::JobOnGpus> = running
            .into_iter()
            .map(|r| {
                // The shim's count, once the job's processes use it.
                let shim = r
                    .shared
                    .filter(|s| !s.region.pids().is_empty())
                    .map(|s| (0..s.gpus.len()).map(|i| s.region.used(i)).sum::<u64>());
                job_samples::JobOnGpus {
                    memory_counted: shim.or_else(|| counted.get(&r.id).copied()),
                    gpus: r
                        .gpus
                        .iter()
                        .filter_map(|u| physical.get(u.as_str()).map(|p| (*p).to_owned()))
                        .collect(),
                    gpu_milli: r.gpu_milli,
                    id: r.id,
                }
            })
            .collect();
        job_samples::attribute(&readings, &jobs)
            .into_iter()
            .map(
                |(job_id, utilization, memory_used_bytes)| allot_proto::v1::JobSample {
                    job_id,
                    utilization: utilization as f32,
                    memory_used_bytes,
                },
            )
            .collect()
    }

    fn mig_uuids(&self, index: u32) -> Vec<String> {
        self.backend
            .mig()
            .and_then(|m| m.mig_instances(index).ok().flatten())
            .unwrap_or_default()
            .into_iter()
            .map(|i| i.uuid)
            .collect()
    }

    /// Gives a GPU the MIG layout the control plane asked for, refusing to destroy an
    /// instance a job runs on; the next heartbeat reports the result.
    fn partition(&self, p: Partition) {
        let Some(mig) = self.backend.mig() else {
            tracing::warn!(gpu = %p.gpu_uuid, "asked to partition, but this backend has no MIG");
            return;
        };
        let gpu = match self.backend.inventory() {
            Ok(inv) => inv.into_iter().find(|g| g.uuid == p.gpu_uuid),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read GPU inventory");
                return;
            }
        };
        let Some(gpu) = gpu else {
            tracing::warn!(gpu = %p.gpu_uuid, "asked to partition a GPU this node does not have");
            return;
        };
        let layout: Vec<(u32, u8)> = p
            .layout
            .iter()
            .map(|m| (m.profile, u8::try_from(m.start).unwrap_or(u8::MAX)))
            .collect();
        let held: HashSet<String> = self
            .lock_jobs()
            .running
            .values()
            .flat_map(|j| j.gpus.iter().cloned())
            .collect();
        let store = mig::LayoutStore::new(&self.cfg.data_dir);
        match mig::apply(mig, &store, &gpu, &layout, &|uuid| held.contains(uuid)) {
            Ok(actual) => {
                tracing::info!(gpu = %gpu.uuid, instances = actual.len(), "MIG layout applied")
            }
            Err(e) => tracing::warn!(gpu = %gpu.uuid, error = %e, "MIG layout not applied"),
        }
    }

    fn running_ids(&self) -> Vec<String> {
        self.lock_jobs().running.keys().cloned().collect()
    }

    fn lock_jobs(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_creds(&self) -> std::sync::MutexGuard<'_, Option<Credentials>> {
        self.creds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a newly signed certificate for the key of `request` into use (and saves it).
    fn adopt(&self, key_pem: String, cert_pem: String) -> Result<(), AgentError> {
        let creds = Credentials::new(key_pem, cert_pem)?;
        identity::save(&self.cfg.data_dir, &creds)?;
        self.link.present(&creds)?;
        *self.lock_creds() = Some(creds);
        Ok(())
    }

    /// Registers, retrying until it works or the agent stops: with the node certificate when
    /// there is one, else (or when it is refused) with the bootstrap token. Each registration
    /// gets a new certificate for a new key. Returns the heartbeat interval.
    async fn register(&self, stop: &CancellationToken) -> Result<Option<Duration>, AgentError> {
        let mut attempt = 0;
        loop {
            let (channel, bootstrap_token) = match self.link.node() {
                Some(channel) => (channel, String::new()),
                None => match &self.cfg.bootstrap_token {
                    Some(t) => (self.link.anonymous(), t.clone()),
                    None => {
                        return Err(AgentError::NoCredentials(
                            self.cfg.data_dir.join("identity"),
                        ));
                    }
                },
            };
            let with_certificate = bootstrap_token.is_empty();
            let request = allot_pki::node_request(&self.cfg.node_name)
                .map_err(|e| AgentError::Credentials(e.to_string()))?;
            let req = RegisterRequest {
                bootstrap_token,
                csr_pem: request.csr_pem,
                node_name: self.cfg.node_name.clone(),
                agent_version: VERSION.to_owned(),
                gpu_backend: self.backend.kind().to_owned(),
                gpus: self.gpus()?,
                running_job_ids: self.running_ids(),
                cpu_milli: self.cfg.offer.cpu_milli,
                memory_bytes: self.cfg.offer.memory_bytes,
                runtime: self.runtime.kind().as_str().to_owned(),
            };
            let sent = Instant::now();
            match NodeServiceClient::new(channel).register(req).await {
                Ok(res) => {
                    let res = res.into_inner();
                    self.adopt(request.key_pem, res.certificate_pem)?;
                    let duration = Duration::from_millis(res.lease_duration_ms.into());
                    *self.lock_lease() = Lease {
                        valid_until: Some(sent + duration),
                        duration,
                    };
                    tracing::info!(node = %self.cfg.node_name, id = %res.node_id, "registered");
                    return Ok(Some(Duration::from_millis(
                        res.heartbeat_interval_ms.max(100).into(),
                    )));
                }
                Err(s) if s.code() == Code::Unauthenticated && with_certificate => {
                    // Revoked, expired, or from an earlier CA: only a bootstrap token helps.
                    tracing::error!(node = %self.cfg.node_name, error = %s.message(), "the control plane refused the node certificate");
                    self.link.forget();
                    *self.lock_creds() = None;
                }
                Err(s) if matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied) => {
                    return Err(AgentError::Refused(s.message().to_owned()));
                }
                Err(s) => {
                    tracing::warn!(node = %self.cfg.node_name, error = %s.message(), "registration failed; retrying");
                    attempt += 1;
                    tokio::select! {
                        () = stop.cancelled() => return Ok(None),
                        () = tokio::time::sleep(backoff(attempt)) => {}
                    }
                }
            }
        }
    }

    async fn heartbeats(self: Arc<Self>, every: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            self.heartbeat(every).await;
            let renew_at = self.lock_creds().as_ref().map(|c| c.cert.renew_at());
            if renew_at.is_some_and(|at| chrono::Utc::now() >= at) {
                self.renew().await;
            }
        }
    }

    /// Replaces the node certificate, two thirds through its life, with one for a new key.
    /// A failure is retried at the next heartbeat; the current certificate serves meanwhile.
    async fn renew(&self) {
        let request = match allot_pki::node_request(&self.cfg.node_name) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a certificate signing request");
                return;
            }
        };
        let req = RenewCertificateRequest {
            csr_pem: request.csr_pem,
        };
        match client(&self.link).renew_certificate(req).await {
            Ok(res) => match self.adopt(request.key_pem, res.into_inner().certificate_pem) {
                Ok(()) => {
                    let until = self.lock_creds().as_ref().map(|c| c.cert.not_after);
                    tracing::info!(until = ?until, "node certificate renewed");
                }
                Err(e) => tracing::warn!(error = %e, "renewed node certificate not taken"),
            },
            Err(s) => tracing::warn!(error = %s.message(), "renewing the node certificate failed"),
        }
    }

    /// One heartbeat: renews the lease (on success, from when it was sent) and reports the
    /// inventory and the running jobs.
    async fn heartbeat(&self, every: Duration) {
        let gpus = match self.gpus() {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read GPU inventory");
                return;
            }
        };
        let job_samples = self.job_samples(&gpus);
        let mut client = client(&self.link);
        let mut req = Request::new(HeartbeatRequest {
            gpus,
            running_job_ids: self.running_ids(),
            job_samples,
        });
        // A slow answer still renews the lease from when the call was sent, so wait for
        // one up to half a lease (a loaded control plane is not a lost one).
        let half_lease = self.lock_lease().duration / 2;
        req.set_timeout(half_lease.max(every));
        let sent = Instant::now();
        match client.heartbeat(req).await {
            Ok(_) => {
                let mut lease = self.lock_lease();
                lease.valid_until = Some(sent + lease.duration);
            }
            Err(s) => tracing::warn!(error = %s.message(), "heartbeat failed"),
        }
    }

    fn lock_lease(&self) -> std::sync::MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills every job once the lease is about to lapse without renewal: from then on the
    /// control plane may requeue them elsewhere, and a job must never run twice.
    async fn fence(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let (fence_at, check) = {
                let lease = *self.lock_lease();
                let check = (lease.duration / 10)
                    .clamp(Duration::from_millis(20), Duration::from_millis(250));
                (lease.fence_at(), check)
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(check) => {}
            }
            if fence_at.is_none_or(|at| Instant::now() < at) {
                continue;
            }
            let jobs = self.lock_jobs();
            for (id, job) in &jobs.running {
                tracing::warn!(job = %id, attempt = job.attempt, "lease about to lapse without renewal: killing the job");
                job.signal.stop(StopReason::LeaseLost);
            }
        }
    }

    /// Acts on the GPU events the backend reports (XIDs), by class (see
    /// `allot_domain::xid`): the jobs on a GPU with an application fault fail; those on a GPU
    /// with a contained memory error or one that needs a drain are stopped and requeued
    /// elsewhere, and a GPU that needs a drain is reported unhealthy from then on. After an
    /// informational XID the GPU is reported degraded: its jobs run on, it takes no new work.
    async fn watch_gpus(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            for event in self.backend.take_events() {
                let GpuEvent::Xid { index, code } = event;
                let Some(uuid) = self
                    .backend
                    .inventory()
                    .ok()
                    .and_then(|inv| inv.into_iter().find(|g| g.index == index))
                    .map(|g| g.uuid)
                else {
                    tracing::warn!(index, code, "XID on a GPU the backend does not list");
                    continue;
                };
                // Jobs on the GPU's MIG instances share its fate.
                let mut affected = self.mig_uuids(index);
                affected.push(uuid.clone());
                let what = format!("{} on GPU {uuid}", allot_domain::xid::describe(code));
                let class = allot_domain::classify_xid(code);
                self.metrics.xid(&uuid, code, metrics::xid_class(class));
                let reason = match class {
                    XidClass::Informational => {
                        // Its jobs run on; it takes no new work. Tell the control plane now.
                        tracing::warn!(%what, "GPU degraded");
                        if self.lock_degraded().insert(uuid.clone()) {
                            let every = self.lock_lease().duration / 5;
                            self.heartbeat(every).await;
                        }
                        continue;
                    }
                    XidClass::ApplicationFault => StopReason::ApplicationFault,
                    XidClass::ContainedMemoryError => StopReason::DeviceFault,
                    XidClass::DrainAndReset => {
                        self.lock_drained().insert(uuid.clone());
                        // Tell the control plane first, so the jobs stopped below are not
                        // placed on this GPU again.
                        let every = self.lock_lease().duration / 5;
                        self.heartbeat(every).await;
                        StopReason::DeviceFault
                    }
                };
                tracing::warn!(%what, ?reason, "GPU fault");
                for (id, job) in &self.lock_jobs().running {
                    if job.gpus.iter().any(|g| affected.contains(g)) {
                        tracing::warn!(job = %id, attempt = job.attempt, %what, "stopping the job");
                        job.signal.stop_with(reason, what.clone());
                    }
                }
            }
        }
    }

    fn lock_drained(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.drained.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the metrics report, as of now.
    fn metrics_snapshot(&self) -> metrics::Snapshot {
        let gpus = self.gpus().unwrap_or_default();
        let mut per_gpu: HashMap<String, i64> = gpus.iter().map(|g| (g.uuid.clone(), 0)).collect();
        for job in self.lock_jobs().running.values() {
            for uuid in &job.gpus {
                *per_gpu.entry(uuid.clone()).or_default() += 1;
            }
        }
        let remaining = self.lock_lease().valid_until.map_or(0.0, |u| {
            u.saturating_duration_since(Instant::now()).as_secs_f64()
        });
        metrics::Snapshot {
            gpus: gpus
                .iter()
                .map(|g| {
                    // Operators' drains are the control plane's: it reports those.
                    let health = if !g.healthy {
                        "unhealthy"
                    } else if g.degraded {
                        "degraded"
                    } else {
                        "healthy"
                    };
                    (
                        metrics::GpuLabels {
                            gpu_uuid: g.uuid.clone(),
                            model: g.model.clone(),
                            health: health.to_owned(),
                        },
                        g.memory_bytes,
                    )
                })
                .collect(),
            jobs_per_gpu: per_gpu.into_iter().collect(),
            lease_remaining_seconds: remaining,
        }
    }

    fn lock_degraded(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.degraded.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn report(&self, r: JobStatusReport) {
        // The reporter outlives every sender but the agent's own, so this cannot fail
        // while jobs run.
        let _ = self.reports.send(r);
    }

    fn launch(self: &Arc<Self>, l: Launch, tasks: &mut JoinSet<()>) {
        let signal = Arc::new(StopSignal::default());
        let traceparent = l.traceparent.clone();
        if self
            .lock_jobs()
            .seen
            .contains(&(l.job_id.clone(), l.attempt))
        {
            return;
        }
        let inventory = self.backend.inventory().unwrap_or_default();
        if self.runtime.kind() == runtime::RuntimeKind::Oci
            && self.backend.kind() == "simulated"
            && !l.gpu_uuids.is_empty()
            && let Err(e) = write_simulated_cdi(&self.cfg.data_dir, self.backend.as_ref())
        {
            tracing::warn!(error = %e, "simulated GPUs' CDI spec not rewritten");
        }
        let share = sharing::Share {
            gpu_milli: l.gpu_milli,
            gpu_memory_bytes: l.gpu_memory_bytes,
        };
        let shared = match sharing::prepare(
            &self.cfg.sharing,
            &l.job_id,
            &l.gpu_uuids,
            share,
            &l.gpu_compute,
            &inventory,
        ) {
            Ok(s) => s.map(Arc::new),
            Err(why) => {
                // Never run a shared job without its limits.
                tracing::warn!(job = %l.job_id, %why, "cannot enforce the job's GPU share");
                self.lock_jobs().seen.insert((l.job_id.clone(), l.attempt));
                self.report(JobStatusReport {
                    job_id: l.job_id,
                    phase: JobPhase::Failed.into(),
                    message: format!("the node cannot hold the job to its GPU share: {why}"),
                    attempt: l.attempt,
                    ..Default::default()
                });
                return;
            }
        };
        let tracker = Arc::new(Mutex::new(None));
        {
            let mut jobs = self.lock_jobs();
            if !jobs.seen.insert((l.job_id.clone(), l.attempt)) {
                return;
            }
            jobs.running.insert(
                l.job_id.clone(),
                RunningJob {
                    attempt: l.attempt,
                    signal: signal.clone(),
                    gpus: l.gpu_uuids.clone(),
                    gpu_milli: l.gpu_milli,
                    sharing: shared.clone(),
                    tracker: tracker.clone(),
                },
            );
        }
        let attempt = l.attempt;
        let spec = LaunchSpec {
            job_id: l.job_id.clone(),
            job_name: l.name,
            tenant: l.tenant,
            node_name: self.cfg.node_name.clone(),
            command: l.command,
            env: {
                let mut env: std::collections::BTreeMap<_, _> = l.env.into_iter().collect();
                if let Some(tool) = &self.cuda_checkpoint {
                    env.insert(
                        "ALLOT_CUDA_CHECKPOINT".to_owned(),
                        tool.display().to_string(),
                    );
                }
                if let Some(s) = &shared {
                    let extra = s.env(&env);
                    env.extend(extra);
                }
                env
            },
            workdir: (!l.workdir.is_empty()).then_some(l.workdir),
            gpus: self.assigned(&l.gpu_uuids, &inventory),
            gpu_uuids: l.gpu_uuids,
            attempt: l.attempt,
            gpu_milli: l.gpu_milli,
            gpu_memory_bytes: l.gpu_memory_bytes,
            cpu_milli: l.cpu_milli,
            memory_bytes: l.memory_bytes,
            image: (!l.image.is_empty()).then_some(l.image),
            pull_credentials: (!l.registry_username.is_empty()).then_some(PullCredentials {
                username: l.registry_username,
                password: l.registry_password,
            }),
            network: if l.network == "none" {
                Network::None
            } else {
                Network::Host
            },
            checkpoint_dir: (!l.checkpoint_dir.is_empty()).then(|| PathBuf::from(l.checkpoint_dir)),
            inherit_fds: shared
                .as_ref()
                .map(|s| s.fds().to_vec())
                .unwrap_or_default(),
            preload: shared.as_ref().and_then(|s| s.preload.clone()),
        };
        let agent = self.clone();
        // The launch joins the trace of the decision that placed it.
        let span = tracing::info_span!(
            "job.launch",
            otel.name = "job.launch",
            job.id = %spec.job_id,
            job.attempt = spec.attempt,
            node = %self.cfg.node_name,
            trace_id = tracing::field::Empty,
        );
        allot_telemetry::set_parent(&span, &traceparent);
        if let Some(id) = allot_telemetry::trace_id(&span) {
            span.record("trace_id", id);
        }
        tasks.spawn(
            async move {
                let job_id = spec.job_id.clone();
                let log = runtime::joblog::path(&agent.cfg.data_dir, &job_id, attempt);
                tracing::info!(job = %job_id, image = ?spec.image, runtime = agent.runtime.kind().as_str(), "launching");
                let finished = runtime::supervise(
                    agent.runtime.as_ref(),
                    spec,
                    log,
                    &signal,
                    agent.cfg.stop_grace,
                    |started| {
                        *tracker.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(started.tracker.clone());
                        agent.report(JobStatusReport {
                            job_id: job_id.clone(),
                            phase: JobPhase::Running.into(),
                            pid: Some(started.pid),
                            attempt,
                            image_digest: started.image_digest.unwrap_or_default(),
                            ..Default::default()
                        });
                    },
                )
                .await;
                let (phase, exit_code, message) = match finished.outcome {
                    Outcome::Succeeded => (JobPhase::Succeeded, Some(0), String::new()),
                    Outcome::Failed { exit_code, message } => {
                        (JobPhase::Failed, exit_code, message)
                    }
                    Outcome::Cancelled { message } => (JobPhase::Cancelled, None, message),
                    Outcome::Lost { message } => (JobPhase::Lost, None, message),
                    Outcome::DeviceFault { message } => (JobPhase::DeviceFault, None, message),
                };
                tracing::info!(job = %job_id, ?phase, ?exit_code, "job ended");
                agent.report(JobStatusReport {
                    job_id: job_id.clone(),
                    phase: phase.into(),
                    pid: None,
                    exit_code,
                    message,
                    log_tail: finished.log_tail,
                    attempt,
                    ..Default::default()
                });
                let mut jobs = agent.lock_jobs();
                if jobs
                    .running
                    .get(&job_id)
                    .is_some_and(|j| j.attempt == attempt)
                {
                    jobs.running.remove(&job_id);
                }
            }
            .instrument(span),
        );
    }

    /// Applies a new share to a running job's limits.
    fn resize(&self, r: Resize) {
        let jobs = self.lock_jobs();
        match jobs.running.get(&r.job_id) {
            Some(job) if job.attempt == r.attempt || r.attempt == 0 => match &job.sharing {
                Some(s) => {
                    s.resize(sharing::Share {
                        gpu_milli: r.gpu_milli,
                        gpu_memory_bytes: r.gpu_memory_bytes,
                    });
                    tracing::info!(job = %r.job_id, gpu_milli = r.gpu_milli, gpu_memory_bytes = r.gpu_memory_bytes, "resized");
                }
                None => tracing::warn!(job = %r.job_id, "resize of a job on whole GPUs ignored"),
            },
            _ => {
                tracing::info!(job = %r.job_id, attempt = r.attempt, "resize of a job not running here ignored")
            }
        }
    }

    /// Keeps jobs on shared GPUs to their limits: contention for elastic jobs, the budget
    /// of dead processes, and the driver's count of each job's memory (the second line of
    /// defence behind the shim).
    async fn police_sharing(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
            let shared: Vec<PolicedJob> = self
                .lock_jobs()
                .running
                .iter()
                .filter_map(|(id, j)| {
                    let s = j.sharing.clone()?;
                    Some((id.clone(), j.tracker(), s, j.signal.clone()))
                })
                .collect();
            if shared.is_empty() {
                continue;
            }
            for (_, _, s, _) in &shared {
                s.region.sweep_dead(allot_shim_core::process_alive);
            }
            let regions: Vec<&sharing::JobSharing> =
                shared.iter().map(|(_, _, s, _)| s.as_ref()).collect();
            sharing::update_contention(&regions, allot_shim_core::monotonic_ns());
            let owners: Vec<(String, Tracker)> = shared
                .iter()
                .filter_map(|(id, tracker, _, _)| Some((id.clone(), tracker.clone()?)))
                .collect();
            let Ok(inventory) = self.backend.inventory() else {
                continue;
            };
            for gpu in &inventory {
                let limits: HashMap<String, u64> = shared
                    .iter()
                    .filter_map(|(id, _, s, _)| Some((id.clone(), s.limit_on(&gpu.uuid)?)))
                    .collect();
                if limits.is_empty() {
                    continue;
                }
                let Some(processes) = self.backend.process_memory(gpu.index) else {
                    continue;
                };
                for breach in sharing::breaches(&gpu.uuid, &processes, &owners, &limits) {
                    let Some((_, _, _, signal)) =
                        shared.iter().find(|(id, ..)| *id == breach.job_id)
                    else {
                        continue;
                    };
                    tracing::warn!(job = %breach.job_id, gpu = %breach.gpu, used = breach.used, limit = breach.limit, "job over its GPU memory limit: killing it");
                    self.metrics.limit_kill(&breach.gpu);
                    signal.stop_with(StopReason::OverLimit, breach.message());
                }
            }
        }
    }

    /// Stops the job's attempt `c.attempt` (0: whichever runs), or makes sure it never
    /// starts here.
    fn cancel(&self, c: Cancel) {
        let mut jobs = self.lock_jobs();
        if let Some(job) = jobs.running.get(&c.job_id)
            && (c.attempt == 0 || job.attempt == c.attempt)
        {
            tracing::info!(job = %c.job_id, attempt = job.attempt, reason = %c.reason, grace_seconds = c.grace_seconds, "stopping");
            if c.grace_seconds > 0 {
                job.signal.stop_within(
                    StopReason::Cancelled,
                    Duration::from_secs(u64::from(c.grace_seconds)),
                );
            } else {
                job.signal.stop(StopReason::Cancelled);
            }
            return;
        }
        if c.attempt != 0 && jobs.seen.insert((c.job_id.clone(), c.attempt)) {
            // Stopped before its launch reached us: it will never start here.
            drop(jobs);
            self.report(JobStatusReport {
                job_id: c.job_id,
                phase: JobPhase::Cancelled.into(),
                message: format!("{} before it started", c.reason),
                attempt: c.attempt,
                ..Default::default()
            });
        }
    }

    /// Follows the assignment stream until it breaks or the agent stops.
    async fn follow(
        self: &Arc<Self>,
        stop: &CancellationToken,
        tasks: &mut JoinSet<()>,
    ) -> StreamEnd {
        let mut stream = match client(&self.link)
            .watch_assignments(WatchAssignmentsRequest {})
            .await
        {
            Ok(s) => s.into_inner(),
            Err(s) => {
                tracing::warn!(error = %s.message(), "cannot watch assignments");
                return if s.code() == Code::Unauthenticated {
                    StreamEnd::Unauthenticated
                } else {
                    StreamEnd::Unreachable
                };
            }
        };
        loop {
            let msg = tokio::select! {
                () = stop.cancelled() => return StreamEnd::Stopped,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
                msg = stream.message() => msg,
            };
            match msg {
                Ok(Some(a)) => match a.kind {
                    Some(Kind::Launch(l)) => self.launch(l, tasks),
                    Some(Kind::Cancel(c)) => self.cancel(c),
                    Some(Kind::Partition(p)) => self.partition(p),
                    Some(Kind::Resize(r)) => self.resize(r),
                    None => tracing::warn!("empty assignment ignored"),
                },
                Ok(None) => {
                    tracing::warn!("assignment stream closed by the control plane");
                    return StreamEnd::Broke;
                }
                Err(s) => {
                    tracing::warn!(error = %s.message(), "assignment stream broke");
                    return StreamEnd::Broke;
                }
            }
        }
    }
}

/// Delivers status reports in order, retrying each until the control plane acknowledges it,
/// so no exit is lost to a restart of the control plane.
async fn deliver_reports(link: Arc<Link>, mut rx: mpsc::UnboundedReceiver<JobStatusReport>) {
    while let Some(report) = rx.recv().await {
        let mut attempt = 0;
        loop {
            match client(&link).report_job_status(report.clone()).await {
                Ok(_) => break,
                Err(s) if transient(&s) => {
                    attempt += 1;
                    // Retried often: a report stuck behind a partition holds up every
                    // later one (a job's start included).
                    tokio::time::sleep(backoff(attempt).min(Duration::from_millis(300))).await;
                }
                Err(s) => {
                    tracing::warn!(job = %report.job_id, error = %s.message(), "status report rejected");
                    break;
                }
            }
        }
    }
}

/// Runs the agent until `shutdown` is cancelled; then stops its jobs, reports them, and
/// returns.
pub async fn run(
    cfg: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let link = Link::new(&cfg.server, &cfg.ca_cert_pem)?;
    let runtime = prepare_runtime(&cfg, backend.as_ref())?;
    std::fs::create_dir_all(cfg.data_dir.join("jobs"))?;
    let creds = identity::load(&cfg.data_dir, &cfg.node_name)?;
    match &creds {
        Some(c) => link.present(c)?,
        None if cfg.bootstrap_token.is_none() => {
            return Err(AgentError::NoCredentials(cfg.data_dir.join("identity")));
        }
        None => {}
    }
    let (reports, rx) = mpsc::unbounded_channel();
    let reporter = tokio::spawn(deliver_reports(link.clone(), rx));
    let backend_driver = backend.driver_version();
    let agent = Arc::new(Agent {
        cfg,
        backend,
        link,
        creds: Mutex::new(creds),
        jobs: Mutex::new(Jobs::default()),
        reports,
        lease: Mutex::new(Lease::default()),
        drained: Mutex::new(HashSet::new()),
        degraded: Mutex::new(HashSet::new()),
        metrics: metrics::AgentMetrics::new(),
        runtime,
        cuda_checkpoint: match cuda_checkpoint::detect(backend_driver.as_deref()) {
            Ok(tool) => {
                tracing::info!(tool = %tool.display(), "transparent CUDA checkpointing available");
                Some(tool)
            }
            Err(why) => {
                tracing::info!(%why, "no transparent CUDA checkpointing; jobs checkpoint themselves");
                None
            }
        },
    });
    if let Some(addr) = agent.cfg.metrics_listen {
        let a = agent.clone();
        let bound = metrics::serve(
            addr,
            Arc::new(move || a.metrics.render(a.metrics_snapshot())),
            shutdown.clone(),
        )?;
        tracing::info!(%bound, "agent metrics at /metrics");
    }
    if let Some(mig) = agent.backend.mig() {
        let store = mig::LayoutStore::new(&agent.cfg.data_dir);
        let gpus = agent.backend.inventory()?;
        match mig::restore(mig, &store, &gpus) {
            Ok(failures) => {
                for (gpu, e) in failures {
                    tracing::warn!(%gpu, error = %e, "stored MIG layout not recreated");
                }
            }
            Err(e) => tracing::warn!(error = %e, "stored MIG layouts unreadable"),
        }
    }
    let killed = agent.runtime.remove_leftovers();
    if killed > 0 {
        tracing::warn!(
            killed,
            "removed jobs left running by an earlier run of this agent"
        );
    }
    tokio::spawn(agent.clone().fence(shutdown.clone()));
    tokio::spawn(agent.clone().watch_gpus(shutdown.clone()));
    tokio::spawn(agent.clone().police_sharing(shutdown.clone()));
    let mut tasks = JoinSet::new();
    // Set when the control plane refuses this node for good: its jobs stop, and the agent
    // exits with the reason.
    let mut refused = None;
    'register: while !shutdown.is_cancelled() {
        let every = match agent.register(&shutdown).await {
            Ok(Some(every)) => every,
            Ok(None) => break,
            Err(e) => {
                refused = Some(e);
                break;
            }
        };
        // Heartbeats go on while the stream is re-opened: a broken stream is not a lost
        // lease, and registering again is only needed when the credentials are refused.
        let session = shutdown.child_token();
        tokio::spawn(agent.clone().heartbeats(every, session.clone()));
        let mut failures = 0;
        loop {
            failures = match agent.follow(&shutdown, &mut tasks).await {
                StreamEnd::Stopped => break 'register,
                StreamEnd::Unauthenticated => break,
                StreamEnd::Broke => 1,
                StreamEnd::Unreachable => failures + 1,
            };
            // Heartbeats may already say the node is back: re-open the stream promptly.
            let wait = backoff(failures).min(Duration::from_secs(1));
            tokio::select! {
                () = shutdown.cancelled() => break 'register,
                () = tokio::time::sleep(wait) => {}
            }
        }
        session.cancel();
    }
    for job in agent.lock_jobs().running.values() {
        job.signal.stop(StopReason::AgentShutdown);
    }
    while tasks.join_next().await.is_some() {}
    // Give the final reports a moment to land; the control plane may be going away too.
    drop(agent);
    if tokio::time::timeout(Duration::from_secs(3), reporter)
        .await
        .is_err()
    {
        tracing::warn!("some job status reports were not delivered before shutdown");
    }
    refused.map_or(Ok(()), Err)
}

/// The data dir's mode: 0700, or 0711 when containers run here (their user namespaces must
/// pass through it to their images' root file systems; nothing in it can be listed, and
/// every directory holding a secret is 0700).
fn secure_data_dir(dir: &std::path::Path, containers: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let mode = if containers { 0o711 } else { 0o700 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    for sub in ["identity", "jobs", "logs"] {
        let p = dir.join(sub);
        std::fs::create_dir_all(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The runtime the configuration asks for, with the data dir secured for it. For
/// containers on simulated GPUs, the simulated CDI spec is written first.
fn prepare_runtime(
    cfg: &AgentConfig,
    backend: &dyn GpuBackend,
) -> Result<Arc<dyn JobRuntime>, AgentError> {
    match &cfg.runtime {
        RuntimeChoice::Process => {
            secure_data_dir(&cfg.data_dir, false)?;
            Ok(Arc::new(runtime::process::ProcessRuntime::new(
                &cfg.data_dir,
            )))
        }
        RuntimeChoice::Oci(oci) => {
            secure_data_dir(&cfg.data_dir, true)?;
            let mut oci = oci.clone();
            if backend.kind() == "simulated" {
                let dir = simulated_cdi_dir(&cfg.data_dir);
                write_simulated_cdi(&cfg.data_dir, backend)?;
                oci.cdi_dirs.insert(0, dir);
            }
            let rt = runtime::oci::OciRuntime::new(&cfg.data_dir, &cfg.node_name, oci)
                .map_err(AgentError::Runtime)?;
            tracing::info!(
                runtime = %rt_name(&cfg.runtime),
                cgroups = rt.hierarchy().name(),
                "jobs run in OCI containers"
            );
            Ok(Arc::new(rt))
        }
    }
}

fn rt_name(r: &RuntimeChoice) -> String {
    match r {
        RuntimeChoice::Process => "process".into(),
        RuntimeChoice::Oci(c) => c.runtime.display().to_string(),
    }
}

fn simulated_cdi_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("sim-cdi")
}

/// The CDI spec of the simulated GPUs as they are now (MIG instances come and go).
fn write_simulated_cdi(
    data_dir: &std::path::Path,
    backend: &dyn GpuBackend,
) -> Result<(), AgentError> {
    let gpus = backend.inventory()?;
    let mut mig = std::collections::BTreeMap::new();
    if let Some(m) = backend.mig() {
        for g in &gpus {
            if let Some(instances) = m.mig_instances(g.index)? {
                mig.insert(g.index, instances);
            }
        }
    }
    cdi::write_simulated(
        &simulated_cdi_dir(data_dir),
        &data_dir.join("sim-dev"),
        &gpus,
        &mig,
    )
    .map_err(|e| AgentError::Runtime(format!("simulated GPUs' CDI spec: {e}")))?;
    Ok(())
}
