//! Tenants and their quotas.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{ValidationError, Violations};
use crate::isolation::Isolation;
use crate::quantity::MAX_BYTES;

/// A tenant's name: 1–63 characters of lowercase letters, digits and `-`, starting with a
/// letter and not ending with `-` (a DNS label, so it can name namespaces and metrics).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct TenantName(String);

impl TenantName {
    pub fn parse(field: &str, raw: &str) -> Result<Self, ValidationError> {
        let reason = if raw.is_empty() {
            Some("must not be empty")
        } else if raw.len() > 63 {
            Some("must be at most 63 characters")
        } else if !raw.starts_with(|c: char| c.is_ascii_lowercase()) {
            Some("must start with a lowercase letter")
        } else if raw.ends_with('-') {
            Some("must not end with `-`")
        } else if !raw
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            Some("may contain only lowercase letters, digits and `-`")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(ValidationError::single(field, reason)),
            None => Ok(Self(raw.to_owned())),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Upper bound on GPUs in any single quota or request: beyond it a number is a mistake.
pub const MAX_GPUS: u32 = 100_000;
/// Upper bound on CPUs (in milli) in any quota: beyond it a number is a mistake.
pub const MAX_CPU_MILLI: u64 = 100_000_000;
/// Upper bound on an over-quota weight.
pub const MAX_WEIGHT: u32 = 10_000;

/// The largest monthly GPU-hour budget, in thousandths of a GPU-hour.
pub const MAX_GPU_HOUR_BUDGET_MILLI: u64 = 1_000_000_000_000;

/// An amount of each resource a quota speaks of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    /// GPU share in milli: 1000 is one whole GPU, 7500 is seven and a half.
    pub gpu_milli: u64,
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    /// GPU memory (per GPU asked for, times the GPUs).
    pub gpu_memory_bytes: u64,
}

/// A hard limit per resource; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ResourceLimits {
    pub gpu_milli: Option<u64>,
    pub cpu_milli: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub gpu_memory_bytes: Option<u64>,
}

/// A tenant's (or team's) share of the cluster.
///
/// `guaranteed` is held for the tenant (and its children) whenever it asks and lent to
/// others while idle; the scheduler takes it back by preempting borrowers. `limit` is never
/// exceeded, borrowing included. `weight` sets the share of spare capacity among tenants
/// that compete for it. `min_isolation` is the least isolation its jobs run at.
/// `mig_limits` caps the MIG instances of each profile (by name) the tenant and its
/// children hold at once; a profile not named is unlimited. `gpu_hour_budget_milli` caps
/// the GPU-hours (in thousandths) the tenant and its children use per calendar month (UTC):
/// once spent, their pending jobs wait for the next month (running ones finish).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quota {
    pub guaranteed: Resources,
    pub limit: ResourceLimits,
    pub weight: u32,
    pub min_isolation: Isolation,
    pub mig_limits: std::collections::BTreeMap<String, u32>,
    pub gpu_hour_budget_milli: Option<u64>,
}

impl Default for Quota {
    fn default() -> Self {
        Self {
            guaranteed: Resources::default(),
            limit: ResourceLimits::default(),
            weight: 1,
            min_isolation: Isolation::Shared,
            mig_limits: std::collections::BTreeMap::new(),
            gpu_hour_budget_milli: None,
        }
    }
}

/// One resource of a quota as checked: its field, guarantee, limit, most allowed, that most
/// in words, and how an amount of it is said.
type QuotaCheck<'a> = (&'a str, u64, Option<u64>, u64, &'a str, fn(u64) -> String);

