//! A typed graph as served: the mapped typed index plus the nodes and
//! edges added while serving, switched atomically (the typed counterpart
//! of [`crate::graph::live`], docs/graph-index.md "Updating a typed
//! graph").
//!
//! A [`TypedSnapshot`] is immutable: the base [`TypedGraph`], each node
//! type's id bound, and per edge type a [`Delta`] of added sources per
//! destination node (rows as the typed index keeps them). An update builds
//! the next snapshot and publishes it with one atomic pointer swap;
//! requests sample from the snapshot they loaded, so nothing is dropped
//! and sampling takes no lock.
//!
//! Nodes of a type are dense, as in the typed index: every id below the
//! type's id bound is a node. Adding id `k` of a type at or past its bound
//! makes the bound `k + 1` (the ids in between are nodes without edges,
//! served their type's default row until a row is stored for them); one
//! update may move a bound at most [`MAX_ID_GROWTH`] past where it was.
//!
//! Compaction ([`TypedLiveGraph::compact`]) writes base + deltas as a new
//! typed index (each edge type through the regular builder, the schema
//! with each type's count) under `typed-graph.tmp`, swaps it in for
//! `typed-graph`, maps it and publishes a snapshot with empty deltas plus
//! the updates applied while it ran. Neither updates nor sampling wait for
//! the build.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::Xxh3;

use crate::graph::build::{self, BuildOptions, EdgeFile, TypedEdges};
use crate::graph::delta::Delta;
use crate::graph::format::StreamPosition;
use crate::graph::live::{kth_of_union, merge_sorted, MAX_ID_GROWTH, MAX_NODE_ID};
use crate::graph::sampler::TypedNeighborSource;
use crate::graph::typed::{self, TypedGraph, TypedSchema};

/// One typed update: nodes to add and edges to add, by type index, applied
/// whole or not at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypedUpdate {
    /// `(node type, id)`.
    pub nodes: Vec<(usize, u64)>,
    /// `(edge type, [(src, dst)])`: `src` a node of the edge type's source
    /// type, `dst` of its destination type; endpoints past their type's
    /// bound become nodes.
    pub edges: Vec<(usize, Vec<(u64, u64)>)>,
}

impl TypedUpdate {
    /// Every `(node type, id)` the update names.
    fn ids<'a>(&'a self, ends: &'a [(usize, usize)]) -> impl Iterator<Item = (usize, u64)> + 'a {
        self.nodes
            .iter()
            .copied()
            .chain(self.edges.iter().flat_map(move |(e, pairs)| {
                let (src, dst) = ends[*e];
                pairs.iter().flat_map(move |&(s, d)| [(src, s), (dst, d)])
            }))
    }
}

/// What a typed update changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypedUpdateStats {
    /// Ids that were not nodes before (over every type).
    pub nodes_added: u64,
    pub edges_added: u64,
    /// Edges already present (or self loops of a one-type edge type).
    pub edges_ignored: u64,
    /// Nodes after the update, over every type.
    pub n_nodes: u64,
    pub generation: u64,
}

/// An immutable view of the typed graph: base index + added rows.
#[derive(Debug)]
pub struct TypedSnapshot {
    base: Arc<TypedGraph>,
    /// Per node type: largest id + 1 (every id below is a node).
    id_bounds: Vec<u64>,
    /// Per edge type: added sources per destination node.
    deltas: Vec<Delta>,
    /// Per edge type: edges added since the base index.
    added_edges: Vec<u64>,
    /// Updates applied since the graph's import.
    generation: u64,
    position: StreamPosition,
    consumed: u64,
}

impl TypedSnapshot {
    pub fn schema(&self) -> &TypedSchema {
        self.base.schema()
    }

    pub fn graph_version(&self) -> u64 {
        self.schema().graph_version
    }

    /// Node type `t`'s id bound: its node count.
    pub fn id_bound(&self, t: usize) -> u64 {
        self.id_bounds[t]
    }

    /// Nodes over every type.
    pub fn n_nodes(&self) -> u64 {
        self.id_bounds.iter().sum()
    }

    /// Edge type `e`'s edges.
    pub fn n_edges_of(&self, e: usize) -> u64 {
        self.base.csr(e).n_edges() + self.added_edges[e]
    }

