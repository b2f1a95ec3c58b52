//! The update log: a Redis Stream every replica follows (docs/updates.md).
//!
//! - [`entry`]: the contract of an entry, parsed and checked whole;
//! - [`follower`]: reads the stream from this replica's position and
//!   applies it to the store, the caches and the graph;
//! - [`publish`]: `sidecar publish`, the command-line producer.

pub mod entry;
pub mod follower;
pub mod publish;

/// The stream's default key.
pub const DEFAULT_STREAM: &str = "gnn:updates";
