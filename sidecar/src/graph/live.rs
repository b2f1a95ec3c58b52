//! The graph as served: the mapped base index plus the nodes and edges added
//! while serving, switched atomically.
//!
//! A [`GraphSnapshot`] is immutable: the base [`CsrIndex`] and a delta of
//! added neighbours. An update builds the next snapshot (sharing unchanged
//! rows) and publishes it with one atomic pointer swap. A request samples
//! from the snapshot it loaded when it started, so in-flight requests finish
//! on the old version and new requests see the new one; nothing is dropped
//! and no lock is taken on the sampling path.
//!
//! New nodes: node ids are dense. Adding a node (or an edge touching it)
//! with id `k` makes every id below `k + 1` known; ids past the base index
//! are servable (inductive serving of new users) as soon as the snapshot that
//! added them is published.
//!
//! Compaction ([`LiveGraph::compact`]) writes base + delta as a new CSR file
//! through the regular builder, renames it over the index, maps it, and
//! publishes a snapshot with an empty delta. Updates wait while it runs;
//! sampling does not.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Context};
use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;

use crate::graph::build::{self, BuildOptions, BuildStats, EdgeFile};
use crate::graph::sampler::NeighborSource;
use crate::graph::CsrIndex;

/// How far past the graph's last node id one update may add nodes
/// (docs/graph-index.md, "Updates").
pub const MAX_ID_GROWTH: u64 = 1 << 20;

/// An immutable view of the graph: base index + added rows.
#[derive(Debug)]
pub struct GraphSnapshot {
    base: Arc<CsrIndex>,
    /// Added neighbours per node: sorted, unique, none already in the base row.
    added: FxHashMap<u32, Arc<[u32]>>,
    /// Known node count (>= the base's).
    n_nodes: u64,
    added_edges: u64,
    /// Number of updates since the base was mapped; 0 for a fresh base.
    generation: u64,
}

impl GraphSnapshot {
    pub fn base(&self) -> &CsrIndex {
        &self.base
    }

    pub fn n_nodes(&self) -> u64 {
        self.n_nodes
    }

    pub fn n_edges(&self) -> u64 {
        self.base.n_edges() + self.added_edges
    }

    /// Edges added since the base index.
    pub fn added_edges(&self) -> u64 {
        self.added_edges
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn graph_version(&self) -> u64 {
        self.base.graph_version()
    }

    fn added_row(&self, node: u32) -> &[u32] {
        self.added.get(&node).map(|row| &row[..]).unwrap_or(&[])
    }

    /// All neighbours of `node` (base row, then added ones), as ids.
    pub fn neighbors(&self, node: u64) -> Vec<u64> {
        let Ok(node) = u32::try_from(node) else {
            return Vec::new();
        };
        self.base
            .neighbors(node)
            .iter()
            .chain(self.added_row(node))
            .map(|&v| u64::from(v))
            .collect()
    }
}

impl NeighborSource for GraphSnapshot {
    fn degree(&self, node: u64) -> Option<u32> {
        if node >= self.n_nodes {
            return None;
        }
        let node = node as u32;
        Some(self.base.degree(node) + self.added_row(node).len() as u32)
    }

    fn neighbor(&self, node: u64, i: u32) -> u64 {
        let node = node as u32;
        let base = self.base.neighbors(node);
        match base.get(i as usize) {
            Some(&v) => u64::from(v),
            None => u64::from(self.added_row(node)[i as usize - base.len()]),
        }
    }
}

/// What an update changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateStats {
    pub edges_added: u64,
    /// Edges that were already present (or self loops), ignored.
    pub edges_ignored: u64,
    pub n_nodes: u64,
    pub generation: u64,
}

/// The served graph: the current snapshot, replaced atomically by updates.
#[derive(Debug)]
pub struct LiveGraph {
    current: ArcSwap<GraphSnapshot>,
    /// Serialises writers (updates, compaction); readers never take it.
    writer: Mutex<()>,
}

impl LiveGraph {
    pub fn new(base: CsrIndex) -> Self {
        Self {
            current: ArcSwap::from_pointee(Self::fresh(Arc::new(base))),
            writer: Mutex::new(()),
        }
    }

    fn fresh(base: Arc<CsrIndex>) -> GraphSnapshot {
        GraphSnapshot {
            n_nodes: u64::from(base.n_nodes()),
            base,
            added: FxHashMap::default(),
            added_edges: 0,
            generation: 0,
        }
    }

