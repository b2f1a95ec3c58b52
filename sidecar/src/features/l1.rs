//! L1: feature rows in process memory.
//!
//! Two parts:
//! - the **pinned hot set** ([`Pinned`]): rows loaded at warm-up (the
//!   top-degree nodes) in one contiguous table, never evicted, replaced as a
//!   whole (behind an `ArcSwap`) only by a warm-up or an invalidation;
//! - the **cache** ([`L1Cache`]): bounded in bytes, with quick_cache's
//!   scan-resistant eviction (CLOCK-Pro style: a one-off scan of cold rows
//!   does not push out the rows that are read again and again).
//!
//! The cache is quick_cache's single-threaded cache in [`SHARDS`] shards,
//! each behind a reader-writer lock. A batch takes every shard's read lock
//! once and then looks up all its rows, copying each straight from the cache
//! into the response: per row that is a hash probe and a copy, with no lock
//! and no reference count touched (quick_cache's own concurrent cache locks
//! a shard and clones the value per row, which made a warm batch cost twice
//! as much). Lookups through `&self` are safe under a read lock: quick_cache
//! records a hit with a relaxed atomic. Inserts and removals take one
//! shard's write lock at a time.
//!
//! Invalidation race: [`L1Cache::insert_many`] checks the caller's epoch
//! under each shard's write lock, and the invalidation bumps the epoch
//! before it takes the same locks to remove, so a row fetched before an
//! invalidation is either removed by it or never inserted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use quick_cache::unsync::{Cache, DefaultLifecycle};
use quick_cache::Weighter;
use rustc_hash::{FxBuildHasher, FxHashMap};

/// Shards of the L1 cache (a power of two).
pub const SHARDS: usize = 16;

/// Bytes charged per cached row beyond its data (key, slot, allocation).
const ROW_OVERHEAD: u64 = 48;

#[derive(Clone)]
struct RowWeighter;

impl Weighter<u64, Box<[f32]>> for RowWeighter {
    fn weight(&self, _key: &u64, row: &Box<[f32]>) -> u64 {
        row.len() as u64 * 4 + ROW_OVERHEAD
    }
}

type Shard = Cache<u64, Box<[f32]>, RowWeighter, FxBuildHasher, DefaultLifecycle<u64, Box<[f32]>>>;

fn shard_of(id: u64) -> usize {
    // The top bits of a multiplicative hash: consecutive ids spread out.
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros())) as usize
}

/// The pinned hot set: rows that are never evicted.
///
/// An id's row is found in an id-indexed table while the ids are dense
/// (the warm-up pins the top-degree nodes of a graph whose ids run from 0:
/// with every node pinned, one load and no hash per row; the hash lookup
/// was an eighth of the sidecar's time at 8 targets a request,
/// docs/serving.md), and in a hash map past it. The table covers ids
/// below four slots per pinned row (at least [`DENSE_MIN`]), so it never
/// holds more than 16 bytes per pinned row beyond that minimum.
#[derive(Debug, Default)]
pub struct Pinned {
    dim: usize,
    /// The row of each id below its length; [`NOT_PINNED`] where none.
    dense: Vec<u32>,
    /// The row of each pinned id at or past `dense.len()`.
    sparse: FxHashMap<u64, u32>,
    rows: Vec<f32>,
    len: usize,
}

/// Ids the dense table may always cover (256 KiB of slots).
const DENSE_MIN: usize = 1 << 16;

/// A dense slot without a row.
const NOT_PINNED: u32 = u32::MAX;

