//! The sidecar daemon: owns the shared-memory ring (through `protocol`), the
//! local graph index, the feature tiers and the Redis connections, and answers
//! the worker's requests in place.
//!
//! What exists so far is the ring contract it serves (`protocol::server`);
//! the graph index, the feature tiers, `sidecar import` and `sidecar serve`
//! arrive with the issues that build them.
//!
//! **Architecture invariant:** depends on `protocol`, never on `gnn-worker`;
//! no ONNX Runtime here.
#![forbid(unsafe_code)]
