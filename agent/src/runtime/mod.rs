//! How a job's attempt runs on this node.
//!
//! A [`JobRuntime`] starts an attempt and knows how to reach every process of it: the `oci`
//! runtime ([`oci::OciRuntime`]) runs it as a confined OCI container through `runc`, the
//! `process` runtime ([`process::ProcessRuntime`]) as an unconfined process group (for
//! `allot dev` without root, and for hosts whose operator accepts that). What every runtime
//! shares lives here: the stop signal and its reasons, the supervision of an attempt from
//! start to end (grace, kill, how it ended), and the job's log, which the agent writes where
//! the job cannot reach ([`joblog`]).

pub mod cgroup;
pub mod joblog;
pub mod oci;
pub mod process;
pub mod secrets;
pub mod volumes;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

/// A future a runtime returns (the trait is used as an object).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which runtime a node runs its jobs with: reported in its inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeKind {
    /// Unconfined processes of the agent's own user.
    Process,
    /// OCI containers: own namespaces, cgroups, no capabilities, only the job's devices.
    Oci,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Process => "process",
            RuntimeKind::Oci => "oci",
        }
    }

    /// Whether a job here is confined (what a tenant policy may require).
    pub fn confined(self) -> bool {
        self == RuntimeKind::Oci
    }
}

/// Starts attempts and removes what an earlier run of the agent left.
pub trait JobRuntime: Send + Sync {
    fn kind(&self) -> RuntimeKind;
    /// Starts the attempt, its output going to `log` (a file the job cannot reach).
    fn start<'a>(
        &'a self,
        spec: &'a LaunchSpec,
        log: std::fs::File,
    ) -> BoxFuture<'a, Result<Box<dyn Attempt>, String>>;
    /// Kills and removes every attempt an earlier run of this agent left behind (its
    /// processes, containers and cgroups); returns how many.
    fn remove_leftovers(&self) -> usize;
    /// Sets up what its jobs share, once leftovers are removed (the `oci` runtime's job
    /// networks).
    fn prepare(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    /// The address jobs with networks of their own route through, once prepared (a host
    /// address while any of them runs).
    fn jobs_gateway(&self) -> Option<std::net::Ipv4Addr> {
        None
    }
    /// Once the agent's jobs have all ended: removes what the runtime keeps for them
    /// (a container runtime's parent cgroup and job networks).
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// How the agent recognises an attempt's processes (GPU memory attribution, samples).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracker {
    /// Every process in this process group (the process runtime).
    Group(u32),
    /// Every process in this cgroup, named by its path below the hierarchy's root.
    Cgroup(String),
}

/// What the runtime tells of an attempt once started.
#[derive(Debug, Clone)]
pub struct Started {
    /// The host pid of its first process.
    pub pid: u32,
    pub tracker: Tracker,
    /// The image's manifest digest the attempt runs (containers from an image).
    pub image_digest: Option<String>,
}

/// How an attempt ended, beyond its first process's exit status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ending {
    /// The kernel's OOM killer killed a process of it at its memory limit.
    pub out_of_memory: bool,
}

/// One running attempt.
pub trait Attempt: Send {
    fn started(&self) -> Started;
    /// Waits for its first process to exit.
    fn wait(&mut self) -> BoxFuture<'_, std::io::Result<ExitStatus>>;
    /// Signals every process of it.
    fn signal(&self, signal: Signal);
    /// Once its first process ended: kills whatever of it is left, tells how it ended, and
    /// removes its state.
    fn finish(self: Box<Self>) -> BoxFuture<'static, Ending>;
}

/// How much of the end of a job's log is sent back with its final status.
pub const LOG_TAIL_BYTES: u64 = 64 * 1024;

/// Why a job is being stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
    AgentShutdown,
    /// The agent could not renew its lease: kill at once, the attempt is being requeued.
    LeaseLost,
    /// The job's GPU faulted through no fault of the job (XID): kill at once, requeue.
    DeviceFault,
    /// The job's work on its GPU failed (an application XID): kill at once, it failed.
    ApplicationFault,
    /// The job holds more GPU memory than its limit by the driver's count: kill at once,
    /// it failed.
    OverLimit,
}

/// Tells a running job to stop, and why.
#[derive(Debug, Default)]
pub struct StopSignal {
    token: CancellationToken,
    reason: Mutex<Option<StopReason>>,
    /// What happened, for the report (e.g. which XID).
    note: Mutex<Option<String>>,
    /// The grace the stop asked for, instead of the agent's own.
    grace: Mutex<Option<Duration>>,
}

impl StopSignal {
    /// Resolves once a stop is asked for.
    pub async fn stopped(&self) {
        self.token.cancelled().await;
    }

