//! The evaluation protocol of the openb README: the seeded arrival stream, one-at-a-time
//! placement without departures, and allocation measured against arrival.

use std::collections::BTreeMap;

use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::trace::Pod;
use crate::placement::Cluster;
use crate::placement::{Choice, PlacementPolicy};

/// Sorts by name, shuffles with `rng`, then inflates with random clones until the GPU
/// demand reaches `tune` × capacity (stopping at the first clone that would pass it), or
/// removes random pods while it is above.
pub fn arrival_stream(pods: &[Pod], capacity: u64, tune: f64, rng: &mut StdRng) -> Vec<Pod> {
    let mut stream: Vec<Pod> = pods.to_vec();
    stream.sort_by(|a, b| a.name.cmp(&b.name));
    stream.shuffle(rng);
    let target = (tune * capacity as f64) as u64;
    let mut total: u64 = stream.iter().map(Pod::gpu_total).sum();
    if total < target && !pods.is_empty() {
        let mut clones = 0;
        loop {
            let original = &pods[rng.random_range(0..pods.len())];
            if total + original.gpu_total() > target {
                break;
            }
            total += original.gpu_total();
            clones += 1;
            let mut clone = original.clone();
            clone.name = format!("{}-clone-{clones}", original.name);
            stream.push(clone);
        }
    } else {
        while total > target && !stream.is_empty() {
            let gone = stream.remove(rng.random_range(0..stream.len()));
            total -= gone.gpu_total();
        }
    }
    stream
}

/// What one run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Per arriving pod, in order: where it went (`None`: dropped).
    pub placements: Vec<Option<Choice>>,
    /// Allocation at arrival: for each whole arrival percentage reached, the mean allocated
    /// percentage over the pods whose arrival rounds to it.
    pub alloc_at: BTreeMap<u32, f64>,
    pub placed: usize,
}

impl RunOutcome {
    pub fn alloc_at(&self, arrival_pct: u32) -> Option<f64> {
        self.alloc_at.get(&arrival_pct).copied()
    }
}

/// Places `stream` one pod at a time with `policy`; nothing leaves, nothing is retried.
pub fn simulate(
    cluster: &mut Cluster,
    stream: &[Pod],
    policy: &mut dyn PlacementPolicy,
    rng: &mut StdRng,
) -> RunOutcome {
    let capacity = cluster.capacity.max(1) as f64;
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let mut sums: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
    let mut placements = Vec::with_capacity(stream.len());
    let mut placed = 0;
    for pod in stream {
        let r = pod.request(cluster);
        arrived += r.gpu_total();
        policy.arrived(cluster, &r);
        let choice = policy.choose(cluster, &r, rng);
        if let Some(c) = &choice {
            cluster.nodes[c.node].place(&r, &c.gpus);
            allocated += r.gpu_total();
            placed += 1;
            policy.node_changed(cluster, c.node);
        }
        placements.push(choice);
        let arrival_pct = (100.0 * arrived as f64 / capacity).round() as u32;
        let entry = sums.entry(arrival_pct).or_default();
        entry.0 += 100.0 * allocated as f64 / capacity;
        entry.1 += 1;
    }
    RunOutcome {
        placements,
        alloc_at: sums
            .into_iter()
            .map(|(k, (sum, n))| (k, sum / f64::from(n)))
            .collect(),
        placed,
    }
}

/// One seeded run end to end: the stream from `seed`, ties broken by a generator derived
/// from it.
pub fn run_seed(
    cluster: &Cluster,
    pods: &[Pod],
    tune: f64,
    seed: u64,
    policy: &mut dyn PlacementPolicy,
) -> (Vec<Pod>, RunOutcome) {
    let mut rng = StdRng::seed_from_u64(seed);
    let stream = arrival_stream(pods, cluster.capacity, tune, &mut rng);
    let mut cluster = cluster.clone();
    cluster.shuffle_ranks(&mut rng);
    let outcome = simulate(&mut cluster, &stream, policy, &mut rng);
    (stream, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openb::{parse_nodes, parse_pods, policy};

    const NODES: &str =
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,64000,131072,4,V100M32\n";
    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
        p0,4000,8192,1,500,\np1,0,1024,0,0,\np2,8000,16384,2,1000,V100M32\np3,2000,4096,1,300,T4|A10\n";

    #[test]
    fn parsing_reads_the_trace_and_names_bad_lines() {
        let pods = parse_pods(PODS).expect("pods");
        assert_eq!(pods[1].cpu_milli, 100, "cpu_milli 0 counts as 100");
        assert_eq!(pods[3].gpu_spec, ["T4", "A10"]);
        let err = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,2,500\n")
            .expect_err("a shared multi-GPU pod");
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = parse_nodes("sn,cpu_milli,memory_mib,gpu,model\nn,lots,1,1,T4\n")
            .expect_err("not a number");
        assert!(err.to_string().contains("cpu_milli"), "{err}");
        assert!(parse_nodes("sn,cpu_milli\n").is_err(), "missing columns");
    }

    #[test]
    fn the_stream_is_seeded_and_inflated_to_the_target() {
        let pods = parse_pods(PODS).expect("pods");
        let capacity = 6_000;
        let a = arrival_stream(&pods, capacity, 1.3, &mut StdRng::seed_from_u64(7));
        let b = arrival_stream(&pods, capacity, 1.3, &mut StdRng::seed_from_u64(7));
        assert_eq!(a, b, "same seed, same stream");
        let total: u64 = a.iter().map(Pod::gpu_total).sum();
        assert!(total <= 7_800 && total + 2_000 > 7_800, "{total}");
        let shrunk = arrival_stream(&pods, 1_000, 1.0, &mut StdRng::seed_from_u64(7));
        assert!(shrunk.iter().map(Pod::gpu_total).sum::<u64>() <= 1_000);
    }

    #[test]
    fn no_policy_overcommits_a_node_or_breaks_a_constraint() {
        let nodes = parse_nodes(NODES).expect("nodes");
        let pods = parse_pods(PODS).expect("pods");
        let cluster = Cluster::new(&nodes);
        for name in crate::openb::POLICIES {
            let mut p = policy(name, &cluster, &pods).expect("policy");
            let (stream, outcome) = run_seed(&cluster, &pods, 3.0, 1, p.as_mut());
            let mut used = vec![(0u32, 0u32, vec![0u32; 4]); nodes.len()];
            for (pod, choice) in stream.iter().zip(&outcome.placements) {
                let Some(c) = choice else { continue };
                let n = &nodes[c.node];
                assert!(pod.accepts(&n.model) || pod.num_gpu == 0, "{name}: model");
                assert_eq!(c.gpus.len(), usize::from(pod.num_gpu), "{name}: GPU count");
                let u = &mut used[c.node];
                u.0 += pod.cpu_milli;
                u.1 += pod.memory_mib;
                for &g in &c.gpus {
                    u.2[usize::from(g)] += pod.gpu_milli;
                }
                assert!(
                    u.0 <= n.cpu_milli && u.1 <= n.memory_mib,
                    "{name}: CPU/memory"
                );
                assert!(
                    u.2.iter().all(|&m| m <= 1000),
                    "{name}: a GPU over 1000 milli"
                );
                assert!(c.gpus.iter().all(|&g| g < n.gpus), "{name}: no such GPU");
            }
            assert!(outcome.placed > 0, "{name}");
        }
    }
}
