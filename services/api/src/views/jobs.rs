//! Jobs: the submit body, the job as the API shows it, and the list and log queries.

use std::collections::BTreeMap;

use allot_domain::{
    GpuCompute, Isolation, Job, JobEvent, JobNetwork, JobState, PendingReason, WorkloadClass,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::*;

fn default_preemptible() -> bool {
    true
}

fn default_gpus() -> u32 {
    1
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitJob {
    /// The tenant to run as; defaults to the token's tenant.
    pub tenant: Option<String>,
    /// A label for people; defaults to the program name.
    pub name: Option<String>,
    /// GPUs (0 for a CPU-only job).
    #[serde(default = "default_gpus")]
    #[schema(default = 1, maximum = 1024)]
    pub gpus: u32,
    /// The share of each GPU in milli, 1–1000: less than 1000 asks for a fraction of one
    /// GPU that other jobs share (then `gpus` is 1). Whole GPUs when absent.
    pub gpu_milli: Option<u32>,
    /// GPU memory needed on each GPU, in bytes: the least a whole GPU must have, or what
    /// the job holds of a shared one.
    pub gpu_memory_bytes: Option<u64>,
    /// Acceptable GPU models (e.g. `H200`, `A100-80GB`; case and a leading `NVIDIA` do
    /// not matter); any when empty.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// CPU reserved on the node and the job's limit, in milli (1000 is one CPU); absent or 0
    /// takes the tenant's default (`GET /api/v1/tenants/{name}/job-limits`), and above its
    /// maximum is refused.
    #[serde(default)]
    pub cpu_milli: u32,
    /// Memory reserved on the node and the job's limit, in bytes; absent or 0 takes the
    /// tenant's default, and above its maximum is refused.
    #[serde(default)]
    pub memory_bytes: u64,
    /// -1000 to 1000; higher runs first and is preempted last (low -100, normal 0, high 100,
    /// critical 1000).
    #[serde(default)]
    pub priority: i32,
    /// Whether reclaim may stop and requeue the job while it runs on borrowed capacity.
    #[serde(default = "default_preemptible")]
    #[schema(default = true)]
    pub preemptible: bool,
    /// shared, mig or dedicated; the workload class's default (else shared) when absent,
    /// and never below the tenant's minimum.
    #[schema(value_type = Option<String>, example = "shared", pattern = "^(shared|mig|dedicated)$")]
    pub isolation: Option<Isolation>,
    /// training (default isolation dedicated), inference or batch (shared).
    #[schema(value_type = Option<String>, example = "inference", pattern = "^(training|inference|batch)$")]
    pub class: Option<WorkloadClass>,
    /// Retries of attempts that fail on their own (non-zero exit, application XID), 0–100,
    /// after 1 s, doubling to at most 5 minutes. Lost nodes, device faults and preemptions
    /// requeue without counting.
    #[serde(default)]
    pub max_retries: u32,
    /// Program and arguments, run directly (no shell); the image's entrypoint and command
    /// when empty (a job with an image).
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The OCI image to run, `REGISTRY/REPOSITORY:TAG` or `REGISTRY/REPOSITORY@sha256:…`:
    /// what nodes that confine jobs run. A tag is resolved to a digest at the first pull and
    /// every attempt runs that digest. The tenant's policy may limit the registries.
    pub image: Option<String>,
    /// `private` (the default: a network of its own, reaching what its tenant's policy
    /// allows), `host` (the node's own network, only where the tenant's policy allows it)
    /// or `none` (loopback only). On nodes running jobs as processes (`--runtime process`)
    /// every job is on the node's network whatever it asks.
    #[schema(example = "private")]
    pub network: Option<String>,
    /// Absolute working directory: inside the container (a job with an image), else on
    /// the node; `/scratch` or the job's own directory when absent.
    pub workdir: Option<String>,
    /// Where the job writes checkpoints: an absolute path inside one of its `volumes`
    /// mounted writable (host paths are refused); a requeued or retried attempt finds the
    /// newest entry there in `ALLOT_RESTORE_FROM`.
    pub checkpoint_dir: Option<String>,
    /// Named volumes (shared storage declared by platform admins) to mount.
    #[serde(default)]
    pub volumes: Vec<VolumeMountBody>,
    /// Tenant secrets the job gets as variables or files (by name; values never pass
    /// through the job's spec).
    #[serde(default)]
    pub secrets: Vec<SecretUseBody>,
    /// Run on a MIG instance of this profile (e.g. `1g.18gb`) instead of GPUs or GPU
    /// shares; implies `gpus: 1` and `mig` isolation.
    pub mig_profile: Option<String>,
    /// For a share of a GPU (`gpu_milli` below 1000): `strict` (the default) holds the job
    /// to its share always, `elastic` only while other jobs want the GPU; `best_effort`
    /// holds no share of its own (leave `gpu_milli` out; give `gpu_memory_bytes`), runs on
    /// what the GPU's other jobs leave idle and gives its place up to any job that is not
    /// best-effort.
    #[schema(
        value_type = Option<String>,
        example = "strict",
        pattern = "^(strict|elastic|best_effort)$"
    )]
    pub gpu_compute: Option<GpuCompute>,
    /// For a share of a GPU: the job's share may be resized while it runs
    /// (`POST /api/v1/jobs/{id}/resize`).
    #[serde(default)]
    pub gpu_resizable: bool,
    /// Allot sizes the job's share of one GPU and its GPU memory limit from what it uses
    /// (`allot job submit --gpus auto`, `--gpu-memory auto`). A sized job is resizable.
    pub gpu_sizing: Option<GpuSizingBody>,
    /// The longest an attempt may run, in seconds (at most 366 days): an attempt still
    /// running then is stopped and the job ends `timed_out`, saying so. It also lets the
    /// scheduler estimate when the jobs behind this one start.
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub time_limit_secs: Option<u64>,
    /// Replicas of a multi-node job (a gang), each asking for all of the above on a node:
    /// placed all at once or not at all, and requeued, retried, preempted and cancelled
    /// together. Each is told `WORLD_SIZE`, `RANK`, `NODE_RANK`, `LOCAL_WORLD_SIZE`,
    /// `MASTER_ADDR` and `MASTER_PORT` (and the `PET_*` variables `torchrun` reads).
    #[serde(default = "one_replica")]
    #[schema(minimum = 1, maximum = 256, default = 1)]
    pub replicas: u32,
    /// For a multi-node job: keep every replica on nodes sharing one value of this node
    /// label (`allot node label`), e.g. `rack`.
    pub pack: Option<PackBody>,
    /// Submit an array: one job per task index, as Slurm's `--array` writes it (`0-199`,
    /// `1,3,5-9`, `0-99:10`), with `%N` at the end to run at most N at once. Each task is
    /// told its index in `ALLOT_ARRAY_TASK_ID` and `SLURM_ARRAY_TASK_ID`; the answer is the
    /// first task, whose id is the array's.
    #[schema(example = "0-199%16")]
    pub array: Option<String>,
    /// Jobs this one waits for: it is placed only once each has ended as asked, and ends
    /// cancelled, saying why, if one never can. An array's id stands for all its tasks.
    #[serde(default)]
    pub dependencies: Vec<DependencyBody>,
}

