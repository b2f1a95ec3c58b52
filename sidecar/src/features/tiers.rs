//! Fetching a batch's rows through the tiers, into the response in place.
//!
//! L1 (the pinned hot set, then a byte-bounded scan-resistant cache: see
//! [`crate::features::l1`]) -> L2 (RocksDB) -> L3 (Redis, one MGET per
//! batch). The rows a batch misses in L1 go out as one *flight*; every row
//! of a flight is registered in a table, so a concurrent request that
//! misses the same row joins that flight instead of fetching it again. The
//! requester drives its own flight (no task hand-off on the common path)
//! and copies the rows out as soon as they land; filling L1 and the L2
//! cache and closing the flight happen afterwards on a task of their own,
//! off the request's path. If the deadline passes first, the flight moves
//! to a background task, so it is not cancelled for the requests sharing
//! it and a late answer still warms L1 and L2.
//!
//! A row that is missing everywhere, arrives after the request's deadline,
//! or cannot be fetched (Redis unreachable) is the configured default row
//! (zeros or the population mean), flagged as fallback and counted by cause;
//! the request never fails for it.

use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use daemon_kit::metrics::{Out, Telemetry};
use protocol::payload::schema::tier;
use rustc_hash::FxHashMap;
use tokio::sync::watch;

use crate::features::contract::{decode_row, encode_row};
use crate::features::l1::{L1Cache, Pinned};
use crate::features::redis_tier::RedisTier;
use crate::features::rocks::RocksStore;
use crate::features::store::{LocalStore, RemoteStore, Role};

/// The row served when no tier has one.
#[derive(Debug, Clone)]
pub enum DefaultRow {
    Zeros,
    /// The population mean, computed at import.
    Mean(Arc<[f32]>),
}

/// The tiers at one moment: what `/metrics` and `sidecarctl stats` and
/// `status` report of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierSnapshot {
    /// Rows served from L1, L2 and L3 ([`TierSnapshot::TIERS`]).
    pub rows: [u64; 3],
    /// Default rows served, per cause ([`TierSnapshot::CAUSES`]).
    pub fallbacks: [u64; 3],
    /// Stored values of the wrong length, in L2 and in L3.
    pub malformed: [u64; 2],
    pub coalesced: u64,
    pub redis_round_trips: u64,
    pub l1_stale_refused: u64,
    pub l2_writes: u64,
    pub l1_bytes: u64,
    pub l1_rows: u64,
    pub pinned_rows: u64,
    pub rows_in_flight: u64,
}

