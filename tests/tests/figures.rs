//! The figures Allot shows add up, from one definition of what a job holds (a whole GPU all
//! of its compute and memory, a share its fraction and the memory it asked for, a MIG
//! instance its compute slices of seven): GPU-memory limits count whole GPUs, parents'
//! figures include their teams', a gang's size reads the same everywhere, and MIG slices
//! count exactly on tenants and nodes alike. Read through the API, the CLI and the metrics
//! of a real control plane with real agents.

use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster_with};
use serde_json::{Value, json};

async fn tenant(c: &TestCluster, name: &str, parent: Option<&str>, quota: Value) {
    c.create_tenant_in(name, parent, quota).await;
}

/// Submits a job of tenant `infer` on one 1g.18gb MIG instance.
async fn submit_mig(c: &TestCluster) -> String {
    c.submit_with(
        "infer",
        json!({ "mig_profile": "1g.18gb" }),
        &["sleep", "600"],
    )
    .await
}

async fn tenant_view(c: &TestCluster, name: &str) -> Value {
    c.get(&format!("/api/v1/tenants/{name}")).await.1
}

/// A tenant with `--max-gpu-memory 200GiB` holds one H200 (all 141 GiB of it) and a second
/// whole GPU waits, saying why; `tenant get` shows the memory held. (Whole GPUs used to hold
/// no GPU memory: 66 H200s ran under a 200 GiB limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_memory_limit_counts_whole_gpus() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "4xH200", |_| {}).await;
    tenant(
        &c,
        "mem",
        None,
        json!({ "limit": { "gpu_memory_bytes": 200u64 << 30 } }),
    )
    .await;
    let first = c.submit("mem", 1, &["sleep", "600"]).await;
    let running = c.wait_for_state(&first, "running").await;
    let second = c.submit("mem", 1, &["sleep", "600"]).await;
    let waiting = c
        .eventually("the second to wait for the limit", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{second}")).await;
            (j["pending_reason"]["code"] == "TenantLimit").then_some(j)
        })
        .await;
    assert!(
        waiting["pending_reason"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("GiB of GPU memory")),
        "{waiting}"
    );
    let gpu = running["gpu_uuids"][0].as_str().expect("gpu");
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let memory = nodes[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["uuid"] == gpu)
        .and_then(|g| g["memory_bytes"].as_u64())
        .expect("the GPU's memory");
    let t = tenant_view(&c, "mem").await;
    assert_eq!(t["usage"]["gpu_memory_bytes"].as_u64(), Some(memory), "{t}");
    assert_eq!(t["usage"]["gpus"], 1.0, "{t}");
    c.shutdown().await;
}

