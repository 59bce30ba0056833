//! Isolation levels as placement constraints, and the per-GPU limits of operations practice.
//!
//! - `shared`: a fraction of a GPU that other tenants' shared jobs may also use, up to
//!   `max_jobs_per_shared_gpu` jobs on one GPU, whose GPU memory together stays within the
//!   GPU's memory less `shared_memory_reserve_pct` (10% by default).
//! - `mig`: a hardware partition (MIG), placed by the node-agent work; until nodes offer
//!   MIG instances such jobs wait with their own reason.
//! - `dedicated`: whole GPUs on a node that runs no other tenant's work while the job is
//!   there (for sensitive data); a fraction asked for at this level is rounded up to a GPU.
//!
//! A tenant sets the minimum level for its jobs (and its teams'); a workload class sets a
//! job's default (training: dedicated; inference and batch: shared).

use std::collections::HashMap;

use crate::placement::{GPU_MILLI, NodeState, Request};

pub use allot_domain::{Isolation, WorkloadClass};

/// Per-GPU limits from operations practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuLimits {
    /// Most jobs sharing one GPU.
    pub max_jobs_per_shared_gpu: u32,
    /// Percent of a shared GPU's memory kept free of jobs' memory (headroom for the
    /// driver, contexts and spikes).
    pub shared_memory_reserve_pct: u32,
    /// Thousandths of a GPU that auto-sized jobs' forecasts leave free on a GPU they are
    /// placed or consolidated on, so that they grow in place (see `engine::forecast`).
    pub sized_headroom_milli: u32,
}

impl Default for GpuLimits {
    fn default() -> Self {
        Self {
            max_jobs_per_shared_gpu: 4,
            shared_memory_reserve_pct: 10,
            sized_headroom_milli: 100,
        }
    }
}

impl GpuLimits {
    /// GPU memory jobs may hold on one shared GPU of `capacity_mib`.
    pub fn shared_memory_budget(&self, capacity_mib: u32) -> u64 {
        u64::from(capacity_mib) * u64::from(100 - self.shared_memory_reserve_pct.min(100)) / 100
    }
}

/// What one placement of a job holds, as far as isolation is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenancy {
    /// The quota queue.
    pub q: usize,
    pub level: Isolation,
    /// GPU memory it holds on each GPU it shares (0 for whole GPUs).
    pub shared_mib: u32,
    /// Whether it is best-effort work (see [`super::Job::best_effort`]).
    pub best_effort: bool,
    /// How much more of the GPU than its share an auto-sized job's forecast wants (see
    /// [`super::Sizing`]).
    pub wanted_extra_milli: u32,
}

/// What a request needs of a GPU's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Per GPU; 0 when not asked.
    pub mib: u32,
    /// The node's GPU memory; 0 when unknown.
    pub capacity_mib: u32,
}

/// The request a job at `level` holds: a dedicated job takes whole GPUs.
pub fn held_request(r: &Request, level: Isolation) -> Request {
    if level == Isolation::Dedicated && r.num_gpu > 0 {
        Request {
            gpu_milli: GPU_MILLI,
            ..*r
        }
    } else {
        *r
    }
}

/// Who runs what where, as far as isolation is concerned.
#[derive(Debug, Clone, Default)]
pub struct Occupancy {
    /// Per node: placements by tenant (queue index).
    tenants: Vec<HashMap<usize, u32>>,
    /// Per node: the tenant holding it dedicated, and how many of its placements do.
    dedicated: Vec<Option<(usize, u32)>>,
    /// Jobs on each (node, GPU).
    gpu_jobs: HashMap<(usize, u8), u32>,
    /// GPU memory held by the jobs sharing each (node, GPU).
    shared_mib: HashMap<(usize, u8), u64>,
    /// Best-effort jobs on each (node, GPU).
    best_effort: HashMap<(usize, u8), u32>,
    /// What the auto-sized jobs on each (node, GPU) want beyond their shares.
    wanted_extra: HashMap<(usize, u8), u32>,
}

impl Occupancy {
    pub fn new(nodes: usize) -> Self {
        Self {
            tenants: vec![HashMap::new(); nodes],
            dedicated: vec![None; nodes],
            gpu_jobs: HashMap::new(),
            shared_mib: HashMap::new(),
            best_effort: HashMap::new(),
            wanted_extra: HashMap::new(),
        }
    }

