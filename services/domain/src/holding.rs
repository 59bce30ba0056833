//! What jobs hold, and what tenants, nodes and the fleet hold as their sum: one definition,
//! in exact units, that every figure Allot shows is added up from (the API's tenant, node
//! and cluster figures, the portal's pages, the metrics and the scheduler's quotas).
//!
//! - A whole GPU holds all of the GPU: its compute and all of its memory.
//! - A share holds its fraction of the GPU's compute and the GPU memory it asked for.
//! - A MIG instance holds its compute slices of the board's seven, and its memory.
//!
//! GPU compute is counted in [`GpuParts`], 7,000 to a GPU, so that shares in milli and MIG
//! slices in sevenths add up exactly: seven 1g instances hold one GPU, not 0.994 or 0.875.

use std::collections::HashMap;
use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Sub};

use serde::Serialize;

use crate::{GPU_MILLI, GpuDevice, Job, JobState, Node, Tenant};

/// An exact amount of GPU compute: 7,000 parts to a GPU (a milli is 7 parts, a MIG
/// compute slice 1,000).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct GpuParts(pub u64);

impl GpuParts {
    /// One GPU.
    pub const GPU: GpuParts = GpuParts(7_000);
    /// Parts in one milli of a GPU.
    pub const PER_MILLI: u64 = 7;
    /// Parts in one MIG compute slice (a board has seven).
    pub const PER_SLICE: u64 = 1_000;

    pub fn whole(gpus: u64) -> Self {
        GpuParts(gpus * Self::GPU.0)
    }

    pub fn milli(milli: u64) -> Self {
        GpuParts(milli * Self::PER_MILLI)
    }

    /// A MIG instance of `compute_slices` of its board's seven.
    pub fn slices(compute_slices: u8) -> Self {
        GpuParts(u64::from(compute_slices) * Self::PER_SLICE)
    }

    /// In GPUs (exact for whole GPUs and milli shares; sevenths as near as a float is).
    pub fn gpus(self) -> f64 {
        self.0 as f64 / Self::GPU.0 as f64
    }

    /// In milli, rounded to the nearest (what a Prometheus gauge in milli carries).
    pub fn milli_rounded(self) -> u64 {
        (self.0 + Self::PER_MILLI / 2) / Self::PER_MILLI
    }

    pub fn saturating_sub(self, other: GpuParts) -> GpuParts {
        GpuParts(self.0.saturating_sub(other.0))
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for GpuParts {
    /// In GPUs to three decimals, trailing zeros dropped: `2`, `0.25`, `0.143`, `49.5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::format_milli(self.milli_rounded()))
    }
}

impl Add for GpuParts {
    type Output = GpuParts;
    fn add(self, o: GpuParts) -> GpuParts {
        GpuParts(self.0 + o.0)
    }
}

impl AddAssign for GpuParts {
    fn add_assign(&mut self, o: GpuParts) {
        self.0 += o.0;
    }
}

impl Sub for GpuParts {
    type Output = GpuParts;
    fn sub(self, o: GpuParts) -> GpuParts {
        GpuParts(self.0.saturating_sub(o.0))
    }
}

impl Sum for GpuParts {
    fn sum<I: Iterator<Item = GpuParts>>(iter: I) -> GpuParts {
        GpuParts(iter.map(|p| p.0).sum())
    }
}

/// What something holds of each resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Held {
    pub gpu: GpuParts,
    pub gpu_memory_bytes: u64,
    pub cpu_milli: u64,
    pub memory_bytes: u64,
}

impl Add for Held {
    type Output = Held;
    fn add(self, o: Held) -> Held {
        Held {
            gpu: self.gpu + o.gpu,
            gpu_memory_bytes: self.gpu_memory_bytes + o.gpu_memory_bytes,
            cpu_milli: self.cpu_milli + o.cpu_milli,
            memory_bytes: self.memory_bytes + o.memory_bytes,
        }
    }
}

