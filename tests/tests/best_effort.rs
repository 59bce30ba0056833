//! Best-effort work on a live cluster: a job that holds no share of its own runs on what
//! a GPU's other jobs leave, beside a share that fits with it, and gives its place up
//! (preempted, requeued as its next attempt) to a job that is not best-effort and needs
//! the GPU — here one from a tenant with no guarantee at all, which could take nothing
//! from a borrower. Its submission is checked field by field.

use allot_system_tests::{
    Backend, StatusCode, TestCluster, process_group_alive, spawn_cluster_with,
};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

async fn tenant(c: &TestCluster, name: &str) {
    let (status, body) = c.post("/api/v1/tenants", json!({ "name": name })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Asserts that job `id` still runs its first attempt.
async fn still_first_attempt(c: &TestCluster, id: &str) {
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        (job["state"].as_str(), job["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "{job}"
    );
}

fn messages(job: &Value) -> Vec<String> {
    job["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_work_runs_beside_shares_and_gives_way_to_a_whole_gpu() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "1xH200", |cfg| {
        cfg.min_runtime = std::time::Duration::from_secs(3600);
    })
    .await;
    tenant(&c, "batch").await;
    tenant(&c, "serving").await;

    let best_effort = json!({ "gpu_compute": "best_effort", "gpu_memory_bytes": 8 * GIB });
    let be = c
        .submit_with(
            "batch",
            best_effort.clone(),
            &["sh", "-c", "echo attempt $ALLOT_ATTEMPT; sleep 120"],
        )
        .await;
    let job = c.wait_for_state(&be, "running").await;
    assert_eq!(job["gpu_compute"], "best_effort", "{job}");
    assert_eq!(job["gpu_milli"], 1, "the least share there is: {job}");
    assert_eq!(job["gpus"], 1, "{job}");
    let first_pid = u32::try_from(job["pid"].as_u64().expect("pid")).expect("pid fits");

    // A share that fits beside it runs there, and takes nothing from it.
    let share = c
        .submit_with(
            "serving",
            json!({ "gpus": 1, "gpu_milli": 500, "gpu_memory_bytes": 8 * GIB }),
            &["sleep", "1"],
        )
        .await;
    c.wait_for_state(&share, "succeeded").await;
    still_first_attempt(&c, &be).await;

    // A whole GPU for a tenant with no guarantee (and an hour's minimum runtime that
    // would hold any borrower): the best-effort job gives its place up at once.
    let whole = c
        .submit_with("serving", json!({ "gpus": 1 }), &["sleep", "2"])
        .await;
    c.wait_for_state(&whole, "running").await;
    let (_, job) = c.get(&format!("/api/v1/jobs/{be}")).await;
    assert_eq!(job["attempt"], 2, "{job}");
    let why = messages(&job);
    assert!(
        why.iter().any(|m| m.contains(&format!(
            "best-effort: gave its place up to {whole} (tenant serving)"
        ))),
        "{why:?}"
    );
    assert!(
        !process_group_alive(first_pid),
        "the preempted attempt was stopped on its node"
    );
    // Once the GPU is free again, it comes back as its next attempt.
    c.wait_for_state(&whole, "succeeded").await;
    let back = c.wait_for_state(&be, "running").await;
    assert_eq!(back["attempt"], 2, "{back}");

    // The same whole-GPU job does not take the place of a share that is not best-effort
    // (negative control): it waits.
    let (status, body) = c
        .post(&format!("/api/v1/jobs/{be}/cancel"), json!({}))
        .await;
    assert!(status.is_success(), "{body}");
    let held = c
        .submit_with(
            "batch",
            json!({ "gpus": 1, "gpu_milli": 1, "gpu_memory_bytes": 8 * GIB }),
            &["sleep", "120"],
        )
        .await;
    c.wait_for_state(&held, "running").await;
    let waits = c
        .submit_with("serving", json!({ "gpus": 1 }), &["sleep", "1"])
        .await;
    let job: Value = c
        .eventually("the whole-GPU job says why it waits", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{waits}")).await;
            j["pending_reason"].is_object().then_some(j)
        })
        .await;
    assert_eq!(job["state"], "pending", "{job}");
    still_first_attempt(&c, &held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_best_effort_submission_names_what_it_cannot_have() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "1xH200", |_| {}).await;
    tenant(&c, "batch").await;
    let refused = |extra: Value| {
        let c = &c;
        async move {
            let mut body =
                json!({ "tenant": "batch", "command": ["true"], "gpu_compute": "best_effort" });
            if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
                b.extend(e.clone());
            }
            let (status, body) = c.post("/api/v1/jobs", body).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            body["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["field"].as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(refused(json!({})).await, ["gpu_memory_bytes"]);
    assert_eq!(
        refused(json!({ "gpu_memory_bytes": GIB, "gpu_milli": 500 })).await,
        ["gpu_milli"]
    );
    assert_eq!(
        refused(json!({ "gpu_memory_bytes": GIB, "preemptible": false })).await,
        ["preemptible"]
    );
    assert!(
        refused(json!({ "gpu_memory_bytes": GIB, "replicas": 2 }))
            .await
            .contains(&"gpus".to_owned())
    );
    assert_eq!(
        refused(json!({ "gpu_memory_bytes": GIB, "isolation": "dedicated" })).await,
        ["isolation"]
    );
    // From the command line, as people type it.
    let out = c.cli_output(&[
        "job",
        "submit",
        "--tenant",
        "batch",
        "--gpu-compute",
        "best-effort",
        "--gpu-memory",
        "2G",
        "--",
        "true",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.cli_output(&[
        "job",
        "submit",
        "--tenant",
        "batch",
        "--gpu-compute",
        "best-effort",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpu_memory_bytes"), "{err}");
}
