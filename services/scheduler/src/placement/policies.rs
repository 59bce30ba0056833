//! The published baseline policies of the openb evaluation, as its README specifies them.
//! Scores are integers (0..100) as in the authors' simulator; the highest wins, and ties go
//! to the node that comes first in the run's seeded random order of nodes (so a tie between
//! idle nodes keeps filling the same one, as the simulator does).

use std::collections::HashMap;

use rand::Rng;
use rand::rngs::StdRng;

use super::cluster::{Cluster, GPU_MILLI, NodeState, Request};

/// Where a pod goes: a node and the indices of its GPUs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub node: usize,
    pub gpus: Vec<u8>,
}

/// A placement policy of the openb simulation.
pub trait PlacementPolicy: Send {
    fn name(&self) -> &'static str;
    /// What the policy was told beyond each request and the cluster's state.
    fn given(&self) -> &'static str {
        "nothing"
    }
    /// Told once of each request as it arrives, before it is first chosen for: a request
    /// that waits is chosen for again on every pass, but it arrived once. Policies that
    /// learn the workload count it here, never in [`PlacementPolicy::choose`].
    fn arrived(&mut self, _cluster: &Cluster, _r: &Request) {}
    /// Picks a node and GPUs for `r`, or `None` when it fits nowhere.
    fn choose(&mut self, cluster: &Cluster, r: &Request, rng: &mut StdRng) -> Option<Choice>;
    /// The workload mix the policy has learned from arrivals, most frequent first (empty
    /// for a policy that learns none).
    fn learned_mix(&self) -> Vec<RequestClass> {
        Vec::new()
    }
    /// Everything the policy has learned, to be taken up by another instance of it
    /// ([`PlacementPolicy::take_up`]): a control plane's next leader carries on from it.
    /// `None` for a policy that learns nothing.
    fn learned(&self) -> Option<super::allot::Learned> {
        None
    }
    /// Carries on from what another instance learned ([`PlacementPolicy::learned`]).
    fn take_up(&mut self, _learned: super::allot::Learned) {}
    /// Told after every change to a node's state, a placement or a release (policies that
    /// cache per-node state refresh it).
    fn node_changed(&mut self, _cluster: &Cluster, _node: usize) {}
    /// Told before a pass over a cluster that may differ from the last one (nodes come and
    /// go): per-node state starts again, what was learned stays.
    fn reset(&mut self, _cluster: &Cluster) {}
}

/// The published baselines by their command-line names.
pub const BASELINES: [&str; 6] = [
    "random",
    "dotprod",
    "gpu-clustering",
    "gpu-packing",
    "bestfit",
    "fgd",
];

/// The highest score; among equals, the node first in `cluster.rank` (the run's seeded order).
pub(crate) fn best<T>(
    cluster: &Cluster,
    candidates: impl Iterator<Item = (i64, usize, T)>,
) -> Option<(usize, T)> {
    let mut top: Option<(i64, u32, usize, T)> = None;
    for (score, node, c) in candidates {
        let rank = cluster.rank[node];
        if top
            .as_ref()
            .is_none_or(|(s, r, _, _)| score > *s || (score == *s && rank < *r))
        {
            top = Some((score, rank, node, c));
        }
    }
    top.map(|(_, _, node, c)| (node, c))
}

pub(crate) fn feasible<'a>(
    cluster: &'a Cluster,
    r: &'a Request,
) -> impl Iterator<Item = (usize, &'a NodeState)> {
    cluster.nodes.iter().enumerate().filter(|(_, n)| n.fits(r))
}

/// Scores each feasible node with `score` and places on the default GPUs of the best.
fn by_score(cluster: &Cluster, r: &Request, score: impl Fn(&NodeState) -> i64) -> Option<Choice> {
    let (node, ()) = best(
        cluster,
        feasible(cluster, r).map(|(i, n)| (score(n), i, ())),
    )?;
    Some(Choice {
        node,
        gpus: cluster.nodes[node].default_gpus(r),
    })
}

pub struct Random;

