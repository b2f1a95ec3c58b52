//! Fetching a batch's rows through the tiers, into the response in place.
//!
//! L1 (the pinned hot set, then a byte-bounded scan-resistant cache) ->
//! L2 (RocksDB) -> L3 (Redis, one MGET per batch). Rows missing from L1 go
//! through a *flight* per row: concurrent requests that miss the same row
//! wait for the same fetch instead of issuing their own. The requester
//! drives the fetch of the rows it owns itself (no task hand-off on the
//! common path); if its deadline passes first, the fetch is moved to a
//! background task, so it is not cancelled for the requests sharing it and
//! a late answer still warms L1 and L2.
//!
//! A row that is missing everywhere, arrives after the request's deadline,
//! or cannot be fetched (Redis unreachable) is the configured default row
//! (zeros or the population mean), flagged as fallback and counted by cause;
//! the request never fails for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use protocol::payload::schema::tier;
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use rustc_hash::FxHashMap;
use tokio::sync::watch;

use crate::features::contract::decode_row;
use crate::features::redis_tier::RedisTier;
use crate::features::rocks::{RocksStore, Role};

/// The row served when no tier has one.
#[derive(Debug, Clone)]
pub enum DefaultRow {
    Zeros,
    /// The population mean, computed at import.
    Mean(Arc<[f32]>),
}

/// Counters, per tier and per fallback cause.
#[derive(Debug, Default)]
pub struct TierStats {
    pub l1_hits: AtomicU64,
    pub l2_hits: AtomicU64,
    pub l3_hits: AtomicU64,
    /// Rows no tier had.
    pub fallback_missing: AtomicU64,
    /// Rows that did not arrive before the request's deadline.
    pub fallback_deadline: AtomicU64,
    /// Rows whose fetch failed (Redis unreachable, L2 error).
    pub fallback_unavailable: AtomicU64,
    /// Values of the wrong length (counted as missing too).
    pub malformed: AtomicU64,
    /// Rows that joined another request's fetch.
    pub coalesced: AtomicU64,
    /// Redis round trips (MGET batches).
    pub l3_round_trips: AtomicU64,
}

/// How the tiers are set up.
#[derive(Debug, Clone)]
pub struct TierConfig {
    pub feature_dim: usize,
    /// L1 capacity in bytes of row data.
    pub l1_bytes: u64,
    /// Default deadline of a fetch when the request sets none.
    pub default_deadline: Duration,
    pub default_row: DefaultRow,
    /// Longest a detached fetch may run (it outlives short deadlines).
    pub fetch_timeout: Duration,
}

impl TierConfig {
    pub fn new(feature_dim: usize) -> Self {
        Self {
            feature_dim,
            l1_bytes: 256 << 20,
            default_deadline: Duration::from_millis(20),
            default_row: DefaultRow::Zeros,
            fetch_timeout: Duration::from_secs(1),
        }
    }
}

#[derive(Clone)]
struct RowWeighter;

impl Weighter<u64, Arc<[f32]>> for RowWeighter {
    fn weight(&self, _key: &u64, row: &Arc<[f32]>) -> u64 {
        (row.len() * 4 + 32) as u64
    }
}

/// The outcome of one row's flight.
#[derive(Debug, Clone)]
enum Landed {
    Row(Arc<[f32]>, u8),
    Missing,
    Failed,
}

type Flight = watch::Receiver<Option<Landed>>;

struct Inner {
    dim: usize,
    l1: Cache<u64, Arc<[f32]>, RowWeighter>,
    pinned: ArcSwap<FxHashMap<u64, Arc<[f32]>>>,
    l2: Option<Arc<RocksStore>>,
    l3: Option<RedisTier>,
    default_row: Arc<[f32]>,
    default_deadline: Duration,
    fetch_timeout: Duration,
    flights: Mutex<FxHashMap<u64, Flight>>,
    stats: TierStats,
    ready: AtomicBool,
    /// Bumped by every invalidation. A fetch that saw another value when it
    /// started does not write its rows to L1 or L2: they may predate the
    /// invalidation (it still hands them to its waiters).
    invalidations: AtomicU64,
}

