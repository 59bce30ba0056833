//! The scheduling engine on a live cluster: GPU sharing, and reclaim that preempts a
//! borrower, stops it on its node, requeues it as its next attempt and runs it again later.

use std::time::Duration;

use allot_system_tests::{
    Backend, StatusCode, TestCluster, process_group_alive, spawn_cluster_with,
};
use serde_json::{Value, json};

async fn tenant(c: &TestCluster, name: &str, quota: Value) {
    let (status, body) = c
        .post("/api/v1/tenants", json!({ "name": name, "quota": quota }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

fn states(job: &Value) -> Vec<String> {
    job["events"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(|e| e["to"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn log_of(c: &TestCluster, id: &str) -> String {
    c.http
        .get(c.url(&format!("/api/v1/jobs/{id}/log")))
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("log request")
        .text()
        .await
        .expect("log body")
}

async fn reclaim(backend: Backend) {
    let c = spawn_cluster_with(backend, 1, "1xH200", |cfg| {
        cfg.min_runtime = Duration::ZERO;
    })
    .await;
    tenant(&c, "owner", json!({ "guaranteed": { "gpu_milli": 1000 } })).await;
    tenant(&c, "borrower", json!({})).await;

    // The owner is idle, so the borrower runs on its GPU, borrowing.
    let borrowed = c
        .submit_with(
            "borrower",
            json!({}),
            &["sh", "-c", "echo attempt $ALLOT_ATTEMPT; sleep 60"],
        )
        .await;
    let job = c.wait_for_state(&borrowed, "running").await;
    assert_eq!(job["borrowing"], true, "{job}");
    let first_pid = u32::try_from(job["pid"].as_u64().expect("pid")).expect("pid fits");

    // The owner asks: the borrower is preempted, stopped on its node and requeued.
    let owned = c.submit_with("owner", json!({}), &["sleep", "1"]).await;
    let job = c.wait_for_state(&owned, "running").await;
    assert_eq!(job["borrowing"], false, "{job}");
    let (_, job) = c.get(&format!("/api/v1/jobs/{borrowed}")).await;
    assert_eq!(job["state"], "pending", "{job}");
    assert_eq!(job["attempt"], 2);
    assert_eq!(job["node_id"], Value::Null);
    assert_eq!(
        states(&job),
        ["pending", "scheduled", "running", "pending"],
        "{job}"
    );
    let preempted = job["events"][3]["message"].as_str().unwrap_or_default();
    assert!(
        preempted.starts_with("preempted: tenant borrower held 1 of 0 GPUs guaranteed"),
        "{preempted}"
    );
    assert!(
        !process_group_alive(first_pid),
        "the first attempt's process is gone before the owner runs"
    );

    // Once the owner's job is done, the borrower runs again as its second attempt.
    c.wait_for_state(&owned, "succeeded").await;
    let job = c.wait_for_state(&borrowed, "running").await;
    assert_eq!(job["attempt"], 2);
    c.post(&format!("/api/v1/jobs/{borrowed}/cancel"), Value::Null)
        .await;
    c.wait_for_state(&borrowed, "cancelled").await;
    let log = log_of(&c, &borrowed).await;
    assert!(log.contains("attempt 2"), "{log}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_preempts_and_requeues_on_sqlite() {
    reclaim(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_preempts_and_requeues_on_postgres() {
    reclaim(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_share_one_gpu_in_fractions() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "1xH200", |_| {}).await;
    tenant(&c, "red", json!({})).await;
    tenant(&c, "blue", json!({ "limit": { "gpu_milli": 500 } })).await;
    let half = json!({ "gpus": 1, "gpu_milli": 500 });
    let script = [
        "sh",
        "-c",
        "echo share $ALLOT_GPU_MILLI of $CUDA_VISIBLE_DEVICES; sleep 60",
    ];
    let r = c.submit_with("red", half.clone(), &script).await;
    let b = c.submit_with("blue", half.clone(), &script).await;
    let jr = c.wait_for_state(&r, "running").await;
    let jb = c.wait_for_state(&b, "running").await;
    assert_eq!(jr["gpu_uuids"], jb["gpu_uuids"], "both halves on one GPU");
    assert_eq!(
        (jr["held_gpu_milli"].as_u64(), jb["held_gpu_milli"].as_u64()),
        (Some(500), Some(500))
    );
    let gpu = jr["gpu_uuids"][0].as_str().expect("a GPU").to_owned();

    // The GPU is full: another half waits for room; blue is at its limit.
    let third = c.submit_with("red", half.clone(), &["true"]).await;
    let over = c
        .submit_with("blue", json!({ "gpus": 1, "gpu_milli": 100 }), &["true"])
        .await;
    for (id, code) in [(&third, "NoRoom"), (&over, "TenantLimit")] {
        let job = c.wait_for_reason(id).await;
        assert_eq!(job["pending_reason"]["code"], code, "{job}");
    }
    let (_, job) = c.get(&format!("/api/v1/jobs/{over}")).await;
    assert_eq!(
        job["pending_reason"]["message"],
        "tenant blue: 0.5 of 0.5 GPUs in use (limit); request 0.1"
    );
    c.post(&format!("/api/v1/jobs/{r}/cancel"), Value::Null)
        .await;
    c.wait_for_state(&r, "cancelled").await;
    let log = log_of(&c, &r).await;
    assert!(log.contains(&format!("share 500 of {gpu}")), "{log}");
    c.wait_for_state(&third, "succeeded").await;
    for id in [&b, &over] {
        c.post(&format!("/api/v1/jobs/{id}/cancel"), Value::Null)
            .await;
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_retry_with_backoff_then_fail() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "1xH200", |_| {}).await;
    tenant(&c, "flaky", json!({})).await;
    let id = c
        .submit_with(
            "flaky",
            json!({ "max_retries": 2 }),
            &["sh", "-c", "echo attempt $ALLOT_ATTEMPT; exit 3"],
        )
        .await;
    let job = c.wait_for_state(&id, "failed").await;
    assert_eq!(
        (job["attempt"].as_u64(), job["failures"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(job["exit_code"], 3);
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    let messages: Vec<&str> = job["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["to"] == "pending" && e["from"].is_string())
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert_eq!(
        messages,
        [
            "exited with status 3; retry 1 of 2 in 1 s",
            "exited with status 3; retry 2 of 2 in 2 s"
        ],
        "{job}"
    );
    // The backoff held: the third attempt started at least 1 + 2 s after the first failed.
    let at = |i: usize| {
        chrono::DateTime::parse_from_rfc3339(job["events"][i]["at"].as_str().unwrap_or_default())
            .expect("time")
    };
    let events = job["events"].as_array().map_or(0, Vec::len);
    assert_eq!(events, 10, "{job}");
    assert!((at(7) - at(3)).num_milliseconds() >= 3000, "{job}");
    c.shutdown().await;
}

/// A cluster of one node with two GPUs, a tenant `gpu`, the node list, and the directory
/// where files `xid-<gpu>-<code>` inject XIDs.
async fn one_node_with_fault_files() -> (TestCluster, Value, std::path::PathBuf) {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "2xH200", |_| {}).await;
    tenant(&c, "gpu", json!({})).await;
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let node = nodes[0]["name"].as_str().expect("node").to_owned();
    let faults = c.data_dir.path().join(&node).join("sim-faults");
    std::fs::create_dir_all(&faults).expect("fault dir");
    (c, nodes, faults)
}

/// The index of the GPU `job` runs on.
fn gpu_index(nodes: &Value, job: &Value) -> u64 {
    let uuid = job["gpu_uuids"][0].as_str().unwrap_or_default();
    nodes[0]["gpus"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["uuid"] == uuid))
        .and_then(|g| g["index"].as_u64())
        .expect("the job's GPU")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xids_fail_the_attempt_or_drain_the_gpu() {
    let (c, nodes, faults) = one_node_with_fault_files().await;
    let gpu_index = |job: &Value| gpu_index(&nodes, job);

    // An application fault fails the attempt; the GPU stays healthy.
    let app = c.submit_with("gpu", json!({}), &["sleep", "60"]).await;
    let job = c.wait_for_state(&app, "running").await;
    std::fs::write(faults.join(format!("xid-{}-13", gpu_index(&job))), b"").expect("inject");
    let job = c.wait_for_state(&app, "failed").await;
    let message = job["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("XID 13 (graphics engine exception) on GPU"),
        "{job}"
    );

    // A GPU that fell off the bus: the job moves to the other GPU, not counted as a
    // failure, and the GPU is reported unhealthy.
    let moved = c.submit_with("gpu", json!({}), &["sleep", "60"]).await;
    let job = c.wait_for_state(&moved, "running").await;
    let first_gpu = job["gpu_uuids"][0].clone();
    std::fs::write(faults.join(format!("xid-{}-79", gpu_index(&job))), b"").expect("inject");
    let job = c
        .eventually("the job to run again on the other GPU", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{moved}")).await;
            (j["state"] == "running" && j["attempt"] == 2).then_some(j)
        })
        .await;
    assert_ne!(job["gpu_uuids"][0], first_gpu);
    assert_eq!(job["failures"], 0);
    let requeued = job["events"]
        .as_array()
        .and_then(|e| {
            e.iter()
                .find(|e| e["to"] == "pending" && e["from"] == "running")
        })
        .and_then(|e| e["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        requeued.starts_with("XID 79 (GPU has fallen off the bus)"),
        "{requeued}"
    );
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let sick: Vec<&Value> = nodes[0]["gpus"]
        .as_array()
        .map(|g| g.iter().filter(|g| g["healthy"] == false).collect())
        .unwrap_or_default();
    assert_eq!(sick.len(), 1, "{nodes}");
    assert_eq!(sick[0]["uuid"], first_gpu);
    c.post(&format!("/api/v1/jobs/{moved}/cancel"), Value::Null)
        .await;
    c.wait_for_state(&moved, "cancelled").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informational_xid_degrades_the_gpu_without_moving_its_job() {
    let (c, nodes, faults) = one_node_with_fault_files().await;
    let first = c.submit_with("gpu", json!({}), &["sleep", "60"]).await;
    let job = c.wait_for_state(&first, "running").await;
    let uuid = job["gpu_uuids"][0].as_str().expect("gpu").to_owned();
    let index = gpu_index(&nodes, &job);
    // XID 63: a page retired. The GPU is degraded; its job runs on.
    std::fs::write(faults.join(format!("xid-{index}-63")), b"").expect("inject");
    c.eventually("the GPU to be reported degraded", || async {
        let (_, nodes) = c.get("/api/v1/nodes").await;
        nodes[0]["gpus"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["uuid"] == uuid.as_str()).cloned())
            .filter(|g| g["health"] == "degraded" && g["degraded"] == true)
    })
    .await;
    let (_, job) = c.get(&format!("/api/v1/jobs/{first}")).await;
    assert_eq!(job["state"], "running", "{job}");
    assert_eq!(job["attempt"], 1, "not moved: {job}");

    // New work goes to the other GPU, and a third job waits rather than share it.
    let second = c.submit_with("gpu", json!({}), &["sleep", "60"]).await;
    let job = c.wait_for_state(&second, "running").await;
    assert_ne!(job["gpu_uuids"][0], uuid.as_str());
    let third = c.submit_with("gpu", json!({}), &["sleep", "60"]).await;
    let waiting = c.wait_for_reason(&third).await;
    assert_eq!(waiting["pending_reason"]["code"], "NoRoom", "{waiting}");
    for id in [&first, &second, &third] {
        c.post(&format!("/api/v1/jobs/{id}/cancel"), Value::Null)
            .await;
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_drain_cordon_and_return_to_service() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "2xH200", |_| {}).await;
    tenant(&c, "ops", json!({})).await;
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let node = nodes[0]["name"].as_str().expect("node").to_owned();
    let admin = |path: String| {
        let c = &c;
        async move {
            let (status, body) = c.post(&path, Value::Null).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            body
        }
    };

    // Draining a GPU moves its job to the other one, without counting a failure.
    let a = c.submit_with("ops", json!({}), &["sleep", "60"]).await;
    let job = c.wait_for_state(&a, "running").await;
    let first = job["gpu_uuids"][0].as_str().expect("gpu").to_owned();
    let view = admin(format!("/api/v1/nodes/{node}/gpus/{first}/drain")).await;
    let drained: Vec<&Value> = view["gpus"]
        .as_array()
        .map(|g| g.iter().filter(|g| g["drained"] == true).collect())
        .unwrap_or_default();
    assert_eq!(drained.len(), 1, "{view}");
    let job = c
        .eventually("the job to run on the other GPU", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{a}")).await;
            (j["state"] == "running" && j["attempt"] == 2).then_some(j)
        })
        .await;
    assert_ne!(job["gpu_uuids"][0], first.as_str());
    assert_eq!(job["failures"], 0);

    // A cordoned node takes nothing new; returned to service, it does again.
    admin(format!("/api/v1/nodes/{node}/cordon")).await;
    let b = c.submit_with("ops", json!({}), &["true"]).await;
    let job = c.wait_for_reason(&b).await;
    assert_eq!(job["pending_reason"]["code"], "NoReadyNodes", "{job}");
    admin(format!("/api/v1/nodes/{node}/uncordon")).await;
    admin(format!("/api/v1/nodes/{node}/gpus/{first}/return")).await;
    c.wait_for_state(&b, "succeeded").await;

    // Draining the node moves everything off it, and only returning it lets work back.
    admin(format!("/api/v1/nodes/{node}/drain")).await;
    c.eventually("the drained job to be requeued", || async {
        let (_, j) = c.get(&format!("/api/v1/jobs/{a}")).await;
        (j["state"] == "pending" && j["attempt"] == 3).then_some(())
    })
    .await;
    admin(format!("/api/v1/nodes/{node}/uncordon")).await;
    c.wait_for_state(&a, "running").await;

    // Each decision is in the audit log.
    for action in [
        "node.gpu.drain",
        "node.gpu.return",
        "node.cordon",
        "node.uncordon",
    ] {
        let (_, found) = c
            .get(&format!("/api/v1/audit/entries?log=system&action={action}"))
            .await;
        let n = found["entries"].as_array().map_or(0, Vec::len);
        assert!(n >= 1, "{action}: {found}");
    }
    c.post(&format!("/api/v1/jobs/{a}/cancel"), Value::Null)
        .await;
    c.wait_for_state(&a, "cancelled").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_attempt_restores_from_the_newest_checkpoint() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "1xH200", |_| {}).await;
    tenant(&c, "ckpt", json!({})).await;
    let shared = tempfile::tempdir().expect("checkpoint storage");
    c.put_volume("ckpt", shared.path(), &["ckpt"]).await;
    // The job sees its checkpoint directory through the volume; running as a process, it is
    // told the host path of the tenant's directory there.
    let dir = shared.path().join("ckpt").join("job");
    let script = r#"if [ -z "$ALLOT_RESTORE_FROM" ]; then
  echo one > "$ALLOT_CHECKPOINT_DIR/step-1"; sleep 0.05
  echo two > "$ALLOT_CHECKPOINT_DIR/step-2"; exit 3
fi
echo "restoring from $ALLOT_RESTORE_FROM: $(cat "$ALLOT_RESTORE_FROM")""#;
    let id = c
        .submit_with(
            "ckpt",
            json!({ "max_retries": 1, "checkpoint_dir": "/ckpt/job",
                    "volumes": [{ "volume": "ckpt", "path": "/ckpt" }] }),
            &["sh", "-c", script],
        )
        .await;
    let job = c.wait_for_state(&id, "succeeded").await;
    assert_eq!(job["attempt"], 2, "{job}");
    let log = log_of(&c, &id).await;
    let expected = format!("restoring from {}: two", dir.join("step-2").display());
    assert!(log.contains(&expected), "{log}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_requeued_for_a_device_fault_runs_on_another_gpu() {
    let c =
        allot_system_tests::spawn_cluster(allot_system_tests::Backend::Sqlite, 1, "2xH200").await;
    c.create_tenant("t", None).await;
    let id = c.submit("t", 1, &["sleep", "60"]).await;
    let first = c.wait_for_state(&id, "running").await;
    let gpu = first["gpu_uuids"][0].as_str().expect("gpu").to_owned();
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let index = nodes[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["uuid"] == gpu.as_str())
        .and_then(|g| g["index"].as_u64())
        .expect("its index");
    // A contained memory error (XID 94): the attempt is requeued, the GPU stays healthy.
    let faults = c.data_dir.path().join("node-1").join("sim-faults");
    std::fs::create_dir_all(&faults).expect("fault dir");
    std::fs::write(faults.join(format!("xid-{index}-94")), b"").expect("inject");
    let again = c
        .eventually("the next attempt running", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{id}")).await;
            (j["attempt"] == 2 && j["state"] == "running").then_some(j)
        })
        .await;
    assert_ne!(
        again["gpu_uuids"][0],
        gpu.as_str(),
        "anti-affinity: {again}"
    );
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert!(
        nodes[0]["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .all(|g| g["health"] == "healthy"),
        "{nodes}"
    );
    c.shutdown().await;
}

/// What no node and no limit could ever give is refused at submit, as `sbatch` refuses it:
/// 422 naming the field and the most the fleet or the quota can give, and nothing stored.
/// (It used to be accepted and wait forever, an A100 request on an all-H200 fleet saying
/// "no node has room for 1 whole GPU".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_could_never_run_are_refused_at_submit() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "8xH200", |_| {}).await;
    c.create_tenant("demo", Some(4)).await;
    let never = [
        (
            json!({ "gpus": 1, "gpu_models": ["A100"] }),
            "gpu_models",
            "no node has a GPU of model A100; the nodes have H200",
        ),
        (
            json!({ "gpus": 1, "gpu_memory_bytes": 500u64 << 30 }),
            "gpu_memory_bytes",
            "no GPU has more than 141 GiB of memory",
        ),
        (
            json!({ "gpus": 0, "memory_bytes": 10_000_000_000_000u64 }),
            "memory_bytes",
            "no node offers more than",
        ),
        (
            json!({ "gpus": 8 }),
            "gpus",
            "tenant `demo` may hold at most 4 GPUs at once (its hard limit), and this job asks for 8",
        ),
        (json!({ "gpus": 9 }), "gpus", "no node has more than 8 GPUs"),
        (
            json!({ "mig_profile": "1g.18gb" }),
            "mig_profile",
            "no GPU is in MIG mode",
        ),
    ];
    for (fields, field, says) in never {
        let mut body = json!({ "tenant": "demo", "command": ["true"] });
        if let (Some(b), Some(extra)) = (body.as_object_mut(), fields.as_object()) {
            b.extend(extra.clone());
        }
        let (status, p) = c.post("/api/v1/jobs", body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{fields}: {p}");
        let named = p["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["field"] == field)
            .unwrap_or_else(|| panic!("{fields}: {field} not named in {p}"));
        assert!(
            named["reason"].as_str().unwrap_or("").contains(says),
            "{fields}: {p}"
        );
    }
    let (_, jobs) = c.get("/api/v1/jobs?tenant=demo").await;
    assert_eq!(jobs["items"].as_array().map(Vec::len), Some(0), "{jobs}");
    // What the fleet and the limit do allow is admitted and runs.
    let id = c
        .submit_with(
            "demo",
            json!({ "gpus": 4, "gpu_models": ["h200"] }),
            &["true"],
        )
        .await;
    assert_eq!(c.wait_for_end(&id).await["state"], "succeeded");
}

/// A job with a time limit is stopped when it reaches it and ends timed out (its own end
/// state, as Slurm's TIMEOUT, not a cancel) saying so, in the API, the metrics and usage;
/// the job waiting behind it is told when it is estimated to start (when the limit is
/// reached), and starts then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_limit_stops_a_job_and_tells_the_next_when_it_starts() {
    let c = allot_system_tests::spawn_cluster_with(Backend::Sqlite, 1, "1xH200", |config| {
        config.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    c.create_tenant("t", None).await;
    let (s, body) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "t", "command": ["true"], "time_limit_secs": 0 }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["errors"][0]["field"], "time_limit_secs", "{body}");

    let long = c
        .submit_with(
            "t",
            json!({ "gpus": 1, "time_limit_secs": 4 }),
            &["sleep", "600"],
        )
        .await;
    let running = c.wait_for_state(&long, "running").await;
    let started: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(running["started_at"].clone()).expect("started_at");
    let next = c
        .submit_with("t", json!({ "gpus": 1, "time_limit_secs": 60 }), &["true"])
        .await;
    let (_, waiting) = c.get(&format!("/api/v1/jobs/{next}")).await;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    let estimate: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(waiting["estimated_start"].clone())
            .unwrap_or_else(|e| panic!("an estimated start ({e}): {waiting}"));
    assert_eq!(
        estimate,
        started + chrono::Duration::seconds(4),
        "when the job ahead reaches its limit: {waiting}"
    );

    let ended = c.wait_for_state(&long, "timed_out").await;
    assert_eq!(ended["message"], "time limit of 4s reached", "{ended}");
    let metrics = c.scrape_metrics().await;
    assert!(
        metrics.contains(r#"allot_jobs{tenant="t",state="timed_out"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"allot_jobs{tenant="t",state="cancelled"} 0"#),
        "{metrics}"
    );
    let (_, usage) = c.get("/api/v1/usage?by=job").await;
    assert!(
        usage["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .any(|r| r["job_id"] == long.as_str() && r["gpu_hours"].as_f64() > Some(0.0)),
        "a timed-out job's GPU-hours count: {usage}"
    );
    let (_, listed) = c.get("/api/v1/jobs?state=timed_out").await;
    assert_eq!(listed["items"][0]["id"], long.as_str(), "{listed}");
    let finished: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(ended["finished_at"].clone()).expect("finished_at");
    let ran = (finished - started).num_milliseconds();
    assert!(
        (4000..15_000).contains(&ran),
        "stopped at its limit: ran {ran} ms"
    );
    c.wait_for_state(&next, "succeeded").await;
    c.shutdown().await;
}

/// `allot bench scheduler` at several fleet sizes in one run, gangs in the mix: each size
/// reported, gangs placed whole (a gang's replicas counted with it), nothing placed twice.
#[test]
fn the_scale_benchmark_runs_several_sizes_with_gangs() {
    let out = std::process::Command::new(allot_system_tests::allot_bin())
        .args(["bench", "scheduler", "--nodes", "40,120", "--gangs", "0.5"])
        .args(["--gpus-per-node", "8", "--json"])
        .output()
        .expect("allot runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let runs = v["runs"].as_array().expect("a run per size");
    assert_eq!(runs.len(), 2, "{v}");
    for (run, nodes) in runs.iter().zip([40, 120]) {
        assert_eq!(run["nodes"], nodes, "{run}");
        assert_eq!(
            run["pending"],
            nodes * 10,
            "ten jobs per node by default: {run}"
        );
        let n = |k: &str| run[k].as_u64().unwrap_or_else(|| panic!("{k}: {run}"));
        assert!(n("gangs_pending") > 0 && n("gangs_placed") > 0, "{run}");
        assert!(
            n("replicas_placed") >= n("placed") + n("gangs_placed"),
            "{run}"
        );
        assert!(
            n("placed") < n("pending"),
            "a backlog deeper than the fleet: {run}"
        );
        let alloc = run["gpu_alloc_pct"].as_f64().unwrap_or_default();
        assert!(alloc > 50.0 && alloc <= 100.0, "{run}");
        assert!(run["p99_decision_ms"].as_f64().is_some(), "{run}");
    }
    let bad = std::process::Command::new(allot_system_tests::allot_bin())
        .args(["bench", "scheduler", "--nodes", "10", "--gangs", "1.5"])
        .output()
        .expect("allot runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--gangs"));
}

/// With fair share over time, each tenant's decayed past GPU use outlives the control
/// plane: saved by the scheduling loop, taken up by the next server on the database (a
/// restart, or another replica), not started afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fair_share_history_outlives_the_server() {
    use allot_store::FairShareRepo;
    let mut shared = None;
    let c = spawn_cluster_with(Backend::Sqlite, 1, "2xH200", |cfg| {
        cfg.fair_share_half_life = Some(Duration::from_secs(3600));
        shared = Some(cfg.clone());
    })
    .await;
    // One GPU at a time: the second job waits while the first runs, so passes record.
    c.create_tenant("t", Some(1)).await;
    let first = c.submit("t", 1, &["sleep", "2"]).await;
    let second = c.submit("t", 1, &["true"]).await;
    for id in [&first, &second] {
        c.eventually("the jobs succeed", || async {
            let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
            (job["state"] == "succeeded").then_some(())
        })
        .await;
    }
    let (_, tenant) = c.get("/api/v1/tenants/t").await;
    let tenant_id = tenant["id"].as_str().expect("tenant id").to_owned();
    let store =
        allot_store::Store::connect(&c.db_url, std::sync::Arc::new(allot_domain::SystemClock))
            .await
            .expect("store");
    let token = c.admin_token.clone();
    // The first server stops (saving the history); its database stays.
    let TestCluster { server, .. } = c;
    server.shutdown().await;
    let saved = store.fair_share_history().await.expect("read");
    let used = saved.by_tenant.get(&tenant_id).copied().unwrap_or_default();
    assert!(used >= 1.0, "about two GPU-seconds recorded: {saved:?}");

    // The next server on the database takes it up. Its node is gone (the agent spoke to
    // the first server), so a new job waits, and passes record again: a history started
    // afresh would have nothing of t's, and saving it would forget what was saved.
    let mut config = shared.expect("configuration");
    config.http_listen = "127.0.0.1:0".parse().expect("address");
    config.grpc_listen = "127.0.0.1:0".parse().expect("address");
    let next = allot_server::start(config, std::sync::Arc::new(allot_domain::SystemClock))
        .await
        .expect("the next server starts");
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("{}/api/v1/jobs", next.http_url()))
        .bearer_auth(&token)
        .json(&json!({ "tenant": "t", "gpus": 1, "command": ["true"] }))
        .send()
        .await
        .expect("submit");
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    next.shutdown().await;
    let again = store.fair_share_history().await.expect("read");
    let kept = again.by_tenant.get(&tenant_id).copied().unwrap_or_default();
    assert!(
        kept > 0.9 * used && kept <= used,
        "taken up, decayed a little: {used} then {kept}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_low_on_disk_takes_no_new_work_and_says_why() {
    // node-1 wants more free space than any disk has; node-2 checks nothing.
    let c = allot_system_tests::spawn_cluster_of(
        Backend::Sqlite,
        2,
        "1xH200",
        |_| {},
        |cfg| {
            if cfg.node_name == "node-1" {
                cfg.min_free_disk_bytes = 1 << 60;
            }
        },
    )
    .await;
    c.create_tenant("ml", None).await;
    let node = |name: &'static str| {
        let c = &c;
        async move {
            let (_, nodes) = c.get("/api/v1/nodes").await;
            nodes
                .as_array()
                .and_then(|a| a.iter().find(|n| n["name"] == name).cloned())
                .expect("node")
        }
    };
    let low = c
        .eventually("node-1 says it takes no new work", || async {
            let n = node("node-1").await;
            let why = n["unavailable"].as_str().unwrap_or_default().to_owned();
            (!why.is_empty()).then_some(why)
        })
        .await;
    assert!(
        low.starts_with("low on disk") && low.contains("--min-free-disk"),
        "{low}"
    );
    assert_eq!(node("node-2").await["unavailable"], "", "node-2 takes work");
    assert_eq!(node("node-1").await["status"], "ready", "node-1 is alive");
    // Work goes to node-2 only: a second job waits rather than go to node-1.
    let first = c.submit("ml", 1, &["sleep", "60"]).await;
    let running = c.wait_for_state(&first, "running").await;
    let node2 = node("node-2").await;
    assert_eq!(running["node_id"], node2["id"], "{running:#}");
    let second = c.submit("ml", 1, &["sleep", "60"]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, waiting) = c.get(&format!("/api/v1/jobs/{second}")).await;
    assert_eq!(waiting["state"], "pending", "{waiting:#}");
    // `allot node list` and `node get` show it.
    let cli = |args: &[&str]| c.cli(args);
    let list = cli(&["node", "list"]);
    let line = list
        .lines()
        .find(|l| l.contains("node-1"))
        .expect("node-1 listed");
    assert!(line.contains("unavailable"), "{list}");
    let id = node("node-1").await["id"].as_str().expect("id").to_owned();
    // The free space it names moves as the disk fills: the reason, and the setting.
    let got = cli(&["node", "get", &id]);
    let said = got
        .lines()
        .find_map(|l| l.strip_prefix("Unavailable:"))
        .map(str::trim)
        .unwrap_or_default();
    assert!(
        said.starts_with("low on disk") && said.ends_with("--min-free-disk 1048576 TiB"),
        "{got}"
    );
    for id in [first, second] {
        let (status, _) = c
            .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
            .await;
        assert!(status.is_success());
    }
    c.shutdown().await;
}