    pub fn stop(&self, reason: StopReason) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        r.get_or_insert(reason);
        self.token.cancel();
    }

    /// Stops with a note saying what happened (the first stop's reason and note win).
    pub fn stop_with(&self, reason: StopReason, note: String) {
        {
            let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                self.note
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(note);
            }
        }
        self.stop(reason);
    }

    /// Stops with this long between the termination signal and the kill (a preemption's
    /// grace, for the job to checkpoint). The first stop's grace wins.
    pub fn stop_within(&self, reason: StopReason, grace: Duration) {
        {
            let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                self.grace
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(grace);
            }
        }
        self.stop(reason);
    }

    fn grace(&self) -> Option<Duration> {
        *self.grace.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note(&self) -> Option<String> {
        self.note.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A job's network (see [`allot_domain::JobNetwork`]). The `process` runtime has none of
/// its own to give: its jobs are on the node's network whatever they asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// A namespace of its own, routed through the node and held to its tenant's network
    /// policy ([`oci::network`]).
    #[default]
    Private,
    /// The node's own (only where its tenant's policy allows it).
    Host,
    /// Only a loopback interface of its own.
    None,
}

/// A GPU (or MIG instance) assigned to the job, as the node knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedGpu {
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// The index of the (parent) GPU.
    pub index: u32,
}

/// Credentials to pull an image from a private registry.
#[derive(Clone, PartialEq, Eq)]
pub struct PullCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for PullCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullCredentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub job_id: String,
    pub job_name: String,
    pub tenant: String,
    pub node_name: String,
    /// Program and arguments; empty runs the image's entrypoint and command.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Where it starts: a path inside its container, or on the node for a process.
    pub workdir: Option<String>,
    pub gpu_uuids: Vec<String>,
    /// The same GPUs, with what the node knows of them (their device nodes come from it).
    pub gpus: Vec<AssignedGpu>,
    /// Which run of the job this is.
    pub attempt: u32,
    /// The share of each GPU the job holds (1000: whole GPUs) and the GPU memory it asked
    /// for on each (0: not asked): what the GPU-sharing limits enforce.
    pub gpu_milli: u32,
    pub gpu_memory_bytes: u64,
    /// CPU (milli) and memory (bytes) it reserved: its cgroup's limits (0: none).
    pub cpu_milli: u32,
    pub memory_bytes: u64,
    /// The OCI image it runs (`REGISTRY/REPO:TAG` or `…@sha256:…`); none runs on the node's
    /// own file system (the process runtime only).
    pub image: Option<String>,
    pub pull_credentials: Option<PullCredentials>,
    pub network: Network,
    /// Its tenant's network policy as the control plane sent it with the launch (none from
    /// an older control plane: a confining node then runs no private or host job).
    pub network_policy: Option<allot_domain::NetworkPolicy>,
    /// For a replica of a gang: where the gang meets, for its network.
    pub gang: Option<oci::network::GangNetwork>,
    /// This node's address as it advertises itself to the control plane.
    pub node_address: String,
    /// Where the job writes checkpoints, if it does: a path in one of its volumes, as the
    /// job sees it.
    pub checkpoint_dir: Option<String>,
    /// Named volumes it mounts.
    pub volumes: Vec<volumes::VolumeSpec>,
    /// The tenant secrets it gets.
    pub secrets: Vec<secrets::SecretSpec>,
    /// Its tenant's host uid range (`allot_domain::Tenant::uid_slot`).
    pub uid_slot: Option<u32>,
    /// Descriptors the job inherits (its GPU-sharing limits region: limits, then usage).
    pub inherit_fds: Vec<i32>,
    /// The shim preloaded into it, when it runs on shares of GPUs.
    pub preload: Option<PathBuf>,
}

impl LaunchSpec {
    /// The variables every job gets, whatever runs it.
    fn allot_env(&self, job_dir: &str) -> Vec<(String, String)> {
        let gpus = self.gpu_uuids.join(",");
        vec![
            ("CUDA_VISIBLE_DEVICES".into(), gpus.clone()),
            ("ALLOT_JOB_ID".into(), self.job_id.clone()),
            ("ALLOT_JOB_NAME".into(), self.job_name.clone()),
            ("ALLOT_TENANT".into(), self.tenant.clone()),
            ("ALLOT_NODE".into(), self.node_name.clone()),
            ("ALLOT_GPU_UUIDS".into(), gpus),
            ("ALLOT_ATTEMPT".into(), self.attempt.to_string()),
            ("ALLOT_GPU_MILLI".into(), self.gpu_milli.to_string()),
            (
                "ALLOT_GPU_MEMORY_BYTES".into(),
                self.gpu_memory_bytes.to_string(),
            ),
            ("ALLOT_JOB_DIR".into(), job_dir.to_owned()),
        ]
    }
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed {
        exit_code: Option<i32>,
        message: String,
    },
    Cancelled {
        message: String,
    },
    /// Killed because the node lost its lease.
    Lost {
        message: String,
    },
    /// Killed because its GPU faulted (not the job's doing).
    DeviceFault {
        message: String,
    },
    /// Stopped because the agent is shutting down (not the job's doing).
    AgentShutdown {
        message: String,
    },
}

