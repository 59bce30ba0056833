//! MIG through the whole system: jobs ask for a MIG profile, the control plane partitions a
//! GPU in MIG mode for them (a real agent applies the layout on its simulated GPU), places
//! each alone on an instance it sees as `CUDA_VISIBLE_DEVICES=MIG-…`, holds tenants to their
//! per-profile limits, and rebuilds an idle GPU for a different profile.

use allot_system_tests::{Backend, StatusCode, spawn_cluster};
use serde_json::{Value, json};

async fn job_log(c: &allot_system_tests::TestCluster, id: &str) -> String {
    let res = c
        .http
        .get(c.url(&format!("/api/v1/jobs/{id}/log")))
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("log");
    res.text().await.expect("log text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_jobs_get_their_own_instance_within_their_limits() {
    let c =
        allot_system_tests::spawn_cluster_with(Backend::Sqlite, 1, "1xH200:mig,1xH200", |config| {
            config.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
        })
        .await;
    let (s, body) = c
        .post(
            "/api/v1/tenants",
            json!({ "name": "infer", "quota": { "mig_limits": { "1g.18gb": 2 } } }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (s, body) = c
        .post(
            "/api/v1/tenants",
            json!({ "name": "infer", "quota": { "mig_limits": { "9g.1tb": 2 } } }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            c.submit_with(
                "infer",
                json!({ "mig_profile": "1g.18gb" }),
                &["sh", "-c", "echo visible=$CUDA_VISIBLE_DEVICES; sleep 3"],
            )
            .await,
        );
    }
    let (a, b, third) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
    let a_job = c.wait_for_state(&a, "running").await;
    let b_job = c.wait_for_state(&b, "running").await;
    let (ua, ub) = (&a_job["gpu_uuids"][0], &b_job["gpu_uuids"][0]);
    assert!(
        ua.as_str().is_some_and(|u| u.starts_with("MIG-")),
        "{a_job}"
    );
    assert_ne!(ua, ub, "each job has its own instance");
    assert_eq!(a_job["isolation"], "mig", "{a_job}");
    // The third waits for the tenant's limit, saying so.
    let pending = c
        .eventually("the third job to wait for the limit", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{third}")).await;
            (j["pending_reason"]["code"] == "MigLimit").then_some(j)
        })
        .await;
    assert!(
        pending["pending_reason"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("2 of the 2")),
        "{pending}"
    );
    // The node shows the instances, on the GPU in MIG mode only.
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let gpus = nodes[0]["gpus"].as_array().expect("gpus").clone();
    let mig_gpu = gpus
        .iter()
        .find(|g| g.get("mig_instances").is_some())
        .expect("a GPU in MIG mode");
    assert_eq!(mig_gpu["memory_enforcement"], "mig", "{mig_gpu}");
    let profiles: Vec<&str> = mig_gpu["mig_instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|i| i["profile"].as_str())
        .collect();
    assert_eq!(profiles, vec!["1g.18gb", "1g.18gb"], "{mig_gpu}");
    // The metrics count them, held.
    let text = c.scrape_metrics().await;
    assert!(
        text.lines().any(|l| l.starts_with("allot_mig_instances{")
            && l.contains("profile=\"1g.18gb\"")
            && l.contains("state=\"held\"")
            && l.ends_with(" 2")),
        "{text}"
    );
    assert_eq!(
        gpus.iter()
            .filter(|g| g.get("mig_instances").is_none())
            .count(),
        1
    );

    // Each saw only its instance.
    let done = c.wait_for_state(&a, "succeeded").await;
    assert!(
        job_log(&c, &a)
            .await
            .contains(&format!("visible={}", ua.as_str().unwrap_or_default())),
        "{done}"
    );
    c.wait_for_state(&third, "running").await;
    c.wait_for_state(&b, "succeeded").await;
    c.wait_for_state(&third, "succeeded").await;

    // A whole-GPU MIG profile: the idle GPU is rebuilt as one 7g instance.
    let big = c
        .submit_with(
            "infer",
            json!({ "mig_profile": "7g.141gb" }),
            &["sh", "-c", "echo visible=$CUDA_VISIBLE_DEVICES"],
        )
        .await;
    let big_job = c.wait_for_state(&big, "succeeded").await;
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let instances: Vec<Value> = nodes[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .filter_map(|g| g.get("mig_instances").cloned())
        .collect();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0][0]["profile"], "7g.141gb", "{instances:?}");
    assert_eq!(instances[0][0]["uuid"], big_job["gpu_uuids"][0]);

    // Whole-GPU jobs never land on the GPU in MIG mode.
    let whole = c.submit("infer", 1, &["true"]).await;
    let whole_job = c.wait_for_state(&whole, "succeeded").await;
    let plain = gpus
        .iter()
        .find(|g| g.get("mig_instances").is_none())
        .expect("the other GPU");
    assert_eq!(whole_job["gpu_uuids"][0], plain["uuid"]);

    // Every repartition is in the system audit log.
    let (_, entries) = c
        .get("/api/v1/audit/entries?log=system&action=node.gpu.repartition")
        .await;
    let items = entries["entries"].as_array().map(Vec::len).unwrap_or(0);
    assert!(items >= 2, "{entries}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_mig_requests_are_refused_naming_the_field() {
    let c = spawn_cluster(Backend::Sqlite, 0, "").await;
    c.create_tenant("t", None).await;
    for (fields, field) in [
        (json!({ "mig_profile": "1g.99gb" }), "mig_profile"),
        (
            json!({ "mig_profile": "1g.18gb", "gpus": 2 }),
            "mig_profile",
        ),
        (
            json!({ "mig_profile": "1g.18gb", "gpu_milli": 500 }),
            "mig_profile",
        ),
        (
            json!({ "mig_profile": "1g.18gb", "isolation": "shared" }),
            "isolation",
        ),
    ] {
        let mut body = json!({ "tenant": "t", "command": ["true"] });
        if let (Some(b), Some(extra)) = (body.as_object_mut(), fields.as_object()) {
            b.extend(extra.clone());
        }
        let (s, problem) = c.post("/api/v1/jobs", body).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{fields}: {problem}");
        let named = problem["errors"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["field"] == field));
        assert!(named, "{fields}: {problem}");
    }
    c.shutdown().await;
}
