//! A job's whole journey: API -> scheduler -> gRPC assignment -> agent process -> status
//! report -> API, on SQLite and on PostgreSQL.

use allot_store::AuditRepo;
use allot_system_tests::{Backend, StatusCode, TestCluster, process_group_alive, spawn_cluster};
use serde_json::{Value, json};

/// The states a job went through: its events that changed its state (not those that say
/// something of it in a state, as who asked for its cancel).
fn states(job: &Value) -> Vec<String> {
    job["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["from"] != e["to"])
        .map(|e| e["to"].as_str().expect("to").to_owned())
        .collect()
}

/// (action, actor kind, from state, to state) of every audit entry about `job`.
async fn audit_trail(
    c: &TestCluster,
    tenant: &str,
    job: &str,
) -> Vec<(String, String, String, String)> {
    let (_, t) = c.get(&format!("/api/v1/tenants/{tenant}")).await;
    let log = t["id"].as_str().expect("tenant id");
    let entries = c
        .server
        .store
        .audit_entries(log, 0, 10_000)
        .await
        .expect("audit entries");
    entries
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e.body.as_deref().unwrap_or_default()).expect("entry")
        })
        .filter(|e| e["target"] == format!("job/{job}"))
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
            (
                s(&e["action"]),
                s(&e["actor"]["kind"]),
                s(&e["before"]["state"]),
                s(&e["after"]["state"]),
            )
        })
        .collect()
}

async fn job_lifecycle(backend: Backend) {
    let c = spawn_cluster(backend, 2, "4xH200").await;
    c.create_tenant("team-a", Some(3)).await;

    // Success, with output captured in the job's log.
    let id = c.submit("team-a", 1, &["sh", "-c", "echo hi"]).await;
    let job = c.wait_for_state(&id, "succeeded").await;
    assert_eq!(job["exit_code"], 0);
    assert_eq!(
        states(&job),
        ["pending", "scheduled", "running", "succeeded"]
    );
    let times: Vec<&str> = job["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["at"].as_str().expect("at"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let log = c
        .http
        .get(c.url(&format!("/api/v1/jobs/{id}/log")))
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("log")
        .text()
        .await
        .expect("log text");
    assert_eq!(log, "hi\n");
    let node = job["node_id"].as_str().expect("placed on a node");
    let (_, node_json) = c.get(&format!("/api/v1/nodes/{node}")).await;
    let gpu = job["gpu_uuids"][0].as_str().expect("one GPU");
    assert!(
        node_json["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .any(|g| g["uuid"] == gpu),
        "the job's GPU belongs to its node"
    );
    let on_disk = std::fs::read_to_string(
        c.data_dir
            .path()
            .join(node_json["name"].as_str().expect("name"))
            .join("logs")
            .join(format!("{id}.1.log")),
    )
    .expect("log file on the node");
    assert_eq!(on_disk, "hi\n");

    // Every step is in the tenant's audit log, with who did it: the API token that submitted,
    // the scheduler that placed, the node that ran it.
    let trail = audit_trail(&c, "team-a", &id).await;
    let t = |a: &str, k: &str, f: &str, to: &str| {
        (a.to_owned(), k.to_owned(), f.to_owned(), to.to_owned())
    };
    assert_eq!(
        trail,
        [
            t("job.submit", "token", "-", "-"),
            t("job.transition", "system", "pending", "scheduled"),
            t("job.transition", "node", "scheduled", "running"),
            t("job.transition", "node", "running", "succeeded"),
        ]
    );

    // Failure, with its exit code.
    let id = c
        .submit("team-a", 1, &["sh", "-c", "echo oops >&2; exit 3"])
        .await;
    let job = c.wait_for_state(&id, "failed").await;
    assert_eq!(job["exit_code"], 3);
    assert_eq!(states(&job), ["pending", "scheduled", "running", "failed"]);

    // Cancel a running job: the process goes away.
    let id = c.submit("team-a", 1, &["sleep", "60"]).await;
    let job = c.wait_for_state(&id, "running").await;
    let pid = u32::try_from(job["pid"].as_u64().expect("pid")).expect("pid fits");
    assert!(process_group_alive(pid), "the job runs as a real process");
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{id}/cancel"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let job = c.wait_for_state(&id, "cancelled").await;
    assert_eq!(
        states(&job),
        ["pending", "scheduled", "running", "cancelled"]
    );
    c.eventually("the cancelled process to be gone", || async {
        (!process_group_alive(pid)).then_some(())
    })
    .await;

    // The tenant cap: 3 GPUs held, so a further one waits, with the numbers, until freed.
    let holder = c.submit("team-a", 3, &["sleep", "60"]).await;
    c.wait_for_state(&holder, "running").await;
    let waiting = c.submit("team-a", 1, &["true"]).await;
    let job = c.wait_for_reason(&waiting).await;
    assert_eq!(job["state"], "pending");
    assert_eq!(job["pending_reason"]["code"], "TenantLimit");
    assert_eq!(
        job["pending_reason"]["message"],
        "tenant team-a: 3 of 3 GPUs in use (limit); request 1"
    );
    // A job over the cap on its own could never run: refused at submit, naming the field and
    // the limit, and not stored. Other tenants are not held back.
    let (status, p) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "team-a", "gpus": 4, "command": ["true"] }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["errors"][0]["field"], "gpus", "{p}");
    assert_eq!(
        p["errors"][0]["reason"],
        "tenant `team-a` may hold at most 3 GPUs at once (its hard limit), and this job asks for 4",
    );
    c.create_tenant("team-b", None).await;
    let other = c.submit("team-b", 1, &["true"]).await;
    c.wait_for_state(&other, "succeeded").await;

    // Cancelling a pending job is immediate.
    let queued = c.submit("team-a", 1, &["true"]).await;
    let (status, job) = c
        .post(&format!("/api/v1/jobs/{queued}/cancel"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["state"], "cancelled");

    // Freeing the GPUs lets the waiting job run.
    c.post(&format!("/api/v1/jobs/{holder}/cancel"), Value::Null)
        .await;
    c.wait_for_state(&holder, "cancelled").await;
    c.wait_for_state(&waiting, "succeeded").await;

    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_lifecycle_on_sqlite() {
    job_lifecycle(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_lifecycle_on_postgres() {
    job_lifecycle(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_spread_over_both_nodes_and_gpus_are_not_shared() {
    let c = spawn_cluster(Backend::Sqlite, 2, "2xH200").await;
    c.create_tenant("spread", None).await;
    let a = c.submit("spread", 2, &["sleep", "60"]).await;
    let b = c.submit("spread", 2, &["sleep", "60"]).await;
    let ja = c.wait_for_state(&a, "running").await;
    let jb = c.wait_for_state(&b, "running").await;
    assert_ne!(ja["node_id"], jb["node_id"]);
    let third = c.submit("spread", 1, &["true"]).await;
    let job = c.wait_for_reason(&third).await;
    assert_eq!(job["pending_reason"]["code"], "NoRoom");
    assert!(
        job["pending_reason"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("no node has room for 1 whole GPU")),
        "{job}"
    );
    for id in [&a, &b] {
        c.post(&format!("/api/v1/jobs/{id}/cancel"), Value::Null)
            .await;
    }
    c.wait_for_state(&third, "succeeded").await;
    c.shutdown().await;
}