    pub fn add(&mut self, node: usize, gpus: &[u8], t: Tenancy) {
        let Tenancy { q, level, .. } = t;
        *self.tenants[node].entry(q).or_default() += 1;
        if level == Isolation::Dedicated {
            let held = self.dedicated[node].get_or_insert((q, 0));
            held.1 += 1;
        }
        for &g in gpus {
            *self.gpu_jobs.entry((node, g)).or_default() += 1;
            if t.best_effort {
                *self.best_effort.entry((node, g)).or_default() += 1;
            }
            *self.shared_mib.entry((node, g)).or_default() += u64::from(t.shared_mib);
            if t.wanted_extra_milli > 0 {
                *self.wanted_extra.entry((node, g)).or_default() += t.wanted_extra_milli;
            }
        }
    }

    pub fn remove(&mut self, node: usize, gpus: &[u8], t: Tenancy) {
        let Tenancy { q, level, .. } = t;
        for &g in gpus {
            if let Some(held) = self.shared_mib.get_mut(&(node, g)) {
                *held = held.saturating_sub(u64::from(t.shared_mib));
            }
            if t.wanted_extra_milli > 0
                && let Some(extra) = self.wanted_extra.get_mut(&(node, g))
            {
                *extra = extra.saturating_sub(t.wanted_extra_milli);
            }
        }
        if let Some(n) = self.tenants[node].get_mut(&q) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.tenants[node].remove(&q);
            }
        }
        if level == Isolation::Dedicated
            && let Some((_, n)) = &mut self.dedicated[node]
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.dedicated[node] = None;
            }
        }
        for &g in gpus {
            if let Some(n) = self.gpu_jobs.get_mut(&(node, g)) {
                *n = n.saturating_sub(1);
            }
            if t.best_effort
                && let Some(n) = self.best_effort.get_mut(&(node, g))
            {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// Best-effort jobs on GPU `g` of `node`.
    pub fn best_effort_on(&self, node: usize, g: u8) -> u32 {
        self.best_effort.get(&(node, g)).copied().unwrap_or(0)
    }

    /// What the auto-sized jobs on GPU `g` of `node` want beyond their shares.
    pub fn wanted_extra_on(&self, node: usize, g: u8) -> u32 {
        self.wanted_extra.get(&(node, g)).copied().unwrap_or(0)
    }

    /// The (node, GPU)s whose auto-sized jobs want more than their shares.
    pub fn wanting_more(&self) -> impl Iterator<Item = (usize, u8)> + '_ {
        self.wanted_extra
            .iter()
            .filter(|&(_, &extra)| extra > 0)
            .map(|(&at, _)| at)
    }

    /// Jobs on GPU `g` of `node`.
    pub fn jobs_on(&self, node: usize, g: u8) -> u32 {
        self.gpu_jobs.get(&(node, g)).copied().unwrap_or(0)
    }

    /// Whether tenant `q` may run a job at `level` on `node` at all.
    pub fn node_allows(&self, node: usize, q: usize, level: Isolation) -> bool {
        let held_by_other = self.dedicated[node].is_some_and(|(t, _)| t != q);
        let others_here = self.tenants[node].keys().any(|&t| t != q);
        let wants_alone = level == Isolation::Dedicated;
        !(held_by_other || wants_alone && others_here)
    }

    /// Whether GPU `g` of `node` may take a shared request needing `memory`: under the job
    /// limit, and its jobs' GPU memory within the budget the reserve leaves.
    fn shared_gpu_allows(&self, node: usize, g: u8, memory: MemoryNeed, limits: GpuLimits) -> bool {
        let held = self.shared_mib.get(&(node, g)).copied().unwrap_or(0);
        self.jobs_on(node, g) < limits.max_jobs_per_shared_gpu
            && (memory.mib == 0
                || held + u64::from(memory.mib) <= limits.shared_memory_budget(memory.capacity_mib))
    }

    /// The GPUs of `n` (node `node`) that `r` would take: a shared request the tightest GPU
    /// with room, under the job limit and within the memory budget; whole GPUs the first
    /// free ones, if they have the memory asked for.
    pub fn gpus_for(
        &self,
        node: usize,
        n: &NodeState,
        r: &Request,
        memory: MemoryNeed,
        limits: GpuLimits,
    ) -> Option<Vec<u8>> {
        if !n.fits(r) || memory.mib > memory.capacity_mib {
            return None;
        }
        if !r.is_shared() {
            return Some(n.default_gpus(r));
        }
        n.gpu_free
            .iter()
            .enumerate()
            .filter(|&(g, &free)| {
                free >= r.gpu_milli && self.shared_gpu_allows(node, g as u8, memory, limits)
            })
            .min_by_key(|&(g, &free)| (free, g))
            .map(|(g, _)| vec![g as u8])
    }

    /// Whether `gpus` of `node` may take `r` needing `memory`.
    pub fn gpus_allow(
        &self,
        node: usize,
        gpus: &[u8],
        r: &Request,
        memory: MemoryNeed,
        limits: GpuLimits,
    ) -> bool {
        memory.mib <= memory.capacity_mib
            && (!r.is_shared()
                || gpus
                    .iter()
                    .all(|&g| self.shared_gpu_allows(node, g, memory, limits)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeState {
        NodeState {
            cpu_free: 64_000,
            memory_free: 256 * 1024,
            gpu_free: vec![1000; 2],
            model: 0,
            kinds: 0,
        }
    }

    fn shared(milli: u32) -> Request {
        Request {
            cpu_milli: 1000,
            memory_mib: 1024,
            num_gpu: 1,
            gpu_milli: milli,
            models: u64::MAX,
        }
    }

    fn t(q: usize, level: Isolation) -> Tenancy {
        Tenancy {
            q,
            level,
            shared_mib: 0,
            best_effort: false,
            wanted_extra_milli: 0,
        }
    }

    const NO_MEMORY: MemoryNeed = MemoryNeed {
        mib: 0,
        capacity_mib: 0,
    };

    #[test]
    fn dedicated_nodes_host_one_tenant() {
        let mut o = Occupancy::new(2);
        o.add(0, &[0], t(1, Isolation::Shared));
        assert!(
            !o.node_allows(0, 2, Isolation::Dedicated),
            "tenant 1 is already there"
        );
        assert!(o.node_allows(0, 1, Isolation::Dedicated), "its own node");
        assert!(o.node_allows(0, 2, Isolation::Shared));
        o.add(1, &[0, 1], t(3, Isolation::Dedicated));
        assert!(
            !o.node_allows(1, 2, Isolation::Shared),
            "held dedicated by tenant 3"
        );
        assert!(o.node_allows(1, 3, Isolation::Shared));
        o.remove(1, &[0, 1], t(3, Isolation::Dedicated));
        assert!(o.node_allows(1, 2, Isolation::Dedicated), "free again");
    }

    #[test]
    fn shared_gpus_take_at_most_the_job_limit() {
        let limits = GpuLimits {
            max_jobs_per_shared_gpu: 2,
            shared_memory_reserve_pct: 10,
            sized_headroom_milli: 100,
        };
        let mut o = Occupancy::new(1);
        let mut n = node();
        for _ in 0..2 {
            let gpus = o
                .gpus_for(0, &n, &shared(100), NO_MEMORY, limits)
                .expect("room");
            assert_eq!(gpus, [0], "the tightest GPU first");
            n.place(&shared(100), &gpus);
            o.add(0, &gpus, t(1, Isolation::Shared));
        }
        let next = o.gpus_for(0, &n, &shared(100), NO_MEMORY, limits);
        assert_eq!(next, Some(vec![1]), "GPU 0 has 2 jobs");
        assert!(!o.gpus_allow(0, &[0], &shared(100), NO_MEMORY, limits));
        assert_eq!(
            held_request(&shared(300), Isolation::Dedicated).gpu_milli,
            1000
        );
        assert_eq!(
            WorkloadClass::Training.default_isolation(),
            Isolation::Dedicated
        );
    }

    #[test]
    fn shared_gpus_keep_their_memory_reserve() {
        let limits = GpuLimits::default();
        let mut o = Occupancy::new(1);
        let n = node();
        let need = |mib| MemoryNeed {
            mib,
            capacity_mib: 80 * 1024,
        };
        // 90% of 80 GiB is 72 GiB: 40 + 32 fit, 40 + 33 do not.
        let holder = Tenancy {
            shared_mib: 40 * 1024,
            ..t(1, Isolation::Shared)
        };
        o.add(0, &[0], holder);
        assert!(o.gpus_allow(0, &[0], &shared(100), need(32 * 1024), limits));
        assert!(!o.gpus_allow(0, &[0], &shared(100), need(33 * 1024), limits));
        let next = o.gpus_for(0, &n, &shared(100), need(33 * 1024), limits);
        assert_eq!(next, Some(vec![1]));
        let whole = Request {
            gpu_milli: 1000,
            ..shared(100)
        };
        assert!(
            !o.gpus_allow(0, &[1], &whole, need(96 * 1024), limits),
            "more than it has"
        );
        let unknown = MemoryNeed {
            mib: 1024,
            capacity_mib: 0,
        };
        assert_eq!(
            o.gpus_for(0, &n, &whole, unknown, limits),
            None,
            "asked, not known"
        );
    }
}