impl Pinned {
    /// An empty set of rows of `dim` values.
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            ..Self::default()
        }
    }

    /// The row index of `id`, if pinned.
    #[inline]
    fn slot(&self, id: u64) -> Option<u32> {
        match self.dense.get(id as usize) {
            Some(&NOT_PINNED) => None,
            Some(&idx) => Some(idx),
            None => self.sparse.get(&id).copied(),
        }
    }

    /// Adds (or replaces) the row of `id`.
    pub fn insert(&mut self, id: u64, row: &[f32]) {
        assert_eq!(row.len(), self.dim, "pinned row has the feature dim");
        if let Some(idx) = self.slot(id) {
            self.row_mut(idx).copy_from_slice(row);
            return;
        }
        let idx = u32::try_from(self.len)
            .ok()
            .filter(|&i| i != NOT_PINNED)
            .expect("fewer than 2^32 - 1 pinned rows");
        self.rows.extend_from_slice(row);
        self.len += 1;
        let limit = (4 * self.len).max(DENSE_MIN);
        match usize::try_from(id) {
            Ok(at) if at < limit => {
                if at >= self.dense.len() {
                    self.grow_dense((at + 1).max(2 * self.dense.len()).min(limit));
                }
                self.dense[at] = idx;
            }
            _ => {
                self.sparse.insert(id, idx);
            }
        }
    }

    /// Extends the dense table to `len` slots, moving the sparse ids it
    /// now covers into it (every pinned id below its length is in it).
    fn grow_dense(&mut self, len: usize) {
        self.dense.resize(len, NOT_PINNED);
        let dense = &mut self.dense;
        self.sparse
            .retain(|&id, &mut idx| match dense.get_mut(id as usize) {
                Some(slot) => {
                    *slot = idx;
                    false
                }
                None => true,
            });
    }

    fn row_mut(&mut self, idx: u32) -> &mut [f32] {
        let start = idx as usize * self.dim;
        &mut self.rows[start..start + self.dim]
    }

    /// The row of `id`, if pinned.
    #[inline]
    pub fn get(&self, id: u64) -> Option<&[f32]> {
        let start = self.slot(id)? as usize * self.dim;
        Some(&self.rows[start..start + self.dim])
    }

    pub fn contains(&self, id: u64) -> bool {
        self.slot(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every pinned id with its row index.
    fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        let dense = self
            .dense
            .iter()
            .enumerate()
            .filter(|(_, &idx)| idx != NOT_PINNED)
            .map(|(id, &idx)| (id as u64, idx));
        dense.chain(self.sparse.iter().map(|(&id, &idx)| (id, idx)))
    }

    /// A copy without the rows of `ids`.
    pub fn without(&self, ids: &[u64]) -> Self {
        let mut next = Self::new(self.dim);
        let drop: rustc_hash::FxHashSet<u64> = ids.iter().copied().collect();
        for (id, idx) in self.entries() {
            if !drop.contains(&id) {
                let start = idx as usize * self.dim;
                next.insert(id, &self.rows[start..start + self.dim]);
            }
        }
        next
    }
}

/// The bounded L1 cache.
pub struct L1Cache {
    shards: Box<[RwLock<Shard>]>,
    /// Rows refused because an invalidation ran since their fetch began.
    pub stale_refused: AtomicU64,
}

impl std::fmt::Debug for L1Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L1Cache")
            .field("rows", &self.len())
            .field("bytes", &self.weight())
            .finish()
    }
}

/// Every shard's read lock, taken once for a batch of lookups.
pub struct L1Reader<'a> {
    shards: [RwLockReadGuard<'a, Shard>; SHARDS],
}

impl std::fmt::Debug for L1Reader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L1Reader").finish_non_exhaustive()
    }
}

impl L1Reader<'_> {
    /// The cached row of `id`.
    #[inline]
    pub fn get(&self, id: u64) -> Option<&[f32]> {
        self.shards[shard_of(id)].get(&id).map(|row| &**row)
    }
}

impl L1Cache {
    /// A cache of at most `capacity_bytes` (row data plus a small overhead
    /// per row) for rows of `dim` values.
    pub fn new(capacity_bytes: u64, dim: usize) -> Self {
        let per_shard = (capacity_bytes / SHARDS as u64).max(1);
        let row_weight = dim as u64 * 4 + ROW_OVERHEAD;
        let items = (per_shard / row_weight).max(4) as usize;
        let shards = (0..SHARDS)
            .map(|_| {
                RwLock::new(Shard::with(
                    items,
                    per_shard,
                    RowWeighter,
                    FxBuildHasher,
                    DefaultLifecycle::default(),
                ))
            })
            .collect();
        Self {
            shards,
            stale_refused: AtomicU64::new(0),
        }
    }

