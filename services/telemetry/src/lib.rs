//! Tracing across the system with OpenTelemetry: spans of `tracing` exported over OTLP/gRPC
//! when an endpoint is configured (nothing otherwise), and the W3C `traceparent` that
//! carries a trace from an API request, through the scheduling decision and the gRPC
//! assignment, into the agent that launches the job.

use std::collections::HashMap;

pub mod client_errors;
pub use client_errors::{ClientErrors, is_client_error};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP exporter for {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
}

/// The exporting half: flush it before the process exits.
#[derive(Debug, Clone)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// A tracer provider batching spans to the OTLP/gRPC collector at `endpoint` (e.g.
    /// `http://127.0.0.1:4317`), naming this process `service`.
    pub fn otlp(endpoint: &str, service: &str) -> Result<Self, TelemetryError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| TelemetryError::Exporter {
                endpoint: endpoint.to_owned(),
                reason: e.to_string(),
            })?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(service.to_owned())
                    .build(),
            )
            .build();
        Ok(Self { provider })
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("allot"))
    }

    /// Exports what is buffered.
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "flushing traces");
        }
    }

    /// Flushes and stops exporting.
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

/// The W3C `traceparent` of `span`, when it is part of a sampled trace.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the trace in `traceparent` (ignored when malformed).
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() || traceparent.len() > 128 {
        return;
    }
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The trace id of `span` in hex, for logs; `None` when it is not traced.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}
