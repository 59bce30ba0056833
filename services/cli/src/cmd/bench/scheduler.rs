//! `allot bench scheduler`: placement decisions per second and decision latency of a
//! policy on a large synthetic cluster with a deep backlog.

use std::time::Instant;

use allot_scheduler::openb::{self, synthetic};
use anyhow::bail;
use clap::Args;
use serde_json::json;

#[derive(Debug, Args)]
pub struct SchedulerBench {
    /// Nodes in the synthetic cluster.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// GPUs on each node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u8,
    /// Pending jobs to decide, one at a time in arrival order.
    #[arg(long, default_value_t = 50_000)]
    pending: usize,
    /// allot (ours), or a published baseline: random, dotprod, gpu-clustering, gpu-packing,
    /// bestfit or fgd.
    #[arg(long, default_value = "allot")]
    policy: String,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &SchedulerBench) -> anyhow::Result<()> {
    if args.nodes == 0 || args.gpus_per_node == 0 || args.pending == 0 {
        bail!("--nodes, --gpus-per-node and --pending must be at least 1");
    }
    let (mut cluster, jobs, mut rng) =
        synthetic::scenario(args.nodes, args.gpus_per_node, args.pending, args.seed);
    // FGD is told the workload's classes up front; Allot learns them as it goes.
    let mut policy = openb::policy(&args.policy, &cluster, &jobs)?;
    let mut latencies = Vec::with_capacity(jobs.len());
    let (mut placed, mut gpu_milli) = (0usize, 0u64);
    let started = Instant::now();
    for job in &jobs {
        let t = Instant::now();
        let r = cluster.request(job);
        if let Some(choice) = policy.choose(&cluster, &r, &mut rng) {
            cluster.nodes[choice.node].place(&r, &choice.gpus);
            policy.node_changed(&cluster, choice.node);
            placed += 1;
            gpu_milli += r.gpu_total();
        }
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let wall_s = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    let out = json!({
        "policy": args.policy,
        "nodes": args.nodes,
        "gpus": cluster.capacity / 1000,
        "pending": jobs.len(),
        "placed": placed,
        "left_pending": jobs.len() - placed,
        "gpu_alloc_pct": 100.0 * gpu_milli as f64 / cluster.capacity as f64,
        "wall_s": wall_s,
        "decisions_per_s": jobs.len() as f64 / wall_s,
        "placements_per_s": placed as f64 / wall_s,
        "p50_decision_ms": at(0.5),
        "p99_decision_ms": at(0.99),
        "max_decision_ms": at(1.0),
        "seed": args.seed,
    });
    if args.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}
