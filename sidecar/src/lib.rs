//! The sidecar daemon: owns the shared-memory ring (through `protocol`), the
//! local graph index, the feature tiers and the Redis connections, and answers
//! the worker's requests in place.
//!
//! - [`graph`]: the CSR index (build, map, verify) and the sampler;
//! - [`features`]: the feature tiers (L1 RAM, L2 RocksDB, L3 Redis);
//! - [`daemon`]: the state `serve` and `admin` share, below both: phase,
//!   knobs, readiness latches, the control loop's events, the registry in
//!   which every subsystem registers its own telemetry;
//! - [`serve`]: `sidecar serve`: loading, the serving threads and the
//!   control loop;
//! - [`admin`]: the admin socket and its wire format (`sidecarctl`);
//! - [`config`]: every setting of `sidecar serve`, its default and range;
//! - [`data_dir`]: the lock that keeps one sidecar per data directory;
//! - [`updates`]: the update log every replica follows (a Redis Stream),
//!   and `sidecar publish`.
//!
//! **Architecture invariant:** depends on `protocol`, never on `gnn-worker`;
//! no ONNX Runtime here. `unsafe` is denied except where a file is memory
//! mapped (`graph::index`, `graph::build`).
#![deny(unsafe_code)]

pub mod admin;
pub mod config;
pub mod daemon;
pub mod data_dir;
pub mod features;
pub mod graph;
pub mod serve;
pub mod updates;
