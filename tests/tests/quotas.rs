//! Hard limits hold through quota changes: a placement is checked against the quota in
//! force when it commits (not the one its pass read), and a tenant above a hard limit — by
//! a race, or because an admin lowered it — is brought back under it by stopping its own
//! newest preemptible work, never another tenant's. Against a real control plane and real
//! agents.

use std::time::{Duration, Instant};

use allot_system_tests::{Backend, StatusCode, TestCluster, spawn_cluster};
use serde_json::{Value, json};

async fn set_max_gpus(c: &TestCluster, tenant: &str, gpus: Option<u64>) {
    let (status, body) = c
        .request(
            reqwest::Method::PATCH,
            &format!("/api/v1/tenants/{tenant}/quota"),
            Some(&c.admin_token),
            Some(json!({ "limit": { "gpu_milli": gpus.map(|g| g * 1000) } })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The GPUs (in milli) the tenant's jobs hold now, from the job list.
async fn held_milli(c: &TestCluster, tenant: &str) -> u64 {
    let (_, jobs) = c
        .get(&format!(
            "/api/v1/jobs?tenant={tenant}&state=scheduled,running&limit=500"
        ))
        .await;
    jobs["items"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["gpus"].as_u64().unwrap_or(0) * 1000)
        .sum()
}

fn at(v: &Value) -> chrono::DateTime<chrono::Utc> {
    v.as_str().and_then(|s| s.parse().ok()).expect("a time")
}

/// `set-quota --max-gpus none`, then `--max-gpus 16` 110 ms later, with many jobs waiting:
/// no placement of the tenant commits after the limit is back, the tenant is brought back
/// to 16 by stopping its own newest jobs, and nobody else's job is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lifted_and_set_back_is_not_overrun() {
    let c = spawn_cluster(Backend::Sqlite, 4, "8xH200").await;
    c.create_tenant("interns", Some(16)).await;
    c.create_tenant("others", None).await;
    let others: Vec<String> = {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(c.submit("others", 1, &["sleep", "600"]).await);
        }
        ids
    };
    for id in &others {
        c.wait_for_state(id, "running").await;
    }
    let mut interns = Vec::new();
    for _ in 0..40 {
        interns.push(c.submit("interns", 1, &["sleep", "600"]).await);
    }
    c.eventually("interns at its limit of 16", || async {
        (held_milli(&c, "interns").await == 16_000).then_some(())
    })
    .await;

    set_max_gpus(&c, "interns", None).await;
    tokio::time::sleep(Duration::from_millis(110)).await;
    set_max_gpus(&c, "interns", Some(16)).await;
    let limit_back = chrono::Utc::now();
    let back = Instant::now();

    // Brought back under: within a few passes and the agents' stops.
    let seen_over = std::sync::atomic::AtomicU64::new(0);
    c.eventually("interns back at 16 GPUs or fewer", || async {
        let held = held_milli(&c, "interns").await;
        seen_over.fetch_max(held, std::sync::atomic::Ordering::Relaxed);
        (held <= 16_000).then_some(())
    })
    .await;
    let seen_over = seen_over.into_inner();
    let corrected_in = back.elapsed();
    // And it stays there.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(held_milli(&c, "interns").await <= 16_000);
    }

    // No placement of the tenant's committed once the limit was back.
    let mut late = Vec::new();
    for id in &interns {
        let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
        for e in job["events"].as_array().expect("events") {
            if e["to"] == "scheduled" && at(&e["at"]) > limit_back {
                late.push((id.clone(), e["at"].clone()));
            }
        }
    }
    assert!(
        late.is_empty(),
        "placed after the limit was set back: {late:?} (held up to {seen_over} milli, \
         back under in {corrected_in:?})"
    );
    // Whatever was stopped was the tenant's own; the others' jobs run on, first attempt.
    for id in &others {
        let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
        assert_eq!(job["state"], "running", "{job}");
        assert_eq!(job["attempt"], 1, "{job}");
    }
    if seen_over > 16_000 {
        // The tenant's stopped work says why.
        let mut said = false;
        for id in &interns {
            let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
            said |= job["events"].as_array().expect("events").iter().any(|e| {
                e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("hard limit"))
            });
        }
        assert!(said, "the stopped jobs say why");
    }
    c.shutdown().await;
}

/// An admin lowering a limit below what the tenant holds: it is brought down to the new
/// limit, newest work first, and waits there; another tenant's work is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_is_enforced_on_the_tenants_own_newest_work() {
    let c = spawn_cluster(Backend::Sqlite, 2, "8xH200").await;
    c.create_tenant("interns", Some(10)).await;
    c.create_tenant("others", None).await;
    let other = c.submit("others", 4, &["sleep", "600"]).await;
    c.wait_for_state(&other, "running").await;
    let mut mine = Vec::new();
    for _ in 0..10 {
        let id = c.submit("interns", 1, &["sleep", "600"]).await;
        c.wait_for_state(&id, "running").await;
        mine.push(id);
    }
    set_max_gpus(&c, "interns", Some(6)).await;
    c.eventually("interns down to 6", || async {
        (held_milli(&c, "interns").await == 6_000).then_some(())
    })
    .await;
    // The four newest were stopped and wait; the six oldest run on.
    for (i, id) in mine.iter().enumerate() {
        let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
        if i < 6 {
            assert_eq!(job["state"], "running", "{job}");
            assert_eq!(job["attempt"], 1, "{job}");
        } else {
            assert_eq!(job["state"], "pending", "{job}");
            c.eventually("the stopped job to wait for the limit", || async {
                let (_, j) = c.get(&format!("/api/v1/jobs/{id}")).await;
                (j["pending_reason"]["code"] == "TenantLimit").then_some(())
            })
            .await;
        }
    }
    let (_, job) = c.get(&format!("/api/v1/jobs/{other}")).await;
    assert_eq!(
        (job["state"].clone(), job["attempt"].clone()),
        (json!("running"), json!(1))
    );
    // Given room again, the stopped jobs run their next attempt, and no longer say they
    // were preempted (that is in their history).
    set_max_gpus(&c, "interns", Some(10)).await;
    for id in &mine[6..] {
        let job = c.wait_for_state(id, "running").await;
        assert_eq!(job["attempt"], 2, "{job}");
        assert_eq!(job["message"], Value::Null, "{job}");
        assert_eq!(job["preempt_reason"], Value::Null, "{job}");
    }
    c.shutdown().await;
}
