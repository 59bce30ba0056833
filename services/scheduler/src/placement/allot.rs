//! Allot's own placement policy, as it runs in the openb evaluation.
//!
//! It scores a placement by how much it changes three expectations about a node, each in
//! GPU milli that future work could not use:
//! - the fragment FGD measures (free GPU milli that the typical pod classes could not use),
//! - the eventual waste of each GPU it touches: [`waste_table`] gives, for a GPU with `f`
//!   milli free, the milli expected to stay free once pods of the workload's sizes keep
//!   landing on it, so it tells a hole that later pods fill exactly (two 470s) from one that
//!   nothing will fill (a 320 next to a 470 leaves 210); sizes rarer than
//!   [`RARE_SIZE`] are not counted on to fill holes, as too few of them come for all the
//!   holes they fit,
//! - the GPU milli stranded because the node's CPU (or memory) would run out first at the
//!   workload's CPU (memory) per GPU milli: it keeps CPU-hungry pods, CPU-only ones above
//!   all, off nodes whose GPUs still need that CPU,
//! - the scarcity of the node's GPU model ([`Scarcity`]): a milli of a model that
//!   model-constrained requests need is worth more than a milli any request can use, in
//!   proportion to how much of the constrained demand falls on that model's free capacity
//!   beyond the average; so work that can run anywhere goes where constrained work cannot,
//!   and constrained work goes to the model of its set that others need least.
//!
//! The workload mix behind all three is learned from the requests that arrived (each counted
//! once, however often it is chosen for while it waits), refreshed as more arrive: nothing
//! about the trace is given up front. On the live path old arrivals fade
//! ([`Allot::fading`]), as the workload drifts.
//! Scores are quantised as FGD's are, and ties go to the node first in the run's seeded
//! order, which keeps consolidating work onto the nodes already in use.

use std::collections::{BTreeSet, HashMap};

use rand::rngs::StdRng;
use rustc_hash::FxHashMap;

use super::cluster::{Cluster, GPU_MILLI, NodeState, Request};
use super::policies::{
    Choice, FragMemo, PlacementPolicy, RequestClass, best, class_of, classes_from_counts,
    fragmentation, scored_option,
};

/// The share of requests the typical classes cover (as FGD).
const COVERAGE: f64 = 0.95;
/// GPU sizes with less than this share of the GPU requests do not count in [`waste_table`].
pub const RARE_SIZE: f64 = 0.01;
/// How much the eventual-waste term weighs against the fragment.
const WASTE_WEIGHT: f64 = 1.5;
/// How much GPU milli stranded for want of CPU weighs against the fragment.
const CPU_STRANDED_WEIGHT: f64 = 3.0;
/// How much GPU milli stranded for want of memory weighs against the fragment.
const MEMORY_STRANDED_WEIGHT: f64 = 0.5;
/// How much a milli of a scarce model weighs beyond a milli of an average one, per unit of
/// excess pressure ([`Scarcity`]). Not tuned: one, from the units. Excess pressure `x` on a
/// model says that `x` of each of its free milli is owed to constrained demand beyond what
/// an average milli is; taking it leaves that much constrained work without a GPU, which
/// is GPU milli unusable exactly as a fragment is. (Tuned on the shared traces with model
/// constraints, `gpuspec10` and `gpuspec20`, 0.1 does 0.03 and 0.15 points better there and
/// up to 5 points worse on heavier constraints: see docs/benchmarks.md.)
const SCARCITY_WEIGHT: f64 = 1.0;
/// Excess pressure counts up to one milli per milli taken: a milli cannot leave more than
/// a milli of constrained work without a GPU.
const SCARCITY_CAP: f64 = 1.0;
/// The learned mix is refreshed after 1, 2, 4, ... requests, then every this many.
const REFRESH_EVERY: u64 = 512;

