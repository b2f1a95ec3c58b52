//! What both daemons (`sidecar serve`, `gnn-worker serve`) share and the ring
//! contract does not:
//!
//! - [`cli`]: command lines whose values may be negative numbers;
//! - [`config`]: layered configuration, defaults < TOML file < environment
//!   < flags, merged by figment, with errors that name the key, where its
//!   value came from (file:line, variable or flag) and the fix;
//! - [`logging`]: tracing to stderr as text or JSON, with a level that can
//!   be changed while running;
//! - [`endpoint`]: `/metrics`, `/healthz` and `/readyz`, the same on both;
//! - [`metrics`]: the registry's encoder, a histogram whose buckets can be
//!   read back, and the [`metrics::Telemetry`] seam through which each
//!   subsystem reports a snapshot of its own state;
//! - [`readiness`]: readiness as latches every subsystem must release;
//! - [`row`]: a feature row given on a command line;
//! - [`redact`]: a Redis URL's password kept out of logs, errors and
//!   `--print-config`;
//! - [`startup`]: both daemons' `serve` start-up: configuration,
//!   `--print-config`, logging, signals.
//!
//! **Architecture invariant:** no ring, no I/O runtime of its own (the
//! endpoint runs on the daemon's), no RocksDB, Redis
//! or ONNX Runtime: both daemons link it, and neither learns anything of the
//! other through it.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod endpoint;
pub mod logging;
pub mod metrics;
pub mod readiness;
pub mod redact;
pub mod row;
pub mod startup;
pub mod traces;
