//! `allot bench control-plane`: the live path of a replicated control plane, measured from
//! outside. Real `allot server` replicas on PostgreSQL, real agents (in this process, over
//! real gRPC and mTLS, simulated GPUs, jobs as processes), clients over HTTP.
//!
//! 1. **Submit to running** with free capacity: submits sent open-loop at `--latency-rate`
//!    (each at its scheduled time, whatever became of the others), latency from the
//!    scheduled send to the job's `running` transition as the control plane recorded it.
//! 2. **Submits per second**: `--clients` concurrent clients, each submitting as fast as
//!    answers come, spread over the replicas, for `--submit-secs`. Their jobs wait in a
//!    tenant limited to one GPU: they become the pending backlog of step 3.
//! 3. **Scheduling pass duration** with the backlog topped up (by the same clients) to each
//!    of `--pending`: the leader's own pass histogram over a window of passes.
//! 4. **Heartbeats** of `--heartbeat-nodes` agents: how many stay ready over a window of
//!    several leases, and the leader's CPU time per heartbeat.
//!
//! Targets (docs/benchmarks.md): ≥ 1,000 submits/s with three replicas, p99 submit to
//! running ≤ 1 s, pass cost growing less than linearly with the backlog, 5,000 nodes'
//! heartbeats kept up with. The run reports each against its target and exits non-zero
//! when one is missed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::harness::percentile;

#[derive(Debug, clap::Args)]
pub struct ControlPlaneBench {
    /// `allot server` replicas on the one database.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// PostgreSQL to use instead of a throwaway cluster (a database of its own: the
    /// benchmark fills it).
    #[arg(long)]
    database_url: Option<String>,
    /// Agents (simulated GPU nodes) for steps 1–3.
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Simulated GPUs of each of those nodes.
    #[arg(long, default_value = "8xH100")]
    sim_gpus: String,
    /// Step 1: submits per second, open-loop.
    #[arg(long, default_value_t = 20.0)]
    latency_rate: f64,
    /// Step 1: seconds of submits.
    #[arg(long, default_value_t = 20)]
    latency_secs: u64,
    /// Steps 2 and 3: concurrent clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Step 2: seconds of submits.
    #[arg(long, default_value_t = 15)]
    submit_secs: u64,
    /// Step 3: the backlogs (pending jobs) at which passes are timed.
    #[arg(long, value_delimiter = ',', default_value = "10000,50000")]
    pending: Vec<usize>,
    /// Step 3: passes timed at each backlog.
    #[arg(long, default_value_t = 10)]
    passes: u64,
    /// Step 4: agents in all (0: skip the step).
    #[arg(long, default_value_t = 5000)]
    heartbeat_nodes: usize,
    /// Step 4: seconds of the window (at least two leases, as the control plane grants
    /// them to this many nodes).
    #[arg(long, default_value_t = 120)]
    heartbeat_secs: u64,
    /// The steps to run, in this order (1 latency, 2 throughput, 3 passes, 4 heartbeats).
    /// Heartbeats at thousands of nodes compete with a large backlog's passes for the same
    /// cores: on a small machine run step 4 on its own.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "latency,throughput,passes,heartbeats"
    )]
    steps: Vec<Step>,
    /// Step 4: seconds the agents have to join and all be ready.
    #[arg(long, default_value_t = 300)]
    join_secs: u64,
    /// Keep the servers' data, logs and the agents' directories here.
    #[arg(long)]
    keep_dir: Option<PathBuf>,
    /// One line of JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Step {
    Latency,
    Throughput,
    Passes,
    Heartbeats,
}

const LATENCY_TENANT: &str = "latency";
/// Limited to one GPU: its jobs wait, the backlog of step 3.
const BACKLOG_TENANT: &str = "backlog";

const PASS_SECONDS: &str = "allot_scheduling_pass_duration_seconds";
const HEARTBEAT_SECONDS: &str = "allot_heartbeat_duration_seconds";