impl Quota {
    /// Checks each number on its own; whether guarantees fit the parent's is the
    /// scheduler's quota tree to say.
    pub fn validate(&self, prefix: &str) -> Result<(), ValidationError> {
        let mut v = Violations::default();
        let max_gpu_milli = u64::from(MAX_GPUS) * 1000;
        let g = &self.guaranteed;
        let l = &self.limit;
        let checks: [QuotaCheck<'_>; 4] = [
            (
                "gpu_milli",
                g.gpu_milli,
                l.gpu_milli,
                max_gpu_milli,
                "100000 GPUs",
                |m| format!("{} GPUs", crate::format_milli(m)),
            ),
            (
                "cpu_milli",
                g.cpu_milli,
                l.cpu_milli,
                MAX_CPU_MILLI,
                "100000 CPUs",
                |m| format!("{} CPUs", crate::format_milli(m)),
            ),
            (
                "memory_bytes",
                g.memory_bytes,
                l.memory_bytes,
                MAX_BYTES,
                "1 PiB",
                crate::format_bytes,
            ),
            (
                "gpu_memory_bytes",
                g.gpu_memory_bytes,
                l.gpu_memory_bytes,
                MAX_BYTES,
                "1 PiB",
                crate::format_bytes,
            ),
        ];
        for (name, guaranteed, limit, max, shown, unit) in checks {
            v.check(
                guaranteed <= max,
                format!("{prefix}guaranteed.{name}"),
                format!("must be at most {shown}"),
            );
            if let Some(limit) = limit {
                v.check(
                    limit <= max,
                    format!("{prefix}limit.{name}"),
                    format!("must be at most {shown}"),
                );
                v.check(
                    guaranteed <= limit,
                    format!("{prefix}guaranteed.{name}"),
                    format!("must not be above the limit ({})", unit(limit)),
                );
            }
        }
        v.check(
            (1..=MAX_WEIGHT).contains(&self.weight),
            format!("{prefix}weight"),
            format!("must be from 1 to {MAX_WEIGHT}"),
        );
        if let Some(b) = self.gpu_hour_budget_milli {
            v.check(
                b <= MAX_GPU_HOUR_BUDGET_MILLI,
                format!("{prefix}gpu_hour_budget"),
                "must be from 0 to 1000000000 GPU-hours",
            );
        }
        for (profile, max) in &self.mig_limits {
            v.check(
                crate::mig::profile_named(profile).is_some(),
                format!("{prefix}mig_limits.{profile}"),
                "is not a known MIG profile",
            );
            v.check(
                *max <= MAX_GPUS * 7,
                format!("{prefix}mig_limits.{profile}"),
                format!("must be at most {}", MAX_GPUS * 7),
            );
        }
        v.into_result()
    }
}

/// Default and most CPU and memory per job, as a Kubernetes LimitRange: a job that asks for
/// no CPU (or no memory) gets the default, and one asking for more than the maximum is
/// refused. Each is the tenant's own setting; `None` takes its parent's (see
/// [`JobLimits::effective`]). What a job gets is both its reservation (the scheduler places
/// it where that much is free) and its limit (its cgroup's CPU quota and memory limit).
/// And the share of a GPU an auto-sized job (`--gpus auto`) starts at, before anything was
/// measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLimits {
    pub default_cpu_milli: Option<u64>,
    pub default_memory_bytes: Option<u64>,
    pub max_cpu_milli: Option<u64>,
    pub max_memory_bytes: Option<u64>,
    /// Thousandths of a GPU an auto-sized job starts at (its ceiling, when lower).
    pub default_gpu_milli: Option<u64>,
}

/// What applies to one tenant's jobs, its chain and the platform's defaults resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EffectiveJobLimits {
    pub default_cpu_milli: u64,
    pub default_memory_bytes: u64,
    pub max_cpu_milli: Option<u64>,
    pub max_memory_bytes: Option<u64>,
    pub default_gpu_milli: u64,
}

impl JobLimits {
    /// CPU a job gets where no tenant up its chain sets a default: one CPU, as Slurm gives a
    /// task that names none.
    pub const PLATFORM_DEFAULT_CPU_MILLI: u64 = 1000;
    /// Memory a job gets where no tenant up its chain sets a default.
    pub const PLATFORM_DEFAULT_MEMORY_BYTES: u64 = 2 << 30;
    /// The share an auto-sized job starts at where no tenant up its chain sets one: a tenth
    /// of a GPU. Its sizer grows it within seconds of its launches waiting for it, and it
    /// runs elastic (idle time is its to use), so starting small costs little and packs
    /// new services tightly until they are measured.
    pub const PLATFORM_DEFAULT_GPU_MILLI: u64 = 100;