    /// Takes every shard's read lock. Hold it only for synchronous lookups
    /// (never across an `.await`): inserts wait for it.
    pub fn reader(&self) -> L1Reader<'_> {
        L1Reader {
            shards: std::array::from_fn(|i| {
                self.shards[i]
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
            }),
        }
    }

    /// Inserts rows, shard by shard, unless `epoch` (read by the caller
    /// before its fetch began) differs from `current` under the shard's
    /// write lock. Returns how many rows were inserted.
    pub fn insert_many<'r>(
        &self,
        rows: impl Iterator<Item = (u64, &'r [f32])> + Clone,
        epoch: u64,
        current: &AtomicU64,
    ) -> usize {
        let mut inserted = 0;
        for (shard_idx, shard) in self.shards.iter().enumerate() {
            let mut mine = rows.clone().filter(|(id, _)| shard_of(*id) == shard_idx);
            let Some(first) = mine.next() else {
                continue;
            };
            let mut shard = shard.write().unwrap_or_else(PoisonError::into_inner);
            // SYNC POINT: pairs with the invalidation's epoch bump, made
            // before it takes this lock to remove.
            if current.load(Ordering::Acquire) != epoch {
                let refused = 1 + mine.count();
                self.stale_refused
                    .fetch_add(refused as u64, Ordering::Relaxed);
                continue;
            }
            for (id, row) in std::iter::once(first).chain(mine) {
                shard.insert(id, row.into());
                inserted += 1;
            }
        }
        inserted
    }

    /// Removes the rows of `ids`.
    pub fn remove_many(&self, ids: &[u64]) {
        for &id in ids {
            self.shards[shard_of(id)]
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        }
    }

    /// Drops every row; returns how many there were.
    pub fn clear(&self) -> usize {
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.write().unwrap_or_else(PoisonError::into_inner);
            dropped += shard.len();
            shard.clear();
        }
        dropped
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held (row data plus the per-row overhead).
    pub fn weight(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).weight())
            .sum()
    }

    /// The bound, in bytes.
    pub fn capacity(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).capacity())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64, dim: usize) -> Vec<f32> {
        (0..dim).map(|j| id as f32 + j as f32 / 1000.0).collect()
    }

    #[test]
    fn inserted_rows_read_back_and_removed_rows_do_not() {
        let dim = 8;
        let cache = L1Cache::new(1 << 20, dim);
        let rows: Vec<(u64, Vec<f32>)> = (0..500).map(|id| (id * 7, row(id * 7, dim))).collect();
        let epoch = AtomicU64::new(3);
        let inserted = cache.insert_many(rows.iter().map(|(id, r)| (*id, &r[..])), 3, &epoch);
        assert_eq!(inserted, 500);
        assert_eq!(cache.len(), 500);
        {
            let reader = cache.reader();
            for (id, r) in &rows {
                assert_eq!(reader.get(*id), Some(&r[..]));
            }
            assert_eq!(reader.get(1), None);
        }
        cache.remove_many(&[0, 7, 14]);
        let reader = cache.reader();
        assert_eq!(reader.get(7), None);
        assert_eq!(reader.get(21), Some(&row(21, dim)[..]));
    }

    /// Ids in the dense table, past it, and moved into it as it grows all
    /// read back their own rows; a replaced row is replaced in place;
    /// `without` keeps the others.
    #[test]
    fn pinned_rows_read_back_dense_sparse_and_moved() {
        let dim = 3;
        let mut pinned = Pinned::new(dim);
        // Past the dense table at first (far ids), then enough rows that
        // the table grows over some of them.
        let far: Vec<u64> = (0..50).map(|i| 300_000 + i * 7).collect();
        for &id in &far {
            pinned.insert(id, &row(id, dim));
        }
        assert!(!pinned.sparse.is_empty());
        let near: Vec<u64> = (0..100_000).rev().collect();
        for &id in &near {
            pinned.insert(id, &row(id, dim));
        }
        assert!(pinned.dense.len() < 300_000);
        // An id the table may now cover (four slots a row) grows it over
        // the far ids, which move into it.
        let grow = 350_000;
        pinned.insert(grow, &row(grow, dim));
        assert!(pinned.dense.len() > grow as usize, "the table grew");
        assert!(pinned.sparse.is_empty(), "the far ids moved into the table");
        let huge = u64::MAX - 1;
        pinned.insert(huge, &row(5, dim));
        assert_eq!(pinned.sparse.len(), 1);
        assert_eq!(pinned.len(), far.len() + near.len() + 2);
        for &id in far.iter().chain(&near).chain(&[grow]) {
            assert_eq!(pinned.get(id), Some(&row(id, dim)[..]), "id {id}");
        }
        assert_eq!(pinned.get(huge), Some(&row(5, dim)[..]));
        for absent in [100_000, 299_999, 349_999, 400_000, u64::MAX] {
            assert_eq!(pinned.get(absent), None, "id {absent}");
            assert!(!pinned.contains(absent));
        }
        pinned.insert(7, &row(70, dim));
        assert_eq!(pinned.get(7), Some(&row(70, dim)[..]));
        assert_eq!(pinned.len(), far.len() + near.len() + 2);
        let fewer = pinned.without(&[7, far[0], huge]);
        assert_eq!(fewer.len(), pinned.len() - 3);
        assert_eq!(fewer.get(7), None);
        assert_eq!(fewer.get(far[0]), None);
        assert_eq!(fewer.get(huge), None);
        assert_eq!(fewer.get(8), Some(&row(8, dim)[..]));
        assert_eq!(fewer.get(far[1]), Some(&row(far[1], dim)[..]));
    }

    #[test]
    fn a_stale_epoch_inserts_nothing() {
        let cache = L1Cache::new(1 << 20, 4);
        let epoch = AtomicU64::new(5);
        let rows = [(1u64, vec![1.0; 4]), (2, vec![2.0; 4])];
        assert_eq!(
            cache.insert_many(rows.iter().map(|(id, r)| (*id, &r[..])), 4, &epoch),
            0
        );
        assert!(cache.is_empty());
        assert_eq!(cache.stale_refused.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn the_byte_bound_holds_and_a_scan_does_not_flush_the_hot_rows() {
        let dim = 32;
        let row_weight = dim as u64 * 4 + ROW_OVERHEAD;
        // Room for about 1 600 rows.
        let cache = L1Cache::new(row_weight * 1_600, dim);
        let epoch = AtomicU64::new(0);
        let hot: Vec<(u64, Vec<f32>)> = (0..400).map(|id| (id, row(id, dim))).collect();
        cache.insert_many(hot.iter().map(|(id, r)| (*id, &r[..])), 0, &epoch);
        // The hot rows are read again and again...
        for _ in 0..3 {
            let reader = cache.reader();
            for (id, _) in &hot {
                assert!(reader.get(*id).is_some());
            }
        }
        // ...then a scan of 20 000 rows read once each goes through.
        for chunk in (10_000..30_000u64).collect::<Vec<_>>().chunks(500) {
            let rows: Vec<(u64, Vec<f32>)> = chunk.iter().map(|&id| (id, row(id, dim))).collect();
            cache.insert_many(rows.iter().map(|(id, r)| (*id, &r[..])), 0, &epoch);
        }
        assert!(
            cache.weight() <= cache.capacity(),
            "{} > {}",
            cache.weight(),
            cache.capacity()
        );
        let reader = cache.reader();
        let kept = hot
            .iter()
            .filter(|(id, _)| reader.get(*id).is_some())
            .count();
        assert!(kept >= 360, "only {kept} of 400 hot rows survived a scan");
    }

    #[test]
    fn pinned_rows_are_contiguous_and_survive_removal_of_others() {
        let mut pinned = Pinned::new(4);
        pinned.insert(10, &[1.0, 2.0, 3.0, 4.0]);
        pinned.insert(20, &[5.0; 4]);
        pinned.insert(10, &[9.0; 4]);
        assert_eq!(pinned.len(), 2);
        assert_eq!(pinned.get(10), Some(&[9.0f32; 4][..]));
        let next = pinned.without(&[10, 30]);
        assert_eq!(next.get(10), None);
        assert_eq!(next.get(20), Some(&[5.0f32; 4][..]));
    }
}