/// W(f) for f = 0..=1000: the milli a GPU with `f` free is expected to end with when pods
/// of the classes' sizes (in proportion to their frequency, conditioned on fitting) keep
/// landing on it until none fits. Sizes with less than `rare` of the GPU requests are left
/// out.
pub fn waste_table(classes: &[RequestClass], rare: f64) -> Vec<f64> {
    let mut by_size: HashMap<usize, f64> = HashMap::new();
    for c in classes.iter().filter(|c| c.request.num_gpu > 0) {
        *by_size.entry(c.request.gpu_milli as usize).or_default() +=
            c.weight * f64::from(c.request.num_gpu);
    }
    let total: f64 = by_size.values().sum();
    let mut sizes: Vec<(usize, f64)> = by_size
        .into_iter()
        .filter(|&(size, p)| size > 0 && p >= rare * total)
        .collect();
    sizes.sort_by_key(|s| s.0);
    let mut w = vec![0.0; GPU_MILLI as usize + 1];
    for f in 0..w.len() {
        let (mut sum, mut weight) = (0.0, 0.0);
        for &(size, p) in &sizes {
            if size <= f {
                sum += p * w[f - size];
                weight += p;
            }
        }
        w[f] = if weight > 0.0 { sum / weight } else { f as f64 };
    }
    w
}

/// What the policy has learned of the workload.
#[derive(Debug)]
struct Mix {
    /// Arrivals, and the memory they asked for in all, by class: each arrival weighs
    /// `unit` at the time, so that with fading the older ones weigh less (in proportion).
    counts: HashMap<Request, (f64, f64)>,
    seen: u64,
    /// What the next arrival weighs; grows by 2^(1/half-life) per arrival when fading.
    unit: f64,
    /// Arrivals after which one weighs half as much as a new one; `None`: never fades.
    half_life: Option<f64>,
    classes: Vec<RequestClass>,
    waste: Vec<f64>,
    /// CPU milli and memory MiB per GPU milli of the GPU classes; `None` before any GPU
    /// request.
    cpu_per_milli: Option<f64>,
    memory_per_milli: Option<f64>,
    /// Each set of acceptable models (a mask) with its share of the GPU milli requested,
    /// over every arrival (not only the typical classes: a rare constraint still needs its
    /// model).
    demand_by_models: Vec<(u64, f64)>,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            counts: HashMap::new(),
            seen: 0,
            unit: 1.0,
            half_life: None,
            classes: Vec::new(),
            waste: Vec::new(),
            cpu_per_milli: None,
            memory_per_milli: None,
            demand_by_models: Vec::new(),
        }
    }
}

/// What Allot's policy has learned of the workload, whole: taken up by another instance
/// ([`PlacementPolicy::take_up`]), it decides exactly as this one would. The control plane
/// keeps it in its database, so a new leader carries on where the last one stopped.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Learned {
    /// Each class's weighted arrivals and memory asked for, in a stable order.
    counts: Vec<(Request, f64, f64)>,
    seen: u64,
    unit: f64,
    /// The figures derived at the last refresh (not recomputed: they were derived from the
    /// counts as they were then).
    classes: Vec<RequestClass>,
    cpu_per_milli: Option<f64>,
    memory_per_milli: Option<f64>,
    demand_by_models: Vec<(u64, f64)>,
}

/// Past this, the weights are brought back to the scale of one arrival (and classes that
/// have faded to nothing are forgotten).
const UNIT_CEILING: f64 = 1e12;

impl Mix {
    /// Counts the arrival `r`; true when the derived figures were refreshed.
    fn observe(&mut self, r: &Request) -> bool {
        let unit = self.unit;
        let class = self.counts.entry(class_of(r)).or_default();
        class.0 += unit;
        class.1 += unit * f64::from(r.memory_mib);
        if let Some(h) = self.half_life {
            self.unit *= 2f64.powf(1.0 / h);
            if self.unit > UNIT_CEILING {
                for c in self.counts.values_mut() {
                    c.0 /= self.unit;
                    c.1 /= self.unit;
                }
                self.counts.retain(|_, c| c.0 > 1e-9);
                self.unit = 1.0;
            }
        }
        self.seen += 1;
        let due = if self.seen < REFRESH_EVERY {
            self.seen.is_power_of_two()
        } else {
            self.seen.is_multiple_of(REFRESH_EVERY)
        };
        if due {
            self.refresh();
        }
        due
    }

