//! Jobs, what they ask for, and the state machine they move through.
//!
//! ```text
//! Pending ──► Scheduled ──► Running ──► Succeeded
//!    │  ▲         │            ├──────► Failed
//!    │  │         ├──► Failed  ├──────► Cancelled
//!    │  │         │            └──────► TimedOut (stopped at its time limit)
//!    └──┼─────────┴──► Cancelled
//!       └── Scheduled, Running: preempted by reclaim, stopped, requeued (next attempt)
//! ```
//! Every transition is persisted with its time; terminal states never change again.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{ValidationError, Violations};
use crate::isolation::{Isolation, PRIORITY_RANGE, WorkloadClass};
use crate::quantity::MAX_BYTES;
use crate::tenant::{MAX_CPU_MILLI, TenantName};

/// Most GPUs a single job may ask for.
pub const MAX_JOB_GPUS: u32 = 1024;
/// Most bytes of command line (program and arguments together).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Most environment variables a job may set.
pub const MAX_ENV_VARS: usize = 256;
/// Most retries a job may ask for.
pub const MAX_RETRIES: u32 = 100;
/// Most GPU models a job may list as acceptable.
pub const MAX_GPU_MODELS: usize = 16;
/// A whole GPU, in milli.
pub const GPU_MILLI: u32 = 1000;
/// Most replicas a multi-node job (a gang) may have.
pub const MAX_REPLICAS: u32 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Scheduled,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// Stopped when its time limit was reached (Slurm's TIMEOUT).
    TimedOut,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Scheduled,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Scheduled => "scheduled",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::TimedOut => "timed_out",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::TimedOut
        )
    }

    /// Whether `name` (an API state, e.g. `"timed_out"`) is a state a job ends in: for
    /// clients holding the wire form.
    pub fn ends_in(name: &str) -> bool {
        name.parse::<JobState>().is_ok_and(JobState::is_terminal)
    }

    /// Whether the job holds resources on a node in this state.
    pub fn holds_resources(self) -> bool {
        matches!(self, JobState::Scheduled | JobState::Running)
    }

    /// The legal transitions of the job state machine.
    pub fn can_become(self, next: JobState) -> bool {
        use JobState::*;
        matches!(
            (self, next),
            (Pending, Scheduled)
                | (Pending, Cancelled)
                | (Scheduled, Running)
                | (Scheduled, Pending)
                | (Running, Pending)
                | (Scheduled, Failed)
                | (Scheduled, Cancelled)
                | (Running, Succeeded)
                | (Running, Failed)
                | (Running, Cancelled)
                | (Running, TimedOut)
        )
    }

    /// Checks a transition, naming both ends when it is illegal.
    pub fn transition(self, next: JobState) -> Result<JobState, TransitionError> {
        if self.can_become(next) {
            Ok(next)
        } else {
            Err(TransitionError {
                from: self,
                to: next,
            })
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!("unknown state `{s}` (one of pending, scheduled, running, succeeded, failed, cancelled, timed_out)")
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a job cannot go from {from} to {to}")]
pub struct TransitionError {
    pub from: JobState,
    pub to: JobState,
}

/// The longest time limit a job may ask for: 366 days.
pub const MAX_TIME_LIMIT_SECS: u64 = 366 * 86_400;

/// What a tenant asks to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobSpec {
    pub tenant: TenantName,
    pub name: String,
    /// CPU the job reserves on its node, in milli (1000 is one CPU); 0 reserves none.
    pub cpu_milli: u32,
    /// Memory the job reserves on its node; 0 reserves none.
    pub memory_bytes: u64,
    /// GPUs, 0 for a CPU-only job.
    pub gpus: u32,
    /// The share of each GPU, in milli: 1000 (the default) is a whole GPU; less asks for a
    /// fraction of one GPU that other jobs share.
    pub gpu_milli: Option<u32>,
    /// GPU memory the job needs on each GPU: the least a whole GPU must have, or what the
    /// job holds of a shared one.
    pub gpu_memory_bytes: Option<u64>,
    /// GPU models the job accepts (e.g. `H200`, `A100-80GB`); empty accepts any.
    pub gpu_models: Vec<String>,
    /// Higher runs first and is preempted last; see [`crate::PRIORITY_CLASSES`].
    pub priority: i32,
    /// Whether reclaim may stop the job (and requeue it) while it runs on borrowed capacity.
    pub preemptible: bool,
    /// The isolation asked for; the workload class's default when absent, and never below
    /// the tenant's minimum.
    pub isolation: Option<Isolation>,
    pub class: Option<WorkloadClass>,
    /// How often an attempt that fails on its own (a non-zero exit, an application XID) is
    /// retried, after 1 s doubling to at most 5 min. Lost nodes, device faults and preemptions
    /// requeue without counting.
    pub max_retries: u32,
    /// Program and arguments, executed directly (no shell unless the job names one).
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Working directory on the node; the job's own directory when absent.
    pub workdir: Option<String>,
    /// Where the job writes checkpoints: a path in one of its `volumes` (shared storage
    /// every node sees), never a host path. A requeued or retried attempt is told the newest
    /// entry there in `ALLOT_RESTORE_FROM`.
    pub checkpoint_dir: Option<String>,
    /// Named volumes the job mounts (see [`crate::volume`]).
    pub volumes: Vec<crate::VolumeMount>,
    /// Tenant secrets the job gets as variables or files (see [`crate::secret`]).
    pub secrets: Vec<crate::SecretUse>,
    /// A MIG instance of this profile (e.g. `1g.18gb`, by its name on the board) instead of
    /// GPUs or GPU shares: the job runs on one instance, alone.
    pub mig_profile: Option<String>,
    /// How the job's share of a shared GPU is held: strict (the default) or elastic.
    pub gpu_compute: Option<crate::GpuCompute>,
    /// Whether its share of a shared GPU may be resized while it runs.
    pub gpu_resizable: bool,
    /// Whether Allot sizes its share and GPU memory limit from what it uses.
    pub gpu_sizing: GpuSizing,
    /// The OCI image it runs (`REGISTRY/REPOSITORY[:TAG][@sha256:…]`): what nodes that
    /// confine jobs run; none runs on a node's own file system (nodes running jobs as
    /// processes only).
    pub image: Option<String>,
    /// Its network: its own (the default), the node's (where its tenant's policy allows)
    /// or none.
    pub network: JobNetwork,
    /// The longest an attempt may run, in seconds (Slurm's `--time`): an attempt still
    /// running then is stopped, and the job ends timed out saying so. None: no limit (and
    /// no estimate of when the jobs behind it start).
    pub time_limit_secs: Option<u64>,
    /// Replicas of a multi-node job (a gang, see [`crate::gang`]): each asks for all of the
    /// above on a node of its own choosing; all are placed at once or none, and they are
    /// requeued, retried, preempted and cancelled together. 1: a job on one node.
    pub replicas: u32,
    /// For a gang: keep every replica on nodes sharing one value of this node label.
    pub pack: Option<Pack>,
    /// Submitted as an array: one job per task index, at most so many running at once.
    pub array: Option<crate::workflow::ArraySpec>,
    /// Jobs this one waits for (`--after-ok` …): it is placed only once each has ended as
    /// asked, and ends if one never can.
    pub dependencies: Vec<crate::workflow::Dependency>,
}

impl JobSpec {
    /// Whether it runs best-effort: on what other jobs leave of its GPU, giving way to them.
    pub fn is_best_effort(&self) -> bool {
        self.gpu_compute == Some(crate::GpuCompute::BestEffort)
    }
}

/// The smallest share Allot sizes a job to, and the least a sized job's ceiling or a
/// tenant's starting share may be: below it a share's memory may not hold a CUDA context,
/// and the job could never be measured using more.
pub const MIN_SIZED_GPU_MILLI: u32 = 20;

/// What Allot sizes of a job's share of its GPU from what the job uses (`--gpus auto`,
/// `--gpu-memory auto`; the rules are `allot_sizing`'s). A sized job is resizable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSizing {
    /// Its compute share is sized, up to this many thousandths of the GPU (`auto:MAX`;
    /// 1000 when no ceiling was given). None: the share it asked for stays.
    pub max_milli: Option<u32>,
    /// Its GPU memory limit is sized (never below what it was seen to hold).
    pub memory: bool,
}

