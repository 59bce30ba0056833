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
