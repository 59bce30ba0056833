//! `allot-bench` (run as `allot bench …`): the measured benchmarks whose figures go into
//! docs/benchmarks.md. A binary of its own so that the `allot` a fleet runs links none of
//! what only benchmarks need (the shim's probe, the fake driver's busy reader, the trace
//! harness); `allot bench` runs this binary from beside itself. It starts `allot` (the
//! binary beside it) as servers and agents where a benchmark needs processes.

mod audit;
mod chaos;
mod control_plane;
mod crash;
mod efficiency;
mod failover;
mod launch;
mod openb;
mod postgres;
mod scheduler;
mod shim;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// Benchmarks of Allot; their results belong in docs/benchmarks.md.
#[derive(Debug, Parser)]
#[command(name = "allot bench", bin_name = "allot bench", version)]
struct Cli {
    #[command(subcommand)]
    bench: BenchCmd,
}

/// Which runtime a benchmark's agents run jobs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    Oci,
    Process,
}

/// The `allot` binary the benchmarks start as servers and agents: the one beside this
/// binary (`ALLOT_BIN` names another).
pub fn allot_exe() -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("ALLOT_BIN") {
        return Ok(p.into());
    }
    let me = std::env::current_exe().context("locating allot-bench")?;
    let allot = me.with_file_name("allot");
    anyhow::ensure!(
        allot.is_file(),
        "{} is missing: build it beside allot-bench (cargo build -p allot), or name it in ALLOT_BIN",
        allot.display()
    );
    Ok(allot)
}

fn main() -> ExitCode {
    allot_api::crypto::install_crypto_provider();
    let cli = Cli::parse();
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("ALLOT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.bench)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// The audit log on PostgreSQL: batched append throughput with concurrent writers, append
    /// latency at a fixed rate, offline verification rate, and export + verify of a large log.
    Audit(audit::AuditBench),
    /// Fault injection against real agent processes: SIGKILLed and restarted agents,
    /// partitions and blips; counts jobs lost or running twice, and recovery times.
    Chaos(chaos::ChaosBench),
    /// The replicated control plane's live path: replicas on PostgreSQL, in-process agents;
    /// submit-to-running latency (open loop), submits per second (concurrent clients),
    /// scheduling pass duration at large backlogs, heartbeats of thousands of nodes.
    ControlPlane(control_plane::ControlPlaneBench),
    /// Crash consistency: `allot server` on PostgreSQL (or SQLite) SIGKILLed at random
    /// moments under a load of submits, cancels and agents' reports, and restarted each
    /// time; then every acknowledged submit, every job's history, every run and every audit
    /// log is checked.
    Crash(crash::CrashBench),
    /// GPU utilization, services per GPU, request latency and training work on the real
    /// system (control plane, agents, shim, contending simulated GPUs, workload programs,
    /// an open-loop load): exclusive, static and elastic sharing side by side.
    Efficiency(efficiency::EfficiencyBench),
    /// Control-plane failover: replicas on PostgreSQL whose leader is SIGKILLed or frozen
    /// with SIGSTOP past its lease at random moments under load; counts writes by a deposed
    /// leader, jobs lost, run twice, failed or requeued, takeover and scheduling-resume
    /// times, and requests answered by a client that retries on another replica.
    Failover(failover::FailoverBench),
    /// From an assignment's arrival to the job's process running: the process runtime
    /// against the oci runtime (runc, the image cached), median and p99 side by side.
    Launch(launch::LaunchBench),
    /// Replay the openb GPU-sharing trace under the published protocol with one placement
    /// policy, and report GPU allocation against arrival.
    Openb(openb::OpenbBench),
    /// Writes a variant of the openb trace family (chosen shares of CPU-only, shared,
    /// multi-GPU and model-constrained pods, drawn from a base trace's pods) as a pod list.
    OpenbVariant(openb::OpenbVariant),
    /// Placement throughput and decision latency on a large synthetic cluster with a deep
    /// backlog (one decision per pending job, in order).
    Scheduler(scheduler::SchedulerBench),
    /// What the GPU-sharing shim adds to each allocation, free and kernel launch it
    /// intercepts (the C probe on the fake CUDA driver, with and without the shim).
    Shim(shim::ShimBench),
}

async fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Audit(args) => audit::run(args).await,
        BenchCmd::Chaos(args) => chaos::run(&args).await,
        BenchCmd::ControlPlane(args) => control_plane::run(&args).await,
        BenchCmd::Crash(args) => crash::run(&args).await,
        BenchCmd::Efficiency(args) => efficiency::run(&args).await,
        BenchCmd::Failover(args) => failover::run(&args).await,
        BenchCmd::Launch(args) => launch::run(&args).await,
        BenchCmd::Openb(args) => openb::run(&args),
        BenchCmd::OpenbVariant(args) => openb::variant(&args),
        BenchCmd::Scheduler(args) => scheduler::run(&args),
        BenchCmd::Shim(args) => shim::run(&args),
    }
}

/// Prints a benchmark's result: one line of JSON with `--json`, else indented.
fn print(out: &serde_json::Value, one_line: bool) -> anyhow::Result<()> {
    if one_line {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(out)?);
    }
    Ok(())
}

/// The `p` quantile (0–1) of ascending `sorted`, by nearest rank; 0 when empty.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Where a run keeps its files: `keep` (created if need be), else a temporary directory
/// removed when the returned guard drops. The path is canonical.
fn work_dir(
    keep: Option<&std::path::Path>,
) -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf)> {
    use anyhow::Context as _;
    let dir = tempfile::tempdir().context("temporary directory")?;
    let root = match keep {
        Some(keep) => {
            std::fs::create_dir_all(keep)?;
            keep.canonicalize()?
        }
        None => dir.path().canonicalize()?,
    };
    Ok((dir, root))
}

/// Starts a control plane in this process on a fresh database, and a client holding the
/// admin token its first start made.
async fn in_process_server(
    config: allot_server::ServerConfig,
) -> anyhow::Result<(allot_server::RunningServer, allot_client::Client)> {
    use anyhow::Context as _;
    let server =
        allot_server::start(config, std::sync::Arc::new(allot_domain::SystemClock)).await?;
    let token = server
        .bootstrap_admin_token
        .clone()
        .context("a fresh database gives a bootstrap token")?;
    let client = allot_client::Client::new(&server.http_url(), Some(token), None)?;
    Ok((server, client))
}

/// What a benchmark's sleeping job reserves (`cpu_milli`, `memory_bytes`): a shell and a
/// `sleep` need a tenth of a CPU and little memory. Left to the tenant's default (one CPU
/// each), a simulated node of a small host would fit as many jobs as the host has CPUs, not
/// GPUs, and the benchmark would measure the queue that makes instead of what it says.
const SLEEP_JOB_CPU_MILLI: u32 = 100;
const SLEEP_JOB_MEMORY_BYTES: u64 = 64 << 20;

/// Starts one of a benchmark's `allot` child processes quietly (warnings only), its output
/// appended to `log`, killed if the benchmark drops it.
fn spawn_logged(
    cmd: &mut tokio::process::Command,
    log: &std::path::Path,
) -> anyhow::Result<tokio::process::Child> {
    use anyhow::Context as _;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    // Warnings only, unless `ALLOT_BENCH_LOG` says otherwise (to look into a run).
    let level = std::env::var("ALLOT_BENCH_LOG").unwrap_or_else(|_| "warn".to_owned());
    cmd.env("ALLOT_LOG", level)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.as_std().get_program()))
}