    fn learned(&self) -> Learned {
        let mut counts: Vec<(Request, f64, f64)> =
            self.counts.iter().map(|(r, (n, m))| (*r, *n, *m)).collect();
        counts
            .sort_by_key(|(r, _, _)| (r.num_gpu, r.gpu_milli, r.cpu_milli, r.memory_mib, r.models));
        Learned {
            counts,
            seen: self.seen,
            unit: self.unit,
            classes: self.classes.clone(),
            cpu_per_milli: self.cpu_per_milli,
            memory_per_milli: self.memory_per_milli,
            demand_by_models: self.demand_by_models.clone(),
        }
    }

    /// Carries on from `l` (the fading half-life stays this one's).
    fn take_up(&mut self, l: Learned) {
        self.counts = l.counts.into_iter().map(|(r, n, m)| (r, (n, m))).collect();
        self.seen = l.seen;
        self.unit = l.unit;
        self.waste = waste_table(&l.classes, RARE_SIZE);
        self.classes = l.classes;
        self.cpu_per_milli = l.cpu_per_milli;
        self.memory_per_milli = l.memory_per_milli;
        self.demand_by_models = l.demand_by_models;
    }

    fn refresh(&mut self) {
        let counts = self.counts.iter().map(|(r, (n, _))| (*r, *n)).collect();
        self.classes = classes_from_counts(&counts, COVERAGE);
        self.waste = waste_table(&self.classes, RARE_SIZE);
        let (mut cpu, mut memory, mut gpu) = (0.0, 0.0, 0.0);
        for c in self.classes.iter().filter(|c| c.request.num_gpu > 0) {
            let (n, memory_sum) = self.counts.get(&c.request).copied().unwrap_or((1.0, 0.0));
            cpu += c.weight * f64::from(c.request.cpu_milli);
            memory += c.weight * memory_sum / n.max(f64::MIN_POSITIVE);
            gpu += c.weight * c.request.gpu_total() as f64;
        }
        self.cpu_per_milli = (gpu > 0.0 && cpu > 0.0).then(|| cpu / gpu);
        self.memory_per_milli = (gpu > 0.0 && memory > 0.0).then(|| memory / gpu);
        let mut by_models: HashMap<u64, f64> = HashMap::new();
        for (r, (n, _)) in self.counts.iter().filter(|(r, _)| r.num_gpu > 0) {
            *by_models.entry(r.models).or_default() += n * r.gpu_total() as f64;
        }
        let total: f64 = by_models.values().sum();
        self.demand_by_models = by_models
            .into_iter()
            .filter(|_| total > 0.0)
            .map(|(models, milli)| (models, milli / total))
            .collect();
        self.demand_by_models.sort_by_key(|d| d.0);
    }

    /// GPU milli of a node with these free amounts that its CPU or memory could not serve,
    /// weighted.
    fn stranded(&self, gpu_free: f64, cpu_free: f64, memory_free: f64) -> f64 {
        let short = |ratio: Option<f64>, free: f64| {
            ratio.map_or(0.0, |ratio| (gpu_free - free / ratio).max(0.0))
        };
        CPU_STRANDED_WEIGHT * short(self.cpu_per_milli, cpu_free)
            + MEMORY_STRANDED_WEIGHT * short(self.memory_per_milli, memory_free)
    }

    /// How much placing `r` on `gpus` of `n` lowers the node's expected unusable milli
    /// (higher is better), given its fragment now (`before`) and after (`after`), and the
    /// excess pressure on the node's model (`scarce`, per milli).
    fn gain(
        &self,
        n: &NodeState,
        r: &Request,
        gpus: &[u8],
        (before, after): (f64, f64),
        scarce: f64,
    ) -> f64 {
        let (gpu_free, cpu_free, memory_free) = (
            f64::from(n.gpu_free_total()),
            f64::from(n.cpu_free),
            f64::from(n.memory_free),
        );
        let stranded = self.stranded(gpu_free, cpu_free, memory_free)
            - self.stranded(
                gpu_free - r.gpu_total() as f64,
                cpu_free - f64::from(r.cpu_milli),
                memory_free - f64::from(r.memory_mib),
            );
        let waste: f64 = gpus
            .iter()
            .map(|&g| {
                let f = n.gpu_free[usize::from(g)] as usize;
                self.waste[f] - self.waste[f - r.gpu_milli as usize]
            })
            .sum();
        (before - after) + stranded + WASTE_WEIGHT * waste
            - SCARCITY_WEIGHT * scarce * r.gpu_total() as f64
    }
}

