//! Isolation levels as placement constraints, and the per-GPU limits of operations practice.
//!
//! - `shared`: a fraction of a GPU that other tenants' shared jobs may also use, up to
//!   `max_jobs_per_shared_gpu` jobs on one GPU.
//! - `mig`: a hardware partition (MIG), placed by the node-agent work; until nodes offer
//!   MIG instances such jobs wait with their own reason.
//! - `dedicated`: whole GPUs on a node that runs no other tenant's work while the job is
//!   there (for sensitive data); a fraction asked for at this level is rounded up to a GPU.
//!
//! A tenant sets the minimum level for its jobs (and its teams'); a workload class sets a
//! job's default (training: dedicated; inference and batch: shared).

use std::collections::HashMap;

use crate::openb::cluster::{GPU_MILLI, NodeState, Request};

/// How much a job shares its GPUs; later levels share less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isolation {
    #[default]
    Shared,
    Mig,
    Dedicated,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Shared => "shared",
            Isolation::Mig => "mig",
            Isolation::Dedicated => "dedicated",
        }
    }
}

/// What a job is for, which sets its default isolation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkloadClass {
    Training,
    Inference,
    Batch,
}

impl WorkloadClass {
    pub fn default_isolation(self) -> Isolation {
        match self {
            WorkloadClass::Training => Isolation::Dedicated,
            WorkloadClass::Inference | WorkloadClass::Batch => Isolation::Shared,
        }
    }
}

/// Per-GPU limits from operations practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuLimits {
    /// Most jobs sharing one GPU.
    pub max_jobs_per_shared_gpu: u32,
}

impl Default for GpuLimits {
    fn default() -> Self {
        Self {
            max_jobs_per_shared_gpu: 4,
        }
    }
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
}

impl Occupancy {
    pub fn new(nodes: usize) -> Self {
        Self {
            tenants: vec![HashMap::new(); nodes],
            dedicated: vec![None; nodes],
            gpu_jobs: HashMap::new(),
        }
    }

    pub fn add(&mut self, node: usize, gpus: &[u8], q: usize, level: Isolation) {
        *self.tenants[node].entry(q).or_default() += 1;
        if level == Isolation::Dedicated {
            let held = self.dedicated[node].get_or_insert((q, 0));
            held.1 += 1;
        }
        for &g in gpus {
            *self.gpu_jobs.entry((node, g)).or_default() += 1;
        }
    }

    pub fn remove(&mut self, node: usize, gpus: &[u8], q: usize, level: Isolation) {
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
        }
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

    /// The GPUs of `n` (node `node`) that `r` would take: a shared request the tightest GPU
    /// with room and under the job limit, whole GPUs the first free ones.
    pub fn gpus_for(
        &self,
        node: usize,
        n: &NodeState,
        r: &Request,
        limits: GpuLimits,
    ) -> Option<Vec<u8>> {
        if !n.fits(r) {
            return None;
        }
        if !r.is_shared() {
            return Some(n.default_gpus(r));
        }
        let jobs = |g: usize| self.gpu_jobs.get(&(node, g as u8)).copied().unwrap_or(0);
        n.gpu_free
            .iter()
            .enumerate()
            .filter(|&(g, &free)| free >= r.gpu_milli && jobs(g) < limits.max_jobs_per_shared_gpu)
            .min_by_key(|&(g, &free)| (free, g))
            .map(|(g, _)| vec![g as u8])
    }

    /// Whether `gpus` of `node` may take a shared request under the job limit.
    pub fn gpus_allow(&self, node: usize, gpus: &[u8], r: &Request, limits: GpuLimits) -> bool {
        !r.is_shared()
            || gpus.iter().all(|&g| {
                self.gpu_jobs.get(&(node, g)).copied().unwrap_or(0) < limits.max_jobs_per_shared_gpu
            })
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

    #[test]
    fn dedicated_nodes_host_one_tenant() {
        let mut o = Occupancy::new(2);
        o.add(0, &[0], 1, Isolation::Shared);
        assert!(
            !o.node_allows(0, 2, Isolation::Dedicated),
            "tenant 1 is already there"
        );
        assert!(o.node_allows(0, 1, Isolation::Dedicated), "its own node");
        assert!(o.node_allows(0, 2, Isolation::Shared));
        o.add(1, &[0, 1], 3, Isolation::Dedicated);
        assert!(
            !o.node_allows(1, 2, Isolation::Shared),
            "held dedicated by tenant 3"
        );
        assert!(o.node_allows(1, 3, Isolation::Shared));
        o.remove(1, &[0, 1], 3, Isolation::Dedicated);
        assert!(o.node_allows(1, 2, Isolation::Dedicated), "free again");
    }

    #[test]
    fn shared_gpus_take_at_most_the_job_limit() {
        let limits = GpuLimits {
            max_jobs_per_shared_gpu: 2,
        };
        let mut o = Occupancy::new(1);
        let mut n = node();
        for _ in 0..2 {
            let gpus = o.gpus_for(0, &n, &shared(100), limits).expect("room");
            assert_eq!(gpus, [0], "the tightest GPU first");
            n.place(&shared(100), &gpus);
            o.add(0, &gpus, 1, Isolation::Shared);
        }
        assert_eq!(
            o.gpus_for(0, &n, &shared(100), limits),
            Some(vec![1]),
            "GPU 0 has 2 jobs"
        );
        assert!(!o.gpus_allow(0, &[0], &shared(100), limits));
        assert_eq!(
            held_request(&shared(300), Isolation::Dedicated).gpu_milli,
            1000
        );
        assert_eq!(
            WorkloadClass::Training.default_isolation(),
            Isolation::Dedicated
        );
    }
}
