//! The gRPC API (proto/predictor.proto): unary `Predict` and bidirectional
//! `PredictStream`, both through the batcher. A call made while the worker
//! is not ready (no sidecar yet, sidecar gone or draining) is answered
//! UNAVAILABLE with the reason.

use std::pin::Pin;

use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::batcher::{PredictError, Prediction};
use crate::service::{Call, NewNodeCall, Service};

/// Generated types of `gnn.v1`.
#[allow(clippy::all, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("gnn.v1");
}

/// The encoded descriptors of `gnn.v1`, served by gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("gnn_descriptor");

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
        ..Default::default()
    }
}

/// What tonic's codec and server say, as INTERNAL, when a request's bytes
/// are not a message: the client's mistake, not the worker's (and INTERNAL
/// is documented as retryable).
const UNDECODABLE: [&str; 5] = [
    // The protobuf bytes do not decode.
    "failed to decode Protobuf message",
    // The body ends inside a message's frame.
    "Unexpected EOF decoding stream",
    // An empty body where a unary call's one message should be.
    "Missing request message",
    // A compressed flag without `grpc-encoding`, or another flag value.
    "protocol error: received message with",
    "Error decompressing",
];

/// Whether an INTERNAL status of tonic's says the request was undecodable.
fn is_undecodable(code: tonic::Code, message: &str) -> bool {
    code == tonic::Code::Internal && UNDECODABLE.iter().any(|m| message.contains(m))
}

/// A unary call whose message could not be decoded gets INVALID_ARGUMENT
/// instead of the INTERNAL that tonic's codec reports, and one over the
/// message size limit RESOURCE_EXHAUSTED (gRPC's code for it) instead of
/// tonic's OUT_OF_RANGE (the status of such an early failure is in the
/// response headers: a trailers-only response).
pub fn invalid_argument_for_undecodable<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let headers = response.headers_mut();
    let code = headers.get("grpc-status").map(|c| c.as_bytes().to_vec());
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(percent_decoded);
    let remapped = match (code.as_deref(), message) {
        (Some(b"13"), Some(m)) if is_undecodable(tonic::Code::Internal, &m) => Some("3"),
        (Some(b"11"), Some(m)) if m.contains("message length too large") => Some("8"),
        _ => None,
    };
    if let Some(code) = remapped {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static(code),
        );
    }
    response
}

