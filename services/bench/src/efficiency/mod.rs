//! `allot bench efficiency`: GPU utilization, services per GPU, request latency and training
//! work, measured on the system itself. A control plane, real agents with simulated GPUs
//! that contend as GPUs without MPS do (`docs/shim.md`), the shim preloaded into shared
//! jobs, and workloads that are programs (`allot-workload`): inference services answering
//! requests with kernel launches, training loops launching kernels back to back and
//! checkpointing on SIGTERM. An open-loop load generator sends each service a seeded,
//! diurnal, bursty stream of requests and times each from its scheduled send.
//!
//! Three modes, each on a fresh fleet with the same load:
//! - **exclusive**: every service on a whole GPU of its own; training takes what is left;
//! - **static**: services packed at a fixed strict share sized for their peak, training on
//!   whole GPUs;
//! - **elastic**: the control plane's elastic shares (`--elastic`, a policy with inference
//!   and training classes): services packed at an elastic share (their share while others
//!   want the GPU, whatever is idle otherwise), training on whole GPUs and, at an elastic
//!   share, in what the services leave of theirs.
//!
//! Every figure comes from what happens: GPU busy time from the fake driver's own
//! accounting, services per GPU from where the scheduler put them, latencies at the
//! client, training work from the kernels the loops ran and the checkpoints they kept.
//!
//! The `day-night` scenario runs one compressed day under a policy giving inference 80% of
//! the fleet by day and training 80% by night: services scale out at dawn (their new
//! replicas take GPUs back from training, which checkpoints) and in at dusk, and the
//! whole day's utilization is reported.

mod demand;
mod fleet;
mod load;
mod replay;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use fleet::{Fleet, FleetSpec, Kit};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Exclusive,
    Static,
    Elastic,
    /// Services submitted `--gpus auto`: Allot sizes them (a demand replay).
    Auto,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Static => "static",
            Mode::Elastic => "elastic",
            Mode::Auto => "auto",
        }
    }
}

/// How the control plane sizes auto-sized jobs in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SizingRules {
    /// Allot's rules: a forecast with headroom, up quickly, down slowly.
    Forecast,
    /// The negative control: the last sample alone, no headroom, no hysteresis.
    LastSample,
    /// The negative control: not sized at all (jobs keep the share they start at).
    Off,
}

