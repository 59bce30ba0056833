//! MIG placement: jobs that ask for a MIG profile run alone on one instance of it. Pure:
//! GPUs in MIG mode (with their current instances), the instances jobs hold, pending MIG
//! jobs and per-profile limits in; placements, repartitions and reasons out.
//!
//! For each pending job, highest priority then oldest first:
//! 1. Limits: the job's tenant and every tenant above it must stay within the instances of
//!    that profile they may hold (held ones, and those planned this pass), and within their
//!    hard limits of GPUs and GPU memory (an instance holds its compute slices of seven and
//!    its memory, as every other job's holdings count; see [`allot_domain::holding`]).
//! 2. A free instance of the profile: placed there, on the GPU holding the most instances
//!    already (packing keeps other GPUs whole for repartitioning).
//! 3. Room for a new instance beside the existing ones: the GPU is repartitioned to the
//!    current layout plus one (nothing is destroyed).
//! 4. Room once the GPU's free instances (of other profiles) go: repartitioned to the held
//!    instances plus one. An idle GPU is rebuilt entirely this way (dynamic MIG).
//!
//! A repartition makes the job wait (`MigRepartitioning`) until the node reports the new
//! instance, which the next pass places it on. Held instances are never in danger: every
//! layout keeps them, and agents refuse to destroy an instance a job runs on.

use std::collections::{BTreeMap, HashMap, HashSet};

use allot_domain::mig::MigGeometry;
use allot_domain::{MigSlot, PendingReason};

/// A GPU in MIG mode.
#[derive(Debug, Clone)]
pub struct MigGpu<'a> {
    pub node_id: &'a str,
    pub node_name: &'a str,
    pub gpu_uuid: &'a str,
    pub geometry: &'static MigGeometry,
    pub instances: &'a [MigSlot],
    /// Ready to take work: its node is ready and reachable, it is healthy and not drained.
    pub usable: bool,
    /// Its node runs jobs in containers (only jobs from images), else as processes (only
    /// jobs without one).
    pub containers: bool,
}

/// A pending job asking for a MIG instance.
#[derive(Debug, Clone)]
pub struct MigJob<'a> {
    pub id: &'a str,
    pub tenant_id: &'a str,
    pub profile: &'a str,
    pub priority: i32,
    /// Submission order: lower is older.
    pub seq: u64,
    /// What it holds once placed, as quotas count it.
    pub held: crate::quota::Amounts,
    /// It runs an image (so only on a node running containers).
    pub image: bool,
}

/// The quota tree and what its queues hold (every job's, MIG or not), for hard limits.
pub struct MigQuota<'t> {
    pub tree: &'t crate::quota::QuotaTree,
    pub usage: crate::quota::Usage,
}

/// An instance a scheduled or running job holds.
#[derive(Debug, Clone)]
pub struct MigHeld<'a> {
    pub tenant_id: &'a str,
    pub profile: &'a str,
    pub instance_uuid: &'a str,
}

/// The tenant tree as far as per-profile limits go.
#[derive(Debug, Clone, Default)]
pub struct MigLimits<'a> {
    /// Tenant id to its parent's.
    pub parent: HashMap<&'a str, Option<&'a str>>,
    /// Tenant id to (its name, its limits by profile name).
    pub limits: HashMap<&'a str, (&'a str, &'a BTreeMap<String, u32>)>,
}

