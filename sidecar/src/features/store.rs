//! The seams between the fetch path ([`crate::features::tiers`]) and the
//! stores under L1, in the manner of TiKV's engine traits: the tiers reach
//! L2 through [`LocalStore`] and L3 through [`RemoteStore`], so that a
//! store can be swapped, or faked in a unit test without RocksDB or Redis.
//! This module depends on neither.
//!
//! Implementations: [`crate::features::rocks::RocksStore`] (L2, the
//! embedded store of record or the cache in front of Redis) and
//! [`crate::features::redis_tier::RedisTier`] (L3, Redis or Redis Cluster).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

/// What an L2 store is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Rows live here (no Redis): never flushed, never written back to.
    StoreOfRecord,
    /// A cache in front of Redis: rows fetched from L3 are written back,
    /// within `max_bytes`, served for `ttl`.
    Cache { max_bytes: u64, ttl: Duration },
}

/// A local row store under L1 (L2). Its calls block: the tiers run them on
/// blocking threads, never on the async runtime's workers.
pub trait LocalStore: Send + Sync + std::fmt::Debug {
    fn role(&self) -> Role;

    /// Where it lives (for logs and `Debug`).
    fn path(&self) -> &Path;

    /// The raw values of `ids`, in order: `None` for a row it does not
    /// have, or one that is not `row_bytes` long.
    fn get_many(&self, ids: &[u64], row_bytes: usize) -> Vec<Option<Vec<u8>>>;

    /// Writes rows (a cache's write-back of L3 rows).
    fn put_rows(&self, rows: &[(u64, Vec<u8>)]) -> anyhow::Result<()>;

    /// Deletes rows (an invalidation of a cache's rows).
    fn delete_many(&self, ids: &[u64]) -> anyhow::Result<()>;

    /// Deletes every row (`sidecarctl cache flush --l2`).
    fn clear(&self) -> anyhow::Result<()>;

    /// Values it held of the wrong length (served as misses), since it
    /// was opened.
    fn malformed_rows(&self) -> u64 {
        0
    }

    /// Whether its disk is full (writes then fail, and are not logged
    /// again by the tiers: the store alarms once).
    fn disk_full(&self) -> bool;
}

/// The raw values of a remote fetch, in order (`None`: no such key).
pub type RemoteRows = anyhow::Result<Vec<Option<Vec<u8>>>>;

/// A remote row store (L3): many rows in one round trip.
pub trait RemoteStore: Send + Sync + std::fmt::Debug {
    /// How it is named in logs (a URL without its password).
    fn shown(&self) -> &str;

    /// The raw values of `ids`, in order, in as few round trips as it can.
    fn get_many<'a>(
        &'a self,
        ids: &'a [u64],
    ) -> Pin<Box<dyn Future<Output = RemoteRows> + Send + 'a>>;
}