impl TierSnapshot {
    pub const TIERS: [&'static str; 3] = ["l1", "l2", "l3"];
    pub const CAUSES: [&'static str; 3] = ["missing", "deadline", "unavailable"];

    fn labelled<const N: usize>(
        names: [&'static str; N],
        values: [u64; N],
    ) -> [(&'static str, u64); N] {
        std::array::from_fn(|i| (names[i], values[i]))
    }

    /// Rows per tier, labelled.
    pub fn tier_rows(&self) -> [(&'static str, u64); 3] {
        Self::labelled(Self::TIERS, self.rows)
    }

    /// Default rows per cause, labelled.
    pub fn fallback_rows(&self) -> [(&'static str, u64); 3] {
        Self::labelled(Self::CAUSES, self.fallbacks)
    }

    /// The sum of several tier sets' snapshots (a typed graph's node types,
    /// each with tiers of its own): what `sidecarctl stats` and `status`
    /// report for the whole sidecar, as `/metrics` counts per node type.
    pub fn sum<'a>(snapshots: impl IntoIterator<Item = &'a TierSnapshot>) -> TierSnapshot {
        let mut total = TierSnapshot::default();
        for s in snapshots {
            let add = |a: &mut [u64], b: &[u64]| a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            add(&mut total.rows, &s.rows);
            add(&mut total.fallbacks, &s.fallbacks);
            add(&mut total.malformed, &s.malformed);
            total.coalesced += s.coalesced;
            total.redis_round_trips += s.redis_round_trips;
            total.l1_stale_refused += s.l1_stale_refused;
            total.l2_writes += s.l2_writes;
            total.l1_bytes += s.l1_bytes;
            total.l1_rows += s.l1_rows;
            total.pinned_rows += s.pinned_rows;
            total.rows_in_flight += s.rows_in_flight;
        }
        total
    }
}

/// Registered at the sidecar's top level (`sidecar_feature_*`, `sidecar_l1_*`,
/// ...): the tiers' names predate sub-registry prefixes.
impl Telemetry for FeatureTiers {
    fn encode(&self, out: &mut Out<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        out.counters(
            "feature_rows",
            "feature rows served, per tier (a tier's hit ratio is its share)",
            "tier",
            &s.tier_rows(),
        )?;
        out.counters(
            "feature_fallbacks",
            "default rows served, per cause",
            "cause",
            &s.fallback_rows(),
        )?;
        out.counters(
            "feature_malformed",
            "stored values of the wrong length, served as misses, per tier",
            "tier",
            &[("l2", s.malformed[0]), ("l3", s.malformed[1])],
        )?;
        out.counter(
            "feature_coalesced",
            "rows that joined another request's fetch",
            s.coalesced,
        )?;
        out.counter(
            "redis_round_trips",
            "Redis MGET round trips (one per batch of misses)",
            s.redis_round_trips,
        )?;
        out.counter(
            "l1_stale_refused",
            "fetched rows not cached because an invalidation ran during their fetch",
            s.l1_stale_refused,
        )?;
        out.counter(
            "l2_writes",
            "rows from Redis written back to the L2 cache",
            s.l2_writes,
        )?;
        out.gauge("l1_bytes", "bytes held by the L1 cache", s.l1_bytes)?;
        out.gauge("l1_rows", "rows held by the L1 cache", s.l1_rows)?;
        out.gauge(
            "l1_pinned_rows",
            "rows of the pinned hot set",
            s.pinned_rows,
        )?;
        out.gauge(
            "rows_in_flight",
            "rows being fetched from L2 or L3 now",
            s.rows_in_flight,
        )
    }
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
    /// L3 round trips that failed or timed out (the rows are counted in
    /// `fallback_unavailable`); rate-limits their log lines.
    pub l3_failed_round_trips: AtomicU64,
    /// Rows from Redis written back to the L2 cache.
    pub l2_writes: AtomicU64,
}

/// How the tiers are set up.
impl TierStats {
    /// Counts a failed L3 round trip; returns how many there were. Its log
    /// line is written at the 1st, 2nd, 4th... so that an outage under load
    /// does not flood the log.
    fn l3_failed(&self) -> u64 {
        self.l3_failed_round_trips.fetch_add(1, Ordering::Relaxed) + 1
    }
}

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
    /// The change clock invalidations mark (docs/protocol.md, "Freshness").
    pub changes: Option<Arc<crate::graph::Changes>>,
    /// The node type whose rows these are: its marks are the clock's keys
    /// of that type (`graph::changes::node_key`; 0 for a one-type graph).
    pub node_type: usize,
}

impl TierConfig {
    /// `sidecar serve`'s defaults (`ServeConfig::default()`: the one set).
    pub fn new(feature_dim: usize) -> Self {
        let defaults = crate::config::ServeConfig::default();
        Self {
            feature_dim,
            l1_bytes: defaults.l1_bytes(),
            default_deadline: defaults.deadline(),
            default_row: DefaultRow::Zeros,
            fetch_timeout: Duration::from_secs(1),
            changes: None,
            node_type: 0,
        }
    }
}

/// How one row of a flight landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Landed {
    /// Found, in the tier given.
    Row(u8),
    /// No tier has it (or its value was malformed).
    Missing,
    /// The fetch failed (Redis unreachable, timed out, L2 error).
    Failed,
}

/// What a flight brought back: its rows in one table, in flight order.
#[derive(Debug)]
struct FlightRows {
    rows: Vec<f32>,
    landed: Vec<Landed>,
}

type FlightRx = watch::Receiver<Option<Arc<FlightRows>>>;

/// How a request's misses are fetched: its own flight's rows (positions
/// and ids in flight order), and the rows it joined other requests'
/// flights for: (position, flight, index in that flight).
struct Booking {
    owned_pos: Vec<usize>,
    owned_ids: Vec<u64>,
    joined: Vec<(usize, u64, u32)>,
    joined_flights: Vec<(u64, FlightRx)>,
    /// A row this request misses twice (its ids repeat, as a temporal
    /// sample's rows do): (its later position, its first), copied once the
    /// first has landed.
    repeats: Vec<(usize, usize)>,
    /// This request's own flight, opened.
    mine: Option<(u64, watch::Sender<Option<Arc<FlightRows>>>)>,
}

/// The fetches in progress. One flight per batch of misses; each row being
/// fetched maps to its flight and its place in it, so a request missing the
/// same row joins that flight instead of fetching the row again.
#[derive(Default)]
struct Flights {
    /// Row id -> (flight number, index in the flight).
    by_row: FxHashMap<u64, (u64, u32)>,
    /// Flight number -> where its rows land.
    open: FxHashMap<u64, FlightRx>,
    next: u64,
}

struct Inner {
    dim: usize,
    l1: L1Cache,
    pinned: ArcSwap<Pinned>,
    l2: Option<Arc<dyn LocalStore>>,
    l3: Option<Arc<dyn RemoteStore>>,
    default_row: Arc<[f32]>,
    default_deadline: Duration,
    fetch_timeout: Duration,
    flights: Mutex<Flights>,
    /// Orders write-backs to an L2 cache with invalidations' deletes.
    l2_writes: Mutex<()>,
    stats: TierStats,
    /// Bumped by every invalidation. A fetch that saw another value when it
    /// started does not write its rows to L1 or L2: they may predate the
    /// invalidation (it still hands them to its waiters).
    invalidations: AtomicU64,
    /// The change clock invalidations mark, and the node type of the rows.
    changes: Option<Arc<crate::graph::Changes>>,
    node_type: usize,
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
    /// The row missed its deadline (a fallback whose cause is the deadline).
    pub late: bool,
}

impl RowSource {
    const L1: Self = Self {
        tier: tier::L1,
        fallback: false,
        late: false,
    };
    const DEFAULT: Self = Self {
        tier: tier::DEFAULT,
        fallback: true,
        late: false,
    };
}

impl FeatureTiers {
    /// The tiers over the product's stores: RocksDB (L2) and Redis (L3).
    pub fn new(config: &TierConfig, l2: Option<Arc<RocksStore>>, l3: Option<RedisTier>) -> Self {
        Self::with_stores(
            config,
            l2.map(|s| s as Arc<dyn LocalStore>),
            l3.map(|s| Arc::new(s) as Arc<dyn RemoteStore>),
        )
    }

    /// The tiers over any stores ([`crate::features::store`]).
    pub fn with_stores(
        config: &TierConfig,
        l2: Option<Arc<dyn LocalStore>>,
        l3: Option<Arc<dyn RemoteStore>>,
    ) -> Self {
        let dim = config.feature_dim;
        let default_row: Arc<[f32]> = match &config.default_row {
            DefaultRow::Zeros => vec![0.0; dim].into(),
            DefaultRow::Mean(mean) => {
                assert_eq!(mean.len(), dim, "mean row has the feature dim");
                mean.clone()
            }
        };
        Self {
            inner: Arc::new(Inner {
                dim,
                l1: L1Cache::new(config.l1_bytes, dim),
                pinned: ArcSwap::from_pointee(Pinned::new(dim)),
                l2,
                l3,
                default_row,
                default_deadline: config.default_deadline,
                fetch_timeout: config.fetch_timeout,
                flights: Mutex::new(Flights::default()),
                l2_writes: Mutex::new(()),
                stats: TierStats::default(),
                invalidations: AtomicU64::new(0),
                changes: config.changes.clone(),
                node_type: config.node_type,
            }),
        }
    }

    pub fn stats(&self) -> &TierStats {
        &self.inner.stats
    }

    /// The tiers' counters and occupancy now.
    pub fn snapshot(&self) -> TierSnapshot {
        let t = &self.inner.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (l1_rows, pinned_rows) = self.l1_rows();
        TierSnapshot {
            rows: [load(&t.l1_hits), load(&t.l2_hits), load(&t.l3_hits)],
            fallbacks: [
                load(&t.fallback_missing),
                load(&t.fallback_deadline),
                load(&t.fallback_unavailable),
            ],
            malformed: [
                self.inner.l2.as_ref().map_or(0, |s| s.malformed_rows()),
                load(&t.malformed),
            ],
            coalesced: load(&t.coalesced),
            redis_round_trips: load(&t.l3_round_trips),
            l1_stale_refused: self.stale_refused(),
            l2_writes: load(&t.l2_writes),
            l1_bytes: self.l1_bytes(),
            l1_rows: l1_rows as u64,
            pinned_rows: pinned_rows as u64,
            rows_in_flight: self.rows_in_flight() as u64,
        }
    }

    /// Bytes held by the L1 cache (the pinned set excluded).
    pub fn l1_bytes(&self) -> u64 {
        self.inner.l1.weight()
    }

    /// Rows held by the L1 cache and by the pinned set.
    pub fn l1_rows(&self) -> (usize, usize) {
        (self.inner.l1.len(), self.inner.pinned.load().len())
    }

    /// Rows an in-flight fetch did not cache because an invalidation ran
    /// meanwhile.
    pub fn stale_refused(&self) -> u64 {
        self.inner.l1.stale_refused.load(Ordering::Relaxed)
    }

    pub fn feature_dim(&self) -> usize {
        self.inner.dim
    }

    /// Rows being fetched now (flights not yet closed: a landed flight
    /// stays open until its rows are in L1).
    pub fn rows_in_flight(&self) -> usize {
        self.inner
            .flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_row
            .len()
    }

    /// Fetches `ids` through the tiers and adds them to the pinned hot set
    /// (the rows already pinned stay), `chunk` ids at a time, calling
    /// `progress(done, total)` after each chunk. Rows no tier has are not
    /// pinned. Returns how many rows this call pinned.
    pub async fn pin(
        &self,
        ids: &[u64],
        chunk: usize,
        mut progress: impl FnMut(u64, u64),
    ) -> usize {
        let dim = self.inner.dim;
        let mut fetched: Vec<(u64, Vec<f32>)> = Vec::new();
        let total = ids.len() as u64;
        let mut done = 0u64;
        for chunk in ids.chunks(chunk.max(1)) {
            let mut rows = vec![0f32; chunk.len() * dim];
            let mut sources = vec![RowSource::default(); chunk.len()];
            let deadline = Instant::now() + self.inner.fetch_timeout;
            self.fetch_into(chunk, Some(deadline), &mut rows, &mut sources)
                .await;
            for ((&id, row), source) in chunk.iter().zip(rows.chunks_exact(dim)).zip(&sources) {
                if !source.fallback {
                    fetched.push((id, row.to_vec()));
                }
            }
            done += chunk.len() as u64;
            progress(done, total);
        }
        let current = self.inner.pinned.load();
        let mut next = current.without(&[]);
        for (id, row) in &fetched {
            next.insert(*id, row);
        }
        self.inner.pinned.store(Arc::new(next));
        fetched.len()
    }

    /// Empties L1: the cache and, when `pinned`, the pinned hot set.
    /// Returns the (cache, pinned) rows dropped.
    pub fn flush_l1(&self, pinned: bool) -> (usize, usize) {
        // SYNC POINT: as an invalidation of everything: a fetch in flight
        // does not put its (older) rows back.
        self.inner.invalidations.fetch_add(1, Ordering::AcqRel);
        let cache_rows = self.inner.l1.clear();
        let pinned_rows = if pinned {
            let n = self.inner.pinned.load().len();
            self.inner
                .pinned
                .store(Arc::new(Pinned::new(self.inner.dim)));
            n
        } else {
            0
        };
        (cache_rows, pinned_rows)
    }

    /// Empties the L2 cache. Refused when L2 is the store of record (its
    /// rows exist nowhere else) or there is no L2.
    pub async fn flush_l2(&self) -> anyhow::Result<()> {
        let Some(l2) = self.inner.l2.clone() else {
            anyhow::bail!("there is no L2 cache to flush (no_l2, or no Redis)");
        };
        anyhow::ensure!(
            matches!(l2.role(), Role::Cache { .. }),
            "L2 is the embedded store of record here (no Redis): its rows exist nowhere else, \
             so it is never flushed; flush L1 only (--l1)"
        );
        self.inner.invalidations.fetch_add(1, Ordering::AcqRel);
        let tiers = self.clone();
        tokio::task::spawn_blocking(move || {
            // SYNC POINT: the write-back lock, as an invalidation's delete.
            let _l2 = tiers
                .inner
                .l2_writes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            l2.clear()
        })
        .await
        .map_err(|e| anyhow::anyhow!("the L2 flush task failed: {e}"))?
    }

    /// Evicts rows from L1 (pinned set included) and from an L2 cache. A
    /// fetch already in flight, or one that starts before this returns, will
    /// not cache what it brings back.
    pub async fn invalidate(&self, ids: &[u64]) {
        // Marked before any cached row goes; the tick moves once they have.
        let change = self.inner.changes.as_deref().map(|changes| {
            let change = changes.begin();
            let t = self.inner.node_type;
            change.features(ids.iter().map(|&id| crate::graph::changes::node_key(t, id)));
            change
        });
        self.evict(ids).await;
        drop(change);
    }

    async fn evict(&self, ids: &[u64]) {
        // SYNC POINT: the epoch is bumped twice. The first bump, before the
        // L2 delete, stops a flight that started earlier from writing its
        // (possibly old) L3 rows back to L2 after the delete: the write-back
        // checks the epoch under the lock the delete takes. The second, after
        // the delete and before the L1 removals, stops a flight that started
        // in between (and may have read the old row from L2 before the
        // delete) from filling L1: the fill checks the epoch under the L1
        // shard lock the removal takes, so its row is refused or removed.
        self.inner.invalidations.fetch_add(1, Ordering::AcqRel);
        {
            // A flight that started before now may carry the old rows: later
            // requests must not join it for these ids (it may have landed
            // and be waiting to close).
            let mut flights = self
                .inner
                .flights
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for id in ids {
                flights.by_row.remove(id);
            }
        }
        if let Some(l2) = self.inner.l2.clone() {
            if matches!(l2.role(), Role::Cache { .. }) {
                let ids = ids.to_vec();
                let tiers = self.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    // SYNC POINT: see the write-back in `fill_and_close`.
                    let _l2 = tiers
                        .inner
                        .l2_writes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    l2.delete_many(&ids)
                })
                .await;
            }
        }
        self.inner.invalidations.fetch_add(1, Ordering::AcqRel);
        self.inner.l1.remove_many(ids);
        let pinned = self.inner.pinned.load();
        if ids.iter().any(|&id| pinned.contains(id)) {
            self.inner.pinned.store(Arc::new(pinned.without(ids)));
        }
    }

    /// Fetches the rows of `ids` into `features` (`ids.len() x dim`,
    /// row-major) and reports each row's source; an id repeated in `ids`
    /// is fetched once and copied. Waits at most until
    /// `deadline` (default: now + the configured deadline).
    pub async fn fetch_into(
        &self,
        ids: &[u64],
        deadline: Option<Instant>,
        features: &mut [f32],
        sources: &mut [RowSource],
    ) {
        use tracing::Instrument;
        let span = daemon_kit::child_span!("fetch", rows = ids.len());
        self.fetch_rows(ids, deadline, features, sources)
            .instrument(span)
            .await
    }

    /// [`Self::fetch_into`], inside its span.
    async fn fetch_rows(
        &self,
        ids: &[u64],
        deadline: Option<Instant>,
        features: &mut [f32],
        sources: &mut [RowSource],
    ) {
        let dim = self.inner.dim;
        assert_eq!(features.len(), ids.len() * dim);
        assert_eq!(sources.len(), ids.len());
        let mut missing: Vec<usize> = Vec::new();
        {
            let _span = daemon_kit::child_span!("l1").entered();
            // Hot path: no lock, reference count or allocation per row.
            let pinned = self.inner.pinned.load();
            let pinned = (!pinned.is_empty()).then_some(&**pinned);
            let l1 = self.inner.l1.reader();
            // All lookups first, then all copies: the lookups' cache misses
            // overlap instead of queueing behind each row's copy.
            let found: Vec<Option<&[f32]>> = ids
                .iter()
                .map(|&id| pinned.and_then(|p| p.get(id)).or_else(|| l1.get(id)))
                .collect();
            for (pos, (row, out)) in found.iter().zip(features.chunks_exact_mut(dim)).enumerate() {
                match row {
                    Some(row) => {
                        out.copy_from_slice(row);
                        sources[pos] = RowSource::L1;
                    }
                    None => missing.push(pos),
                }
            }
        }
        self.inner
            .stats
            .l1_hits
            .fetch_add((ids.len() - missing.len()) as u64, Ordering::Relaxed);
        if !missing.is_empty() {
            let deadline = deadline.unwrap_or_else(|| Instant::now() + self.inner.default_deadline);
            self.fetch_misses(ids, &missing, deadline, features, sources)
                .await;
        }
    }

    /// The L1 misses at `missing` (positions in `ids`): joins the flights
    /// already fetching some of them, flies the rest itself.
    async fn fetch_misses(
        &self,
        ids: &[u64],
        missing: &[usize],
        deadline: Instant,
        features: &mut [f32],
        sources: &mut [RowSource],
    ) {
        let booking = self.book(ids, missing);
        self.inner
            .stats
            .coalesced
            .fetch_add(booking.joined.len() as u64, Ordering::Relaxed);
        if let Some((flight_no, tx)) = booking.mine {
            let guard = FlightGuard {
                tiers: self.clone(),
                flight_no,
                ids: booking.owned_ids,
            };
            let mut fly = Box::pin(self.clone().fly(guard, tx));
            tokio::select! {
                biased;
                rows = &mut fly => {
                    for (idx, &pos) in booking.owned_pos.iter().enumerate() {
                        self.land(&rows, idx, pos, features, sources);
                    }
                }
                () = tokio::time::sleep_until(deadline.into()) => {
                    // Keep fetching for whoever shares these rows, and to
                    // warm the caches with a late answer.
                    tokio::spawn(fly);
                    self.late(&booking.owned_pos, features, sources);
                }
            }
        }
        for (no, rx) in booking.joined_flights {
            self.await_joined(no, rx, &booking.joined, deadline, features, sources)
                .await;
        }
        let dim = self.inner.dim;
        for &(pos, first) in &booking.repeats {
            features.copy_within(first * dim..(first + 1) * dim, pos * dim);
            sources[pos] = sources[first];
        }
    }

    /// Under the flights' lock: the rows of `missing` another request is
    /// fetching are joined to its flight; the others make this request's
    /// own flight (opened here, if there are any).
    fn book(&self, ids: &[u64], missing: &[usize]) -> Booking {
        let mut booking = Booking {
            owned_pos: Vec::with_capacity(missing.len()),
            owned_ids: Vec::with_capacity(missing.len()),
            joined: Vec::new(),
            joined_flights: Vec::new(),
            repeats: Vec::new(),
            mine: None,
        };
        let mut flights = self
            .inner
            .flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let flight_no = flights.next;
        flights.next += 1;
        for &pos in missing {
            match flights.by_row.entry(ids[pos]) {
                Entry::Occupied(entry) => {
                    let (no, idx) = *entry.get();
                    if no == flight_no {
                        // Repeated in this request: its own flight has it.
                        booking.repeats.push((pos, booking.owned_pos[idx as usize]));
                    } else {
                        booking.joined.push((pos, no, idx));
                    }
                }
                Entry::Vacant(entry) => {
                    entry.insert((flight_no, booking.owned_ids.len() as u32));
                    booking.owned_pos.push(pos);
                    booking.owned_ids.push(ids[pos]);
                }
            }
        }
        for &(_, no, _) in &booking.joined {
            if !booking.joined_flights.iter().any(|(n, _)| *n == no) {
                let rx = flights
                    .open
                    .get(&no)
                    .expect("a row's flight is open")
                    .clone();
                booking.joined_flights.push((no, rx));
            }
        }
        if !booking.owned_ids.is_empty() {
            let (tx, rx) = watch::channel(None);
            flights.open.insert(flight_no, rx);
            booking.mine = Some((flight_no, tx));
        }
        booking
    }

    /// Waits (until `deadline`) for another request's flight `no` and
    /// copies out the rows this request joined it for.
    async fn await_joined(
        &self,
        no: u64,
        mut rx: FlightRx,
        joined: &[(usize, u64, u32)],
        deadline: Instant,
        features: &mut [f32],
        sources: &mut [RowSource],
    ) {
        let waited = tokio::time::timeout_at(deadline.into(), rx.wait_for(Option::is_some)).await;
        let rows = match waited {
            Ok(Ok(rows)) => rows.clone(),
            Ok(Err(_)) => None,
            Err(_) => {
                let late: Vec<usize> = joined
                    .iter()
                    .filter(|(_, n, _)| *n == no)
                    .map(|&(pos, ..)| pos)
                    .collect();
                self.late(&late, features, sources);
                return;
            }
        };
        for &(pos, _, idx) in joined.iter().filter(|(_, n, _)| *n == no) {
            match &rows {
                Some(rows) => self.land(rows, idx as usize, pos, features, sources),
                None => {
                    // The flight was dropped unfinished.
                    self.inner
                        .stats
                        .fallback_unavailable
                        .fetch_add(1, Ordering::Relaxed);
                    self.default_into(pos, features, sources);
                }
            }
        }
    }

    /// Copies row `idx` of a flight to `pos` of the response.
    fn land(
        &self,
        rows: &FlightRows,
        idx: usize,
        pos: usize,
        features: &mut [f32],
        sources: &mut [RowSource],
    ) {
        let dim = self.inner.dim;
        let stats = &self.inner.stats;
        match rows.landed[idx] {
            Landed::Row(from) => {
                features[pos * dim..(pos + 1) * dim]
                    .copy_from_slice(&rows.rows[idx * dim..(idx + 1) * dim]);
                sources[pos] = RowSource {
                    tier: from,
                    fallback: false,
                    late: false,
                };
            }
            Landed::Missing => {
                stats.fallback_missing.fetch_add(1, Ordering::Relaxed);
                self.default_into(pos, features, sources);
            }
            Landed::Failed => {
                stats.fallback_unavailable.fetch_add(1, Ordering::Relaxed);
                self.default_into(pos, features, sources);
            }
        }
    }

    /// Default rows for positions whose rows missed the deadline.
    fn late(&self, positions: &[usize], features: &mut [f32], sources: &mut [RowSource]) {
        self.inner
            .stats
            .fallback_deadline
            .fetch_add(positions.len() as u64, Ordering::Relaxed);
        for &pos in positions {
            self.default_into(pos, features, sources);
            sources[pos].late = true;
        }
    }

    fn default_into(&self, pos: usize, features: &mut [f32], sources: &mut [RowSource]) {
        let dim = self.inner.dim;
        features[pos * dim..(pos + 1) * dim].copy_from_slice(&self.inner.default_row);
        sources[pos] = RowSource::DEFAULT;
    }

    /// Fetches a flight's rows from L2 then L3 and lands them. Filling the
    /// caches and closing the flight happen after, on a task of their own,
    /// so the requester that drives this does not wait for them.
    async fn fly(
        self,
        guard: FlightGuard,
        tx: watch::Sender<Option<Arc<FlightRows>>>,
    ) -> Arc<FlightRows> {
        use tracing::Instrument;
        let inner = &self.inner;
        let dim = inner.dim;
        let epoch = inner.invalidations.load(Ordering::Acquire);
        let ids = &guard.ids;
        let mut rows = vec![0f32; ids.len() * dim];
        let mut landed = vec![Landed::Missing; ids.len()];
        let mut pending: Vec<usize> = (0..ids.len()).collect();
        // L2.
        if let Some(l2) = inner.l2.clone() {
            let lookup = ids.clone();
            let span = daemon_kit::child_span!("l2", rows = lookup.len());
            match tokio::task::spawn_blocking(move || l2.get_many(&lookup, dim * 4))
                .instrument(span)
                .await
            {
                Ok(values) => {
                    for (i, value) in values.into_iter().enumerate() {
                        let out = &mut rows[i * dim..(i + 1) * dim];
                        if value.is_some_and(|bytes| decode_row(&bytes, out)) {
                            landed[i] = Landed::Row(tier::L2);
                        }
                    }
                    let before = pending.len();
                    pending.retain(|&i| landed[i] == Landed::Missing);
                    inner
                        .stats
                        .l2_hits
                        .fetch_add((before - pending.len()) as u64, Ordering::Relaxed);
                }
                Err(e) => tracing::error!(error = %e, "L2 lookup task failed"),
            }
        }
        // L3, for what L2 did not have.
        if let (Some(l3), false) = (&inner.l3, pending.is_empty()) {
            let wanted: Vec<u64> = pending.iter().map(|&i| ids[i]).collect();
            inner.stats.l3_round_trips.fetch_add(1, Ordering::Relaxed);
            let span = daemon_kit::child_span!("redis.mget", keys = wanted.len());
            match tokio::time::timeout(inner.fetch_timeout, l3.get_many(&wanted))
                .instrument(span)
                .await
            {
                Ok(Ok(values)) => {
                    let mut hits = 0;
                    for (&i, value) in pending.iter().zip(values) {
                        let Some(bytes) = value else { continue };
                        if decode_row(&bytes, &mut rows[i * dim..(i + 1) * dim]) {
                            landed[i] = Landed::Row(tier::L3);
                            hits += 1;
                        } else {
                            inner.stats.malformed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    inner.stats.l3_hits.fetch_add(hits, Ordering::Relaxed);
                }
                Ok(Err(e)) => {
                    let n = inner.stats.l3_failed();
                    if n.is_power_of_two() {
                        tracing::warn!(redis = %l3.shown(), error = %e, rows = wanted.len(), failed_round_trips = n, "L3 fetch failed; serving default rows");
                    }
                    for &i in &pending {
                        landed[i] = Landed::Failed;
                    }
                }
                Err(_) => {
                    let n = inner.stats.l3_failed();
                    if n.is_power_of_two() {
                        tracing::warn!(redis = %l3.shown(), rows = wanted.len(), failed_round_trips = n, "L3 fetch timed out; serving default rows");
                    }
                    for &i in &pending {
                        landed[i] = Landed::Failed;
                    }
                }
            }
        }
        let flight = Arc::new(FlightRows { rows, landed });
        tx.send_replace(Some(flight.clone()));
        let filled = flight.clone();
        tokio::spawn(async move { guard.fill_and_close(&filled, epoch).await });
        flight
    }
}

/// A flight's rows and its entries in the flight table. Closing it removes
/// the entries; dropping it unclosed (its fetch was cancelled) does too, so
/// no later request joins a flight that will never land.
struct FlightGuard {
    tiers: FeatureTiers,
    flight_no: u64,
    ids: Vec<u64>,
}

impl FlightGuard {
    /// Fills L1 (unless an invalidation ran since `epoch`), closes the
    /// flight, then writes L3 rows back to an L2 cache.
    async fn fill_and_close(self, flight: &FlightRows, epoch: u64) {
        let inner = &self.tiers.inner;
        let dim = inner.dim;
        let found = || {
            self.ids
                .iter()
                .enumerate()
                .filter_map(move |(i, &id)| match flight.landed[i] {
                    Landed::Row(from) => Some((i, id, from)),
                    _ => None,
                })
        };
        // L1 before closing: a request that no longer finds the flight
        // finds the row in L1.
        inner.l1.insert_many(
            found().map(|(i, id, _)| (id, &flight.rows[i * dim..(i + 1) * dim])),
            epoch,
            &inner.invalidations,
        );
        let l2_rows: Vec<(u64, Vec<u8>)> = match &inner.l2 {
            Some(l2) if matches!(l2.role(), Role::Cache { .. }) => found()
                .filter(|&(_, _, from)| from == tier::L3)
                .map(|(i, id, _)| (id, encode_row(&flight.rows[i * dim..(i + 1) * dim])))
                .collect(),
            _ => Vec::new(),
        };
        let tiers = self.tiers.clone();
        drop(self);
        let inner = &tiers.inner;
        if let (Some(l2), false) = (inner.l2.clone(), l2_rows.is_empty()) {
            let n = l2_rows.len() as u64;
            let writer = tiers.clone();
            let written = tokio::task::spawn_blocking(move || {
                let inner = &writer.inner;
                // SYNC POINT: the same lock as the invalidation's L2 delete,
                // which bumps the epoch first: an old row is deleted after
                // this write, or this write sees the new epoch.
                let _l2 = inner
                    .l2_writes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if inner.invalidations.load(Ordering::Acquire) != epoch {
                    return Ok(false);
                }
                l2.put_rows(&l2_rows).map(|()| true)
            })
            .await;
            match written {
                Ok(Ok(true)) => {
                    inner.stats.l2_writes.fetch_add(n, Ordering::Relaxed);
                }
                Ok(Ok(false)) => {}
                // A full disk is alarmed (and logged once) by the store.
                Ok(Err(_)) if inner.l2.as_ref().is_some_and(|l2| l2.disk_full()) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "writing L3 rows to the L2 cache failed")
                }
                Err(e) => tracing::error!(error = %e, "L2 write-back task failed"),
            }
        }
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut flights = self
            .tiers
            .inner
            .flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for id in &self.ids {
            if let Entry::Occupied(entry) = flights.by_row.entry(*id) {
                if entry.get().0 == self.flight_no {
                    entry.remove();
                }
            }
        }
        flights.open.remove(&self.flight_no);
    }
}

#[cfg(test)]
mod tests {
    //! The fetch path over fake stores ([`crate::features::store`]): no
    //! RocksDB, no Redis. The real stores are tested in
    //! `sidecar/tests/feature_tiers.rs`.
    use super::*;
    use crate::features::contract::encode_row;
    use std::collections::HashMap;
    use std::path::Path;