/// A parent's figures include its teams' (tenant list and get, the metrics, usage, job
/// lists), its own jobs told apart. (A parent whose teams held the fleet showed 0 held, 0
/// waiting, and `job list --tenant research` listed nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_figures_include_its_teams() {
    let c = spawn_cluster_with(Backend::Sqlite, 2, "4xH200", |config| {
        config.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    tenant(
        &c,
        "research",
        None,
        json!({ "limit": { "gpu_milli": 6000 } }),
    )
    .await;
    tenant(&c, "vision", Some("research"), json!({})).await;
    tenant(&c, "nlp", Some("research"), json!({})).await;
    tenant(&c, "ops", None, json!({})).await;
    let mut ids = Vec::new();
    for team in ["vision", "vision", "nlp"] {
        ids.push(c.submit(team, 2, &["sleep", "600"]).await);
    }
    for id in &ids {
        c.wait_for_state(id, "running").await;
    }
    // Past research's limit of 6: waits, counted in the parent's queue.
    let waiting = c.submit("nlp", 1, &["sleep", "600"]).await;
    c.wait_for_reason(&waiting).await;
    let own = c
        .submit_with("research", json!({ "gpus": 0 }), &["sleep", "600"])
        .await;
    c.wait_for_state(&own, "running").await;

    let research = tenant_view(&c, "research").await;
    assert_eq!(research["usage"]["gpus"], 6.0, "{research}");
    assert_eq!(research["jobs_running"], 4, "{research}");
    assert_eq!(research["jobs_pending"], 1, "{research}");
    assert_eq!(research["own"]["usage"]["gpus"], 0.0, "{research}");
    assert_eq!(research["own"]["jobs_running"], 1, "{research}");
    let vision = tenant_view(&c, "vision").await;
    assert_eq!(vision["usage"]["gpus"], 4.0, "{vision}");
    // The CLI says both.
    let got = c.cli(&["tenant", "get", "research"]);
    assert!(got.contains("its teams' included; its own jobs"), "{got}");
    let listed = c.cli(&["tenant", "list", "--format", "name,gpus,pending,running"]);
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["research", "6", "1", "4"]),
        "{listed}"
    );
    // The metrics, with and without the teams.
    let m = c.scrape_metrics().await;
    assert!(
        m.contains(r#"allot_tenant_gpu_milli_in_use{tenant="research"} 6000"#),
        "{m}"
    );
    assert!(
        m.contains(r#"allot_tenant_own_gpu_milli_in_use{tenant="research"} 0"#),
        "{m}"
    );
    // Listing the parent's jobs lists its teams' too.
    let (_, jobs) = c.get("/api/v1/jobs?tenant=research&limit=500").await;
    assert_eq!(
        jobs["items"].as_array().map(Vec::len),
        Some(5),
        "the parent's own job and its teams' four: {jobs}"
    );
    // Usage of the parent: its teams' GPU-hours, above zero.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (_, usage) = c.get("/api/v1/usage?tenant=research").await;
    assert!(
        usage["total_gpu_hours"].as_f64().is_some_and(|h| h > 0.0),
        "{usage}"
    );
    let (_, usage) = c.get("/api/v1/usage?tenant=ops").await;
    assert_eq!(usage["total_gpu_hours"], 0.0, "{usage}");
    let text = c.cli(&["usage", "--tenant", "ops"]);
    assert!(!text.contains("-0.000"), "{text}");
    c.shutdown().await;
}

/// A gang's size reads as replicas × each = all, everywhere: the CLI's GPUS column, the
/// reason it waits, and a tenant's counts (a gang is one job waiting). (A 4×8 gang showed
/// "8", "4x8" and "request 32", and a tenant's PENDING counted its replicas.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gangs_size_reads_the_same_everywhere() {
    let c = spawn_cluster_with(Backend::Sqlite, 2, "4xH200", |_| {}).await;
    tenant(&c, "train", None, json!({ "limit": { "gpu_milli": 4000 } })).await;
    // More than the limit ever allows: refused at submit, in the same words.
    let (s, body) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "train", "gpus": 4, "replicas": 2, "command": ["true"] }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("asks for 2 × 4 = 8"), "{body}");
    let one = c.submit("train", 1, &["sleep", "600"]).await;
    c.wait_for_state(&one, "running").await;
    let gang = c
        .submit_with(
            "train",
            json!({ "gpus": 2, "replicas": 2 }),
            &["sleep", "600"],
        )
        .await;
    let waiting = c
        .eventually("the gang to wait for the limit", || async {
            let (_, j) = c.get(&format!("/api/v1/jobs/{gang}")).await;
            (j["pending_reason"]["code"] == "TenantLimit").then_some(j)
        })
        .await;
    let reason = waiting["pending_reason"]["message"]
        .as_str()
        .expect("reason");
    assert!(reason.contains("request 2 × 2 = 4"), "{reason}");
    let listed = c.cli(&["job", "list", "--format", "name,gpus"]);
    assert!(listed.contains("2 × 2 = 4"), "{listed}");
    let t = tenant_view(&c, "train").await;
    assert_eq!(t["jobs_pending"], 1, "a gang is one job: {t}");
    assert_eq!(t["jobs_running"], 1, "{t}");
    c.shutdown().await;
}

/// MIG slices count exactly: seven 1g instances are one GPU on their tenant and their node;
/// with six held, the node has 1/7 of a GPU free (it has a free slot), and held + free is
/// the node's GPUs. (Tenants counted a slice as 0.142, nodes as 1/8.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_slices_count_exactly_on_tenants_and_nodes() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "1xH200:mig", |_| {}).await;
    tenant(&c, "infer", None, json!({})).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(submit_mig(&c).await);
    }
    for id in &ids {
        c.wait_for_state(id, "running").await;
    }
    let (_, nodes) = c.get("/api/v1/nodes").await;
    let n = &nodes[0];
    let held = n["gpus_held"].as_f64().expect("held");
    let free = n["gpus_free"].as_f64().expect("free");
    assert!((held - 6.0 / 7.0).abs() < 1e-9, "{n}");
    assert!((free - 1.0 / 7.0).abs() < 1e-9, "a free slot is free: {n}");
    assert!((held + free - 1.0).abs() < 1e-9, "{n}");
    let listed = c.cli(&["node", "list", "--format", "name,free,held"]);
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["node-1", "0.143", "0.857"]),
        "{listed}"
    );
    ids.push(submit_mig(&c).await);
    c.wait_for_state(ids.last().expect("seventh"), "running")
        .await;
    let t = tenant_view(&c, "infer").await;
    assert_eq!(
        t["usage"]["gpus"], 1.0,
        "seven 1g instances are one GPU: {t}"
    );
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(nodes[0]["gpus_held"], 1.0, "{}", nodes[0]);
    assert_eq!(nodes[0]["gpus"][0]["held"], 1.0, "{}", nodes[0]);
    let got = c.cli(&["tenant", "list", "--format", "name,gpus"]);
    assert!(
        got.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["infer", "1"]),
        "{got}"
    );
    c.shutdown().await;
}
