//! A real OTLP/gRPC receiver for the traces tests and the trace-overhead
//! benchmark: the OpenTelemetry collector's own `TraceService` (generated
//! from the OTLP protos by opentelemetry-proto), keeping every span it is
//! sent.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;

/// One span as the receiver got it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The `service.name` of its resource.
    pub service: String,
    pub name: String,
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    /// Empty for a root span.
    pub parent: Vec<u8>,
    pub start: u64,
    pub end: u64,
}

/// The spans received so far. Cheap to clone.
#[derive(Debug, Default, Clone)]
pub struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    /// Serves OTLP/gRPC on `addr` (port 0: any) on the current tokio
    /// runtime; returns the receiver, its endpoint URL and the server task.
    pub async fn serve(addr: &str) -> std::io::Result<(Self, String, tokio::task::JoinHandle<()>)> {
        let receiver = Self::default();
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let service = TraceServiceServer::new(receiver.clone());
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Ok((receiver, endpoint, server))
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many spans were received so far.
    pub fn count(&self) -> usize {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    received.push(Received {
                        service: service.clone(),
                        name: span.name,
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                        parent: span.parent_span_id,
                        start: span.start_time_unix_nano,
                        end: span.end_time_unix_nano,
                    });
                }
            }
        }
        self.spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}