impl GpuSizing {
    pub fn is_sized(self) -> bool {
        self.max_milli.is_some() || self.memory
    }

    /// The share a job sized up to `max` starts at, its tenant's default being `default`
    /// ([`crate::EffectiveJobLimits::default_gpu_milli`]): that, or its ceiling when lower.
    pub fn start_milli(default: u64, max: u32) -> u32 {
        u32::try_from(default)
            .unwrap_or(GPU_MILLI)
            .clamp(1, GPU_MILLI)
            .min(max)
    }
}

/// A gang packed within one value of a node label (`rack`, `spine`): as a requirement (it
/// waits until one value has room for every replica), or as a preference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pack {
    pub label: String,
    pub required: bool,
}

/// A job that is one replica of a gang: the gang's id (its first replica's job id) and
/// which replica it is (0 is the gang's own record, what its submitter sees).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replica {
    pub gang_id: String,
    pub rank: u32,
}

/// A job's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobNetwork {
    /// A network namespace of its own (the default on nodes that confine jobs): its own
    /// loopback, and one interface routed through the node, whose connections leave the
    /// node NATed to where its tenant's network policy allows ([`crate::network`]); nothing
    /// reaches it but its gang's rendezvous. Nodes running jobs as processes have no such
    /// thing: there a job is the agent's user on the node's network whatever it asked for.
    #[default]
    Private,
    /// The node's own network namespace: every address, service and listener of the node
    /// (only where its tenant's policy allows it).
    Host,
    /// A network namespace of its own with no interfaces but loopback.
    None,
}

