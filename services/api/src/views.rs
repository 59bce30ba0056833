//! The API's wire types: request bodies (strict: unknown fields are rejected) and responses.

use std::collections::BTreeMap;

use allot_domain::{
    ApiToken, GpuCompute, GpuDevice, Isolation, Job, JobEvent, JobNetwork, JobState, Node,
    NodeStatus, PendingReason, Quota, ResourceLimits, Resources, Role, Tenant, WorkloadClass,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An amount of each resource a quota speaks of; absent fields are 0.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesBody {
    /// GPU share in milli: 1000 is one GPU, 7500 seven and a half.
    #[serde(default)]
    pub gpu_milli: u64,
    /// CPU in milli: 1000 is one CPU.
    #[serde(default)]
    pub cpu_milli: u64,
    #[serde(default)]
    pub memory_bytes: u64,
    /// GPU memory: per GPU asked for, times the GPUs.
    #[serde(default)]
    pub gpu_memory_bytes: u64,
}

/// Hard limits per resource; an absent field is unlimited.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsBody {
    pub gpu_milli: Option<u64>,
    pub cpu_milli: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub gpu_memory_bytes: Option<u64>,
}

fn default_weight() -> u32 {
    1
}

/// What a tenant's jobs may run and where.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyBody {
    /// Image name prefixes its jobs may use: a registry (`registry.example.com`,
    /// `127.0.0.1:5000`) or a registry and repository prefix
    /// (`registry.example.com/team-a`). Empty allows any image.
    #[serde(default)]
    pub image_registries: Vec<String>,
    /// Place its jobs only on nodes that run them in containers (the `oci` runtime).
    #[serde(default)]
    pub require_confinement: bool,
    /// Where its jobs' connections may go (jobs with a network of their own, the default),
    /// besides what they never reach: the node's own addresses and services, link-local
    /// addresses (`169.254.0.0/16`) and other jobs. Absent or null: anywhere else; a list:
    /// only there (empty: nowhere). IPv4 only.
    #[serde(default)]
    pub egress: Option<Vec<EgressRuleBody>>,
    /// Whether its jobs may ask for the node's own network (`network: host`), which reaches
    /// everything the node does.
    #[serde(default)]
    pub allow_host_network: bool,
}

/// Where a job's connections may go.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressRuleBody {
    /// An IPv4 network (`ADDRESS/PREFIX`, or an address alone).
    #[schema(example = "203.0.113.0/24")]
    pub cidr: String,
    /// Destination ports, TCP and UDP: `443`, `8000-8100`, comma-separated. Absent or
    /// empty: every port and protocol.
    #[schema(example = "443,8000-8100")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
}

impl From<allot_domain::TenantPolicy> for PolicyBody {
    fn from(p: allot_domain::TenantPolicy) -> Self {
        Self {
            image_registries: p.image_registries,
            require_confinement: p.require_confinement,
            egress: p.network.egress.map(|rules| {
                rules
                    .iter()
                    .map(|r| EgressRuleBody {
                        cidr: r.cidr.to_string(),
                        ports: (!r.ports.is_empty()).then(|| r.ports_text()),
                    })
                    .collect()
            }),
            allow_host_network: p.network.allow_host_network,
        }
    }
}

impl TryFrom<PolicyBody> for allot_domain::TenantPolicy {
    type Error = allot_domain::ValidationError;

    /// Parses the egress rules, naming a bad one's field.
    fn try_from(p: PolicyBody) -> Result<Self, Self::Error> {
        let egress = p
            .egress
            .map(|rules| {
                let raw: Vec<(String, Option<String>)> =
                    rules.into_iter().map(|r| (r.cidr, r.ports)).collect();
                allot_domain::network::parse_egress(&raw)
            })
            .transpose()?;
        Ok(Self {
            image_registries: p.image_registries,
            require_confinement: p.require_confinement,
            network: allot_domain::NetworkPolicy {
                egress,
                allow_host_network: p.allow_host_network,
            },
        })
    }
}

