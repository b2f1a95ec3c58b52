//! The follower: reads the update stream from this replica's position and
//! applies each entry, in order, to the feature store, the caches and the
//! graph (docs/updates.md, "Following the stream").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use daemon_kit::metrics::{Out, Telemetry};
use daemon_kit::readiness::Latch;
use prometheus_client::metrics::histogram::Histogram;
use redis::Value;

use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::features::rocks::{RocksStore, Role};
use crate::features::FeatureTiers;
use crate::graph::live::{MAX_ID_GROWTH, MAX_NODE_ID};
use crate::graph::{GraphUpdate, LiveGraph, StreamPosition};
use crate::updates::entry::Op;
use crate::updates::typed_entry::{self, GraphOp};

/// Entries read per XREAD.
pub const BATCH: usize = 1_000;
/// How long one XREAD waits for new entries (below the Redis client's
/// 500 ms response timeout).
const BLOCK_MS: u64 = 200;
/// How often the follower checks that the stream was not trimmed past it.
const TRIM_CHECK: Duration = Duration::from_secs(60);
/// Most entries past its position a replica counts to check for a trim;
/// further behind, the check waits until it has caught up.
const MAX_CHECKED: u64 = 1_000_000;

/// Counters and state of the follower, read by the metrics endpoint and
/// `sidecarctl status`.
#[derive(Debug)]
pub struct FollowerStats {
    pub stream: String,
    position_ms: AtomicU64,
    position_seq: AtomicU64,
    /// Milliseconds (stream time) of the last applied entry.
    last_entry_ms: AtomicU64,
    /// The last read found nothing more to apply.
    caught_up: AtomicBool,
    /// Applied entries per op: add_node, add_edges, set_features, invalidate.
    pub applied: [AtomicU64; 4],
    pub malformed: AtomicU64,
    pub read_errors: AtomicU64,
    /// Why this replica cannot follow any more (its position was trimmed).
    stale: Mutex<Option<String>>,
    /// Whether `stale` is set (read on every batch, without the lock).
    is_stale: AtomicBool,
    /// Seconds from an entry's id time to its change being visible.
    pub apply_lag: Histogram,
    /// Held until the stream is replayed to its end at start, and again
    /// for good once the stream is found trimmed past this replica.
    latch: Latch,
}

/// The follower at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowerSnapshot {
    pub stream: String,
    pub position: StreamPosition,
    pub lag_seconds: f64,
    /// Entries applied per op ([`OPS`]).
    pub applied: [u64; 4],
    pub malformed: u64,
    pub read_errors: u64,
    pub stale: bool,
}

pub const OPS: [&str; 4] = ["add_node", "add_edges", "set_features", "invalidate"];

/// Buckets of the apply lag, seconds.
const LAG_BUCKETS: [f64; 14] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];

impl FollowerStats {
    /// `latch` is held until [`FollowerStats::caught_up_at_start`].
    pub fn new(stream: &str, latch: Latch) -> Self {
        Self {
            latch,
            stream: stream.to_string(),
            position_ms: AtomicU64::new(0),
            position_seq: AtomicU64::new(0),
            last_entry_ms: AtomicU64::new(0),
            caught_up: AtomicBool::new(false),
            applied: Default::default(),
            malformed: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            stale: Mutex::new(None),
            is_stale: AtomicBool::new(false),
            apply_lag: Histogram::new(LAG_BUCKETS),
        }
    }

    /// The last entry applied (or skipped as malformed).
    pub fn position(&self) -> StreamPosition {
        StreamPosition {
            ms: self.position_ms.load(Ordering::Acquire),
            seq: self.position_seq.load(Ordering::Acquire),
        }
    }

    fn set_position(&self, position: StreamPosition) {
        self.position_ms.store(position.ms, Ordering::Release);
        self.position_seq.store(position.seq, Ordering::Release);
    }

    /// Now minus the time of the last applied entry while entries are
    /// pending; 0 once everything the stream holds is applied.
    pub fn lag_seconds(&self) -> f64 {
        if self.caught_up.load(Ordering::Acquire) {
            return 0.0;
        }
        let last = self.last_entry_ms.load(Ordering::Acquire);
        if last == 0 {
            return 0.0;
        }
        (now_ms().saturating_sub(last)) as f64 / 1e3
    }

