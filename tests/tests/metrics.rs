//! Prometheus metrics: what the store holds, read at scrape time, and what happened,
//! counted, in OpenMetrics text on the metrics listener.

use allot_store::testing::Backend;
use allot_system_tests::{http_client, spawn_cluster_with};
use reqwest::StatusCode;
use serde_json::json;

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
