//! API tokens for automation and the roles they carry.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a token may do. `Admin` and `Auditor` are platform-wide and have no tenant; the
/// others are scoped to exactly one tenant. The tenant roles and `Admin` form a ladder, each
/// including the rights of those below; `Auditor` stands apart: it reads every audit log and
/// nothing else, and only `Admin` includes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum Role {
    /// Read the tenant's jobs, quota and the node inventory.
    Viewer,
    /// Viewer, plus submit and cancel jobs.
    Member,
    /// Member, plus manage the tenant's API tokens.
    TenantAdmin,
    /// Everything, across all tenants.
    #[serde(rename = "platform-admin")]
    Admin,
    /// Read every audit log, its proofs and exports; nothing else.
    Auditor,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Viewer,
        Role::Member,
        Role::TenantAdmin,
        Role::Admin,
        Role::Auditor,
    ];

    /// Whether this role has every right of `other`.
    pub fn includes(self, other: Role) -> bool {
        let rank = |r: Role| match r {
            Role::Viewer => Some(0),
            Role::Member => Some(1),
            Role::TenantAdmin => Some(2),
            Role::Admin => Some(3),
            Role::Auditor => None,
        };
        match (self, rank(self), rank(other)) {
            (Role::Admin, _, _) => true,
            (_, Some(a), Some(b)) => a >= b,
            _ => self == other,
        }
    }

    /// Platform-wide roles hold no tenant.
    pub fn is_platform(self) -> bool {
        matches!(self, Role::Admin | Role::Auditor)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::TenantAdmin => "tenant-admin",
            Role::Admin => "platform-admin",
            Role::Auditor => "auditor",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "admin" {
            // The name platform admins had before the role set grew.
            return Ok(Role::Admin);
        }
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown role `{s}` (one of viewer, member, tenant-admin, platform-admin, auditor)"
                )
            })
    }
}

/// Read as [`FromStr`] does, so a bad role in a request says which roles there are (not
/// serde's list of variants).
impl TryFrom<String> for Role {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// A stored API token; the secret itself is never kept, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiToken {
    pub id: String,
    pub name: String,
    pub tenant_id: Option<String>,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

impl ApiToken {
    /// Whether the token may authenticate a request at `now`.
    pub fn is_usable(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| now < e)
    }
}

/// A role held by a token or user: platform-wide (`tenant_id` is `None`) for the platform
/// roles, else within one tenant and every tenant below it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RoleBinding {
    pub role: Role,
    pub tenant_id: Option<String>,
}

impl RoleBinding {
    pub fn platform(role: Role) -> Self {
        Self {
            role,
            tenant_id: None,
        }
    }

    pub fn tenant(role: Role, tenant_id: impl Into<String>) -> Self {
        Self {
            role,
            tenant_id: Some(tenant_id.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_role_names_the_roles_there_are() {
        let err = serde_json::from_str::<Role>("\"owner\"")
            .expect_err("no such role")
            .to_string();
        assert!(
            err.contains(
                "unknown role `owner` (one of viewer, member, tenant-admin, platform-admin, auditor)"
            ),
            "{err}"
        );
        assert!(
            !err.contains("variant") && !err.contains("`admin`"),
            "{err}"
        );
        for r in Role::ALL {
            let text = serde_json::to_string(&r).expect("serialize");
            assert_eq!(text, format!("\"{r}\""));
            assert_eq!(serde_json::from_str::<Role>(&text).ok(), Some(r));
        }
    }
}
