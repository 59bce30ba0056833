//! Multi-node jobs (gangs) on a real control plane with real `allot agent` processes: a
//! gang starts together with the rank environment `torchrun` reads; one that does not fit
//! waits whole; SIGKILLing one replica's agent requeues the whole gang as its next attempt,
//! with no replica of the old attempt running when the new one starts (checked from the
//! processes); preemption takes the gang whole; cancel stops every replica; a failure
//! counts against the gang's retries once.

use std::collections::{BTreeSet, HashMap};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster_with};
use serde_json::{Value, json};

/// `allot agent` processes, SIGKILLed when dropped.
struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn start_agent(c: &TestCluster, name: &str) -> Child {
    let token = allot_system_tests::bootstrap_token(&c.server).await;
    allot_system_tests::agent_process(c, name, "2xH200", Some(&token))
}

/// The (job id, attempt) of every process on this machine that runs a job attempt, read
/// from the variables the agent gave it.
fn running_attempts() -> BTreeSet<(String, u32)> {
    let mut out = BTreeSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Ok(env) = std::fs::read(p.path().join("environ")) else {
            continue;
        };
        let vars: HashMap<&[u8], &[u8]> = env
            .split(|&b| b == 0)
            .filter_map(|kv| {
                let eq = kv.iter().position(|&b| b == b'=')?;
                Some((&kv[..eq], &kv[eq + 1..]))
            })
            .collect();
        let (Some(id), Some(attempt)) = (
            vars.get(&b"ALLOT_JOB_ID"[..]),
            vars.get(&b"ALLOT_ATTEMPT"[..]),
        ) else {
            continue;
        };
        if let Ok(attempt) = std::str::from_utf8(attempt).unwrap_or("").parse() {
            out.insert((String::from_utf8_lossy(id).into_owned(), attempt));
        }
    }
    out
}

fn replicas(gang: &Value) -> Vec<Value> {
    gang["gang"].as_array().cloned().unwrap_or_default()
}