impl AddAssign for Held {
    fn add_assign(&mut self, o: Held) {
        *self = *self + o;
    }
}

impl Sum for Held {
    fn sum<I: Iterator<Item = Held>>(iter: I) -> Held {
        iter.fold(Held::default(), Add::add)
    }
}

/// What one placed job holds of one GPU (or of the GPU a MIG instance is on): its compute
/// and GPU memory there. `gpu` is the device the job's placement names (for a MIG instance,
/// the GPU it is on).
pub fn held_on_gpu(job: &Job, gpu: &GpuDevice) -> (GpuParts, u64) {
    if let Some(profile) = job.spec.mig_profile.as_deref() {
        let p = crate::mig::profile_named(profile);
        return (
            p.map_or(GpuParts(0), |p| GpuParts::slices(p.compute_slices)),
            p.map_or(0, |p| u64::from(p.memory_mib) << 20),
        );
    }
    let share = job.share();
    if share.gpu_milli >= GPU_MILLI {
        (GpuParts::GPU, gpu.memory_bytes)
    } else {
        (
            GpuParts::milli(u64::from(share.gpu_milli)),
            share.gpu_memory_bytes,
        )
    }
}

/// What `job` holds while placed (nothing otherwise), its GPUs looked up among `gpus` (its
/// node's). A GPU its node no longer reports counts as what the job asked for.
pub fn held_by(job: &Job, gpus: &[GpuDevice]) -> Held {
    if !job.state.holds_resources() {
        return Held::default();
    }
    let mut held = Held {
        cpu_milli: u64::from(job.spec.cpu_milli),
        memory_bytes: job.spec.memory_bytes,
        ..Held::default()
    };
    if job.spec.gpus == 0 && job.spec.mig_profile.is_none() {
        return held;
    }
    for uuid in &job.gpu_uuids {
        let (gpu, memory) = match gpus.iter().find(|g| g.holds(uuid)) {
            Some(g) => held_on_gpu(job, g),
            None => unplaced_share(job),
        };
        held.gpu += gpu;
        held.gpu_memory_bytes += memory;
    }
    held
}

/// What a job holds of one GPU that is not known (its node no longer reports it): its share,
/// and the memory it asked for.
fn unplaced_share(job: &Job) -> (GpuParts, u64) {
    if let Some(p) = job
        .spec
        .mig_profile
        .as_deref()
        .and_then(crate::mig::profile_named)
    {
        return (
            GpuParts::slices(p.compute_slices),
            u64::from(p.memory_mib) << 20,
        );
    }
    let share = job.share();
    (
        GpuParts::milli(u64::from(share.gpu_milli.min(GPU_MILLI))),
        share.gpu_memory_bytes,
    )
}

/// A job's size, one definition for every page: replicas × GPUs each = GPUs in all (a
/// job of one replica is just its GPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GangSize {
    pub replicas: u32,
    /// GPUs each replica asks for (a share of one, or a MIG instance's slices of seven).
    pub per_replica: GpuParts,
    pub total: GpuParts,
}

impl GangSize {
    /// From what a job asks for: `gpus` of `gpu_milli` each (whole when absent), or one MIG
    /// instance of `mig_profile`, on each of `replicas`.
    pub fn new(
        replicas: u32,
        gpus: u32,
        gpu_milli: Option<u32>,
        mig_profile: Option<&str>,
    ) -> Self {
        let per_replica = match mig_profile.and_then(crate::mig::profile_named) {
            Some(p) => GpuParts::slices(p.compute_slices),
            None => GpuParts(
                u64::from(gpus) * GpuParts::milli(u64::from(gpu_milli.unwrap_or(GPU_MILLI))).0,
            ),
        };
        let replicas = replicas.max(1);
        GangSize {
            replicas,
            per_replica,
            total: GpuParts(per_replica.0 * u64::from(replicas)),
        }
    }

