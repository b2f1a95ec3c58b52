//! The seams between the fetch path ([`crate::features::tiers`]) and the
//! stores under L1, in the manner of TiKV's engine traits: the tiers reach
//! L2 through [`LocalStore`] and L3 through [`RemoteStore`], so that a
//! store can be swapped, or faked in a unit test without RocksDB or Redis.
//! This module depends on neither.
//!
//! Implementations: [`crate::features::rocks::RocksStore`] (L2, the
//! embedded store of record or the cache in front of Redis) and
//! [`crate::features::redis_tier::RedisTier`] (L3, Redis or Redis Cluster).
//! [`conformance`] is the contract as one suite, run against every
//! implementation: the real ones in `sidecar/tests/stores.rs`, the fetch
//! path's fakes in its unit tests.

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

    /// Deletes every row of a cache (`sidecarctl cache flush --l2`); a
    /// store of record is never cleared: an error, and its rows stay.
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

/// The stores' contract as checks any implementation must pass (TiKV's
/// habit: one suite, every engine). Each panics naming what does not hold.
pub mod conformance {
    use super::{LocalStore, RemoteStore, Role};

    const ROW_BYTES: usize = 16;

    fn row(id: u64, version: u8) -> Vec<u8> {
        (0..ROW_BYTES as u8)
            .map(|i| (id as u8).wrapping_mul(31) ^ i ^ version)
            .collect()
    }

    /// An empty local store: rows written are read back in the order
    /// asked, a value of the wrong length and an absent row are `None`, a
    /// write replaces, a delete removes only its rows, and `clear` empties
    /// a cache but is refused by a store of record (whose rows stay).
    pub fn local_store(store: &dyn LocalStore) {
        let name = store.path().display().to_string();
        assert_eq!(
            store.get_many(&[1, 2, 3], ROW_BYTES),
            [None, None, None],
            "{name}: a new store holds rows"
        );
        store
            .put_rows(&[(1, row(1, 0)), (2, row(2, 0)), (7, vec![1, 2, 3])])
            .unwrap_or_else(|e| panic!("{name}: put_rows: {e:#}"));
        assert_eq!(
            store.get_many(&[2, 1, 7, 9], ROW_BYTES),
            [Some(row(2, 0)), Some(row(1, 0)), None, None],
            "{name}: rows in the order asked; wrong length and absent are None"
        );
        store.put_rows(&[(1, row(1, 1))]).unwrap();
        assert_eq!(
            store.get_many(&[1], ROW_BYTES),
            [Some(row(1, 1))],
            "{name}: a write replaces"
        );
        store.delete_many(&[1, 5]).unwrap();
        assert_eq!(
            store.get_many(&[1, 2], ROW_BYTES),
            [None, Some(row(2, 0))],
            "{name}: a delete removes its rows only"
        );
        let many: Vec<(u64, Vec<u8>)> = (100..5_100).map(|id| (id, row(id, 2))).collect();
        store.put_rows(&many).unwrap();
        let ids: Vec<u64> = (100..5_100).rev().collect();
        let got = store.get_many(&ids, ROW_BYTES);
        assert!(
            got.iter()
                .zip(&ids)
                .all(|(r, &id)| r.as_ref() == Some(&row(id, 2))),
            "{name}: 5,000 rows in one call, in the order asked"
        );
        assert!(!store.disk_full(), "{name}: a fresh store's disk is full");
        match store.role() {
            Role::StoreOfRecord => {
                assert!(
                    store.clear().is_err(),
                    "{name}: a store of record was cleared"
                );
                assert_eq!(store.get_many(&[2], ROW_BYTES), [Some(row(2, 0))]);
            }
            Role::Cache { .. } => {
                store.clear().unwrap();
                assert_eq!(
                    store.get_many(&[2, 100, 5_099], ROW_BYTES),
                    [None, None, None],
                    "{name}: a cleared cache holds rows"
                );
            }
        }
    }

    /// The rows [`remote_store`] expects the remote store to hold (ids
    /// 1..=3,000 but every 7th, and id 3,001 with a value of 3 bytes).
    pub fn remote_rows() -> Vec<(u64, Vec<u8>)> {
        (1..=3_000u64)
            .filter(|id| id % 7 != 0)
            .map(|id| (id, row(id, 3)))
            .chain(std::iter::once((3_001, vec![9, 9, 9])))
            .collect()
    }

    /// A remote store seeded with [`remote_rows`]: one call for many ids
    /// answers each id's raw value (whatever its length: the tiers judge
    /// it) in the order asked, and `None` for a key it does not have.
    pub async fn remote_store(store: &dyn RemoteStore) {
        let name = store.shown().to_string();
        let ids: Vec<u64> = (0..=3_002u64).rev().collect();
        let got = store
            .get_many(&ids)
            .await
            .unwrap_or_else(|e| panic!("{name}: get_many: {e:#}"));
        assert_eq!(got.len(), ids.len(), "{name}: one answer per id");
        for (value, &id) in got.iter().zip(&ids) {
            let want = match id {
                3_001 => Some(vec![9, 9, 9]),
                0 | 3_002 => None,
                id if id % 7 == 0 => None,
                id => Some(row(id, 3)),
            };
            assert_eq!(value, &want, "{name}: node {id}");
        }
        let none = store.get_many(&[]).await.unwrap();
        assert!(none.is_empty(), "{name}: no ids, no answers");
    }
}