    /// Why the replica refuses to serve, if it does.
    pub fn stale(&self) -> Option<String> {
        if !self.is_stale.load(Ordering::Acquire) {
            return None;
        }
        self.stale.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_stale(&self, why: String) {
        self.latch.hold(why.clone());
        *self.stale.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.is_stale.store(true, Ordering::Release);
    }

    /// The stream is replayed to its end: ready, unless it was found
    /// trimmed past this replica meanwhile.
    pub fn caught_up_at_start(&self) {
        if !self.is_stale.load(Ordering::Acquire) {
            self.latch.release();
        }
    }

    pub fn snapshot(&self) -> FollowerSnapshot {
        FollowerSnapshot {
            stream: self.stream.clone(),
            position: self.position(),
            lag_seconds: self.lag_seconds(),
            applied: self.applied.each_ref().map(|n| n.load(Ordering::Relaxed)),
            malformed: self.malformed.load(Ordering::Relaxed),
            read_errors: self.read_errors.load(Ordering::Relaxed),
            stale: self.is_stale.load(Ordering::Acquire),
        }
    }
}

/// Registered at the sidecar's top level (`sidecar_update_*`,
/// `sidecar_updates_*`), only when the sidecar follows a stream.
impl Telemetry for FollowerStats {
    fn encode(&self, out: &mut Out<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        out.gauge(
            "update_lag_seconds",
            "now minus the time of the last applied update-stream entry while entries are \
             pending; 0 when caught up",
            s.lag_seconds,
        )?;
        out.gauge(
            "update_position_ms",
            "the millisecond part of the last applied update-stream entry's id",
            s.position.ms,
        )?;
        let applied: [(&str, u64); 4] = std::array::from_fn(|i| (OPS[i], s.applied[i]));
        out.counters(
            "updates_applied",
            "update-stream entries applied, per op",
            "op",
            &applied,
        )?;
        out.counter(
            "updates_malformed",
            "update-stream entries skipped whole as malformed",
            s.malformed,
        )?;
        out.counter(
            "updates_read_errors",
            "failed reads of the update stream (retried)",
            s.read_errors,
        )?;
        out.gauge(
            "updates_stale",
            "1 once the stream was trimmed past this replica's position (it reports not \
             ready and refuses requests; re-seed it)",
            u64::from(s.stale),
        )?;
        out.metric(
            "update_apply_lag_seconds",
            "per applied entry, from its id's time to its change being visible",
            &self.apply_lag,
        )
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the follower applies entries to.
#[derive(Debug, Clone)]
pub struct Targets {
    pub graph: LiveGraph,
    /// A one-type graph's row width in bytes (4 x feature_dim): its entries
    /// are one-type entries (docs/updates.md). `None` for a typed graph,
    /// whose entries name their types.
    pub one_type_row_bytes: Option<usize>,
    /// Per node type (the one type of a one-type graph): its tiers and
    /// embedded store; `None` for a type without features.
    pub features: Vec<Option<FeatureTarget>>,
}

/// A node type's features as the follower changes them.
#[derive(Debug, Clone)]
pub struct FeatureTarget {
    pub tiers: FeatureTiers,
    /// The embedded store: store of record (rows written), or L2 cache
    /// (rows evicted); both record their position.
    pub store: Option<Arc<RocksStore>>,
}

/// One entry, parsed, checked and split into what each part applies.
#[derive(Debug, Default)]
struct Parsed {
    /// `(node type, id, row)`.
    rows: Vec<(usize, u64, Vec<u8>)>,
    /// `(node type, id)`.
    evicted: Vec<(usize, u64)>,
    graph: Option<GraphUpdate>,
    /// Index in [`OPS`].
    op: usize,
}

impl Targets {
    /// Parses and checks one entry against the graph as the entries before
    /// it leave it (`bounds`, each node type's id bound, advanced here):
    /// the same judgement on every replica.
    fn parse(&self, fields: &[(Vec<u8>, Vec<u8>)], bounds: &mut [u64]) -> Result<Parsed, String> {
        let graph = self.graph.snapshot();
        // A one-type entry is the 1x1 typed graph's operation: one check
        // against the graph's types for both.
        let op = match self.one_type_row_bytes {
            Some(row_bytes) => {
                if typed_entry::is_typed(fields) {
                    return Err("the entry names a node type or an edge type (`type`, \
                                `edges:<edge type>`): this replica serves a one-type graph"
                        .into());
                }
                GraphOp::from(Op::from_fields(fields, row_bytes)?)
            }
            None => {
                if !typed_entry::is_typed(fields) {
                    return Err(format!(
                        "this replica serves a typed graph ({} node types): the entry names no \
                         node type (`type`) or edge type (`edges:<edge type>`) \
                         (docs/updates.md, \"Typed graphs\")",
                        graph.schema().node_types.len()
                    ));
                }
                GraphOp::from_fields(fields)?
            }
        };
        let change = op.resolve(graph.schema())?;
        let mut parsed = Parsed {
            rows: change.rows,
            evicted: change.evicted,
            graph: change.update,
            op: op_index(op.name()),
        };
        // The graph's id rule.
        let mut largest: Vec<Option<u64>> = vec![None; bounds.len()];
        if let Some(update) = &parsed.graph {
            for (t, id) in update.ids(&graph.schema().ends()) {
                largest[t] = Some(largest[t].map_or(id, |m| m.max(id)));
            }
        }
        for (t, max) in largest.iter().enumerate() {
            let Some(max) = *max else { continue };
            if max >= bounds[t] + MAX_ID_GROWTH {
                return Err(format!(
                    "node id {max} lies {MAX_ID_GROWTH} or more ids past the graph's largest id \
                     {}{}",
                    bounds[t].saturating_sub(1),
                    match self.one_type_row_bytes {
                        None => format!(" of node type {}", graph.schema().node_types[t].name),
                        Some(_) => String::new(),
                    }
                ));
            }
            debug_assert!(max <= MAX_NODE_ID);
        }
        for (t, max) in largest.iter().enumerate() {
            if let Some(max) = max {
                bounds[t] = bounds[t].max(max + 1);
            }
        }
        parsed
            .rows
            .retain(|(t, _, _)| self.features.get(*t).is_some_and(Option::is_some));
        Ok(parsed)
    }
}

/// One replica's follower of the stream.
#[derive(Debug)]
pub struct Follower {
    redis: RedisTier,
    stream: String,
    targets: Targets,
    stats: Arc<FollowerStats>,
    /// Next read starts after this.
    position: StreamPosition,
    /// Entries consumed (applied or skipped) up to `position`.
    consumed: u64,
    /// The graph holds every entry up to here.
    graph_position: StreamPosition,
    /// The embedded store holds every entry's rows and evictions up to here.
    store_position: StreamPosition,
    trim_checked: Instant,
}

impl Follower {
    /// Connects, reads the positions the graph and the store record, and
    /// refuses to start if the stream was trimmed past them.
    pub async fn start(
        redis: &RedisConfig,
        stream: &str,
        targets: Targets,
        stats: Arc<FollowerStats>,
    ) -> anyhow::Result<Self> {
        let connection = RedisTier::connect(redis)
            .await
            .with_context(|| format!("connecting to the update stream's Redis ({stream})"))?;
        let graph_at = {
            let graph = targets.graph.snapshot();
            (graph.position(), graph.consumed())
        };
        // A cache that lost its position (a flush, FIFO compaction) replays
        // from the graph's: evictions are idempotent. With several stores
        // (a typed graph's node types) the oldest decides: writing a row
        // again, or evicting again, changes nothing.
        let store_at = targets
            .features
            .iter()
            .flatten()
            .filter_map(|f| f.store.as_ref())
            .map(|store| match (store.update_position(), store.role()) {
                (Some(at), _) => at,
                (None, Role::StoreOfRecord) => (StreamPosition::START, 0),
                (None, Role::Cache { .. }) => graph_at,
            })
            .min()
            .unwrap_or(graph_at);
        let (graph_position, store_position) = (graph_at.0, store_at.0);
        let (position, consumed) = graph_at.min(store_at);
        stats.set_position(position);
        let follower = Self {
            redis: connection,
            stream: stream.to_string(),
            targets,
            stats,
            position,
            consumed,
            graph_position,
            store_position,
            trim_checked: Instant::now(),
        };
        tracing::info!(
            stream,
            position = %position,
            graph_position = %graph_position,
            store_position = %store_position,
            "following the update stream"
        );
        Ok(follower)
    }

    /// Applies everything the stream holds now, then checks that no entry
    /// after the position it started from was deleted (if one was, fails
    /// with how to re-seed the replica); returns the entries read.
    pub async fn catch_up(&mut self) -> anyhow::Result<u64> {
        let mut total = 0;
        loop {
            let n = self.step(None).await?;
            total += n as u64;
            if n < BATCH {
                break;
            }
        }
        if let Some(why) = self.trimmed_past().await? {
            bail!(why);
        }
        Ok(total)
    }

    /// Follows the stream for the life of the runtime: reads, applies, and
    /// once a minute checks that the stream was not trimmed past this
    /// replica (if it was, marks the replica stale and stops).
    pub async fn run(mut self) {
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.trim_checked.elapsed() >= TRIM_CHECK {
                self.trim_checked = Instant::now();
                match self.trimmed_past().await {
                    Ok(Some(why)) => {
                        tracing::error!(stream = %self.stream, "{why}");
                        self.stats.set_stale(why);
                        return;
                    }
                    Ok(None) => {}
                    Err(e) => self.log_error(&e),
                }
            }
            match self.step(Some(BLOCK_MS)).await {
                Ok(_) => backoff = Duration::from_millis(50),
                Err(e) => {
                    self.log_error(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    fn log_error(&self, e: &anyhow::Error) {
        let n = self.stats.read_errors.fetch_add(1, Ordering::Relaxed) + 1;
        // The 1st, 2nd, 4th, 8th... failure: Redis down must not flood the log.
        if n.is_power_of_two() {
            tracing::warn!(
                stream = %self.stream,
                errors = n,
                error = %format!("{e:#}"),
                "reading the update stream failed; retrying (updates wait, serving goes on)"
            );
        }
    }

    /// Whether entries after this replica's position were deleted (an
    /// XDEL, or a trim past it): then it cannot catch up. Exact, from
    /// Redis's count of entries ever added: of those, this replica consumed
    /// `consumed` up to its position, so the rest must still be there. The
    /// message says how to re-seed the replica.
    async fn trimmed_past(&self) -> anyhow::Result<Option<String>> {
        let lost = |what: String| {
            Some(format!(
                "{what}: this replica (at {} of the update stream {}) cannot catch up and \
                 refuses to serve a stale graph. Re-seed it: stop it, replace its data directory \
                 with a fresh `sidecar import` (or a copy of a current replica's), start it \
                 again; and trim only entries older than every replica's position \
                 (docs/updates.md, \"Trimming\")",
                self.position, self.stream
            ))
        };
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("STREAM").arg(&self.stream);
        let info: Value = match self.redis.query(&cmd).await {
            Ok(info) => info,
            Err(e) if e.to_string().to_lowercase().contains("no such key") => {
                return Ok((self.consumed > 0)
                    .then(|| {
                        lost(format!(
                        "the update stream {} does not exist, but this replica's data holds {} \
                         of its entries (the stream was deleted, or this is the wrong Redis)",
                        self.stream, self.consumed
                    ))
                    })
                    .flatten())
            }
            Err(e) => return Err(e).context("XINFO STREAM"),
        };
        let id = |name: &str| {
            field(&info, name)
                .and_then(text)
                .and_then(|t| StreamPosition::parse(&t))
        };
        let deleted = id("max-deleted-entry-id").unwrap_or_default();
        if deleted > self.position {
            return Ok(lost(format!(
                "entry {deleted}, after this replica's position, was deleted"
            )));
        }
        let (Some(added), Some(last)) = (
            field(&info, "entries-added").and_then(int),
            id("last-generated-id"),
        ) else {
            // A Redis before 7.0 keeps no count: only XDEL is detected.
            return Ok(None);
        };
        let Some(after) = added.checked_sub(self.consumed) else {
            return Ok(lost(format!(
                "the stream counts {added} entries ever added, fewer than the {} this replica \
                 consumed (it was deleted and re-created, or this is the wrong Redis)",
                self.consumed
            )));
        };
        if after == 0 || after > MAX_CHECKED {
            // Nothing after the position, or too far behind to count now:
            // checked again once caught up.
            return Ok(None);
        }
        let mut range = redis::cmd("XRANGE");
        range
            .arg(&self.stream)
            .arg(format!("({}", self.position))
            .arg(last.to_string())
            .arg("COUNT")
            .arg(after);
        let present: Value = self.redis.query(&range).await.context("XRANGE")?;
        let present = match present {
            Value::Array(entries) => entries.len() as u64,
            _ => 0,
        };
        Ok((present < after)
            .then(|| {
                lost(format!(
                    "{} of the {after} entries added after this replica's position are gone (the \
                 stream was trimmed past it)",
                    after - present
                ))
            })
            .flatten())
    }

    /// One XREAD (blocking up to `block_ms`) and the application of what it
    /// returned; returns the entries read.
    async fn step(&mut self, block_ms: Option<u64>) -> anyhow::Result<usize> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(BATCH);
        if let Some(ms) = block_ms {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS")
            .arg(&self.stream)
            .arg(self.position.to_string());
        let reply: Value = self.redis.query(&cmd).await.context("XREAD")?;
        let entries = parse_xread(&reply)?;
        if entries.is_empty() {
            self.stats.caught_up.store(true, Ordering::Release);
            return Ok(0);
        }
        let n = entries.len();
        self.apply(entries).await?;
        self.stats.caught_up.store(n < BATCH, Ordering::Release);
        Ok(n)
    }

    /// Applies a batch in stream order: rows and evictions, then the graph
    /// changes in one snapshot.
    async fn apply(&mut self, entries: Vec<Entry>) -> anyhow::Result<()> {
        let last = entries
            .last()
            .map(|(id, _)| *id)
            .expect("a non-empty batch");
        let consumed = self.consumed + entries.len() as u64;
        let mut bounds = self.targets.graph.snapshot().id_bounds().to_vec();
        let n_types = self.targets.features.len();
        let mut rows: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new(); n_types];
        let mut evicted: Vec<Vec<u64>> = vec![Vec::new(); n_types];
        let mut updates: Vec<GraphUpdate> = Vec::new();
        let mut applied = Vec::new();
        for (id, fields) in entries {
            let parsed = match self.targets.parse(&fields, &mut bounds) {
                Ok(parsed) => parsed,
                Err(why) => {
                    let n = self.stats.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= 100 || n.is_power_of_two() {
                        tracing::warn!(
                            stream = %self.stream,
                            entry = %id,
                            malformed = n,
                            "skipped a malformed update entry: {why}"
                        );
                    }
                    continue;
                }
            };
            if id > self.store_position {
                for (t, node, row) in parsed.rows {
                    rows[t].push((node, row));
                }
                for (t, node) in parsed.evicted {
                    evicted[t].push(node);
                }
            }
            if id > self.graph_position {
                updates.extend(parsed.graph);
            }
            applied.push((id, parsed.op));
        }
        // Rows first (and each store's position with them), then evictions
        // from every cache, then the graph: a node is never reachable before
        // its row is stored, nor served an evicted row after it is.
        if last > self.store_position {
            for (t, target) in self.targets.features.iter().enumerate() {
                let Some(target) = target else { continue };
                let mut rows = std::mem::take(&mut rows[t]);
                let evicted = &mut evicted[t];
                if let Some(store) = target.store.clone() {
                    // A cache holds Redis's rows, which the producer wrote:
                    // it only evicts. The store of record takes the rows.
                    if store.role() != Role::StoreOfRecord {
                        rows.clear();
                    }
                    let evicted_for_store = evicted.clone();
                    tokio::task::spawn_blocking(move || {
                        store.apply_updates(
                            rows.iter().map(|(id, row)| (*id, row.as_slice())),
                            &evicted_for_store,
                            last,
                            consumed,
                        )
                    })
                    .await
                    .context("the store writer panicked")??;
                }
                evicted.sort_unstable();
                evicted.dedup();
                if !evicted.is_empty() {
                    target.tiers.invalidate(evicted).await;
                }
            }
            self.store_position = last;
        }
        if last > self.graph_position {
            let refused: Vec<String> = self
                .targets
                .graph
                .apply(&updates, Some((last, consumed)))
                .into_iter()
                .filter_map(|o| o.err().map(|e| format!("{e:#}")))
                .collect();
            for e in refused {
                // Checked above with the same rule: not expected.
                tracing::warn!(error = %e, "an update entry was refused by the graph");
            }
            self.graph_position = last;
        }
        let now = now_ms();
        for (id, op) in &applied {
            self.stats.applied[*op].fetch_add(1, Ordering::Relaxed);
            self.stats
                .apply_lag
                .observe(now.saturating_sub(id.ms) as f64 / 1e3);
        }
        self.position = last;
        self.consumed = consumed;
        self.stats.set_position(last);
        self.stats.last_entry_ms.store(last.ms, Ordering::Release);
        Ok(())
    }
}

/// The index of op `name` in [`OPS`].
fn op_index(name: &str) -> usize {
    OPS.iter()
        .position(|op| *op == name)
        .expect("every op is one of OPS")
}

/// An entry as read: its id and its fields.
type Entry = (StreamPosition, Vec<(Vec<u8>, Vec<u8>)>);

/// The entries of an XREAD reply for one stream (RESP2 arrays or RESP3
/// maps); nil (a timeout) is no entry.
fn parse_xread(reply: &Value) -> anyhow::Result<Vec<Entry>> {
    let streams: Vec<&Value> = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(items) => items.iter().collect(),
        Value::Map(pairs) => pairs.iter().map(|(_, v)| v).collect(),
        other => bail!("XREAD answered {other:?}"),
    };
    let mut out = Vec::new();
    for stream in streams {
        // RESP2: [key, entries]; RESP3 map value: entries.
        let entries = match stream {
            Value::Array(pair) if pair.len() == 2 && matches!(pair[1], Value::Array(_)) => &pair[1],
            other => other,
        };
        let Value::Array(entries) = entries else {
            bail!("XREAD answered a stream that is not a list of entries");
        };
        for entry in entries {
            let Value::Array(parts) = entry else {
                bail!("XREAD answered an entry that is not [id, fields]");
            };
            let (Some(id), Some(fields)) = (parts.first().and_then(text), parts.get(1)) else {
                bail!("XREAD answered an entry without id or fields");
            };
            let id = StreamPosition::parse(&id)
                .with_context(|| format!("XREAD answered an entry id {id:?}"))?;
            let flat: Vec<Vec<u8>> = match fields {
                Value::Array(values) => values.iter().map(bytes).collect(),
                Value::Map(pairs) => pairs
                    .iter()
                    .flat_map(|(k, v)| [bytes(k), bytes(v)])
                    .collect(),
                Value::Nil => Vec::new(),
                _ => bail!("XREAD answered entry {id} with fields that are not a list"),
            };
            let fields = flat
                .chunks(2)
                .map(|kv| (kv[0].clone(), kv.get(1).cloned().unwrap_or_default()))
                .collect();
            out.push((id, fields));
        }
    }
    Ok(out)
}

fn bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::BulkString(b) => b.clone(),
        Value::SimpleString(s) => s.as_bytes().to_vec(),
        Value::Int(i) => i.to_string().into_bytes(),
        _ => Vec::new(),
    }
}

fn int(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => text(other)?.parse().ok(),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The value of `name` in an XINFO reply (a flat [name, value, ...] array
/// or a map).
fn field<'a>(info: &'a Value, name: &str) -> Option<&'a Value> {
    match info {
        Value::Array(items) => items
            .chunks(2)
            .find(|kv| text(&kv[0]).as_deref() == Some(name))
            .and_then(|kv| kv.get(1)),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}
