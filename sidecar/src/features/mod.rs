//! The feature tiers: where a node's feature row comes from.
//!
//! - [`contract`]: how rows are keyed and encoded in Redis and RocksDB;
//! - [`rocks`]: L2, RocksDB (store of record without Redis, cache with it);
//! - [`redis_tier`]: L3, Redis or Redis Cluster, one MGET per batch;
//! - [`l1`]: L1, the pinned hot set and the byte-bounded cache;
//! - [`store`]: the traits the tiers reach L2 and L3 through (a seam for
//!   other stores and for fakes in unit tests);
//! - [`tiers`]: the fetch path through the tiers, with coalescing,
//!   deadlines and fallback rows;
//! - [`import`]: loading a dataset's rows into RocksDB or Redis;
//! - [`invalidation`]: the pub/sub channel that evicts changed rows.

pub mod contract;
pub mod import;
pub mod invalidation;
pub mod l1;
pub mod redis_tier;
pub mod rocks;
pub mod store;
pub mod tiers;

pub use tiers::{DefaultRow, FeatureTiers, RowSource, TierConfig, TierStats};
