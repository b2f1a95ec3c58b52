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

/// A stream's answer to a request that failed: the status in band.
fn error_response(request_id: u64, status: &Status) -> pb::PredictResponse {
    pb::PredictResponse {
        predictions: Vec::new(),
        request_id,
        error: Some(pb::Error {
            code: status.code() as i32,
            message: status.message().to_string(),
        }),
    }
}

/// A unary call whose message could not be decoded gets INVALID_ARGUMENT
/// instead of the INTERNAL that tonic's codec reports (the status of such an
/// early failure is in the response headers: a trailers-only response).
pub fn invalid_argument_for_undecodable<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let headers = response.headers_mut();
    let internal = headers
        .get("grpc-status")
        .is_some_and(|code| code.as_bytes() == b"13");
    let undecodable = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| m.contains("decode"));
    if internal && undecodable {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("3"),
        );
    }
    response
}

/// A message that could not be decoded is the client's mistake:
/// INVALID_ARGUMENT, not the INTERNAL that the codec reports.
pub fn malformed(status: Status) -> Status {
    if status.code() == tonic::Code::Internal && status.message().contains("decode") {
        Status::invalid_argument(format!(
            "the request is not a valid gnn.v1.PredictRequest ({}): check the client's \
             generated code against gnn-worker/proto/predictor.proto",
            status.message()
        ))
    } else {
        status
    }
}

fn to_status(e: PredictError) -> Status {
    match e {
        PredictError::InvalidArgument(m) => Status::invalid_argument(m),
        PredictError::Unavailable(m) => Status::unavailable(m),
        PredictError::Internal(m) => Status::internal(m),
        PredictError::Overloaded(m) => Status::resource_exhausted(m),
    }
}

fn to_pb(p: Prediction) -> pb::Prediction {
    pb::Prediction {
        node_id: p.node_id,
        label: p.label,
        logits: p.logits,
        embedding: p.embedding,
        known: p.known,
        fallback_rows: p.fallback_rows,
        answered_by: p.answered_by.as_str().to_string(),
    }
}

/// `left`: the time before the call's deadline (its `grpc-timeout`).
async fn answer(
    service: &Service,
    request: pb::PredictRequest,
    left: Option<std::time::Duration>,
) -> Result<pb::PredictResponse, Status> {
    let predictions = match request.new_node {
        None => service.predict(request.node_ids, left).await,
        Some(_) if !request.node_ids.is_empty() => Err(PredictError::InvalidArgument(
            "a PredictRequest sets node_ids or new_node, not both: send the known nodes in a \
             request of their own"
                .into(),
        )),
        Some(node) => {
            let new_node = protocol::request::NewNode {
                features: node.features,
                neighbors: node.neighbors,
                directed: node.directed,
            };
            service.predict_new_node(node.id, new_node, left).await
        }
    }
    .map_err(to_status)?;
    Ok(pb::PredictResponse {
        predictions: predictions.into_iter().map(to_pb).collect(),
        request_id: request.request_id,
        error: None,
    })
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<pb::PredictResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::predictor_server::Predictor for PredictService {
    async fn predict(
        &self,
        request: Request<pb::PredictRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        let left = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(crate::ladder::parse_grpc_timeout);
        answer(&self.service, request.into_inner(), left)
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
                    Ok(Some(request)) => {
                        let request_id = request.request_id;
                        // A stream's deadline is the whole stream's, not
                        // one request's: the ladder is not consulted.
                        match answer(&service, request, None).await {
                            Ok(response) => Ok(response),
                            Err(status) => Ok(error_response(request_id, &status)),
                        }
                    }
                    Ok(None) => return,
                    // Bytes that are not a message: the decoder cannot find
                    // the next one reliably, so the stream ends here.
                    Err(status) => Err(malformed(status)),
                };
                let ended = next.is_err();
                if tx.send(next).await.is_err() || ended {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