impl JobNetwork {
    pub fn as_str(self) -> &'static str {
        match self {
            JobNetwork::Private => "private",
            JobNetwork::Host => "host",
            JobNetwork::None => "none",
        }
    }
}

impl std::str::FromStr for JobNetwork {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "private" => Ok(JobNetwork::Private),
            "host" => Ok(JobNetwork::Host),
            "none" => Ok(JobNetwork::None),
            other => Err(format!("unknown network `{other}` (private, host or none)")),
        }
    }
}

/// Unicode's explicit text-direction controls (embeddings, overrides, isolates and marks),
/// which make a name display as something other than what it is.
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether a name or line someone gives (a job's or token's name, a drain's reason) holds
/// anything that would act on a terminal or display as other than it is: control or
/// text-direction characters.
pub fn has_unsafe_chars(s: &str) -> bool {
    s.chars().any(|c| c.is_control() || is_bidi_control(c))
}

impl JobSpec {
    /// Checks every rule and reports all broken ones at once.
    /// Its time limit as a length of time.
    pub fn time_limit(&self) -> Option<chrono::Duration> {
        self.time_limit_secs
            .and_then(|s| i64::try_from(s).ok())
            .map(chrono::Duration::seconds)
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        let mut v = Violations::default();
        if let Some(limit) = self.time_limit_secs {
            v.check(
                (1..=MAX_TIME_LIMIT_SECS).contains(&limit),
                "time_limit_secs",
                "must be from 1 second to 366 days",
            );
        }
        v.check(
            (1..=MAX_REPLICAS).contains(&self.replicas),
            "replicas",
            format!("must be from 1 to {MAX_REPLICAS}"),
        );
        if let Some(p) = &self.pack {
            v.check(
                self.replicas > 1,
                "pack",
                "applies to a multi-node job: set replicas above 1",
            );
            if let Err(why) = crate::node::check_label_name(&p.label) {
                v.push("pack.label", why);
            }
        }
        if self.replicas > 1 {
            v.check(
                self.mig_profile.is_none(),
                "replicas",
                "a MIG job runs on one instance: a gang asks for GPUs or shares of them",
            );
            v.check(
                !self.gpu_resizable,
                "gpu_resizable",
                "a gang's replicas hold one share each: resizing applies to a job of one replica",
            );
        }
        if let Some(a) = &self.array {
            v.check(
                self.replicas == 1,
                "array",
                "an array's tasks run on one node each: not with replicas",
            );
            if let Err(why) = a.tasks() {
                v.push("array", why);
            }
        }
        v.check(
            self.dependencies.len() <= crate::workflow::MAX_DEPENDENCIES,
            "dependencies",
            format!("at most {} dependencies", crate::workflow::MAX_DEPENDENCIES),
        );
        v.check(!self.name.trim().is_empty(), "name", "must not be empty");
        v.check(
            self.name.len() <= 128,
            "name",
            "must be at most 128 characters",
        );
        v.check(
            !has_unsafe_chars(&self.name),
            "name",
            "must not contain control or text-direction characters",
        );
        v.check(
            self.gpus <= MAX_JOB_GPUS,
            "gpus",
            format!("must be at most {MAX_JOB_GPUS}"),
        );
        v.check(
            u64::from(self.cpu_milli) <= MAX_CPU_MILLI,
            "cpu_milli",
            "must be at most 100000 CPUs",
        );
        v.check(
            self.memory_bytes <= MAX_BYTES,
            "memory_bytes",
            "must be at most 1 PiB",
        );
        if let Some(share) = self.gpu_milli {
            v.check(
                (1..=GPU_MILLI).contains(&share),
                "gpu_milli",
                format!("must be from 1 to {GPU_MILLI} (a whole GPU)"),
            );
            v.check(
                self.gpus > 0,
                "gpu_milli",
                "only applies to jobs that request GPUs",
            );
            v.check(
                share >= GPU_MILLI || self.gpus <= 1,
                "gpu_milli",
                "a fraction of a GPU is asked of one GPU: set gpus to 1, or ask for whole GPUs",
            );
        }
        v.check(
            self.gpu_models.len() <= MAX_GPU_MODELS,
            "gpu_models",
            format!("must list at most {MAX_GPU_MODELS} models"),
        );
        for (i, m) in self.gpu_models.iter().enumerate() {
            v.check(
                !m.trim().is_empty() && m.len() <= 64 && !m.chars().any(char::is_control),
                format!("gpu_models[{i}]"),
                "must be 1 to 64 characters without control characters",
            );
        }
        v.check(
            self.gpu_models.is_empty() || self.gpus > 0,
            "gpu_models",
            "only applies to jobs that request GPUs",
        );
        v.check(
            self.max_retries <= MAX_RETRIES,
            "max_retries",
            format!("must be at most {MAX_RETRIES}"),
        );
        v.check(
            PRIORITY_RANGE.contains(&self.priority),
            "priority",
            format!(
                "must be from {} to {}",
                PRIORITY_RANGE.start(),
                PRIORITY_RANGE.end()
            ),
        );
        if let Some(p) = &self.mig_profile {
            v.check(
                crate::mig::profile_named(p).is_some(),
                "mig_profile",
                format!(
                    "unknown MIG profile `{p}` (one of {})",
                    crate::mig::profile_names().join(", ")
                ),
            );
            v.check(
                self.gpus <= 1,
                "mig_profile",
                "a MIG job runs on one instance: set gpus to 1 (or leave it out)",
            );
            v.check(
                self.gpu_milli.is_none() && self.gpu_memory_bytes.is_none(),
                "mig_profile",
                "the profile sets the job's share and memory: leave out gpu_milli and gpu_memory_bytes",
            );
            v.check(
                self.isolation.is_none_or(|i| i == Isolation::Mig),
                "isolation",
                "a MIG job runs at mig isolation",
            );
        }
        if self.gpu_resizable {
            v.check(
                self.gpu_milli.is_some_and(|m| m < 1000) && self.mig_profile.is_none(),
                "gpu_resizable",
                "applies to a share of a GPU: set gpu_milli below 1000",
            );
        }
        if let Some(max) = self.gpu_sizing.max_milli {
            v.check(
                (MIN_SIZED_GPU_MILLI..=GPU_MILLI).contains(&max),
                "gpu_sizing.max_milli",
                format!(
                    "must be from {MIN_SIZED_GPU_MILLI} to {GPU_MILLI} (a fiftieth of a GPU, the \
                     smallest share Allot sizes a job to, to a whole GPU)"
                ),
            );
        }
        if self.gpu_sizing.is_sized() {
            v.check(
                self.gpus == 1
                    && self.replicas == 1
                    && self.mig_profile.is_none()
                    && self.gpu_milli.is_some_and(|m| m < GPU_MILLI),
                "gpu_sizing",
                "sizes a share of one GPU: ask for `gpus auto` (or a share below 1 with \
                 `gpu-memory auto`), not whole GPUs, a MIG instance or a gang",
            );
            v.check(
                self.gpu_resizable,
                "gpu_resizable",
                "a sized job is resizable: set gpu_resizable",
            );
            v.check(
                self.isolation.is_none_or(|i| i == Isolation::Shared),
                "isolation",
                "a sized job is a share of a GPU: shared isolation (dedicated and mig hold \
                 whole GPUs or instances)",
            );
            if let (Some(max), Some(start)) = (self.gpu_sizing.max_milli, self.gpu_milli) {
                v.check(
                    start <= max,
                    "gpu_milli",
                    format!("a sized job starts at or below its ceiling ({max} thousandths)"),
                );
            }
        }
        if self.gpu_compute.is_some() {
            v.check(
                self.gpu_milli.is_some_and(|m| m < 1000) && self.mig_profile.is_none(),
                "gpu_compute",
                "applies to a share of a GPU: set gpu_milli below 1000",
            );
        }
        if self.gpu_compute == Some(crate::GpuCompute::BestEffort) {
            v.check(
                self.gpu_milli == Some(crate::BEST_EFFORT_MILLI),
                "gpu_milli",
                format!(
                    "a best-effort job holds no share of its own ({} thousandth, the least \
                     there is): leave gpu_milli out",
                    crate::BEST_EFFORT_MILLI
                ),
            );
            v.check(
                self.gpus == 1 && self.replicas == 1,
                "gpus",
                "a best-effort job runs on one GPU, alone (not a gang)",
            );
            v.check(
                self.gpu_memory_bytes.is_some(),
                "gpu_memory_bytes",
                "a best-effort job holds the GPU memory it names: set gpu_memory_bytes",
            );
            v.check(
                !self.gpu_sizing.is_sized() && !self.gpu_resizable,
                "gpu_sizing",
                "a best-effort job has no share to size or resize",
            );
            v.check(
                self.preemptible,
                "preemptible",
                "a best-effort job gives its place up to others: it must be preemptible",
            );
            v.check(
                self.isolation.is_none_or(|i| i == Isolation::Shared),
                "isolation",
                "a best-effort job shares its GPU: shared isolation",
            );
        }
        if let Some(m) = self.gpu_memory_bytes {
            v.check(m > 0, "gpu_memory_bytes", "must be positive");
            v.check(m <= MAX_BYTES, "gpu_memory_bytes", "must be at most 1 PiB");
            v.check(
                self.gpus > 0,
                "gpu_memory_bytes",
                "only applies to jobs that request GPUs",
            );
        }
        if let Some(image) = &self.image
            && let Err(why) = crate::image::ImageRef::parse(image)
        {
            v.push("image", why);
        }
        if self.command.is_empty() {
            if self.image.is_none() {
                v.push(
                    "command",
                    "must name a program to run (or the job an image)",
                );
            }
        } else if self.command[0].is_empty() {
            v.push("command[0]", "the program must not be empty");
        }
        for (i, arg) in self.command.iter().enumerate() {
            v.check(
                !arg.contains('\0'),
                format!("command[{i}]"),
                "must not contain NUL bytes",
            );
        }
        let total: usize = self.command.iter().map(String::len).sum();
        v.check(
            total <= MAX_COMMAND_BYTES,
            "command",
            format!("must be at most {MAX_COMMAND_BYTES} bytes in total"),
        );
        v.check(
            self.env.len() <= MAX_ENV_VARS,
            "env",
            format!("must have at most {MAX_ENV_VARS} variables"),
        );
        for (key, value) in &self.env {
            let field = format!("env.{key}");
            v.check(
                crate::secret::is_env_name(key),
                field.clone(),
                "names letters, digits and `_`, not starting with a digit",
            );
            v.check(
                !crate::secret::is_reserved_env(key),
                field.clone(),
                "is set by Allot and cannot be overridden",
            );
            v.check(!value.contains('\0'), field, "must not contain NUL bytes");
        }
        crate::secret::check_uses(&self.secrets, &self.env, &mut v);
        if let Err(e) = crate::volume::check_mounts(&self.volumes, self.checkpoint_dir.as_deref()) {
            for f in e.0 {
                v.push(f.field, f.reason);
            }
        }
        {
            let field = "workdir";
            if let Some(dir) = &self.workdir {
                v.check(dir.starts_with('/'), field, "must be an absolute path");
                v.check(!dir.contains('\0'), field, "must not contain NUL bytes");
                v.check(
                    !std::path::Path::new(dir)
                        .components()
                        .any(|c| c == std::path::Component::ParentDir),
                    field,
                    "must not contain `..`",
                );
                v.check(
                    !crate::volume::in_runtime_dir(dir),
                    field,
                    format!(
                        "must not be or lie in {}, the runtime's own directory",
                        crate::volume::RUNTIME_DIR
                    ),
                );
            }
        }
        v.into_result()
    }
}

/// Why a job is still pending: a stable code for programs and a sentence with numbers for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingReason {
    pub code: String,
    pub message: String,
}

