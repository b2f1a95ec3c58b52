//! What both daemons (`sidecar serve`, `gnn-worker serve`) share and the ring
//! contract does not:
//!
//! - [`cli`]: command lines whose values may be negative numbers;
//! - [`config`]: layered configuration, defaults < TOML file < environment
//!   < flags, merged by figment, with errors that name the key, where its
//!   value came from (file:line, variable or flag) and the fix;
//! - [`logging`]: tracing to stderr as text or JSON, with a level that can
//!   be changed while running;
//! - [`metrics`]: reading back the OpenMetrics text a daemon's registry
//!   encodes (percentiles for `sidecarctl stats`, the documented-metric
//!   check);
//! - [`row`]: a feature row given on a command line;
//! - [`redact`]: a Redis URL's password kept out of logs, errors and
//!   `--print-config`;
//! - [`startup`]: both daemons' `serve` start-up: configuration,
//!   `--print-config`, logging, signals.
//!
//! **Architecture invariant:** no ring, no I/O runtime, no RocksDB, Redis
//! or ONNX Runtime: both daemons link it, and neither learns anything of the
//! other through it.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod logging;
pub mod metrics;
pub mod redact;
pub mod row;
pub mod startup;
