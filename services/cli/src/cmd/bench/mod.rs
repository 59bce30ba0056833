//! `allot bench …`: measured benchmarks whose figures go into docs/benchmarks.md.

mod audit;
mod chaos;
mod elastic;
mod launch;
mod openb;
mod scheduler;
mod shim;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// The audit log on PostgreSQL: batched append throughput with concurrent writers, append
    /// latency at a fixed rate, offline verification rate, and export + verify of a large log.
    Audit(audit::AuditBench),
    /// Fault injection against real agent processes: SIGKILLed and restarted agents,
    /// partitions and blips; counts jobs lost or running twice, and recovery times.
    Chaos(chaos::ChaosBench),
    /// A simulated fleet with a diurnal, bursty inference load and a training backlog, run
    /// three ways: exclusive whole GPUs, static sharing, elastic sharing with forecasting.
    Elastic(elastic::ElasticBench),
    /// From an assignment's arrival to the job's process running: the process runtime
    /// against the oci runtime (runc, the image cached), median and p99 side by side.
    Launch(launch::LaunchBench),
    /// Replay the openb GPU-sharing trace under the published protocol with one placement
    /// policy, and report GPU allocation against arrival.
    Openb(openb::OpenbBench),
    /// Placement throughput and decision latency on a large synthetic cluster with a deep
    /// backlog (one decision per pending job, in order).
    Scheduler(scheduler::SchedulerBench),
    /// What the GPU-sharing shim adds to each allocation, free and kernel launch it
    /// intercepts (the C probe on the fake CUDA driver, with and without the shim).
    Shim(shim::ShimBench),
}

pub async fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Audit(args) => audit::run(args).await,
        BenchCmd::Chaos(args) => chaos::run(&args).await,
        BenchCmd::Elastic(args) => elastic::run(&args),
        BenchCmd::Launch(args) => launch::run(&args).await,
        BenchCmd::Openb(args) => openb::run(&args),
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