/// The replicas, their clients and their agents.
struct Plane {
    replicas: Vec<crate::harness::processes::Server>,
    bases: Vec<String>,
    token: String,
    http: reqwest::Client,
    ca_pem: String,
    grpc: Vec<String>,
    root: PathBuf,
    stop_agents: CancellationToken,
    agents: Vec<tokio::task::JoinHandle<Result<(), allot_agent::AgentError>>>,
}

impl Plane {
    async fn call(
        &self,
        base: usize,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let retry = method == reqwest::Method::GET;
        let res = send(
            || {
                let req = self
                    .http
                    .request(
                        method.clone(),
                        format!("{}{path}", self.bases[base % self.bases.len()]),
                    )
                    .bearer_auth(&self.token);
                match &body {
                    Some(b) => req.json(b),
                    None => req,
                }
            },
            retry,
        )
        .await?;
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{path}: {status}: {body}");
        }
        Ok(body)
    }

    /// The replica that leads now, by its metrics.
    async fn leader(&self) -> anyhow::Result<usize> {
        for _ in 0..300 {
            for (i, r) in self.replicas.iter().enumerate() {
                if r.epoch(&self.http).await.unwrap_or(0) > 0 {
                    return Ok(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("no replica leads")
    }

    /// Starts agents `from..to` (named `cp-NNNNN`) with `gpus` each, in this process: their
    /// bootstrap tokens asked for 16 at a time, spread over the replicas. Gives up (with
    /// those started so far running) at `deadline`.
    async fn add_agents(
        &mut self,
        from: usize,
        to: usize,
        gpus: &str,
        deadline: Instant,
    ) -> anyhow::Result<()> {
        let mut next = from;
        while next < to {
            if Instant::now() > deadline {
                bail!(
                    "{} of {} agents started before the deadline",
                    next - from,
                    to - from
                );
            }
            let batch: Vec<usize> = (next..to.min(next + 16)).collect();
            next += batch.len();
            let this: &Plane = self;
            let asks = batch.iter().map(|&i| {
                let name = format!("cp-{i:05}");
                async move {
                    let created = this
                        .call(
                            i,
                            reqwest::Method::POST,
                            "/api/v1/bootstrap-tokens",
                            Some(json!({
                                "node_name": name,
                                "description": "allot bench control-plane",
                            })),
                        )
                        .await?;
                    let secret = created["secret"]
                        .as_str()
                        .context("a bootstrap token")?
                        .to_owned();
                    anyhow::Ok((name, secret))
                }
            });
            for joined in futures_util::future::join_all(asks).await {
                let (name, secret) = joined?;
                self.start_agent(name, secret, gpus)?;
            }
        }
        Ok(())
    }

    fn start_agent(&mut self, name: String, secret: String, gpus: &str) -> anyhow::Result<()> {
        let dir = self.root.join("nodes").join(&name);
        std::fs::create_dir_all(&dir)?;
        let backend = allot_agent::gpu::SimBackend::from_spec(gpus, &name)?;
        let cfg = allot_agent::AgentConfig {
            servers: self.grpc.clone(),
            ca_cert_pem: self.ca_pem.clone(),
            bootstrap_token: Some(secret),
            node_name: name,
            data_dir: dir,
            stop_grace: Duration::from_secs(2),
            offer: allot_agent::NodeResources::detect(),
            metrics_listen: None,
            sharing: allot_agent::sharing::SharingConfig::default(),
            runtime: allot_agent::RuntimeChoice::Process,
            address: String::new(),
            job_log_tail: allot_agent::DEFAULT_JOB_LOG_TAIL,
            min_free_disk_bytes: 0,
        };
        self.agents.push(tokio::spawn(allot_agent::run(
            cfg,
            Arc::new(backend),
            self.stop_agents.clone(),
        )));
        Ok(())
    }

    /// Nodes the control plane counts ready.
    async fn ready_nodes(&self) -> anyhow::Result<usize> {
        Ok(self.fleet().await?.0)
    }

    /// Nodes the control plane counts ready, and the median lease their last heartbeats
    /// were granted (seconds from the heartbeat to its lease's end, as recorded).
    async fn fleet(&self) -> anyhow::Result<(usize, f64)> {
        let nodes = self
            .call(0, reqwest::Method::GET, "/api/v1/nodes", None)
            .await?;
        let nodes = nodes.as_array().map(Vec::as_slice).unwrap_or_default();
        let time = |v: &Value| {
            v.as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        };
        let mut leases: Vec<f64> = nodes
            .iter()
            .filter_map(|n| {
                let granted = time(&n["lease_expires_at"])? - time(&n["last_heartbeat_at"])?;
                Some(granted.as_seconds_f64())
            })
            .collect();
        leases.sort_by(f64::total_cmp);
        let ready = nodes.iter().filter(|n| n["status"] == "ready").count();
        Ok((ready, percentile(&leases, 0.5)))
    }

    async fn wait_ready(&self, nodes: usize, within: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            let ready = self.ready_nodes().await?;
            if ready >= nodes {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                bail!("{ready} of {nodes} nodes ready after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Pending jobs, all tenants together, as the leader's `allot_jobs` gauge counts them.
    async fn pending(&self) -> anyhow::Result<u64> {
        let text = self
            .http
            .get(self.replicas[self.leader().await?].metrics_url())
            .send()
            .await?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("allot_jobs{") && l.contains("state=\"pending\""))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum::<f64>() as u64)
    }
}

/// A submit's body.
fn job(tenant: &str, name: &str, command: &[&str]) -> Value {
    json!({
        "tenant": tenant, "name": name, "gpus": 1, "command": command,
        "cpu_milli": crate::harness::SLEEP_JOB_CPU_MILLI, "memory_bytes": crate::harness::SLEEP_JOB_MEMORY_BYTES,
    })
}

/// Step 1: open-loop submits, latency from each scheduled send to `running`.
async fn submit_to_running(plane: &Plane, rate: f64, secs: u64) -> anyhow::Result<Value> {
    let total = (rate * secs as f64).round() as usize;
    let start = Instant::now();
    let wall = SystemTime::now();
    let mut sends = Vec::with_capacity(total);
    for i in 0..total {
        let at = Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until((start + at).into()).await;
        let (http, base, token) = (
            plane.http.clone(),
            plane.bases[i % plane.bases.len()].clone(),
            plane.token.clone(),
        );
        sends.push(tokio::spawn(async move {
            let res = http
                .post(format!("{base}/api/v1/jobs"))
                .bearer_auth(&token)
                .json(&job(LATENCY_TENANT, &format!("l{i}"), &["sleep", "1"]))
                .send()
                .await
                .ok()?;
            let body: Value = res.json().await.ok()?;
            Some((body["id"].as_str()?.to_owned(), wall + at))
        }));
    }
    let mut latencies = Vec::new();
    let mut never = 0usize;
    for send in sends {
        let Some((id, sent)) = send.await? else {
            never += 1;
            continue;
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let running = loop {
            let j = plane
                .call(0, reqwest::Method::GET, &format!("/api/v1/jobs/{id}"), None)
                .await?;
            let at = j["events"].as_array().into_iter().flatten().find_map(|e| {
                (e["to"] == "running")
                    .then(|| e["at"].as_str())
                    .flatten()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            });
            if let Some(at) = at {
                break Some(at);
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        match running {
            Some(at) => {
                let sent: chrono::DateTime<chrono::Utc> = sent.into();
                latencies.push((at.with_timezone(&chrono::Utc) - sent).as_seconds_f64());
            }
            None => never += 1,
        }
    }
    latencies.sort_by(f64::total_cmp);
    Ok(json!({
        "submits": total,
        "rate_per_s": rate,
        "ran": latencies.len(),
        "never_ran": never,
        "p50_s": percentile(&latencies, 0.5),
        "p99_s": percentile(&latencies, 0.99),
        "max_s": latencies.last().copied().unwrap_or(0.0),
    }))
}

/// Closed-loop submits by `clients` clients until `until` says stop; (acknowledged, other
/// answers, latencies of the acknowledged in seconds).
async fn flood(
    plane: &Plane,
    clients: usize,
    until: impl Fn(u64, Duration) -> bool + Send + Sync + 'static,
) -> anyhow::Result<(u64, u64, Vec<f64>, Duration)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let acked = Arc::new(AtomicU64::new(0));
    let until = Arc::new(until);
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (http, bases, token, acked, until) = (
                plane.http.clone(),
                plane.bases.clone(),
                plane.token.clone(),
                acked.clone(),
                until.clone(),
            );
            tokio::spawn(async move {
                let (mut failed, mut latencies, mut n) = (0u64, Vec::new(), 0usize);
                while !until(acked.load(Ordering::Relaxed), start.elapsed()) {
                    n += 1;
                    let sent = Instant::now();
                    let res = http
                        .post(format!("{}/api/v1/jobs", bases[(c + n) % bases.len()]))
                        .bearer_auth(&token)
                        .json(&job(BACKLOG_TENANT, &format!("b{c}-{n}"), &["true"]))
                        .send()
                        .await;
                    match res {
                        Ok(r) if r.status().as_u16() == 201 => {
                            acked.fetch_add(1, Ordering::Relaxed);
                            latencies.push(sent.elapsed().as_secs_f64());
                        }
                        _ => failed += 1,
                    }
                }
                (failed, latencies)
            })
        })
        .collect();
    let (mut failed, mut latencies) = (0, Vec::new());
    for t in tasks {
        let (f, l) = t.await?;
        failed += f;
        latencies.extend(l);
    }
    latencies.sort_by(f64::total_cmp);
    Ok((
        acked.load(Ordering::Relaxed),
        failed,
        latencies,
        start.elapsed(),
    ))
}

/// Sends the request `build` makes; with `retry` (a GET), up to three times more when it
/// fails to be answered (a kept-alive connection closed under it).
async fn send(
    build: impl Fn() -> reqwest::RequestBuilder,
    retry: bool,
) -> Result<reqwest::Response, reqwest::Error> {
    let mut tries = 0;
    loop {
        match build().send().await {
            Err(_) if retry && tries < 3 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            answered => return answered,
        }
    }
}

/// A histogram of the leader's: (count, sum of seconds, cumulative buckets).
async fn histogram(
    plane: &Plane,
    leader: usize,
    name: &str,
) -> anyhow::Result<(f64, f64, Vec<(f64, f64)>)> {
    let text = send(
        || plane.http.get(plane.replicas[leader].metrics_url()),
        true,
    )
    .await?
    .error_for_status()?
    .text()
    .await?;
    let bucket = format!("{name}_bucket{{le=\"");
    let value = |suffix: &str| {
        let prefix = format!("{name}_{suffix} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let buckets = text
        .lines()
        .filter_map(|l| l.strip_prefix(&bucket))
        .filter_map(|l| {
            let (le, rest) = l.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse().ok()?))
        })
        .collect();
    Ok((value("count"), value("sum"), buckets))
}

/// Quantile `q` of the observations between two cumulative histograms (linear within the
/// bucket it falls in).
fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - was)
        })
        .collect();
    let total = counts.last().map_or(0.0, |(_, n)| *n);
    if total <= 0.0 {
        return 0.0;
    }
    let half = total * q;
    let mut lower = (0.0, 0.0);
    for (le, n) in counts {
        if n >= half {
            if !le.is_finite() {
                return lower.0;
            }
            let share = if n > lower.1 {
                (half - lower.1) / (n - lower.1)
            } else {
                0.0
            };
            return lower.0 + share * (le - lower.0);
        }
        lower = (le, n);
    }
    lower.0
}

