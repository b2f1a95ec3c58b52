//! The graph as served: the mapped base index plus the nodes and edges added
//! while serving, switched atomically.
//!
//! A [`GraphSnapshot`] is immutable: the base [`CsrIndex`] and a
//! [`Delta`] of added rows (a persistent map: an update copies only the
//! paths of the ids it touches). An update builds the next snapshot and
//! publishes it with one atomic pointer swap. A request samples from the
//! snapshot it loaded when it started, so in-flight requests finish on the
//! old version and new requests see the new one; nothing is dropped and no
//! lock is taken on the sampling path.
//!
//! Known nodes: the base index's (every id below its node count, or those
//! of its bitmap) and every id an update added, by itself or as an edge's
//! endpoint. Adding id `k` past the end does not make the ids in between
//! known. New ids are servable (inductive serving of new users) as soon as
//! the snapshot that added them is published.
//!
//! Compaction ([`LiveGraph::compact`]) writes base + delta as a new CSR file
//! through the regular builder, renames it over the index, maps it, and
//! publishes a snapshot with an empty delta plus the updates applied while
//! it ran. Neither updates nor sampling wait for the build.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Context};
use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::Xxh3;

use crate::graph::build::{self, BuildOptions, BuildStats, EdgeFile};
use crate::graph::changes::Changes;
use crate::graph::delta::{Delta, Row};
use crate::graph::format::StreamPosition;
use crate::graph::sampler::NeighborSource;
use crate::graph::CsrIndex;

/// How far past the graph's id bound (largest known id + 1) one update may
/// add nodes (docs/graph-index.md, "Updates").
pub const MAX_ID_GROWTH: u64 = 1 << 20;

/// The largest node id (docs/graph-index.md): ids are u32, and 2^32 - 1 is
/// reserved.
pub const MAX_NODE_ID: u64 = u32::MAX as u64 - 1;

/// One update: nodes to make known and edges to add, applied whole or not
/// at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphUpdate {
    /// Ids to make known (isolated until edges arrive).
    pub nodes: Vec<u64>,
    /// `(src, dst)` edges; unknown endpoints become known nodes.
    pub edges: Vec<(u64, u64)>,
    /// Also add every edge's reverse.
    pub undirected: bool,
}

/// An immutable view of the graph: base index + added rows.
#[derive(Debug)]
pub struct GraphSnapshot {
    base: Arc<CsrIndex>,
    /// Added neighbours per node, and the known nodes the base lacks.
    delta: Delta,
    /// Known nodes.
    known: u64,
    /// Largest known id + 1.
    id_bound: u64,
    added_edges: u64,
    /// Updates applied since the graph's import.
    generation: u64,
    /// The last update-stream entry applied.
    position: StreamPosition,
    /// Update-stream entries consumed up to `position`.
    consumed: u64,
}

impl GraphSnapshot {
    pub fn base(&self) -> &CsrIndex {
        &self.base
    }

    /// Known nodes.
    pub fn n_nodes(&self) -> u64 {
        self.known
    }

    /// Largest known id + 1: what a compaction's index spans.
    pub fn id_bound(&self) -> u64 {
        self.id_bound
    }

    pub fn n_edges(&self) -> u64 {
        self.base.n_edges() + self.added_edges
    }

    /// Edges added since the base index.
    pub fn added_edges(&self) -> u64 {
        self.added_edges
    }

    /// Entries of the delta (nodes with added edges, added nodes).
    pub fn delta_entries(&self) -> u64 {
        self.delta.len()
    }

    /// Updates applied since the graph's import (a compaction keeps it).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The last update-stream entry this graph holds.
    pub fn position(&self) -> StreamPosition {
        self.position
    }