    pub fn of(spec: &crate::JobSpec) -> Self {
        Self::new(
            spec.replicas,
            spec.gpus,
            spec.gpu_milli,
            spec.mig_profile.as_deref(),
        )
    }
}

impl fmt::Display for GangSize {
    /// `4 × 8 = 32` for a gang, `8` for a job of one replica (in GPUs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.replicas > 1 {
            write!(
                f,
                "{} × {} = {}",
                self.replicas, self.per_replica, self.total
            )
        } else {
            write!(f, "{}", self.total)
        }
    }
}

/// What a tenant holds and how many of its jobs wait and run: its own, and with its teams'
/// (every tenant below it) added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TenantFigures {
    pub held: Held,
    /// Jobs waiting (a gang counts once: it is one job of several replicas).
    pub jobs_pending: u64,
    /// Jobs placed (scheduled or running; a gang once).
    pub jobs_running: u64,
}

impl Add for TenantFigures {
    type Output = TenantFigures;
    fn add(self, o: TenantFigures) -> TenantFigures {
        TenantFigures {
            held: self.held + o.held,
            jobs_pending: self.jobs_pending + o.jobs_pending,
            jobs_running: self.jobs_running + o.jobs_running,
        }
    }
}

/// A tenant's figures, its own and its subtree's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TenantTotals {
    /// Of the tenant's own jobs.
    pub own: TenantFigures,
    /// Of its own and its teams' (all the tenants below it).
    pub total: TenantFigures,
}

/// Each tenant's figures from the jobs not yet ended, by tenant id: what its jobs hold (each
/// replica of a gang holds its own) and how many of them wait and run (a gang counts once,
/// by its replica 0's record). `nodes` give the GPUs jobs hold.
pub fn tenant_totals(
    tenants: &[Tenant],
    jobs: &[Job],
    nodes: &[Node],
) -> HashMap<String, TenantTotals> {
    let gpus_of: HashMap<&str, &[GpuDevice]> = nodes
        .iter()
        .map(|n| (n.id.as_str(), n.gpus.as_slice()))
        .collect();
    let mut own: HashMap<&str, TenantFigures> = HashMap::new();
    for j in jobs {
        let f = own.entry(j.tenant_id.as_str()).or_default();
        let counted = j.replica.as_ref().is_none_or(|r| r.rank == 0);
        match j.state {
            JobState::Pending if counted => f.jobs_pending += 1,
            s if s.holds_resources() => {
                let gpus = j
                    .node_id
                    .as_deref()
                    .and_then(|n| gpus_of.get(n).copied())
                    .unwrap_or_default();
                f.held += held_by(j, gpus);
                if counted {
                    f.jobs_running += 1;
                }
            }
            _ => {}
        }
    }
    let parent: HashMap<&str, Option<&str>> = tenants
        .iter()
        .map(|t| (t.id.as_str(), t.parent_id.as_deref()))
        .collect();
    let mut out: HashMap<String, TenantTotals> = tenants
        .iter()
        .map(|t| {
            let mine = own.get(t.id.as_str()).copied().unwrap_or_default();
            (
                t.id.clone(),
                TenantTotals {
                    own: mine,
                    total: TenantFigures::default(),
                },
            )
        })
        .collect();
    // Each tenant's own figures go to it and every tenant above it.
    for t in tenants {
        let mine = out.get(&t.id).map(|x| x.own).unwrap_or_default();
        let mut at = Some(t.id.as_str());
        let mut steps = 0;
        while let Some(id) = at {
            if let Some(x) = out.get_mut(id) {
                x.total = x.total + mine;
            }
            at = parent.get(id).copied().flatten();
            steps += 1;
            if steps > tenants.len() {
                break;
            }
        }
    }
    out
}

