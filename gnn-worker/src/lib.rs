//! The model worker: serves predictions to clients over gRPC and HTTP,
//! batches concurrent calls, submits target ids to the sidecar's ring, and
//! runs the ONNX model on the Arrow buffers in shared memory, in place.
//!
//! - [`model`]: the manifest, its check against the segment, the ONNX
//!   Runtime session and the zero-copy input binding;
//! - [`onnxruntime`]: finding and loading the ONNX Runtime library;
//! - [`batcher`]: dynamic batching and the executor threads;
//! - [`rollout`]: loading the model, checking it against the sidecar, and
//!   switching to a new one without a restart;
//! - [`service`]: the worker as the front ends see it (readiness, calls);
//! - [`grpc`], [`http`]: the client APIs; [`v2`]: the Open Inference
//!   Protocol beside them (tritonclient, KServe); [`health`]: `grpc.health.v1`
//!   (readiness and liveness for native gRPC probes) beside gRPC server
//!   reflection on the gRPC port; [`tls`]: TLS and mutual TLS on both;
//! - [`config`]: every setting of `gnn-worker serve`, its default and range;
//! - [`metrics`]: the worker's Prometheus registry.
//!
//! The model tooling (train, export, reference outputs) is
//! `gnn-worker/model/sage.py`.
//!
//! **Architecture invariant:** depends on `protocol`, never on `sidecar`; no
//! RocksDB, no Redis here. No `unsafe`: the shared memory is reached through
//! `protocol`'s leases.
#![forbid(unsafe_code)]

pub mod batcher;
pub mod config;
pub mod grpc;
pub mod grpc_connections;
pub mod health;
pub mod http;
pub mod http_server;
pub mod ladder;
pub mod metrics;
pub mod model;
pub mod onnx_graph;
pub mod onnxruntime;
pub mod precomputed;
pub mod queue;
pub mod rollout;
pub mod service;
pub mod tls;
pub mod v2;
