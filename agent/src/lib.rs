//! The node agent: registers with the control plane over gRPC, heartbeats its inventory,
//! follows its assignment stream, runs each job through its runtime (a confined OCI
//! container, or an unconfined process where the operator chose that), and reports every
//! status change until the control plane has acknowledged it.

mod assignments;
pub mod cdi;
pub mod cuda_checkpoint;
mod faults;
mod fencing;
pub mod gpu;
mod heartbeat;
pub mod identity;
pub mod image;
pub mod job_samples;
pub(crate) mod logship;
mod metrics;
pub mod mig;
mod police;
mod registration;
pub mod runtime;
pub mod sharing;
mod stream;

use crate::assignments::deliver_reports;
use crate::fencing::Lease;
use crate::stream::{StreamEnd, backoff, client, transient};

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

/// How long an agent starting again spends shipping the logs its last run left, at most.
const LEFTOVER_LOGS_WITHIN: Duration = Duration::from_secs(15);

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The control plane's gRPC endpoints, e.g. `https://cp.example:7070`: one, or each
    /// replica's (the agent follows the leader among them).
    pub servers: Vec<String>,
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
    /// Where other nodes reach this one (an IP address or DNS name): where a gang whose
    /// first replica runs here meets. Empty: this machine's address on its route to the
    /// control plane.
    pub address: String,
    /// How much of the end of each attempt's log the node keeps beside its first MiB (the
    /// middle of a longer log is freed as it grows; see [`DEFAULT_JOB_LOG_TAIL`]).
    pub job_log_tail: u64,
    /// Below this much free space on the data dir's file system (logs, images, containers'
    /// roots), the node takes no new work and says so in its heartbeats; 0: no check.
    pub min_free_disk_bytes: u64,
}

/// Why a node with `free` bytes left on its data dir's file system takes no new work, if
/// it does not: under `min` (0: never).
pub fn low_on_disk(free: u64, min: u64, data_dir: &std::path::Path) -> Option<String> {
    (free < min).then(|| {
        format!(
            "low on disk: {} free on the file system of its data dir {}, under --min-free-disk {}",
            allot_domain::format_bytes(free),
            data_dir.display(),
            allot_domain::format_bytes(min)
        )
    })
}

/// How much of the end of each attempt's log a node keeps by default.
pub const DEFAULT_JOB_LOG_TAIL: u64 = logship::DEFAULT_KEEP_TAIL;

/// This machine's address on its route to `server` (a URL): the source address the kernel
/// picks to reach it (nothing is sent). Empty when that cannot be told.
pub fn route_address(server: &str) -> String {
    use std::net::{ToSocketAddrs, UdpSocket};
    let Ok(uri) = server.parse::<tonic::codegen::http::Uri>() else {
        return String::new();
    };
    let Some(host) = uri.host() else {
        return String::new();
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    let Some(target) = (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
    else {
        return String::new();
    };
    let local = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    UdpSocket::bind(local)
        .and_then(|s| {
            s.connect(target)?;
            s.local_addr()
        })
        .map(|a| a.ip().to_string())
        .unwrap_or_default()
}

/// The runtime an agent runs its jobs with (see [`runtime`]).
#[derive(Debug, Clone, Default)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per agent, made once at start: its size costs nothing"
)]
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
        Self {
            cpu_milli: cpus * 1000,
            memory_bytes: host_memory_bytes().unwrap_or(0),
        }
    }
}

/// This machine's memory: `MemTotal` of `/proc/meminfo`.
pub fn host_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
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
    /// Its log, and how much of it was shipped.
    log: logship::SharedCursor,
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

impl Jobs {
    /// No longer running here: `job_id`'s entry, if it is still of `attempt` (a later
    /// attempt's launch may have replaced it).
    fn stop_tracking(&mut self, job_id: &str, attempt: u32) {
        if self
            .running
            .get(job_id)
            .is_some_and(|j| j.attempt == attempt)
        {
            self.running.remove(job_id);
        }
    }
}

struct Agent {
    cfg: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    link: Arc<Link>,
    /// The node certificate presented now, once registered.
    creds: Mutex<Option<Credentials>>,
    jobs: Mutex<Jobs>,
    /// Status reports and log output, delivered in order.
    reports: mpsc::UnboundedSender<logship::Outbound>,
    /// Log output queued and not yet delivered.
    log_queued: Arc<logship::Queued>,
    lease: Mutex<Lease>,
    /// GPUs that had an XID needing a drain: unhealthy until the agent starts again (an
    /// operator resets the GPU meanwhile).
    drained: Mutex<HashSet<String>>,
    /// GPUs that had an informational XID (page retirement, a high single-bit ECC rate):
    /// degraded until the agent starts again.
    degraded: Mutex<HashSet<String>>,
    /// Why the node last said it takes no new work (empty: it takes work).
    unavailable: Mutex<String>,
    metrics: metrics::AgentMetrics,
    /// `cuda-checkpoint`, where the driver and the utility are both here.
    cuda_checkpoint: Option<PathBuf>,
    /// What runs its jobs.
    runtime: Arc<dyn JobRuntime>,
    /// Wakes the heartbeat loop early (a job's end was reported).
    heartbeat_now: Arc<tokio::sync::Notify>,
}

impl Agent {
    /// Writes the simulated GPUs' CDI spec again after their MIG layout changed, where
    /// containers take their devices from it.
    fn refresh_simulated_cdi(&self) {
        if self.runtime.kind() == runtime::RuntimeKind::Oci
            && self.backend.kind() == "simulated"
            && let Err(e) = write_simulated_cdi(&self.cfg.data_dir, self.backend.as_ref())
        {
            tracing::warn!(error = %e, "simulated GPUs' CDI spec not rewritten");
        }
    }

