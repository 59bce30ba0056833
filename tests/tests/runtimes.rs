//! A job goes only to nodes that can run it: one that names an image to nodes running
//! containers (`agent --runtime oci`), one without an image to nodes running processes;
//! what no node could ever run is refused at submit, naming `image`. With real agents of
//! both runtimes (`runc` for the containers) and images from a registry on loopback.

use allot_system_tests::oci::{
    Registry, confined_cluster, push_busybox, require_container_support,
};
use allot_system_tests::{Backend, StatusCode, spawn_cluster_of};
use serde_json::json;

/// A fleet of one node running containers (4 GPUs) and one running processes (1 GPU):
/// jobs without an image all go to the process node (one runs, the others wait for it),
/// never to the container node where they would fail at once; a job from an image goes to
/// the container node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_go_to_nodes_that_run_what_they_need() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    push_busybox(&registry, "team/busybox:1").await;
    let image = format!("{}/team/busybox:1", registry.addr);
    let addr = registry.addr.clone();
    let c = spawn_cluster_of(
        Backend::Sqlite,
        2,
        "1xH200",
        |_| {},
        move |cfg| {
            if cfg.node_name == "node-1" {
                let mut oci = allot_agent::runtime::oci::OciConfig::discover(None)
                    .expect("runc and tini-static");
                oci.registries.insecure = vec![addr.clone()];
                cfg.runtime = allot_agent::RuntimeChoice::Oci(oci);
            }
        },
    )
    .await;
    c.create_tenant("t", None).await;
    let mut plain = Vec::new();
    for _ in 0..2 {
        plain.push(c.submit("t", 1, &["sleep", "600"]).await);
    }
    let first = c.wait_for_state(&plain[0], "running").await;
    assert_eq!(first["node_name"], "node-2", "{first}");
    // The second waits for the process node rather than fail on the container node.
    let second = c.wait_for_reason(&plain[1]).await;
    assert_eq!(second["state"], "pending", "{second}");
    let boxed = c
        .submit_with("t", json!({ "image": image, "gpus": 1 }), &["sleep", "600"])
        .await;
    let boxed = c.wait_for_state(&boxed, "running").await;
    assert_eq!(boxed["node_name"], "node-1", "{boxed}");
    let (_, second) = c.get(&format!("/api/v1/jobs/{}", plain[1])).await;
    assert_eq!(second["state"], "pending", "{second}");
    assert_eq!(second["attempt"], 1, "it never failed on a node: {second}");
    c.shutdown().await;
}

/// A fleet that runs only containers refuses a job without an image at submit, naming
/// `image`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_no_node_can_run_is_refused_naming_image() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    let c = confined_cluster(&registry, 1, "1xH200", 256).await;
    c.create_tenant("t", None).await;
    let (s, body) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "t", "gpus": 1, "command": ["true"] }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["errors"][0]["field"], "image", "{body}");
    c.shutdown().await;
}