    const DIM: usize = 4;

    fn row(id: u64) -> Vec<f32> {
        (0..DIM).map(|j| id as f32 + j as f32 / 10.0).collect()
    }

    #[derive(Debug)]
    struct FakeLocal {
        role: Role,
        rows: Mutex<HashMap<u64, Vec<u8>>>,
    }

    impl FakeLocal {
        fn new(role: Role, ids: &[u64]) -> Arc<Self> {
            let rows = ids.iter().map(|&id| (id, encode_row(&row(id)))).collect();
            Arc::new(Self {
                role,
                rows: Mutex::new(rows),
            })
        }

        fn has(&self, id: u64) -> bool {
            self.rows.lock().unwrap().contains_key(&id)
        }
    }

    impl LocalStore for FakeLocal {
        fn role(&self) -> Role {
            self.role
        }
        fn path(&self) -> &Path {
            Path::new("fake")
        }
        fn get_many(&self, ids: &[u64], row_bytes: usize) -> Vec<Option<Vec<u8>>> {
            let rows = self.rows.lock().unwrap();
            ids.iter()
                .map(|id| rows.get(id).filter(|r| r.len() == row_bytes).cloned())
                .collect()
        }
        fn put_rows(&self, rows: &[(u64, Vec<u8>)]) -> anyhow::Result<()> {
            self.rows.lock().unwrap().extend(rows.iter().cloned());
            Ok(())
        }
        fn delete_many(&self, ids: &[u64]) -> anyhow::Result<()> {
            let mut rows = self.rows.lock().unwrap();
            for id in ids {
                rows.remove(id);
            }
            Ok(())
        }
        fn clear(&self) -> anyhow::Result<()> {
            anyhow::ensure!(
                self.role != Role::StoreOfRecord,
                "the store of record is never cleared"
            );
            self.rows.lock().unwrap().clear();
            Ok(())
        }
        fn disk_full(&self) -> bool {
            false
        }
    }