    /// Update-stream entries consumed (applied or skipped) up to
    /// `position`.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    pub fn graph_version(&self) -> u64 {
        self.base.graph_version()
    }

    pub fn is_known(&self, node: u64) -> bool {
        let Ok(node) = u32::try_from(node) else {
            return false;
        };
        self.base.is_known(node) || self.delta.get(node).is_some()
    }

    fn added_row(&self, node: u32) -> &[u32] {
        self.delta.get(node).map(|row| &row[..]).unwrap_or(&[])
    }

    /// All neighbours of `node`, sorted, as ids.
    pub fn neighbors(&self, node: u64) -> Vec<u64> {
        let Ok(node) = u32::try_from(node) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        merge_sorted(self.base.neighbors(node), self.added_row(node), |v| {
            out.push(u64::from(v))
        });
        out
    }

    /// A digest of the served graph: its known nodes and each one's sorted
    /// neighbours, whether they lie in the index or the delta. Replicas that
    /// applied the same updates print the same digest, compacted or not.
    pub fn checksum(&self) -> u64 {
        let mut digest = 0u64;
        let mut row = Vec::new();
        for node in 0..self.id_bound as u32 {
            if !self.is_known(u64::from(node)) {
                continue;
            }
            row.clear();
            row.extend_from_slice(&node.to_le_bytes());
            merge_sorted(self.base.neighbors(node), self.added_row(node), |v| {
                row.extend_from_slice(&v.to_le_bytes())
            });
            let mut hasher = Xxh3::new();
            hasher.update(&row);
            // A sum: the digest does not depend on the order nodes are met.
            digest = digest.wrapping_add(hasher.digest());
        }
        digest
    }

    /// This snapshot with one more node, `id`, and its edges to known nodes
    /// (both ways unless `directed`), exactly as an update adding them would
    /// make it, for one request to sample from (`NEW_NODE`): nothing is
    /// published. Costs what that update would (the paths of the ids it
    /// touches). Refuses an id the graph has or cannot take, and an edge to
    /// a node it does not have.
    pub fn with_new_node(
        &self,
        id: u64,
        neighbors: &[u64],
        directed: bool,
    ) -> anyhow::Result<GraphSnapshot> {
        ensure!(
            !self.is_known(id),
            "node {id} is already in the graph: predict it by its id (a new node needs an id \
             the graph does not have)"
        );
        if let Some(&unknown) = neighbors.iter().find(|&&n| !self.is_known(n)) {
            bail!(
                "the new node's neighbour {unknown} is not in the graph: a new node's edges must \
                 go to known nodes"
            );
        }
        let update = GraphUpdate {
            nodes: vec![id],
            edges: neighbors.iter().map(|&n| (id, n)).collect(),
            undirected: !directed,
        };
        // Nothing is published: no gaps are left behind.
        self.check(&update, u64::MAX)?;
        let mut next = GraphSnapshot {
            base: self.base.clone(),
            delta: self.delta.clone(),
            ..*self
        };
        next.apply(&update, &mut Vec::new());
        Ok(next)
    }

    /// Makes `node` known, if it is not.
    fn know(&mut self, node: u32) {
        if !self.is_known(u64::from(node)) {
            self.delta.insert(node, Row::from([]));
            self.known += 1;
            self.id_bound = self.id_bound.max(u64::from(node) + 1);
        }
    }

    /// Ids below the id bound that are not nodes.
    fn gaps(&self) -> u64 {
        self.id_bound.saturating_sub(self.known)
    }

    /// Refuses an update that names an id above the maximum or too far past
    /// the id bound, or that would leave `max_gaps` or more ids below the
    /// bound that are not nodes, naming the id; changes nothing.
    fn check(&self, update: &GraphUpdate, max_gaps: u64) -> anyhow::Result<()> {
        let ids = || {
            update
                .edges
                .iter()
                .flat_map(|&(s, d)| [s, d])
                .chain(update.nodes.iter().copied())
        };
        let Some(max_id) = ids().max() else {
            return Ok(());
        };
        ensure!(
            max_id <= MAX_NODE_ID,
            "node id {max_id} is too large: node ids must be at most {MAX_NODE_ID} (2^32 - 2)"
        );
        let largest = self.id_bound.saturating_sub(1);
        // `past` ids past the largest: refused from MAX_ID_GROWTH on.
        ensure!(
            max_id + 1 < self.id_bound + MAX_ID_GROWTH,
            "node id {max_id} lies {MAX_ID_GROWTH} or more ids past the graph's largest id \
             {largest}: node ids are dense; add the nodes in between first (or check the id)"
        );
        if max_id < self.id_bound {
            return Ok(());
        }
        // Past the end: the ids it skips stay gaps. Counted across updates,
        // so that many steps each within the bound cannot grow the id space
        // (and the next compaction's index) without end either.
        let mut past: Vec<u64> = ids().filter(|&id| id >= self.id_bound).collect();
        past.sort_unstable();
        past.dedup();
        let gaps = self.gaps() + (max_id + 1 - self.id_bound) - past.len() as u64;
        ensure!(
            gaps < max_gaps,
            "node id {max_id} would leave {gaps} ids below the graph's end that are not nodes, \
             {MAX_ID_GROWTH} more than the graph had when the sidecar started: node ids are \
             dense; add the nodes in between first (or check the id)"
        );
        Ok(())
    }

    /// Applies one checked update to this (private, next) snapshot; adds
    /// the nodes whose neighbour lists it changed (or that it made known)
    /// to `touched`.
    fn apply(&mut self, update: &GraphUpdate, touched: &mut Vec<u64>) -> UpdateStats {
        let known_before = self.known;
        for &node in &update.nodes {
            if !self.is_known(node) {
                touched.push(node);
            }
            self.know(node as u32);
        }
        // New neighbours per source node, before merging.
        let mut incoming: FxHashMap<u32, Vec<u32>> = FxHashMap::default();
        for &(src, dst) in &update.edges {
            let (src, dst) = (src as u32, dst as u32);
            for node in [src, dst] {
                if !self.is_known(u64::from(node)) {
                    touched.push(u64::from(node));
                }
                self.know(node);
            }
            incoming.entry(src).or_default().push(dst);
            if update.undirected {
                incoming.entry(dst).or_default().push(src);
            }
        }
        let mut edges_added = 0u64;
        let mut considered = 0u64;
        for (node, mut fresh) in incoming {
            considered += fresh.len() as u64;
            let base_row = self.base.neighbors(node);
            fresh.sort_unstable();
            fresh.dedup();
            let previous = self.added_row(node);
            fresh.retain(|&v| {
                v != node
                    && base_row.binary_search(&v).is_err()
                    && previous.binary_search(&v).is_err()
            });
            if fresh.is_empty() {
                continue;
            }
            let mut merged: Vec<u32> = Vec::with_capacity(previous.len() + fresh.len());
            merge_sorted(previous, &fresh, |v| merged.push(v));
            edges_added += fresh.len() as u64;
            touched.push(u64::from(node));
            self.delta.insert(node, merged.into());
        }
        self.added_edges += edges_added;
        self.generation += 1;
        UpdateStats {
            nodes_added: self.known - known_before,
            edges_added,
            edges_ignored: considered - edges_added,
            n_nodes: self.known,
            generation: self.generation,
        }
    }
}