/// How scarce each GPU model's free capacity is for the model-constrained demand.
///
/// A set `c` of acceptable models with share `s_c` of the GPU demand puts pressure
/// `s_c / F_c` on each free milli of its models (`F_c`: the free milli of the models in
/// `c`), so model `m` carries `π_m = F · Σ_{c ∋ m} s_c / F_c` (`F`: all free milli), the
/// share of the demand that must land on it per share of the free capacity it is. Averaged
/// over the free milli, `π` is the constrained share `S = Σ s_c`; a milli of model `m` costs
/// `π_m − S` more than an average one (capped at [`SCARCITY_CAP`]). Sets covering every
/// model, and unconstrained requests, put no pressure on any. Free milli per model is kept
/// as nodes change; the pressure is recomputed for each decision (a few models, a few sets).
#[derive(Debug, Default)]
struct Scarcity {
    /// Free GPU milli of each node, as last seen.
    node_free: Vec<u64>,
    /// Free GPU milli by model index.
    free: Vec<f64>,
    /// Excess pressure per milli, by model index.
    excess: Vec<f64>,
}

impl Scarcity {
    fn new(cluster: &Cluster) -> Self {
        let mut s = Self {
            node_free: vec![0; cluster.nodes.len()],
            free: vec![0.0; cluster.models.len().clamp(1, 64)],
            excess: vec![0.0; cluster.models.len().clamp(1, 64)],
        };
        for node in 0..cluster.nodes.len() {
            s.node_changed(cluster, node);
        }
        s
    }

    fn node_changed(&mut self, cluster: &Cluster, node: usize) {
        let n = &cluster.nodes[node];
        let now = u64::from(n.gpu_free_total());
        let model = usize::from(n.model).min(self.free.len() - 1);
        self.free[model] += now as f64 - self.node_free[node] as f64;
        self.node_free[node] = now;
    }

    /// Recomputes the excess pressure from the demand by sets of models.
    fn refresh(&mut self, demand_by_models: &[(u64, f64)]) {
        let all = if self.free.len() >= 64 {
            u64::MAX
        } else {
            (1u64 << self.free.len()) - 1
        };
        let total: f64 = self.free.iter().sum();
        let mut pressure = vec![0.0; self.free.len()];
        let mut constrained = 0.0;
        for &(models, share) in demand_by_models {
            let models = models & all;
            if models == all || models == 0 {
                continue;
            }
            constrained += share;
            let members = || (0..self.free.len()).filter(move |m| (models >> m) & 1 == 1);
            let free: f64 = members().map(|m| self.free[m]).sum();
            for m in members() {
                pressure[m] += if free > 0.0 { share / free } else { 0.0 };
            }
        }
        for (excess, p) in self.excess.iter_mut().zip(pressure) {
            *excess = (total * p - constrained).clamp(-SCARCITY_CAP, SCARCITY_CAP);
        }
    }

    fn of(&self, n: &NodeState) -> f64 {
        self.excess
            .get(usize::from(n.model))
            .copied()
            .unwrap_or_default()
    }
}

/// What a node's score depends on; nodes with equal keys are interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StateKey {
    cpu: u32,
    memory: u32,
    model: u8,
    /// Free milli of its GPUs, in ascending order.
    free: Vec<u32>,
}

impl StateKey {
    fn of(n: &NodeState) -> Self {
        let mut free = n.gpu_free.clone();
        free.sort_unstable();
        Self {
            cpu: n.cpu_free,
            memory: n.memory_free,
            model: n.model,
            free,
        }
    }
}