    #[derive(Debug, Default)]
    struct FakeRemote {
        rows: HashMap<u64, Vec<u8>>,
        round_trips: AtomicU64,
        fail: bool,
        delay: Duration,
    }

    impl FakeRemote {
        fn new(ids: &[u64]) -> Self {
            Self {
                rows: ids.iter().map(|&id| (id, encode_row(&row(id)))).collect(),
                ..Self::default()
            }
        }
    }

    impl RemoteStore for FakeRemote {
        fn shown(&self) -> &str {
            "fake://remote"
        }
        fn get_many<'a>(
            &'a self,
            ids: &'a [u64],
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = crate::features::store::RemoteRows> + Send + 'a>,
        > {
            Box::pin(async move {
                self.round_trips.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(self.delay).await;
                anyhow::ensure!(!self.fail, "the fake remote is down");
                Ok(ids.iter().map(|id| self.rows.get(id).cloned()).collect())
            })
        }
    }

    #[tokio::test]
    async fn the_fakes_keep_the_stores_contract() {
        use crate::features::store::conformance;
        let cache = Role::Cache {
            max_bytes: 1 << 20,
            ttl: Duration::from_secs(60),
        };
        for role in [Role::StoreOfRecord, cache] {
            conformance::local_store(FakeLocal::new(role, &[]).as_ref());
        }
        let remote = FakeRemote {
            rows: conformance::remote_rows().into_iter().collect(),
            ..FakeRemote::default()
        };
        conformance::remote_store(&remote).await;
    }

