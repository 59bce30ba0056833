//! `allot bench failover`: several `allot server` replicas on one PostgreSQL database (a
//! throwaway cluster, or `--database-url`), real `allot agent` processes given every
//! replica's address, and an open-loop load of submits and cancels sent through whichever
//! replica answers. At seeded random moments the leader is killed with SIGKILL (and
//! started again) or frozen with SIGSTOP for longer than its lease (and resumed); right
//! after each fault a probe job is submitted through another replica.
//!
//! Reported and asserted, besides everything `allot bench crash` checks (acknowledged
//! submits present and audited, histories, no job lost or run twice, audit logs verified
//! offline): writes by a deposed leader accepted (an entry a leader wrote under an epoch
//! after an entry of a later epoch in the same log: log order is commit order; and, read
//! from the database once the replicas have stopped, a job row last written under an epoch
//! after a later term had begun: `jobs.writer_epoch` against `leader_terms`), jobs
//! failed or requeued, the time to another replica leading and to the probe being placed
//! (p99 within two leases), and the share of the load's requests answered (2xx, or 409 to
//! a cancel of a job that had ended meanwhile; at least 99.9%).
//! `--unfenced` runs the replicas with their leader writes unfenced: the negative control,
//! which should fail the run.

use anyhow::bail;

use crate::harness::parse_range;
use crate::harness::scenario::{Database, Faults, LoadArgs, Scenario, run_scenario};

#[derive(Debug, clap::Args)]
pub struct FailoverBench {
    /// `allot server` replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Agent processes (simulated GPU nodes).
    #[arg(long, default_value_t = 20)]
    nodes: usize,
    /// Jobs submitted in all (besides one probe per fault).
    #[arg(long, default_value_t = 500)]
    jobs: u64,
    /// Faults of the leader, at least (they go on until the load has been sent).
    #[arg(long, default_value_t = 10)]
    faults: usize,
    /// Share of the faults that freeze the leader (SIGSTOP) rather than kill it.
    #[arg(long, default_value_t = 0.5)]
    stop_share: f64,
    /// The replicas' leader lease, in seconds; a frozen leader stays frozen 1.5–3 leases.
    #[arg(long, default_value_t = 5)]
    leader_lease_secs: u64,
    /// Milliseconds from a failover settling to the next fault, drawn from this range.
    #[arg(long, default_value = "1000-4000", value_parser = parse_range)]
    up_ms: (u64, u64),
    /// Milliseconds a killed leader stays dead before it is started again.
    #[arg(long, default_value = "500-3000", value_parser = parse_range)]
    down_ms: (u64, u64),
    /// PostgreSQL to use instead of a throwaway cluster (a database of its own).
    #[arg(long)]
    database_url: Option<String>,
    /// The negative control: the replicas' leader writes unfenced (a deposed leader's
    /// writes land). The run should then fail.
    #[arg(long)]
    unfenced: bool,
    /// Also freeze every replica at once (SIGSTOP) for this many seconds, midway through
    /// the faults, then wake them: jobs must run through it, none requeued (0: no outage).
    #[arg(long, default_value_t = 0)]
    outage_secs: u64,
    #[command(flatten)]
    load: LoadArgs,
}

pub async fn run(args: &FailoverBench) -> anyhow::Result<()> {
    if args.replicas < 2
        || args.nodes == 0
        || args.jobs == 0
        || args.faults == 0
        || !(args.load.rate > 0.0 && args.load.rate <= 1000.0)
        || !(0.0..=1.0).contains(&args.stop_share)
        || args.leader_lease_secs == 0
    {
        bail!(
            "--replicas at least 2; --nodes, --jobs, --faults and --leader-lease-secs at \
             least 1; --rate in (0, 1000]; --stop-share in [0, 1]"
        );
    }
    run_scenario(&Scenario {
        database: Database::Postgres,
        database_url: args.database_url.clone(),
        replicas: args.replicas,
        nodes: args.nodes,
        jobs: Some(args.jobs),
        up_ms: args.up_ms,
        down_ms: args.down_ms,
        load: args.load.clone(),
        faults: Faults::Leader {
            count: args.faults,
            stop_share: args.stop_share,
            lease_secs: args.leader_lease_secs,
            unfenced: args.unfenced,
            outage: std::time::Duration::from_secs(args.outage_secs),
        },
        bench: "failover",
    })
    .await
}
