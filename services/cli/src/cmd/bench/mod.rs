//! `allot bench …`: measured benchmarks whose figures go into docs/benchmarks.md.

mod audit;
mod openb;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// The audit log on PostgreSQL: batched append throughput with concurrent writers, append
    /// latency at a fixed rate, offline verification rate, and export + verify of a large log.
    Audit(audit::AuditBench),
    /// Replay the openb GPU-sharing trace under the published protocol with one placement
    /// policy, and report GPU allocation against arrival.
    Openb(openb::OpenbBench),
}

pub async fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Audit(args) => audit::run(args).await,
        BenchCmd::Openb(args) => openb::run(&args),
    }
}
