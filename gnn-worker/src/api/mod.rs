//! The worker's doors, together: each turns its requests into one
//! [`crate::service::Call`] and its call errors into a status through one
//! table ([`crate::batcher::PredictError::http_status`] for HTTP,
//! [`grpc::to_status`] for gRPC); nothing here validates a call beyond
//! decoding it.
//!
//! - [`grpc`], [`http`]: the native client APIs (`gnn.v1.Predictor`, and
//!   `/v1/...` JSON); [`v2`]: the Open Inference Protocol beside them
//!   (tritonclient, KServe), over gRPC and HTTP;
//! - [`health`]: `grpc.health.v1` (readiness and liveness for native gRPC
//!   probes) beside gRPC server reflection on the gRPC port;
//! - [`grpc_connections`], [`http_server`]: the two ports' connection
//!   handling (handshake and read timeouts, limits); [`tls`]: TLS and
//!   mutual TLS on both.

pub mod grpc;
pub mod grpc_connections;
pub mod health;
pub mod http;
pub mod http_server;
pub mod tls;
pub mod v2;
