//! Nodes and their GPUs, and node enrollment (bootstrap tokens, revocation).

use std::collections::BTreeMap;

use allot_domain::{GpuDevice, Job, Node, NodeStatus};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
    /// An operator drained it: why, and until when its jobs may finish (then they are
    /// requeued elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainView>,
    /// Jobs placed on it, scheduled or running (with `telemetry.read`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<u32>,
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
            drain: n.drain.map(|d| DrainView {
                reason: d.reason,
                deadline: d.deadline,
            }),
            jobs: None,
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
        let jobs = holding
            .iter()
            .filter(|j| j.node_id.as_deref() == Some(n.id.as_str()))
            .count();
        let mut view = Self::new(n, now);
        view.jobs = Some(u32::try_from(jobs).unwrap_or(u32::MAX));
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

/// A drain, as `sinfo -R` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DrainView {
    /// Why, as the operator said.
    pub reason: String,
    /// Its running jobs may finish until then; after it they are requeued elsewhere.
    pub deadline: DateTime<Utc>,
}

/// How a node is drained.
#[derive(Debug, Default, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DrainQuery {
    /// Why (shown beside the node, as `sinfo -R` shows it), at most 512 characters.
    #[param(max_length = 512)]
    pub reason: Option<String>,
    /// Seconds its running jobs may finish in before they are requeued elsewhere (0, the
    /// default: at once; at most a week).
    #[param(minimum = 0, maximum = 604_800)]
    pub grace_secs: Option<u64>,
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