/// A job another waits for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DependencyBody {
    /// `after-ok` (it succeeded), `after-any` (it ended) or `after-not-ok` (it failed, was
    /// cancelled or timed out).
    #[schema(value_type = String, example = "after-ok", pattern = "^(after-ok|after-any|after-not-ok)$")]
    pub kind: allot_domain::workflow::DependencyKind,
    /// Its id, or its short id.
    pub job: String,
}

/// What Allot sizes of a job's share of its GPU from what the job uses.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuSizingBody {
    /// The compute share is sized: it starts at a quarter of a GPU (or `max_milli` when
    /// lower) and follows what the job uses, held back and measured by its node.
    #[serde(default)]
    pub compute: bool,
    /// The most share it is sized up to, in thousandths (1000, a whole GPU, when absent).
    #[schema(minimum = 1, maximum = 1000)]
    pub max_milli: Option<u32>,
    /// The GPU memory limit is sized, never below the most the job held plus headroom.
    /// With `compute` and no `gpu_memory_bytes`, memory is sized too.
    #[serde(default)]
    pub memory: bool,
}

impl From<allot_domain::GpuSizing> for GpuSizingBody {
    fn from(s: allot_domain::GpuSizing) -> Self {
        Self {
            compute: s.max_milli.is_some(),
            max_milli: s.max_milli,
            memory: s.memory,
        }
    }
}