/// `grpc-message` as sent: percent-encoded (gRPC's HTTP/2 mapping).
fn percent_decoded(message: &str) -> String {
    let bytes = message.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A message that could not be decoded is the client's mistake:
/// INVALID_ARGUMENT, not the INTERNAL that the codec reports.
pub fn malformed(status: Status) -> Status {
    if is_undecodable(status.code(), status.message()) {
        Status::invalid_argument(format!(
            "the request is not a valid gnn.v1.PredictRequest ({}): check the client's \
             generated code against gnn-worker/proto/predictor.proto",
            status.message()
        ))
    } else {
        status
    }
}

pub(crate) fn to_status(e: PredictError) -> Status {
    match e {
        PredictError::InvalidArgument(m) => Status::invalid_argument(m),
        PredictError::Unavailable(m) => Status::unavailable(m),
        PredictError::Internal(m) => Status::internal(m),
        PredictError::Overloaded(m) => Status::resource_exhausted(m),
        PredictError::DeadlineExceeded(m) => Status::deadline_exceeded(m),
    }
}

fn to_pb(p: Prediction) -> pb::Prediction {
    let degraded = p.degraded();
    pb::Prediction {
        node_id: p.node_id,
        label: p.label,
        logits: p.logits,
        embedding: p.embedding,
        known: p.known,
        fallback_rows: p.fallback_rows,
        answered_by: p.answered_by.as_str().to_string(),
        degraded,
    }
}

/// `left`: the time before the call's deadline (its `grpc-timeout`).
async fn answer(
    service: &Service,
    request: pb::PredictRequest,
    left: Option<std::time::Duration>,
) -> Result<pb::PredictResponse, Status> {
    let new_node = match request.new_node {
        None => None,
        Some(node) => {
            if let Some(list) = node.edges.iter().find(|l| l.src.len() != l.dst.len()) {
                return Err(to_status(PredictError::InvalidArgument(format!(
                    "the new node's edges of {}: {} src and {} dst ids; give them in pairs",
                    list.edge_type,
                    list.src.len(),
                    list.dst.len()
                ))));
            }
            // A NewNode without edge lists is a one-type graph's.
            let edges = (!node.edges.is_empty()).then(|| {
                node.edges
                    .into_iter()
                    .map(|l| (l.edge_type, l.src.into_iter().zip(l.dst).collect()))
                    .collect()
            });
            Some(NewNodeCall {
                id: node.id,
                features: node.features,
                neighbors: node.neighbors,
                directed: node.directed,
                edges,
            })
        }
    };
    let call = Call::of(request.node_ids, new_node).map_err(to_status)?;
    let answer = service.call(call, left).await.map_err(to_status)?;
    Ok(pb::PredictResponse {
        predictions: answer.predictions.into_iter().map(to_pb).collect(),
        request_id: request.request_id,
        error: None,
        model: answer.model.name.clone(),
        model_sha256: answer.model.sha256.clone(),
    })
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<pb::PredictResponse, Status>> + Send>>;

/// A stream's requests answered at once, at most (their answers go out in
/// request order).
const STREAM_IN_FLIGHT: usize = 256;

/// Memory a stream's requests read ahead of their answers may hold, at
/// most ([`held_bytes`] each).
/// Reading a burst off the connection at once keeps HTTP/2's budget of
/// buffered small DATA frames from running out (it closes the connection
/// with ENHANCE_YOUR_CALM "too_many_data_frames" when a peer's unread
/// frames cost too much), while this bound keeps the memory a stream holds
/// bounded: past it, reading waits, and a real flood meets that protection.
const STREAM_READ_AHEAD_BYTES: usize = 64 << 20;

/// Answers a `PredictStream`: reads requests as they come (up to
/// [`STREAM_READ_AHEAD_BYTES`] ahead), answers up to [`STREAM_IN_FLIGHT`]
/// of them at once through the batcher, and sends the answers in request
/// order. A failed request is answered in band and the stream goes on;
/// bytes that are not a message end it, after the answers before them.
async fn drive_stream(
    service: Service,
    mut incoming: Streaming<pb::PredictRequest>,
    tx: tokio::sync::mpsc::Sender<Result<pb::PredictResponse, Status>>,
) {
    use futures_util::stream::{FuturesOrdered, StreamExt};
    let mut waiting: std::collections::VecDeque<(pb::PredictRequest, usize)> = Default::default();
    let mut waiting_bytes = 0usize;
    let mut running = FuturesOrdered::new();
    let mut reading = true;
    let mut end: Option<Status> = None;
    // An answer taken from `running` that the response channel has no room
    // for yet: reading goes on meanwhile (a client that writes its whole
    // burst before it reads an answer must not stall its own reading, or
    // its unread small frames would meet HTTP/2's flood protection).
    let mut ready: Option<pb::PredictResponse> = None;
    loop {
        while running.len() < STREAM_IN_FLIGHT {
            let Some((request, bytes)) = waiting.pop_front() else {
                break;
            };
            waiting_bytes -= bytes;
            running.push_back(answer_in_band(service.clone(), request));
        }
        if !reading && ready.is_none() && waiting.is_empty() && running.is_empty() {
            if let Some(status) = end {
                let _ = tx.send(Err(status)).await;
            }
            return;
        }
        // Unbiased: neither answering nor reading starves the other.
        tokio::select! {
            permit = tx.reserve(), if ready.is_some() => match permit {
                Ok(permit) => permit.send(Ok(ready.take().expect("guarded"))),
                // The client is gone.
                Err(_) => return,
            },
            Some(answer) = running.next(), if ready.is_none() && !running.is_empty() => {
                ready = Some(answer);
            }
            message = incoming.message(), if reading && waiting_bytes < STREAM_READ_AHEAD_BYTES => {
                match message {
                    Ok(Some(request)) => {
                        let bytes = held_bytes(&request);
                        waiting_bytes += bytes;
                        waiting.push_back((request, bytes));
                    }
                    Ok(None) => reading = false,
                    // Bytes that are not a message: the decoder cannot find
                    // the next one reliably, so the stream ends here.
                    Err(status) => {
                        reading = false;
                        end = Some(malformed(status));
                    }
                }
            }
        }
    }
}

/// What a request read ahead holds in memory, at most: the message and its
/// decoded fields (a varint id of one byte on the wire is eight in memory),
/// so that a flood of tiny requests is bounded as a burst of large ones.
fn held_bytes(request: &pb::PredictRequest) -> usize {
    std::mem::size_of::<pb::PredictRequest>() + 8 * prost::Message::encoded_len(request)
}

/// One stream request's answer: its predictions, or its error in band. A
/// stream's deadline is the whole stream's, not one request's: the ladder
/// is not consulted.
async fn answer_in_band(service: Service, request: pb::PredictRequest) -> pb::PredictResponse {
    let request_id = request.request_id;
    match answer(&service, request, None).await {
        Ok(response) => response,
        Err(status) => error_response(request_id, &status),
    }
}

#[tonic::async_trait]
impl pb::predictor_server::Predictor for PredictService {
    async fn predict(
        &self,
        request: Request<pb::PredictRequest>,
    ) -> Result<Response<pb::PredictResponse>, Status> {
        use tracing::Instrument;
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(crate::ladder::parse_grpc_timeout);
        let left = crate::api::grpc_connections::time_left(request.extensions(), timeout);
        let span = crate::service::call_span(
            "gnn.v1.Predictor/Predict",
            request
                .metadata()
                .get("traceparent")
                .and_then(|v| v.to_str().ok()),
        );
        answer(&self.service, request.into_inner(), left)
            .instrument(span)
            .await
            .map(Response::new)
    }

    type PredictStreamStream = ResponseStream;

    async fn predict_stream(
        &self,
        request: Request<Streaming<pb::PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        let incoming = request.into_inner();
        let service = self.service.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_IN_FLIGHT);
        // The driver reads the stream while its calls run: they go through
        // the pipeline, never run to completion on its thread.
        tokio::spawn(crate::batcher::through_the_pipeline(drive_stream(
            service, incoming, tx,
        )));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
