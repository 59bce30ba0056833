//! Whether a running job on shares of GPUs can take a new share: it must fit on each of its
//! GPUs beside their other jobs (compute, and memory within the share of a shared GPU's
//! memory jobs may hold, as placement counts it), and within the hard limits of its
//! tenant and every tenant above it. Pure: the control plane serializes the check with its
//! scheduling passes.

use std::collections::HashMap;

use allot_domain::{GPU_MILLI, Job, Node, Share, Tenant};

/// What a job holds of each GPU: (thousandths, bytes of memory).
fn held(job: &Job, gpu_memory: u64) -> (u64, u64) {
    let share = job.share();
    (u64::from(share.gpu_milli), share.memory_on(gpu_memory))
}

/// `Ok` when `job` (one of `holding`) can hold `share` of each of its GPUs; else why not.
pub fn check(
    job: &Job,
    share: Share,
    holding: &[Job],
    nodes: &[Node],
    tenants: &[Tenant],
    limits: &crate::engine::GpuLimits,
) -> Result<(), String> {
    let node = job
        .node_id
        .as_deref()
        .and_then(|id| nodes.iter().find(|n| n.id == id))
        .ok_or_else(|| format!("job {} is not placed on a known node", job.id))?;
    let others: Vec<&Job> = holding
        .iter()
        .filter(|j| j.id != job.id && j.node_id == job.node_id)
        .collect();
    for uuid in &job.gpu_uuids {
        let gpu = node
            .gpus
            .iter()
            .find(|g| g.uuid == *uuid)
            .ok_or_else(|| format!("GPU {uuid} is no longer on node {}", node.name))?;
        let (milli, memory) = others
            .iter()
            .filter(|j| j.gpu_uuids.contains(uuid))
            .map(|j| held(j, gpu.memory_bytes))
            .fold((0, 0), |(m, b), (jm, jb)| (m + jm, b + jb));
        let want = u64::from(share.gpu_milli);
        if milli + want > u64::from(GPU_MILLI) {
            return Err(format!(
                "GPU {uuid} has {} of a GPU free beside its other jobs, not {}",
                allot_domain::format_milli(u64::from(GPU_MILLI).saturating_sub(milli)),
                allot_domain::format_milli(want)
            ));
        }
        let want_memory = share.memory_on(gpu.memory_bytes);
        if memory + want_memory > gpu.memory_bytes {
            return Err(format!(
                "GPU {uuid} has {} of memory free beside its other jobs, not {}",
                allot_domain::format_bytes(gpu.memory_bytes.saturating_sub(memory)),
                allot_domain::format_bytes(want_memory)
            ));
        }
        // The GPU memory jobs ask for by size, as placement counts it: within the GPU's
        // memory less the reserve kept free on a shared GPU.
        let asked = |j: &Job| j.spec.gpu_memory_bytes.unwrap_or(0);
        let asked_beside: u64 = others
            .iter()
            .filter(|j| j.gpu_uuids.contains(uuid))
            .map(|j| asked(j))
            .sum();
        let budget = limits
            .shared_memory_budget(u32::try_from(gpu.memory_bytes >> 20).unwrap_or(u32::MAX))
            << 20;
        if share.gpu_memory_bytes > 0 && asked_beside + share.gpu_memory_bytes > budget {
            return Err(format!(
                "GPU {uuid} has {} of memory free beside its other jobs (its {} less the {}% \
                 kept free on a shared GPU), not {}",
                allot_domain::format_bytes(budget.saturating_sub(asked_beside)),
                allot_domain::format_bytes(gpu.memory_bytes),
                limits.shared_memory_reserve_pct,
                allot_domain::format_bytes(share.gpu_memory_bytes)
            ));
        }
    }
    // The tenant's and its ancestors' hard limits, for what the job adds.
    let gpus = u64::from(job.spec.gpus);
    let (now_milli, _) = held(job, 0);
    let add_milli = (u64::from(share.gpu_milli) * gpus).saturating_sub(now_milli * gpus);
    let add_memory = (share.gpu_memory_bytes * gpus)
        .saturating_sub(job.spec.gpu_memory_bytes.unwrap_or(0) * gpus);
    if add_milli == 0 && add_memory == 0 {
        return Ok(());
    }
    let parent: HashMap<&str, Option<&str>> = tenants
        .iter()
        .map(|t| (t.id.as_str(), t.parent_id.as_deref()))
        .collect();
    let within = |tenant: &str, root: &str| {
        let mut at = Some(tenant);
        while let Some(t) = at {
            if t == root {
                return true;
            }
            at = parent.get(t).copied().flatten();
        }
        false
    };
    let mut at = Some(job.tenant_id.as_str());
    while let Some(id) = at {
        let Some(t) = tenants.iter().find(|t| t.id == id) else {
            break;
        };
        let subtree: Vec<&Job> = holding
            .iter()
            .filter(|j| within(&j.tenant_id, id))
            .collect();
        if let Some(limit) = t.quota.limit.gpu_milli {
            let used: u64 = subtree
                .iter()
                .map(|j| held(j, 0).0 * u64::from(j.spec.gpus))
                .sum();
            if used + add_milli > limit {
                return Err(format!(
                    "tenant {} may hold {} GPUs and holds {}: {} more is over its limit",
                    t.name,
                    allot_domain::format_milli(limit),
                    allot_domain::format_milli(used),
                    allot_domain::format_milli(add_milli)
                ));
            }
        }
        if let Some(limit) = t.quota.limit.gpu_memory_bytes {
            let used: u64 = subtree
                .iter()
                .map(|j| j.spec.gpu_memory_bytes.unwrap_or(0) * u64::from(j.spec.gpus))
                .sum();
            if used + add_memory > limit {
                return Err(format!(
                    "tenant {} may hold {} of GPU memory and holds {}",
                    t.name,
                    allot_domain::format_bytes(limit),
                    allot_domain::format_bytes(used)
                ));
            }
        }
        at = t.parent_id.as_deref();
    }
    Ok(())
}