/// The feature tiers of one sidecar. Cheap to clone (shared).
#[derive(Clone)]
pub struct FeatureTiers {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FeatureTiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureTiers")
            .field("dim", &self.inner.dim)
            .field(
                "l2",
                &self.inner.l2.as_ref().map(|s| s.path().to_path_buf()),
            )
            .field("l3", &self.inner.l3)
            .finish()
    }
}

/// Where each row of a fetch came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowSource {
    pub tier: u8,
    pub fallback: bool,
}

impl FeatureTiers {
    pub fn new(config: &TierConfig, l2: Option<Arc<RocksStore>>, l3: Option<RedisTier>) -> Self {
        let dim = config.feature_dim;
        let default_row: Arc<[f32]> = match &config.default_row {
            DefaultRow::Zeros => vec![0.0; dim].into(),
            DefaultRow::Mean(mean) => {
                assert_eq!(mean.len(), dim, "mean row has the feature dim");
                mean.clone()
            }
        };
        let row_weight = (dim * 4 + 32) as u64;
        let estimated = (config.l1_bytes / row_weight).max(16) as usize;
        Self {
            inner: Arc::new(Inner {
                dim,
                l1: Cache::with_weighter(estimated, config.l1_bytes, RowWeighter),
                pinned: ArcSwap::from_pointee(FxHashMap::default()),
                l2,
                l3,
                default_row,
                default_deadline: config.default_deadline,
                fetch_timeout: config.fetch_timeout,
                flights: Mutex::new(FxHashMap::default()),
                stats: TierStats::default(),
                ready: AtomicBool::new(false),
                invalidations: AtomicU64::new(0),
            }),
        }
    }

    pub fn stats(&self) -> &TierStats {
        &self.inner.stats
    }

    /// Bytes of row data held by the L1 cache (the pinned set excluded).
    pub fn l1_bytes(&self) -> u64 {
        self.inner.l1.weight()
    }

    pub fn feature_dim(&self) -> usize {
        self.inner.dim
    }

    /// True once [`FeatureTiers::warm_up`] has completed.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    /// Loads `hot` (e.g. the top-degree nodes) through the tiers and pins
    /// them in L1, then marks the tiers ready. Returns how many were pinned.
    pub async fn warm_up(&self, hot: &[u64]) -> usize {
        let mut pinned: FxHashMap<u64, Arc<[f32]>> = FxHashMap::default();
        for chunk in hot.chunks(1_000) {
            let landed = self
                .fetch_rows(chunk, Instant::now() + self.inner.fetch_timeout)
                .await;
            for (&id, landed) in chunk.iter().zip(landed) {
                if let Landed::Row(row, _) = landed {
                    pinned.insert(id, row);
                }
            }
        }
        let n = pinned.len();
        self.inner.pinned.store(Arc::new(pinned));
        self.inner.ready.store(true, Ordering::Release);
        tracing::info!(pinned = n, requested = hot.len(), "feature warm-up done");
        n
    }

    /// Evicts rows from L1 (pinned set included) and from an L2 cache. A
    /// fetch already in flight will not cache what it brings back.
    pub async fn invalidate(&self, ids: &[u64]) {
        // SYNC POINT: bumped before evicting, so a fetch that read the old
        // epoch either finishes caching before the eviction below, or sees
        // the new epoch and does not cache at all.
        self.inner.invalidations.fetch_add(1, Ordering::AcqRel);
        for id in ids {
            self.inner.l1.remove(id);
        }
        let pinned = self.inner.pinned.load();
        if ids.iter().any(|id| pinned.contains_key(id)) {
            let mut next = (**pinned).clone();
            for id in ids {
                next.remove(id);
            }
            self.inner.pinned.store(Arc::new(next));
        }
        if let Some(l2) = self.inner.l2.clone() {
            if matches!(l2.role(), Role::Cache { .. }) {
                let ids = ids.to_vec();
                let _ = tokio::task::spawn_blocking(move || l2.delete_many(&ids)).await;
            }
        }
    }

