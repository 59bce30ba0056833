//! Scheduling: which pending job goes where, and why the others wait.
//!
//! Pure functions over a snapshot of the cluster; no IO, no clock. The control plane builds
//! a [`Snapshot`] from the store, calls [`schedule`], and persists the [`Decision`]s.
//! Placement policies implement [`Placement`]; [`FirstFit`] is the walking skeleton's.

pub mod engine;
mod first_fit;
pub mod openb;
pub mod quota;

use std::collections::{HashMap, HashSet};

use allot_domain::{PendingReason, Quota, format_bytes};

pub use first_fit::FirstFit;

/// A GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuView {
    pub uuid: String,
    pub model: String,
    pub memory_bytes: u64,
    pub healthy: bool,
}

/// A node that can take work (its lease is current).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    pub name: String,
    pub gpus: Vec<GpuView>,
}

/// A job already holding GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub tenant_id: String,
    pub node_id: String,
    pub gpu_uuids: Vec<String>,
}

/// A job waiting to be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub job_id: String,
    pub tenant_id: String,
    pub tenant_name: String,
    pub gpus: u32,
    /// Minimum memory of each GPU.
    pub gpu_memory_bytes: Option<u64>,
}

/// Everything a scheduling pass needs.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeView>,
    pub allocations: Vec<Allocation>,
    pub quotas: HashMap<String, Quota>,
    /// Pending jobs, oldest first.
    pub pending: Vec<Request>,
}

/// Where a job goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub node_id: String,
    pub gpu_uuids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Place {
        job_id: String,
        placed: Placed,
    },
    Wait {
        job_id: String,
        reason: PendingReason,
    },
}

/// Free capacity during one pass: GPUs not held by any allocation or earlier decision.
#[derive(Debug, Clone)]
pub struct FreeGpus<'a> {
    nodes: &'a [NodeView],
    taken: HashSet<String>,
}

impl<'a> FreeGpus<'a> {
    fn new(nodes: &'a [NodeView], allocations: &[Allocation]) -> Self {
        let taken = allocations
            .iter()
            .flat_map(|a| a.gpu_uuids.iter().cloned())
            .collect();
        Self { nodes, taken }
    }

    /// Nodes with their free, healthy GPUs, in snapshot order.
    pub fn nodes(&self) -> impl Iterator<Item = (&'a NodeView, Vec<&'a GpuView>)> + '_ {
        self.nodes.iter().map(|n| {
            let free = n
                .gpus
                .iter()
                .filter(|g| g.healthy && !self.taken.contains(&g.uuid))
                .collect();
            (n, free)
        })
    }

    fn take(&mut self, placed: &Placed) {
        self.taken.extend(placed.gpu_uuids.iter().cloned());
    }

    fn memory_of(&self, uuids: &[String]) -> u64 {
        self.nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| uuids.contains(&g.uuid))
            .map(|g| g.memory_bytes)
            .sum()
    }
}

/// A placement policy: choose GPUs for one request from what is free, or say why not.
pub trait Placement {
    fn place(&self, request: &Request, free: &FreeGpus<'_>) -> Result<Placed, PendingReason>;
}

#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    gpus: u64,
    gpu_memory_bytes: u64,
}

/// One scheduling pass: pending jobs in order, each placed if its tenant's caps and the free
/// capacity allow, otherwise left waiting with a reason.
pub fn schedule(policy: &dyn Placement, snapshot: &Snapshot) -> Vec<Decision> {
    let mut free = FreeGpus::new(&snapshot.nodes, &snapshot.allocations);
    let mut usage: HashMap<&str, Usage> = HashMap::new();
    for a in &snapshot.allocations {
        let u = usage.entry(a.tenant_id.as_str()).or_default();
        u.gpus += a.gpu_uuids.len() as u64;
        u.gpu_memory_bytes += free.memory_of(&a.gpu_uuids);
    }
    let mut decisions = Vec::with_capacity(snapshot.pending.len());
    for req in &snapshot.pending {
        let quota = snapshot
            .quotas
            .get(&req.tenant_id)
            .copied()
            .unwrap_or_default();
        let used = usage
            .get(req.tenant_id.as_str())
            .copied()
            .unwrap_or_default();
        if let Some(max) = quota.max_gpus
            && used.gpus + u64::from(req.gpus) > u64::from(max)
        {
            decisions.push(Decision::Wait {
                job_id: req.job_id.clone(),
                reason: PendingReason {
                    code: "TenantGpuCap".into(),
                    message: format!(
                        "tenant {}: {} of {} GPUs in use (cap {}); request {}",
                        req.tenant_name, used.gpus, max, max, req.gpus
                    ),
                },
            });
            continue;
        }
        let placed = match policy.place(req, &free) {
            Ok(p) => p,
            Err(reason) => {
                decisions.push(Decision::Wait {
                    job_id: req.job_id.clone(),
                    reason,
                });
                continue;
            }
        };
        let mem = free.memory_of(&placed.gpu_uuids);
        if let Some(max) = quota.max_gpu_memory_bytes
            && used.gpu_memory_bytes + mem > max
        {
            decisions.push(Decision::Wait {
                job_id: req.job_id.clone(),
                reason: PendingReason {
                    code: "TenantGpuMemoryCap".into(),
                    message: format!(
                        "tenant {}: {} of {} GPU memory in use (cap); request would hold {}",
                        req.tenant_name,
                        format_bytes(used.gpu_memory_bytes),
                        format_bytes(max),
                        format_bytes(mem)
                    ),
                },
            });
            continue;
        }
        free.take(&placed);
        let u = usage.entry(req.tenant_id.as_str()).or_default();
        u.gpus += u64::from(req.gpus);
        u.gpu_memory_bytes += mem;
        decisions.push(Decision::Place {
            job_id: req.job_id.clone(),
            placed,
        });
    }
    decisions
}

#[cfg(test)]
mod tests;