impl PlacementPolicy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn choose(&mut self, cluster: &Cluster, r: &Request, rng: &mut StdRng) -> Option<Choice> {
        let feasible: Vec<usize> = feasible(cluster, r).map(|(i, _)| i).collect();
        if feasible.is_empty() {
            return None;
        }
        let node = feasible[rng.random_range(0..feasible.len())];
        let n = &cluster.nodes[node];
        let gpus = if r.is_shared() {
            let fitting: Vec<u8> = (0..n.gpu_free.len())
                .filter(|&g| n.gpu_free[g] >= r.gpu_milli)
                .map(|g| g as u8)
                .collect();
            vec![fitting[rng.random_range(0..fitting.len())]]
        } else {
            n.default_gpus(r)
        };
        Some(Choice { node, gpus })
    }
}

const CPU_NORM: f64 = 128_000.0;
const GPU_NORM: f64 = 8_000.0;

pub struct DotProd;

impl PlacementPolicy for DotProd {
    fn name(&self) -> &'static str {
        "dotprod"
    }

    fn choose(&mut self, cluster: &Cluster, r: &Request, _rng: &mut StdRng) -> Option<Choice> {
        let (cpu, gpu) = (f64::from(r.cpu_milli), r.gpu_total() as f64);
        by_score(cluster, r, |n| {
            let dot = f64::from(n.cpu_free) / CPU_NORM * cpu / CPU_NORM
                + f64::from(n.gpu_free_total()) / GPU_NORM * gpu / GPU_NORM;
            (100.0 * (1.0 - dot / 2.0)) as i64
        })
    }
}

pub struct BestFit;

impl PlacementPolicy for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }

    fn choose(&mut self, cluster: &Cluster, r: &Request, _rng: &mut StdRng) -> Option<Choice> {
        let (cpu, gpu) = (f64::from(r.cpu_milli), r.gpu_total() as f64);
        let raw: Vec<(usize, i64)> = feasible(cluster, r)
            .map(|(i, n)| {
                let left = 0.5 * (f64::from(n.cpu_free) - cpu) / CPU_NORM
                    + 0.5 * (f64::from(n.gpu_free_total()) - gpu) / GPU_NORM;
                (i, (100.0 * (1.0 - left)) as i64)
            })
            .collect();
        let min = raw.iter().map(|(_, s)| *s).min()?;
        let max = raw.iter().map(|(_, s)| *s).max()?;
        let normalised = raw.into_iter().map(|(i, s)| {
            let s = if max > min {
                (s - min) * 100 / (max - min)
            } else {
                100
            };
            (s, i, ())
        });
        let (node, ()) = best(cluster, normalised)?;
        Some(Choice {
            node,
            gpus: cluster.nodes[node].default_gpus(r),
        })
    }
}

/// Prefer GPUs already in use, then used nodes, then idle nodes.
pub struct GpuPacking;

/// The packing score of the simulator: 50..100 when only partly used GPUs are needed
/// (fuller is better), 33..50 when whole free GPUs of a used node are, and below 33 on an
/// idle node (fewer GPUs is better).
fn packing_score(n: &NodeState, r: &Request) -> i64 {
    if r.num_gpu == 0 {
        return 0;
    }
    let fully_free = n.gpu_free.iter().filter(|&&f| f == GPU_MILLI).count() as i64;
    if fully_free == n.gpu_free.len() as i64 {
        return (100 / 3 - fully_free).max(fully_free);
    }
    let mut by_left: Vec<usize> = (0..n.gpu_free.len()).collect();
    by_left.sort_by_key(|&g| n.gpu_free[g]);
    let mut wanted = i64::from(r.num_gpu);
    let (mut fully_free_used, mut free_ratio_on_used) = (0i64, 0i64);
    for g in by_left {
        if wanted == 0 {
            break;
        }
        let left = n.gpu_free[g];
        if left >= r.gpu_milli {
            wanted -= 1;
            free_ratio_on_used += i64::from(left) * 100 / i64::from(GPU_MILLI);
            if left == GPU_MILLI {
                fully_free_used += 1;
            }
        }
    }
    if fully_free_used > 0 {
        (100 / 2 - fully_free_used).max(100 / 3)
    } else {
        (100 - free_ratio_on_used / 10).max(100 / 2)
    }
}

impl PlacementPolicy for GpuPacking {
    fn name(&self) -> &'static str {
        "gpu-packing"
    }

    fn choose(&mut self, cluster: &Cluster, r: &Request, _rng: &mut StdRng) -> Option<Choice> {
        by_score(cluster, r, |n| packing_score(n, r))
    }
}

