//! A seeded synthetic cluster and backlog for the scale benchmark: nodes of a few GPU
//! models, and requests in the proportions the openb default trace shows (whole GPUs,
//! common GPU shares, multi-GPU jobs, CPU-only jobs, some tied to one model).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::trace::{Node, Pod};
use crate::placement::Cluster;

/// The benchmark's setup from `seed`: the cluster (nodes in a seeded order that breaks ties),
/// the backlog, and the generator the policy draws from.
pub fn scenario(
    nodes: usize,
    gpus_per_node: u8,
    pending: usize,
    seed: u64,
) -> (Cluster, Vec<Pod>, StdRng) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cluster = Cluster::new(&self::cluster(nodes, gpus_per_node, &mut rng));
    let jobs = backlog(pending, gpus_per_node, &mut rng);
    cluster.shuffle_ranks(&mut rng);
    (cluster, jobs, rng)
}

/// GPU models of the synthetic fleet and their share of its nodes.
const MODELS: [(&str, f64); 3] = [("H200", 0.5), ("A100-80GB", 0.3), ("L40S", 0.2)];

/// Memory of each model's GPUs.
fn gpu_memory_mib(model: &str) -> u32 {
    match model {
        "H200" => 141 * 1024,
        "A100-80GB" => 80 * 1024,
        _ => 48 * 1024,
    }
}

/// Request shapes: (weight, CPU milli, memory MiB, GPUs, milli per GPU).
const SHAPES: [(f64, u32, u32, u8, u32); 12] = [
    (0.40, 8_000, 49_152, 1, 1000),
    (0.13, 3_000, 5_600, 1, 810),
    (0.09, 12_000, 47_104, 1, 470),
    (0.04, 4_000, 22_888, 1, 320),
    (0.03, 6_000, 47_104, 1, 650),
    (0.02, 2_000, 30_517, 1, 230),
    (0.02, 4_000, 12_288, 1, 460),
    (0.01, 2_000, 15_258, 1, 160),
    (0.03, 32_000, 196_608, 4, 1000),
    (0.03, 64_000, 393_216, 8, 1000),
    (0.02, 16_000, 98_304, 2, 1000),
    (0.18, 4_000, 16_384, 0, 0),
];

/// `nodes` nodes of `gpus_per_node` GPUs, with 12 cores and 48 GiB per GPU.
pub fn cluster(nodes: usize, gpus_per_node: u8, rng: &mut StdRng) -> Vec<Node> {
    (0..nodes)
        .map(|i| {
            let model = pick_model(rng);
            Node {
                name: format!("node-{i:05}"),
                cpu_milli: 12_000 * u32::from(gpus_per_node).max(1),
                memory_mib: 49_152 * u32::from(gpus_per_node).max(1),
                gpus: gpus_per_node,
                model: model.to_owned(),
                gpu_memory_mib: gpu_memory_mib(model),
            }
        })
        .collect()
}

/// `count` requests; one in ten GPU requests accepts only one model.
pub fn backlog(count: usize, gpus_per_node: u8, rng: &mut StdRng) -> Vec<Pod> {
    let shapes: Vec<_> = SHAPES
        .iter()
        .filter(|s| s.3 <= gpus_per_node)
        .map(|&(w, cpu, mem, gpus, milli)| (w, (cpu, mem, gpus, milli)))
        .collect();
    (0..count)
        .map(|i| {
            let (cpu_milli, memory_mib, num_gpu, gpu_milli) = pick(&shapes, rng);
            let gpu_spec = if num_gpu > 0 && rng.random_bool(0.1) {
                vec![pick_model(rng).to_owned()]
            } else {
                Vec::new()
            };
            Pod {
                name: format!("job-{i:06}"),
                cpu_milli,
                memory_mib,
                num_gpu,
                gpu_milli,
                gpu_spec,
            }
        })
        .collect()
}

/// A GPU model, in proportion to its share of the fleet.
fn pick_model(rng: &mut StdRng) -> &'static str {
    pick(&MODELS.map(|(m, w)| (w, m)), rng)
}

/// One of `choices`, in proportion to its weight.
fn pick<T: Copy>(choices: &[(f64, T)], rng: &mut StdRng) -> T {
    let total: f64 = choices.iter().map(|c| c.0).sum();
    let mut x = rng.random_range(0.0..total);
    for &(w, v) in choices {
        if x < w {
            return v;
        }
        x -= w;
    }
    choices[choices.len() - 1].1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_workload_is_seeded_and_fits_its_nodes() {
        let mut a = StdRng::seed_from_u64(1);
        let mut b = StdRng::seed_from_u64(1);
        assert_eq!(cluster(50, 4, &mut a), cluster(50, 4, &mut b));
        let jobs = backlog(2_000, 4, &mut a);
        assert_eq!(jobs, backlog(2_000, 4, &mut b));
        assert!(
            jobs.iter().all(|j| j.num_gpu <= 4),
            "no job larger than a node"
        );
        assert!(jobs.iter().any(|j| j.num_gpu == 0) && jobs.iter().any(|j| j.gpu_milli < 1000));
        assert!(jobs.iter().any(|j| !j.gpu_spec.is_empty()));
    }
}