/// A tenant's own default and most CPU and memory per job (as a Kubernetes LimitRange): a
/// job asking for no CPU (or memory) gets the default; asking for more than the maximum is
/// refused (422). An absent field takes the parent's, and where no tenant up the chain
/// sets one, the platform's (defaults of 1 CPU and 2 GiB, no maximum).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobLimitsBody {
    /// CPU a job asking for none gets, in milli (1000 is one CPU).
    #[schema(example = 2000)]
    pub default_cpu_milli: Option<u64>,
    /// Memory a job asking for none gets.
    #[schema(example = 8589934592u64)]
    pub default_memory_bytes: Option<u64>,
    /// The most CPU one job may ask for, in milli.
    pub max_cpu_milli: Option<u64>,
    /// The most memory one job may ask for.
    pub max_memory_bytes: Option<u64>,
    /// The share of a GPU an auto-sized job (`gpu_sizing`) starts at, in thousandths
    /// (1000 is a whole GPU); the platform's is 100.
    #[schema(example = 100)]
    pub default_gpu_milli: Option<u64>,
}

impl From<allot_domain::JobLimits> for JobLimitsBody {
    fn from(l: allot_domain::JobLimits) -> Self {
        Self {
            default_cpu_milli: l.default_cpu_milli,
            default_memory_bytes: l.default_memory_bytes,
            max_cpu_milli: l.max_cpu_milli,
            max_memory_bytes: l.max_memory_bytes,
            default_gpu_milli: l.default_gpu_milli,
        }
    }
}

impl From<JobLimitsBody> for allot_domain::JobLimits {
    fn from(l: JobLimitsBody) -> Self {
        Self {
            default_cpu_milli: l.default_cpu_milli,
            default_memory_bytes: l.default_memory_bytes,
            max_cpu_milli: l.max_cpu_milli,
            max_memory_bytes: l.max_memory_bytes,
            default_gpu_milli: l.default_gpu_milli,
        }
    }
}

/// A tenant's job limits: its own settings and what applies.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
pub struct JobLimitsView {
    /// As set on the tenant (absent fields inherited).
    pub own: JobLimitsBody,
    /// What its jobs get: its own settings, its parents' where it has none, the platform's
    /// where none is set (both defaults are always given; an absent maximum is none). A
    /// default is never above the maximum that applies, and a maximum is the least set on
    /// the tenant or above it.
    pub effective: JobLimitsBody,
}

impl JobLimitsView {
    /// Tenant `t`'s, among `all` (its chain is found there).
    pub fn new(t: &Tenant, all: &[Tenant]) -> Self {
        let e = allot_domain::JobLimits::effective(t, all);
        Self {
            own: t.job_limits.into(),
            effective: JobLimitsBody {
                default_cpu_milli: Some(e.default_cpu_milli),
                default_memory_bytes: Some(e.default_memory_bytes),
                max_cpu_milli: e.max_cpu_milli,
                max_memory_bytes: e.max_memory_bytes,
                default_gpu_milli: Some(e.default_gpu_milli),
            },
        }
    }
}

/// A named volume a job mounts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMountBody {
    /// The volume's name.
    #[schema(example = "checkpoints")]
    pub volume: String,
    /// Where the job sees it: an absolute path inside its container.
    #[schema(example = "/ckpt")]
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

impl From<allot_domain::VolumeMount> for VolumeMountBody {
    fn from(m: allot_domain::VolumeMount) -> Self {
        Self {
            volume: m.volume,
            path: m.path,
            read_only: m.read_only,
        }
    }
}

impl From<VolumeMountBody> for allot_domain::VolumeMount {
    fn from(m: VolumeMountBody) -> Self {
        Self {
            volume: m.volume,
            path: m.path,
            read_only: m.read_only,
        }
    }
}

/// A tenant secret a job uses, as exactly one of an environment variable (`env`) and a
/// read-only file (`file`, at `/run/secrets/NAME`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretUseBody {
    /// The secret's name in the job's tenant.
    #[schema(example = "db-password")]
    pub secret: String,
    #[schema(example = "DB_PASSWORD")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[schema(example = "/run/secrets/db-password")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl From<allot_domain::SecretUse> for SecretUseBody {
    fn from(u: allot_domain::SecretUse) -> Self {
        Self {
            secret: u.secret,
            env: u.env,
            file: u.file,
        }
    }
}

impl From<SecretUseBody> for allot_domain::SecretUse {
    fn from(u: SecretUseBody) -> Self {
        Self {
            secret: u.secret,
            env: u.env,
            file: u.file,
        }
    }
}