/// The nodes grouped by state, each group ordered by the run's node order: a decision
/// scores each distinct state once and takes the first node that has it, which chooses
/// exactly what scoring every node would, at a cost that grows with the distinct states
/// rather than with the nodes.
#[derive(Debug, Default)]
struct Groups {
    by_state: FxHashMap<StateKey, BTreeSet<(u32, usize)>>,
    state_of: Vec<StateKey>,
}

impl Groups {
    fn new(cluster: &Cluster) -> Self {
        let mut groups = Self::default();
        for (i, n) in cluster.nodes.iter().enumerate() {
            let key = StateKey::of(n);
            groups
                .by_state
                .entry(key.clone())
                .or_default()
                .insert((cluster.rank[i], i));
            groups.state_of.push(key);
        }
        groups
    }

    /// Moves `node` to the group of its state now.
    fn update(&mut self, cluster: &Cluster, node: usize) {
        let entry = (cluster.rank[node], node);
        let old = &self.state_of[node];
        if let Some(group) = self.by_state.get_mut(old) {
            group.remove(&entry);
            if group.is_empty() {
                self.by_state.remove(old);
            }
        }
        let key = StateKey::of(&cluster.nodes[node]);
        self.by_state.entry(key.clone()).or_default().insert(entry);
        self.state_of[node] = key;
    }

    /// The first node of each group.
    fn representatives(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_state
            .values()
            .filter_map(|g| g.first().map(|(_, node)| *node))
    }
}

/// Allot's policy: see the module documentation.
pub struct Allot {
    mix: Mix,
    /// Each node's fragment under the current mix.
    current: Vec<f64>,
    memo: FragMemo,
    /// Built on the first decision (the run's node order is set by then).
    groups: Option<Groups>,
    scarcity: Scarcity,
}

impl Allot {
    pub fn new(cluster: &Cluster) -> Self {
        let mut mix = Mix::default();
        mix.refresh();
        Self {
            current: vec![0.0; cluster.nodes.len()],
            mix,
            memo: FragMemo::default(),
            groups: None,
            scarcity: Scarcity::new(cluster),
        }
    }

    /// Lets old arrivals fade: one `half_life` arrivals old weighs half as much as a new one
    /// (the live workload drifts; a trace replayed whole does not).
    pub fn fading(mut self, half_life: f64) -> Self {
        self.mix.half_life = (half_life.is_finite() && half_life > 0.0).then_some(half_life);
        self
    }

    /// Each node's fragment under the mix just learnt: once per distinct state when the
    /// nodes are grouped (nodes of a state share it), else node by node.
    fn relearn(&mut self, cluster: &Cluster) {
        self.memo = FragMemo::default();
        match &self.groups {
            Some(groups) => {
                for group in groups.by_state.values() {
                    let Some(&(_, first)) = group.first() else {
                        continue;
                    };
                    let f = fragmentation(&cluster.nodes[first], &self.mix.classes);
                    for &(_, node) in group {
                        self.current[node] = f;
                    }
                }
            }
            None => {
                for (current, n) in self.current.iter_mut().zip(&cluster.nodes) {
                    *current = fragmentation(n, &self.mix.classes);
                }
            }
        }
    }
}