    fn lock_jobs(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs the agent until `shutdown` is cancelled; then stops its jobs, reports them, and
/// returns.
pub async fn run(
    cfg: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let link = Link::new(&cfg.servers, &cfg.ca_cert_pem)?;
    let runtime = prepare_runtime(&cfg, backend.as_ref())?;
    let creds = identity::load(&cfg.data_dir, &cfg.node_name)?;
    match &creds {
        Some(c) => link.present(c)?,
        None if cfg.bootstrap_token.is_none() => {
            return Err(AgentError::NoCredentials(cfg.data_dir.join("identity")));
        }
        None => {}
    }
    let (reports, rx) = mpsc::unbounded_channel();
    let heartbeat_now = Arc::new(tokio::sync::Notify::new());
    let log_queued = Arc::new(logship::Queued::default());
    let reporter = tokio::spawn(deliver_reports(
        link.clone(),
        rx,
        heartbeat_now.clone(),
        log_queued.clone(),
    ));
    let backend_driver = backend.driver_version();
    let agent = Arc::new(Agent {
        cfg,
        backend,
        link,
        creds: Mutex::new(creds),
        jobs: Mutex::new(Jobs::default()),
        reports,
        log_queued,
        lease: Mutex::new(Lease::default()),
        drained: Mutex::new(HashSet::new()),
        degraded: Mutex::new(HashSet::new()),
        unavailable: Mutex::new(String::new()),
        metrics: metrics::AgentMetrics::new(),
        runtime,
        heartbeat_now,
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
        agent.refresh_simulated_cdi();
    }
    let killed = agent.runtime.remove_leftovers();
    if killed > 0 {
        tracing::warn!(
            killed,
            "removed jobs left running by an earlier run of this agent"
        );
    }
    // What the killed attempts wrote, shipped while the control plane still counts them as
    // this node's (registering tells it they are gone).
    let registered_before = agent
        .creds
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some();
    if registered_before {
        agent.ship_leftover_logs(LEFTOVER_LOGS_WITHIN).await;
    }
    agent.runtime.prepare().await.map_err(AgentError::Runtime)?;
    tokio::spawn(agent.clone().fence(shutdown.clone()));
    tokio::spawn(agent.clone().watch_gpus(shutdown.clone()));
    tokio::spawn(agent.clone().police_sharing(shutdown.clone()));
    tokio::spawn(agent.clone().ship_logs(shutdown.clone()));
    let mut tasks = JoinSet::new();
    // Set when the control plane refuses this node for good: its jobs stop, and the agent
    // exits with the reason.
    let mut refused = None;
    'register: while !shutdown.is_cancelled() {
        match agent.register(&shutdown).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                refused = Some(e);
                break;
            }
        };
        // Heartbeats go on while the stream is re-opened: a broken stream is not a lost
        // lease, and registering again is only needed when the credentials are refused.
        let session = shutdown.child_token();
        tokio::spawn(agent.clone().heartbeats(session.clone()));
        let mut failures = 0;
        loop {
            failures = match agent.follow(&shutdown, &mut tasks).await {
                StreamEnd::Stopped => break 'register,
                StreamEnd::Unauthenticated => break,
                StreamEnd::Broke => 1,
                StreamEnd::Unreachable => failures + 1,
            };
            // Heartbeats may already say the node is back: re-open the stream promptly.
            let wait = agent
                .link
                .jitter(backoff(failures).min(Duration::from_secs(1)));
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
    agent.runtime.shut_down().await;
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

impl Agent {
    /// Where other nodes reach this one: `--advertise-address`, else this machine's address
    /// on its route to the control plane. A loopback address (every node on one machine,
    /// as in `allot dev`) is unreachable from a job's own network: there the gateway of
    /// this agent's job networks is, a host address the other agents' jobs reach too.
    pub(crate) fn advertised_address(&self) -> String {
        if !self.cfg.address.is_empty() {
            return self.cfg.address.clone();
        }
        let routed = crate::route_address(self.link.server());
        let loopback = routed
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
        match self.runtime.jobs_gateway() {
            Some(gateway) if loopback || routed.is_empty() => gateway.to_string(),
            _ => routed,
        }
    }
}

/// The data dir, the agent's alone: 0700, or 0711 when containers run here (their user
/// namespaces must pass through it to their images' root file systems; nothing in it can be
/// listed), every directory in it 0700 and every file 0600, checked and tightened at each
/// start (saying what). Kept by others: the image cache (`images/`, whose roots containers
/// pass through), the container runtime's state (`oci/`), the simulated GPUs' device nodes
/// (`sim-dev/`) and what jobs write in their working directories (`jobs/<id>/`).
fn secure_data_dir(dir: &std::path::Path, containers: bool) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mode = if containers { 0o711 } else { 0o700 };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    for sub in ["identity", "jobs", "logs"] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join(sub))?;
    }
    let jobs = dir.join("jobs");
    let descend = |p: &std::path::Path| {
        if p.parent() == Some(jobs.as_path()) {
            allot_pki::Descend::Itself
        } else if p.parent() == Some(dir)
            && ["images", "oci", "sim-dev"].iter().any(|n| p.ends_with(n))
        {
            allot_pki::Descend::Leave
        } else {
            allot_pki::Descend::All
        }
    };
    for t in allot_pki::make_private(dir, mode, &descend)? {
        tracing::warn!(fixed = %t, "the agent's data dir held a file or directory others could read");
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
