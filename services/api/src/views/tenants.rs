//! Tenants: their quotas, limits, policy and figures.

use allot_domain::{Isolation, Quota, ResourceLimits, Resources, Tenant};
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