    /// Fetches the rows of `ids` (unique) into `features` (`ids.len() x dim`,
    /// row-major) and reports each row's source. Waits at most until
    /// `deadline` (default: now + the configured deadline).
    pub async fn fetch_into(
        &self,
        ids: &[u64],
        deadline: Option<Instant>,
        features: &mut [f32],
        sources: &mut [RowSource],
    ) {
        let dim = self.inner.dim;
        assert_eq!(features.len(), ids.len() * dim);
        assert_eq!(sources.len(), ids.len());
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.inner.default_deadline);
        let stats = &self.inner.stats;
        let mut missing: Vec<usize> = Vec::new();
        {
            let pinned = self.inner.pinned.load();
            let pinned = (!pinned.is_empty()).then_some(&**pinned);
            for (pos, id) in ids.iter().enumerate() {
                let row = pinned
                    .and_then(|p| p.get(id).cloned())
                    .or_else(|| self.inner.l1.get(id));
                match row {
                    Some(row) => {
                        features[pos * dim..(pos + 1) * dim].copy_from_slice(&row);
                        sources[pos] = RowSource {
                            tier: tier::L1,
                            fallback: false,
                        };
                    }
                    None => missing.push(pos),
                }
            }
        }
        stats
            .l1_hits
            .fetch_add((ids.len() - missing.len()) as u64, Ordering::Relaxed);
        if missing.is_empty() {
            return;
        }
        let missing_ids: Vec<u64> = missing.iter().map(|&pos| ids[pos]).collect();
        let landed = self.fetch_rows(&missing_ids, deadline).await;
        for (&pos, landed) in missing.iter().zip(landed) {
            let out = &mut features[pos * dim..(pos + 1) * dim];
            sources[pos] = match landed {
                Landed::Row(row, from) => {
                    out.copy_from_slice(&row);
                    RowSource {
                        tier: from,
                        fallback: false,
                    }
                }
                Landed::Missing | Landed::Failed => {
                    out.copy_from_slice(&self.inner.default_row);
                    RowSource {
                        tier: tier::DEFAULT,
                        fallback: true,
                    }
                }
            };
        }
    }

    /// Rows for L1 misses, through flights; `Failed` also stands for
    /// "not back before the deadline".
    async fn fetch_rows(&self, ids: &[u64], deadline: Instant) -> Vec<Landed> {
        let stats = &self.inner.stats;
        let mut waits: Vec<Flight> = Vec::with_capacity(ids.len());
        let mut owned: Vec<(u64, watch::Sender<Option<Landed>>)> = Vec::new();
        {
            let mut flights = self.inner.flights.lock().unwrap_or_else(|p| p.into_inner());
            for &id in ids {
                match flights.get(&id) {
                    Some(flight) => {
                        stats.coalesced.fetch_add(1, Ordering::Relaxed);
                        waits.push(flight.clone());
                    }
                    None => {
                        let (tx, rx) = watch::channel(None);
                        flights.insert(id, rx.clone());
                        waits.push(rx);
                        owned.push((id, tx));
                    }
                }
            }
        }
        if !owned.is_empty() {
            let mut fly = Box::pin(self.clone().fly(owned));
            tokio::select! {
                biased;
                () = &mut fly => {}
                () = tokio::time::sleep_until(deadline.into()) => {
                    // Keep fetching for whoever shares these rows.
                    tokio::spawn(fly);
                }
            }
        }
        let mut out = Vec::with_capacity(ids.len());
        for mut flight in waits {
            let landed =
                match tokio::time::timeout_at(deadline.into(), flight.wait_for(|v| v.is_some()))
                    .await
                {
                    Ok(Ok(value)) => value.clone().expect("waited for Some"),
                    Ok(Err(_)) => Landed::Failed,
                    Err(_) => {
                        stats.fallback_deadline.fetch_add(1, Ordering::Relaxed);
                        out.push(Landed::Failed);
                        continue;
                    }
                };
            match landed {
                Landed::Missing => stats.fallback_missing.fetch_add(1, Ordering::Relaxed),
                Landed::Failed => stats.fallback_unavailable.fetch_add(1, Ordering::Relaxed),
                Landed::Row(..) => 0,
            };
            out.push(landed);
        }
        out
    }

    /// Fetches the owned rows from L2 then L3, lands every flight, and fills
    /// the caches.
    async fn fly(self, owned: Vec<(u64, watch::Sender<Option<Landed>>)>) {
        let inner = &self.inner;
        let dim = inner.dim;
        let epoch = inner.invalidations.load(Ordering::Acquire);
        let ids: Vec<u64> = owned.iter().map(|(id, _)| *id).collect();
        let mut landed: Vec<Option<Landed>> = vec![None; ids.len()];
        let decode = |bytes: &[u8]| -> Option<Arc<[f32]>> {
            let mut row = vec![0f32; dim];
            decode_row(bytes, &mut row).then(|| row.into())
        };
        // L2.
        if let Some(l2) = inner.l2.clone() {
            let lookup = ids.clone();
            match tokio::task::spawn_blocking(move || l2.get_many(&lookup, dim * 4)).await {
                Ok(values) => {
                    for (slot, value) in landed.iter_mut().zip(values) {
                        if let Some(row) = value.as_deref().and_then(decode) {
                            inner.stats.l2_hits.fetch_add(1, Ordering::Relaxed);
                            *slot = Some(Landed::Row(row, tier::L2));
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "L2 lookup task failed"),
            }
        }
        // L3, for what L2 did not have.
        let pending: Vec<usize> = (0..ids.len()).filter(|&i| landed[i].is_none()).collect();
        let mut from_l3: Vec<(u64, Vec<u8>)> = Vec::new();
        if let (Some(l3), false) = (&inner.l3, pending.is_empty()) {
            let wanted: Vec<u64> = pending.iter().map(|&i| ids[i]).collect();
            inner.stats.l3_round_trips.fetch_add(1, Ordering::Relaxed);
            match tokio::time::timeout(inner.fetch_timeout, l3.get_many(&wanted)).await {
                Ok(Ok(values)) => {
                    for (&i, value) in pending.iter().zip(values) {
                        landed[i] = Some(match value {
                            Some(bytes) => match decode(&bytes) {
                                Some(row) => {
                                    inner.stats.l3_hits.fetch_add(1, Ordering::Relaxed);
                                    from_l3.push((ids[i], bytes));
                                    Landed::Row(row, tier::L3)
                                }
                                None => {
                                    inner.stats.malformed.fetch_add(1, Ordering::Relaxed);
                                    Landed::Missing
                                }
                            },
                            None => Landed::Missing,
                        });
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(redis = %l3.shown(), error = %e, rows = wanted.len(), "L3 fetch failed; serving default rows");
                    for &i in &pending {
                        landed[i] = Some(Landed::Failed);
                    }
                }
                Err(_) => {
                    tracing::warn!(redis = %l3.shown(), rows = wanted.len(), "L3 fetch timed out; serving default rows");
                    for &i in &pending {
                        landed[i] = Some(Landed::Failed);
                    }
                }
            }
        }
        // Fill L1 first, then land the flights, then write L3 rows back to an
        // L2 cache; skip the caches if an invalidation ran meanwhile.
        let cacheable = || inner.invalidations.load(Ordering::Acquire) == epoch;
        {
            let mut flights = inner.flights.lock().unwrap_or_else(|p| p.into_inner());
            let cache = cacheable();
            for ((id, tx), landed) in owned.into_iter().zip(landed) {
                let landed = landed.unwrap_or(Landed::Missing);
                if let (Landed::Row(row, _), true) = (&landed, cache) {
                    inner.l1.insert(id, row.clone());
                }
                flights.remove(&id);
                let _ = tx.send(Some(landed));
            }
        }
        if let (Some(l2), false) = (inner.l2.clone(), from_l3.is_empty()) {
            if matches!(l2.role(), Role::Cache { .. }) && cacheable() {
                let written = tokio::task::spawn_blocking(move || {
                    l2.put_many(from_l3.iter().map(|(id, bytes)| (*id, bytes.as_slice())))
                })
                .await;
                if let Ok(Err(e)) = written {
                    tracing::warn!(error = %e, "writing L3 rows to the L2 cache failed");
                }
            }
        }
    }
}
