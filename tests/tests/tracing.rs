//! Traces across the system: with an OTLP collector configured, a job's submission (the API
//! request), its scheduling decision and its launch on the agent are spans of one trace,
//! each the child of the one before, exported over OTLP/gRPC. The collector here is a real
//! OTLP trace service on loopback that keeps what it receives.

use std::sync::{Arc, Mutex};

use allot_system_tests::{Backend, spawn_cluster};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for rs in req.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    fn named(&self, name: &str) -> Vec<Span> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_one_trace_from_submission_to_launch() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("collector port");
    let addr = listener.local_addr().expect("address");
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let traces =
        allot_telemetry::Tracing::otlp(&format!("http://{addr}"), "allot-test").expect("exporter");
    tracing_subscriber::registry().with(traces.layer()).init();

    let c = spawn_cluster(Backend::Sqlite, 1, "1xH200").await;
    c.create_tenant("t", None).await;
    let id = c.submit("t", 1, &["true"]).await;
    c.wait_for_state(&id, "succeeded").await;
    traces.flush();

    let submitted = c
        .eventually("the submission's span", || async {
            traces.flush();
            collector.named("POST /api/v1/jobs").into_iter().next()
        })
        .await;
    let scheduled = c
        .eventually("the scheduling span", || async {
            traces.flush();
            collector.named("job.schedule").into_iter().next()
        })
        .await;
    let launched = c
        .eventually("the launch span", || async {
            traces.flush();
            collector.named("job.launch").into_iter().next()
        })
        .await;
    assert_eq!(scheduled.trace_id, submitted.trace_id, "one trace");
    assert_eq!(launched.trace_id, submitted.trace_id, "one trace");
    assert_eq!(
        scheduled.parent_span_id, submitted.span_id,
        "scheduled under the request"
    );
    assert_eq!(
        launched.parent_span_id, scheduled.span_id,
        "launched under the decision"
    );
    let job_attr = |s: &Span| {
        s.attributes
            .iter()
            .find(|a| a.key == "job.id")
            .and_then(|a| a.value.clone())
            .map(|v| format!("{v:?}"))
            .unwrap_or_default()
    };
    assert!(job_attr(&launched).contains(&id), "{launched:?}");
    c.shutdown().await;
    traces.shutdown();
}