/// A tenant secret as anyone is shown it: its name and when it was set, never its value.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantSecretView {
    pub name: String,
    pub updated_at: DateTime<Utc>,
}

impl From<allot_domain::TenantSecret> for TenantSecretView {
    fn from(s: allot_domain::TenantSecret) -> Self {
        Self {
            name: s.name,
            updated_at: s.updated_at,
        }
    }
}

/// A secret's value, to store. Never shown again.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetSecretBody {
    /// The value (text, 1 byte to 64 KiB).
    pub value: String,
}

/// A volume's declaration: a host path every node has (shared storage), and the tenants
/// whose jobs may mount it. Each tenant's jobs see only its own directory there,
/// `<host_path>/<tenant>`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeBody {
    /// Absolute path on every node.
    #[schema(example = "/mnt/shared/checkpoints")]
    pub host_path: String,
    /// Tenants (by name) whose jobs may mount it.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Jobs may only read it.
    #[serde(default)]
    pub read_only: bool,
}

/// A declared volume.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VolumeView {
    pub name: String,
    pub host_path: String,
    pub tenants: Vec<String>,
    pub read_only: bool,
    pub created_at: DateTime<Utc>,
}

impl From<allot_domain::Volume> for VolumeView {
    fn from(v: allot_domain::Volume) -> Self {
        Self {
            name: v.name,
            host_path: v.host_path,
            tenants: v.tenants.into_iter().map(|t| t.to_string()).collect(),
            read_only: v.read_only,
            created_at: v.created_at,
        }
    }
}

/// A tenant's credentials for one registry. They are written only: no response shows them.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryCredentialBody {
    pub username: String,
    /// The password or access token.
    pub password: String,
}

impl std::fmt::Debug for RegistryCredentialBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryCredentialBody(<redacted>)")
    }
}

/// Which registry a tenant has credentials for, and since when (never the credentials).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RegistryCredentialView {
    #[schema(example = "registry.example.com:5000")]
    pub registry: String,
    pub updated_at: DateTime<Utc>,
}

impl From<allot_domain::RegistryCredential> for RegistryCredentialView {
    fn from(c: allot_domain::RegistryCredential) -> Self {
        Self {
            registry: c.registry,
            updated_at: c.updated_at,
        }
    }
}

/// A tenant's share: held for it while it asks (`guaranteed`, lent to others while idle and
/// reclaimed by preempting borrowers), never exceeded (`limit`), its weight among tenants
/// competing for spare capacity, and the least isolation its jobs run at.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    #[serde(default)]
    pub guaranteed: ResourcesBody,
    #[serde(default)]
    pub limit: LimitsBody,
    /// Over-quota weight, 1 to 10000.
    #[serde(default = "default_weight")]
    #[schema(default = 1, minimum = 1, maximum = 10000)]
    pub weight: u32,
    /// shared, mig or dedicated.
    #[serde(default)]
    #[schema(value_type = String, example = "shared", pattern = "^(shared|mig|dedicated)$")]
    pub min_isolation: Isolation,
    /// The most MIG instances of each profile (by name, e.g. `1g.18gb`) the tenant and its
    /// teams hold at once; a profile not named is unlimited.
    #[serde(default)]
    pub mig_limits: std::collections::BTreeMap<String, u32>,
    /// GPU-hours the tenant and its teams may use per calendar month (UTC); once spent,
    /// their pending jobs wait for the next month. Absent: no budget.
    pub gpu_hour_budget: Option<f64>,
}

/// A change of a quota: a JSON merge patch (RFC 7396) of [`QuotaBody`]. Every member is
/// optional and only those present change; `null` sets one back to its default (a limit,
/// a MIG profile's limit or the budget lifted, nothing guaranteed, weight 1, shared).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaPatch {
    pub guaranteed: Option<ResourcesPatch>,
    pub limit: Option<LimitsBody>,
    /// Over-quota weight, 1 to 10000.
    #[schema(minimum = 1, maximum = 10000)]
    pub weight: Option<u32>,
    /// shared, mig or dedicated.
    #[schema(value_type = Option<String>, example = "dedicated", pattern = "^(shared|mig|dedicated)$")]
    pub min_isolation: Option<Isolation>,
    /// MIG profile limits to set (or, `null`, to lift); profiles not named keep theirs.
    pub mig_limits: Option<std::collections::BTreeMap<String, Option<u32>>>,
    pub gpu_hour_budget: Option<f64>,
}