    /// Checks each number on its own, and a default above the tenant's own maximum.
    pub fn validate(&self, prefix: &str) -> Result<(), ValidationError> {
        let mut v = Violations::default();
        let cpus = |m: u64| format!("{} CPUs", crate::format_milli(m));
        for (name, value) in [
            ("default_cpu_milli", self.default_cpu_milli),
            ("max_cpu_milli", self.max_cpu_milli),
        ] {
            if let Some(m) = value {
                v.check(
                    (1..=MAX_CPU_MILLI).contains(&m),
                    format!("{prefix}{name}"),
                    "must be from 1 to 100000000 (a thousandth of a CPU to 100000 CPUs)",
                );
            }
        }
        for (name, value) in [
            ("default_memory_bytes", self.default_memory_bytes),
            ("max_memory_bytes", self.max_memory_bytes),
        ] {
            if let Some(b) = value {
                v.check(
                    (1..=MAX_BYTES).contains(&b),
                    format!("{prefix}{name}"),
                    "must be from 1 byte to 1 PiB",
                );
            }
        }
        if let Some(m) = self.default_gpu_milli {
            v.check(
                (u64::from(crate::MIN_SIZED_GPU_MILLI)..=u64::from(crate::GPU_MILLI)).contains(&m),
                format!("{prefix}default_gpu_milli"),
                format!(
                    "must be from {} to {} (a fiftieth of a GPU, the smallest share Allot \
                     sizes a job to, to a whole one)",
                    crate::MIN_SIZED_GPU_MILLI,
                    crate::GPU_MILLI
                ),
            );
        }
        if let (Some(d), Some(m)) = (self.default_cpu_milli, self.max_cpu_milli) {
            v.check(
                d <= m,
                format!("{prefix}default_cpu_milli"),
                format!("must not be above the maximum ({})", cpus(m)),
            );
        }
        if let (Some(d), Some(m)) = (self.default_memory_bytes, self.max_memory_bytes) {
            v.check(
                d <= m,
                format!("{prefix}default_memory_bytes"),
                format!("must not be above the maximum ({})", crate::format_bytes(m)),
            );
        }
        v.into_result()
    }

    /// What applies to `tenant`'s jobs, its parents found among `all`: each default is the
    /// nearest one set on the tenant or up its chain, else the platform's; each maximum is
    /// the least set anywhere on the chain (a team is held to every maximum above it); and
    /// a default is never above the maximum that applies.
    pub fn effective(tenant: &Tenant, all: &[Tenant]) -> EffectiveJobLimits {
        let mut chain = vec![tenant];
        let mut next = tenant.parent_id.as_deref();
        while let Some(id) = next {
            // A cycle (which the tree never has) ends the walk rather than looping.
            let Some(t) = all.iter().find(|t| t.id == id) else {
                break;
            };
            if chain.iter().any(|c| c.id == t.id) {
                break;
            }
            chain.push(t);
            next = t.parent_id.as_deref();
        }
        let nearest =
            |f: fn(&JobLimits) -> Option<u64>| chain.iter().find_map(|t| f(&t.job_limits));
        let least =
            |f: fn(&JobLimits) -> Option<u64>| chain.iter().filter_map(|t| f(&t.job_limits)).min();
        let max_cpu_milli = least(|l| l.max_cpu_milli);
        let max_memory_bytes = least(|l| l.max_memory_bytes);
        let clamp = |d: u64, max: Option<u64>| max.map_or(d, |m| d.min(m));
        EffectiveJobLimits {
            default_cpu_milli: clamp(
                nearest(|l| l.default_cpu_milli).unwrap_or(Self::PLATFORM_DEFAULT_CPU_MILLI),
                max_cpu_milli,
            ),
            default_memory_bytes: clamp(
                nearest(|l| l.default_memory_bytes).unwrap_or(Self::PLATFORM_DEFAULT_MEMORY_BYTES),
                max_memory_bytes,
            ),
            max_cpu_milli,
            max_memory_bytes,
            default_gpu_milli: nearest(|l| l.default_gpu_milli)
                .unwrap_or(Self::PLATFORM_DEFAULT_GPU_MILLI),
        }
    }
}