impl SizingRules {
    fn server(self) -> allot_server::sizing::Rules {
        match self {
            SizingRules::Forecast => allot_server::sizing::Rules::Forecast,
            SizingRules::LastSample => allot_server::sizing::Rules::LastSample,
            SizingRules::Off => allot_server::sizing::Rules::Off,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SizingRules::Forecast => "forecast",
            SizingRules::LastSample => "last-sample",
            SizingRules::Off => "off",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// The three modes side by side under the same load.
    Modes,
    /// One compressed day of the elastic mode: inference by day, training by night.
    DayNight,
}

#[derive(Debug, clap::Args)]
pub struct EfficiencyBench {
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, value_enum, default_value_t = Scenario::Modes)]
    scenario: Scenario,
    /// The modes to run, comma-separated (default: exclusive, static and elastic; with
    /// --demand, exclusive, static and auto).
    #[arg(long, value_enum, value_delimiter = ',')]
    modes: Option<Vec<Mode>>,
    /// Replay a demand instead of the modes scenario's load: FILE.csv with the header
    /// `t_s,service,busy` (optional `gpu_memory_bytes,requested_gpus`; `busy`, from 0 to 1,
    /// is the share of one GPU the service's requests keep busy from `t_s` until its next
    /// row), or `synthetic:SEED` (a day of --services services with daily curves, bursts and
    /// owners who over-request 2-10 times). Exits 1 when auto misses a target.
    #[arg(long)]
    demand: Option<String>,
    /// How many times faster than recorded the demand is replayed (the control plane's
    /// sizing windows are as many times shorter); default: the demand's span in --secs.
    #[arg(long)]
    time_scale: Option<f64>,
    /// Agent processes (simulated nodes).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    #[arg(long, default_value_t = 5)]
    gpus_per_node: usize,
    /// Inference services (default: one per GPU, all that exclusive allocation holds).
    #[arg(long)]
    services: Option<usize>,
    /// Seconds of load per mode (the modes scenario).
    #[arg(long, default_value_t = 180)]
    secs: u64,
    /// Minutes the compressed day lasts (day-night; even: day and night get half each).
    #[arg(long, default_value_t = 8)]
    day_minutes: u64,
    /// Each service's mean load over the run, as a share of one GPU.
    #[arg(long, default_value_t = 0.08)]
    service_load: f64,
    /// The diurnal swing of the load (0: flat; 0.5: from half to 1.5 times the mean).
    #[arg(long, default_value_t = 0.5)]
    swing: f64,
    /// Kernels per request, and each one's length (microseconds).
    #[arg(long, default_value_t = 3)]
    kernels: u32,
    #[arg(long, default_value_t = 1000)]
    kernel_us: u32,
    /// Requests a service batches at most, and what each extra one adds to a kernel.
    #[arg(long, default_value_t = 8)]
    max_batch: u32,
    #[arg(long, default_value_t = 0.25)]
    batch_cost: f64,
    /// The training loops' kernel length (microseconds).
    #[arg(long, default_value_t = 2000)]
    train_kernel_us: u32,
    /// Static sharing: each service's strict share of a GPU (milli), sized for its peak.
    #[arg(long, default_value_t = 250)]
    static_milli: u32,
    /// Elastic sharing: each service's elastic share of a GPU (milli).
    #[arg(long, default_value_t = 160)]
    elastic_milli: u32,
    /// Day-night: the share (milli) of every replica and training loop. Smaller than a
    /// fifth of a GPU, replicas leave room beside them for training loops, which then run
    /// in the replicas' idle time.
    #[arg(long, default_value_t = 160, value_parser = clap::value_parser!(u32).range(50..=1000))]
    day_night_milli: u32,
    /// The latency objective (milliseconds) requests are counted against.
    #[arg(long, default_value_t = 100.0)]
    slo_ms: f64,
    /// How the control plane sizes auto-sized jobs: by forecast (Allot's rules), or, as a
    /// control, on the last sample alone with no headroom, or not at all.
    #[arg(long, value_enum, default_value_t = SizingRules::Forecast)]
    sizing: SizingRules,
    /// How auto-sized services hold their share: `elastic` (the default of `--gpus auto`:
    /// idle time of the GPU is lent to them) or `strict` (held to the share they were
    /// sized to, which then bears the whole burden of a burst).
    #[arg(long, value_parser = ["elastic", "strict"], default_value = "elastic")]
    sized_compute: String,
    /// Keep each mode's database, agent logs and state here.
    #[arg(long)]
    keep_dir: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

impl EfficiencyBench {
    fn modes_or(&self, default: &[Mode]) -> Vec<Mode> {
        self.modes.clone().unwrap_or_else(|| default.to_vec())
    }

    fn services(&self) -> usize {
        self.services.unwrap_or(self.nodes * self.gpus_per_node)
    }

    fn fleet_gpus(&self) -> usize {
        self.nodes * self.gpus_per_node
    }

    /// GPU-seconds one request costs alone.
    fn request_cost_s(&self) -> f64 {
        f64::from(self.kernels) * f64::from(self.kernel_us) / 1e6
    }

    fn fleet(&self, elastic_policy: Option<String>) -> FleetSpec {
        FleetSpec {
            nodes: self.nodes,
            gpus_per_node: self.gpus_per_node,
            elastic_policy,
            sizing_time_scale: 1.0,
            sizing_rules: self.sizing.server(),
        }
    }

    /// The load over `duration`, its midday at `peak_at` of it.
    fn shape(&self, duration: Duration, peak_at: f64) -> load::Shape {
        load::Shape {
            duration,
            mean_rps: self.service_load / self.request_cost_s(),
            swing: self.swing,
            peak_at,
            // One burst per service every three minutes of load, on average.
            bursts_per_service: duration.as_secs_f64() / 180.0,
            burst_factor: (1.5, 2.5),
            burst_secs: (5.0, 20.0),
        }
    }