/// The element at index `k` of the sorted union of two sorted, disjoint
/// rows: a binary search over how many of the first `k + 1` come from `a`.
pub(crate) fn kth_of_union(a: &[u32], b: &[u32], k: usize) -> u32 {
    debug_assert!(k < a.len() + b.len());
    let (mut lo, mut hi) = ((k + 1).saturating_sub(b.len()), (k + 1).min(a.len()));
    loop {
        let i = (lo + hi) / 2; // taken from a
        let j = k + 1 - i; // taken from b
        if i < a.len() && j > 0 && b[j - 1] > a[i] {
            lo = i + 1;
        } else if i > 0 && j < b.len() && a[i - 1] > b[j] {
            hi = i - 1;
        } else {
            return match (
                i.checked_sub(1).map(|x| a[x]),
                j.checked_sub(1).map(|x| b[x]),
            ) {
                (Some(x), Some(y)) => x.max(y),
                (Some(x), None) => x,
                (None, Some(y)) => y,
                (None, None) => unreachable!("k + 1 >= 1 elements are taken"),
            };
        }
    }
}

/// Calls `each` with the union of two sorted, disjoint rows, in order.
pub(crate) fn merge_sorted(a: &[u32], b: &[u32], mut each: impl FnMut(u32)) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if j == b.len() || (i < a.len() && a[i] < b[j]) {
            each(a[i]);
            i += 1;
        } else {
            each(b[j]);
            j += 1;
        }
    }
}