impl EffectiveJobLimits {
    /// A job's CPU and memory as asked (0: not asked) with the defaults given where it
    /// asked for none; above a maximum is refused naming the field.
    pub fn apply(&self, cpu_milli: u32, memory_bytes: u64) -> Result<(u32, u64), ValidationError> {
        let mut v = Violations::default();
        let cpu = if cpu_milli == 0 {
            u32::try_from(self.default_cpu_milli).unwrap_or(u32::MAX)
        } else {
            cpu_milli
        };
        let memory = if memory_bytes == 0 {
            self.default_memory_bytes
        } else {
            memory_bytes
        };
        if let Some(max) = self.max_cpu_milli {
            v.check(
                u64::from(cpu) <= max,
                "cpu_milli",
                format!(
                    "must be at most {} CPUs, the most a job of this tenant may have",
                    crate::format_milli(max)
                ),
            );
        }
        if let Some(max) = self.max_memory_bytes {
            v.check(
                memory <= max,
                "memory_bytes",
                format!(
                    "must be at most {}, the most a job of this tenant may have",
                    crate::format_bytes(max)
                ),
            );
        }
        v.into_result().map(|()| (cpu, memory))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tenant {
    pub id: String,
    pub name: TenantName,
    /// The tenant this one is a team of; its quota nests within the parent's.
    pub parent_id: Option<String>,
    pub quota: Quota,
    /// What its jobs may run and where.
    pub policy: crate::TenantPolicy,
    /// The CPU and memory its jobs get when they ask for none, and the most one may ask
    /// for (unset: its parent's, then the platform's).
    pub job_limits: JobLimits,
    /// Its host uid range on every node: container uids 0..65536 of its jobs are host uids
    /// `Tenant::UID_FIRST + uid_slot × 65536` on. The control plane gives each tenant its
    /// own, the same on every node, so no two tenants share a host uid and files a tenant
    /// writes to shared storage on one node are its own on the next.
    pub uid_slot: u32,
    pub created_at: DateTime<Utc>,
}

impl Tenant {
    /// The first host uid of slot 0: above every ordinary user's and the host's root.
    pub const UID_FIRST: u32 = 1 << 20;
    /// Host uids per tenant.
    pub const UID_RANGE: u32 = 65536;
    /// Slots that fit below 2^32.
    pub const UID_SLOTS: u32 = (u32::MAX - Self::UID_FIRST) / Self::UID_RANGE;
}

/// The ids of `root` and every tenant below it among `all` (its teams, their teams, …),
/// `root` first.
pub fn subtree(all: &[Tenant], root: &str) -> Vec<String> {
    let mut out = vec![root.to_owned()];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].clone();
        for t in all {
            if t.parent_id.as_deref() == Some(parent.as_str()) && !out.contains(&t.id) {
                out.push(t.id.clone());
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_follow_dns_label_rules() {
        assert!(TenantName::parse("name", "team-a").is_ok());
        assert!(TenantName::parse("name", "a1").is_ok());
        for bad in ["", "A", "1team", "team-", "team_a", "tëam", &"a".repeat(64)] {
            let err = TenantName::parse("name", bad).expect_err(bad);
            assert_eq!(err.0[0].field, "name");
        }
    }

    #[test]
    fn quota_rejects_absurd_values() {
        let q = Quota {
            guaranteed: Resources {
                gpu_milli: 9000,
                ..Resources::default()
            },
            limit: ResourceLimits {
                gpu_milli: Some(8000),
                memory_bytes: Some(MAX_BYTES + 1),
                ..ResourceLimits::default()
            },
            weight: 0,
            min_isolation: Isolation::Shared,
            mig_limits: [("1g.18gb".to_owned(), 2), ("9g.1tb".to_owned(), 1)].into(),
            gpu_hour_budget_milli: Some(u64::MAX),
        };
        let err = q.validate("quota.").expect_err("absurd");
        let fields: Vec<_> = err.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "quota.guaranteed.gpu_milli",
                "quota.limit.memory_bytes",
                "quota.weight",
                "quota.gpu_hour_budget",
                "quota.mig_limits.9g.1tb"
            ]
        );
        assert_eq!(Quota::default().validate(""), Ok(()));
    }

    fn tenant(id: &str, parent: Option<&str>, job_limits: JobLimits) -> Tenant {
        Tenant {
            id: id.to_owned(),
            name: TenantName::parse("name", id).expect("name"),
            parent_id: parent.map(str::to_owned),
            quota: Quota::default(),
            policy: Default::default(),
            job_limits,
            uid_slot: 0,
            created_at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn job_limits_inherit_from_the_parent_then_the_platform() {
        let org = tenant(
            "org",
            None,
            JobLimits {
                default_memory_bytes: Some(8 << 30),
                max_cpu_milli: Some(4000),
                max_memory_bytes: Some(16 << 30),
                ..JobLimits::default()
            },
        );
        let team = tenant(
            "team",
            Some("org"),
            JobLimits {
                default_cpu_milli: Some(2000),
                // Above the parent's maximum: the parent's holds.
                max_cpu_milli: Some(8000),
                default_gpu_milli: Some(250),
                ..JobLimits::default()
            },
        );
        let lone = tenant("lone", None, JobLimits::default());
        let all = [org.clone(), team.clone(), lone.clone()];
        let e = JobLimits::effective(&team, &all);
        assert_eq!(
            e,
            EffectiveJobLimits {
                default_cpu_milli: 2000,
                default_memory_bytes: 8 << 30,
                max_cpu_milli: Some(4000),
                max_memory_bytes: Some(16 << 30),
                default_gpu_milli: 250,
            }
        );
        let platform = JobLimits::effective(&lone, &all);
        assert_eq!(
            platform.default_gpu_milli,
            JobLimits::PLATFORM_DEFAULT_GPU_MILLI
        );
        assert_eq!(
            platform.default_cpu_milli,
            JobLimits::PLATFORM_DEFAULT_CPU_MILLI
        );
        assert_eq!(
            platform.default_memory_bytes,
            JobLimits::PLATFORM_DEFAULT_MEMORY_BYTES
        );
        assert_eq!(
            (platform.max_cpu_milli, platform.max_memory_bytes),
            (None, None)
        );
        // A default is never above the maximum that applies.
        let small = tenant(
            "small",
            Some("org"),
            JobLimits {
                max_memory_bytes: Some(1 << 30),
                ..JobLimits::default()
            },
        );
        assert_eq!(
            JobLimits::effective(&small, &all).default_memory_bytes,
            1 << 30
        );
    }

    #[test]
    fn job_limits_apply_defaults_and_refuse_above_the_maximum() {
        let e = EffectiveJobLimits {
            default_cpu_milli: 1500,
            default_memory_bytes: 4 << 30,
            max_cpu_milli: Some(4000),
            max_memory_bytes: Some(8 << 30),
            default_gpu_milli: 100,
        };
        assert_eq!(e.apply(0, 0), Ok((1500, 4 << 30)));
        assert_eq!(e.apply(250, 1 << 20), Ok((250, 1 << 20)));
        assert_eq!(e.apply(4000, 8 << 30), Ok((4000, 8 << 30)));
        let err = e.apply(4001, 9 << 30).expect_err("above both");
        let fields: Vec<_> = err.0.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["cpu_milli", "memory_bytes"]);
        assert!(err.0[0].reason.contains("4 CPUs"), "{}", err.0[0].reason);
    }

    #[test]
    fn job_limits_refuse_a_default_above_their_maximum() {
        let l = JobLimits {
            default_cpu_milli: Some(8000),
            max_cpu_milli: Some(4000),
            default_memory_bytes: Some(0),
            max_memory_bytes: None,
            default_gpu_milli: Some(1001),
        };
        let err = l.validate("").expect_err("bad");
        let fields: Vec<_> = err.0.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "default_memory_bytes",
                "default_gpu_milli",
                "default_cpu_milli"
            ]
        );
        assert_eq!(JobLimits::default().validate(""), Ok(()));
    }
}