    fn serve_args(&self) -> Vec<String> {
        [
            ("--kernels", self.kernels.to_string()),
            ("--kernel-us", self.kernel_us.to_string()),
            ("--max-batch", self.max_batch.to_string()),
            ("--batch-cost", self.batch_cost.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
    }

    fn train_args(&self) -> Vec<String> {
        vec![
            "--kernel-us".into(),
            self.train_kernel_us.to_string(),
            "--checkpoint-secs".into(),
            "30".into(),
        ]
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.nodes == 0 || self.gpus_per_node == 0 || self.services() == 0 {
            bail!("--nodes, --gpus-per-node and --services must be at least 1");
        }
        if self.kernels == 0 || self.kernel_us == 0 || self.train_kernel_us == 0 {
            bail!("--kernels, --kernel-us and --train-kernel-us must be at least 1");
        }
        if !(1..=1000).contains(&self.static_milli) || !(1..=1000).contains(&self.elastic_milli) {
            bail!("--static-milli and --elastic-milli must be from 1 to 1000");
        }
        if !(0.0..1.0).contains(&self.swing)
            || self.service_load.is_nan()
            || self.service_load <= 0.0
        {
            bail!("--swing must be from 0 to under 1, --service-load above 0");
        }
        if self.scenario == Scenario::DayNight
            && (self.day_minutes < 2 || !self.day_minutes.is_multiple_of(2))
        {
            bail!("--day-minutes must be even and at least 2");
        }
        Ok(())
    }
}

pub async fn run(args: &EfficiencyBench) -> anyhow::Result<()> {
    args.check()?;
    let (_guard, root) = crate::harness::work_dir(args.keep_dir.as_deref())?;
    if let Some(spec) = &args.demand {
        let (out, met) = replay::run(args, spec, &root).await?;
        crate::harness::print(&out, args.json)?;
        if !met {
            bail!("auto missed a target (see `targets` above)");
        }
        return Ok(());
    }
    let kit = Kit::find(&root)?;
    let out = match args.scenario {
        Scenario::Modes => {
            let mut modes = serde_json::Map::new();
            for mode in args.modes_or(&[Mode::Exclusive, Mode::Static, Mode::Elastic]) {
                let report = run_mode(args, &kit, &root.join(mode.name()), mode).await?;
                modes.insert(mode.name().into(), report);
            }
            json!({
                "scenario": "modes",
                "seed": args.seed,
                "fleet_gpus": args.fleet_gpus(),
                "services": args.services(),
                "load_secs": args.secs,
                "service_load": args.service_load,
                "request": { "kernels": args.kernels, "kernel_us": args.kernel_us,
                             "max_batch": args.max_batch, "batch_cost": args.batch_cost },
                "slo_ms": args.slo_ms,
                "modes": modes,
                "targets": targets(&modes),
            })
        }
        Scenario::DayNight => day_night(args, &kit, &root.join("day-night")).await?,
    };
    crate::harness::print(&out, args.json)
}

/// The issue's targets, elastic against exclusive and static, as measured.
fn targets(modes: &serde_json::Map<String, Value>) -> Value {
    let f = |m: &str, k: &str| modes.get(m).and_then(|v| v[k].as_f64());
    let busy = f("elastic", "gpu_busy");
    let spg = match (
        f("elastic", "services_per_gpu"),
        f("exclusive", "services_per_gpu"),
    ) {
        (Some(e), Some(x)) if x > 0.0 => Some(e / x),
        _ => None,
    };
    let p999 = modes
        .get("elastic")
        .and_then(|v| v["latency_ms"]["p99_9"].as_f64());
    let retained = match (
        f("elastic", "training_kernel_s"),
        f("static", "training_kernel_s"),
    ) {
        (Some(e), Some(s)) if s > 0.0 => Some(e / s),
        _ => None,
    };
    json!({
        "elastic_gpu_busy": { "measured": busy, "target": 0.8, "met": busy.map(|b| b >= 0.8) },
        "services_per_gpu_vs_exclusive": { "measured": spg, "target": 5.0, "met": spg.map(|s| s >= 5.0) },
        "elastic_p99_9_ms": { "measured": p999, "target": 100.0, "met": p999.map(|p| p < 100.0) },
        "training_vs_static": { "measured": retained, "target": 0.9, "met": retained.map(|r| r >= 0.9) },
    })
}

/// The elastic policy for the modes scenario: one window all week, inference entitled to
/// what its services hold, training to the rest; the burst and a 5 s preemption grace.
fn steady_policy(inference_share: f64) -> String {
    let inference = inference_share.clamp(0.05, 0.95);
    format!(
        "time_zone = \"UTC\"\n\n[[window]]\nname = \"all week\"\n\
         days = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         from = \"00:00\"\nto = \"00:00\"\n\
         shares = {{ inference = {inference:.3}, training = {:.3} }}\n\n\
         [burst]\nclass = \"inference\"\nqueue_ms = 50\nmax_extra_share = 0.1\n\
         cooldown_minutes = 1\n\n[preemption]\ngrace_seconds = 5\n",
        1.0 - inference
    )
}

/// Waits until each service replica of `keys` runs and listens (up to two minutes).
async fn wait_for_ports(fleet: &Fleet, keys: &[String]) -> anyhow::Result<HashMap<String, u16>> {
    let started = std::time::Instant::now();
    loop {
        let ports: HashMap<String, u16> = keys
            .iter()
            .filter_map(|k| fleet.port(k).map(|p| (k.clone(), p)))
            .collect();
        if ports.len() == keys.len() {
            return Ok(ports);
        }
        if started.elapsed() > Duration::from_secs(120) {
            let jobs = fleet.jobs().await?;
            let waiting: Vec<String> = jobs
                .iter()
                .filter(|j| {
                    j["name"]
                        .as_str()
                        .is_some_and(|n| keys.iter().any(|k| k == n) && !ports.contains_key(n))
                })
                .map(|j| format!("{} {} {}", j["name"], j["state"], j["pending_reason"]))
                .collect();
            bail!("services not listening after 2 minutes: {waiting:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Latency quantiles (ms) and the true share of requests over the objective (lost and
/// refused requests count as over it).
fn latency_report(out: &load::Outcome, slo_ms: f64) -> Value {
    let l: Vec<f64> = out.latencies_ms.iter().map(|(_, ms)| *ms).collect();
    latency_summary(l, out.lost, out.refused, slo_ms)
}

fn latency_summary(mut l: Vec<f64>, lost: u64, refused: u64, slo_ms: f64) -> Value {
    l.sort_by(f64::total_cmp);
    let over = l.iter().filter(|&&x| x > slo_ms).count() as u64 + lost + refused;
    let all = l.len() as u64 + lost + refused;
    json!({
        "p50": crate::harness::percentile(&l, 0.5),
        "p99": crate::harness::percentile(&l, 0.99),
        "p99_9": crate::harness::percentile(&l, 0.999),
        "max": l.last().copied().unwrap_or(0.0),
        "requests": all,
        "answered": l.len(),
        "lost": lost,
        "refused": refused,
        "over_slo_share": if all == 0 { 0.0 } else { over as f64 / all as f64 },
    })
}

fn busy_total(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
) -> (f64, HashMap<String, f64>) {
    let per: HashMap<String, f64> = after
        .iter()
        .map(|(g, a)| {
            (
                g.clone(),
                a.saturating_sub(before.get(g).copied().unwrap_or(0)) as f64 / 1e9,
            )
        })
        .collect();
    (per.values().sum(), per)
}

/// Kernel-seconds the training loops ran between two readings.
fn work_between(before: &HashMap<String, f64>, after: &HashMap<String, f64>) -> f64 {
    after
        .iter()
        .map(|(k, w)| w - before.get(k).copied().unwrap_or(0.0))
        .fold(0.0, |a, b| a + b)
}

/// Attempts of training jobs that a preemption (or any requeue) ended.
fn preemptions(jobs: &[Value]) -> u64 {
    jobs.iter()
        .filter(|j| j["tenant"] == "research")
        .map(|j| j["attempt"].as_u64().unwrap_or(1).saturating_sub(1))
        .sum()
}

/// Stops the training loops as a cancel stops them (SIGTERM, a checkpoint) and says what
/// they ran in all and what their checkpoints hold: the difference was lost.
async fn stop_training(fleet: &Fleet, training: &[(String, String)]) -> anyhow::Result<(f64, f64)> {
    let ids: Vec<String> = training.iter().map(|(_, id)| id.clone()).collect();
    fleet.cancel_all(&ids).await?;
    let work = fleet.training_work();
    let executed = training
        .iter()
        .flat_map(|(_, id)| {
            let prefix = format!("{id}-");
            work.iter()
                .filter(move |(name, _)| name.starts_with(&prefix))
                .map(|(_, w)| *w)
        })
        .sum();
    let retained = training.iter().map(|(k, _)| fleet.checkpointed(k)).sum();
    Ok((executed, retained))
}

/// A load being sent: its bursts, where its requests go and where their answers come back.
struct Load {
    bursts: Vec<load::Burst>,
    router: load::Router,
    answers: load::Answers,
    /// Replicas' answers are read until then.
    until: tokio::time::Instant,
    /// Its outcome, once the load and its drain are over.
    sender: tokio::task::JoinHandle<load::Outcome>,
}

impl Load {
    /// Puts the replica `key` of `service`, listening on loopback `port`, in the rotation.
    async fn join(&self, service: usize, key: &str, port: u16) -> std::io::Result<()> {
        connect(&self.router, &self.answers, self.until, service, key, port).await
    }
}

async fn connect(
    router: &load::Router,
    answers: &load::Answers,
    until: tokio::time::Instant,
    service: usize,
    key: &str,
    port: u16,
) -> std::io::Result<()> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    router.add(service, key, addr, answers, until).await
}

/// Connects to the first replica of each service (service `i` is `keys[i]`, listening on
/// `ports[keys[i]]`) and starts sending the seeded load at `start`.
async fn start_load(
    args: &EfficiencyBench,
    shape: &load::Shape,
    keys: &[String],
    ports: &HashMap<String, u16>,
    start: tokio::time::Instant,
) -> anyhow::Result<Load> {
    let (bursts, requests) = load::schedule(shape, args.services(), args.seed);
    let router = load::Router::default();
    let answers: load::Answers = Arc::default();
    let until = start + shape.duration + Duration::from_secs(10);
    for (i, key) in keys.iter().enumerate() {
        connect(&router, &answers, until, i, key, ports[key])
            .await
            .with_context(|| format!("connecting to service {key}"))?;
    }
    let sender = send(&router, &answers, requests, start);
    Ok(Load {
        bursts,
        router,
        answers,
        until,
        sender,
    })
}

/// Sends `requests` from `start` on a task of its own (answers awaited 5 s after the last).
fn send(
    router: &load::Router,
    answers: &load::Answers,
    requests: Vec<load::Request>,
    start: tokio::time::Instant,
) -> tokio::task::JoinHandle<load::Outcome> {
    let (router, answers) = (router.clone(), answers.clone());
    tokio::spawn(async move {
        load::run(&router, &answers, &requests, start, Duration::from_secs(5)).await
    })
}

/// Connects to service `i` at `ports[keys[i]]`, and to each replica that starts after
/// (a service moved: its port file names the new one) until the load is over, and sends
/// `requests` from `start` (for `duration`); the outcome once they are answered.
async fn start_requests(
    fleet: &Fleet,
    keys: &[String],
    ports: &HashMap<String, u16>,
    requests: Vec<load::Request>,
    start: tokio::time::Instant,
    duration: Duration,
) -> anyhow::Result<tokio::task::JoinHandle<load::Outcome>> {
    let router = load::Router::default();
    let answers: load::Answers = Arc::default();
    let until = start + duration + Duration::from_secs(10);
    let mut connected = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        // A service moved since it listened there is joined where it listens next.
        let port = ports[key];
        if connect(&router, &answers, until, i, &format!("{key}:{port}"), port)
            .await
            .is_ok()
        {
            connected.insert(key.clone(), port);
        }
    }
    // The load balancer follows the services: a replica listening on a new port joins.
    let (port_files, follow) = (fleet.ports.clone(), router.clone());
    let (keys, follow_answers) = (keys.to_vec(), answers.clone());
    tokio::spawn(async move {
        while tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
            for (i, key) in keys.iter().enumerate() {
                let Some(port) = std::fs::read_to_string(port_files.join(key))
                    .ok()
                    .and_then(|p| p.trim().parse::<u16>().ok())
                else {
                    continue;
                };
                if connected.get(key) == Some(&port) {
                    continue;
                }
                let joined = connect(
                    &follow,
                    &follow_answers,
                    until,
                    i,
                    &format!("{key}:{port}"),
                    port,
                )
                .await;
                if joined.is_ok() {
                    connected.insert(key.clone(), port);
                }
            }
        }
    });
    Ok(send(&router, &answers, requests, start))
}

async fn run_mode(
    args: &EfficiencyBench,
    kit: &Kit,
    dir: &Path,
    mode: Mode,
) -> anyhow::Result<Value> {
    let services = args.services();
    let gpus = args.fleet_gpus();
    // Inference is entitled to the GPUs its services fill at their elastic share.
    let per_gpu = (1000 / args.elastic_milli).max(1) as usize;
    let service_gpus = services.div_ceil(per_gpu);
    let policy = (mode == Mode::Elastic).then(|| steady_policy(service_gpus as f64 / gpus as f64));
    let fleet = Fleet::start(kit, dir, &args.fleet(policy)).await?;
    let result = drive_mode(args, &fleet, mode).await;
    fleet.stop().await;
    result
}

async fn drive_mode(args: &EfficiencyBench, fleet: &Fleet, mode: Mode) -> anyhow::Result<Value> {
    let services = args.services();
    let (milli, compute) = match mode {
        Mode::Exclusive => (None, "strict"),
        Mode::Static => (Some(args.static_milli), "strict"),
        Mode::Elastic => (Some(args.elastic_milli), "elastic"),
        Mode::Auto => bail!("auto sizes what a demand replay sends: give --demand"),
    };
    // Services first, each running before the next is placed, as a deployment rolls out.
    let keys: Vec<String> = (0..services).map(|i| format!("svc-{i}")).collect();
    let mut service_ids = Vec::new();
    for k in &keys {
        service_ids.push(
            fleet
                .submit_service(k, milli, compute, &args.serve_args())
                .await?,
        );
    }
    let ports = wait_for_ports(fleet, &keys).await?;
    // Then the training backlog: a loop per GPU, and under elastic sharing one more per
    // GPU at the share services leave, elastic, to run in their idle time.
    let mut training = fleet.submit_backlog(&args.train_args(), false).await?;
    if mode == Mode::Elastic {
        let per_gpu = (1000 / args.elastic_milli).max(1);
        let left = 1000 - per_gpu * args.elastic_milli;
        if left >= 50 {
            for i in 0..args.fleet_gpus() {
                let key = format!("fill-{i}");
                training.push((
                    key.clone(),
                    fleet
                        .submit_training(&key, Some(left), &args.train_args())
                        .await?,
                ));
            }
        }
    }
    // Let placement settle and every loop start.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let shape = args.shape(Duration::from_secs(args.secs), 0.5);
    let start = tokio::time::Instant::now() + Duration::from_secs(1);
    let load = start_load(args, &shape, &keys, &ports, start).await?;
    tokio::time::sleep_until(start).await;
    let (busy0, work0) = (fleet.busy_ns(), fleet.training_work());
    tokio::time::sleep_until(start + shape.duration).await;
    let (busy1, work1) = (fleet.busy_ns(), fleet.training_work());
    let outcome = load.sender.await.context("the load generator")?;

    let window_s = shape.duration.as_secs_f64();
    let (busy_s, per_gpu) = busy_total(&busy0, &busy1);
    let jobs = fleet.jobs().await?;
    let service_gpus: BTreeSet<String> = jobs
        .iter()
        .filter(|j| j["tenant"] == "serving" && j["state"] == "running")
        .flat_map(|j| j["gpu_uuids"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g.as_str().map(str::to_owned))
        .collect();
    let inference_busy: f64 = service_gpus
        .iter()
        .map(|g| per_gpu.get(g).copied().unwrap_or(0.0))
        .sum();
    let window_work = work_between(&work0, &work1);
    let preempted = preemptions(&jobs);
    let (executed, retained) = stop_training(fleet, &training).await?;
    fleet.cancel_all(&service_ids).await?;
    let running_training = jobs
        .iter()
        .filter(|j| j["tenant"] == "research" && j["state"] == "running")
        .count();

    Ok(json!({
        "gpu_busy": busy_s / (window_s * fleet.gpus.len() as f64),
        "inference_gpus": service_gpus.len(),
        "inference_gpu_busy": if service_gpus.is_empty() { 0.0 } else { inference_busy / (window_s * service_gpus.len() as f64) },
        "services_per_gpu": if service_gpus.is_empty() { 0.0 } else { services as f64 / service_gpus.len() as f64 },
        "latency_ms": latency_report(&outcome, args.slo_ms),
        "training_jobs_running": running_training,
        "training_kernel_s": window_work,
        "training_kernel_s_per_s": window_work / window_s,
        "training_preemptions": preempted,
        "training_executed_kernel_s": executed,
        "training_lost_kernel_s": (executed - retained).max(0.0),
        "bursts": load.bursts.len(),
    }))
}

/// The day-night policy: day from `dawn` for `half` minutes, night the rest, every day (UTC).
fn day_night_policy(dawn: chrono::DateTime<chrono::Utc>, half: u64) -> String {
    let dusk = dawn + chrono::Duration::minutes(half as i64);
    let (d, n) = (dawn.format("%H:%M"), dusk.format("%H:%M"));
    let days = r#"["mon", "tue", "wed", "thu", "fri", "sat", "sun"]"#;
    format!(
        "time_zone = \"UTC\"\n\n\
         [[window]]\nname = \"day: inference first\"\ndays = {days}\nfrom = \"{d}\"\nto = \"{n}\"\n\
         shares = {{ inference = 0.8, training = 0.2 }}\n\n\
         [[window]]\nname = \"night: training first\"\ndays = {days}\nfrom = \"{n}\"\nto = \"{d}\"\n\
         shares = {{ inference = 0.2, training = 0.8 }}\n\n\
         [burst]\nclass = \"inference\"\nqueue_ms = 50\nmax_extra_share = 0.1\ncooldown_minutes = 1\n\n\
         [preemption]\ngrace_seconds = 5\n"
    )
}

/// Replicas of each service by day, for one by night (the policy's 80% against 20%).
const DAY_REPLICAS: usize = 4;

/// The day-night scenario: one compressed day of the elastic mode. Every job is a share of
/// `--day-night-milli`; training loops fill what one replica per service leaves of the
/// fleet. At dawn the policy's day window gives inference 80% and the
/// services scale out to four replicas each, which the control plane places by stopping
/// training loops (they checkpoint in the grace period and wait); at dusk they scale back
/// in and the loops resume from their checkpoints.
async fn day_night(args: &EfficiencyBench, kit: &Kit, dir: &Path) -> anyhow::Result<Value> {
    let gpus = args.fleet_gpus();
    let services = args.services();
    let milli = args.day_night_milli;
    // By day the replicas must fit in inference's 80%.
    if services * DAY_REPLICAS * milli as usize > gpus * 800 {
        bail!(
            "--day-night-milli {milli}: {services} services of {DAY_REPLICAS} replicas do not fit in 80% of {gpus} GPUs"
        );
    }
    let slots = gpus * (1000 / milli) as usize;
    let loops = slots.saturating_sub(services);
    let half = args.day_minutes / 2;
    let day = Duration::from_secs(args.day_minutes * 60);
    // Dawn: the next whole minute at least 90 s away; the fleet is set up in the night
    // before it.
    let dawn_ts = (chrono::Utc::now().timestamp() + 90).div_euclid(60) * 60 + 60;
    let dawn = chrono::DateTime::from_timestamp(dawn_ts, 0).context("a time")?;
    let fleet = Fleet::start(kit, dir, &args.fleet(Some(day_night_policy(dawn, half)))).await?;
    let result = drive_day_night(args, &fleet, dawn, milli, loops, day).await;
    fleet.stop().await;
    result
}

async fn drive_day_night(
    args: &EfficiencyBench,
    fleet: &Fleet,
    dawn: chrono::DateTime<chrono::Utc>,
    milli: u32,
    loops: usize,
    day: Duration,
) -> anyhow::Result<Value> {
    let services = args.services();
    let night_keys: Vec<String> = (0..services).map(|i| format!("svc-{i}-r0")).collect();
    let mut service_ids = Vec::new();
    for k in &night_keys {
        service_ids.push(
            fleet
                .submit_service(k, Some(milli), "elastic", &args.serve_args())
                .await?,
        );
    }
    let ports = wait_for_ports(fleet, &night_keys).await?;
    let mut training = Vec::new();
    for i in 0..loops {
        let key = format!("train-{i}");
        training.push((
            key.clone(),
            fleet
                .submit_training(&key, Some(milli), &args.train_args())
                .await?,
        ));
    }
    let to_dawn = (dawn - chrono::Utc::now()).to_std().unwrap_or_default();
    let start = tokio::time::Instant::now() + to_dawn;
    let dusk = start + day / 2;
    let end = start + day;

    let shape = args.shape(day, 0.25);
    let load = start_load(args, &shape, &night_keys, &ports, start).await?;
    tokio::time::sleep_until(start).await;
    let (busy0, work0) = (fleet.busy_ns(), fleet.training_work());

    // Dawn: scale out; each new replica joins the rotation once it listens.
    let mut day_keys = Vec::new();
    let mut day_ids = Vec::new();
    for r in 1..DAY_REPLICAS {
        for i in 0..services {
            let key = format!("svc-{i}-r{r}");
            day_ids.push(
                fleet
                    .submit_service(&key, Some(milli), "elastic", &args.serve_args())
                    .await?,
            );
            day_keys.push((i, key));
        }
    }
    let mut joined = std::collections::HashSet::new();
    let mut scaled_out_s = None;
    while tokio::time::Instant::now() < dusk && joined.len() < day_keys.len() {
        for (i, key) in &day_keys {
            if joined.contains(key) {
                continue;
            }
            if let Some(port) = fleet.port(key)
                && load.join(*i, key, port).await.is_ok()
            {
                joined.insert(key.clone());
            }
        }
        if joined.len() == day_keys.len() {
            scaled_out_s = Some(start.elapsed().as_secs_f64());
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    tokio::time::sleep_until(dusk).await;
    let (busy_dusk, work_dusk) = (fleet.busy_ns(), fleet.training_work());
    // Dusk: scale in, the replicas out of the rotation before they stop.
    for (_, key) in &day_keys {
        load.router.remove(key);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.cancel_all(&day_ids).await?;
    tokio::time::sleep_until(end).await;
    let (busy1, work1) = (fleet.busy_ns(), fleet.training_work());
    let outcome = load.sender.await.context("the load generator")?;

    let g = fleet.gpus.len() as f64;
    let half_s = day.as_secs_f64() / 2.0;
    let (day_busy, _) = busy_total(&busy0, &busy_dusk);
    let (night_busy, _) = busy_total(&busy_dusk, &busy1);
    let jobs = fleet.jobs().await?;
    let preempted = preemptions(&jobs);
    let (executed, retained) = stop_training(fleet, &training).await?;
    fleet.cancel_all(&service_ids).await?;

    let by_half = |day_half: bool| -> Vec<f64> {
        outcome
            .latencies_ms
            .iter()
            .filter(|(at, _)| (at.as_secs_f64() < half_s) == day_half)
            .map(|(_, ms)| *ms)
            .collect()
    };
    Ok(json!({
        "scenario": "day-night",
        "seed": args.seed,
        "fleet_gpus": fleet.gpus.len(),
        "services": services,
        "replicas": { "day": DAY_REPLICAS, "night": 1, "gpu_milli": milli },
        "training_loops": loops,
        "day_minutes": args.day_minutes,
        "dawn_utc": dawn.to_rfc3339(),
        "service_load": args.service_load,
        "swing": args.swing,
        "utilization": {
            "whole_day": (day_busy + night_busy) / (g * day.as_secs_f64()),
            "day": day_busy / (g * half_s),
            "night": night_busy / (g * half_s),
            "target_whole_day": 0.7,
        },
        "scale_out_s": scaled_out_s,
        "latency_ms": {
            "whole_day": latency_report(&outcome, args.slo_ms),
            "day": latency_summary(by_half(true), 0, 0, args.slo_ms),
            "night": latency_summary(by_half(false), 0, 0, args.slo_ms),
        },
        "training_kernel_s": {
            "day": work_between(&work0, &work_dusk),
            "night": work_between(&work_dusk, &work1),
        },
        "training_preemptions": preempted,
        "training_executed_kernel_s": executed,
        "training_lost_kernel_s": (executed - retained).max(0.0),
        "bursts": load.bursts.len(),
    }))
}
