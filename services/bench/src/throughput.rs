//! `allot bench throughput`: N one-GPU jobs of D seconds on a simulated fleet (`allot dev`,
//! its nodes' GPUs simulated, jobs real processes), submitted by P concurrent clients
//! through the CLI (each submit an `allot job submit` process, as a person's script runs
//! it) and then through the API (one HTTP client each, connections kept): submits per
//! second, each submit's latency, and the makespan (the first submit to the last job's
//! end) against the ideal `N × D / GPUs`. The two paths run one after the other on the same
//! cluster, so their figures compare side by side; what Slurm's `sbatch` does on the same
//! machine is measured apart (docs/benchmarks.md says how).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_client::Client;
use anyhow::{Context, bail};
use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::harness::percentile;

#[derive(Debug, Args)]
pub struct ThroughputBench {
    /// Jobs per path.
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    /// Seconds each job runs (`sleep D`).
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Simulated nodes.
    #[arg(long, default_value_t = 10)]
    nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Which paths: cli, api, or both (CLI first).
    #[arg(long, default_value = "both")]
    via: String,
    /// The run fails if the CLI path submits fewer jobs a second than this (0: no target).
    #[arg(long, default_value_t = 0.0)]
    min_cli_submits_per_sec: f64,
    /// One line of JSON instead of indented output.
    #[arg(long)]
    json: bool,
}

/// `allot dev`, killed when dropped.
struct Dev {
    child: tokio::process::Child,
    url: String,
    token: String,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn start_dev(allot: &Path, data: &Path, args: &ThroughputBench) -> anyhow::Result<Dev> {
    let mut child = tokio::process::Command::new(allot)
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .args(["--nodes", &args.nodes.to_string()])
        .args(["--sim-gpus", &format!("{}xH200", args.gpus_per_node)])
        .env("ALLOT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting allot dev")?;
    let stdout = child.stdout.take().context("allot dev's output")?;
    let mut lines = BufReader::new(stdout).lines();
    let url = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.trim().strip_prefix("API:") {
                return Ok(rest.trim().to_owned());
            }
        }
        bail!("allot dev ended before saying its URL")
    })
    .await
    .context("allot dev did not say its URL within 2 minutes")??;
    // Keep reading what it prints, as a terminal would.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let token = std::fs::read_to_string(data.join("admin.token"))
        .context("allot dev's admin token")?
        .trim()
        .to_owned();
    Ok(Dev { child, url, token })
}

/// What one path measured.
#[derive(Debug, serde::Serialize)]
struct PathResult {
    via: &'static str,
    jobs: usize,
    submit_window_secs: f64,
    submits_per_sec: f64,
    submit_p50_ms: f64,
    submit_p99_ms: f64,
    makespan_secs: f64,
    ideal_secs: f64,
    makespan_over_ideal: f64,
}