    /// Tiers without an L1 cache, so that every fetch reaches the stores.
    fn tiers(l2: Option<Arc<FakeLocal>>, l3: Option<Arc<FakeRemote>>) -> FeatureTiers {
        let config = TierConfig {
            l1_bytes: 0,
            ..TierConfig::new(DIM)
        };
        FeatureTiers::with_stores(
            &config,
            l2.map(|s| s as Arc<dyn LocalStore>),
            l3.map(|s| s as Arc<dyn RemoteStore>),
        )
    }

    async fn fetch(
        tiers: &FeatureTiers,
        ids: &[u64],
        within: Duration,
    ) -> (Vec<f32>, Vec<RowSource>) {
        let mut features = vec![f32::NAN; ids.len() * DIM];
        let mut sources = vec![RowSource::default(); ids.len()];
        let deadline = Some(Instant::now() + within);
        tiers
            .fetch_into(ids, deadline, &mut features, &mut sources)
            .await;
        (features, sources)
    }

    const CACHE: Role = Role::Cache {
        max_bytes: 1 << 20,
        ttl: Duration::from_secs(60),
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_from_the_remote_are_written_back_to_a_local_cache_and_served_from_it() {
        let local = FakeLocal::new(CACHE, &[]);
        let remote = Arc::new(FakeRemote::new(&[1, 2]));
        let tiers = tiers(Some(local.clone()), Some(remote.clone()));
        let (features, sources) = fetch(&tiers, &[1, 2], Duration::from_secs(5)).await;
        assert!(sources.iter().all(|s| s.tier == tier::L3 && !s.fallback));
        assert_eq!(&features[DIM..], &row(2)[..]);
        // The write-back counts its rows after it wrote them, off the
        // request's path: wait for both.
        let deadline = Instant::now() + Duration::from_secs(10);
        let writes = || tiers.stats().l2_writes.load(Ordering::Relaxed);
        while !(local.has(1) && local.has(2) && writes() == 2) {
            assert!(Instant::now() < deadline, "the rows were written back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (features, sources) = fetch(&tiers, &[2, 1], Duration::from_secs(5)).await;
        assert!(sources.iter().all(|s| s.tier == tier::L2), "{sources:?}");
        assert_eq!(&features[..DIM], &row(2)[..]);
        assert_eq!(remote.round_trips.load(Ordering::Relaxed), 1);
        assert_eq!(writes(), 2, "each row written back once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_of_record_serves_what_it_has_and_missing_rows_are_flagged() {
        let local = FakeLocal::new(Role::StoreOfRecord, &[1]);
        let tiers = tiers(Some(local.clone()), None);
        let (features, sources) = fetch(&tiers, &[1, 9], Duration::from_secs(5)).await;
        assert_eq!(
            sources[0],
            RowSource {
                tier: tier::L2,
                fallback: false,
                late: false
            }
        );
        assert_eq!(sources[1], RowSource::DEFAULT);
        assert_eq!(&features[..DIM], &row(1)[..]);
        assert!(features[DIM..].iter().all(|&v| v == 0.0), "the zeros row");
        assert_eq!(tiers.stats().fallback_missing.load(Ordering::Relaxed), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!local.has(9), "nothing is written to a store of record");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_remote_costs_flagged_default_rows_never_an_error() {
        let remote = Arc::new(FakeRemote {
            fail: true,
            ..FakeRemote::new(&[1, 2, 3])
        });
        let tiers = tiers(None, Some(remote));
        let (_, sources) = fetch(&tiers, &[1, 2, 3], Duration::from_secs(5)).await;
        assert!(
            sources.iter().all(|s| *s == RowSource::DEFAULT),
            "{sources:?}"
        );
        assert_eq!(
            tiers.stats().fallback_unavailable.load(Ordering::Relaxed),
            3
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_remote_slower_than_the_deadline_costs_late_rows() {
        let remote = Arc::new(FakeRemote {
            delay: Duration::from_millis(300),
            ..FakeRemote::new(&[1, 2])
        });
        let tiers = tiers(None, Some(remote));
        let (_, sources) = fetch(&tiers, &[1, 2], Duration::from_millis(10)).await;
        let late = RowSource {
            late: true,
            ..RowSource::DEFAULT
        };
        assert!(sources.iter().all(|s| *s == late), "{sources:?}");
        assert_eq!(tiers.stats().fallback_deadline.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_invalidation_deletes_a_local_caches_rows() {
        let local = FakeLocal::new(CACHE, &[1, 2]);
        let tiers = tiers(Some(local.clone()), Some(Arc::new(FakeRemote::new(&[]))));
        tiers.invalidate(&[1]).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while local.has(1) {
            assert!(
                Instant::now() < deadline,
                "row 1 was deleted from the cache"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(local.has(2), "only the invalidated row goes");
    }
}
