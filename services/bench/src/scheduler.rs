//! `allot bench scheduler`: placement decisions per second and decision latency of a
//! policy on large synthetic clusters with a deep backlog, at one or more fleet sizes in
//! one run; with gangs (multi-node jobs) in the mix, through the quota engine's pass, as the
//! live path decides.

use std::time::Instant;

use allot_scheduler::engine::{self, Config, GpuLimits, Job, World};
use allot_scheduler::openb::{self, Cluster, Pod, synthetic};
use allot_scheduler::quota::{Amounts, Limits, QueueSpec, QuotaTree};
use anyhow::bail;
use clap::Args;
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;

#[derive(Debug, Args)]
pub struct SchedulerBench {
    /// Nodes in the synthetic cluster; several sizes (`1000,5000,20000`) run one after the
    /// other in this run, each with its own cluster and backlog from the same seed.
    #[arg(long, value_delimiter = ',', default_value = "5000")]
    nodes: Vec<usize>,
    /// GPUs on each node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u8,
    /// Pending jobs to decide, one at a time in arrival order (default: ten per node).
    #[arg(long)]
    pending: Option<usize>,
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
    /// The share (0–1) of 4- and 8-GPU jobs that are gangs of 2 to 4 replicas, placed all
    /// or none; implies the engine pass (one team unless `--teams`).
    #[arg(long, default_value_t = 0.0)]
    gangs: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &SchedulerBench) -> anyhow::Result<()> {
    if args.nodes.is_empty() || args.nodes.contains(&0) || args.gpus_per_node == 0 {
        bail!("--nodes and --gpus-per-node must be at least 1");
    }
    if args.pending == Some(0) {
        bail!("--pending must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.gangs) {
        bail!("--gangs: {} is not a share from 0 to 1", args.gangs);
    }
    let teams = match args.teams {
        Some(0) => bail!("--teams must be at least 1"),
        None if args.gangs > 0.0 => Some(1),
        t => t,
    };
    let mut runs = Vec::with_capacity(args.nodes.len());
    for &nodes in &args.nodes {
        let pending = args.pending.unwrap_or(nodes * 10);
        let (cluster, jobs, rng) =
            synthetic::scenario(nodes, args.gpus_per_node, pending, args.seed);
        let run = match teams {
            Some(teams) => engine_pass(args, teams, &cluster, &jobs, rng)?,
            None => one_at_a_time(args, cluster, &jobs, rng)?,
        };
        if !args.json {
            eprintln!("{nodes} nodes: {}", summary(&run));
        }
        runs.push(run);
    }
    let out = match runs.len() {
        1 => runs.remove(0),
        _ => json!({ "runs": runs }),
    };
    crate::harness::print(&out, args.json)?;
    Ok(())
}

/// One line of a run's headline figures.
fn summary(run: &serde_json::Value) -> String {
    let f = |k: &str| run[k].as_f64().unwrap_or_default();
    format!(
        "{:.0} placements/s, p50 {:.4} ms, p99 {:.4} ms, max {:.2} ms per decision",
        f("placements_per_s"),
        f("p50_decision_ms"),
        f("p99_decision_ms"),
        f("max_decision_ms")
    )
}

/// Decision latencies (ms) by quantile.
fn latency(mut ms: Vec<f64>) -> serde_json::Value {
    ms.sort_by(f64::total_cmp);
    json!({
        "p50_decision_ms": crate::harness::percentile(&ms, 0.5),
        "p99_decision_ms": crate::harness::percentile(&ms, 0.99),
        "max_decision_ms": crate::harness::percentile(&ms, 1.0),
    })
}

/// Each job decided by the policy alone, in arrival order.
fn one_at_a_time(
    args: &SchedulerBench,
    mut cluster: Cluster,
    jobs: &[Pod],
    mut rng: StdRng,
) -> anyhow::Result<serde_json::Value> {
    // FGD is told the workload's classes up front; Allot learns them as it goes.
    let mut policy = openb::policy(&args.policy, &cluster, jobs)?;
    let mut latencies = Vec::with_capacity(jobs.len());
    let (mut placed, mut gpu_milli) = (0usize, 0u64);
    let started = Instant::now();
    for job in jobs {
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
    let mut out = json!({
        "policy": args.policy,
        "nodes": cluster.nodes.len(),
        "gpus": cluster.capacity / 1000,
        "pending": jobs.len(),
        "placed": placed,
        "left_pending": jobs.len() - placed,
        "gpu_alloc_pct": 100.0 * gpu_milli as f64 / cluster.capacity as f64,
        "wall_s": wall_s,
        "decisions_per_s": jobs.len() as f64 / wall_s,
        "placements_per_s": placed as f64 / wall_s,
        "seed": args.seed,
    });
    merge(&mut out, latency(latencies));
    Ok(out)
}

/// One quota-engine pass over the whole backlog: `teams` teams under one organisation, each
/// guaranteed an equal part of the GPUs, jobs dealt to them in turn; a share of the 4- and
/// 8-GPU jobs (`--gangs`) are gangs of 2–4 replicas. Every decision is timed, the retries of
/// the pass's fixed point included.
fn engine_pass(
    args: &SchedulerBench,
    teams: u32,
    cluster: &Cluster,
    pods: &[Pod],
    mut rng: StdRng,
) -> anyhow::Result<serde_json::Value> {
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
            replicas: if pod.num_gpu >= 4 && rng.random_bool(args.gangs) {
                rng.random_range(2..=4)
            } else {
                1
            },
            priority: 0,
            preemptible: true,
            seq: i as u64,
            gpu_memory_mib: 0,
            whole_gpu_memory_mib: 0,
            isolation: None,
            class: None,
            avoid: Default::default(),
            pack: None,
            best_effort: false,
            sizing: None,
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
        outside: &[],
    };
    let mut latencies = Vec::with_capacity(jobs.len());
    let started = Instant::now();
    // Each job arrives once, as the live path tells the policy before its pass.
    for j in &jobs {
        for _ in 0..j.replicas {
            policy.arrived(cluster, &j.request);
        }
    }
    let mut last = Instant::now();
    let decisions =
        engine::schedule_observed(world, &jobs, policy.as_mut(), &mut rng, &mut |_| {
            let now = Instant::now();
            latencies.push((now - last).as_secs_f64() * 1000.0);
            last = now;
        })?;
    let pass_s = started.elapsed().as_secs_f64();
    let (mut placed, mut gangs, mut replicas, mut gpu_milli) = (0usize, 0usize, 0usize, 0u64);
    for d in &decisions {
        if let engine::Decision::Place {
            request,
            placements,
            ..
        } = d
        {
            placed += 1;
            gangs += usize::from(placements.len() > 1);
            replicas += placements.len();
            gpu_milli += request.gpu_total() * placements.len() as u64;
        }
    }
    let decided = latencies.len();
    let mut out = json!({
        "mode": "engine pass",
        "policy": args.policy,
        "teams": teams,
        "nodes": cluster.nodes.len(),
        "gpus": cluster.capacity / 1000,
        "pending": jobs.len(),
        "gangs_pending": jobs.iter().filter(|j| j.replicas > 1).count(),
        "placed": placed,
        "gangs_placed": gangs,
        "replicas_placed": replicas,
        "gpu_alloc_pct": 100.0 * gpu_milli as f64 / cluster.capacity as f64,
        "decisions": decided,
        "pass_s": pass_s,
        "decisions_per_s": decided as f64 / pass_s,
        "placements_per_s": placed as f64 / pass_s,
        "seed": args.seed,
    });
    merge(&mut out, latency(latencies));
    Ok(out)
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}
