//! Topology on a real control plane with real agents: a multi-GPU job gets GPUs of one
//! NVLink domain when one has room (simulated domains, `8xH200:nvlink=4`), and a gang asked
//! to be packed within one value of a node label (`--pack rack`) is, or waits saying which
//! value lacks room; as a preference it goes anywhere.

use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster};
use serde_json::{Value, json};

async fn replica_nodes(c: &TestCluster, id: &str) -> Vec<String> {
    let (_, g) = c.get(&format!("/api/v1/jobs/{id}")).await;
    g["gang"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|r| r["node_name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_gang_running(c: &TestCluster, id: &str) -> Vec<String> {
    c.eventually("the gang runs", || async {
        let (_, g) = c.get(&format!("/api/v1/jobs/{id}")).await;
        (g["state"] == "running").then_some(())
    })
    .await;
    replica_nodes(c, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_gpu_job_gets_one_nvlink_domain() {
    let c = spawn_cluster(Backend::Sqlite, 1, "8xH200:nvlink=4").await;
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let domains: Vec<Value> = nodes[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["nvlink_domain"].clone())
        .collect();
    assert_eq!(
        domains,
        [0, 0, 0, 0, 1, 1, 1, 1].map(Value::from),
        "{nodes}"
    );
    // Two GPUs of domain 0 are taken: a 4-GPU job fits only in domain 1.
    c.create_tenant("t", None).await;
    let small = c.submit("t", 2, &["sleep", "600"]).await;
    let small = c.wait_for_state(&small, "running").await;
    assert_eq!(small["nvlink_domains"], json!([0]), "{small}");
    let four = c.submit("t", 4, &["sleep", "600"]).await;
    let four = c.wait_for_state(&four, "running").await;
    assert_eq!(four["nvlink_domains"], json!([1]), "one domain: {four}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packed_gang_shares_one_rack_or_waits_saying_which_lacks_room() {
    let c = spawn_cluster(Backend::Sqlite, 4, "1xH200").await;
    c.create_tenant("t", None).await;
    for (node, rack) in [
        ("node-1", "r1"),
        ("node-2", "r1"),
        ("node-3", "r2"),
        ("node-4", "r2"),
    ] {
        let (status, body) = c
            .request(
                reqwest::Method::PATCH,
                &format!("/api/v1/nodes/{node}/labels"),
                Some(&c.admin_token),
                Some(json!({ "labels": { "rack": rack, "zone": "z1" } })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["labels"]["rack"], rack, "{body}");
    }
    // A bad label is refused naming it.
    let (status, body) = c
        .request(
            reqwest::Method::PATCH,
            "/api/v1/nodes/node-1/labels",
            Some(&c.admin_token),
            Some(json!({ "labels": { "bad label": "x" } })),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // Removing one.
    let (_, body) = c
        .request(
            reqwest::Method::PATCH,
            "/api/v1/nodes/node-1/labels",
            Some(&c.admin_token),
            Some(json!({ "labels": { "zone": null } })),
        )
        .await;
    assert!(body["labels"].get("zone").is_none(), "{body}");

    let rack_of = |n: &str| {
        if n == "node-1" || n == "node-2" {
            "r1"
        } else {
            "r2"
        }
    };
    // Two replicas packed within a rack: both in one.
    let packed = c
        .submit_with(
            "t",
            json!({ "gpus": 1, "replicas": 2, "pack": { "label": "rack" } }),
            &["sleep", "600"],
        )
        .await;
    let on = wait_gang_running(&c, &packed).await;
    assert_eq!(on.len(), 2);
    assert_eq!(rack_of(&on[0]), rack_of(&on[1]), "{on:?}");
    c.post(&format!("/api/v1/jobs/{packed}/cancel"), Value::Null)
        .await;
    c.wait_for_state(&packed, "cancelled").await;

    // One node of each rack cordoned: each rack has room for one replica only. A packed
    // gang waits, saying so of each rack.
    for node in ["node-1", "node-3"] {
        let (status, _) = c
            .post(&format!("/api/v1/nodes/{node}/cordon"), Value::Null)
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let waits = c
        .submit_with(
            "t",
            json!({ "gpus": 1, "replicas": 2, "pack": { "label": "rack" } }),
            &["sleep", "600"],
        )
        .await;
    let w = c.wait_for_reason(&waits).await;
    let why = w["pending_reason"]["message"].as_str().unwrap_or_default();
    assert!(
        why.starts_with(
            "no rack has room for all 2 replicas (rack=r1 has room for 1, rack=r2 has room for 1)"
        ),
        "{why}"
    );
    assert_eq!(replica_nodes(&c, &waits).await, Vec::<String>::new());
    // As a preference it runs across the racks.
    c.post(&format!("/api/v1/jobs/{waits}/cancel"), Value::Null)
        .await;
    let anywhere = c
        .submit_with(
            "t",
            json!({ "gpus": 1, "replicas": 2, "pack": { "label": "rack", "required": false } }),
            &["sleep", "600"],
        )
        .await;
    let mut on = wait_gang_running(&c, &anywhere).await;
    on.sort();
    assert_eq!(on, ["node-2", "node-4"]);
    // A pack on a job of one replica is refused, naming the field.
    let (status, body) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "t", "command": ["true"], "pack": { "label": "rack" } }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("pack"), "{body}");
    c.shutdown().await;
}