impl<'a> MigLimits<'a> {
    /// The tenant and every tenant above it.
    fn chain(&self, tenant: &'a str) -> Vec<&'a str> {
        let mut out = vec![tenant];
        let mut at = tenant;
        while let Some(Some(p)) = self.parent.get(at) {
            if out.contains(p) {
                break;
            }
            out.push(p);
            at = p;
        }
        out
    }

    fn limit(&self, tenant: &str, profile: &str) -> Option<(&'a str, u32)> {
        let (name, limits) = self.limits.get(tenant)?;
        limits
            .iter()
            .find(|(p, _)| p.eq_ignore_ascii_case(profile))
            .map(|(_, &n)| (*name, n))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigDecision {
    Place {
        job_id: String,
        node_id: String,
        /// The instance's `MIG-…` UUID.
        instance_uuid: String,
        /// The instance's share of its GPU, in milli (compute slices of 7).
        gpu_milli: u32,
    },
    /// Give the GPU this layout (profile id, start slice), then place on it.
    Repartition {
        node_id: String,
        gpu_uuid: String,
        layout: Vec<(u32, u8)>,
    },
    Wait {
        job_id: String,
        reason: PendingReason,
    },
}

fn wait(job: &MigJob<'_>, code: &str, message: String) -> MigDecision {
    MigDecision::Wait {
        job_id: job.id.to_owned(),
        reason: PendingReason {
            code: code.into(),
            message,
        },
    }
}

/// A GPU as this pass changes it.
struct Working<'a> {
    gpu: &'a MigGpu<'a>,
    /// (profile, start, UUID when it exists).
    layout: Vec<(u32, u8, Option<&'a str>)>,
    held: usize,
    changed: bool,
}

impl Working<'_> {
    fn shape(&self) -> Vec<(u32, u8)> {
        self.layout.iter().map(|&(p, s, _)| (p, s)).collect()
    }
}

/// Decides where each pending MIG job goes (see the module docs).
pub fn plan(
    gpus: &[MigGpu<'_>],
    held: &[MigHeld<'_>],
    pending: &[MigJob<'_>],
    limits: &MigLimits<'_>,
    mut quota: Option<&mut MigQuota<'_>>,
) -> Vec<MigDecision> {
    let held_uuids: HashSet<&str> = held.iter().map(|h| h.instance_uuid).collect();
    let mut usage: HashMap<(&str, String), u32> = HashMap::new();
    for h in held {
        for t in limits.chain(h.tenant_id) {
            *usage
                .entry((t, h.profile.to_ascii_lowercase()))
                .or_default() += 1;
        }
    }
    let mut work: Vec<Working<'_>> = gpus
        .iter()
        .filter(|g| g.usable)
        .map(|g| Working {
            gpu: g,
            layout: g
                .instances
                .iter()
                .map(|i| (i.profile, i.start, Some(i.uuid.as_str())))
                .collect(),
            held: g
                .instances
                .iter()
                .filter(|i| held_uuids.contains(i.uuid.as_str()))
                .count(),
            changed: false,
        })
        .collect();
    // Packing: the fullest GPUs first; then a stable order.
    fn order<'w>(w: &'w Working<'_>) -> (std::cmp::Reverse<usize>, &'w str, &'w str) {
        (std::cmp::Reverse(w.held), w.gpu.node_name, w.gpu.gpu_uuid)
    }
    let mut taken: HashSet<&str> = HashSet::new();
    let mut jobs: Vec<&MigJob<'_>> = pending.iter().collect();
    jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.seq));
    let mut out = Vec::new();
    for job in jobs {
        let key = job.profile.to_ascii_lowercase();
        let chain = limits.chain(job.tenant_id);
        if let Some((name, max, used)) = chain.iter().find_map(|t| {
            let (name, max) = limits.limit(t, job.profile)?;
            let used = usage.get(&(*t, key.clone())).copied().unwrap_or(0);
            (used >= max).then_some((name, max, used))
        }) {
            out.push(wait(
                job,
                "MigLimit",
                format!(
                    "tenant {name} holds {used} of the {max} {} instances it may hold",
                    job.profile
                ),
            ));
            continue;
        }
        let queue = quota.as_deref().and_then(|qt| qt.tree.find(job.tenant_id));
        if let (Some(qt), Some(q)) = (quota.as_deref(), queue)
            && let Some(over) = qt.usage.over_limit(qt.tree, q, &job.held)
        {
            out.push(wait(job, "TenantLimit", over.to_string()));
            continue;
        }
        work.sort_by(|a, b| order(a).cmp(&order(b)));
        let offers = |w: &Working<'_>| {
            (w.gpu.containers == job.image)
                .then(|| w.gpu.geometry.profile_named(job.profile))
                .flatten()
        };
        if !work.iter().any(|w| offers(w).is_some()) {
            out.push(wait(
                job,
                "MigUnavailable",
                format!(
                    "no ready GPU in MIG mode offers {} (GPUs enter MIG mode only by an administrator)",
                    job.profile
                ),
            ));
            continue;
        }
        // 2. A free instance.
        let free = work.iter().filter(|w| !w.changed).find_map(|w| {
            let p = offers(w)?;
            w.layout.iter().find_map(|&(id, _, uuid)| {
                let uuid = uuid?;
                (id == p.id && !held_uuids.contains(uuid) && !taken.contains(uuid))
                    .then_some((w, uuid, p))
            })
        });
        if let Some((w, uuid, p)) = free {
            taken.insert(uuid);
            if let (Some(qt), Some(q)) = (quota.as_deref_mut(), queue) {
                qt.usage.take(qt.tree, q, &job.held);
            }
            out.push(MigDecision::Place {
                job_id: job.id.to_owned(),
                node_id: w.gpu.node_id.to_owned(),
                instance_uuid: uuid.to_owned(),
                gpu_milli: u32::from(p.compute_slices) * 1000 / 7,
            });
        } else if let Some((i, id, start)) = work.iter().enumerate().find_map(|(i, w)| {
            // 3. Beside what is there.
            let p = offers(w)?;
            let start = w.gpu.geometry.place(&w.shape(), p.id)?;
            Some((i, p.id, start))
        }) {
            let w = &mut work[i];
            w.layout.push((id, start, None));
            w.changed = true;
            out.push(repartitioning(job, w));
        } else if let Some((i, id, start)) = work.iter().enumerate().find_map(|(i, w)| {
            // 4. In place of free instances.
            let p = offers(w)?;
            let start = w.gpu.geometry.place(&kept(w, &held_uuids, &taken), p.id)?;
            Some((i, p.id, start))
        }) {
            let w = &mut work[i];
            w.layout.retain(|&(_, _, uuid)| {
                uuid.is_none_or(|u| held_uuids.contains(u) || taken.contains(u))
            });
            w.layout.push((id, start, None));
            w.changed = true;
            out.push(repartitioning(job, w));
        } else {
            out.push(wait(
                job,
                "MigUnavailable",
                format!(
                    "every ready GPU in MIG mode that offers {} is full",
                    job.profile
                ),
            ));
            continue;
        }
        for t in &chain {
            *usage.entry((t, key.clone())).or_default() += 1;
        }
    }
    for w in work.iter().filter(|w| w.changed) {
        let mut layout = w.shape();
        layout.sort_by_key(|&(_, start)| start);
        out.push(MigDecision::Repartition {
            node_id: w.gpu.node_id.to_owned(),
            gpu_uuid: w.gpu.gpu_uuid.to_owned(),
            layout,
        });
    }
    out
}

/// The layout once the GPU's free instances go: held ones, ones placed on this pass, and
/// ones planned this pass.
fn kept(w: &Working<'_>, held: &HashSet<&str>, taken: &HashSet<&str>) -> Vec<(u32, u8)> {
    w.layout
        .iter()
        .filter(|&&(_, _, uuid)| uuid.is_none_or(|u| held.contains(u) || taken.contains(u)))
        .map(|&(p, s, _)| (p, s))
        .collect()
}

fn repartitioning(job: &MigJob<'_>, w: &Working<'_>) -> MigDecision {
    wait(
        job,
        "MigRepartitioning",
        format!(
            "creating a {} instance on GPU {} of node {}",
            job.profile, w.gpu.gpu_uuid, w.gpu.node_name
        ),
    )
}

#[cfg(test)]
mod tests;
