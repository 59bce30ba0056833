//! The cluster model: each node's free CPU, memory and per-GPU milli, and what a request
//! asks of them.

/// A GPU has this many milli.
pub const GPU_MILLI: u32 = 1000;

/// A pod's request, with its acceptable models resolved to a bit mask over the cluster's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub num_gpu: u8,
    pub gpu_milli: u32,
    /// Bit `i` set when model `i` is acceptable.
    pub models: u64,
}

impl Request {
    pub fn gpu_total(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// A shared-GPU request: one GPU, part of it.
    pub fn is_shared(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < GPU_MILLI
    }

    /// The kind GpuClustering groups by: CPU-only (0), shared (1), k whole GPUs (1 + k).
    pub fn kind(&self) -> u8 {
        match (self.num_gpu, self.is_shared()) {
            (0, _) => 0,
            (_, true) => 1,
            (k, false) => 1 + k,
        }
    }
}

/// A node as the model is given it: its capacity and GPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub gpus: u8,
    /// The GPU model (`H200`, `T4`, or an undisclosed code such as `G2`).
    pub model: String,
    /// Memory of each GPU; 0 when unknown.
    pub gpu_memory_mib: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub cpu_free: u32,
    pub memory_free: u32,
    /// Free milli of each GPU.
    pub gpu_free: Vec<u32>,
    pub model: u8,
    /// Bit `kind` set for every kind of GPU pod the node hosts.
    pub kinds: u32,
}

impl NodeState {
    pub fn gpu_free_total(&self) -> u32 {
        self.gpu_free.iter().sum()
    }

    /// Whether any GPU is (partly) allocated.
    pub fn busy(&self) -> bool {
        self.gpu_free.iter().any(|&f| f < GPU_MILLI)
    }

    /// Whether `r` fits: CPU, memory, model and enough GPUs with room.
    pub fn fits(&self, r: &Request) -> bool {
        self.cpu_free >= r.cpu_milli
            && self.memory_free >= r.memory_mib
            && (r.num_gpu == 0
                || (r.models >> self.model) & 1 == 1
                    && self.gpu_free.iter().filter(|&&f| f >= r.gpu_milli).count()
                        >= usize::from(r.num_gpu))
    }

    /// The GPUs the usual rule picks: for a shared request the tightest GPU that fits (the
    /// lowest index among equals), else the first `num_gpu` GPUs with room.
    pub fn default_gpus(&self, r: &Request) -> Vec<u8> {
        if r.num_gpu == 0 {
            return Vec::new();
        }
        if r.is_shared() {
            return self
                .gpu_free
                .iter()
                .enumerate()
                .filter(|(_, f)| **f >= r.gpu_milli)
                .min_by_key(|(i, f)| (**f, *i))
                .map(|(i, _)| vec![i as u8])
                .unwrap_or_default();
        }
        self.gpu_free
            .iter()
            .enumerate()
            .filter(|(_, f)| **f >= r.gpu_milli)
            .take(usize::from(r.num_gpu))
            .map(|(i, _)| i as u8)
            .collect()
    }

    /// Takes `r` onto `gpus`.
    pub fn place(&mut self, r: &Request, gpus: &[u8]) {
        self.cpu_free -= r.cpu_milli;
        self.memory_free -= r.memory_mib;
        for &g in gpus {
            self.gpu_free[usize::from(g)] -= r.gpu_milli;
        }
        if r.num_gpu > 0 {
            self.kinds |= 1 << r.kind();
        }
    }

    /// Gives back what `place(r, gpus)` took. (`kinds` keeps the kinds the node has hosted.)
    pub fn release(&mut self, r: &Request, gpus: &[u8]) {
        self.cpu_free += r.cpu_milli;
        self.memory_free += r.memory_mib;
        for &g in gpus {
            self.gpu_free[usize::from(g)] += r.gpu_milli;
        }
    }
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub nodes: Vec<NodeState>,
    pub names: Vec<String>,
    /// Model names, by index.
    pub models: Vec<String>,
    /// Total GPU milli.
    pub capacity: u64,
    /// Each node's place in the run's random order, which breaks ties between equal scores.
    pub rank: Vec<u32>,
    /// Memory of each node's GPUs (0: unknown).
    pub gpu_memory_mib: Vec<u32>,
}

impl Cluster {
    pub fn new(nodes: &[Node]) -> Self {
        let mut models: Vec<String> = Vec::new();
        let states = nodes
            .iter()
            .map(|n| {
                let model = models
                    .iter()
                    .position(|m| *m == n.model)
                    .unwrap_or_else(|| {
                        models.push(n.model.clone());
                        models.len() - 1
                    });
                NodeState {
                    cpu_free: n.cpu_milli,
                    memory_free: n.memory_mib,
                    gpu_free: vec![GPU_MILLI; usize::from(n.gpus)],
                    model: model.min(63) as u8,
                    kinds: 0,
                }
            })
            .collect();
        Self {
            nodes: states,
            names: nodes.iter().map(|n| n.name.clone()).collect(),
            capacity: nodes.iter().map(|n| u64::from(n.gpus)).sum::<u64>() * u64::from(GPU_MILLI),
            rank: (0..nodes.len() as u32).collect(),
            gpu_memory_mib: nodes.iter().map(|n| n.gpu_memory_mib).collect(),
            models,
        }
    }

    /// Gives the nodes a random order (`rank`) that breaks ties between equal scores.
    pub fn shuffle_ranks(&mut self, rng: &mut rand::rngs::StdRng) {
        use rand::seq::SliceRandom;
        let mut order: Vec<u32> = (0..self.nodes.len() as u32).collect();
        order.shuffle(rng);
        for (rank, node) in order.into_iter().enumerate() {
            self.rank[node as usize] = rank as u32;
        }
    }

    /// The mask of the cluster's models that `accepts` accepts (all of them when no model
    /// is named).
    pub fn model_mask(&self, any: bool, accepts: impl Fn(&str) -> bool) -> u64 {
        if any {
            return u64::MAX;
        }
        self.models
            .iter()
            .enumerate()
            .filter(|(_, m)| accepts(m))
            .fold(0u64, |acc, (i, _)| acc | (1 << i.min(63)))
    }
}