    /// Edges over every type.
    pub fn n_edges(&self) -> u64 {
        (0..self.deltas.len()).map(|e| self.n_edges_of(e)).sum()
    }

    /// Entries of the deltas (destinations with added sources).
    pub fn delta_entries(&self) -> u64 {
        self.deltas.iter().map(Delta::len).sum()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Updates the typed index on disk holds (its import's or its last
    /// compaction's generation): `generation() - base_generation()` are in
    /// memory only.
    pub fn base_generation(&self) -> u64 {
        self.base.csr(0).header().generation
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

    fn added_row(&self, e: usize, node: u32) -> &[u32] {
        self.deltas[e].get(node).map(|row| &row[..]).unwrap_or(&[])
    }

    /// Edge type `e`'s sources of `node`, sorted.
    pub fn sources(&self, e: usize, node: u64) -> Vec<u64> {
        let Ok(node) = u32::try_from(node) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        merge_sorted(
            self.base.csr(e).neighbors(node),
            self.added_row(e, node),
            |v| out.push(u64::from(v)),
        );
        out
    }

    /// The `k` nodes with the most edges over every edge type (as a
    /// destination and as a source, index and delta alike), as `(node
    /// type, id)`, most first (ties by type, then id): the rows most
    /// sampled neighbourhoods read, which the warm-up pins. Only node types
    /// `wanted` says yes to are ranked (those with feature rows). One pass
    /// over the edges.
    pub fn top_degree(&self, k: usize, wanted: impl Fn(usize) -> bool) -> Vec<(usize, u64)> {
        let mut degree: Vec<Vec<u32>> = self
            .id_bounds
            .iter()
            .map(|&n| vec![0u32; n as usize])
            .collect();
        for (e, &(src, dst)) in self.base.edge_types().iter().enumerate() {
            for node in 0..self.id_bounds[dst] {
                let node = node as u32;
                let mut count = 0u32;
                merge_sorted(
                    self.base.csr(e).neighbors(node),
                    self.added_row(e, node),
                    |v| {
                        count += 1;
                        if let Some(d) = degree[src].get_mut(v as usize) {
                            *d = d.saturating_add(1);
                        }
                    },
                );
                let d = &mut degree[dst][node as usize];
                *d = d.saturating_add(count);
            }
        }
        let mut nodes: Vec<(u32, usize, u64)> = degree
            .iter()
            .enumerate()
            .filter(|&(t, _)| wanted(t))
            .flat_map(|(t, d)| {
                d.iter()
                    .enumerate()
                    .filter(|&(_, &d)| d > 0)
                    .map(move |(v, &d)| (d, t, v as u64))
            })
            .collect();
        let order = |a: &(u32, usize, u64), b: &(u32, usize, u64)| {
            b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
        };
        let k = k.min(nodes.len());
        if k == 0 {
            return Vec::new();
        }
        if k < nodes.len() {
            nodes.select_nth_unstable_by(k - 1, order);
            nodes.truncate(k);
        }
        nodes.sort_unstable_by(order);
        nodes.into_iter().map(|(_, t, v)| (t, v)).collect()
    }

    /// A digest of the served typed graph: each type's node count and each
    /// edge type's sources per destination, wherever they lie. Replicas
    /// that applied the same updates print the same digest.
    pub fn checksum(&self) -> u64 {
        let mut digest = 0u64;
        let mut row = Vec::new();
        for (t, bound) in self.id_bounds.iter().enumerate() {
            let mut hasher = Xxh3::new();
            hasher.update(b"node type");
            hasher.update(&(t as u64).to_le_bytes());
            hasher.update(&bound.to_le_bytes());
            digest = digest.wrapping_add(hasher.digest());
        }
        for (e, &(_, dst)) in self.base.edge_types().iter().enumerate() {
            let csr = self.base.csr(e);
            for node in 0..self.id_bounds[dst] as u32 {
                let (base, added) = (csr.neighbors(node), self.added_row(e, node));
                if base.is_empty() && added.is_empty() {
                    continue;
                }
                row.clear();
                row.extend_from_slice(&(e as u32).to_le_bytes());
                row.extend_from_slice(&node.to_le_bytes());
                merge_sorted(base, added, |v| row.extend_from_slice(&v.to_le_bytes()));
                let mut hasher = Xxh3::new();
                hasher.update(&row);
                // A sum: the digest does not depend on the order rows are met.
                digest = digest.wrapping_add(hasher.digest());
            }
        }
        digest
    }

    /// This snapshot with one more node, `id` of type `node_type`, and its
    /// edges `edges` (per edge type, `(src, dst)` pairs whose other end is
    /// a node of the graph), exactly as an update adding them would make
    /// it, for one request to sample from (a typed `NEW_NODE`): nothing is
    /// published. Refuses an id the type has or an update could not add,
    /// and an edge to a node the graph does not have, by name.
    pub fn with_new_node(
        &self,
        node_type: usize,
        id: u64,
        edges: &[Vec<(u64, u64)>],
    ) -> anyhow::Result<TypedSnapshot> {
        let schema = self.schema();
        let name = &schema.node_types[node_type].name;
        ensure!(
            id >= self.id_bounds[node_type],
            "{name} {id} is already in the graph ({} {name} nodes): predict it by its id (a new \
             node needs an id its type does not have)",
            self.id_bounds[node_type]
        );
        let ends = self.base.edge_types();
        for (e, pairs) in edges.iter().enumerate() {
            let (src, dst) = ends[e];
            for &(s, d) in pairs {
                let (other_type, other) = if src == node_type && s == id {
                    (dst, d)
                } else {
                    (src, s)
                };
                ensure!(
                    other < self.id_bounds[other_type] || (other_type == node_type && other == id),
                    "the new node's edge ({s}, {d}) of edge type {}: {} {other} is not in the \
                     graph; a new node's edges go to nodes the graph has",
                    schema.edge_types[e].key(),
                    schema.node_types[other_type].name
                );
            }
        }
        let update = TypedUpdate {
            nodes: vec![(node_type, id)],
            edges: edges.iter().cloned().enumerate().collect(),
        };
        self.check(&update)?;
        let mut next = TypedSnapshot {
            base: self.base.clone(),
            id_bounds: self.id_bounds.clone(),
            deltas: self.deltas.clone(),
            added_edges: self.added_edges.clone(),
            generation: self.generation,
            position: self.position,
            consumed: self.consumed,
        };
        next.apply(&update);
        Ok(next)
    }

    /// Refuses an update that names a type out of range or an id above the
    /// maximum or too far past its type's bound, naming the type and the
    /// id; changes nothing.
    pub fn check(&self, update: &TypedUpdate) -> anyhow::Result<()> {
        let schema = self.schema();
        let ends = self.base.edge_types();
        for &(t, _) in &update.nodes {
            ensure!(t < self.id_bounds.len(), "node type index {t} out of range");
        }
        for (e, _) in &update.edges {
            ensure!(*e < ends.len(), "edge type index {e} out of range");
        }
        let mut largest = vec![None::<u64>; self.id_bounds.len()];
        for (t, id) in update.ids(ends) {
            largest[t] = Some(largest[t].map_or(id, |m: u64| m.max(id)));
        }
        for (t, max_id) in largest.iter().enumerate() {
            let Some(max_id) = *max_id else { continue };
            let name = &schema.node_types[t].name;
            ensure!(
                max_id <= MAX_NODE_ID,
                "{name} id {max_id} is too large: node ids must be at most {MAX_NODE_ID} (2^32 - 2)"
            );
            ensure!(
                max_id + 1 < self.id_bounds[t] + MAX_ID_GROWTH,
                "{name} id {max_id} lies {MAX_ID_GROWTH} or more ids past the {} {name} nodes: \
                 a type's node ids are dense (every id below the largest is a node); add the \
                 nodes in between first (or check the id)",
                self.id_bounds[t]
            );
        }
        Ok(())
    }

    /// Applies one checked update to this (private, next) snapshot.
    fn apply(&mut self, update: &TypedUpdate) -> TypedUpdateStats {
        let before = self.n_nodes();
        let ends = self.base.edge_types().to_vec();
        for (t, id) in update.ids(&ends) {
            self.id_bounds[t] = self.id_bounds[t].max(id + 1);
        }
        let (mut edges_added, mut considered) = (0u64, 0u64);
        for (e, pairs) in &update.edges {
            let e = *e;
            let (src_type, dst_type) = ends[e];
            let mut added = 0u64;
            let mut incoming: FxHashMap<u32, Vec<u32>> = FxHashMap::default();
            for &(src, dst) in pairs {
                incoming.entry(dst as u32).or_default().push(src as u32);
            }
            considered += pairs.len() as u64;
            for (node, mut fresh) in incoming {
                let base_row = self.base.csr(e).neighbors(node);
                let previous = self.added_row(e, node);
                fresh.sort_unstable();
                fresh.dedup();
                fresh.retain(|&v| {
                    // A one-type edge type drops self loops, as the import does.
                    !(src_type == dst_type && v == node)
                        && base_row.binary_search(&v).is_err()
                        && previous.binary_search(&v).is_err()
                });
                if fresh.is_empty() {
                    continue;
                }
                let mut merged: Vec<u32> = Vec::with_capacity(previous.len() + fresh.len());
                merge_sorted(previous, &fresh, |v| merged.push(v));
                added += fresh.len() as u64;
                self.deltas[e].insert(node, merged.into());
            }
            self.added_edges[e] += added;
            edges_added += added;
        }
        self.generation += 1;
        TypedUpdateStats {
            nodes_added: self.n_nodes() - before,
            edges_added,
            edges_ignored: considered - edges_added,
            n_nodes: self.n_nodes(),
            generation: self.generation,
        }
    }
}

impl TypedNeighborSource for TypedSnapshot {
    fn n_node_types(&self) -> usize {
        self.id_bounds.len()
    }

    fn edge_types(&self) -> &[(usize, usize)] {
        self.base.edge_types()
    }

    fn is_node(&self, node_type: usize, node: u64) -> bool {
        node < self.id_bounds[node_type]
    }

    fn degree(&self, edge_type: usize, node: u64) -> Option<u32> {
        let (_, dst) = self.base.edge_types()[edge_type];
        if !self.is_node(dst, node) {
            return None;
        }
        let node = node as u32;
        Some(self.base.csr(edge_type).degree(node) + self.added_row(edge_type, node).len() as u32)
    }

    /// The `i`-th source in increasing id order, wherever it lies (index or
    /// delta): replicas sample the same nodes.
    fn neighbor(&self, edge_type: usize, node: u64, i: u32) -> u64 {
        let node = node as u32;
        let base = self.base.csr(edge_type).neighbors(node);
        let added = self.added_row(edge_type, node);
        if added.is_empty() {
            return u64::from(base[i as usize]);
        }
        u64::from(kth_of_union(base, added, i as usize))
    }
}

/// The served typed graph: the current snapshot, replaced atomically by
/// updates. Cloning it is cheap; the clones share the graph.
#[derive(Debug, Clone)]
pub struct TypedLiveGraph {
    current: Arc<ArcSwap<TypedSnapshot>>,
    /// Serialises writers; readers never take it, and a compaction holds it
    /// only to take its snapshot and to switch to the new base.
    writer: Arc<Mutex<WriterState>>,
}

#[derive(Debug, Default)]
struct WriterState {
    /// While a compaction builds: the updates applied since it took its
    /// snapshot, replayed on the new base.
    compacting: Option<Vec<TypedUpdate>>,
}

/// What a compaction wrote.
#[derive(Debug, Clone, Copy)]
pub struct TypedCompacted {
    pub n_nodes: u64,
    pub n_edges: u64,
    pub generation: u64,
    pub seconds: f64,
}

impl TypedLiveGraph {
    /// Serves `base` as imported, at the update position its index records.
    pub fn new(base: TypedGraph) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(Self::fresh(base))),
            writer: Arc::new(Mutex::new(WriterState::default())),
        }
    }