/// Waits until nothing of tenant `bench` waits or runs.
async fn idle(client: &Client, patience: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let t: Value = client.get("/api/v1/tenants/bench", &[]).await?;
        if t["jobs_pending"] == 0 && t["jobs_running"] == 0 {
            return Ok(());
        }
        if start.elapsed() > patience {
            bail!("the jobs did not finish within {patience:?}: {t}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_path(
    via: &'static str,
    allot: &Path,
    dev: &Dev,
    client: &Client,
    args: &ThroughputBench,
) -> anyhow::Result<PathResult> {
    let n = args.jobs;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let secs = format!("{}", args.secs);
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.clients.max(1) {
        let next = next.clone();
        let (allot, url, token, secs) = (
            allot.to_owned(),
            dev.url.clone(),
            dev.token.clone(),
            secs.clone(),
        );
        let api = Client::new(&dev.url, Some(dev.token.clone()), None)?;
        workers.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(latencies);
                }
                let name = format!("{via}-{i}");
                let t = Instant::now();
                if via == "cli" {
                    let out = tokio::process::Command::new(&allot)
                        .args(["job", "submit", "--tenant", "bench", "--gpus", "1"])
                        // Little CPU and memory: GPUs are what the jobs wait for.
                        .args(["--cpus", "0.01", "--memory", "16MiB"])
                        .args(["--name", &name, "--", "sleep", &secs])
                        .env("ALLOT_SERVER", &url)
                        .env("ALLOT_TOKEN", &token)
                        .stdin(Stdio::null())
                        .output()
                        .await?;
                    if !out.status.success() {
                        bail!(
                            "allot job submit failed: {}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                    }
                } else {
                    let body = json!({ "tenant": "bench", "gpus": 1, "name": name,
                        "cpu_milli": 10, "memory_bytes": 16 << 20,
                        "command": ["sleep", secs] });
                    let _: Value = api.call(Method::POST, "/api/v1/jobs", Some(&body)).await?;
                }
                latencies.push(t.elapsed().as_secs_f64() * 1e3);
            }
        });
    }
    let mut latencies = Vec::with_capacity(n);
    while let Some(done) = workers.join_next().await {
        latencies.extend(done??);
    }
    let window = started.elapsed().as_secs_f64();
    let gpus = f64::from(args.nodes * args.gpus_per_node);
    let ideal = n as f64 * args.secs / gpus;
    idle(client, Duration::from_secs_f64(ideal * 20.0 + 300.0)).await?;
    let makespan = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    Ok(PathResult {
        via,
        jobs: n,
        submit_window_secs: window,
        submits_per_sec: n as f64 / window,
        submit_p50_ms: percentile(&latencies, 0.5),
        submit_p99_ms: percentile(&latencies, 0.99),
        makespan_secs: makespan,
        ideal_secs: ideal,
        makespan_over_ideal: makespan / ideal,
    })
}

pub async fn run(args: &ThroughputBench) -> anyhow::Result<()> {
    let paths: &[&'static str] = match args.via.as_str() {
        "both" => &["cli", "api"],
        "cli" => &["cli"],
        "api" => &["api"],
        other => bail!("--via {other}: cli, api or both"),
    };
    if args.jobs == 0 || args.secs <= 0.0 || args.nodes == 0 || args.gpus_per_node == 0 {
        bail!("--jobs, --secs, --nodes and --gpus-per-node must be above 0");
    }
    let allot = crate::allot_exe()?;
    // Not a 0700 temporary directory's child: nothing here needs one.
    let home = tempfile::tempdir().context("a data directory")?;
    let dev = start_dev(&allot, &home.path().join("allot"), args).await?;
    let client = Client::new(&dev.url, Some(dev.token.clone()), None)?;
    let _: Value = client
        .call(
            Method::POST,
            "/api/v1/tenants",
            Some(&json!({ "name": "bench", "quota": {} })),
        )
        .await?;
    let mut results = Vec::new();
    for via in paths {
        let r = run_path(via, &allot, &dev, &client, args).await?;
        if !args.json {
            println!(
                "{}: {} jobs of {} s on {} GPUs by {} clients: {:.1} submits/s (p50 {:.1} ms, p99 {:.1} ms); makespan {:.1} s, ideal {:.1} s ({:.2}×)",
                r.via,
                r.jobs,
                args.secs,
                args.nodes * args.gpus_per_node,
                args.clients,
                r.submits_per_sec,
                r.submit_p50_ms,
                r.submit_p99_ms,
                r.makespan_secs,
                r.ideal_secs,
                r.makespan_over_ideal
            );
        }
        results.push(r);
    }
    if args.json {
        println!(
            "{}",
            json!({ "jobs": args.jobs, "secs": args.secs, "nodes": args.nodes,
                "gpus_per_node": args.gpus_per_node, "clients": args.clients,
                "paths": results })
        );
    }
    if let Some(cli) = results.iter().find(|r| r.via == "cli")
        && args.min_cli_submits_per_sec > 0.0
        && cli.submits_per_sec < args.min_cli_submits_per_sec
    {
        bail!(
            "the CLI submitted {:.1} jobs a second, under the target of {:.1}",
            cli.submits_per_sec,
            args.min_cli_submits_per_sec
        );
    }
    Ok(())
}