/// What a GPU holds and has free: the jobs on it (or on its MIG instances) and what they
/// hold of it, exactly; free is the rest (none on an unhealthy or drained GPU is *free*
/// to new work, but it is what is not held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHolding<'a> {
    pub jobs: Vec<(&'a Job, GpuParts)>,
    pub held: GpuParts,
    pub free: GpuParts,
}

impl GpuDevice {
    /// The jobs of `holding` on this GPU and what they hold of it.
    pub fn holding<'a>(&self, holding: &'a [Job]) -> GpuHolding<'a> {
        let jobs: Vec<(&Job, GpuParts)> = holding
            .iter()
            .filter(|j| j.state.holds_resources() && j.gpu_uuids.iter().any(|u| self.holds(u)))
            .map(|j| (j, held_on_gpu(j, self).0))
            .collect();
        let held: GpuParts = jobs.iter().map(|(_, p)| *p).sum();
        let held = held.min(GpuParts::GPU);
        GpuHolding {
            jobs,
            held,
            free: GpuParts::GPU - held,
        }
    }
}

/// What one GPU holds, and how many jobs hold it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuFigures {
    pub held: GpuParts,
    pub jobs: u32,
}

/// A node's GPUs as the pages show them: each one's held share, and the node's held, free
/// and unavailable GPUs, which add up to its GPUs exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFigures {
    pub gpus: Vec<GpuFigures>,
    pub held: GpuParts,
    /// What new work could take now: the unheld part of its healthy GPUs nobody drained,
    /// when the node is ready and not cordoned.
    pub free: GpuParts,
    /// Neither held nor free.
    pub unavailable: GpuParts,
    /// GPUs nothing holds that a whole-GPU job could take now (not in MIG mode).
    pub idle: u32,
}

/// `n`'s figures from the jobs that hold resources (any tenant's).
pub fn node_figures(n: &Node, now: chrono::DateTime<chrono::Utc>, holding: &[Job]) -> NodeFigures {
    let open = n.status(now) == crate::NodeStatus::Ready && n.takes_work();
    let mut out = NodeFigures::default();
    for g in &n.gpus {
        let h = g.holding(holding);
        let takes_work = open && g.health(n.drained_gpus.contains(&g.uuid)) == "healthy";
        out.gpus.push(GpuFigures {
            held: h.held,
            jobs: u32::try_from(h.jobs.len()).unwrap_or(u32::MAX),
        });
        out.held += h.held;
        if takes_work {
            out.free += h.free;
            if h.held.is_zero() && g.mig.is_none() {
                out.idle += 1;
            }
        } else {
            out.unavailable += h.free;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seven_one_g_slices_are_one_gpu_and_fifty_gpus_are_fifty() {
        let one_g = GpuParts::slices(1);
        let seven: GpuParts = (0..7).map(|_| one_g).sum();
        assert_eq!(seven, GpuParts::GPU);
        assert_eq!(seven.to_string(), "1");
        assert_eq!(one_g.to_string(), "0.143");
        let fifty: GpuParts = (0..350).map(|_| one_g).sum();
        assert_eq!(fifty.to_string(), "50");
        assert_eq!(fifty.gpus(), 50.0);
        assert_eq!(GpuParts::milli(250).to_string(), "0.25");
        assert_eq!(
            GpuParts::whole(3) + GpuParts::milli(500),
            GpuParts::milli(3500)
        );
        assert_eq!((GpuParts::GPU - GpuParts::slices(6)).to_string(), "0.143");
    }

    #[test]
    fn a_gangs_size_is_replicas_times_each() {
        assert_eq!(GangSize::new(4, 8, None, None).to_string(), "4 × 8 = 32");
        assert_eq!(GangSize::new(1, 8, None, None).to_string(), "8");
        assert_eq!(
            GangSize::new(2, 1, Some(250), None).to_string(),
            "2 × 0.25 = 0.5"
        );
        assert_eq!(
            GangSize::new(1, 1, None, Some("1g.18gb")).to_string(),
            "0.143"
        );
    }
}
