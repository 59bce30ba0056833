//! What jobs use by name: tenant secrets, registry credentials and volumes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