/// Step 3: the backlog topped up to `target`, then `passes` passes timed on the leader.
async fn pass_at(
    plane: &Plane,
    clients: usize,
    target: usize,
    passes: u64,
) -> anyhow::Result<Value> {
    let have = plane.pending().await? as usize;
    let topping = target.saturating_sub(have) as u64;
    if topping > 0 {
        flood(plane, clients, move |acked, _| acked >= topping).await?;
    }
    let pending = plane.pending().await?;
    let leader = plane.leader().await?;
    let (count0, sum0, buckets0) = histogram(plane, leader, PASS_SECONDS).await?;
    let start = Instant::now();
    let (count, sum, buckets) = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let h = histogram(plane, leader, PASS_SECONDS).await?;
        if h.0 - count0 >= passes as f64 || start.elapsed() > Duration::from_secs(600) {
            break h;
        }
    };
    let n = count - count0;
    Ok(json!({
        "pending": pending,
        "passes": n,
        "mean_s": if n > 0.0 { (sum - sum0) / n } else { 0.0 },
        "median_s": histogram_quantile(&buckets0, &buckets, 0.5),
    }))
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("/proc stat")?
        .1
        .split_whitespace()
        .collect();
    // After "pid (comm)": state is field 0, utime 11, stime 12 (clock ticks).
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Ok((ticks(11) + ticks(12)) / hz)
}

