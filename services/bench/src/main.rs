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
mod harness;
mod launch;
mod openb;
mod scheduler;
mod shim;
mod throughput;

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
    /// Short jobs turned over on a simulated fleet (`allot dev`): N one-GPU jobs of D
    /// seconds submitted by P concurrent clients through the CLI and through the API;
    /// submits per second, submit latency and makespan against the ideal.
    Throughput(throughput::ThroughputBench),
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
        BenchCmd::Throughput(args) => throughput::run(&args).await,
    }
}
