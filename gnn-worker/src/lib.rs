//! The model worker: serves predictions to clients over gRPC and HTTP,
//! batches concurrent calls, submits target ids to the sidecar's ring, and
//! runs the ONNX model on the Arrow buffers in shared memory, in place.
//!
//! - [`model`]: the manifest, its checks against the segment and the
//!   session, loading the ONNX Runtime session, and running it on the
//!   response's buffers in place;
//! - [`onnxruntime`]: finding and loading the ONNX Runtime library;
//! - [`batcher`]: dynamic batching and the executor threads;
//! - [`rollout`]: loading the model, checking it against the sidecar, and
//!   switching to a new one without a restart;
//! - [`service`]: the worker as the front ends see it (readiness, calls);
//! - [`api`]: the doors, together: native gRPC and HTTP, the Open
//!   Inference Protocol's two (tritonclient, KServe), `grpc.health.v1`,
//!   TLS and the ports' connection handling;
//! - [`config`]: every setting of `gnn-worker serve`, its default and range;
//! - [`metrics`]: the worker's Prometheus registry.
//!
//! The model tooling (train, export, check, reference outputs; PyTorch)
//! is `gnn-worker/model/`: `sage.py` (the dense layout), `pyg_model.py`
//! (PyG models of one-type and typed graphs as exported), `common.py` (what
//! they share: the dataset reader and the sampler).
//!
//! **Architecture invariant:** depends on `protocol`, never on `sidecar`; no
//! RocksDB, no Redis here. No `unsafe`: the shared memory is reached through
//! `protocol`'s leases.
#![forbid(unsafe_code)]

pub mod api;
pub mod batcher;
pub mod config;
pub mod ladder;
pub mod metrics;
pub mod model;
pub mod onnx_graph;
pub mod onnxruntime;
pub mod precomputed;
pub mod queue;
pub mod rollout;
pub mod service;