/// Guaranteed amounts to change; absent ones stay.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesPatch {
    pub gpu_milli: Option<u64>,
    pub cpu_milli: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub gpu_memory_bytes: Option<u64>,
}

impl Default for QuotaBody {
    fn default() -> Self {
        Quota::default().into()
    }
}

impl From<QuotaBody> for Quota {
    fn from(q: QuotaBody) -> Self {
        let (g, l) = (q.guaranteed, q.limit);
        Quota {
            guaranteed: Resources {
                gpu_milli: g.gpu_milli,
                cpu_milli: g.cpu_milli,
                memory_bytes: g.memory_bytes,
                gpu_memory_bytes: g.gpu_memory_bytes,
            },
            limit: ResourceLimits {
                gpu_milli: l.gpu_milli,
                cpu_milli: l.cpu_milli,
                memory_bytes: l.memory_bytes,
                gpu_memory_bytes: l.gpu_memory_bytes,
            },
            weight: q.weight,
            min_isolation: q.min_isolation,
            mig_limits: q.mig_limits,
            // Thousandths of a GPU-hour; anything negative or absurd fails validation.
            gpu_hour_budget_milli: q.gpu_hour_budget.map(|b| {
                if b.is_finite() && b >= 0.0 {
                    (b * 1000.0).round().min(u64::MAX as f64) as u64
                } else {
                    u64::MAX
                }
            }),
        }
    }
}