/// Prefer nodes that host only pods of the same kind (shared, or k whole GPUs), then nodes
/// that host that kind among others, then idle nodes; fuller nodes first within each band.
pub struct GpuClustering;

/// The most GPU milli a node has (8 GPUs).
const MAX_NODE_GPU_MILLI: i64 = 8 * GPU_MILLI as i64;

fn clustering_score(n: &NodeState, r: &Request) -> i64 {
    if r.num_gpu == 0 {
        return 0;
    }
    let fullness = 25 * (MAX_NODE_GPU_MILLI - i64::from(n.gpu_free_total())) / MAX_NODE_GPU_MILLI;
    let kind = 1u32 << r.kind();
    let band = if n.kinds & kind != 0 {
        if n.kinds == kind { 75 } else { 50 }
    } else if n.kinds == 0 {
        25
    } else {
        0
    };
    fullness + band
}

impl PlacementPolicy for GpuClustering {
    fn name(&self) -> &'static str {
        "gpu-clustering"
    }

    fn choose(&mut self, cluster: &Cluster, r: &Request, _rng: &mut StdRng) -> Option<Choice> {
        by_score(cluster, r, |n| clustering_score(n, r))
    }
}

/// A typical request class and its share of the workload.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RequestClass {
    pub request: Request,
    pub weight: f64,
}

/// The most frequent request shapes covering `coverage` of `requests` (by count), each
/// with its frequency among them.
pub fn typical_classes(requests: &[Request], coverage: f64) -> Vec<RequestClass> {
    let mut counts: HashMap<Request, f64> = HashMap::new();
    for r in requests {
        *counts.entry(class_of(r)).or_default() += 1.0;
    }
    classes_from_counts(&counts, coverage)
}

/// The class a request belongs to: its shape without memory (as the authors' simulator).
pub(crate) fn class_of(r: &Request) -> Request {
    Request {
        memory_mib: 0,
        ..*r
    }
}

/// The most frequent classes in `counts` (each class's count, or its weight when old
/// arrivals fade) covering `coverage` of them, with their frequencies renormalised (as the
/// authors' simulator does) to sum to one.
pub(crate) fn classes_from_counts(
    counts: &HashMap<Request, f64>,
    coverage: f64,
) -> Vec<RequestClass> {
    let mut classes: Vec<(Request, f64)> = counts.iter().map(|(r, n)| (*r, *n)).collect();
    classes.sort_by(|a, b| {
        b.1.total_cmp(&a.1).then_with(|| {
            (a.0.num_gpu, a.0.gpu_milli, a.0.cpu_milli, a.0.models).cmp(&(
                b.0.num_gpu,
                b.0.gpu_milli,
                b.0.cpu_milli,
                b.0.models,
            ))
        })
    });
    let total = classes.iter().map(|c| c.1).sum::<f64>();
    let total = if total > 0.0 { total } else { 1.0 };
    let mut covered = 0.0;
    let mut out = Vec::new();
    for (request, count) in classes {
        if covered / total >= coverage {
            break;
        }
        covered += count;
        out.push(RequestClass {
            request,
            weight: count / total,
        });
    }
    let kept = covered / total;
    for c in &mut out {
        c.weight /= kept;
    }
    out
}

/// How much of a node's free GPU milli class `m` could not use.
fn class_fragment(n: &NodeState, free_total: u32, m: &Request) -> u32 {
    if m.num_gpu == 0 || !n.fits(m) {
        return free_total;
    }
    n.gpu_free.iter().filter(|&&f| f < m.gpu_milli).sum()
}

/// The expected fragment of a node under a workload of `classes`.
pub fn fragmentation(n: &NodeState, classes: &[RequestClass]) -> f64 {
    let free = n.gpu_free_total();
    classes
        .iter()
        .map(|c| c.weight * f64::from(class_fragment(n, free, &c.request)))
        .sum()
}

/// Fragmentation Gradient Descent (Weng et al., ATC'23): the placement that grows the
/// expected fragment of the cluster the least.
pub struct Fgd {
    classes: Vec<RequestClass>,
    /// Each node's fragmentation now, refreshed after every placement on it.
    current: Vec<f64>,
    memo: FragMemo,
}

