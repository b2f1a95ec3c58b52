//! Traces: OpenTelemetry spans exported over OTLP/gRPC, off unless
//! `otlp_endpoint` is set (docs/operations.md, "Traces").
//!
//! The spans are `tracing` spans at level TRACE under the daemons' own
//! targets, turned into OpenTelemetry spans by `tracing-opentelemetry`'s
//! layer, which sees nothing else (no events, no other crate's spans). With
//! no endpoint there is no such layer and the log's level is INFO or
//! coarser in production, so no layer wants the spans and `tracing` skips
//! them at their call site: traces off cost a branch per span.
//!
//! The exporter is tonic's OTLP client, batched by the SDK's span
//! processor on a thread of its own, with a one-thread tokio runtime of
//! its own for the gRPC connection (the serving runtimes never carry it).
//! Both are started after the signal mask is set, so they inherit it.
//!
//! Across processes a trace travels as W3C trace context: the `traceparent`
//! header on the worker's front ends, and in the ring request
//! (docs/protocol.md, "Trace context"); [`context_of`] and
//! [`remote_parent`] convert between a span and those bytes.

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A TRACE-level span named `$name` (with fields) inside the current span
/// when that one is traced; a disabled span otherwise, at the cost of a
/// branch (so an untraced call makes no spans at all).
#[macro_export]
macro_rules! child_span {
    ($name:literal $(, $($fields:tt)*)?) => {
        if ::tracing::Span::current().is_none() {
            ::tracing::Span::none()
        } else {
            ::tracing::trace_span!($name $(, $($fields)*)?)
        }
    };
}

/// What a daemon's traces are configured to be.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The OTLP/gRPC endpoint (a collector, Jaeger), e.g.
    /// `http://otel-collector:4317`; `None`: traces off.
    pub endpoint: Option<String>,
    /// The share of calls without a sampled parent that are traced (0 to 1);
    /// a call whose parent was sampled (a client's `traceparent`, the
    /// worker's ring request) is traced.
    pub sample_ratio: f64,
    /// `service.name` of the spans.
    pub service: &'static str,
}

/// The span exporter, alive while this is: dropping it exports the spans
/// still buffered (at most a few seconds) and stops the exporter.
pub struct Traces {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").finish_non_exhaustive()
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("traces: the last spans were not exported: {e}");
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Starts the exporter when `settings` names an endpoint; returns it and
/// the tracer its layer uses.
pub fn start(settings: &TraceSettings) -> anyhow::Result<Option<(Traces, SdkTracer)>> {
    let Some(endpoint) = &settings.endpoint else {
        return Ok(None);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp")
        .enable_all()
        .build()?;
    // The channel's connection task runs on the runtime it is built in.
    let exporter = {
        let _inside = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .build()
            .map_err(|e| {
                anyhow::anyhow!(
                    "otlp_endpoint {endpoint:?}: {e}: give an OTLP/gRPC URL such as \
                     http://otel-collector:4317"
                )
            })?
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sample_ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(settings.service)
                .build(),
        )
        .build();
    let tracer = provider.tracer(settings.service);
    Ok(Some((
        Traces {
            provider,
            runtime: Some(runtime),
        },
        tracer,
    )))
}

/// Checks the `otlp_endpoint` key of either daemon: unset, or an http://
/// or https:// URL with a host.
pub fn check_endpoint(endpoint: Option<&str>) -> Result<(), crate::config::Invalid> {
    let Some(endpoint) = endpoint else {
        return Ok(());
    };
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => Err(crate::config::Invalid::new(
            "otlp_endpoint",
            format!(
                "{endpoint:?} is not an OTLP/gRPC URL (http:// or https://, a host and a port)"
            ),
            "give a URL such as http://otel-collector:4317, or leave it unset",
        )),
    }
}

/// A span's trace context as W3C bytes: trace id, span id and whether it
/// is sampled; `None` when the span is not traced (traces off, or the span
/// disabled).
pub fn context_of(span: &tracing::Span) -> Option<([u8; 16], [u8; 8], bool)> {
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    let span_ref = context.span();
    let span_context = span_ref.span_context();
    span_context.is_valid().then(|| {
        (
            span_context.trace_id().to_bytes(),
            span_context.span_id().to_bytes(),
            span_context.is_sampled(),
        )
    })
}

/// Makes `span` a child of the remote span `(trace_id, span_id)`, sampled
/// or not; all-zero ids (no context) leave it as it is.
pub fn remote_parent(span: &tracing::Span, trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) {
    let context = SpanContext::new(
        TraceId::from_bytes(trace_id),
        SpanId::from_bytes(span_id),
        if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        },
        true,
        TraceState::default(),
    );
    if context.is_valid() {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(context));
    }
}

/// The W3C `traceparent` header's value, parsed: version 00, a trace id, a
/// parent span id and flags, all hex; `None` for anything else.
pub fn parse_traceparent(value: &str) -> Option<([u8; 16], [u8; 8], bool)> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 {
        return None;
    }
    let hex = |s: &str, out: &mut [u8]| -> Option<()> {
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(())
    };
    let (mut trace_id, mut span_id, mut flag) = ([0u8; 16], [0u8; 8], [0u8; 1]);
    hex(trace, &mut trace_id)?;
    hex(span, &mut span_id)?;
    if flags.len() != 2 {
        return None;
    }
    hex(flags, &mut flag)?;
    Some((trace_id, span_id, flag[0] & 1 == 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parses_or_is_ignored() {
        let (trace, span, sampled) =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(trace[0], 0x4b);
        assert_eq!(trace[15], 0x36);
        assert_eq!(span, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(sampled);
        let (_, _, sampled) =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!sampled);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad:?}");
        }
    }
}