impl From<Quota> for QuotaBody {
    fn from(q: Quota) -> Self {
        let (g, l) = (q.guaranteed, q.limit);
        QuotaBody {
            guaranteed: ResourcesBody {
                gpu_milli: g.gpu_milli,
                cpu_milli: g.cpu_milli,
                memory_bytes: g.memory_bytes,
                gpu_memory_bytes: g.gpu_memory_bytes,
            },
            limit: LimitsBody {
                gpu_milli: l.gpu_milli,
                cpu_milli: l.cpu_milli,
                memory_bytes: l.memory_bytes,
                gpu_memory_bytes: l.gpu_memory_bytes,
            },
            weight: q.weight,
            min_isolation: q.min_isolation,
            mig_limits: q.mig_limits,
            gpu_hour_budget: q.gpu_hour_budget_milli.map(|m| m as f64 / 1000.0),
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// DNS-label style: lowercase letters, digits and `-`, starting with a letter.
    pub name: String,
    /// The tenant this one is a team of: its guarantees nest within the parent's, and the
    /// parent's limits and minimum isolation apply to it too.
    pub parent: Option<String>,
    #[serde(default)]
    pub quota: QuotaBody,
}

/// What something holds now, exactly as the parts it is made of add up: a whole GPU holds
/// one GPU and all of its memory, a share its fraction and the GPU memory it asked for, a
/// MIG instance its compute slices of the board's seven and its memory.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
pub struct HeldView {
    /// GPUs: `2`, `0.25`, `0.142857…` for one 1g MIG instance (seven of them are `1`).
    pub gpus: f64,
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    pub gpu_memory_bytes: u64,
}

impl From<allot_domain::Held> for HeldView {
    fn from(h: allot_domain::Held) -> Self {
        Self {
            gpus: h.gpu.gpus(),
            cpu_milli: h.cpu_milli,
            memory_bytes: h.memory_bytes,
            gpu_memory_bytes: h.gpu_memory_bytes,
        }
    }
}

/// What a tenant's own jobs hold, and how many of them wait and run (a gang counts once).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
pub struct TenantFiguresView {
    pub usage: HeldView,
    pub jobs_pending: u64,
    pub jobs_running: u64,
}

impl From<allot_domain::TenantFigures> for TenantFiguresView {
    fn from(f: allot_domain::TenantFigures) -> Self {
        Self {
            usage: f.held.into(),
            jobs_pending: f.jobs_pending,
            jobs_running: f.jobs_running,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    pub id: String,
    pub name: String,
    /// The parent tenant's name, for a team.
    pub parent: Option<String>,
    pub quota: QuotaBody,
    pub created_at: DateTime<Utc>,
    /// What its jobs and its teams' (every tenant below it) hold now, scheduled or running:
    /// what its quota is held to.
    #[serde(default)]
    pub usage: HeldView,
    /// Its jobs and its teams' waiting to be placed (a gang counts once).
    #[serde(default)]
    pub jobs_pending: u64,
    /// Its jobs and its teams' placed or running (a gang counts once).
    #[serde(default)]
    pub jobs_running: u64,
    /// The same figures of its own jobs alone.
    #[serde(default)]
    pub own: TenantFiguresView,
    /// The CPU and memory its jobs get when they ask for none, and the most they may ask.
    #[serde(default)]
    pub job_limits: JobLimitsView,
}

impl TenantView {
    /// `all`: the tenants to find the parent's name among; `totals`: every tenant's
    /// figures ([`allot_domain::holding::tenant_totals`]).
    pub fn new(
        t: Tenant,
        all: &[Tenant],
        totals: &std::collections::HashMap<String, allot_domain::TenantTotals>,
    ) -> Self {
        let parent = t
            .parent_id
            .as_ref()
            .and_then(|p| all.iter().find(|x| x.id == *p))
            .map(|p| p.name.to_string());
        let figures = totals.get(&t.id).copied().unwrap_or_default();
        let job_limits = JobLimitsView::new(&t, all);
        Self {
            job_limits,
            jobs_pending: figures.total.jobs_pending,
            jobs_running: figures.total.jobs_running,
            usage: figures.total.held.into(),
            own: figures.own.into(),
            id: t.id,
            name: t.name.to_string(),
            parent,
            quota: t.quota.into(),
            created_at: t.created_at,
        }
    }
}

/// What deleting a tenant did. The tenant is gone from every list and lookup; its audit
/// log and its jobs' history stay, and so does its name (no new tenant takes it).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeletedTenant {
    pub id: String,
    pub name: String,
    /// Its API tokens, revoked.
    pub tokens_revoked: u64,
    /// Its role bindings, revoked.
    pub bindings_revoked: u64,
    /// Its secrets and registry pull credentials, removed.
    pub secrets_removed: u64,
    pub credentials_removed: u64,
}

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
    /// with exponential backoff from 1 s. Lost nodes, device faults and preemptions
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
    /// Only jobs of this name.
    #[param(min_length = 1, max_length = 128)]
    pub name: Option<String>,
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
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GpuView {
    pub uuid: String,
    pub index: u32,
    pub model: String,
    pub memory_bytes: u64,
    /// As its agent reports it (a GPU with an XID that needs a drain is not).
    pub healthy: bool,
    /// Suspect but working (an informational XID): its jobs run on, it takes no new work.
    pub degraded: bool,
    /// An operator drained it: no new work until it is returned to service.
    pub drained: bool,
    /// In one word: `healthy`, `degraded`, `draining` (an operator drained it) or
    /// `unhealthy`; only a healthy GPU takes new work.
    pub health: String,
    /// How its node holds each job on it to its GPU memory: `check` (the agent checks the
    /// driver's per-process count and kills a job over its share), `shim` (the GPU-sharing
    /// shim refuses its allocations past it, with that check behind it) or `mig` (in
    /// hardware).
    #[serde(default)]
    pub memory_enforcement: String,
    /// Its NVLink domain on the node: GPUs of one domain talk over NVLink or NVSwitch
    /// (absent: no NVLink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<u32>,
    /// Its MIG instances when the GPU is in MIG mode (absent when it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instances: Option<Vec<MigInstanceView>>,
    /// How much of it jobs hold (scheduled or running), in GPUs (1 is all of it): a share
    /// its fraction, a MIG instance its compute slices of the board's seven (seven 1g
    /// instances hold 1). Every tenant's jobs are cluster-wide telemetry: present only for
    /// callers with the `telemetry.read` right (platform admins by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<f64>,
    /// How many jobs hold part of it (with `telemetry.read` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<u32>,
}

/// A MIG instance of a GPU.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MigInstanceView {
    /// The GPU-instance profile id, and its name on this board (e.g. `1g.18gb`).
    pub profile_id: u32,
    pub profile: String,
    /// The first memory slice it occupies.
    pub start: u8,
    pub uuid: String,
}

impl From<GpuDevice> for GpuView {
    fn from(g: GpuDevice) -> Self {
        let health = g.health(false).to_owned();
        let board = allot_domain::mig::geometry(&g.model, Some(g.memory_bytes >> 20));
        let mig_instances = g.mig.map(|slots| {
            slots
                .into_iter()
                .map(|s| MigInstanceView {
                    profile: board
                        .and_then(|b| b.profile(s.profile))
                        .map_or_else(|| format!("profile {}", s.profile), |p| p.name.to_owned()),
                    profile_id: s.profile,
                    start: s.start,
                    uuid: s.uuid,
                })
                .collect()
        });
        Self {
            mig_instances,
            nvlink_domain: g.nvlink_domain,
            uuid: g.uuid,
            index: g.index,
            model: g.model,
            memory_bytes: g.memory_bytes,
            health,
            healthy: g.healthy,
            degraded: g.degraded,
            drained: false,
            memory_enforcement: g.memory_enforcement.as_str().to_owned(),
            held: None,
            jobs: None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub id: String,
    pub name: String,
    /// `ready` while the lease is current, `not-ready` after it lapses.
    #[schema(value_type = String, example = "ready", pattern = "^(ready|not-ready)$")]
    pub status: NodeStatus,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
    pub lease_expires_at: DateTime<Utc>,
    pub agent_version: String,
    pub gpu_backend: String,
    /// What runs its jobs: `oci` (confined containers) or `process` (unconfined).
    pub runtime: String,
    /// CPU (milli) and memory (bytes) the node offers to jobs; 0 when not reported.
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    pub gpus: Vec<GpuView>,
    /// An operator cordoned it: no new work.
    pub cordoned: bool,
    /// Why its agent says it takes no new work (low on disk); empty: it takes work.
    #[serde(default)]
    pub unavailable: String,
    /// Its operator's labels (`allot node label`), e.g. `rack: r12`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Where other nodes reach it, as its agent says (empty: not said).
    #[serde(default)]
    pub address: String,
    /// What its jobs hold of its GPUs, in GPUs (the sum of each GPU's `held`; with
    /// `telemetry.read` only, as what is held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_held: Option<f64>,
    /// What of its GPUs new work could take now, in GPUs: what is not held of its healthy
    /// GPUs that no operator drained, the node ready and not cordoned (a free MIG instance
    /// is its share). `gpus_held` + `gpus_free` + `gpus_unavailable` is its GPUs, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_free: Option<f64>,
    /// What is neither held nor free: the rest of its unwell or drained GPUs, or all that
    /// is not held when the node is not ready or is cordoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_unavailable: Option<f64>,
    /// Its GPUs nothing holds that could take a whole-GPU job now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_idle: Option<u32>,
}

impl NodeView {
    pub fn new(n: Node, now: DateTime<Utc>) -> Self {
        Self {
            status: n.status(now),
            id: n.id,
            name: n.name,
            registered_at: n.registered_at,
            last_heartbeat_at: n.last_heartbeat_at,
            lease_expires_at: n.lease_expires_at,
            agent_version: n.agent_version,
            gpu_backend: n.gpu_backend,
            runtime: n.runtime,
            cpu_milli: n.cpu_milli,
            memory_bytes: n.memory_bytes,
            gpus: n
                .gpus
                .into_iter()
                .map(|g| {
                    let drained = n.drained_gpus.contains(&g.uuid);
                    GpuView {
                        drained,
                        health: g.health(drained).to_owned(),
                        ..g.into()
                    }
                })
                .collect(),
            cordoned: n.cordoned,
            unavailable: n.unavailable,
            labels: n.labels,
            address: n.address,
            gpus_held: None,
            gpus_free: None,
            gpus_unavailable: None,
            gpus_idle: None,
        }
    }

    /// `n` with what `holding` (the jobs scheduled or running, every tenant's) holds of
    /// each GPU, and its free GPUs, for callers with the `telemetry.read` right.
    pub fn with_holding(n: Node, now: DateTime<Utc>, holding: &[Job]) -> Self {
        let figures = allot_domain::holding::node_figures(&n, now, holding);
        let mut view = Self::new(n, now);
        for (g, f) in view.gpus.iter_mut().zip(&figures.gpus) {
            g.held = Some(f.held.gpus());
            g.jobs = Some(f.jobs);
        }
        view.gpus_held = Some(figures.held.gpus());
        view.gpus_free = Some(figures.free.gpus());
        view.gpus_unavailable = Some(figures.unavailable.gpus());
        view.gpus_idle = Some(figures.idle);
        view
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token is for, e.g. `ci-pipeline`.
    pub name: String,
    /// The tenant the token acts in; required for every role except `platform-admin` and `auditor`.
    pub tenant: Option<String>,
    #[schema(value_type = String, example = "member", pattern = "^(viewer|member|tenant-admin|platform-admin|admin|auditor)$")]
    pub role: Role,
    /// Lifetime in seconds (at most ten years); no expiry when absent.
    #[schema(minimum = 1, maximum = 315_360_000)]
    pub expires_in_seconds: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub tenant: Option<String>,
    /// viewer, member, tenant-admin, platform-admin or auditor.
    pub role: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// When the token was last used, to the minute.
    pub last_used_at: Option<DateTime<Utc>>,
}

impl TokenView {
    pub fn new(t: ApiToken, tenant: Option<String>) -> Self {
        Self {
            id: t.id,
            name: t.name,
            tenant,
            role: t.role.to_string(),
            created_at: t.created_at,
            expires_at: t.expires_at,
            revoked_at: t.revoked_at,
            last_used_at: t.last_used_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub token: TokenView,
    /// The bearer secret. Shown once; only its hash is stored.
    pub secret: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

/// A person who signed in through the identity provider.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UserView {
    pub id: String,
    pub issuer: String,
    /// The provider's `sub` for this person.
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
}

impl From<allot_domain::User> for UserView {
    fn from(u: allot_domain::User) -> Self {
        Self {
            id: u.id,
            issuer: u.issuer,
            subject: u.subject,
            email: u.email,
            name: u.name,
            created_at: u.created_at,
            last_seen_at: u.last_seen_at,
            deleted_at: u.deleted_at,
        }
    }
}

/// Grant a role to one user, or to everyone whose token carries a claim.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBinding {
    /// The user's id (from `GET /api/v1/users`); or give `claim` and `value`.
    pub user: Option<String>,
    /// A token claim, e.g. `groups`.
    pub claim: Option<String>,
    /// The claim's value (or one of its values), e.g. `ml-team`.
    pub value: Option<String>,
    #[schema(value_type = String, example = "member", pattern = "^(viewer|member|tenant-admin|platform-admin|admin|auditor)$")]
    pub role: Role,
    /// The tenant the role applies in (and below); absent for platform-admin and auditor.
    pub tenant: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BindingView {
    pub id: String,
    /// The user granted the role, for user bindings.
    pub user: Option<String>,
    pub claim: Option<String>,
    pub value: Option<String>,
    pub role: String,
    pub tenant: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl BindingView {
    pub fn new(b: allot_domain::StoredBinding, tenant: Option<String>) -> Self {
        let (user, claim, value) = match b.subject {
            allot_domain::BindingSubject::User { user_id } => (Some(user_id), None, None),
            allot_domain::BindingSubject::Claim { claim, value } => {
                (None, Some(claim), Some(value))
            }
        };
        Self {
            id: b.id,
            user,
            claim,
            value,
            role: b.role.to_string(),
            tenant,
            created_at: b.created_at,
            revoked_at: b.revoked_at,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBootstrapToken {
    /// The node it admits: its name, or a pattern with `*` (e.g. `gpu-4*`).
    #[schema(example = "gpu-41")]
    pub node_name: String,
    /// It may take over the name of a node already registered, revoking that node's
    /// certificates (audited as `node.replace`). Without it, a registered name is refused.
    #[serde(default)]
    pub replace: bool,
    /// What the token is for, e.g. `rack 4, nodes gpu-40..47`.
    #[serde(default)]
    pub description: String,
    /// Lifetime in seconds: 1 hour when absent, at most 7 days.
    #[schema(minimum = 1, maximum = 604_800)]
    pub expires_in_seconds: Option<u64>,
}

/// A bootstrap token: one node registers with it, once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BootstrapTokenView {
    pub id: String,
    pub description: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub used_at: Option<DateTime<Utc>>,
    /// The node that registered with it.
    pub used_by: Option<String>,
    /// The node name (or pattern) it admits.
    pub node_name: String,
    /// Whether it may take over a registered node's name.
    pub replace: bool,
}

impl From<allot_store::BootstrapToken> for BootstrapTokenView {
    fn from(t: allot_store::BootstrapToken) -> Self {
        Self {
            id: t.id,
            description: t.description,
            created_by: t.created_by,
            created_at: t.created_at,
            expires_at: t.expires_at,
            used_at: t.used_at,
            used_by: t.used_by,
            node_name: t.node_name,
            replace: t.replace,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedBootstrapToken {
    #[serde(flatten)]
    pub token: BootstrapTokenView,
    /// Give it to the agent (`--bootstrap-token`); shown once.
    pub secret: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RevokedNode {
    pub node: NodeView,
    /// How many of its certificates were current and are now revoked.
    pub certificates_revoked: u64,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// First UTC day, `YYYY-MM-DD` (default: six days before `to`'s last day).
    pub from: Option<chrono::NaiveDate>,
    /// The day after the last, `YYYY-MM-DD` (default: tomorrow, so today is included).
    pub to: Option<chrono::NaiveDate>,
    /// `tenant` (default), `day` (per tenant and day), `job`, or `job,day`.
    #[param(pattern = "^(tenant|day|job|job,day)$")]
    pub by: Option<String>,
    /// Only this tenant (and nothing of its teams).
    pub tenant: Option<String>,
    /// `json` (default) or `csv`.
    #[param(pattern = "^(json|csv)$")]
    pub format: Option<String>,
}

/// One row of a usage report.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageRowView {
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub day: Option<chrono::NaiveDate>,
    /// Whole-GPU hours: a quarter GPU for four hours is one.
    pub gpu_hours: f64,
    /// GPU memory asked for, GiB times hours.
    pub gpu_memory_gib_hours: f64,
    /// MIG compute slices times hours.
    pub mig_slice_hours: f64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    #[schema(value_type = String)]
    pub from: chrono::NaiveDate,
    #[schema(value_type = String)]
    pub to: chrono::NaiveDate,
    pub by: String,
    pub rows: Vec<UsageRowView>,
    pub total_gpu_hours: f64,
}

#[derive(Debug, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SamplesQuery {
    /// `10s` (kept a day; the default) or `5m` (kept 90 days).
    #[param(pattern = "^(10s|5m)$")]
    pub resolution: Option<String>,
    /// How far back, in minutes (default 60; at most 90 days).
    #[param(minimum = 1, maximum = 129_600)]
    pub minutes: Option<u32>,
}

impl SamplesQuery {
    /// The resolution in seconds and the start of the window, checked.
    pub fn window(&self, now: DateTime<Utc>) -> Result<(i64, DateTime<Utc>), crate::ApiError> {
        let resolution = match self.resolution.as_deref() {
            None | Some("10s") => 10,
            Some("5m") => 300,
            Some(other) => {
                return Err(crate::ApiError::malformed(
                    "resolution",
                    format!("unknown resolution `{other}` (10s or 5m)"),
                ));
            }
        };
        let minutes = self.minutes.unwrap_or(60);
        if !(1..=90 * 24 * 60).contains(&minutes) {
            return Err(crate::ApiError::malformed(
                "minutes",
                "must be from 1 to 129600 (90 days)",
            ));
        }
        Ok((
            resolution,
            now - chrono::Duration::minutes(i64::from(minutes)),
        ))
    }
}

/// A job's averages over one bucket.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobSampleView {
    /// The bucket's start.
    pub at: DateTime<Utc>,
    /// The fraction of its GPUs' time the job kept busy, 0 to 1 (averaged over its GPUs).
    pub utilization: f64,
    /// GPU memory it held, all its GPUs together.
    pub memory_used_bytes: u64,
}

/// A GPU's averages over one bucket.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GpuSampleView {
    /// The bucket's start.
    pub at: DateTime<Utc>,
    /// Busy fraction, 0 to 1.
    pub utilization: f64,
    pub memory_used_bytes: u64,
    pub power_watts: f64,
    pub temperature_c: f64,
    /// PCIe and NVLink data traffic, bytes per second (bucket means).
    pub pcie_rx_bytes_per_s: f64,
    pub pcie_tx_bytes_per_s: f64,
    pub nvlink_rx_bytes_per_s: f64,
    pub nvlink_tx_bytes_per_s: f64,
    /// Every reason the GPU's clocks were held down in the bucket (NVML's names).
    pub throttle_reasons: Vec<String>,
    /// ECC errors since the driver loaded, as last sampled in the bucket.
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
}