/// What a node's fragmentation depends on: CPU left, model, and the free milli of its GPUs
/// in ascending order (which GPU is which does not matter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FragKey {
    cpu: u32,
    model: u8,
    gpus: u8,
    free: [u16; 8],
}

/// Fragmentation by node state: the same few states recur across nodes and decisions.
#[derive(Debug, Default)]
pub(crate) struct FragMemo {
    known: rustc_hash::FxHashMap<FragKey, f64>,
}

impl FragMemo {
    /// The fragmentation of `n` after `r` is placed on `gpus`.
    pub(crate) fn after(
        &mut self,
        n: &NodeState,
        r: &Request,
        gpus: &[u8],
        classes: &[RequestClass],
    ) -> f64 {
        let after = || {
            let mut a = n.clone();
            a.place(r, gpus);
            a
        };
        if n.gpu_free.len() > 8 {
            return fragmentation(&after(), classes);
        }
        let mut free = [0u16; 8];
        for (i, f) in n.gpu_free.iter().enumerate() {
            free[i] = *f as u16;
        }
        for &g in gpus {
            free[usize::from(g)] -= r.gpu_milli as u16;
        }
        let len = n.gpu_free.len();
        free[..len].sort_unstable();
        let key = FragKey {
            cpu: n.cpu_free - r.cpu_milli,
            model: n.model,
            gpus: len as u8,
            free,
        };
        *self
            .known
            .entry(key)
            .or_insert_with(|| fragmentation(&after(), classes))
    }
}

impl Fgd {
    /// With the typical classes of `requests` (the original workload, before inflation).
    pub fn new(cluster: &Cluster, requests: &[Request]) -> Self {
        let classes = typical_classes(requests, 0.95);
        let current = cluster
            .nodes
            .iter()
            .map(|n| fragmentation(n, &classes))
            .collect();
        Self {
            classes,
            current,
            memo: FragMemo::default(),
        }
    }
}

/// The option of `gpu_options(n, r)` with the highest `gain`, scored as FGD scores:
/// 100 × sigmoid(gain / 1000), truncated to an integer.
pub(crate) fn scored_option(
    n: &NodeState,
    r: &Request,
    mut gain: impl FnMut(&[u8]) -> f64,
) -> Option<(i64, Vec<u8>)> {
    let mut top: Option<(f64, Vec<u8>)> = None;
    for gpus in gpu_options(n, r) {
        let g = gain(&gpus);
        if top.as_ref().is_none_or(|(best, _)| g > *best) {
            top = Some((g, gpus));
        }
    }
    top.map(|(g, gpus)| ((100.0 * sigmoid(g / 1000.0)) as i64, gpus))
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The GPU options for `r` on `n` worth scoring: for a shared request one per distinct
/// free amount that fits (GPUs with equal free milli are interchangeable), else the default.
pub(crate) fn gpu_options(n: &NodeState, r: &Request) -> Vec<Vec<u8>> {
    if !r.is_shared() {
        return vec![n.default_gpus(r)];
    }
    let mut seen: Vec<u32> = Vec::new();
    let mut out = Vec::new();
    for (g, &f) in n.gpu_free.iter().enumerate() {
        if f >= r.gpu_milli && !seen.contains(&f) {
            seen.push(f);
            out.push(vec![g as u8]);
        }
    }
    out
}

impl PlacementPolicy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn given(&self) -> &'static str {
        "the pod classes of the whole original trace, before the run"
    }

    fn choose(&mut self, cluster: &Cluster, r: &Request, _rng: &mut StdRng) -> Option<Choice> {
        let mut candidates = Vec::new();
        for (i, n) in feasible(cluster, r) {
            let delta = |gpus: &[u8]| self.current[i] - self.memo.after(n, r, gpus, &self.classes);
            if let Some((score, gpus)) = scored_option(n, r, delta) {
                candidates.push((score, i, gpus));
            }
        }
        best(cluster, candidates.into_iter()).map(|(node, gpus)| Choice { node, gpus })
    }

    fn node_changed(&mut self, cluster: &Cluster, node: usize) {
        self.current[node] = fragmentation(&cluster.nodes[node], &self.classes);
    }
}
