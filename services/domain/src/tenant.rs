//! Tenants and their quotas.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;

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

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tenant {
    pub id: String,
    pub name: TenantName,
    /// The tenant this one is a team of; its quota nests within the parent's.
    pub parent_id: Option<String>,
    pub quota: Quota,
    /// What its jobs may run and where.
    pub policy: crate::TenantPolicy,
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
}
