//! Work survives the control plane: jobs on two agents run on while every replica is frozen
//! (SIGSTOP) for three minutes, many times the node lease (6 s here), within the outage
//! tolerance (5 minutes by default), and end as they would have; a node is declared lost
//! at once on evidence instead (its agent killed and started again without the job).
//!
//! Before the outage tolerance, the same freeze cost every job its attempt: agents stopped
//! their jobs at four fifths of the lease and the control plane requeued them once it
//! lapsed (the assertions on attempts and histories below are what that broke).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use allot_store::testing::{Backend, TestDb};
use allot_system_tests::replica::{
    Api, client, eventually, join_agent, leader_and_follower, read, signal, start_agent,
};
use serde_json::json;

/// The node lease here: short, so that the freeze outlasts it thirty times.
const NODE_LEASE_SECS: &str = "6";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_through_a_control_plane_outage_and_a_restarted_agent_is_lost_at_once() {
    let db = TestDb::new(Backend::Postgres).await.expect("PostgreSQL");
    let dir = tempfile::tempdir().expect("tempdir");
    let root: PathBuf = dir.path().to_owned();
    let http = client();
    let extra = ["--node-lease-secs", NODE_LEASE_SECS];
    let (a, b) = leader_and_follower(&http, &db.url, &root, 2, &extra).await;
    let api = Api {
        http: &http,
        token: read(&root.join("server/admin.token")),
    };
    let servers = [a.grpc.as_str(), b.grpc.as_str()];
    let mut n1 = join_agent(&api, &root, &a, &servers, "n1").await;
    let mut n2 = join_agent(&api, &root, &a, &servers, "n2").await;

    // A job on each node (each takes a node's two GPUs), and a short one that ends while
    // the control plane is away.
    let submit = async |name: &str, secs: u32| {
        let (status, job) = api
            .call(
                &a.http,
                reqwest::Method::POST,
                "/api/v1/jobs",
                Some(json!({
                    "tenant": "replicas", "name": name, "gpus": 2,
                    "command": ["sleep", secs.to_string()],
                })),
            )
            .await;
        assert_eq!(status, 201, "{job}");
        job["id"].as_str().expect("id").to_owned()
    };
    let long = submit("long", 600).await;
    let short = submit("short", 60).await;
    for id in [&long, &short] {
        eventually("both jobs run", Duration::from_secs(60), async || {
            (api.job(&a.http, id).await["state"] == "running").then_some(())
        })
        .await;
    }
    let mut nodes = Vec::new();
    for id in [&long, &short] {
        let j = api.job(&a.http, id).await;
        nodes.push(j["node_name"].as_str().expect("a node").to_owned());
    }
    assert_ne!(nodes[0], nodes[1], "one job on each node: {nodes:?}");

    // Every replica frozen for three minutes: nobody answers the agents.
    signal(&a.child, "-STOP");
    signal(&b.child, "-STOP");
    let frozen = Instant::now();
    tokio::time::sleep(Duration::from_secs(180)).await;
    signal(&a.child, "-CONT");
    signal(&b.child, "-CONT");
    eprintln!("replicas frozen for {:?}", frozen.elapsed());
    eventually(
        "a replica leads again",
        Duration::from_secs(60),
        async || {
            let (ea, eb) = (a.epoch(&http).await, b.epoch(&http).await);
            (ea.is_some_and(|e| e > 0) || eb.is_some_and(|e| e > 0)).then_some(())
        },
    )
    .await;
    // The short job ended during the outage; its end, reported again once a replica
    // answers, lands as it was.
    eventually(
        "the short job's end is recorded",
        Duration::from_secs(60),
        async || (api.job(&a.http, &short).await["state"] == "succeeded").then_some(()),
    )
    .await;
    // Several passes and heartbeats later, the long job still runs on its first attempt,
    // its history untouched by the outage.
    tokio::time::sleep(Duration::from_secs(15)).await;
    for (id, end) in [(&long, "running"), (&short, "succeeded")] {
        let j = api.job(&a.http, id).await;
        assert_eq!(
            (j["state"].as_str(), j["attempt"].as_u64()),
            (Some(end), Some(1)),
            "{j}"
        );
        let states: Vec<&str> = j["events"]
            .as_array()
            .map(|h| h.iter().filter_map(|e| e["to"].as_str()).collect())
            .unwrap_or_default();
        let mut expected = vec!["pending", "scheduled", "running"];
        if end != "running" {
            expected.push(end);
        }
        assert_eq!(states, expected, "{j}");
    }
    let log = read(&root.join("agent.log")) + &read(&root.join("n2.log"));
    assert!(
        !log.contains("killing the job"),
        "an agent fenced its jobs: {log}"
    );

    // Evidence, not time: the agent running the long job is killed and started again. It
    // registers without the job, which is requeued at once (its node's lease and the
    // outage tolerance are nowhere near over) and runs again, once.
    let (victim, name) = if nodes[0] == "n1" {
        (&mut n1, "n1")
    } else {
        (&mut n2, "n2")
    };
    signal(victim, "-9");
    let _ = victim.wait();
    let killed = Instant::now();
    *victim = start_agent(&root, &servers, name, None);
    let requeued = eventually(
        "the restarted agent's job is requeued",
        Duration::from_secs(30),
        async || {
            let j = api.job(&a.http, &long).await;
            (j["attempt"].as_u64() == Some(2)).then_some(j)
        },
    )
    .await;
    let after = killed.elapsed();
    assert!(
        after < Duration::from_secs(20),
        "declared lost after {after:?}, not within seconds: {requeued}"
    );
    let message = requeued["events"]
        .as_array()
        .and_then(|h| h.iter().rev().find(|e| e["to"] == "pending"))
        .map(|e| e["message"].to_string())
        .unwrap_or_default();
    assert!(message.contains("restarted"), "{requeued}");
    eventually("it runs again", Duration::from_secs(60), async || {
        let j = api.job(&a.http, &long).await;
        (j["state"] == "running" && j["attempt"] == 2).then_some(())
    })
    .await;
    eprintln!("a restarted agent's job requeued after {after:?}");
    for agent in [&mut n1, &mut n2] {
        signal(agent, "-TERM");
        let _ = agent.wait();
    }
    drop((a, b));
}