impl NeighborSource for GraphSnapshot {
    fn degree(&self, node: u64) -> Option<u32> {
        let node = u32::try_from(node).ok()?;
        let added = self.delta.get(node);
        if added.is_none() && !self.base.is_known(node) {
            return None;
        }
        Some(self.base.degree(node) + added.map_or(0, |row| row.len() as u32))
    }

    /// The `i`-th neighbour in increasing id order, wherever it lies
    /// (index or delta): the same on a replica that compacted and on one
    /// that did not, so sampling picks the same nodes on both.
    fn neighbor(&self, node: u64, i: u32) -> u64 {
        let node = node as u32;
        let base = self.base.neighbors(node);
        let added = self.added_row(node);
        if added.is_empty() {
            return u64::from(base[i as usize]);
        }
        u64::from(kth_of_union(base, added, i as usize))
    }
}

/// What an update changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateStats {
    /// Ids that were not known before.
    pub nodes_added: u64,
    pub edges_added: u64,
    /// Edges that were already present (or self loops), ignored.
    pub edges_ignored: u64,
    /// Known nodes after the update.
    pub n_nodes: u64,
    pub generation: u64,
}

/// When the graph compacts by itself.
#[derive(Debug, Clone)]
pub struct AutoCompact {
    /// The index file to rewrite.
    pub index_path: PathBuf,
    /// Delta entries plus added edges past which a compaction starts.
    pub after: u64,
}

#[derive(Debug, Default)]
struct WriterState {
    /// While a compaction builds: the updates applied since it took its
    /// snapshot, replayed on the new base.
    compacting: Option<Vec<GraphUpdate>>,
}

#[derive(Debug)]
struct Shared {
    current: ArcSwap<GraphSnapshot>,
    /// Marked with the nodes every update touches, before it is published.
    changes: Arc<Changes>,
    /// Serialises writers; readers never take it, and a compaction holds it
    /// only to take its snapshot and to switch to the new base.
    writer: Mutex<WriterState>,
    auto: Option<AutoCompact>,
    /// Compactions completed.
    compactions: AtomicU64,
    /// Updates are refused once they would leave this many ids below the
    /// id bound that are not nodes: the base index's gaps at start plus
    /// [`MAX_ID_GROWTH`].
    max_gaps: u64,
}

/// The served graph: the current snapshot, replaced atomically by updates.
/// Cloning it is cheap; the clones share the graph.
#[derive(Debug, Clone)]
pub struct LiveGraph {
    shared: Arc<Shared>,
}

impl LiveGraph {
    pub fn new(base: CsrIndex) -> Self {
        Self::with_auto_compact(base, None)
    }

