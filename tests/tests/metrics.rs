//! Prometheus metrics: what the store holds, read at scrape time, and what happened,
//! counted, in OpenMetrics text on the metrics listener.

use allot_store::testing::Backend;
use allot_system_tests::{http_client, spawn_cluster_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_jobs_gpus_tenants_requests_and_passes() {
    let c = spawn_cluster_with(Backend::Sqlite, 1, "2xH200", |config| {
        config.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    c.create_tenant("ml", None).await;
    let id = c.submit_with("ml", json!({}), &["sleep", "60"]).await;
    let job = c.wait_for_state(&id, "running").await;
    let gpu = job["gpu_uuids"][0].as_str().expect("gpu").to_owned();

    let addr = c.server.metrics_addr.expect("metrics are served");
    let scrape = || async {
        let res = http_client()
            .build()
            .expect("client")
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .expect("scrape");
        assert_eq!(res.status(), StatusCode::OK);
        let kind = res
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
        res.text().await.expect("text")
    };
    let text = scrape().await;
    for line in [
        r#"allot_jobs{tenant="ml",state="running"} 1"#.to_owned(),
        r#"allot_jobs{tenant="ml",state="pending"} 0"#.to_owned(),
        r#"allot_nodes{node="node-1",status="ready"} 1"#.to_owned(),
        format!(
            r#"allot_gpu_allocated_milli{{node="node-1",gpu_uuid="{gpu}",model="H200",health="healthy"}} 1000"#
        ),
        r#"allot_tenant_gpu_milli_in_use{tenant="ml"} 1000"#.to_owned(),
        r#"allot_http_requests_total{method="POST",route="/api/v1/jobs",status="201"} 1"#
            .to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
    let gpus = text
        .lines()
        .filter(|l| l.starts_with("allot_gpus{"))
        .count();
    assert_eq!(gpus, 2, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with(r#"allot_scheduling_passes_total{outcome="ok"}"#)),
        "{text}"
    );
    assert!(
        text.contains("allot_http_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );

    // The state is read at each scrape: a cancelled job leaves the running count.
    c.post(&format!("/api/v1/jobs/{id}/cancel"), json!(null))
        .await;
    c.wait_for_state(&id, "cancelled").await;
    let text = scrape().await;
    assert!(
        text.lines()
            .any(|l| l == r#"allot_jobs{tenant="ml",state="running"} 0"#),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == r#"allot_tenant_gpu_milli_in_use{tenant="ml"} 0"#),
        "{text}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reports_its_gpus_jobs_lease_and_xids() {
    use std::sync::Arc;

    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |_| {}).await;
    c.create_tenant("ml", None).await;
    // The agent's own metrics address: a port free a moment ago.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let dir = tempfile::tempdir().expect("temp dir");
    let backend = allot_agent::gpu::SimBackend::from_spec("2xH200", "metered")
        .expect("gpus")
        .with_fault_dir(dir.path().join("sim-faults"));
    std::fs::create_dir_all(dir.path().join("sim-faults")).expect("fault dir");
    let stop = tokio_util::sync::CancellationToken::new();
    let agent = tokio::spawn(allot_agent::run(
        allot_agent::AgentConfig {
            metrics_listen: Some(addr),
            ..allot_system_tests::agent_config(&c.server, "metered", dir.path().to_owned()).await
        },
        Arc::new(backend),
        stop.clone(),
    ));
    let id = c.submit_with("ml", json!({}), &["sleep", "60"]).await;
    let job = c.wait_for_state(&id, "running").await;
    let gpu = job["gpu_uuids"][0].as_str().expect("gpu").to_owned();
    std::fs::write(dir.path().join("sim-faults").join("xid-0-63"), b"").expect("inject");
    std::fs::write(dir.path().join("sim-faults").join("xid-1-63"), b"").expect("inject");

    let text = c
        .eventually(
            "the agent's metrics to show the job and the XIDs",
            || async {
                let text = http_client()
                    .build()
                    .ok()?
                    .get(format!("http://{addr}/metrics"))
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                let job_line = format!(r#"allot_agent_jobs_running{{gpu_uuid="{gpu}"}} 1"#);
                (text.lines().any(|l| l == job_line)
                    && text.matches("allot_agent_xids_total{").count() == 2)
                    .then_some(text)
            },
        )
        .await;
    assert!(
        text.lines().any(|l| l.starts_with("allot_agent_gpus{")
            && l.contains(&gpu)
            && l.contains(r#"health="degraded""#)),
        "{text}"
    );
    let lease: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("allot_agent_lease_remaining_seconds "))
        .and_then(|v| v.parse().ok())
        .expect("the lease");
    assert!(lease > 0.0, "{text}");
    c.post(&format!("/api/v1/jobs/{id}/cancel"), json!(null))
        .await;
    c.wait_for_state(&id, "cancelled").await;
    stop.cancel();
    let _ = agent.await;
    c.shutdown().await;
}

#[test]
fn the_grafana_dashboard_plots_only_documented_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/allot-dashboard.json")).expect("JSON");
    let documented = read("docs/metrics.md");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    for panel in panels {
        let title = panel["title"].as_str().expect("a title");
        let exprs: Vec<&str> = panel["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .filter_map(|t| t["expr"].as_str())
            .collect();
        assert!(!exprs.is_empty(), "{title}: no query");
        for expr in exprs {
            let mut rest = expr;
            let mut names = 0;
            while let Some(at) = rest.find("allot_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                let base = name.strip_suffix("_bucket").unwrap_or(&name);
                assert!(
                    documented.contains(&format!("`{base}`")),
                    "{title}: `{base}` is not in docs/metrics.md"
                );
                names += 1;
            }
            assert!(names > 0, "{title}: `{expr}` plots no Allot metric");
        }
    }
}

/// The first sample point at `path` more than 80% busy, once there is one.
async fn busy_point(c: &allot_system_tests::TestCluster, what: &str, path: &str) -> Value {
    c.eventually(what, || async {
        let (_, points) = c.get(path).await;
        points
            .as_array()?
            .iter()
            .find(|p| p["utilization"].as_f64().is_some_and(|u| u > 0.8))
            .cloned()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_samples_from_heartbeats_are_kept_per_bucket() {
    let c = allot_system_tests::spawn_cluster_with(
        allot_system_tests::Backend::Sqlite,
        1,
        "1xH200",
        |config| config.metrics_listen = Some("127.0.0.1:0".parse().expect("address")),
    )
    .await;
    c.create_tenant("ml", None).await;
    let id = c.submit("ml", 1, &["sleep", "60"]).await;
    let job = c.wait_for_state(&id, "running").await;
    let gpu = job["gpu_uuids"][0].as_str().expect("gpu").to_owned();
    let path = format!("/api/v1/nodes/node-1/gpus/{gpu}/samples?minutes=5");
    // The simulated GPU is busy in proportion to the job's share once the job runs; samples
    // are stored every 10 seconds.
    let busy = busy_point(&c, "a sample of the busy GPU", &path).await;
    assert!(
        busy["power_watts"].as_f64().is_some_and(|w| w > 500.0),
        "{busy}"
    );
    assert!(
        busy["memory_used_bytes"].as_u64().is_some_and(|b| b > 0),
        "{busy}"
    );
    // An H200 moves data over PCIe and NVLink while busy, and its power cap throttles it.
    for traffic in ["pcie_rx_bytes_per_s", "nvlink_rx_bytes_per_s"] {
        assert!(busy[traffic].as_f64().is_some_and(|b| b > 1e9), "{busy}");
    }
    assert!(
        busy["throttle_reasons"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r == "sw_power_cap")),
        "{busy}"
    );
    assert_eq!(busy["ecc_uncorrected"], 0);
    let (s, coarse) = c
        .get(&format!(
            "/api/v1/nodes/node-1/gpus/{gpu}/samples?resolution=5m"
        ))
        .await;
    assert_eq!(s, allot_system_tests::StatusCode::OK);
    assert!(!coarse.as_array().expect("points").is_empty(), "{coarse}");
    let (s, _) = c
        .get(&format!(
            "/api/v1/nodes/node-1/gpus/{gpu}/samples?resolution=1h"
        ))
        .await;
    assert_eq!(s, allot_system_tests::StatusCode::BAD_REQUEST);
    let (s, _) = c.get("/api/v1/nodes/node-1/gpus/GPU-nope/samples").await;
    assert_eq!(s, allot_system_tests::StatusCode::NOT_FOUND);
    // The job's own samples: alone on its GPU, it is what the GPU did.
    let job_samples = format!("/api/v1/jobs/{id}/samples?minutes=5");
    let job_point = busy_point(&c, "a sample of the job", &job_samples).await;
    assert!(
        job_point["memory_used_bytes"]
            .as_u64()
            .is_some_and(|b| b > 100 << 30),
        "{job_point}"
    );
    let (s, _) = c
        .get(&format!("/api/v1/jobs/{id}/samples?resolution=1d"))
        .await;
    assert_eq!(s, allot_system_tests::StatusCode::BAD_REQUEST);
    // ... and the latest is on the control plane's /metrics.
    let text = c.scrape_metrics().await;
    let line = text
        .lines()
        .find(|l| l.starts_with("allot_gpu_utilization{") && l.contains(&gpu))
        .unwrap_or_else(|| panic!("no utilization of {gpu}:\n{text}"));
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!(value > 0.8, "{line}");
    for metric in [
        format!(r#"allot_gpu_throttled{{node="node-1",gpu_uuid="{gpu}",reason="sw_power_cap"}} 1"#),
        format!(r#"allot_gpu_ecc_errors{{node="node-1",gpu_uuid="{gpu}",reason="uncorrected"}} 0"#),
    ] {
        assert!(text.lines().any(|l| l == metric), "no {metric}:\n{text}");
    }
    for prefix in [
        format!(
            r#"allot_gpu_link_bytes_per_second{{node="node-1",gpu_uuid="{gpu}",link="nvlink",direction="rx"}} "#
        ),
        format!(r#"allot_job_gpu_utilization{{tenant="ml",job="{id}",node="node-1"}} "#),
        format!(r#"allot_job_gpu_memory_bytes{{tenant="ml",job="{id}",node="node-1"}} "#),
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&prefix)),
            "no {prefix}:\n{text}"
        );
    }
    c.shutdown().await;
}
