//! The gRPC API (proto/predictor.proto): unary `Predict` and bidirectional
//! `PredictStream`, both through the batcher. A call made while the worker
//! is not ready (no sidecar yet, sidecar gone or draining) is answered
//! UNAVAILABLE with the reason.

use std::pin::Pin;

use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::batcher::{PredictError, Prediction};
use crate::service::Service;

/// Generated types of `gnn.v1`.
#[allow(clippy::all, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("gnn.v1");
}

pub use pb::predictor_client::PredictorClient;
pub use pb::predictor_server::PredictorServer;

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct PredictService {
    service: Service,
}

impl PredictService {
    pub fn new(service: Service) -> Self {
        Self { service }
    }
}

fn to_status(e: PredictError) -> Status {
    match e {
        PredictError::InvalidArgument(m) => Status::invalid_argument(m),
        PredictError::Unavailable(m) => Status::unavailable(m),
        PredictError::Internal(m) => Status::internal(m),
    }
}

fn to_pb(p: Prediction) -> pb::Prediction {
    pb::Prediction {
        node_id: p.node_id,
        label: p.label,
        logits: p.logits,
        known: p.known,
        fallback_rows: p.fallback_rows,
    }
}

async fn answer(
    service: &Service,
    request: pb::PredictRequest,
) -> Result<pb::PredictResponse, Status> {
    let predictions = service.predict(request.node_ids).await.map_err(to_status)?;
    Ok(pb::PredictResponse {
        predictions: predictions.into_iter().map(to_pb).collect(),
        request_id: request.request_id,
    })
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<pb::PredictResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::predictor_server::Predictor for PredictService {
    async fn predict(
        &self,
        request: Request<pb::PredictRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        answer(&self.service, request.into_inner())
            .await
            .map(Response::new)
    }

    type PredictStreamStream = ResponseStream;

    async fn predict_stream(
        &self,
        request: Request<Streaming<pb::PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        let mut incoming = request.into_inner();
        let service = self.service.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let next = match incoming.message().await {
                    Ok(Some(request)) => answer(&service, request).await,
                    Ok(None) => return,
                    Err(status) => Err(status),
                };
                let failed = next.is_err();
                if tx.send(next).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
