//! `allot bench crash`: crash consistency of the control plane. `allot server` runs as a
//! child process on PostgreSQL (a throwaway cluster, or `--database-url`) or on the embedded
//! SQLite database `allot dev` uses, with real `allot agent` processes and an open-loop load
//! of submits and cancels; the agents report their jobs' starts and ends. At seeded random
//! moments the server is killed with SIGKILL and started again on the same database.
//!
//! Afterwards, from what the API, the job processes and the audit logs show:
//! - every submit answered 2xx exists, and its `job.submit` entry is in its tenant's log;
//! - every job's history follows the state machine with no skipped step, every state the
//!   benchmark saw while it ran is in that history in the order seen, attempts never went
//!   down, and the log's `job.transition` entries are that same history;
//! - no job is lost (each ends succeeded, or cancelled when the benchmark asked) and none
//!   ran twice (each job appends a line to a file when its run completes; `/proc` is
//!   watched for two live attempts of one job);
//! - every audit log verifies offline, with the verifier keys fetched before the first
//!   kill, against the checkpoint copies the server wrote outside its database and the
//!   signed checkpoints the benchmark fetched while it ran (no gap, no rewrite).
//!
//! The agents are separate processes that outlive each kill: killing `allot dev` would kill
//! its embedded agents too, which is the agent crash `allot bench chaos` covers.

use anyhow::bail;

use crate::harness::parse_range;
use crate::harness::scenario::{Database, Faults, LoadArgs, Scenario, run_scenario};

#[derive(Debug, clap::Args)]
pub struct CrashBench {
    /// What the server keeps its state in.
    #[arg(long, value_enum, default_value_t = Database::Postgres)]
    database: Database,
    /// PostgreSQL to use instead of a throwaway cluster (a database of its own: the
    /// benchmark fills it).
    #[arg(long)]
    database_url: Option<String>,
    /// Times the server is killed with SIGKILL (and started again).
    #[arg(long, default_value_t = 25)]
    kills: usize,
    /// Agent processes (simulated GPU nodes).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Milliseconds from the server being ready to the next kill, drawn from this range.
    #[arg(long, default_value = "500-6000", value_parser = parse_range)]
    up_ms: (u64, u64),
    /// Milliseconds the server stays dead before it is started again, drawn from this range.
    #[arg(long, default_value = "1-1500", value_parser = parse_range)]
    down_ms: (u64, u64),
    #[command(flatten)]
    load: LoadArgs,
}

pub async fn run(args: &CrashBench) -> anyhow::Result<()> {
    if args.kills == 0 || args.nodes == 0 || !(args.load.rate > 0.0 && args.load.rate <= 1000.0) {
        bail!("--kills and --nodes must be at least 1, and --rate in (0, 1000]");
    }
    run_scenario(&Scenario {
        database: args.database,
        database_url: args.database_url.clone(),
        replicas: 1,
        nodes: args.nodes,
        jobs: None,
        up_ms: args.up_ms,
        down_ms: args.down_ms,
        load: args.load.clone(),
        faults: Faults::Restarts { kills: args.kills },
        bench: "crash",
    })
    .await
}
