//! The control plane under faults: replicas (or one server) on one database, real agents,
//! the load, the faults (the server killed and restarted; the leader killed or frozen),
//! then every check, and the figures. `bench crash` and `bench failover` configure it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_audit::TrustedKeys;
use allot_client::Client;
use allot_domain::JobState;
use anyhow::{Context, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Value, json};

use super::controls::Marked;
use super::faults::{fail_leader, outage as outage_of};
use super::history::{completed_runs, deposed_job_rows, history, in_order, verify_log};
use super::processes::{Agents, Server, all_jobs, live_job_processes, terminate};
use super::submits::{Answer, Ledger, Load, Seen, lock, poll};
use super::{parse_range, percentile};

pub(crate) const TENANT: &str = "crash";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Database {
    /// PostgreSQL: a throwaway cluster, or --database-url.
    Postgres,
    /// The embedded SQLite database of `allot dev`, in the run's directory.
    Sqlite,
}

/// The load and the run's keeping, as `bench crash` and `bench failover` take them.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LoadArgs {
    /// Simulated GPUs of each node.
    #[arg(long, default_value = "4xH200")]
    pub(crate) sim_gpus: String,
    /// Submits per second, sent on schedule whatever became of the others.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) rate: f64,
    /// Share of acknowledged submits the benchmark cancels, 0–4 s after the answer.
    #[arg(long, default_value_t = 0.2)]
    pub(crate) cancel_share: f64,
    /// Each job sleeps a whole number of seconds drawn from this range.
    #[arg(long, default_value = "1-3", value_parser = parse_range)]
    pub(crate) job_secs: (u64, u64),
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// After the faults and the load's end, how long the jobs may take to finish before
    /// what has not is counted as lost.
    #[arg(long, default_value_t = 300)]
    pub(crate) settle_secs: u64,
    /// Keep the servers' data directory, logs and the agents' directories here instead of
    /// a temporary directory that is removed afterwards.
    #[arg(long)]
    pub(crate) keep_dir: Option<PathBuf>,
    /// One line of JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// A violation put in on purpose, which the run must count and fail on: `lose` (one
    /// acknowledged job cancelled behind the benchmark's back) or `double` (a second copy
    /// of a running job's process).
    #[arg(long, value_enum)]
    pub(crate) negative_control: Option<super::controls::NegativeControl>,
}

/// What a run does to the control plane.
pub(crate) enum Faults {
    /// The one server SIGKILLed `kills` times, and started again each time.
    Restarts { kills: usize },
    /// The leader among the replicas SIGKILLed (and started again) or frozen with SIGSTOP
    /// for longer than its lease (and resumed): `count` times, and on until the load has
    /// been sent; `stop_share` of them frozen. After each, a probe job measures when
    /// scheduling resumed.
    Leader {
        count: usize,
        stop_share: f64,
        lease_secs: u64,
        /// The replicas' leader work writes without the fence (the negative control).
        unfenced: bool,
        /// Every replica frozen at once for this long, midway through the faults (zero:
        /// never): an outage of the whole control plane, which jobs run through.
        outage: Duration,
    },
}

/// One run: the control plane, its load and its faults.
pub(crate) struct Scenario {
    pub database: Database,
    pub database_url: Option<String>,
    /// `allot server` replicas on the one database.
    pub replicas: usize,
    pub nodes: usize,
    /// Submits sent in all; `None`: on until the faults are over.
    pub jobs: Option<u64>,
    pub up_ms: (u64, u64),
    pub down_ms: (u64, u64),
    pub load: LoadArgs,
    pub faults: Faults,
    /// What the run is called in its report.
    pub bench: &'static str,
}

