//! `grpc.health.v1` on the gRPC port, for Kubernetes' native `grpc`
//! probes, gRPC load balancers and `grpc-health-probe`:
//!
//! - service `""`, `gnn.v1.Predictor` and `inference.GRPCInferenceService`
//!   (the Open Inference Protocol's): the worker's readiness, read at
//!   the call from the same state as `/readyz`: SERVING exactly when
//!   `/readyz` answers 200, NOT_SERVING otherwise, with `/readyz`'s reason
//!   in the response's `x-not-ready-reason` metadata;
//! - service `liveness`: SERVING while the process answers (the liveness
//!   and startup probes; as `/healthz`);
//! - any other name: NOT_FOUND (Watch: SERVICE_UNKNOWN, as the protocol
//!   says).
//!
//! Watch sends the status at once and again whenever it changes (looked at
//! every [`WATCH_EVERY`]), until the client goes.

use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::service::Service;

/// The service names that report readiness.
pub const READINESS_SERVICES: [&str; 3] =
    ["", "gnn.v1.Predictor", "inference.GRPCInferenceService"];
/// The service name that reports liveness.
pub const LIVENESS_SERVICE: &str = "liveness";
/// How often a Watch looks at the readiness.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The health service over the worker's state.
#[derive(Debug, Clone)]
pub struct HealthService {
    service: Service,
}

impl HealthService {
    pub fn server(service: Service) -> HealthServer<Self> {
        HealthServer::new(Self { service })
    }

    /// The status of `name`, and why it is not serving; `None` for a name
    /// this worker does not know.
    fn status(&self, name: &str) -> Option<(ServingStatus, Option<String>)> {
        if name == LIVENESS_SERVICE {
            return Some((ServingStatus::Serving, None));
        }
        if !READINESS_SERVICES.contains(&name) {
            return None;
        }
        Some(match self.service.readiness() {
            Ok(()) => (ServingStatus::Serving, None),
            Err(reason) => (ServingStatus::NotServing, Some(reason)),
        })
    }
}

fn unknown(name: &str) -> Status {
    Status::not_found(format!(
        "no health service {name:?}: ask \"\", \"gnn.v1.Predictor\" or \
         \"inference.GRPCInferenceService\" (readiness) or \"liveness\""
    ))
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let name = &request.get_ref().service;
        let (status, reason) = self.status(name).ok_or_else(|| unknown(name))?;
        let mut response = Response::new(HealthCheckResponse {
            status: status as i32,
        });
        if let Some(value) = reason.and_then(|r| r.parse().ok()) {
            response.metadata_mut().insert("x-not-ready-reason", value);
        }
        Ok(response)
    }

    type WatchStream = ReceiverStream<Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let name = request.into_inner().service;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let status = this
                    .status(&name)
                    .map_or(ServingStatus::ServiceUnknown, |(s, _)| s);
                if last != Some(status) {
                    let sent = tx
                        .send(Ok(HealthCheckResponse {
                            status: status as i32,
                        }))
                        .await;
                    if sent.is_err() {
                        return;
                    }
                    last = Some(status);
                }
                tokio::select! {
                    () = tokio::time::sleep(WATCH_EVERY) => {}
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