/// Step 4: agents added up to `nodes`, then a window of `secs`.
async fn heartbeats(
    plane: &mut Plane,
    nodes: usize,
    secs: u64,
    join_secs: u64,
) -> anyhow::Result<Value> {
    let have = plane.agents.len();
    let joining = Instant::now();
    let deadline = joining + Duration::from_secs(join_secs);
    let joined = match plane.add_agents(have, nodes, "1xH100", deadline).await {
        Ok(()) => {
            plane
                .wait_ready(nodes, deadline.saturating_duration_since(Instant::now()))
                .await
        }
        Err(e) => Err(e),
    };
    let joined = match joined {
        Ok(_) => joining.elapsed().as_secs_f64(),
        Err(e) => {
            // What the leader made of the heartbeats it had, for the report.
            let leader = plane.leader().await?;
            let (count, sum, buckets) = histogram(plane, leader, HEARTBEAT_SECONDS).await?;
            return Ok(json!({
                "nodes": nodes,
                "error": e.to_string(),
                "ready": plane.ready_nodes().await?,
                "heartbeats_handled": count,
                "answer_mean_s": if count > 0.0 { sum / count } else { 0.0 },
                "answer_p50_s": histogram_quantile(&[], &buckets, 0.5),
                "answer_p99_s": histogram_quantile(&[], &buckets, 0.99),
            }));
        }
    };
    let leader = plane.leader().await?;
    let pid = plane.replicas[leader]
        .pid()
        .context("the leader's process")?;
    let cpu0 = cpu_seconds(pid)?;
    let (count0, _, buckets0) = histogram(plane, leader, HEARTBEAT_SECONDS).await?;
    let (_, pass_sum0, _) = histogram(plane, leader, PASS_SECONDS).await?;
    let start = Instant::now();
    let mut least_ready = nodes;
    let mut leases = Vec::new();
    while start.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (ready, lease) = plane.fleet().await?;
        least_ready = least_ready.min(ready);
        leases.push(lease);
    }
    let window = start.elapsed().as_secs_f64();
    leases.sort_by(f64::total_cmp);
    let lease = percentile(&leases, 0.5);
    let cpu = cpu_seconds(pid)? - cpu0;
    let (count, _, buckets) = histogram(plane, leader, HEARTBEAT_SECONDS).await?;
    let (_, pass_sum, _) = histogram(plane, leader, PASS_SECONDS).await?;
    let handled = count - count0;
    Ok(json!({
        "nodes": nodes,
        "joined_s": joined,
        "window_s": window,
        "least_ready": least_ready,
        "heartbeats_per_s": handled / window,
        // As the agents beat and the control plane granted, not as configured: a fleet
        // larger than the leader's heartbeat rate is paced.
        "beat_every_s": nodes as f64 * window / handled.max(1.0),
        "lease_s": lease,
        "window_leases": window / lease.max(f64::MIN_POSITIVE),
        "answer_p50_s": histogram_quantile(&buckets0, &buckets, 0.5),
        "answer_p99_s": histogram_quantile(&buckets0, &buckets, 0.99),
        "leader_cpu_cores": cpu / window,
        "leader_cpu_ms_per_heartbeat": cpu * 1e3 / handled.max(1.0),
        "leader_pass_busy_share": (pass_sum - pass_sum0) / window,
    }))
}

