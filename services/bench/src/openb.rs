//! `allot bench openb`: the openb trace under its published evaluation protocol.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use allot_scheduler::openb::{self, Cluster, Pod};
use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct OpenbBench {
    /// The node list, e.g. ../shared/openb/openb_node_list_gpu_node.csv.
    #[arg(long)]
    nodes: PathBuf,
    /// The pod list, e.g. ../shared/openb/openb_pod_list_default.csv.
    #[arg(long)]
    pods: PathBuf,
    /// allot (ours), or a published baseline: random, dotprod, gpu-clustering, gpu-packing,
    /// bestfit or fgd.
    #[arg(long)]
    policy: String,
    /// The seed of one run.
    #[arg(long, default_value_t = 42, conflicts_with = "seeds")]
    seed: u64,
    /// Several seeds, e.g. 42-51: adds the mean and standard deviation.
    #[arg(long)]
    seeds: Option<String>,
    /// Inflate the workload to this multiple of the GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    tune: f64,
    /// Write one CSV row per arriving pod (one seed only).
    #[arg(long, conflicts_with = "seeds")]
    placements: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let bad = || format!("`{s}` is not a seed range like 42-51");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if b < a || b - a > 1000 {
        return Err(bad());
    }
    Ok((a..=b).collect())
}

/// The trace's name from its pod file: `openb_pod_list_default.csv` → `default`.
fn trace_name(path: &std::path::Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    stem.strip_prefix("openb_pod_list_")
        .unwrap_or(stem)
        .to_owned()
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn write_placements(
    path: &std::path::Path,
    cluster: &Cluster,
    stream: &[Pod],
    outcome: &openb::RunOutcome,
) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    writeln!(
        out,
        "seq,pod,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,node,gpus"
    )?;
    for (seq, (pod, choice)) in stream.iter().zip(&outcome.placements).enumerate() {
        let (node, gpus) = match choice {
            Some(c) => (
                cluster.names[c.node].as_str(),
                c.gpus
                    .iter()
                    .map(u8::to_string)
                    .collect::<Vec<_>>()
                    .join(";"),
            ),
            None => ("", String::new()),
        };
        writeln!(
            out,
            "{seq},{},{},{},{},{},{},{node},{gpus}",
            pod.name,
            pod.cpu_milli,
            pod.memory_mib,
            pod.num_gpu,
            pod.gpu_milli,
            pod.gpu_spec.join("|")
        )?;
    }
    out.flush()?;
    Ok(())
}

pub fn run(args: &OpenbBench) -> anyhow::Result<()> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let nodes = openb::parse_nodes(&read(&args.nodes)?)?;
    let pods = openb::parse_pods(&read(&args.pods)?)?;
    if nodes.is_empty() {
        bail!("{}: no nodes", args.nodes.display());
    }
    if !(args.tune > 0.0 && args.tune <= 10.0) {
        bail!("--tune must be in (0, 10]");
    }
    let cluster = Cluster::new(&nodes);
    let seeds = match &args.seeds {
        Some(s) => parse_seeds(s).map_err(|e| anyhow::anyhow!("--seeds: {e}"))?,
        None => vec![args.seed],
    };
    let given = openb::policy(&args.policy, &cluster, &pods)?.given();
    let mut runs = Vec::new();
    for &seed in &seeds {
        let mut policy = openb::policy(&args.policy, &cluster, &pods)?;
        let started = Instant::now();
        let (stream, outcome) = openb::run_seed(&cluster, &pods, args.tune, seed, policy.as_mut());
        let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
        if let Some(path) = &args.placements {
            write_placements(path, &cluster, &stream, &outcome)?;
        }
        let at = |pct: u32| outcome.alloc_at(pct).map_or(Value::Null, |v| json!(v));
        runs.push(json!({
            "seed": seed,
            "alloc_pct_at_arrival": { "100": at(100), "130": at(130) },
            "pods": stream.len(),
            "placed": outcome.placed,
            "wall_ms": wall_ms,
        }));
    }
    let mut out = json!({
        "trace": trace_name(&args.pods),
        "policy": args.policy,
        "policy_given": given,
        "tune": args.tune,
    });
    if let [one] = runs.as_slice() {
        for (k, v) in one.as_object().into_iter().flatten() {
            out[k] = v.clone();
        }
    } else {
        let mut summary = serde_json::Map::new();
        for pct in ["100", "130"] {
            let xs: Vec<f64> = runs
                .iter()
                .filter_map(|r| r["alloc_pct_at_arrival"][pct].as_f64())
                .collect();
            if !xs.is_empty() {
                let (mean, sd) = mean_sd(&xs);
                summary.insert(pct.to_owned(), json!({ "mean": mean, "sd": sd }));
            }
        }
        out["seeds"] = json!(seeds);
        out["alloc_pct_at_arrival"] = Value::Object(summary);
        out["runs"] = json!(runs);
    }
    crate::harness::print(&out, args.json)?;
    Ok(())
}

#[derive(Debug, Args)]
pub struct OpenbVariant {
    /// The pod list whose pods of each kind the variant draws from, e.g.
    /// ../shared/openb/openb_pod_list_default.csv.
    #[arg(long)]
    base: PathBuf,
    /// The node list (models for constraints when the base has none).
    #[arg(long)]
    nodes: PathBuf,
    /// Pods in the variant.
    #[arg(long, default_value_t = 8152)]
    pods: usize,
    /// Share of all pods that are CPU-only.
    #[arg(long, default_value_t = 0.1)]
    cpu_only: f64,
    /// Share of GPU pods on a shared GPU.
    #[arg(long, default_value_t = 0.5)]
    shared: f64,
    /// Share of whole-GPU pods asking for several GPUs.
    #[arg(long, default_value_t = 0.1)]
    multi_gpu: f64,
    /// Share of GPU pods constrained to GPU models.
    #[arg(long, default_value_t = 0.1)]
    gpu_spec: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// `allot bench openb-variant`: writes a generated pod list to stdout.
pub fn variant(args: &OpenbVariant) -> anyhow::Result<()> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let base = openb::parse_pods(&read(&args.base)?)?;
    let nodes = openb::parse_nodes(&read(&args.nodes)?)?;
    let spec = openb::variants::VariantSpec {
        pods: args.pods,
        cpu_only: args.cpu_only,
        shared: args.shared,
        multi_gpu: args.multi_gpu,
        gpu_spec: args.gpu_spec,
    };
    let pods = openb::variants::generate(&base, &nodes, &spec, args.seed)?;
    let mut out = std::io::stdout().lock();
    match out.write_all(openb::variants::to_csv(&pods).as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the pod list"),
    }
}