/// A job as stored: its spec plus where it is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Job {
    pub id: String,
    pub tenant_id: String,
    pub spec: JobSpec,
    pub state: JobState,
    pub pending_reason: Option<PendingReason>,
    pub node_id: Option<String>,
    pub gpu_uuids: Vec<String>,
    /// The share of each GPU the placement holds (a dedicated job holds whole GPUs).
    pub held_gpu_milli: Option<u32>,
    /// Placed (partly) on capacity above its tenant's guarantee, which reclaim may take back.
    pub borrowing: bool,
    /// Which run of the job this is: 1, plus one each time it is preempted and requeued.
    pub attempt: u32,
    pub cancel_requested: bool,
    /// Why reclaim is stopping the job; it is requeued once its node reports it stopped.
    pub preempt_reason: Option<String>,
    /// Attempts that failed on their own so far (see [`JobSpec::max_retries`]).
    pub failures: u32,
    /// A job retrying after a failure waits until then.
    pub retry_at: Option<DateTime<Utc>>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    /// Why the job ended the way it did (a signal, a launch failure, a lost node).
    pub message: Option<String>,
    pub log_tail: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub scheduled_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The W3C trace context of the request that submitted it, when that was traced.
    pub traceparent: Option<String>,
    /// Where its next attempts must not run for a while after a fault there.
    pub avoid: Option<Avoid>,
    /// The manifest digest its image's tag resolved to at its first pull: every later
    /// attempt runs exactly that.
    pub image_digest: Option<String>,
    /// For a replica of a gang: which gang, which replica.
    pub replica: Option<Replica>,
    /// For a task of an array: which array, which index.
    pub array_task: Option<crate::workflow::ArrayTask>,
    /// Who submitted it: the person's or the token's name.
    pub submitted_by: Option<String>,
}

