//! The agent's Prometheus metrics, served at `/metrics` on `--metrics-listen` (off unless
//! given): its GPUs and their health, the jobs on each, the lease it holds, and the XIDs it
//! has seen. Names and labels are documented in `docs/metrics.md`.

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{App, HttpResponse, HttpServer, web};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The content type of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GpuLabels {
    pub gpu_uuid: String,
    pub model: String,
    pub health: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct JobsLabels {
    pub gpu_uuid: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct XidLabels {
    pub gpu_uuid: String,
    pub code: String,
    pub class: String,
}

/// A snapshot of what the agent knows, taken at scrape time.
pub(crate) struct Snapshot {
    pub gpus: Vec<(GpuLabels, u64)>,
    pub jobs_per_gpu: Vec<(String, i64)>,
    pub lease_remaining_seconds: f64,
}

pub(crate) struct AgentMetrics {
    registry: Registry,
    gpus: Family<GpuLabels, Gauge>,
    gpu_memory: Family<GpuLabels, Gauge>,
    jobs: Family<JobsLabels, Gauge>,
    lease: Gauge<f64, std::sync::atomic::AtomicU64>,
    xids: Family<XidLabels, Counter>,
    limit_kills: Family<JobsLabels, Counter>,
}

impl AgentMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("allot_agent");
        let gpus = Family::<GpuLabels, Gauge>::default();
        registry.register("gpus", "This node's GPUs (1 each), by health", gpus.clone());
        let gpu_memory = Family::<GpuLabels, Gauge>::default();
        registry.register("gpu_memory_bytes", "Each GPU's memory", gpu_memory.clone());
        let jobs = Family::<JobsLabels, Gauge>::default();
        registry.register("jobs_running", "Jobs running on each GPU", jobs.clone());
        let lease = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "lease_remaining_seconds",
            "Seconds until the node's lease lapses unless renewed (0 when it has none)",
            lease.clone(),
        );
        let xids = Family::<XidLabels, Counter>::default();
        registry.register(
            "xids",
            "XID errors the driver reported, by GPU, code and class",
            xids.clone(),
        );
        let limit_kills = Family::<JobsLabels, Counter>::default();
        registry.register(
            "gpu_memory_limit_kills",
            "Jobs killed for holding more GPU memory than their limit by the driver's count \
             (the shim bypassed), by GPU",
            limit_kills.clone(),
        );
        Self {
            registry,
            gpus,
            gpu_memory,
            jobs,
            lease,
            xids,
            limit_kills,
        }
    }

    pub fn xid(&self, gpu_uuid: &str, code: u32, class: &str) {
        self.xids
            .get_or_create(&XidLabels {
                gpu_uuid: gpu_uuid.to_owned(),
                code: code.to_string(),
                class: class.to_owned(),
            })
            .inc();
    }

    pub fn limit_kill(&self, gpu_uuid: &str) {
        self.limit_kills
            .get_or_create(&JobsLabels {
                gpu_uuid: gpu_uuid.to_owned(),
            })
            .inc();
    }

    /// The OpenMetrics text, with the state from `snapshot`.
    pub fn render(&self, snapshot: Snapshot) -> String {
        self.gpus.clear();
        self.gpu_memory.clear();
        for (labels, memory) in snapshot.gpus {
            self.gpus.get_or_create(&labels).set(1);
            self.gpu_memory
                .get_or_create(&labels)
                .set(i64::try_from(memory).unwrap_or(i64::MAX));
        }
        self.jobs.clear();
        for (gpu_uuid, n) in snapshot.jobs_per_gpu {
            self.jobs.get_or_create(&JobsLabels { gpu_uuid }).set(n);
        }
        self.lease.set(snapshot.lease_remaining_seconds);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The class of an XID as a label value.
pub(crate) fn xid_class(class: allot_domain::XidClass) -> &'static str {
    use allot_domain::XidClass as C;
    match class {
        C::ApplicationFault => "application-fault",
        C::ContainedMemoryError => "contained-memory-error",
        C::Informational => "informational",
        C::DrainAndReset => "drain-and-reset",
    }
}

/// Serves `/metrics` on `addr` until `stop`, rendering with `render`.
pub(crate) fn serve(
    addr: SocketAddr,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let server = HttpServer::new(move || {
        let render = render.clone();
        App::new().route(
            "/metrics",
            web::get().to(move || {
                let text = render();
                async move { HttpResponse::Ok().content_type(CONTENT_TYPE).body(text) }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)?
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    tokio::spawn(async move {
        stop.cancelled().await;
        handle.stop(true).await;
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn snapshot() -> Snapshot {
        let gpu = |uuid: &str, health: &str| GpuLabels {
            gpu_uuid: uuid.into(),
            model: "H200".into(),
            health: health.into(),
        };
        Snapshot {
            gpus: vec![
                (gpu("GPU-a", "healthy"), 141 << 30),
                (gpu("GPU-b", "degraded"), 141 << 30),
            ],
            jobs_per_gpu: vec![("GPU-a".into(), 2), ("GPU-b".into(), 0)],
            lease_remaining_seconds: 3.5,
        }
    }

    #[test]
    fn the_text_reports_gpus_jobs_the_lease_and_xids() {
        let m = AgentMetrics::new();
        m.xid("GPU-b", 63, xid_class(allot_domain::classify_xid(63)));
        m.xid("GPU-b", 63, xid_class(allot_domain::classify_xid(63)));
        let text = m.render(snapshot());
        for line in [
            r#"allot_agent_gpus{gpu_uuid="GPU-b",model="H200",health="degraded"} 1"#,
            r#"allot_agent_jobs_running{gpu_uuid="GPU-a"} 2"#,
            r#"allot_agent_lease_remaining_seconds 3.5"#,
            r#"allot_agent_xids_total{gpu_uuid="GPU-b",code="63",class="informational"} 2"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
        assert!(text.trim_end().ends_with("# EOF"));
        // A GPU gone from the snapshot is gone from the text.
        let mut fewer = snapshot();
        fewer.gpus.truncate(1);
        assert!(
            !m.render(fewer)
                .contains(r#"allot_agent_gpus{gpu_uuid="GPU-b""#)
        );
    }

    #[tokio::test]
    async fn metrics_are_served_over_http_until_stopped() {
        let stop = CancellationToken::new();
        let m = Arc::new(AgentMetrics::new());
        let addr = serve(
            "127.0.0.1:0".parse().expect("address"),
            Arc::new(move || m.render(snapshot())),
            stop.clone(),
        )
        .expect("serves");
        let response = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                .expect("request");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("response");
            out
        })
        .await
        .expect("joined");
        assert!(
            response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
            "{response}"
        );
        assert!(
            response.contains("application/openmetrics-text"),
            "{response}"
        );
        assert!(response.contains("allot_agent_gpus{"), "{response}");
        stop.cancel();
    }
}