#[derive(Debug, Clone)]
pub struct Finished {
    pub outcome: Outcome,
    pub log_tail: String,
}

/// The message of an attempt the OOM killer ended.
pub fn out_of_memory_message(limit: u64) -> String {
    format!(
        "OutOfMemory: killed by the kernel at its memory limit of {} (--memory)",
        allot_domain::format_bytes(limit)
    )
}

/// Starts the attempt with `runtime`, calls `started` once it runs, and supervises it to
/// the end: a stop sends the termination signal to every process of it and, after the
/// grace, the kill; whatever is left when its first process ends goes with it.
pub async fn supervise(
    runtime: &dyn JobRuntime,
    spec: LaunchSpec,
    log_path: PathBuf,
    stop: &StopSignal,
    grace: Duration,
    started: impl FnOnce(Started),
) -> Finished {
    let failed = |message: String| Finished {
        outcome: Outcome::Failed {
            exit_code: None,
            message,
        },
        log_tail: String::new(),
    };
    let log = match joblog::create(&log_path) {
        Ok(f) => f,
        Err(e) => return failed(format!("cannot create the job's log: {e}")),
    };
    let mut attempt = tokio::select! {
        a = runtime.start(&spec, log) => match a {
            Ok(a) => a,
            Err(message) => {
                let mut f = failed(message);
                f.log_tail = joblog::tail(&log_path);
                return f;
            }
        },
        // Stopped while pulling its image or setting it up.
        () = stop.token.cancelled() => {
            return Finished { outcome: stopped_outcome(stop), log_tail: String::new() };
        }
    };
    started(attempt.started());
    let status = tokio::select! {
        status = attempt.wait() => status,
        () = stop.token.cancelled() => {
            // Losing the lease allows no grace (the attempt may start elsewhere any moment),
            // and neither does a faulted GPU.
            let grace = match stop.reason() {
                Some(StopReason::Cancelled | StopReason::AgentShutdown) | None => {
                    stop.grace().unwrap_or(grace)
                }
                Some(
                    StopReason::LeaseLost
                    | StopReason::DeviceFault
                    | StopReason::ApplicationFault
                    | StopReason::OverLimit,
                ) => Duration::ZERO,
            };
            if !grace.is_zero() {
                attempt.signal(Signal::SIGTERM);
            }
            match tokio::time::timeout(grace, attempt.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    attempt.signal(Signal::SIGKILL);
                    attempt.wait().await
                }
            }
        }
    };
    // Whatever the job left behind goes with it.
    let ending = attempt.finish().await;
    let log_tail = joblog::tail(&log_path);
    let outcome = match (stop.reason(), status) {
        (Some(_), _) => stopped_outcome(stop),
        (None, _) if ending.out_of_memory => Outcome::Failed {
            exit_code: None,
            message: out_of_memory_message(spec.memory_bytes),
        },
        (None, Ok(s)) if s.success() => Outcome::Succeeded,
        (None, Ok(s)) => exit_outcome(s),
        (None, Err(e)) => Outcome::Failed {
            exit_code: None,
            message: format!("lost track of the process: {e}"),
        },
    };
    Finished { outcome, log_tail }
}

/// How an attempt stopped from outside ended.
fn stopped_outcome(stop: &StopSignal) -> Outcome {
    match stop.reason() {
        Some(StopReason::Cancelled) | None => Outcome::Cancelled {
            message: "cancelled on request".into(),
        },
        Some(StopReason::AgentShutdown) => Outcome::AgentShutdown {
            message: "stopped because the node agent shut down".into(),
        },
        Some(StopReason::LeaseLost) => Outcome::Lost {
            message: "killed: the node could not renew its lease with the control plane".into(),
        },
        Some(StopReason::DeviceFault) => Outcome::DeviceFault {
            message: stop.note().unwrap_or_else(|| "its GPU faulted".into()),
        },
        Some(StopReason::ApplicationFault) => Outcome::Failed {
            exit_code: None,
            message: format!(
                "{}: the job's work on the GPU failed",
                stop.note().unwrap_or_else(|| "an application XID".into())
            ),
        },
        Some(StopReason::OverLimit) => Outcome::Failed {
            exit_code: None,
            message: stop
                .note()
                .unwrap_or_else(|| "killed: over its GPU memory limit".into()),
        },
    }
}

/// A first process's exit as the job's outcome. A container's init reports a signal `N`
/// as status `128 + N`, as shells do.
fn exit_outcome(s: ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(code), _) => Outcome::Failed {
            exit_code: Some(code),
            message: format!("exited with status {code}"),
        },
        (None, Some(sig)) => Outcome::Failed {
            exit_code: None,
            message: format!("killed by signal {sig}"),
        },
        (None, None) => Outcome::Failed {
            exit_code: None,
            message: "ended without an exit status".into(),
        },
    }
}

/// Whether `name` is safe as one path component and a container id: what the agent accepts
/// as a job id from its control plane before it names files after it.
pub fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests;