    /// A graph that compacts by itself (in a background thread) once its
    /// delta passes `auto.after`.
    pub fn with_auto_compact(base: CsrIndex, auto: Option<AutoCompact>) -> Self {
        let fresh = Self::fresh(Arc::new(base));
        let max_gaps = fresh.gaps() + MAX_ID_GROWTH;
        Self {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(fresh),
                changes: Arc::new(Changes::new()),
                writer: Mutex::new(WriterState::default()),
                auto,
                compactions: AtomicU64::new(0),
                max_gaps,
            }),
        }
    }

    fn fresh(base: Arc<CsrIndex>) -> GraphSnapshot {
        let header = *base.header();
        GraphSnapshot {
            known: base.known_nodes(),
            id_bound: u64::from(base.n_nodes()),
            base,
            delta: Delta::default(),
            added_edges: 0,
            generation: header.generation,
            position: header.position,
            consumed: header.consumed,
        }
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.shared.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Compactions completed.
    pub fn compactions(&self) -> u64 {
        self.shared.compactions.load(Ordering::Relaxed)
    }

    /// Whether a compaction is building now.
    pub fn compacting(&self) -> bool {
        self.writer().compacting.is_some()
    }

    /// The change clock every update marks (and that feature invalidations
    /// share).
    pub fn changes(&self) -> &Arc<Changes> {
        &self.shared.changes
    }

    /// The snapshot a request should sample from, start to end.
    pub fn snapshot(&self) -> Arc<GraphSnapshot> {
        self.shared.current.load_full()
    }

    /// Makes nodes `ids` known (isolated until edges arrive).
    pub fn add_nodes(&self, ids: &[u64]) -> anyhow::Result<UpdateStats> {
        self.add_edges_and_nodes(&[], ids, false)
    }

    /// Adds edges (and their reverses when `undirected`), creating unknown
    /// endpoints. Publishes one new snapshot for the whole batch.
    pub fn add_edges(&self, edges: &[(u64, u64)], undirected: bool) -> anyhow::Result<UpdateStats> {
        self.add_edges_and_nodes(edges, &[], undirected)
    }

    /// Adds edges and nodes as one update.
    pub fn add_edges_and_nodes(
        &self,
        edges: &[(u64, u64)],
        nodes: &[u64],
        undirected: bool,
    ) -> anyhow::Result<UpdateStats> {
        let update = GraphUpdate {
            nodes: nodes.to_vec(),
            edges: edges.to_vec(),
            undirected,
        };
        let stats = self
            .apply(std::slice::from_ref(&update), None)
            .pop()
            .expect("one outcome per update")?;
        tracing::info!(
            edges_added = stats.edges_added,
            nodes = stats.n_nodes,
            generation = stats.generation,
            "graph updated"
        );
        Ok(stats)
    }

    /// Applies `updates` in order, each whole or not at all (a refused one,
    /// its id out of range, changes nothing and does not count), and
    /// publishes one snapshot for all of them. `position`, when given, is the
    /// update-stream entry the batch ends at and the count of entries
    /// consumed up to it. Costs time and memory in
    /// proportion to the updates (their ids' paths in the delta, and the
    /// added rows of the nodes they touch), not to the graph or the delta.
    pub fn apply(
        &self,
        updates: &[GraphUpdate],
        position: Option<(StreamPosition, u64)>,
    ) -> Vec<anyhow::Result<UpdateStats>> {
        let mut writer = self.writer();
        let old = self.shared.current.load_full();
        let mut next = GraphSnapshot {
            base: old.base.clone(),
            delta: old.delta.clone(),
            known: old.known,
            id_bound: old.id_bound,
            added_edges: old.added_edges,
            generation: old.generation,
            position: position.map_or(old.position, |p| p.0),
            consumed: position.map_or(old.consumed, |p| p.1),
        };
        let mut touched = Vec::new();
        let outcomes: Vec<anyhow::Result<UpdateStats>> = updates
            .iter()
            .map(|update| {
                next.check(update, self.shared.max_gaps)?;
                if let Some(recorded) = writer.compacting.as_mut() {
                    recorded.push(update.clone());
                }
                Ok(next.apply(update, &mut touched))
            })
            .collect();
        // Marked before the snapshot is published; the tick moves after.
        let change = (!touched.is_empty()).then(|| self.shared.changes.begin());
        if let Some(change) = &change {
            change.edges(touched);
        }
        let wants_compaction = self.shared.auto.as_ref().is_some_and(|auto| {
            writer.compacting.is_none() && next.delta.len() + next.added_edges >= auto.after
        });
        // SYNC POINT: readers that load after this store see the whole new
        // snapshot; readers holding the old one keep it alive until done.
        self.shared.current.store(Arc::new(next));
        drop(change);
        drop(writer);
        if wants_compaction {
            self.compact_in_background();
        }
        outcomes
    }

    fn compact_in_background(&self) {
        let Some(auto) = self.shared.auto.clone() else {
            return;
        };
        let graph = self.clone();
        let spawned = std::thread::Builder::new()
            .name("graph-compact".into())
            .spawn(move || loop {
                let delta = graph.snapshot().delta_entries();
                match graph.compact(&auto.index_path) {
                    Ok(stats) => tracing::info!(
                        delta_entries = delta,
                        edges = stats.n_edges,
                        secs = stats.seconds,
                        "graph compacted by itself (its delta passed the threshold)"
                    ),
                    Err(e) => {
                        tracing::warn!(
                            error = %format!("{e:#}"),
                            "automatic graph compaction failed; the delta stays in memory, and \
                             the next update past the threshold tries again"
                        );
                        return;
                    }
                }
                // The updates applied meanwhile may have passed it again.
                let now = graph.snapshot();
                if now.delta_entries() + now.added_edges() < auto.after {
                    return;
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start a graph compaction thread");
        }
    }

    /// Rebuilds the CSR file at `index_path` from base + delta and switches
    /// to it. Updates and sampling go on while it builds: the updates
    /// applied meanwhile are replayed on the new base when it switches.
    pub fn compact(&self, index_path: &Path) -> anyhow::Result<BuildStats> {
        let snapshot = {
            let mut writer = self.writer();
            if writer.compacting.is_some() {
                bail!("a graph compaction is already running; wait for it to finish");
            }
            writer.compacting = Some(Vec::new());
            self.snapshot()
        };
        let built = write_compacted(&snapshot, index_path)
            .and_then(|stats| Ok((stats, CsrIndex::open(index_path)?)));
        let mut writer = self.writer();
        let recorded = writer.compacting.take().unwrap_or_default();
        let (stats, base) = built?;
        let mut next = Self::fresh(Arc::new(base));
        for update in &recorded {
            // Checked once already, against the same id bound; marked when
            // first applied (the graph served does not change here).
            next.apply(update, &mut Vec::new());
        }
        let current = self.snapshot();
        next.position = current.position;
        next.consumed = current.consumed;
        debug_assert_eq!(next.generation, current.generation);
        debug_assert_eq!(next.n_edges(), current.n_edges());
        self.shared.current.store(Arc::new(next));
        drop(writer);
        self.shared.compactions.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            edges = stats.n_edges,
            nodes = stats.n_nodes,
            replayed = recorded.len(),
            "graph compacted into a new index"
        );
        Ok(stats)
    }
}

/// Writes `snapshot` as a CSR index at `index_path` (temporary name, then
/// rename).
fn write_compacted(snapshot: &GraphSnapshot, index_path: &Path) -> anyhow::Result<BuildStats> {
    let edge_file = index_path.with_extension("compact.edges.tmp");
    let n_nodes = snapshot.id_bound;
    let mut known = (snapshot.known != n_nodes).then(|| vec![0u64; n_nodes.div_ceil(64) as usize]);
    let write = |known: &mut Option<Vec<u64>>| -> anyhow::Result<()> {
        use std::io::Write;
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&edge_file)
                .with_context(|| format!("creating {}", edge_file.display()))?,
        );
        for node in 0..n_nodes as u32 {
            if let Some(bits) = known.as_mut() {
                if snapshot.is_known(u64::from(node)) {
                    bits[node as usize / 64] |= 1 << (node % 64);
                }
            }
            let mut failed = None;
            merge_sorted(
                snapshot.base.neighbors(node),
                snapshot.added_row(node),
                |v| {
                    if failed.is_none() {
                        let mut pair = [0u8; 8];
                        pair[..4].copy_from_slice(&node.to_le_bytes());
                        pair[4..].copy_from_slice(&v.to_le_bytes());
                        failed = out.write_all(&pair).err();
                    }
                },
            );
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
        out.flush()?;
        Ok(())
    };
    let built = write(&mut known).and_then(|()| {
        build::build(
            &EdgeFile {
                path: edge_file.clone(),
                n_nodes: Some(n_nodes),
            },
            index_path,
            &BuildOptions {
                undirected: false,
                graph_version: snapshot.graph_version(),
                known,
                position: snapshot.position,
                consumed: snapshot.consumed,
                generation: snapshot.generation,
                typed: None,
            },
        )
    });
    let _ = std::fs::remove_file(&edge_file);
    built
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kth_of_a_union_is_the_kth_of_the_merge() {
        let mut x = 7u64;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for _ in 0..500 {
            let mut all: Vec<u32> = (0..(next() % 40)).map(|_| next() % 1000).collect();
            all.sort_unstable();
            all.dedup();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for &v in &all {
                if next() % 3 == 0 {
                    a.push(v);
                } else {
                    b.push(v);
                }
            }
            for (k, &want) in all.iter().enumerate() {
                assert_eq!(kth_of_union(&a, &b, k), want, "{a:?} {b:?} {k}");
            }
        }
    }
}