    /// `base` with no update on top, at the position its index records.
    fn fresh(base: TypedGraph) -> TypedSnapshot {
        let header = *base.csr(0).header();
        let n_edge_types = base.schema().edge_types.len();
        TypedSnapshot {
            id_bounds: base
                .schema()
                .node_types
                .iter()
                .map(|t| t.num_nodes)
                .collect(),
            deltas: vec![Delta::default(); n_edge_types],
            added_edges: vec![0; n_edge_types],
            generation: header.generation,
            position: header.position,
            consumed: header.consumed,
            base: Arc::new(base),
        }
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a compaction is building now.
    pub fn compacting(&self) -> bool {
        self.writer().compacting.is_some()
    }

    /// Rewrites `<data_dir>/typed-graph/` with every update folded in and
    /// switches to it. Updates and sampling go on while it builds: the
    /// updates applied meanwhile are replayed on the new base when it
    /// switches.
    pub fn compact(&self, data_dir: &Path) -> anyhow::Result<TypedCompacted> {
        let started = Instant::now();
        let snapshot = {
            let mut writer = self.writer();
            if writer.compacting.is_some() {
                bail!("a graph compaction is already running; wait for it to finish");
            }
            writer.compacting = Some(Vec::new());
            self.snapshot()
        };
        let built = write_compacted(&snapshot, data_dir).and_then(|()| TypedGraph::open(data_dir));
        let mut writer = self.writer();
        let recorded = writer.compacting.take().unwrap_or_default();
        let mut next = Self::fresh(built?);
        for update in &recorded {
            // Checked once already, against the same bounds.
            next.apply(update);
        }
        let current = self.snapshot();
        next.position = current.position;
        next.consumed = current.consumed;
        debug_assert_eq!(next.generation, current.generation);
        debug_assert_eq!(next.n_edges(), current.n_edges());
        let compacted = TypedCompacted {
            n_nodes: next.n_nodes(),
            n_edges: next.n_edges(),
            generation: next.generation,
            seconds: started.elapsed().as_secs_f64(),
        };
        self.current.store(Arc::new(next));
        drop(writer);
        tracing::info!(
            edges = compacted.n_edges,
            nodes = compacted.n_nodes,
            replayed = recorded.len(),
            "typed graph compacted into a new index"
        );
        Ok(compacted)
    }

    /// The snapshot a request should sample from, start to end.
    pub fn snapshot(&self) -> Arc<TypedSnapshot> {
        self.current.load_full()
    }

    /// Applies `updates` in order, each whole or not at all (a refused one
    /// changes nothing), and publishes one snapshot for all of them;
    /// `position`, when given, is the update-stream entry the batch ends at
    /// and the count of entries consumed up to it.
    pub fn apply(
        &self,
        updates: &[TypedUpdate],
        position: Option<(StreamPosition, u64)>,
    ) -> Vec<anyhow::Result<TypedUpdateStats>> {
        let mut writer = self.writer();
        let old = self.snapshot();
        let mut next = TypedSnapshot {
            base: old.base.clone(),
            id_bounds: old.id_bounds.clone(),
            deltas: old.deltas.clone(),
            added_edges: old.added_edges.clone(),
            generation: old.generation,
            position: position.map_or(old.position, |p| p.0),
            consumed: position.map_or(old.consumed, |p| p.1),
        };
        let outcomes = updates
            .iter()
            .map(|update| {
                next.check(update)?;
                if let Some(recorded) = writer.compacting.as_mut() {
                    recorded.push(update.clone());
                }
                Ok(next.apply(update))
            })
            .collect();
        // SYNC POINT: readers that load after this store see the whole new
        // snapshot; readers holding the old one keep it alive until done.
        self.current.store(Arc::new(next));
        outcomes
    }

    /// Applies one update (the admin socket's).
    pub fn update(&self, update: TypedUpdate) -> anyhow::Result<TypedUpdateStats> {
        self.apply(std::slice::from_ref(&update), None)
            .pop()
            .expect("one outcome per update")
    }
}

/// Writes `snapshot` as a typed index into `<data_dir>/typed-graph.tmp`,
/// then swaps it in for `typed-graph` (the old one renamed
/// `typed-graph.old` first, and removed once the new one is in place:
/// [`typed::recover_interrupted_compaction`] puts it back if a crash comes
/// between the two renames).
fn write_compacted(snapshot: &TypedSnapshot, data_dir: &Path) -> anyhow::Result<()> {
    let schema = snapshot.schema();
    let tmp = data_dir.join(format!("{}.tmp", typed::TYPED_DIR));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("removing the leftover {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    for (e, &(src, dst)) in snapshot.base.edge_types().iter().enumerate() {
        let key = schema.edge_types[e].key();
        let edge_file = tmp.join(format!("{key}.edges.tmp"));
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&edge_file)
                .with_context(|| format!("creating {}", edge_file.display()))?,
        );
        let mut failed = None;
        for node in 0..snapshot.id_bounds[dst] as u32 {
            let sources = snapshot.base.csr(e).neighbors(node);
            merge_sorted(sources, snapshot.added_row(e, node), |source| {
                if failed.is_none() {
                    let mut pair = [0u8; 8];
                    pair[..4].copy_from_slice(&source.to_le_bytes());
                    pair[4..].copy_from_slice(&node.to_le_bytes());
                    failed = out.write_all(&pair).err();
                }
            });
        }
        if let Some(e) = failed {
            return Err(e).with_context(|| format!("writing {}", edge_file.display()));
        }
        out.flush()?;
        drop(out);
        build::build(
            &EdgeFile {
                path: edge_file.clone(),
                n_nodes: Some(snapshot.id_bounds[dst]),
            },
            &tmp.join(format!("{key}.csr")),
            &BuildOptions {
                undirected: false,
                graph_version: schema.graph_version,
                known: None,
                position: snapshot.position,
                consumed: snapshot.consumed,
                generation: snapshot.generation,
                typed: Some(TypedEdges {
                    n_src: snapshot.id_bounds[src],
                    same_type: src == dst,
                }),
            },
        )
        .with_context(|| format!("compacting edge type {key}"))?;
        std::fs::remove_file(&edge_file)?;
    }
    let mut compacted = schema.clone();
    for (t, node_type) in compacted.node_types.iter_mut().enumerate() {
        node_type.num_nodes = snapshot.id_bounds[t];
    }
    let schema_path = tmp.join(typed::SCHEMA_FILE);
    std::fs::write(
        &schema_path,
        serde_json::to_string_pretty(&compacted)? + "\n",
    )
    .with_context(|| format!("writing {}", schema_path.display()))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    let dir = data_dir.join(typed::TYPED_DIR);
    let old = data_dir.join(format!("{}.old", typed::TYPED_DIR));
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    std::fs::rename(&dir, &old)
        .with_context(|| format!("renaming {} to {}", dir.display(), old.display()))?;
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    std::fs::File::open(data_dir)?.sync_all()?;
    // The old files stay mapped by the snapshots that still hold them.
    std::fs::remove_dir_all(&old)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::typed::import_typed;

    /// users 0..3, items 0..2; (user, buys, item) 0->0, 1->0, 2->1;
    /// (user, follows, user) 0->1.
    fn small_graph(dir: &std::path::Path) -> TypedGraph {
        let input = dir.join("in");
        std::fs::create_dir_all(&input).unwrap();
        let pairs = |p: &[(u32, u32)]| -> Vec<u8> {
            p.iter()
                .flat_map(|&(s, d)| [s.to_le_bytes(), d.to_le_bytes()])
                .flatten()
                .collect()
        };
        std::fs::write(input.join("buys.u32"), pairs(&[(0, 0), (1, 0), (2, 1)])).unwrap();
        std::fs::write(input.join("follows.u32"), pairs(&[(0, 1)])).unwrap();
        std::fs::write(
            input.join("meta.json"),
            r#"{"node_types": [{"name": "user", "num_nodes": 3},
                               {"name": "item", "num_nodes": 2}],
                "edge_types": [
                  {"src": "user", "relation": "buys", "dst": "item", "num_edges": 3, "edges": "buys.u32"},
                  {"src": "user", "relation": "follows", "dst": "user", "num_edges": 1, "edges": "follows.u32"}]}"#,
        )
        .unwrap();
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        import_typed(&input, &data, 1).unwrap();
        TypedGraph::open(&data).unwrap()
    }

    #[test]
    fn added_nodes_and_edges_are_sampled_in_id_order_and_old_snapshots_stay() {
        let dir = tempfile::tempdir().unwrap();
        let graph = TypedLiveGraph::new(small_graph(dir.path()));
        let before = graph.snapshot();
        let checksum = before.checksum();
        assert_eq!(before.sources(0, 0), vec![0, 1]);
        let stats = graph
            .update(TypedUpdate {
                nodes: vec![(1, 2)],
                edges: vec![(0, vec![(4, 2), (2, 0), (0, 0)]), (1, vec![(1, 1)])],
            })
            .unwrap();
        // item 2 and user 3, 4 are new; (0 -> 0) is present, (1 -> 1) a loop.
        assert_eq!(stats.nodes_added, 3);
        assert_eq!(stats.edges_added, 2);
        assert_eq!(stats.edges_ignored, 2);
        let after = graph.snapshot();
        assert_eq!(after.id_bound(0), 5);
        assert_eq!(after.id_bound(1), 3);
        assert_eq!(after.sources(0, 0), vec![0, 1, 2]);
        assert_eq!(after.degree(0, 0), Some(3));
        assert_eq!(after.neighbor(0, 0, 2), 2);
        assert_eq!(after.sources(0, 2), vec![4]);
        assert_eq!(after.degree(0, 3), None, "item 3 is not a node");
        assert!(after.is_node(0, 3), "user 3 lies below the bound");
        assert_eq!(after.n_edges(), 6);
        assert_ne!(after.checksum(), checksum);
        // The snapshot a request held is unchanged.
        assert_eq!(before.sources(0, 0), vec![0, 1]);
        assert_eq!(before.checksum(), checksum);
    }

    #[test]
    fn the_top_degree_nodes_count_edges_of_every_type_at_either_end() {
        let dir = tempfile::tempdir().unwrap();
        let graph = TypedLiveGraph::new(small_graph(dir.path()));
        // user 0: buys 1, follows 1; user 1: buys 1, followed 1; item 0:
        // bought 2; user 2 and item 1: one edge each.
        let all = |_| true;
        assert_eq!(
            graph.snapshot().top_degree(3, all),
            [(0, 0), (0, 1), (1, 0)]
        );
        assert_eq!(graph.snapshot().top_degree(9, |t| t == 1), [(1, 0), (1, 1)]);
        assert!(graph.snapshot().top_degree(0, all).is_empty());
        // Edges in the delta count too: users 0 and 2 and item 0 have 3.
        graph
            .update(TypedUpdate {
                nodes: vec![],
                edges: vec![(0, vec![(2, 0)]), (1, vec![(2, 0)])],
            })
            .unwrap();
        assert_eq!(
            graph.snapshot().top_degree(4, all),
            [(0, 0), (0, 2), (1, 0), (0, 1)]
        );
    }

    #[test]
    fn a_compaction_writes_what_is_served_and_a_restart_maps_it() {
        let dir = tempfile::tempdir().unwrap();
        let graph = TypedLiveGraph::new(small_graph(dir.path()));
        graph
            .update(TypedUpdate {
                nodes: vec![(1, 3)],
                edges: vec![(0, vec![(4, 3), (2, 0)]), (1, vec![(2, 4)])],
            })
            .unwrap();
        let served = graph.snapshot();
        let compacted = graph.compact(&dir.path().join("data")).unwrap();
        assert_eq!(compacted.n_edges, served.n_edges());
        let now = graph.snapshot();
        assert_eq!(now.checksum(), served.checksum());
        assert_eq!(now.delta_entries(), 0, "everything in the index");
        assert_eq!(now.base_generation(), now.generation());
        // A restart maps what the compaction wrote.
        let reopened = TypedLiveGraph::new(TypedGraph::open(&dir.path().join("data")).unwrap());
        let reopened = reopened.snapshot();
        assert_eq!(reopened.checksum(), served.checksum());
        assert_eq!((reopened.id_bound(0), reopened.id_bound(1)), (5, 4));
        assert_eq!(reopened.sources(0, 0), vec![0, 1, 2]);
        assert_eq!(reopened.generation(), served.generation());
    }

    #[test]
    fn an_id_too_far_past_its_type_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let graph = TypedLiveGraph::new(small_graph(dir.path()));
        let far = 3 + MAX_ID_GROWTH;
        let err = graph
            .update(TypedUpdate {
                nodes: vec![(1, 2)],
                edges: vec![(0, vec![(far, 0)])],
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("user id {far}")), "{err}");
        let now = graph.snapshot();
        assert_eq!(
            (now.id_bound(0), now.id_bound(1)),
            (3, 2),
            "nothing applied"
        );
    }
}
