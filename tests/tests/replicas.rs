//! Several `allot server` replicas on one PostgreSQL database: one leads (schedules, serves
//! the agents), the others serve the API and point agents at the leader. The leader is
//! frozen with SIGSTOP for longer than its lease: another replica takes over under the next
//! epoch, the agent follows it without losing or restarting its job, work submitted
//! meanwhile runs, and the frozen replica, once resumed, writes nothing as leader and
//! follows.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use allot_store::testing::{Backend, TestDb};
use allot_store::{LeadershipRepo, Store};
use allot_system_tests::allot_bin;
use allot_system_tests::replica::{
    Api, Replica, client, eventually, join_agent, leader_and_follower, read, signal,
};

/// Replicas a (leading) and b on a fresh PostgreSQL database with `lease_secs` leases, the
/// agent of node n1, and job `before` running on it.
struct Running {
    _db: TestDb,
    _dir: tempfile::TempDir,
    url: String,
    root: PathBuf,
    http: reqwest::Client,
    token: String,
    a: Replica,
    b: Replica,
    agent: Child,
    first: String,
}

impl Running {
    /// The agent is given the follower first when `via_follower` (it is sent on to the
    /// leader), else the leader; the job is submitted through the same replica.
    async fn start(lease_secs: u64, via_follower: bool) -> Self {
        let db = TestDb::new(Backend::Postgres).await.expect("PostgreSQL");
        let url = db.url.clone();
        let dir = tempfile::tempdir().expect("tempdir");
        let root: PathBuf = dir.path().to_owned();
        let http = client();
        let (a, b) = leader_and_follower(&http, &url, &root, lease_secs, &[]).await;
        let token = read(&root.join("server/admin.token"));
        let api = Api {
            http: &http,
            token: token.clone(),
        };
        let (via, other) = if via_follower { (&b, &a) } else { (&a, &b) };
        let agent = join_agent(&api, &root, via, &[&via.grpc, &other.grpc], "n1").await;
        let first = api.submit(&via.http, "before").await;
        eventually("the first job runs", Duration::from_secs(60), async || {
            (api.job(&via.http, &first).await["state"] == "running").then_some(())
        })
        .await;
        Self {
            _db: db,
            _dir: dir,
            url,
            root,
            http,
            token,
            a,
            b,
            agent,
            first,
        }
    }
}