/// A gang packed within one value of a node label.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PackBody {
    /// The node label, e.g. `rack`.
    pub label: String,
    /// A requirement (the default: it waits until one value has room for every replica)
    /// or, when false, a preference (else anywhere).
    #[serde(default = "yes")]
    pub required: bool,
}

fn yes() -> bool {
    true
}

impl From<PackBody> for allot_domain::Pack {
    fn from(p: PackBody) -> Self {
        Self {
            label: p.label,
            required: p.required,
        }
    }
}

impl From<allot_domain::Pack> for PackBody {
    fn from(p: allot_domain::Pack) -> Self {
        Self {
            label: p.label,
            required: p.required,
        }
    }
}

/// Node label changes: a value sets the label, `null` removes it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeLabels {
    pub labels: BTreeMap<String, Option<String>>,
}

fn one_replica() -> u32 {
    1
}

/// One replica of a gang, as its gang's record shows it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplicaView {
    pub rank: u32,
    /// The replica's own job id (its log is read by it).
    pub id: String,
    #[schema(value_type = String, example = "running", pattern = "^(pending|scheduled|running|succeeded|failed|cancelled|timed_out)$")]
    pub state: JobState,
    pub attempt: u32,
    pub node_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    pub gpu_uuids: Vec<String>,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
}

/// A new share for a running job (at least one of the two).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeJob {
    /// Its share of each of its GPUs, 1 to 999 thousandths.
    pub gpu_milli: Option<u32>,
    /// GPU memory it may hold on each.
    pub gpu_memory_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PendingReasonView {
    /// Stable code: `NoRoom`, `TenantLimit`, `AwaitingPreemption`, `Preempted`,
    /// `NodeLost`, `DeviceFault`, `RetryBackoff`, `MigUnavailable`, `MigRepartitioning`,
    /// `MigLimit`, `BudgetExhausted`, `NoReadyNodes`, `ConfinementRequired`,
    /// `UnknownTenant`, `InvalidQuotaTree`.
    pub code: String,
    /// The same with numbers, for people.
    pub message: String,
}