/// The served graph and its change clock at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphCounts {
    pub graph_version: u64,
    pub nodes: u64,
    pub edges: u64,
    pub generation: u64,
    pub delta_entries: u64,
    pub position: StreamPosition,
    pub compactions: u64,
    pub change_tick: u64,
    pub feature_marks: u64,
    pub edge_marks: u64,
}

impl LiveGraph {
    pub fn counts(&self) -> GraphCounts {
        let graph = self.snapshot();
        let changes = self.changes();
        let (feature_marks, edge_marks) = changes.marked();
        GraphCounts {
            graph_version: graph.graph_version(),
            nodes: graph.n_nodes(),
            edges: graph.n_edges(),
            generation: graph.generation(),
            delta_entries: graph.delta_entries(),
            position: graph.position(),
            compactions: self.compactions(),
            change_tick: changes.tick(),
            feature_marks: feature_marks as u64,
            edge_marks: edge_marks as u64,
        }
    }
}

/// Registered at the sidecar's top level (`sidecar_graph_*`,
/// `sidecar_change_*`).
impl daemon_kit::metrics::Telemetry for LiveGraph {
    fn encode(&self, out: &mut daemon_kit::metrics::Out<'_>) -> std::fmt::Result {
        let c = self.counts();
        out.gauge(
            "change_tick",
            "changes (graph updates, feature invalidations) applied since the sidecar started",
            c.change_tick,
        )?;
        out.gauges(
            "change_marks",
            "nodes marked by the change clock (kept for the process's life), per kind",
            "kind",
            &[
                ("features", c.feature_marks as i64),
                ("edges", c.edge_marks as i64),
            ],
        )?;
        out.gauge("graph_nodes", "nodes of the served graph", c.nodes)?;
        out.gauge("graph_edges", "edges of the served graph", c.edges)?;
        out.gauge(
            "graph_generation",
            "updates applied to the graph since its import (kept by compaction)",
            c.generation,
        )?;
        out.gauge(
            "graph_delta_entries",
            "entries of the graph's in-memory delta (nodes with added edges, added nodes)",
            c.delta_entries,
        )?;
        out.counter(
            "graph_compactions",
            "graph compactions completed (asked for or automatic)",
            c.compactions,
        )
    }
}
