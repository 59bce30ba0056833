//! Tenants and their quotas.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{ValidationError, Violations};
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

/// Per-tenant caps. `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Quota {
    /// Most GPUs the tenant's running and scheduled jobs may hold at once.
    pub max_gpus: Option<u32>,
    /// Most GPU memory (bytes, summed over the GPUs held) the tenant may hold at once.
    pub max_gpu_memory_bytes: Option<u64>,
}

impl Quota {
    pub fn validate(&self, prefix: &str) -> Result<(), ValidationError> {
        let mut v = Violations::default();
        if let Some(g) = self.max_gpus {
            v.check(
                g <= MAX_GPUS,
                format!("{prefix}max_gpus"),
                format!("must be at most {MAX_GPUS}"),
            );
        }
        if let Some(m) = self.max_gpu_memory_bytes {
            v.check(
                m <= MAX_BYTES,
                format!("{prefix}max_gpu_memory_bytes"),
                "must be at most 1 PiB",
            );
        }
        v.into_result()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tenant {
    pub id: String,
    pub name: TenantName,
    pub quota: Quota,
    pub created_at: DateTime<Utc>,
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
            max_gpus: Some(MAX_GPUS + 1),
            max_gpu_memory_bytes: Some(MAX_BYTES + 1),
        };
        let err = q.validate("quota.").expect_err("absurd");
        let fields: Vec<_> = err.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["quota.max_gpus", "quota.max_gpu_memory_bytes"]);
    }
}
