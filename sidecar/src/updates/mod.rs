//! The update log: a Redis Stream every replica follows (docs/updates.md).
//!
//! - [`entry`]: the contract of an entry, parsed and checked whole;
//! - [`typed_entry`]: the entries of a typed graph (node and edge types);
//! - [`follower`]: reads the stream from this replica's position and
//!   applies it to the store, the caches and the graph;
//! - [`publish`]: `sidecar publish`, the command-line producer.

pub mod entry;
pub mod follower;
pub mod publish;
pub mod typed_entry;

/// The stream's default key.
pub const DEFAULT_STREAM: &str = "gnn:updates";
