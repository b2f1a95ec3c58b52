//! The sidecar daemon: owns the shared-memory ring (through `protocol`), the
//! local graph index, the feature tiers and the Redis connections, and answers
//! the worker's requests in place.
//!
//! - [`graph`]: the CSR index (build, map, verify) and the sampler.
//!
//! The feature tiers and `sidecar serve` arrive with the issues that build
//! them.
//!
//! **Architecture invariant:** depends on `protocol`, never on `gnn-worker`;
//! no ONNX Runtime here. `unsafe` is denied except where a file is memory
//! mapped (`graph::index`, `graph::build`).
#![deny(unsafe_code)]

pub mod graph;