/// Anti-affinity after a fault: a job requeued for a device fault avoids the GPUs it held,
/// one requeued because its node was lost avoids the node, until `until`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Avoid {
    pub node_id: Option<String>,
    pub gpu_uuids: Vec<String>,
    pub until: DateTime<Utc>,
}

/// How long a requeued job avoids where it faulted.
pub const AVOID_FOR_SECS: i64 = 600;

/// How long a job moved off a GPU (by its forecast) avoids it: its next placement only.
pub const MOVE_AVOID_SECS: i64 = 60;

/// How many characters a job id's short form has: the last group of its UUID, 48 random
/// bits (the leading digits of time-ordered ids are shared by every job of the same
/// moment), as Docker shows 12 hex digits of an id.
pub const SHORT_ID_LEN: usize = 12;

/// A job id's short form, what lists show and what people type: its last
/// [`SHORT_ID_LEN`] characters (an id shorter than that, whole).
pub fn short_id(id: &str) -> &str {
    id.get(id.len().saturating_sub(SHORT_ID_LEN)..)
        .unwrap_or(id)
}

/// Whether `key` has the form of a short id: [`SHORT_ID_LEN`] hex digits.
pub fn is_short_id(key: &str) -> bool {
    key.len() == SHORT_ID_LEN && key.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Job {
    /// The image its next attempt runs: pinned to its digest once one is known.
    pub fn image_to_run(&self) -> Option<String> {
        self.spec
            .image
            .as_deref()
            .map(|i| crate::image::pinned(i, self.image_digest.as_deref()))
    }

    /// What it holds (once placed) or asks for of each of its GPUs: the placement's share,
    /// else the requested one, else a whole GPU; and the GPU memory asked for on each (0:
    /// not asked).
    pub fn share(&self) -> Share {
        Share {
            gpu_milli: self
                .held_gpu_milli
                .or(self.spec.gpu_milli)
                .unwrap_or(GPU_MILLI),
            gpu_memory_bytes: self.spec.gpu_memory_bytes.unwrap_or(0),
        }
    }

    /// The GPUs it holds (or asks for), a share counting as its fraction of each GPU.
    pub fn gpu_equivalents(&self) -> f64 {
        f64::from(self.spec.gpus) * f64::from(self.share().gpu_milli) / f64::from(GPU_MILLI)
    }
}

/// What a job's elapsed time measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elapsed {
    /// Running, since its attempt started.
    Running,
    /// Ended, from its start to its end.
    Ran,
    /// Ended without running, from its submission to its end.
    EndedUnstarted,
    /// Waiting, since its submission or its last requeue.
    Waiting,
    /// Otherwise (scheduled, say), since its last change.
    InState,
}