impl From<PendingReason> for PendingReasonView {
    fn from(r: PendingReason) -> Self {
        Self {
            code: r.code,
            message: r.message,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobEventView {
    pub from: Option<String>,
    pub to: String,
    pub at: DateTime<Utc>,
    pub message: Option<String>,
}

impl From<JobEvent> for JobEventView {
    fn from(e: JobEvent) -> Self {
        Self {
            from: e.from.map(|s| s.to_string()),
            to: e.to.to_string(),
            at: e.at,
            message: e.message,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    pub id: String,
    /// Its short form, the last 12 hex digits of `id`: what lists show, accepted wherever
    /// a job is named.
    #[serde(default)]
    pub short_id: String,
    pub tenant: String,
    pub name: String,
    /// pending, scheduled, running, succeeded, failed, cancelled or timed_out.
    #[schema(value_type = String, example = "running", pattern = "^(pending|scheduled|running|succeeded|failed|cancelled|timed_out)$")]
    pub state: JobState,
    pub gpus: u32,
    pub gpu_milli: Option<u32>,
    pub gpu_memory_bytes: Option<u64>,
    pub gpu_models: Vec<String>,
    pub cpu_milli: u32,
    pub memory_bytes: u64,
    pub priority: i32,
    pub preemptible: bool,
    #[schema(value_type = Option<String>)]
    pub isolation: Option<Isolation>,
    #[schema(value_type = Option<String>)]
    pub class: Option<WorkloadClass>,
    pub max_retries: u32,
    /// Attempts that failed on their own so far.
    pub failures: u32,
    /// A job retrying after a failure does not start before this.
    pub retry_at: Option<DateTime<Utc>>,
    pub command: Vec<String>,
    /// Its variables; values are shown only to those who may submit jobs in its tenant
    /// (`<redacted>` to others).
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub checkpoint_dir: Option<String>,
    pub volumes: Vec<VolumeMountBody>,
    pub secrets: Vec<SecretUseBody>,
    /// The MIG profile it runs on an instance of.
    pub mig_profile: Option<String>,
    /// How its share of a shared GPU is held: strict, elastic or best_effort.
    #[schema(value_type = Option<String>)]
    pub gpu_compute: Option<GpuCompute>,
    /// Whether its share may be resized while it runs.
    pub gpu_resizable: bool,
    /// What Allot sizes of its share from what it uses (absent: nothing).
    pub gpu_sizing: Option<GpuSizingBody>,
    /// The longest an attempt may run, in seconds.
    pub time_limit_secs: Option<u64>,
    /// Its replicas: more than 1 for a multi-node job (a gang).
    pub replicas: u32,
    /// The node label its replicas share a value of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackBody>,
    /// On a replica of a gang other than its first: the gang's id (its first replica's
    /// job id, the gang's record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_id: Option<String>,
    /// Which replica of its gang this record is (0: the gang's own record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// For a task of an array: the array's id (its first task's job id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_id: Option<String>,
    /// For a task of an array: its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u32>,
    /// For a task of an array: the array as submitted (`0-199%16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
    /// On an array's first task (on reads): how many of its tasks are in each state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, u64>>)]
    pub array_tasks: Option<BTreeMap<JobState, u64>>,
    /// The jobs it waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<DependencyBody>,
    /// Who submitted it: the person's or the token's name.
    pub user: Option<String>,
    /// On a gang's record: every replica, in rank order. The record's `state` and
    /// `failures` are then the gang's: failed if a replica failed, cancelled if one was,
    /// succeeded when all did, else the furthest along of running, scheduled and pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<Vec<ReplicaView>>,
    /// For a pending job: when it is estimated to start (RFC 3339), if every job it waits
    /// behind has a time limit. The estimate assumes running jobs end at their limits and
    /// the jobs ahead of it start as soon as GPUs free; guarantees, quotas, fair share and
    /// preemption can move it either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start: Option<DateTime<Utc>>,
    /// The image as submitted.
    pub image: Option<String>,
    /// The manifest digest its image resolved to at the first pull: what every attempt runs.
    pub image_digest: Option<String>,
    /// `private` (a network namespace of its own, routed by its tenant's policy), `host`
    /// or `none`.
    #[schema(value_type = String, example = "private", pattern = "^(private|host|none)$")]
    pub network: JobNetwork,
    /// Why a pending job waits.
    pub pending_reason: Option<PendingReasonView>,
    /// A pending job's place in its tenant's queue (1: the scheduler takes it next from
    /// that queue), by priority and then age (interrupted work first). Which tenant's
    /// queue goes next is decided on each pass, by guarantees, priority and fair share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u64>,
    /// How many of its tenant's jobs wait in that queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_length: Option<u64>,
    pub node_id: Option<String>,
    /// Its node's name (on reads of jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    pub gpu_uuids: Vec<String>,
    /// The NVLink domains its GPUs are in (on reads; one for a multi-GPU job whose GPUs
    /// all talk over NVLink; empty: no NVLink, or not placed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_domains: Vec<u32>,
    /// The share of each GPU the placement holds (a dedicated job holds whole GPUs).
    pub held_gpu_milli: Option<u32>,
    /// Placed on capacity above the tenant's guarantee, which reclaim may take back.
    pub borrowing: bool,
    /// 1, plus one for each time the job was preempted and requeued.
    pub attempt: u32,
    pub cancel_requested: bool,
    /// Why reclaim is stopping the job (it is requeued once stopped).
    pub preempt_reason: Option<String>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    /// How the job ended, when that needs saying (signal, launch failure, lost node).
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub scheduled_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Every state transition, oldest first (only on single-job reads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<JobEventView>>,
}

impl From<Job> for JobView {
    fn from(j: Job) -> Self {
        Self {
            short_id: allot_domain::job::short_id(&j.id).to_owned(),
            id: j.id,
            tenant: j.spec.tenant.to_string(),
            name: j.spec.name,
            state: j.state,
            gpus: j.spec.gpus,
            gpu_milli: j.spec.gpu_milli,
            gpu_memory_bytes: j.spec.gpu_memory_bytes,
            gpu_models: j.spec.gpu_models,
            cpu_milli: j.spec.cpu_milli,
            memory_bytes: j.spec.memory_bytes,
            priority: j.spec.priority,
            preemptible: j.spec.preemptible,
            isolation: j.spec.isolation,
            class: j.spec.class,
            max_retries: j.spec.max_retries,
            failures: j.failures,
            retry_at: j.retry_at,
            command: j.spec.command,
            env: j.spec.env,
            workdir: j.spec.workdir,
            checkpoint_dir: j.spec.checkpoint_dir,
            volumes: j.spec.volumes.into_iter().map(Into::into).collect(),
            secrets: j.spec.secrets.into_iter().map(Into::into).collect(),
            mig_profile: j.spec.mig_profile,
            gpu_compute: j.spec.gpu_compute,
            gpu_resizable: j.spec.gpu_resizable,
            gpu_sizing: j
                .spec
                .gpu_sizing
                .is_sized()
                .then(|| j.spec.gpu_sizing.into()),
            time_limit_secs: j.spec.time_limit_secs,
            replicas: j.spec.replicas,
            pack: j.spec.pack.map(Into::into),
            gang_id: j
                .replica
                .as_ref()
                .filter(|r| r.rank > 0)
                .map(|r| r.gang_id.clone()),
            rank: j.replica.as_ref().map(|r| r.rank),
            array_id: j.array_task.as_ref().map(|a| a.array_id.clone()),
            array_index: j.array_task.as_ref().map(|a| a.index),
            array: j.spec.array.as_ref().map(ToString::to_string),
            array_tasks: None,
            dependencies: j
                .spec
                .dependencies
                .iter()
                .map(|d| DependencyBody {
                    kind: d.kind,
                    job: d.job_id.clone(),
                })
                .collect(),
            user: j.submitted_by.clone(),
            gang: None,
            estimated_start: None,
            image: j.spec.image,
            image_digest: j.image_digest,
            network: j.spec.network,
            pending_reason: j.pending_reason.map(Into::into),
            queue_position: None,
            queue_length: None,
            node_id: j.node_id,
            node_name: None,
            gpu_uuids: j.gpu_uuids,
            nvlink_domains: Vec::new(),
            held_gpu_milli: j.held_gpu_milli,
            borrowing: j.borrowing,
            attempt: j.attempt,
            cancel_requested: j.cancel_requested,
            preempt_reason: j.preempt_reason,
            pid: j.pid,
            exit_code: j.exit_code,
            message: j.message,
            created_at: j.created_at,
            updated_at: j.updated_at,
            scheduled_at: j.scheduled_at,
            started_at: j.started_at,
            finished_at: j.finished_at,
            events: None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub items: Vec<JobView>,
    /// Pass as `page_token` for the next page; absent on the last page.
    pub next_page_token: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct JobQuery {
    /// Only this tenant's jobs (a scoped token always sees only its own tenant).
    pub tenant: Option<String>,
    /// Comma-separated states, e.g. `pending,running`.
    #[param(
        pattern = "^(pending|scheduled|running|succeeded|failed|cancelled|timed_out)(,(pending|scheduled|running|succeeded|failed|cancelled|timed_out))*$"
    )]
    pub state: Option<String>,
    /// Only jobs placed on this node.
    pub node: Option<String>,
    /// Only jobs of this name; with `*` (any run of characters) or `?` (any one), those
    /// whose name matches, in either case (`sweep-*`).
    #[param(min_length = 1, max_length = 128)]
    pub name: Option<String>,
    /// Only jobs submitted by this person or token (by name, as `user` shows it).
    #[param(min_length = 1, max_length = 256)]
    pub user: Option<String>,
    /// Only the tasks of this array (its id), each listed.
    #[param(min_length = 1, max_length = 36)]
    pub array: Option<String>,
    /// `whole`: each array once, as its first task (whose id is the array's; the
    /// `array_tasks` counts of its read say where its tasks stand). `tasks` (the default):
    /// every task.
    #[param(pattern = "^(whole|tasks)$")]
    pub arrays: Option<String>,
    /// Page size, 1–500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    pub page_token: Option<String>,
}

/// Which part of a job's log to read.
#[derive(Debug, Default, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogQuery {
    /// Which attempt's log (default: the job's latest; following it, the attempts after it
    /// too).
    #[param(minimum = 1)]
    pub attempt: Option<u32>,
    /// Start at this byte of the attempt's log (default 0). Each answer's `Allot-Log-End`
    /// header is where the next read starts.
    pub offset: Option<u64>,
    /// Keep the answer open and send output as it is written, until the job ends.
    pub follow: Option<bool>,
    /// Start at the first output the control plane received at or after this time (RFC
    /// 3339; instead of `offset`). Output arrives every half second or so.
    pub since: Option<DateTime<Utc>>,
    /// Start each line with when the control plane received it (RFC 3339, UTC, to the
    /// millisecond, then a space), as `kubectl logs --timestamps` does. Output arrives
    /// every half second or so, so that is how close the time is to when it was written.
    pub timestamps: Option<bool>,
}