    /// The snapshot a request should sample from, start to end.
    pub fn snapshot(&self) -> Arc<GraphSnapshot> {
        self.current.load_full()
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

    /// Adds edges and nodes in one snapshot.
    pub fn add_edges_and_nodes(
        &self,
        edges: &[(u64, u64)],
        nodes: &[u64],
        undirected: bool,
    ) -> anyhow::Result<UpdateStats> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.current.load_full();
        let max_id = edges
            .iter()
            .flat_map(|&(s, d)| [s, d])
            .chain(nodes.iter().copied())
            .max();
        if let Some(max_id) = max_id {
            ensure!(
                max_id < u64::from(u32::MAX),
                "node id {max_id} is too large: node ids must be below 2^32 - 1"
            );
            // Ids are dense: an update may extend the graph by at most
            // MAX_ID_GROWTH ids, so a mistyped id cannot make the next
            // compaction write billions of empty rows.
            let n_nodes = old.n_nodes();
            ensure!(
                max_id < n_nodes + MAX_ID_GROWTH,
                "node id {max_id} lies more than {MAX_ID_GROWTH} ids past the graph's {n_nodes} \
                 nodes: node ids are dense; add the nodes in between first (or check the id)"
            );
        }
        // New neighbours per source node, before merging.
        let mut incoming: FxHashMap<u32, Vec<u32>> = FxHashMap::default();
        for &(src, dst) in edges {
            incoming.entry(src as u32).or_default().push(dst as u32);
            if undirected {
                incoming.entry(dst as u32).or_default().push(src as u32);
            }
        }
        let mut added = old.added.clone();
        let mut edges_added = 0u64;
        let mut considered = 0u64;
        for (node, mut fresh) in incoming {
            considered += fresh.len() as u64;
            let base_row = old.base.neighbors(node);
            fresh.sort_unstable();
            fresh.dedup();
            fresh.retain(|&v| v != node && base_row.binary_search(&v).is_err());
            let previous = added.get(&node).map(|r| &r[..]).unwrap_or(&[]);
            let mut merged: Vec<u32> = Vec::with_capacity(previous.len() + fresh.len());
            merged.extend_from_slice(previous);
            merged.extend(fresh.iter().filter(|v| previous.binary_search(v).is_err()));
            merged.sort_unstable();
            edges_added += (merged.len() - previous.len()) as u64;
            if merged.len() != previous.len() {
                added.insert(node, merged.into());
            }
        }
        let n_nodes = old.n_nodes.max(max_id.map_or(0, |m| m + 1));
        let next = GraphSnapshot {
            base: old.base.clone(),
            added,
            n_nodes,
            added_edges: old.added_edges + edges_added,
            generation: old.generation + 1,
        };
        let stats = UpdateStats {
            edges_added,
            edges_ignored: considered - edges_added,
            n_nodes,
            generation: next.generation,
        };
        // SYNC POINT: readers that load after this store see the whole new
        // snapshot; readers holding the old one keep it alive until done.
        self.current.store(Arc::new(next));
        tracing::info!(
            edges_added = stats.edges_added,
            nodes = stats.n_nodes,
            generation = stats.generation,
            "graph updated"
        );
        Ok(stats)
    }

    /// Rebuilds the CSR file at `index_path` from base + delta and switches
    /// to it with an empty delta. Updates wait; sampling continues on the
    /// current snapshot throughout.
    pub fn compact(&self, index_path: &Path) -> anyhow::Result<BuildStats> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let snapshot = self.current.load_full();
        let edge_file = index_path.with_extension("compact.edges.tmp");
        let write = || -> anyhow::Result<()> {
            use std::io::Write;
            let mut out = std::io::BufWriter::with_capacity(
                1 << 20,
                std::fs::File::create(&edge_file)
                    .with_context(|| format!("creating {}", edge_file.display()))?,
            );
            for node in 0..snapshot.n_nodes {
                for neighbour in snapshot.neighbors(node) {
                    out.write_all(&(node as u32).to_le_bytes())?;
                    out.write_all(&(neighbour as u32).to_le_bytes())?;
                }
            }
            out.flush()?;
            Ok(())
        };
        let built = write().and_then(|()| {
            build::build(
                &EdgeFile {
                    path: edge_file.clone(),
                    n_nodes: Some(snapshot.n_nodes),
                },
                index_path,
                &BuildOptions {
                    undirected: false,
                    graph_version: snapshot.graph_version(),
                },
            )
        });
        let _ = std::fs::remove_file(&edge_file);
        let stats = built?;
        let base = CsrIndex::open(index_path)?;
        let mut next = Self::fresh(Arc::new(base));
        next.generation = snapshot.generation + 1;
        self.current.store(Arc::new(next));
        tracing::info!(
            edges = stats.n_edges,
            nodes = stats.n_nodes,
            "graph compacted into a new index"
        );
        Ok(stats)
    }
}
