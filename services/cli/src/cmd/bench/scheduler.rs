//! `allot bench scheduler`: placement decisions per second and decision latency of a
//! policy on a large synthetic cluster with a deep backlog.

use std::time::Instant;

use allot_scheduler::engine::{self, Config, GpuLimits, Job, World};
use allot_scheduler::openb::{self, Cluster, Pod, StdRng, synthetic};
use allot_scheduler::quota::{Amounts, Limits, QueueSpec, QuotaTree};
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
    /// Decide the backlog in one pass of the quota engine instead, with this many teams of
    /// one organisation sharing the cluster (each guaranteed an equal part); reports the
    /// pass's time.
    #[arg(long)]
    teams: Option<u32>,
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
    if let Some(teams) = args.teams {
        return engine_pass(args, teams, &cluster, &jobs, &mut rng);
    }
    // FGD is told the workload's classes up front; Allot learns them as it goes.
    let mut policy = openb::policy(&args.policy, &cluster, &jobs)?;
    let mut latencies = Vec::with_capacity(jobs.len());
    let (mut placed, mut gpu_milli) = (0usize, 0u64);
    let started = Instant::now();
    for job in &jobs {
        let t = Instant::now();
        let r = job.request(&cluster);
        policy.arrived(&cluster, &r);
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
    super::print(&out, args.json)?;
    Ok(())
}

/// One quota-engine pass over the whole backlog: `teams` teams under one organisation, each
/// guaranteed an equal part of the GPUs, jobs dealt to them in turn.
fn engine_pass(
    args: &SchedulerBench,
    teams: u32,
    cluster: &Cluster,
    pods: &[Pod],
    rng: &mut StdRng,
) -> anyhow::Result<()> {
    if teams == 0 {
        bail!("--teams must be at least 1");
    }
    let share = cluster.capacity / u64::from(teams);
    let queue = |id: String, parent: Option<String>, gpu_milli: u64| QueueSpec {
        name: id.clone(),
        id,
        parent,
        guaranteed: Amounts::new(gpu_milli, 0, 0),
        limit: Limits::default(),
        weight: 1,
        min_isolation: Default::default(),
    };
    let mut specs = vec![queue("org".into(), None, share * u64::from(teams))];
    specs.extend((0..teams).map(|t| queue(format!("team-{t}"), Some("org".into()), share)));
    let tree = QuotaTree::new(specs)?;
    let jobs: Vec<Job> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| Job {
            id: pod.name.clone(),
            queue: format!("team-{}", i as u64 % u64::from(teams)),
            request: pod.request(cluster),
            replicas: 1,
            priority: 0,
            preemptible: true,
            seq: i as u64,
            gpu_memory_mib: 0,
            isolation: None,
            class: None,
            avoid: Default::default(),
            pack: None,
        })
        .collect();
    let mut policy = openb::policy(&args.policy, cluster, pods)?;
    let world = World {
        cluster,
        tree: &tree,
        running: &[],
        now: 0,
        config: Config {
            min_runtime_secs: 0,
            gpu_limits: GpuLimits::default(),
        },
        past_usage: None,
    };
    let started = Instant::now();
    // Each job arrives once, as the live path tells the policy before its pass.
    for j in &jobs {
        for _ in 0..j.replicas {
            policy.arrived(cluster, &j.request);
        }
    }
    let decisions = engine::schedule(world, &jobs, policy.as_mut(), rng)?;
    let pass_s = started.elapsed().as_secs_f64();
    let placed = decisions
        .iter()
        .filter(|d| matches!(d, engine::Decision::Place { .. }))
        .count();
    let out = json!({
        "mode": "engine pass",
        "policy": args.policy,
        "teams": teams,
        "nodes": args.nodes,
        "gpus": cluster.capacity / 1000,
        "pending": jobs.len(),
        "placed": placed,
        "pass_s": pass_s,
        "decisions_per_s": jobs.len() as f64 / pass_s,
        "placements_per_s": placed as f64 / pass_s,
        "seed": args.seed,
    });
    super::print(&out, args.json)?;
    Ok(())
}