pub async fn run(args: &ControlPlaneBench) -> anyhow::Result<()> {
    if args.replicas == 0 || args.nodes == 0 || args.clients == 0 || args.latency_rate <= 0.0 {
        bail!("--replicas, --nodes, --clients and --latency-rate must be positive");
    }
    let (_dir, root) = crate::harness::work_dir(args.keep_dir.as_deref())?;
    let (_pg, url) = match &args.database_url {
        Some(url) => (None, url.clone()),
        None => {
            let (pg, url) = crate::harness::postgres::Throwaway::start()?;
            (Some(pg), url)
        }
    };
    let exe = crate::allot_exe()?;
    let data_dir = root.join("server");
    std::fs::create_dir_all(&data_dir)?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(args.clients * 2)
        .build()?;
    let mut replicas = Vec::new();
    for r in 1..=args.replicas {
        let mut server = crate::harness::processes::Server::new(
            &exe,
            &data_dir,
            &root.join(format!("server-r{r}.log")),
            &[
                "--database-url",
                &url,
                "--replica-name",
                &format!("r{r}"),
                "--min-runtime-secs",
                "0",
            ],
        )?;
        server.spawn()?;
        server.ready(&http, Instant::now()).await?;
        replicas.push(server);
    }
    let token = allot_client::read_secret_file(&data_dir.join("admin.token"))
        .context("the first replica wrote no admin token")?;
    let ca_pem = std::fs::read_to_string(data_dir.join("pki").join("ca.pem"))?;
    let mut plane = Plane {
        bases: replicas
            .iter()
            .map(|s| format!("http://{}", s.http))
            .collect(),
        grpc: replicas
            .iter()
            .map(|s| format!("https://{}", s.grpc))
            .collect(),
        replicas,
        token,
        http,
        ca_pem,
        root: root.clone(),
        stop_agents: CancellationToken::new(),
        agents: Vec::new(),
    };
    plane
        .call(
            0,
            reqwest::Method::POST,
            "/api/v1/tenants",
            Some(json!({ "name": LATENCY_TENANT })),
        )
        .await?;
    plane
        .call(
            0,
            reqwest::Method::POST,
            "/api/v1/tenants",
            Some(json!({ "name": BACKLOG_TENANT, "quota": { "limit": { "gpu_milli": 1000 } } })),
        )
        .await?;
    plane
        .add_agents(
            0,
            args.nodes,
            &args.sim_gpus,
            Instant::now() + Duration::from_secs(args.join_secs),
        )
        .await?;
    plane
        .wait_ready(args.nodes, Duration::from_secs(args.join_secs))
        .await?;

    // Each step's figures go to stderr as they come: a long run that is stopped keeps them.
    let progress = |step: &str, v: &Value| eprintln!("{step}: {v}");
    let (mut latency, mut throughput, mut passes, mut heartbeat) =
        (Value::Null, Value::Null, Vec::new(), Value::Null);
    for step in &args.steps {
        match step {
            Step::Latency => {
                latency = submit_to_running(&plane, args.latency_rate, args.latency_secs).await?;
                progress("submit_to_running", &latency);
            }
            Step::Throughput => {
                let secs = Duration::from_secs(args.submit_secs);
                let (acked, failed, lat, took) =
                    flood(&plane, args.clients, move |_, t| t >= secs).await?;
                throughput = json!({
                    "clients": args.clients,
                    "seconds": took.as_secs_f64(),
                    "acknowledged": acked,
                    "not_acknowledged": failed,
                    "per_s": acked as f64 / took.as_secs_f64(),
                    "answer_p50_s": percentile(&lat, 0.5),
                    "answer_p99_s": percentile(&lat, 0.99),
                });
                progress("throughput", &throughput);
            }
            Step::Passes => {
                let mut pending = args.pending.clone();
                pending.sort_unstable();
                for target in pending {
                    let p = pass_at(&plane, args.clients, target, args.passes).await?;
                    progress("passes", &p);
                    passes.push(p);
                }
            }
            Step::Heartbeats => {
                heartbeat = heartbeats(
                    &mut plane,
                    args.heartbeat_nodes.max(args.nodes),
                    args.heartbeat_secs,
                    args.join_secs,
                )
                .await?;
                progress("heartbeats", &heartbeat);
            }
        }
    }
    plane.stop_agents.cancel();
    for a in std::mem::take(&mut plane.agents) {
        let _ = a.await;
    }
    for r in &mut plane.replicas {
        r.stop().await;
    }

    // Against the targets.
    let per_s = throughput["per_s"].as_f64().unwrap_or(0.0);
    let p99 = latency["p99_s"].as_f64().unwrap_or(f64::INFINITY);
    let growth = match (passes.first(), passes.last()) {
        (Some(a), Some(b)) if passes.len() > 1 => {
            let cost = |p: &Value| p["median_s"].as_f64().unwrap_or(0.0).max(1e-6);
            let size = |p: &Value| p["pending"].as_f64().unwrap_or(0.0).max(1.0);
            Some((cost(b) / cost(a), size(b) / size(a)))
        }
        _ => None,
    };
    // Every node joined and stayed ready throughout a window of at least two leases: the
    // leader renewed every node's lease in time.
    let kept_up = heartbeat["error"].is_null()
        && heartbeat["least_ready"].as_u64() == heartbeat["nodes"].as_u64()
        && heartbeat["window_leases"].as_f64().unwrap_or(0.0) >= 2.0;
    let ran = |step: Step| args.steps.contains(&step);
    let mut checks = serde_json::Map::new();
    if ran(Step::Latency) {
        checks.insert(
            "p99_submit_to_running_at_most_1s".into(),
            json!(p99 <= 1.0 && latency["never_ran"] == 0),
        );
    }
    if ran(Step::Throughput) {
        checks.insert("submits_per_s_at_least_1000".into(), json!(per_s >= 1000.0));
    }
    if ran(Step::Passes) {
        checks.insert(
            "pass_cost_sublinear".into(),
            json!(growth.is_some_and(|(cost, size)| cost < size)),
        );
    }
    if ran(Step::Heartbeats) {
        checks.insert("heartbeats_kept_up".into(), json!(kept_up));
    }
    let checks = Value::Object(checks);
    let ok = checks
        .as_object()
        .is_some_and(|c| c.values().all(|v| v == true));
    let out = json!({
        "bench": "control-plane",
        "replicas": args.replicas,
        "nodes": args.nodes,
        "submit_to_running": latency,
        "throughput": throughput,
        "passes": passes,
        "pass_cost_growth": growth.map(|(c, s)| json!({ "cost": c, "backlog": s })),
        "heartbeats": heartbeat,
        "checks": checks,
        "ok": ok,
        "logs": keep_note(args.keep_dir.as_deref(), &root),
    });
    crate::harness::print(&out, args.json)?;
    if !ok {
        bail!("a target was missed: {}", out["checks"]);
    }
    Ok(())
}

fn keep_note(keep: Option<&Path>, root: &Path) -> Value {
    keep.map_or(Value::Null, |_| json!(root.display().to_string()))
}
