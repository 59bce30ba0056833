//! The API's wire types: request bodies (strict: unknown fields are rejected) and responses.

use std::collections::BTreeMap;

use allot_domain::{ApiToken, GpuDevice, Job, JobEvent, Node, PendingReason, Quota, Role, Tenant};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Per-tenant caps; an absent field means unlimited.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    /// Most GPUs the tenant's jobs may hold at once.
    #[schema(maximum = 100000)]
    pub max_gpus: Option<u32>,
    /// Most GPU memory, in bytes, summed over the GPUs held.
    pub max_gpu_memory_bytes: Option<u64>,
}

impl From<QuotaBody> for Quota {
    fn from(q: QuotaBody) -> Self {
        Quota {
            max_gpus: q.max_gpus,
            max_gpu_memory_bytes: q.max_gpu_memory_bytes,
        }
    }
}

impl From<Quota> for QuotaBody {
    fn from(q: Quota) -> Self {
        QuotaBody {
            max_gpus: q.max_gpus,
            max_gpu_memory_bytes: q.max_gpu_memory_bytes,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// DNS-label style: lowercase letters, digits and `-`, starting with a letter.
    pub name: String,
    #[serde(default)]
    pub quota: QuotaBody,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    pub id: String,
    pub name: String,
    pub quota: QuotaBody,
    pub created_at: DateTime<Utc>,
}

impl From<Tenant> for TenantView {
    fn from(t: Tenant) -> Self {
        Self {
            id: t.id,
            name: t.name.to_string(),
            quota: t.quota.into(),
            created_at: t.created_at,
        }
    }
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
    /// Whole GPUs (0 for a CPU-only job).
    #[serde(default = "default_gpus")]
    #[schema(default = 1, maximum = 1024)]
    pub gpus: u32,
    /// Minimum memory of each GPU, in bytes.
    pub gpu_memory_bytes: Option<u64>,
    /// Program and arguments, run directly (no shell).
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Absolute working directory on the node; the job's own directory when absent.
    pub workdir: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PendingReasonView {
    /// Stable code, e.g. `TenantGpuCap`, `InsufficientGpus`, `NoReadyNodes`.
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
    pub tenant: String,
    pub name: String,
    /// pending, scheduled, running, succeeded, failed or cancelled.
    pub state: String,
    pub gpus: u32,
    pub gpu_memory_bytes: Option<u64>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    /// Why a pending job waits.
    pub pending_reason: Option<PendingReasonView>,
    pub node_id: Option<String>,
    pub gpu_uuids: Vec<String>,
    pub cancel_requested: bool,
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
            id: j.id,
            tenant: j.spec.tenant.to_string(),
            name: j.spec.name,
            state: j.state.to_string(),
            gpus: j.spec.gpus,
            gpu_memory_bytes: j.spec.gpu_memory_bytes,
            command: j.spec.command,
            env: j.spec.env,
            workdir: j.spec.workdir,
            pending_reason: j.pending_reason.map(Into::into),
            node_id: j.node_id,
            gpu_uuids: j.gpu_uuids,
            cancel_requested: j.cancel_requested,
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
    pub state: Option<String>,
    /// Only jobs placed on this node.
    pub node: Option<String>,
    /// Page size, 1–500 (default 50).
    pub limit: Option<u32>,
    pub page_token: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GpuView {
    pub uuid: String,
    pub index: u32,
    pub model: String,
    pub memory_bytes: u64,
    pub healthy: bool,
}

impl From<GpuDevice> for GpuView {
    fn from(g: GpuDevice) -> Self {
        Self {
            uuid: g.uuid,
            index: g.index,
            model: g.model,
            memory_bytes: g.memory_bytes,
            healthy: g.healthy,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub id: String,
    pub name: String,
    /// `ready` while the lease is current, `not-ready` after it lapses.
    pub status: String,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
    pub lease_expires_at: DateTime<Utc>,
    pub agent_version: String,
    pub gpu_backend: String,
    pub gpus: Vec<GpuView>,
}

impl NodeView {
    pub fn new(n: Node, now: DateTime<Utc>) -> Self {
        let status = match n.status(now) {
            allot_domain::NodeStatus::Ready => "ready",
            allot_domain::NodeStatus::NotReady => "not-ready",
        };
        Self {
            status: status.to_owned(),
            id: n.id,
            name: n.name,
            registered_at: n.registered_at,
            last_heartbeat_at: n.last_heartbeat_at,
            lease_expires_at: n.lease_expires_at,
            agent_version: n.agent_version,
            gpu_backend: n.gpu_backend,
            gpus: n.gpus.into_iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token is for, e.g. `ci-pipeline`.
    pub name: String,
    /// The tenant the token acts in; required for every role except `admin`.
    pub tenant: Option<String>,
    #[schema(value_type = String, example = "member")]
    pub role: Role,
    /// Lifetime in seconds (at most ten years); no expiry when absent.
    pub expires_in_seconds: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub tenant: Option<String>,
    /// viewer, member, tenant-admin or admin.
    pub role: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
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
