//! API tokens for automation and the roles they carry.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a token may do. `Admin` is platform-wide and has no tenant; the others are scoped to
/// exactly one tenant. Roles are ordered: each includes the rights of those below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Read the tenant's jobs, quota and the node inventory.
    Viewer,
    /// Viewer, plus submit and cancel jobs.
    Member,
    /// Member, plus manage the tenant's API tokens.
    TenantAdmin,
    /// Everything, across all tenants.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Member, Role::TenantAdmin, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::TenantAdmin => "tenant-admin",
            Role::Admin => "admin",
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
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!("unknown role `{s}` (one of viewer, member, tenant-admin, admin)")
            })
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
