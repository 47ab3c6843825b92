//! Tidings' spans exported to OpenTelemetry.
//!
//! [`install`] builds an OTLP/HTTP (JSON) span exporter to a collector, and
//! returns the `tracing` layer to add to the process's subscriber and a
//! guard that flushes on drop. It also installs Tidings' trace backend
//! ([`tidings_core::trace::set_backend`]): a new envelope takes the current
//! span's trace context as its `traceparent`, and the span handling a
//! message becomes a child of the message's `traceparent`, so one order's
//! spans join into one trace across processes and brokers.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let otel = tidings_otel::install("http://127.0.0.1:4318", "checkout")?;
//! let subscriber = tracing_subscriber::registry().with(otel.layer());
//! tracing::subscriber::set_global_default(subscriber)?;
//! // ... run; dropping `otel` flushes what is left.
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::fmt;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tidings_core::trace::{Backend, TraceContext};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the OpenTelemetry exporter to {endpoint}: {reason}")]
pub struct InstallError {
    endpoint: String,
    reason: String,
}

/// The installed exporter: hands out the `tracing` layer, flushes on drop.
pub struct Otel {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl fmt::Debug for Otel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Otel").finish_non_exhaustive()
    }
}

impl Otel {
    /// The layer that turns `tracing` spans into OpenTelemetry spans.
    pub fn layer<S>(&self) -> OpenTelemetryLayer<S, SdkTracer>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        tracing_opentelemetry::layer().with_tracer(self.tracer.clone())
    }

    /// Sends the spans ended so far.
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "flushing spans to the collector failed");
        }
    }
}

impl Drop for Otel {
    fn drop(&mut self) {
        self.flush();
        let _ = self.provider.shutdown();
    }
}

/// Exports spans to the OTLP/HTTP collector at `endpoint` (`http://host:4318`;
/// spans go to `/v1/traces`), as service `service`, and installs Tidings'
/// trace backend.
pub fn install(endpoint: &str, service: &str) -> Result<Otel, InstallError> {
    let traces = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(traces)
        .build()
        .map_err(|e| InstallError {
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service.to_owned()).build())
        .build();
    let tracer = provider.tracer("tidings");
    tidings_core::trace::set_backend(Backend { current, set_parent });
    Ok(Otel { provider, tracer })
}

/// The current `tracing` span's OpenTelemetry context, as Tidings' trace context.
fn current() -> Option<TraceContext> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let sc = span.span_context();
    sc.is_valid().then(|| TraceContext {
        trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
        span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
        sampled: sc.is_sampled(),
    })
}

/// Makes `span` a child of the remote span `parent` (a message's `traceparent`).
fn set_parent(span: &tracing::Span, parent: &TraceContext) {
    let remote = SpanContext::new(
        TraceId::from_bytes(parent.trace_id.to_be_bytes()),
        SpanId::from_bytes(parent.span_id.to_be_bytes()),
        if parent.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        },
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}