impl PlacementPolicy for Allot {
    fn name(&self) -> &'static str {
        "allot"
    }

    fn given(&self) -> &'static str {
        "nothing: it learns the workload mix from the requests that have arrived so far"
    }

    fn arrived(&mut self, cluster: &Cluster, r: &Request) {
        if self.mix.observe(r) {
            self.relearn(cluster);
        }
    }

    fn learned_mix(&self) -> Vec<RequestClass> {
        self.mix.classes.clone()
    }

    fn learned(&self) -> Option<Learned> {
        Some(self.mix.learned())
    }

    fn take_up(&mut self, learned: Learned) {
        self.mix.take_up(learned);
    }

    fn choose(&mut self, cluster: &Cluster, r: &Request, _rng: &mut StdRng) -> Option<Choice> {
        let groups = self.groups.get_or_insert_with(|| Groups::new(cluster));
        self.scarcity.refresh(&self.mix.demand_by_models);
        let mut candidates = Vec::new();
        for i in groups.representatives() {
            let n = &cluster.nodes[i];
            if !n.fits(r) {
                continue;
            }
            let scarce = self.scarcity.of(n);
            let gain = |gpus: &[u8]| {
                let after = self.memo.after(n, r, gpus, &self.mix.classes);
                self.mix.gain(n, r, gpus, (self.current[i], after), scarce)
            };
            if let Some((score, gpus)) = scored_option(n, r, gain) {
                candidates.push((score, i, gpus));
            }
        }
        best(cluster, candidates.into_iter()).map(|(node, gpus)| Choice { node, gpus })
    }

    fn node_changed(&mut self, cluster: &Cluster, node: usize) {
        self.current[node] = fragmentation(&cluster.nodes[node], &self.mix.classes);
        if let Some(groups) = &mut self.groups {
            groups.update(cluster, node);
        }
        self.scarcity.node_changed(cluster, node);
    }

    fn reset(&mut self, cluster: &Cluster) {
        self.current = vec![0.0; cluster.nodes.len()];
        self.groups = None;
        self.scarcity = Scarcity::new(cluster);
        self.relearn(cluster);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Node;

    fn class(num_gpu: u8, gpu_milli: u32, weight: f64) -> RequestClass {
        RequestClass {
            request: Request {
                cpu_milli: 1000,
                memory_mib: 0,
                num_gpu,
                gpu_milli,
                models: u64::MAX,
            },
            weight,
        }
    }

    #[test]
    fn waste_tells_holes_that_fill_from_holes_that_do_not() {
        let w = waste_table(&[class(1, 470, 0.5), class(1, 320, 0.5)], 0.0);
        assert_eq!(w[0], 0.0);
        assert_eq!(w[200], 200.0, "nothing fits 200 milli");
        assert_eq!(
            w[530],
            0.5 * 60.0 + 0.5 * 210.0,
            "a 470 leaves 60, a 320 210"
        );
        assert!(w[360] < w[210], "a 320 still fits 360 and leaves 40");
        let empty = waste_table(&[], 0.0);
        assert!(empty.iter().enumerate().all(|(f, w)| *w == f as f64));
        let rare = waste_table(&[class(1, 470, 0.995), class(1, 160, 0.005)], RARE_SIZE);
        assert_eq!(rare[190], 190.0, "too few 160s come to count on them");
    }

    #[test]
    fn the_mix_is_learned_from_what_was_seen() {
        let mut mix = Mix::default();
        mix.refresh();
        assert!(mix.classes.is_empty() && mix.cpu_per_milli.is_none());
        let r = Request {
            memory_mib: 4000,
            ..class(1, 500, 1.0).request
        };
        assert!(mix.observe(&r), "refreshed after the first request");
        assert_eq!(mix.classes.len(), 1);
        assert_eq!(
            mix.cpu_per_milli,
            Some(2.0),
            "1000 CPU milli per 500 GPU milli"
        );
        assert_eq!(
            mix.memory_per_milli,
            Some(8.0),
            "4000 MiB per 500 GPU milli"
        );
        assert!(mix.observe(&r), "and after the second");
        assert!(!mix.observe(&r), "but not the third");
        // 1000 GPU milli free with CPU for 250 of them strands 750, weighted.
        let cpu_short = mix.stranded(1000.0, 500.0, 1e9);
        assert_eq!(cpu_short, CPU_STRANDED_WEIGHT * 750.0);
        let memory_short = mix.stranded(1000.0, 1e9, 4000.0);
        assert_eq!(memory_short, MEMORY_STRANDED_WEIGHT * 500.0);
        assert_eq!(mix.stranded(1000.0, 4000.0, 8000.0), 0.0);
    }

    #[test]
    fn old_arrivals_fade_with_the_half_life() {
        let (a, b) = (class(1, 500, 1.0).request, class(2, 1000, 1.0).request);
        let weight_of_b = |half_life: Option<f64>, first: usize, then: usize| {
            let mut mix = Mix {
                half_life,
                ..Mix::default()
            };
            for _ in 0..first {
                mix.observe(&a);
            }
            for _ in 0..then {
                mix.observe(&b);
            }
            mix.refresh();
            mix.classes
                .iter()
                .find(|c| c.request == b)
                .map_or(0.0, |c| c.weight)
        };
        assert_eq!(weight_of_b(None, 300, 100), 0.25, "counted, not faded");
        // Arrival k weighs 2^(k/100): the last hundred weigh 2^4 - 2^3 against 2^3 - 1.
        let faded = weight_of_b(Some(100.0), 300, 100);
        assert!((faded - 8.0 / 15.0).abs() < 1e-9, "{faded}");
        // A half-life of one arrival doubles the weight each time: the weights are brought
        // back to scale on the way, and the last arrival still weighs all the others.
        let steep = weight_of_b(Some(1.0), 60, 1);
        assert!((steep - 0.5).abs() < 1e-6, "{steep}");
    }

    fn node(name: &str, model: &str) -> Node {
        Node {
            name: name.into(),
            cpu_milli: 64_000,
            memory_mib: 256_000,
            gpus: 2,
            model: model.into(),
            gpu_memory_mib: 0,
        }
    }

    /// Two nodes of model A and two of model B; a quarter of the demand is tied to A.
    fn cluster_with_a_needed() -> (Cluster, Request, Request) {
        let cluster = Cluster::new(&[
            node("a0", "A"),
            node("a1", "A"),
            node("b0", "B"),
            node("b1", "B"),
        ]);
        let any = class(1, 1000, 1.0).request;
        let only_a = Request {
            models: cluster.model_mask(false, |m| m == "A"),
            ..any
        };
        (cluster, any, only_a)
    }

    #[test]
    fn a_model_constrained_demand_needs_is_scarce_for_the_rest() {
        let (mut cluster, any, only_a) = cluster_with_a_needed();
        let mut s = Scarcity::new(&cluster);
        assert_eq!(s.free, vec![4000.0, 4000.0]);
        // A quarter of the demand can only use A, half of the free milli: pressure on A is
        // 8000 × 0.25 / 4000 = 0.5, on B none; the average is the constrained share, 0.25.
        s.refresh(&[(only_a.models, 0.25), (any.models, 0.75)]);
        assert_eq!(s.excess, vec![0.25, -0.25]);
        // Unconstrained demand, or a set covering every model, puts no pressure anywhere.
        s.refresh(&[(any.models, 1.0), (0b11, 0.5)]);
        assert_eq!(s.excess, vec![0.0, 0.0]);
        // As A fills up, what is left of it grows scarcer, up to the cap.
        cluster.nodes[0].place(&any, &[0, 1]);
        cluster.nodes[1].place(&any, &[0]);
        s.node_changed(&cluster, 0);
        s.node_changed(&cluster, 1);
        assert_eq!(s.free, vec![1000.0, 4000.0]);
        s.refresh(&[(only_a.models, 0.25), (any.models, 0.75)]);
        assert_eq!(s.excess, vec![SCARCITY_CAP, -0.25]);
    }

    #[test]
    fn work_that_runs_anywhere_leaves_a_needed_model_to_the_work_that_needs_it() {
        let (cluster, any, only_a) = cluster_with_a_needed();
        let choose = |arrivals: &[Request]| {
            let mut policy = Allot::new(&cluster);
            for r in arrivals {
                policy.arrived(&cluster, r);
            }
            let mut rng = rand::SeedableRng::seed_from_u64(1);
            let choice = policy.choose(&cluster, &any, &mut rng).map(|c| c.node);
            choice.map(|n| cluster.models[usize::from(cluster.nodes[n].model)].clone())
        };
        // Without constrained arrivals the tie goes to the first node in the order (A).
        // (The mix is relearnt after 1, 2, 4, ... arrivals.)
        assert_eq!(choose(&[any, any, any, any]).as_deref(), Some("A"));
        // With a share of the demand tied to A, the unconstrained job goes to B.
        assert_eq!(choose(&[any, any, any, only_a]).as_deref(), Some("B"));
    }
}