async fn tenant(c: &TestCluster, name: &str, quota: Value) {
    let (status, body) = c
        .post("/api/v1/tenants", json!({ "name": name, "quota": quota }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Waits until every replica of gang `id` runs attempt `attempt`.
async fn wait_running(c: &TestCluster, id: &str, attempt: u64) -> Value {
    c.eventually(&format!("gang {id} running attempt {attempt}"), || async {
        let (_, g) = c.get(&format!("/api/v1/jobs/{id}")).await;
        let r = replicas(&g);
        (!r.is_empty()
            && r.iter()
                .all(|r| r["state"] == "running" && r["attempt"] == attempt))
        .then_some(g)
    })
    .await
}

/// Each replica says what it was told, then waits as the process the agent started (under
/// `--runtime process` that process dies with its agent; a child it forked would not, which
/// the OCI runtime's containers and the agent's systemd unit take care of).
const REPORT: &str = "echo attempt=$ALLOT_ATTEMPT rank=$RANK world=$WORLD_SIZE node_rank=$NODE_RANK \
     local=$LOCAL_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT nnodes=$PET_NNODES; exec sleep 600";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangs_run_whole_and_are_requeued_preempted_and_cancelled_whole() {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |cfg| {
        cfg.lease = Duration::from_millis(2_000);
        // A killed agent's node is lost when its lease lapses, not minutes later.
        cfg.outage_tolerance = cfg.lease;
        cfg.min_runtime = Duration::ZERO;
    })
    .await;
    let mut agents = Agents(Vec::new());
    for i in 1..=3 {
        agents.0.push(start_agent(&c, &format!("node-{i}")).await);
    }
    let node_ids: HashMap<String, usize> = c
        .eventually("three nodes ready", || async {
            let (_, nodes) = c.get("/api/v1/nodes").await;
            let ready: Vec<&Value> = nodes
                .as_array()?
                .iter()
                .filter(|n| n["status"] == "ready")
                .collect();
            (ready.len() == 3).then(|| {
                ready
                    .iter()
                    .map(|n| {
                        let name = n["name"].as_str().unwrap_or_default();
                        let i: usize = name.trim_start_matches("node-").parse().unwrap_or(0);
                        (n["id"].as_str().unwrap_or_default().to_owned(), i - 1)
                    })
                    .collect()
            })
        })
        .await;
    tenant(&c, "owner", json!({ "guaranteed": { "gpu_milli": 2000 } })).await;
    tenant(&c, "borrower", json!({})).await;

    // A gang of two replicas of two GPUs: one node each, started together, each told its
    // rank and where the gang meets.
    let a = c
        .submit_with(
            "borrower",
            json!({ "gpus": 2, "replicas": 2 }),
            &["sh", "-c", REPORT],
        )
        .await;
    let gang = wait_running(&c, &a, 1).await;
    assert_eq!(gang["state"], "running", "{gang}");
    assert_eq!(gang["replicas"], 2);
    let reps = replicas(&gang);
    assert_eq!(reps.len(), 2);
    assert_ne!(reps[0]["node_id"], reps[1]["node_id"], "{gang}");
    assert_eq!(
        reps[0]["id"],
        a.as_str(),
        "replica 0's record is the gang's"
    );
    let mut port = None;
    for (rank, r) in reps.iter().enumerate() {
        let id = r["id"].as_str().expect("replica id");
        let log = c
            .eventually("the replica's output", || async {
                let log = c.log_of(id).await;
                log.contains("master=").then_some(log)
            })
            .await;
        assert!(
            log.contains(&format!(
                "attempt=1 rank={rank} world=2 node_rank={rank} local=2 master=127.0.0.1:"
            )),
            "{log}"
        );
        assert!(log.contains("nnodes=2"), "{log}");
        let p: Option<String> = log
            .split("master=127.0.0.1:")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .map(str::to_owned);
        assert!(
            port.is_none() || port == p,
            "every replica meets at one port: {log}"
        );
        port = p;
    }
    // Listed once, as one job.
    let (_, list) = c.get("/api/v1/jobs?tenant=borrower").await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");

    // A gang that does not fit (one node is free, it needs two) waits whole, saying why.
    let b = c
        .submit_with(
            "borrower",
            json!({ "gpus": 2, "replicas": 2 }),
            &["sleep", "600"],
        )
        .await;
    let waiting = c.wait_for_reason(&b).await;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    assert_eq!(waiting["pending_reason"]["code"], "NoRoom", "{waiting}");
    for r in replicas(&waiting) {
        assert_eq!(r["state"], "pending", "{waiting}");
        assert_eq!(
            r["node_id"],
            Value::Null,
            "no replica placed alone: {waiting}"
        );
    }
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{b}/cancel"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, b_view) = c.get(&format!("/api/v1/jobs/{b}")).await;
    assert_eq!(b_view["state"], "cancelled", "{b_view}");
    assert!(
        replicas(&b_view).iter().all(|r| r["state"] == "cancelled"),
        "{b_view}"
    );

    // SIGKILL replica 1's agent: its node is lost, and the whole gang runs again as attempt
    // 2 on the two nodes left. Watched from the processes all along: no attempt-1 replica
    // runs while an attempt-2 one does.
    let ids: Vec<String> = reps
        .iter()
        .map(|r| r["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    let overlap = Arc::new(Mutex::new(Vec::new()));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (ids, overlap, watching) = (ids.clone(), overlap.clone(), watching.clone());
        std::thread::spawn(move || {
            while watching.load(Ordering::Relaxed) {
                let seen: Vec<(String, u32)> = running_attempts()
                    .into_iter()
                    .filter(|(id, _)| ids.contains(id))
                    .collect();
                let attempts: BTreeSet<u32> = seen.iter().map(|(_, a)| *a).collect();
                if attempts.len() > 1 {
                    overlap.lock().expect("lock").push(seen);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let lost = node_ids[reps[1]["node_id"].as_str().expect("node")];
    agents.0[lost].kill().expect("SIGKILL the agent");
    let _ = agents.0[lost].wait();
    let gang = wait_running(&c, &a, 2).await;
    watching.store(false, Ordering::Relaxed);
    watcher.join().expect("watcher");
    let overlaps = overlap.lock().expect("lock").clone();
    assert!(
        overlaps.is_empty(),
        "attempts ran side by side: {overlaps:?}"
    );
    let reps2 = replicas(&gang);
    let lost_id = reps[1]["node_id"].clone();
    assert!(reps2.iter().all(|r| r["node_id"] != lost_id), "{gang}");
    let (_, r1) = c.get(&format!("/api/v1/jobs/{}", ids[1])).await;
    let requeues: Vec<String> = r1["events"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter(|e| e["to"] == "pending" && e["from"] != Value::Null)
                .filter_map(|e| e["message"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(requeues.len(), 1, "{r1}");
    assert!(requeues[0].contains("lost"), "{requeues:?}");
    for id in &ids {
        let log = c
            .eventually("attempt 2's output", || async {
                let log = c.log_of(id).await;
                log.contains("attempt=2").then_some(log)
            })
            .await;
        assert!(log.contains("world=2"), "{log}");
    }

    // The owner claims its guarantee: the borrowing gang is preempted whole and waits
    // (only one node is left free for two replicas) as attempt 3.
    let owned = c
        .submit_with("owner", json!({ "gpus": 2 }), &["sleep", "600"])
        .await;
    c.wait_for_state(&owned, "running").await;
    let preempted = c
        .eventually("the gang requeued whole", || async {
            let (_, g) = c.get(&format!("/api/v1/jobs/{a}")).await;
            replicas(&g)
                .iter()
                .all(|r| r["state"] == "pending" && r["attempt"] == 3)
                .then_some(g)
        })
        .await;
    for id in &ids {
        let (_, r) = c.get(&format!("/api/v1/jobs/{id}")).await;
        let last = r["events"]
            .as_array()
            .and_then(|e| e.last().cloned())
            .unwrap_or_default();
        assert!(
            last["message"]
                .as_str()
                .is_some_and(|m| m.contains("preempted")),
            "{preempted}\n{r}"
        );
    }
    assert!(
        running_attempts().iter().all(|(id, _)| !ids.contains(id)),
        "no replica of the preempted gang runs"
    );
    // The owner done, the gang runs again, whole.
    c.post(&format!("/api/v1/jobs/{owned}/cancel"), Value::Null)
        .await;
    wait_running(&c, &a, 3).await;

    // Cancelling the gang stops every replica.
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{a}/cancel"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let ended = c.wait_for_state(&a, "cancelled").await;
    c.eventually("every replica cancelled", || async {
        let (_, g) = c.get(&format!("/api/v1/jobs/{a}")).await;
        replicas(&g)
            .iter()
            .all(|r| r["state"] == "cancelled")
            .then_some(())
    })
    .await;
    assert_eq!(ended["replicas"], 2);
    c.eventually("no replica process left", || async {
        running_attempts()
            .iter()
            .all(|(id, _)| !ids.contains(id))
            .then_some(())
    })
    .await;

    // Both replicas fail at once: one failure of the gang, retried once as a whole, then
    // the gang fails.
    let f = c
        .submit_with(
            "borrower",
            json!({ "gpus": 1, "replicas": 2, "max_retries": 1 }),
            &["sh", "-c", "sleep 1; exit 3"],
        )
        .await;
    let failed = c
        .eventually("the gang fails", || async {
            let (_, g) = c.get(&format!("/api/v1/jobs/{f}")).await;
            (g["state"] == "failed"
                && replicas(&g)
                    .iter()
                    .all(|r| matches!(r["state"].as_str(), Some("failed" | "cancelled"))))
            .then_some(g)
        })
        .await;
    assert_eq!(failed["failures"], 1, "counted once: {failed}");
    assert!(
        replicas(&failed).iter().all(|r| r["attempt"] == 2),
        "retried once, whole: {failed}"
    );
    drop(agents);
    c.shutdown().await;
}