/// Ends the agent and whichever replicas still run, also when a test fails part-way.
impl Drop for Running {
    fn drop(&mut self) {
        for child in [&mut self.agent, &mut self.a.child, &mut self.b.child] {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = Command::new("kill").arg(child.id().to_string()).status();
                let _ = child.wait();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_and_writes_nothing_when_it_wakes() {
    let run = Running::start(2, true).await;
    let (http, url, root, first) = (&run.http, &run.url, &run.root, &run.first);
    let (a, b) = (&run.a, &run.b);
    let api = Api {
        http,
        token: run.token.clone(),
    };

    // Freeze the leader for several of its leases.
    signal(&a.child, "-STOP");
    let frozen = Instant::now();
    eventually("b takes over", Duration::from_secs(30), async || {
        (b.epoch(http).await == Some(2)).then_some(())
    })
    .await;
    let takeover = frozen.elapsed();
    let second = api.submit(&b.http, "during").await;
    eventually(
        "work submitted meanwhile runs",
        Duration::from_secs(30),
        async || (api.job(&b.http, &second).await["state"] == "running").then_some(()),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&a.child, "-CONT");
    eventually(
        "the woken replica follows",
        Duration::from_secs(30),
        async || (a.epoch(http).await == Some(0)).then_some(()),
    )
    .await;
    // Settle: the woken replica's timers have all fired.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let store = Store::connect(url, std::sync::Arc::new(allot_domain::SystemClock))
        .await
        .expect("store");
    let leader = store.leader().await.expect("lease");
    assert_eq!(
        (leader.holder.as_str(), leader.epoch),
        ("b", 2),
        "{leader:?}"
    );
    assert_eq!(b.epoch(http).await, Some(2));
    // The rows say so too: each job row names the epoch of the leader handle that last
    // wrote it, each term when it began, and no row was last written under a's term after
    // b's had begun.
    let terms = store.leader_terms().await.expect("terms");
    let successor = terms
        .iter()
        .find(|t| t.holder == "b")
        .unwrap_or_else(|| panic!("b's term is recorded: {terms:?}"));
    let frozen_epoch = terms
        .iter()
        .filter(|t| t.holder == "a" && t.epoch < successor.epoch)
        .map(|t| t.epoch)
        .max()
        .unwrap_or_else(|| panic!("a's term is recorded: {terms:?}"));
    assert_eq!((frozen_epoch, successor.epoch), (1, 2), "{terms:?}");
    let deposed = store.deposed_job_writes().await.expect("deposed writes");
    assert!(deposed.is_empty(), "{deposed:?}");
    let writers = store.job_writers().await.expect("writers");
    let late: Vec<_> = writers
        .iter()
        .filter(|w| w.writer_epoch == Some(frozen_epoch) && w.written_at > successor.started_at)
        .collect();
    assert!(
        late.is_empty(),
        "written by a after b's term began: {late:?}"
    );
    // Not for want of stamps: the job b placed and started names b's term.
    let during = writers
        .iter()
        .find(|w| w.job_id == second)
        .unwrap_or_else(|| panic!("{second} has a row: {writers:?}"));
    assert_eq!(during.writer_epoch, Some(successor.epoch), "{during:?}");
    // The job that ran through the failover was neither failed nor requeued: one attempt,
    // running all along.
    let j = api.job(&a.http, first).await;
    assert_eq!(
        (j["state"].as_str(), j["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "{j}"
    );
    let history = &j["events"];
    let states: Vec<&str> = history
        .as_array()
        .map(|h| h.iter().filter_map(|e| e["to"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(states, ["pending", "scheduled", "running"], "{history}");
    let j = api.job(&a.http, &second).await;
    assert_eq!(
        (j["state"].as_str(), j["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "{j}"
    );
    // The woken replica points agents at the leader.
    let log = read(&root.join("a.log"));
    assert!(log.contains("leadership lost"), "{log}");
    eprintln!("takeover after a freeze: {takeover:?}");
    drop(run);
}

/// A leader stopped cleanly (SIGTERM, as in a rolling restart) gives its lease up on the
/// way out: the lease row ends when it stopped, not a lease later, and the follower takes
/// over at its next look instead of waiting the lease out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_cleanly_gives_its_lease_up() {
    // The leader has served the agent and the API (through its HTTP workers) before it
    // stops.
    let mut run = Running::start(6, false).await;
    signal(&run.a.child, "-TERM");
    let a = &mut run.a;
    let stopped = eventually("a exits", Duration::from_secs(30), async || {
        a.child.try_wait().ok().flatten()
    })
    .await;
    assert!(stopped.success(), "a exited with {stopped}");
    let exited = chrono::Utc::now();
    let store = Store::connect(&run.url, std::sync::Arc::new(allot_domain::SystemClock))
        .await
        .expect("store");
    let lease = store.leader().await.expect("lease");
    assert!(
        lease.epoch > 1 || (lease.holder == "a" && lease.expires_at <= exited),
        "a's lease was not given up on a clean stop: {lease:?}"
    );
    eventually("b takes over", Duration::from_secs(30), async || {
        (run.b.epoch(&run.http).await == Some(2)).then_some(())
    })
    .await;
    let log = read(&run.root.join("a.log"));
    assert!(!log.contains("not given up"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
    drop(run);
}

/// Work taken by a follower reaches the leader at once (PostgreSQL `NOTIFY`), not at its
/// next periodic pass: with passes a minute apart, a job submitted through the follower
/// runs within seconds, and a cancel through the follower stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_through_a_follower_wakes_the_leader() {
    let db = TestDb::new(Backend::Postgres).await.expect("PostgreSQL");
    let dir = tempfile::tempdir().expect("tempdir");
    let root: PathBuf = dir.path().to_owned();
    let http = client();
    let slow = ["--schedule-interval-secs", "60"];
    let (mut a, mut b) = leader_and_follower(&http, &db.url, &root, 2, &slow).await;
    let api = Api {
        http: &http,
        token: read(&root.join("server/admin.token")),
    };
    let mut agent = join_agent(&api, &root, &b, &[&a.grpc, &b.grpc], "n1").await;
    eventually("the node is ready", Duration::from_secs(60), async || {
        let (_, nodes) = api
            .call(&b.http, reqwest::Method::GET, "/api/v1/nodes", None)
            .await;
        (nodes[0]["status"] == "ready").then_some(())
    })
    .await;
    // The passes the node's arrival asked for are over.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let submitted = Instant::now();
    let id = api.submit(&b.http, "woken").await;
    eventually(
        "the job submitted through the follower runs",
        Duration::from_secs(15),
        async || (api.job(&b.http, &id).await["state"] == "running").then_some(()),
    )
    .await;
    let placed = submitted.elapsed();
    let (status, j) = api
        .call(
            &b.http,
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{id}/cancel"),
            None,
        )
        .await;
    assert!(status < 300, "{status}: {j}");
    eventually(
        "the cancel through the follower stops the job",
        Duration::from_secs(15),
        async || (api.job(&b.http, &id).await["state"] == "cancelled").then_some(()),
    )
    .await;
    eprintln!("submit through a follower to running: {placed:?}");
    for child in [&mut agent, &mut a.child, &mut b.child] {
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let _ = child.wait();
    }
}

/// `allot bench failover`, small, on the test's PostgreSQL: its JSON report and whether it
/// passed.
fn failover_bench(extra: &[&str]) -> (bool, serde_json::Value, String) {
    let db = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(TestDb::new(Backend::Postgres))
        .expect("PostgreSQL");
    let out = Command::new(allot_bin())
        .args([
            "bench",
            "failover",
            "--nodes",
            "3",
            "--jobs",
            "40",
            "--leader-lease-secs",
            "3",
            "--seed",
            "5",
            "--json",
            "--database-url",
            &db.url,
        ])
        .args(extra)
        .env("ALLOT_LOG", "error")
        .output()
        .expect("allot bench failover runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("JSON ({e}): {stderr}"));
    (out.status.success(), report, stderr)
}

#[test]
fn killed_and_frozen_leaders_lose_repeat_and_fail_nothing() {
    let (ok, r, stderr) = failover_bench(&["--faults", "3"]);
    assert!(ok, "{r}\n{stderr}");
    for zero in [
        "lost",
        "doubled",
        "failed",
        "requeued_attempts",
        "deposed_writes_accepted",
        "deposed_job_rows",
        "failovers_unresolved",
        "acknowledged_submits_missing",
    ] {
        assert_eq!(r[zero], 0, "{zero}: {r}");
    }
    assert!(r["faults"].as_u64().unwrap_or(0) >= 3, "{r}");
    assert_eq!(r["fencing"], true, "{r}");
    assert!(
        r["requests_answered_share"].as_f64().unwrap_or(0.0) >= 0.999,
        "{r}"
    );
}

/// The negative control: with the leaders' writes unfenced, a leader frozen past its lease
/// writes as leader when it wakes, and the benchmark sees it.
#[test]
fn without_fencing_a_woken_leader_writes_and_the_bench_sees_it() {
    let (ok, r, stderr) = failover_bench(&[
        "--unfenced",
        "--stop-share",
        "1",
        "--faults",
        "8",
        "--rate",
        "10",
    ]);
    assert!(!ok, "the run passed without fencing: {r}\n{stderr}");
    assert_eq!(r["fencing"], false, "{r}");
    let caught = [
        "deposed_writes_accepted",
        "deposed_job_rows",
        "doubled",
        "lost",
    ]
    .iter()
    .any(|k| r[k].as_u64().unwrap_or(0) > 0);
    assert!(caught, "nothing stale was seen: {r}");
}

/// Two running replicas given one name (say, both defaulting to one host name): the second
/// does not take the lease from the first, which leads on under its first epoch; it says
/// why, in its log and its `/readyz`. Before, each took the unexpired lease from the other
/// every fifth of a lease, and nothing said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_under_a_running_ones_name_does_not_lead_and_says_so() {
    let db = TestDb::new(Backend::Postgres).await.expect("PostgreSQL");
    let dir = tempfile::tempdir().expect("tempdir");
    let root: PathBuf = dir.path().to_owned();
    let http = client();
    let a = allot_system_tests::replica::spawn_replica("a", &db.url, &root, 2, &[]);
    eventually("a leads", Duration::from_secs(120), async || {
        (a.epoch(&http).await == Some(1)).then_some(())
    })
    .await;
    let twin = allot_system_tests::replica::spawn_logged("a", "a-twin", &db.url, &root, 2, &[]);
    let ready = format!("{}/readyz", twin.http);
    let (status, body) = eventually(
        "the twin says why it is not ready",
        Duration::from_secs(60),
        async || {
            let res = http.get(&ready).send().await.ok()?;
            let status = res.status().as_u16();
            let body = res.text().await.ok()?;
            (status == 503 && body.contains("in use by another running replica"))
                .then_some((status, body))
        },
    )
    .await;
    assert_eq!(status, 503, "{body}");
    // Five leases later, a still leads under its first epoch: nobody took it over.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(a.epoch(&http).await, Some(1));
    assert_eq!(twin.epoch(&http).await, Some(0));
    let store = Store::connect(&db.url, std::sync::Arc::new(allot_domain::SystemClock))
        .await
        .expect("store");
    let lease = store.leader().await.expect("lease");
    assert_eq!((lease.holder.as_str(), lease.epoch), ("a", 1), "{lease:?}");
    let log = read(&root.join("a-twin.log"));
    assert!(log.contains("has this replica's name"), "{log}");
    // a itself is ready.
    let res = http
        .get(format!("{}/readyz", a.http))
        .send()
        .await
        .expect("a answers");
    assert_eq!(res.status().as_u16(), 200);
    drop((a, twin));
}
