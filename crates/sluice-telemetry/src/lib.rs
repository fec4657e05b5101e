//! OpenTelemetry traces for sluice, opt-in with `[telemetry] otlp_endpoint`.
//!
//! The request path is instrumented with `tracing` spans at debug level: `rpc` (one body),
//! and below it one per layer (`mempool`, `logs`, `cache` with its result, `coalesce` with
//! its role, `pool`) and one per upstream exchange (`upstream`, with member and outcome).
//! With telemetry off those callsites are disabled and cost one comparison each. With it on,
//! [`layer`] turns them into OTLP spans, exported over HTTP in batches; a caller's W3C
//! `traceparent` becomes the parent of its `rpc` span ([`adopt_parent`]) and each upstream
//! request carries the `traceparent` of its `upstream` span ([`inject`]).

mod client;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;

/// `[telemetry]`: where traces go, if anywhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP collector, `http://HOST:PORT` (traces are posted to `/v1/traces`, protobuf).
    /// Absent: no traces, and no cost.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans.
    pub service_name: String,
    /// Share of traces kept (0 to 1) for requests without a sampled parent; a caller's sampled
    /// `traceparent` is always followed.
    pub sample_ratio: f64,
    /// How long spans wait to be sent in a batch.
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// Spans kept waiting at most; past it, new spans are dropped (never the request).
    pub max_queue: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "sluice".into(),
            sample_ratio: 1.0,
            export_interval: Duration::from_secs(2),
            max_queue: 8192,
        }
    }
}

impl TelemetryConfig {
    /// What is wrong with it, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.otlp_endpoint {
            let uri: http::Uri = url.parse().map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
            if uri.scheme_str() != Some("http") || uri.host().is_none() {
                return Err("telemetry.otlp_endpoint: an http://HOST:PORT address of an OTLP collector".into());
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err("telemetry.sample_ratio: from 0 to 1".into());
        }
        if self.max_queue == 0 {
            return Err("telemetry.max_queue: more than zero".into());
        }
        Ok(())
    }
}

static ON: AtomicBool = AtomicBool::new(false);

/// True once traces are exported: propagation is skipped otherwise.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The exporter, kept to flush what is queued at exit.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Sends what is still queued, then stops (blocking: call it off the async threads).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("sluice: traces not all sent at exit: {e}");
        }
    }
}

/// The `tracing` layer that exports sluice's spans, for a subscriber `S`; spans are sent from
/// the exporter's own thread through `runtime`.
pub fn layer<S>(
    config: &TelemetryConfig,
    runtime: tokio::runtime::Handle,
) -> Result<(impl Layer<S> + Send + Sync, Traces), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    config.validate()?;
    let base = config.otlp_endpoint.as_deref().ok_or("telemetry.otlp_endpoint: not set")?;
    let timeout = Duration::from_secs(10);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client::TokioHttp::new(runtime, timeout))
        .with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')))
        .with_timeout(timeout)
        .build()
        .map_err(|e| format!("telemetry: {e}"))?;
    let batches = BatchConfigBuilder::default()
        .with_scheduled_delay(config.export_interval)
        .with_max_queue_size(config.max_queue)
        .build();
    let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batches).build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("sluice");
    // Only sluice's own spans, and only within a request (an `rpc` span and what is below it):
    // not log events, not dependencies', not the prober's or the head watcher's own calls.
    let only_spans = tracing_subscriber::filter::dynamic_filter_fn(|meta, cx| {
        meta.is_span() && meta.target().starts_with("sluice") && (meta.name() == "rpc" || cx.lookup_current().is_some())
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_filter(only_spans);
    ON.store(true, Ordering::Relaxed);
    Ok((layer, Traces { provider }))
}

/// Makes the caller's W3C `traceparent` (and `tracestate`) in `headers` the parent of `span`.
pub fn adopt_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if !enabled() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// Adds the current span's `traceparent` to an outgoing request's `headers`.
pub fn inject(headers: &mut http::HeaderMap) {
    if !enabled() {
        return;
    }
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_plain_http_collectors() {
        let with = |url: &str| TelemetryConfig { otlp_endpoint: Some(url.into()), ..TelemetryConfig::default() };
        assert!(with("http://127.0.0.1:4318").validate().is_ok());
        assert!(with("https://collector:4318").validate().unwrap_err().contains("http://"));
        assert!(with("collector:4318").validate().is_err());
        let ratio = TelemetryConfig { sample_ratio: 2.0, ..TelemetryConfig::default() };
        assert!(ratio.validate().unwrap_err().contains("sample_ratio"));
    }

    #[test]
    fn off_means_no_propagation() {
        let mut headers = http::HeaderMap::new();
        inject(&mut headers);
        assert!(headers.is_empty());
    }
}
