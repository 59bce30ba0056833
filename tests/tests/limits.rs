//! CPU, memory and pids limits as a Kubernetes LimitRange and kubelet's system-reserved give
//! them: a tenant's default and most CPU and memory per job (inherited from its parent,
//! else the platform's), applied at submit and shown on the job; each container's cgroup
//! limited to what its job got, its CPU weight following its request; every container of a
//! node below one parent cgroup holding the node's memory less the reserve and a pids limit
//! of all jobs together.

use allot_agent::runtime::cgroup::{Hierarchy, cpu_shares, cpu_weight};
use allot_system_tests::oci::{
    Registry, cgroup_of, confined_cluster_with, push_busybox, require_container_support,
};
use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

async fn patch(c: &TestCluster, path: &str, body: Value, token: &str) -> (StatusCode, Value) {
    c.request(reqwest::Method::PATCH, path, Some(token), Some(body))
        .await
}

/// The field errors of a problem document, as `(field, reason)`.
fn errors(problem: &Value) -> Vec<(String, String)> {
    problem["errors"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["field"].as_str().unwrap_or_default().to_owned(),
                        e["reason"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_give_their_jobs_default_limits_and_refuse_more_than_their_maximum() {
    let c = spawn_cluster(Backend::Sqlite, 1, "2xH200").await;
    c.create_tenant("org", None).await;
    c.create_tenant("plain", None).await;
    let (s, b) = c
        .post(
            "/api/v1/tenants",
            json!({ "name": "team", "parent": "org" }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = c
        .put(
            "/api/v1/tenants/org/job-limits",
            json!({ "default_cpu_milli": 2000, "default_memory_bytes": 4 * GIB,
                    "max_cpu_milli": 4000, "max_memory_bytes": 8 * GIB }),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // The team sets its own CPU default and a maximum above its parent's: the parent's
    // maximum still holds.
    let (s, b) = patch(
        &c,
        "/api/v1/tenants/team/job-limits",
        json!({ "default_cpu_milli": 500, "max_cpu_milli": 16000 }),
        &c.admin_token,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["own"]["default_cpu_milli"], 500);
    assert_eq!(b["own"]["default_memory_bytes"], Value::Null);
    assert_eq!(
        b["effective"],
        // An auto-sized job's starting share: the platform's, nobody set one.
        json!({ "default_cpu_milli": 500, "default_memory_bytes": 4 * GIB,
                "max_cpu_milli": 4000, "max_memory_bytes": 8 * GIB,
                "default_gpu_milli": 100 })
    );
    let (_, team) = c.get("/api/v1/tenants/team").await;
    assert_eq!(team["job_limits"]["effective"]["max_cpu_milli"], 4000);
    let (_, plain) = c.get("/api/v1/tenants/plain/job-limits").await;
    assert_eq!(
        plain["effective"],
        json!({ "default_cpu_milli": 1000, "default_memory_bytes": 2 * GIB,
                "max_cpu_milli": null, "max_memory_bytes": null, "default_gpu_milli": 100 }),
        "the platform's defaults, where no tenant sets any"
    );

    // A job asking for nothing gets the defaults, and shows them.
    let id = c.submit_with("team", json!({ "gpus": 0 }), &["true"]).await;
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        (&job["cpu_milli"], &job["memory_bytes"]),
        (&json!(500), &json!(4 * GIB)),
        "{job:#}"
    );
    let id = c
        .submit_with("plain", json!({ "gpus": 1 }), &["true"])
        .await;
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        (&job["cpu_milli"], &job["memory_bytes"]),
        (&json!(1000), &json!(2 * GIB))
    );
    // What it asks for, within the maximum, it gets.
    let id = c
        .submit_with(
            "team",
            json!({ "gpus": 0, "cpu_milli": 4000, "memory_bytes": MIB }),
            &["true"],
        )
        .await;
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(
        (&job["cpu_milli"], &job["memory_bytes"]),
        (&json!(4000), &json!(MIB))
    );
    // Above the maximum is refused, naming the field.
    let (s, p) = c
        .post(
            "/api/v1/jobs",
            json!({ "tenant": "team", "gpus": 0, "command": ["true"],
                    "cpu_milli": 4001, "memory_bytes": 9 * GIB }),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    let fields = errors(&p);
    assert_eq!(fields[0].0, "cpu_milli", "{p}");
    assert!(fields[0].1.contains("at most 4 CPUs"), "{p}");
    assert_eq!(fields[1].0, "memory_bytes", "{p}");
    assert!(fields[1].1.contains("at most 8 GiB"), "{p}");

    // A default above the tenant's own maximum is refused; `null` inherits again.
    let (s, p) = patch(
        &c,
        "/api/v1/tenants/team/job-limits",
        json!({ "default_cpu_milli": 20000 }),
        &c.admin_token,
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(errors(&p)[0].0, "default_cpu_milli", "{p}");
    let (s, b) = patch(
        &c,
        "/api/v1/tenants/team/job-limits",
        json!({ "default_cpu_milli": null }),
        &c.admin_token,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["effective"]["default_cpu_milli"], 2000);
    let (s, _) = patch(
        &c,
        "/api/v1/tenants/team/job-limits",
        json!({ "default_gpus": 1 }),
        &c.admin_token,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "an unknown field");

    // Only platform admins set them: a tenant's own admin may not raise its maximum.
    let tenant_admin = c.token_for("team", "tenant-admin").await;
    let (s, _) = patch(
        &c,
        "/api/v1/tenants/team/job-limits",
        json!({ "max_cpu_milli": 64000 }),
        &tenant_admin,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, b) = c
        .request(
            reqwest::Method::GET,
            "/api/v1/tenants/team/job-limits",
            Some(&tenant_admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "its admin reads them: {b}");
    let actions: Vec<String> = c
        .audit_log(team["id"].as_str().expect("id"))
        .await
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(
        actions
            .iter()
            .filter(|a| *a == "tenant.job_limits.set")
            .count(),
        2,
        "each change is audited: {actions:?}"
    );
    c.shutdown().await;
}

/// A job asking for no CPU or memory runs in a container whose cgroup holds it to its
/// tenant's defaults; one asking for half a CPU weighs a third as much under contention;
/// the node's containers are all below one cgroup holding the node's memory less the
/// reserve, with a pids limit of all of them together that a job's own limit cannot get
/// past.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_without_requests_runs_under_its_tenants_default_limits() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    push_busybox(&registry, "team-a/busybox:1").await;
    let c = confined_cluster_with(&registry, 1, "1xH200", 64, |oci| {
        oci.jobs_pids_limit = Some(100);
    })
    .await;
    c.create_tenant("team-a", None).await;
    let (s, b) = c
        .put(
            "/api/v1/tenants/team-a/job-limits",
            json!({ "default_cpu_milli": 1500, "default_memory_bytes": 96 * MIB }),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let image = format!("{}/team-a/busybox:1", registry.addr);
    let h = Hierarchy::detect();
    let weight = |milli: u32| match &h {
        Hierarchy::Legacy(_) => cpu_shares(milli),
        Hierarchy::Unified(_) => cpu_weight(cpu_shares(milli)),
    };

    // The job reserves no CPU or memory of its own; it spawns 50 processes and waits.
    let hold = "i=0; while [ $i -lt 50 ]; do sleep 300 & i=$((i+1)); done; echo spawned; wait";
    let a = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image }),
            &["sh", "-c", hold],
        )
        .await;
    let job = c.wait_for_state(&a, "running").await;
    assert_eq!(
        (&job["cpu_milli"], &job["memory_bytes"]),
        (&json!(1500), &json!(96 * MIB))
    );
    let cgroup = cgroup_of(job["pid"].as_u64().expect("pid"));
    assert!(cgroup.starts_with("/allot/"), "{cgroup}");
    assert_eq!(h.memory_limit(&cgroup), Some(96 * MIB), "{cgroup}");
    assert_eq!(h.cpu_quota(&cgroup), Some((150_000, 100_000)), "1.5 CPUs");
    assert_eq!(h.cpu_weight(&cgroup), Some(weight(1500)));
    assert_eq!(h.pids_limit(&cgroup), Some(64));
    // Its parent: every job of the node together.
    let (parent, _) = cgroup.rsplit_once('/').expect("a parent");
    let node_memory = allot_agent::host_memory_bytes().expect("MemTotal");
    assert_eq!(
        h.memory_limit(parent),
        Some(node_memory - allot_agent::runtime::oci::DEFAULT_SYSTEM_RESERVED_MEMORY),
        "the node's memory less the system's reserve"
    );
    assert_eq!(h.pids_limit(parent), Some(100));

    // Half a CPU asked for: a third of the weight.
    let half = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image, "cpu_milli": 500 }),
            &["sleep", "300"],
        )
        .await;
    let job = c.wait_for_state(&half, "running").await;
    let half_cgroup = cgroup_of(job["pid"].as_u64().expect("pid"));
    assert_eq!(h.cpu_weight(&half_cgroup), Some(weight(500)));
    assert!(weight(500) < weight(1500));
    assert_eq!(h.memory_limit(&half_cgroup), Some(96 * MIB));

    // Past the default memory limit, the kernel ends a job that asked for none.
    let oom = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image }),
            &["sh", "-c", "x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done"],
        )
        .await;
    let done = c.wait_for_end(&oom).await;
    assert_eq!(done["state"], "failed", "{done:#}");
    let message = done["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("OutOfMemory") && message.contains("96 MiB"),
        "the message names the reason and the default limit: {message}"
    );

    // All jobs together: with A's 50 processes, 55 more do not fit below the 100 of the
    // node's jobs, though one job's own limit (64) would allow them.
    c.eventually("A spawned its processes", || async {
        c.log_of(&a).await.contains("spawned").then_some(())
    })
    .await;
    let spawn = "(i=0; while [ $i -lt 55 ]; do sleep 30 & i=$((i+1)); done; echo spawned-$i) \
                 2>/tmp/err; grep -q fork /tmp/err && echo refused-fork; exit 0";
    let b = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image, "cpu_milli": 100 }),
            &["sh", "-c", spawn],
        )
        .await;
    c.wait_for_end(&b).await;
    let log = c.log_of(&b).await;
    assert!(log.contains("refused-fork"), "{log}");
    assert!(!log.contains("spawned-55"), "{log}");
    // The negative control: alone, the same job gets all 55.
    for id in [&a, &half] {
        let (s, _) = c
            .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
            .await;
        assert!(s.is_success());
        c.wait_for_end(id).await;
    }
    let alone = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image, "cpu_milli": 100 }),
            &["sh", "-c", spawn],
        )
        .await;
    c.wait_for_end(&alone).await;
    let log = c.log_of(&alone).await;
    assert!(
        log.contains("spawned-55") && !log.contains("refused-fork"),
        "{log}"
    );
    c.shutdown().await;
}