/// How long a job has been in its phase, and which phase that is: what `job get`, `job
/// list`'s TIME and the portal's job page say.
pub fn elapsed(
    state: JobState,
    attempt: u32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> (Elapsed, chrono::Duration) {
    match (state, started_at, finished_at) {
        (JobState::Running, Some(s), _) => (Elapsed::Running, now - s),
        (_, Some(s), Some(f)) if state.is_terminal() => (Elapsed::Ran, f - s),
        (_, _, Some(f)) if state.is_terminal() => (Elapsed::EndedUnstarted, f - created_at),
        (JobState::Pending, _, _) => {
            // A requeued attempt waits from its requeue.
            let since = if attempt > 1 { updated_at } else { created_at };
            (Elapsed::Waiting, now - since)
        }
        _ => (Elapsed::InState, now - updated_at),
    }
}

/// One persisted transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobEvent {
    pub from: Option<JobState>,
    pub to: JobState,
    pub at: DateTime<Utc>,
    pub message: Option<String>,
    /// The share the job holds from this event on, where it changed (placement, resize).
    pub share: Option<Share>,
}

/// What a job holds of each of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Share {
    pub gpu_milli: u32,
    /// GPU memory held on each (0: not asked).
    pub gpu_memory_bytes: u64,
}

impl Share {
    /// The memory it holds of a GPU of `gpu_memory_bytes`: what it asked for, else its
    /// share of the GPU's memory.
    pub fn memory_on(self, gpu_memory_bytes: u64) -> u64 {
        if self.gpu_memory_bytes > 0 {
            self.gpu_memory_bytes
        } else {
            gpu_memory_bytes / u64::from(GPU_MILLI) * u64::from(self.gpu_milli)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