/// Runs `args`: the control plane, agents and load, its faults, then the checks.
pub(crate) async fn run_scenario(args: &Scenario) -> anyhow::Result<()> {
    let (dir, root) = crate::harness::work_dir(args.load.keep_dir.as_deref())?;
    let data_dir = root.join("server");
    let runs = root.join("runs");
    std::fs::create_dir_all(&data_dir)?;
    std::fs::create_dir_all(&runs)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&runs, std::fs::Permissions::from_mode(0o777))?;
    }
    let (pg, database_url) = match (args.database, &args.database_url) {
        (Database::Sqlite, _) => (None, None),
        (Database::Postgres, Some(url)) => (None, Some(url.clone())),
        (Database::Postgres, None) => {
            let (pg, url) = crate::harness::postgres::Throwaway::start()?;
            (Some(pg), Some(url))
        }
    };
    let exe = crate::allot_exe()?;
    // The replicas share the data directory: the node CA, the keys, the checkpoint copies.
    let mut servers = Vec::with_capacity(args.replicas);
    for r in 1..=args.replicas.max(1) {
        let mut extra: Vec<String> = vec!["--min-runtime-secs".into(), "0".into()];
        if let Some(url) = &database_url {
            extra.extend(["--database-url".into(), url.clone()]);
        }
        if let Faults::Leader { lease_secs, .. } = &args.faults {
            extra.extend([
                "--replica-name".into(),
                format!("r{r}"),
                "--leader-lease-secs".into(),
                lease_secs.to_string(),
            ]);
        }
        let log = if args.replicas > 1 {
            root.join(format!("server-r{r}.log"))
        } else {
            root.join("server.log")
        };
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let mut server = Server::new(&exe, &data_dir, &log, &extra)?;
        server.unfenced = matches!(args.faults, Faults::Leader { unfenced: true, .. });
        servers.push(server);
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(if args.replicas > 1 { 3 } else { 10 }))
        .build()?;
    // The first creates what they share; the others start once it has.
    for (i, server) in servers.iter_mut().enumerate() {
        let first = Instant::now();
        server.spawn()?;
        server.ready(&http, first).await?;
        if i == 0 && args.replicas > 1 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The negative control needs servers that can write unfenced: an `allot` built with
    // the `unfenced-for-testing` feature (beside allot-bench, in one command). One built
    // alone writes fenced whatever it is told, and the control would show nothing.
    if matches!(args.faults, Faults::Leader { unfenced: true, .. }) {
        let said = |s: &Server| {
            std::fs::read_to_string(&s.log)
                .is_ok_and(|l| l.contains("leader writes are NOT fenced"))
        };
        let since = Instant::now();
        while !servers.iter().any(said) {
            if since.elapsed() > Duration::from_secs(30) {
                bail!(
                    "--unfenced: the servers write fenced: {} was built without the \
                     unfenced-for-testing feature (build it and allot-bench in one command: \
                     cargo build -p allot -p allot-bench)",
                    exe.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let token = allot_client::read_secret_file(&data_dir.join("admin.token"))
        .context("the server wrote no bootstrap admin token")?;
    let bases: Vec<String> = servers
        .iter()
        .map(|s| format!("http://{}", s.http))
        .collect();
    let clients = bases
        .iter()
        .map(|b| Client::new(b, Some(token.clone()), None))
        .collect::<Result<Vec<_>, _>>()?;
    let client = clients[0].clone();
    let _: Value = client
        .call(
            Method::POST,
            "/api/v1/tenants",
            Some(&json!({ "name": TENANT })),
        )
        .await?;
    // Pinned before the first kill: what every log must verify with at the end.
    let keys: Value = client.get("/api/v1/audit/key", &[]).await?;
    let trusted = TrustedKeys::parse(keys["keys"].as_str().unwrap_or_default())
        .context("the server's verifier keys")?;

    let agents = Agents {
        exe,
        ca_cert: data_dir.join("pki").join("ca.pem"),
        sim_gpus: args.load.sim_gpus.clone(),
        runtime: crate::RuntimeKind::Process,
        registry: None,
        extra_args: Vec::new(),
    };
    let mut children = Vec::new();
    let mut node_dirs = Vec::new();
    for i in 1..=args.nodes {
        let name = format!("crash-{i:03}");
        let node_dir = root.join(&name);
        std::fs::create_dir_all(&node_dir)?;
        let created: Value = client
            .call(
                Method::POST,
                "/api/v1/bootstrap-tokens",
                Some(&json!({ "node_name": name, "description": "allot bench crash" })),
            )
            .await?;
        let secret = created["secret"]
            .as_str()
            .context("a bootstrap token's secret")?;
        let grpc: Vec<SocketAddr> = servers.iter().map(|s| s.grpc).collect();
        children.push(agents.spawn_at(&name, &node_dir, secret, &grpc)?);
        node_dirs.push(node_dir);
    }
    let started = Instant::now();
    loop {
        let list: Vec<Value> = client.get("/api/v1/nodes", &[]).await?;
        if list.iter().filter(|n| n["status"] == "ready").count() == args.nodes {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the {} agents did not all register within 60 s", args.nodes);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Two live attempts of one job at any moment, watched from the side.
    let watching = Arc::new(AtomicBool::new(true));
    let marked = Arc::new(Marked::job_dirs(&root));
    let observer = {
        let watching = watching.clone();
        let marked = marked.clone();
        tokio::task::spawn_blocking(move || {
            let (mut doubled, mut foreign) = (HashSet::new(), HashSet::new());
            while watching.load(Ordering::Relaxed) {
                for (job, attempts) in live_job_processes(&marked.marker, &mut foreign) {
                    if attempts.len() > 1 {
                        doubled.insert(job);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            doubled
        })
    };
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let poller = {
        let (watching, seen) = (watching.clone(), seen.clone());
        let clients = clients.clone();
        tokio::spawn(async move {
            while watching.load(Ordering::Relaxed) {
                let _ = poll(&clients, &seen).await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // The load: open loop, each submit at its scheduled time whatever became of the others.
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let loading = Arc::new(AtomicBool::new(true));
    let load = Arc::new(Load {
        http: http.clone(),
        bases: bases.clone(),
        next: std::sync::atomic::AtomicUsize::new(0),
        token: token.clone(),
        runs: runs.clone(),
        seed: args.load.seed,
        rate: args.load.rate,
        cancel_share: args.load.cancel_share,
        job_secs: args.load.job_secs,
        ledger: ledger.clone(),
        outages: Mutex::default(),
    });
    let loader = {
        let loading = loading.clone();
        let load = load.clone();
        let jobs = args.jobs;
        tokio::spawn(async move {
            let start = Instant::now();
            let mut sent = tokio::task::JoinSet::new();
            let mut i = 0u64;
            while loading.load(Ordering::Relaxed) && jobs.is_none_or(|n| i < n) {
                let at = start + Duration::from_secs_f64(i as f64 / load.rate);
                tokio::time::sleep_until(at.into()).await;
                sent.spawn(load.clone().one(i));
                i += 1;
                while sent.try_join_next().is_some() {}
            }
            while sent.join_next().await.is_some() {}
        })
    };

    // The negative control, once the load has jobs running.
    let control = args.load.negative_control.map(|c| {
        let (client, ledger, marked) = (client.clone(), ledger.clone(), marked.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let ours = |id: &str| {
                let l = lock(&ledger);
                !l.cancels.contains_key(id)
                    && !l.cancels_planned.contains(id)
                    && l.submits
                        .iter()
                        .any(|(_, a, _)| matches!(a, Answer::Acked(acked) if acked == id))
            };
            super::controls::apply(c, &client, &marked, ours).await
        })
    });

    let mut rng = StdRng::seed_from_u64(args.load.seed);
    let begin = Instant::now();
    let mut restarts = Vec::new();
    let mut failovers = Vec::new();
    let mut outages: Vec<(Duration, Duration, Option<f64>)> = Vec::new();
    match &args.faults {
        Faults::Restarts { kills } => {
            let server = &mut servers[0];
            for _ in 0..*kills {
                tokio::time::sleep(Duration::from_millis(
                    rng.random_range(args.up_ms.0..=args.up_ms.1),
                ))
                .await;
                server.kill().await;
                let killed = Instant::now();
                tokio::time::sleep(Duration::from_millis(
                    rng.random_range(args.down_ms.0..=args.down_ms.1),
                ))
                .await;
                let respawned = Instant::now();
                server.spawn()?;
                server.ready(&http, respawned).await?;
                restarts.push((killed, respawned, Instant::now()));
            }
            // A last stretch of load on the last start, then it ends.
            tokio::time::sleep(Duration::from_millis(args.up_ms.1)).await;
        }
        Faults::Leader {
            count,
            stop_share,
            lease_secs,
            outage,
            ..
        } => {
            let lease = Duration::from_secs(*lease_secs);
            while failovers.len() < *count || !loader.is_finished() {
                if !outage.is_zero() && outages.is_empty() && failovers.len() >= count / 2 {
                    // The whole control plane away: every replica frozen, then woken; the
                    // next leader fault waits until it is back at work and two leases more
                    // (its wake is a burst: every agent's reports and heartbeats, and the
                    // requests queued at each replica meanwhile), so that a failover is not
                    // charged for the outage's aftermath.
                    let at = begin.elapsed();
                    let back = outage_of(&servers, &load, *outage).await;
                    outages.push((at, *outage, back));
                    tokio::time::sleep(lease * 2).await;
                }
                tokio::time::sleep(Duration::from_millis(
                    rng.random_range(args.up_ms.0..=args.up_ms.1),
                ))
                .await;
                let frozen = rng.random_bool(stop_share.clamp(0.0, 1.0));
                let (frozen_for, down_for) = (
                    lease.mul_f64(rng.random_range(1.5..3.0)),
                    Duration::from_millis(rng.random_range(args.down_ms.0..=args.down_ms.1)),
                );
                let n = failovers.len();
                failovers.push(
                    fail_leader(&mut servers, &http, &load, n, frozen, frozen_for, down_for)
                        .await?,
                );
            }
        }
    }
    loading.store(false, Ordering::Relaxed);
    loader.await.context("the load")?;
    let load_wall = begin.elapsed();
    let control = match control {
        Some(c) => Some(c.await.context("the negative control")??),
        None => None,
    };

    // Everything finishes.
    let settle_by = Instant::now() + Duration::from_secs(args.load.settle_secs);
    let mut jobs = loop {
        let jobs = all_jobs(&client).await?;
        let done = jobs.iter().all(|j| {
            j["state"]
                .as_str()
                .and_then(|s| JobState::from_str(s).ok())
                .is_some_and(JobState::is_terminal)
        });
        if done || Instant::now() > settle_by {
            break jobs;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Once more, so that the latest states are seen and a checkpoint covers the end.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = poll(&clients, &seen).await;
    watching.store(false, Ordering::Relaxed);
    let doubled_live = observer.await.context("the process observer")?;
    let _ = poller.await;

    // Each job, as the API shows it with its history.
    let mut detailed: HashMap<String, Value> = HashMap::new();
    for j in &jobs {
        if let Some(id) = j["id"].as_str() {
            let job: Value = client.get(&format!("/api/v1/jobs/{id}"), &[]).await?;
            detailed.insert(id.to_owned(), job);
        }
    }
    jobs.retain(|j| j["tenant"].as_str().is_none_or(|t| t == TENANT));

    // The audit logs.
    let logs: Vec<Value> = client.get("/api/v1/audit/logs", &[]).await?;
    let sink = data_dir.join("checkpoints");
    // A copy, taken once: the lock is not held across the exports (the poller has stopped).
    let checkpoints = lock(&seen).checkpoints.clone();
    let mut audited = Vec::new();
    for log in &logs {
        audited.push(verify_log(&client, log, &trusted, &sink, &checkpoints).await?);
    }

    // Stop everything.
    for child in &mut children {
        terminate(child);
    }
    for mut child in children {
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
        }
    }
    for d in &node_dirs {
        allot_agent::runtime::process::kill_orphans(&d.join("jobs"));
    }
    for server in &mut servers {
        server.stop().await;
    }
    // The rows' own record of who wrote them last, once nothing writes.
    let deposed_rows = match (&args.faults, &database_url) {
        (Faults::Leader { .. }, Some(url)) => deposed_job_rows(url).await?,
        _ => Vec::new(),
    };
    drop(pg);

    // The checks.
    let ledger = std::mem::take(&mut *lock(&ledger));
    let seen = std::mem::take(&mut *lock(&seen));
    let runs_done = completed_runs(&runs);
    let names: HashMap<&str, &str> = jobs
        .iter()
        .filter_map(|j| Some((j["name"].as_str()?, j["id"].as_str()?)))
        .collect();
    let acked: Vec<&str> = ledger
        .submits
        .iter()
        .filter_map(|(_, a, _)| match a {
            Answer::Acked(id) => Some(id.as_str()),
            _ => None,
        })
        .collect();
    // Answered but not 2xx, by status. No submit should be (a kill cuts answers off, it
    // does not turn them into errors); a cancel of a job that has just ended is a 409.
    pub(crate) fn by_status<'a>(
        answers: impl Iterator<Item = &'a Answer>,
    ) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for a in answers {
            if let Answer::Refused(status) = a {
                *out.entry(status.to_string()).or_default() += 1;
            }
        }
        out
    }
    let submits_refused = by_status(ledger.submits.iter().map(|(_, a, _)| a));
    let cancels_refused = by_status(ledger.cancels.values());
    let unanswered: Vec<&str> = ledger
        .submits
        .iter()
        .filter(|(_, a, _)| matches!(a, Answer::Unanswered))
        .map(|(n, _, _)| n.as_str())
        .collect();
    // Unanswered submits sent while the server was up: the kill cut them off in flight
    // (the others found it down).
    let cut = ledger
        .submits
        .iter()
        .filter(|(_, a, at)| {
            matches!(a, Answer::Unanswered)
                && !restarts
                    .iter()
                    .any(|(killed, _, ready)| (*killed..=*ready).contains(at))
        })
        .count();
    let unanswered_exist = unanswered.iter().filter(|n| names.contains_key(*n)).count();
    let tenant_log = audited.iter().find(|v| v.log == TENANT);
    let missing = acked
        .iter()
        .filter(|id| !detailed.contains_key(**id))
        .count();
    let unaudited = acked
        .iter()
        .filter(|id| tenant_log.is_none_or(|l| !l.submits.contains(**id)))
        .count();

    let (mut lost, mut doubled, mut backwards, mut audit_mismatch) = (0, 0, 0, 0);
    let (mut succeeded, mut cancelled, mut failed, mut unfinished) = (0, 0, 0, 0);
    let mut forged = 0;
    let mut requeued = 0u64;
    let mut examples: Vec<Value> = Vec::new();
    for j in &jobs {
        let Some(id) = j["id"].as_str() else { continue };
        let Some(job) = detailed.get(id) else {
            continue;
        };
        let state = job["state"]
            .as_str()
            .and_then(|s| JobState::from_str(s).ok());
        let asked_to_cancel = ledger.cancels.contains_key(id);
        let runs = runs_done.get(id).copied().unwrap_or(0);
        requeued += job["attempt"].as_u64().unwrap_or(1).saturating_sub(1);
        let mut wrong = Vec::new();
        match state {
            Some(JobState::Succeeded) => succeeded += 1,
            Some(JobState::Cancelled) => cancelled += 1,
            Some(JobState::Failed) => failed += 1,
            _ => unfinished += 1,
        }
        let ended_right = match state {
            Some(JobState::Succeeded) => true,
            Some(JobState::Cancelled) => asked_to_cancel,
            _ => false,
        };
        if !ended_right {
            lost += 1;
            wrong.push("lost");
        }
        if runs > 1 || doubled_live.contains(id) {
            doubled += 1;
            wrong.push("ran twice");
        }
        if state == Some(JobState::Succeeded) && runs == 0 {
            forged += 1;
            wrong.push("succeeded without a completed run");
        }
        let (states, bad) = history(job);
        let observed = seen.states.get(id).cloned().unwrap_or_default();
        let observed_states: Vec<JobState> = observed.iter().map(|(s, _)| *s).collect();
        let attempts_down = observed.windows(2).any(|w| w[1].1 < w[0].1);
        if bad > 0 || !in_order(&observed_states, &states) || attempts_down {
            backwards += 1;
            wrong.push("history broken or moved backwards");
        }
        let steps: Vec<(String, String)> = states
            .windows(2)
            .map(|w| (w[0].as_str().to_owned(), w[1].as_str().to_owned()))
            .collect();
        let logged = tenant_log
            .and_then(|l| l.transitions.get(id))
            .cloned()
            .unwrap_or_default();
        if steps != logged {
            audit_mismatch += 1;
            wrong.push("audit log differs from the history");
        }
        if !wrong.is_empty() && examples.len() < 10 {
            examples.push(json!({
                "job": id, "wrong": wrong, "state": job["state"], "attempt": job["attempt"],
                "runs_completed": runs, "observed": observed.iter().map(|(s, a)| format!("{s}#{a}")).collect::<Vec<_>>(),
                "history": states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                "message": job["message"],
            }));
        }
    }
    let audit_ok = audited.iter().all(|v| v.problems.is_empty());
    let deposed: u64 = audited.iter().map(|v| v.deposed).sum();
    let mut back: Vec<f64> = restarts
        .iter()
        .map(|(killed, _, ready)| ready.duration_since(*killed).as_secs_f64())
        .collect();
    let mut start: Vec<f64> = restarts
        .iter()
        .map(|(_, respawned, ready)| ready.duration_since(*respawned).as_secs_f64())
        .collect();
    back.sort_by(f64::total_cmp);
    start.sort_by(f64::total_cmp);
    let cancels_acked = ledger
        .cancels
        .values()
        .filter(|a| matches!(a, Answer::Acked(_)))
        .count();
    let mut out = json!({
        "bench": args.bench,
        "database": match args.database { Database::Postgres => "postgres", Database::Sqlite => "sqlite" },
        "seed": args.load.seed,
        "nodes": args.nodes,
        "kills": restarts.len(),
        "start_to_ready_p50_s": percentile(&start, 0.5),
        "start_to_ready_p99_s": percentile(&start, 0.99),
        "kill_to_ready_p50_s": percentile(&back, 0.5),
        "kill_to_ready_p99_s": percentile(&back, 0.99),
        "kill_to_ready_max_s": back.last().copied().unwrap_or(0.0),
        "submits_sent": ledger.submits.len(),
        "submits_acknowledged": acked.len(),
        "submits_refused_by_status": submits_refused,
        "submits_cut_by_a_kill": cut,
        "submits_unanswered": unanswered.len(),
        "unanswered_submits_that_exist": unanswered_exist,
        "acknowledged_submits_missing": missing,
        "acknowledged_submits_without_audit_entry": unaudited,
        "cancels_sent": ledger.cancels.len(),
        "cancels_acknowledged": cancels_acked,
        "cancels_refused_by_status": cancels_refused,
        "jobs_checked": jobs.len(),
        "succeeded": succeeded,
        "cancelled": cancelled,
        "failed": failed,
        "unfinished": unfinished,
        "lost": lost,
        "doubled": doubled,
        "succeeded_without_a_run": forged,
        "backwards_moves": backwards,
        "audit_history_mismatches": audit_mismatch,
        "requeued_attempts": requeued,
        "state_polls": seen.polls,
        "audit_verify_ok": audit_ok,
        "audit_logs": audited.iter().map(|v| json!({
            "log": v.log, "entries": v.entries, "checkpoints_verified": v.checkpoints_verified,
            "external_checkpoints": v.external, "problems": v.problems.iter().take(5).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "load_wall_s": load_wall.as_secs_f64(),
        "examples": examples,
    });
    out["negative_control"] = json!(args.load.negative_control.map(|c| c.name()));
    out["negative_control_job"] = json!(control.as_ref().map(|(id, _)| id.clone()));
    drop(control);
    let mut failover_ok = true;
    if let Faults::Leader {
        lease_secs,
        unfenced,
        ..
    } = &args.faults
    {
        let seconds = |d: &[Option<f64>]| {
            let mut v: Vec<f64> = d.iter().flatten().copied().collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let takeover = seconds(
            &failovers
                .iter()
                .map(|f| f.takeover.map(|d| d.as_secs_f64()))
                .collect::<Vec<_>>(),
        );
        let resumed = seconds(&failovers.iter().map(|f| f.resumed).collect::<Vec<_>>());
        let unresolved = failovers
            .iter()
            .filter(|f| f.takeover.is_none() || f.resumed.is_none())
            .count();
        let share = if ledger.requests == 0 {
            0.0
        } else {
            (ledger.answered_2xx + ledger.answered_conflict) as f64 / ledger.requests as f64
        };
        let resume_p99 = percentile(&resumed, 0.99);
        failover_ok = deposed == 0
            && deposed_rows.is_empty()
            && unresolved == 0
            && outages.iter().all(|(_, _, back)| back.is_some())
            && requeued == 0
            && failed == 0
            && share >= 0.999
            && resume_p99 <= 2.0 * *lease_secs as f64;
        if let Some(o) = out.as_object_mut() {
            for (k, v) in [
                ("replicas", json!(args.replicas)),
                (
                    "requests_unanswered_in_outage",
                    json!(ledger.unanswered_in_outage),
                ),
                (
                    "outages",
                    json!(
                        outages
                            .iter()
                            .map(|(at, lasted, back)| json!({
                                "at_s": at.as_secs_f64(),
                                "every_replica_frozen_s": lasted.as_secs_f64(),
                                "woken_to_scheduling_s": back,
                            }))
                            .collect::<Vec<_>>()
                    ),
                ),
                ("fencing", json!(!unfenced)),
                ("leader_lease_s", json!(lease_secs)),
                ("faults", json!(failovers.len())),
                (
                    "faults_killed",
                    json!(failovers.iter().filter(|f| !f.frozen).count()),
                ),
                (
                    "faults_frozen",
                    json!(failovers.iter().filter(|f| f.frozen).count()),
                ),
                ("takeover_p50_s", json!(percentile(&takeover, 0.5))),
                ("takeover_p99_s", json!(percentile(&takeover, 0.99))),
                (
                    "takeover_max_s",
                    json!(takeover.last().copied().unwrap_or(0.0)),
                ),
                ("scheduling_resumed_p50_s", json!(percentile(&resumed, 0.5))),
                ("scheduling_resumed_p99_s", json!(resume_p99)),
                (
                    "scheduling_resumed_max_s",
                    json!(resumed.last().copied().unwrap_or(0.0)),
                ),
                ("failovers_unresolved", json!(unresolved)),
                ("deposed_writes_accepted", json!(deposed)),
                ("deposed_job_rows", json!(deposed_rows.len())),
                (
                    "deposed_job_row_examples",
                    json!(
                        deposed_rows
                            .iter()
                            .take(5)
                            .map(|w| json!({
                                "job": w.job_id,
                                "writer_epoch": w.writer_epoch,
                                "written_at": w.written_at.to_rfc3339(),
                                "superseded_by": w.superseded_by,
                            }))
                            .collect::<Vec<_>>()
                    ),
                ),
                ("requests", json!(ledger.requests)),
                ("requests_2xx", json!(ledger.answered_2xx)),
                ("requests_cancel_conflict", json!(ledger.answered_conflict)),
                ("requests_answered_share", json!(share)),
                (
                    "failovers",
                    json!(
                        failovers
                            .iter()
                            .map(|f| json!({
                                "frozen": f.frozen,
                                "takeover_s": f.takeover.map(|d| d.as_secs_f64()),
                                "scheduling_resumed_s": f.resumed,
                            }))
                            .collect::<Vec<_>>()
                    ),
                ),
            ] {
                o.insert(k.to_owned(), v);
            }
        }
    }
    crate::harness::print(&out, args.load.json)?;
    drop(dir);
    if missing + unaudited + lost + doubled + forged + backwards + audit_mismatch > 0 || !audit_ok {
        bail!("crash consistency does not hold (see the figures above)");
    }
    if !failover_ok {
        bail!(
            "failover does not hold: a deposed leader's write, a failed or requeued job, \
               scheduling not resumed within two leases, or under 99.9% of requests \
               answered (2xx, or 409 to a cancel of a job that had ended; see the figures \
               above)"
        );
    }
    Ok(())
}
