//! The graph as served: the mapped index plus the nodes and edges added
//! while serving, switched atomically. One store for every graph: a typed
//! graph of N node types and E edge types, and the one-type graph as its
//! 1x1 case (node type `node`, edge type `node__to__node`;
//! [`TypedGraph::one_type`]).
//!
//! A [`GraphSnapshot`] is immutable: the base [`TypedGraph`], each node
//! type's id bound, and per edge type a [`Delta`] of added sources per
//! destination node (rows as the index keeps them; a persistent map: an
//! update copies only the paths of the ids it touches). An update builds
//! the next snapshot and publishes it with one atomic pointer swap. A
//! request samples from the snapshot it loaded when it started, so
//! in-flight requests finish on the old version and new requests see the
//! new one; nothing is dropped and no lock is taken on the sampling path.
//!
//! Nodes (docs/graph-index.md, "Updates"): every id of a type below its id
//! bound, except the gaps a known-node bitmap in the index records (left by
//! compactions of earlier releases). Adding id `k` of a type at or past its
//! bound makes the bound `k + 1`: the ids in between are nodes without
//! edges, as every id below `num_nodes` is a node in PyG; one update may
//! move a bound at most [`MAX_ID_GROWTH`]. An id named in a gap becomes a
//! node. New ids are servable (inductive serving of new users) as soon as
//! the snapshot that added them is published.
//!
//! Compaction ([`LiveGraph::compact`]) writes base + deltas where the index
//! lives, through the regular builder: a one-type graph's `graph.csr`
//! (under a temporary name, then renamed over it), a typed graph's
//! `typed-graph/` (written as `typed-graph.tmp`, then swapped in); it maps
//! the result and publishes a snapshot with empty deltas plus the updates
//! applied while it ran. Neither updates nor sampling wait for the build.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::Xxh3;

use crate::graph::build::{self, BuildOptions, EdgeDataFiles, EdgeFile, TypedEdges};
use crate::graph::changes::{node_key, Changes};
use crate::graph::delta::{DataRow, Delta, EdgeRowData, Row};
use crate::graph::format::StreamPosition;
use crate::graph::sampler::{GraphSource, NeighborSource};
use crate::graph::typed::{self, Location, TypedGraph, TypedSchema};

/// How far past a node type's id bound one update may add nodes
/// (docs/graph-index.md, "Updates").
pub const MAX_ID_GROWTH: u64 = 1 << 20;

/// The largest node id (docs/graph-index.md): ids are u32, and 2^32 - 1 is
/// reserved.
pub const MAX_NODE_ID: u64 = u32::MAX as u64 - 1;

/// One update: nodes to add and edges to add, by type index, applied whole
/// or not at all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphUpdate {
    /// `(node type, id)`: made nodes (without edges until edges arrive).
    pub nodes: Vec<(usize, u64)>,
    /// `(edge type, [(src, dst)])`: `src` a node of the edge type's source
    /// type, `dst` of its destination type (`dst`'s row gains `src`);
    /// endpoints that are not nodes become nodes.
    pub edges: Vec<(usize, Vec<(u64, u64)>)>,
    /// Empty (no edge carries data), or one per entry of `edges`: the data
    /// of its edges, which an edge type with data needs and one without
    /// refuses ([`GraphSnapshot::check`]).
    pub values: Vec<EdgeValues>,
}

/// The data of an update's edges of one edge type, aligned with its pairs:
/// `attrs` row-major (`attr_dim` per edge), a weight and a time per edge;
/// each empty where the edge type does not carry it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeValues {
    pub attrs: Vec<f32>,
    pub weights: Vec<f32>,
    pub times: Vec<i64>,
}

impl EdgeValues {
    /// Parses the data of `n` edges of `edge_type` from text: per edge, its
    /// attributes, then its weight, then its time, as the edge type carries
    /// them, separated by white space or commas (docs/updates.md, "Typed
    /// graphs"). A value that is not a number, a time that is not an integer
    /// and a count that does not fit `n` edges are refused by name.
    pub fn parse(edge_type: &typed::EdgeType, n: usize, text: &str) -> Result<Self, String> {
        let key = edge_type.key();
        let data = edge_type.data();
        let dim = data.attr_dim as usize;
        let per_edge = dim + usize::from(data.weight) + usize::from(data.time);
        let tokens: Vec<&str> = text
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|t| !t.is_empty())
            .collect();
        if per_edge == 0 {
            return Err(format!(
                "edge type {key}: its edges carry no data, and {} values were given; leave \
                 them out",
                tokens.len()
            ));
        }
        if tokens.len() != n * per_edge {
            return Err(format!(
                "edge type {key}: its edges carry {data}, {per_edge} values per edge (the \
                 attributes, then the weight, then the time): {n} edges need {}, {} were given",
                n * per_edge,
                tokens.len()
            ));
        }
        let mut values = EdgeValues {
            attrs: Vec::with_capacity(n * dim),
            weights: Vec::with_capacity(if data.weight { n } else { 0 }),
            times: Vec::with_capacity(if data.time { n } else { 0 }),
        };
        for (i, token) in tokens.iter().enumerate() {
            let (edge, at) = (i / per_edge, i % per_edge);
            let number = |what: &str| {
                token.parse::<f32>().map_err(|_| {
                    format!("edge type {key}: edge {edge}'s {what} {token:?} is not a number")
                })
            };
            if at < dim {
                values.attrs.push(number("attribute")?);
            } else if at == dim && data.weight {
                values.weights.push(number("weight")?);
            } else {
                values.times.push(token.parse::<i64>().map_err(|_| {
                    format!(
                        "edge type {key}: edge {edge}'s time {token:?} is not an integer (times \
                         are whole numbers in the dataset's unit, below 2^63)"
                    )
                })?);
            }
        }
        Ok(values)
    }

    /// Refuses values that do not fit `n` edges of `edge_type`, or that are
    /// not finite, naming the edge type, the edge and the fix.
    pub fn check(&self, edge_type: &typed::EdgeType, n: usize) -> anyhow::Result<()> {
        let key = edge_type.key();
        let data = edge_type.data();
        let dim = data.attr_dim as usize;
        for (what, carried, per_edge, given) in [
            ("attributes", dim > 0, dim, self.attrs.len()),
            ("weights", data.weight, 1, self.weights.len()),
            ("times", data.time, 1, self.times.len()),
        ] {
            ensure!(
                carried || given == 0,
                "edge type {key}: its edges carry {data}, and {given} {what} were given; leave \
                 them out"
            );
            ensure!(
                !carried || given == n * per_edge,
                "edge type {key}: its edges carry {data}: {n} edges need {} {what}{}, {given} \
                 were given",
                n * per_edge,
                if per_edge > 1 {
                    format!(" ({per_edge} per edge)")
                } else {
                    String::new()
                }
            );
        }
        for (what, values, width) in [
            ("attribute", &self.attrs, dim.max(1)),
            ("weight", &self.weights, 1),
        ] {
            if let Some(at) = values.iter().position(|v| !v.is_finite()) {
                bail!(
                    "edge type {key}: edge {} has {what} {}{}; edge data must be finite numbers",
                    at / width,
                    values[at],
                    if width > 1 {
                        format!(" in column {}", at % width)
                    } else {
                        String::new()
                    }
                );
            }
        }
        Ok(())
    }
}

/// The data of one edge ([`GraphSnapshot::edge_data_at`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EdgeDatum<'a> {
    pub attrs: &'a [f32],
    pub weight: Option<f32>,
    pub time: Option<i64>,
}

/// Where an edge of a served row lies: the base index's row (`Base(i)`,
/// its `i`-th edge) or the edges added since (`Added(j)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeAt {
    Base(usize),
    Added(usize),
}

impl GraphUpdate {
    /// A one-type graph's update: `nodes`, and `edges` `(src, dst)` that
    /// make `dst` a neighbour of `src` (the one-type index's rows list a
    /// node's neighbours; docs/graph-index.md), each with its reverse when
    /// `undirected`.
    pub fn one_type(nodes: &[u64], edges: &[(u64, u64)], undirected: bool) -> Self {
        let mut pairs: Vec<(u64, u64)> = edges.iter().map(|&(s, d)| (d, s)).collect();
        if undirected {
            pairs.extend_from_slice(edges);
        }
        Self {
            nodes: nodes.iter().map(|&id| (0, id)).collect(),
            edges: if pairs.is_empty() {
                Vec::new()
            } else {
                vec![(0, pairs)]
            },
            values: Vec::new(),
        }
    }

    /// Appends `other`'s nodes and edges, with their data, to this update.
    pub fn extend(&mut self, other: GraphUpdate) {
        if !self.values.is_empty() || !other.values.is_empty() {
            self.values.resize(self.edges.len(), EdgeValues::default());
            let mut theirs = other.values;
            theirs.resize(other.edges.len(), EdgeValues::default());
            self.values.extend(theirs);
        }
        self.nodes.extend(other.nodes);
        self.edges.extend(other.edges);
    }

    /// Every `(node type, id)` the update names.
    pub fn ids<'a>(
        &'a self,
        ends: &'a [(usize, usize)],
    ) -> impl Iterator<Item = (usize, u64)> + 'a {
        self.nodes
            .iter()
            .copied()
            .chain(self.edges.iter().flat_map(move |(e, pairs)| {
                let (src, dst) = ends[*e];
                pairs.iter().flat_map(move |&(s, d)| [(src, s), (dst, d)])
            }))
    }
}

/// What an update changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateStats {
    /// Ids that were not nodes before (over every type, the ids in between
    /// included).
    pub nodes_added: u64,
    pub edges_added: u64,
    /// Edges already present (or self loops of an edge type whose two ends
    /// are one type), ignored.
    pub edges_ignored: u64,
    /// Nodes after the update, over every type.
    pub n_nodes: u64,
    pub generation: u64,
}

/// An immutable view of the graph: base index + added rows.
#[derive(Debug)]
pub struct GraphSnapshot {
    base: Arc<TypedGraph>,
    /// Per node type: largest id + 1.
    id_bounds: Vec<u64>,
    /// Per node type: its nodes.
    n_nodes: Vec<u64>,
    /// Per node type: ids in the index's gaps (below its bound, not in its
    /// known-node bitmap) that an update made nodes (empty rows).
    filled: Vec<Delta>,
    /// Per edge type: added sources per destination node.
    deltas: Vec<Delta>,
    /// Per edge type with edge data: the data of the added sources,
    /// aligned with `deltas` (empty for the others).
    data: Vec<Delta<DataRow>>,
    /// Per edge type: edges added since the base index.
    added_edges: Vec<u64>,
    /// Updates applied since the graph's import.
    generation: u64,
    /// The last update-stream entry applied.
    position: StreamPosition,
    /// Update-stream entries consumed up to `position`.
    consumed: u64,
}

impl GraphSnapshot {
    /// `base` with no update on top, at the position its index records.
    fn fresh(base: Arc<TypedGraph>) -> Self {
        let header = *base.csr(0).header();
        let n_node_types = base.schema().node_types.len();
        let n_edge_types = base.schema().edge_types.len();
        Self {
            id_bounds: (0..n_node_types).map(|t| base.id_bound(t)).collect(),
            n_nodes: (0..n_node_types).map(|t| base.known_nodes(t)).collect(),
            filled: vec![Delta::default(); n_node_types],
            deltas: vec![Delta::default(); n_edge_types],
            data: vec![Delta::default(); n_edge_types],
            added_edges: vec![0; n_edge_types],
            generation: header.generation,
            position: header.position,
            consumed: header.consumed,
            base,
        }
    }

    /// A copy to build the next snapshot on (the deltas are persistent
    /// maps: O(types)).
    fn next(&self) -> Self {
        Self {
            base: self.base.clone(),
            id_bounds: self.id_bounds.clone(),
            n_nodes: self.n_nodes.clone(),
            filled: self.filled.clone(),
            deltas: self.deltas.clone(),
            data: self.data.clone(),
            added_edges: self.added_edges.clone(),
            ..*self
        }
    }

    pub fn base(&self) -> &TypedGraph {
        &self.base
    }

    pub fn schema(&self) -> &TypedSchema {
        self.base.schema()
    }

    pub fn graph_version(&self) -> u64 {
        self.schema().graph_version
    }

    /// Node type `t`'s id bound: its largest id + 1.
    pub fn id_bound(&self, t: usize) -> u64 {
        self.id_bounds[t]
    }

    /// Every node type's id bound.
    pub fn id_bounds(&self) -> &[u64] {
        &self.id_bounds
    }

    /// Node type `t`'s nodes.
    pub fn n_nodes_of(&self, t: usize) -> u64 {
        self.n_nodes[t]
    }

    /// Nodes over every type.
    pub fn n_nodes(&self) -> u64 {
        self.n_nodes.iter().sum()
    }

    /// Edge type `e`'s edges.
    pub fn n_edges_of(&self, e: usize) -> u64 {
        self.base.csr(e).n_edges() + self.added_edges[e]
    }

    /// Edges over every type.
    pub fn n_edges(&self) -> u64 {
        (0..self.deltas.len()).map(|e| self.n_edges_of(e)).sum()
    }

    /// Edges added since the base index, over every type.
    pub fn added_edges(&self) -> u64 {
        self.added_edges.iter().sum()
    }

    /// Entries of the deltas (destinations with added sources, nodes added
    /// in the index's gaps).
    pub fn delta_entries(&self) -> u64 {
        self.deltas.iter().chain(&self.filled).map(Delta::len).sum()
    }

    /// Updates applied since the graph's import (a compaction keeps it).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Updates the index on disk holds (its import's or its last
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

    /// The times of `node`'s added edges of edge type `e` (empty without).
    fn added_times(&self, e: usize, node: u32) -> &[i64] {
        self.data[e]
            .get(node)
            .map(|data| &data.times[..])
            .unwrap_or(&[])
    }

    /// The data of `node`'s row of edge type `e` in the base index, its
    /// `i`-th edge's at `i`, when nothing was added to the row since (then
    /// the row's order is the index's); `None` when edges were added (read
    /// each edge's with [`Self::edge_at`] and [`Self::edge_data_at`]).
    pub fn base_edge_row(&self, e: usize, node: u32) -> Option<crate::graph::index::EdgeRow<'_>> {
        self.added_row(e, node)
            .is_empty()
            .then(|| self.base.csr(e).edge_row(node))
    }

    /// The data of `node`'s added edges of edge type `e`, if it has any.
    pub fn added_data(&self, e: usize, node: u32) -> Option<&EdgeRowData> {
        self.data[e].get(node).map(|data| &**data)
    }

    /// Calls `each` with every edge of edge type `e` into `node` (its
    /// source, and where it lies), in the row's order: by source id, or by
    /// (time, source id) where the edges have a time; an edge of the base
    /// index before an added one they tie with, so that a compaction keeps
    /// the order (docs/graph-index.md, "Edge data").
    pub fn for_each_edge(&self, e: usize, node: u32, mut each: impl FnMut(u32, EdgeAt)) {
        let csr = self.base.csr(e);
        let (base, added) = (csr.neighbors(node), self.added_row(e, node));
        let (base_times, added_times) = (csr.edge_row(node).times, self.added_times(e, node));
        let (mut i, mut j) = (0, 0);
        while i < base.len() || j < added.len() {
            if j == added.len()
                || i < base.len() && row_key(base, base_times, i) <= row_key(added, added_times, j)
            {
                each(base[i], EdgeAt::Base(i));
                i += 1;
            } else {
                each(added[j], EdgeAt::Added(j));
                j += 1;
            }
        }
    }

    /// Where the `i`-th edge of edge type `e` into `node` lies, in the
    /// order of [`Self::for_each_edge`]: O(log degree).
    pub fn edge_at(&self, e: usize, node: u32, i: u32) -> EdgeAt {
        let csr = self.base.csr(e);
        let (base, added) = (csr.neighbors(node), self.added_row(e, node));
        if added.is_empty() {
            return EdgeAt::Base(i as usize);
        }
        let (base_times, added_times) = (csr.edge_row(node).times, self.added_times(e, node));
        kth_in_union(base.len(), added.len(), i as usize, |a, b| {
            row_key(base, base_times, a) <= row_key(added, added_times, b)
        })
    }

    /// Edge type `e`'s sources of `node` (a one-type graph's neighbours),
    /// in the row's order ([`Self::for_each_edge`]).
    pub fn sources(&self, e: usize, node: u64) -> Vec<u64> {
        let Ok(node) = u32::try_from(node) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        self.for_each_edge(e, node, |v, _| out.push(u64::from(v)));
        out
    }

    /// Node type `t`'s ids below its bound that are not nodes.
    fn gaps(&self, t: usize) -> u64 {
        self.id_bounds[t] - self.n_nodes[t]
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
                self.for_each_edge(e, node, |v, _| {
                    count += 1;
                    if let Some(d) = degree[src].get_mut(v as usize) {
                        *d = d.saturating_add(1);
                    }
                });
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

    /// A digest of the served graph: each type's id bound, node count and
    /// gaps, and each edge type's sources per destination (with their
    /// data, where the edges carry any), wherever they lie (index or
    /// delta). Replicas that applied the same updates print the same
    /// digest, compacted or not.
    pub fn checksum(&self) -> u64 {
        let hash = |parts: &[&[u8]]| {
            let mut hasher = Xxh3::new();
            for part in parts {
                hasher.update(part);
            }
            hasher.digest()
        };
        // Sums: the digest does not depend on the order rows are met.
        let mut digest = 0u64;
        for (t, bound) in self.id_bounds.iter().enumerate() {
            let t_bytes = (t as u64).to_le_bytes();
            digest = digest.wrapping_add(hash(&[
                b"node type",
                &t_bytes,
                &bound.to_le_bytes(),
                &self.n_nodes[t].to_le_bytes(),
            ]));
            if self.gaps(t) > 0 {
                for id in (0..*bound).filter(|&id| !self.is_node(t, id)) {
                    digest = digest.wrapping_add(hash(&[b"gap", &t_bytes, &id.to_le_bytes()]));
                }
            }
        }
        let mut row = Vec::new();
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
                self.for_each_edge(e, node, |v, at| {
                    row.extend_from_slice(&v.to_le_bytes());
                    self.edge_data_bytes(e, node, at, |bytes| row.extend_from_slice(bytes));
                });
                digest = digest.wrapping_add(hash(&[&row]));
            }
        }
        digest
    }

    /// The data of the edge at `at` of edge type `e` into `node`: its
    /// attributes (empty without), its weight and its time where the edges
    /// carry them.
    pub fn edge_data_at(&self, e: usize, node: u32, at: EdgeAt) -> EdgeDatum<'_> {
        let dim = self.base.csr(e).edge_data().attr_dim as usize;
        match at {
            EdgeAt::Base(i) => {
                let row = self.base.csr(e).edge_row(node);
                EdgeDatum {
                    attrs: row.attrs.get(i * dim..(i + 1) * dim).unwrap_or_default(),
                    weight: row.weights.get(i).copied(),
                    time: row.times.get(i).copied(),
                }
            }
            EdgeAt::Added(j) => match self.added_data(e, node) {
                Some(data) => EdgeDatum {
                    attrs: data.attrs.get(j * dim..(j + 1) * dim).unwrap_or_default(),
                    weight: data.weights.get(j).copied(),
                    time: data.times.get(j).copied(),
                },
                None => EdgeDatum::default(),
            },
        }
    }

    /// Calls `each` with the bytes of the data of the edge at `at` of edge
    /// type `e` into `node`: little-endian attributes, weight, time (three
    /// calls, each possibly empty; none where the edges carry nothing).
    fn edge_data_bytes(&self, e: usize, node: u32, at: EdgeAt, mut each: impl FnMut(&[u8])) {
        if self.base.csr(e).edge_data().is_empty() {
            return;
        }
        let datum = self.edge_data_at(e, node, at);
        each(bytemuck::cast_slice(datum.attrs));
        each(bytemuck::cast_slice(datum.weight.as_slice()));
        each(bytemuck::cast_slice(datum.time.as_slice()));
    }

    /// This snapshot with one more node, `id` of type `node_type`, and its
    /// edges `edges` (per edge type, `(src, dst)` pairs whose other end is
    /// a node of the graph), exactly as an update adding them would make
    /// it, for one request to sample from (`NEW_NODE`): nothing is
    /// published. Costs what that update would (the paths of the ids it
    /// touches). Refuses an id the type has or an update could not add,
    /// and an edge to a node the graph does not have, by name. A request
    /// carries no edge data: the new node's edges of an edge type with
    /// data are taken when the request asks for none of its columns
    /// (`asked`; their data, zeros, is then never sent) and refused by
    /// name when it asks for one.
    pub fn with_new_node(
        &self,
        node_type: usize,
        id: u64,
        edges: &[Vec<(u64, u64)>],
        asked: protocol::request::EdgeColumns,
    ) -> anyhow::Result<GraphSnapshot> {
        let schema = self.schema();
        let name = &schema.node_types[node_type].name;
        ensure!(
            !self.is_node(node_type, id),
            "{name} {id} is already in the graph: predict it by its id (a new node needs an id \
             its type does not have)"
        );
        let ends = self.base.edge_types();
        let mut values = Vec::with_capacity(edges.len());
        for (e, pairs) in edges.iter().enumerate() {
            let data = schema.edge_types[e].data();
            ensure!(
                pairs.is_empty() || !asked.sent(&data).any(),
                "the new node's edges of edge type {}: the request asks for their data ({data}), \
                 and a new node's edges in a request carry none; add the node with its edges \
                 through an update (docs/graph-index.md, \"Edge data\"), then predict it by its \
                 id",
                schema.edge_types[e].key()
            );
            // Placeholders of the data no one asked for.
            let n = pairs.len();
            values.push(EdgeValues {
                attrs: vec![0.0; n * data.attr_dim as usize],
                weights: vec![0.0; if data.weight { n } else { 0 }],
                times: vec![0; if data.time { n } else { 0 }],
            });
            let (src, dst) = ends[e];
            for &(s, d) in pairs {
                let (other_type, other) = if src == node_type && s == id {
                    (dst, d)
                } else {
                    (src, s)
                };
                ensure!(
                    self.is_node(other_type, other) || (other_type == node_type && other == id),
                    "the new node's edge ({s}, {d}) of edge type {}: {} {other} is not in the \
                     graph; a new node's edges go to nodes the graph has",
                    schema.edge_types[e].key(),
                    schema.node_types[other_type].name,
                );
            }
        }
        let update = GraphUpdate {
            nodes: vec![(node_type, id)],
            edges: edges.iter().cloned().enumerate().collect(),
            values,
        };
        self.check(&update)?;
        let mut next = self.next();
        next.apply(&update, &mut Vec::new());
        Ok(next)
    }

    /// Refuses an update that names a type out of range, or an id above the
    /// maximum or too far past its type's bound, naming the type and the
    /// id; changes nothing.
    pub fn check(&self, update: &GraphUpdate) -> anyhow::Result<()> {
        let schema = self.schema();
        let ends = self.base.edge_types();
        for &(t, _) in &update.nodes {
            ensure!(t < self.id_bounds.len(), "node type index {t} out of range");
        }
        ensure!(
            update.values.is_empty() || update.values.len() == update.edges.len(),
            "an update with edge data gives it for each of its {} edge lists, not {}",
            update.edges.len(),
            update.values.len()
        );
        let none = EdgeValues::default();
        for (n, (e, pairs)) in update.edges.iter().enumerate() {
            ensure!(*e < ends.len(), "edge type index {e} out of range");
            update
                .values
                .get(n)
                .unwrap_or(&none)
                .check(&schema.edge_types[*e], pairs.len())?;
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
                "{name} id {max_id} lies {MAX_ID_GROWTH} or more ids past the largest {name} id \
                 {}: node ids are dense (the ids in between would become nodes); add the nodes \
                 in between first (or check the id)",
                self.id_bounds[t] as i64 - 1
            );
        }
        Ok(())
    }

    /// Makes `(t, id)` a node, if it is not; marks it in `touched`.
    fn make_node(&mut self, t: usize, id: u64, touched: &mut Vec<u64>) {
        if self.is_node(t, id) {
            return;
        }
        touched.push(node_key(t, id));
        if id < self.id_bounds[t] {
            self.filled[t].insert(id as u32, Row::from([]));
            self.n_nodes[t] += 1;
        } else {
            self.n_nodes[t] += id + 1 - self.id_bounds[t];
            self.id_bounds[t] = id + 1;
        }
    }

    /// Applies one checked update to this (private, next) snapshot; adds
    /// the nodes whose rows it changed (or that it made nodes) to
    /// `touched`, as change-clock keys.
    fn apply(&mut self, update: &GraphUpdate, touched: &mut Vec<u64>) -> UpdateStats {
        let before = self.n_nodes();
        let ends = self.base.edge_types().to_vec();
        for (t, id) in update.ids(&ends) {
            self.make_node(t, id, touched);
        }
        let (mut edges_added, mut considered) = (0u64, 0u64);
        let none = EdgeValues::default();
        for (n, (e, pairs)) in update.edges.iter().enumerate() {
            let e = *e;
            let (src_type, dst_type) = ends[e];
            if !self.base.csr(e).edge_data().is_empty() {
                let values = update.values.get(n).unwrap_or(&none);
                let added = self.add_edges_with_data(e, pairs, values, touched);
                considered += pairs.len() as u64;
                self.added_edges[e] += added;
                edges_added += added;
                continue;
            }
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
                    // An edge type whose ends are one type drops self
                    // loops, as the import does.
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
                touched.push(node_key(dst_type, u64::from(node)));
                self.deltas[e].insert(node, merged.into());
            }
            self.added_edges[e] += added;
            edges_added += added;
        }
        self.generation += 1;
        UpdateStats {
            nodes_added: self.n_nodes() - before,
            edges_added,
            edges_ignored: considered - edges_added,
            n_nodes: self.n_nodes(),
            generation: self.generation,
        }
    }
}

impl GraphSnapshot {
    /// Adds edge type `e`'s edges `pairs` with their data `values` (checked)
    /// to this (private, next) snapshot: every edge is kept (repeated pairs
    /// are edges of their own) except the self loops of an edge type whose
    /// ends are one type. Each destination's added row is merged with the
    /// new edges in the row's order (by (time, id), the earlier added
    /// first on ties, then the update's order). Returns the edges added.
    fn add_edges_with_data(
        &mut self,
        e: usize,
        pairs: &[(u64, u64)],
        values: &EdgeValues,
        touched: &mut Vec<u64>,
    ) -> u64 {
        let (src_type, dst_type) = self.base.edge_types()[e];
        let dim = self.base.csr(e).edge_data().attr_dim as usize;
        let mut incoming: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
        for (k, &(src, dst)) in pairs.iter().enumerate() {
            if !(src_type == dst_type && src == dst) {
                incoming.entry(dst as u32).or_default().push(k);
            }
        }
        let mut added = 0u64;
        for (node, mut fresh) in incoming {
            let time = |k: usize| values.times.get(k).copied().unwrap_or(0);
            fresh.sort_by_key(|&k| (time(k), pairs[k].0 as u32, k));
            let fresh_ids: Vec<u32> = fresh.iter().map(|&k| pairs[k].0 as u32).collect();
            let fresh_times: Vec<i64> = fresh
                .iter()
                .map(|&k| values.times.get(k).copied().unwrap_or(0))
                .collect();
            let previous = self.added_row(e, node);
            let previous_data = self.added_data(e, node).cloned().unwrap_or_default();
            let previous_times: &[i64] = &previous_data.times;
            let mut ids = Vec::with_capacity(previous.len() + fresh.len());
            let mut data = EdgeRowData::default();
            let (mut attrs, mut weights, mut times) = (Vec::new(), Vec::new(), Vec::new());
            let (mut i, mut j) = (0, 0);
            while i < previous.len() || j < fresh.len() {
                let from_previous = j == fresh.len()
                    || i < previous.len()
                        && row_key(previous, previous_times, i)
                            <= row_key(&fresh_ids, &fresh_times, j);
                if from_previous {
                    ids.push(previous[i]);
                    attrs.extend_from_slice(&previous_data.attrs[i * dim..(i + 1) * dim]);
                    weights.extend(previous_data.weights.get(i).copied());
                    times.extend(previous_data.times.get(i).copied());
                    i += 1;
                } else {
                    let k = fresh[j];
                    ids.push(fresh_ids[j]);
                    attrs.extend_from_slice(&values.attrs[k * dim..(k + 1) * dim]);
                    weights.extend(values.weights.get(k).copied());
                    times.extend(values.times.get(k).copied());
                    j += 1;
                }
            }
            (data.attrs, data.weights, data.times) = (attrs.into(), weights.into(), times.into());
            added += fresh.len() as u64;
            touched.push(node_key(dst_type, u64::from(node)));
            self.deltas[e].insert(node, ids.into());
            self.data[e].insert(node, Arc::new(data));
        }
        added
    }
}

/// The order key of a row's `i`-th edge: (time, id), the time 0 where
/// the row has none.
#[inline]
fn row_key(ids: &[u32], times: &[i64], i: usize) -> (i64, u32) {
    (times.get(i).copied().unwrap_or(0), ids[i])
}

/// Where the element at index `k` of the union of two ordered rows `a`
/// (of `a_len`) and `b` (of `b_len`) lies, `a_first(i, j)` saying whether
/// `a[i]` comes before `b[j]`: a binary search over how many of the first
/// `k + 1` come from `a`.
fn kth_in_union(
    a_len: usize,
    b_len: usize,
    k: usize,
    a_first: impl Fn(usize, usize) -> bool,
) -> EdgeAt {
    debug_assert!(k < a_len + b_len);
    let (mut lo, mut hi) = ((k + 1).saturating_sub(b_len), (k + 1).min(a_len));
    loop {
        let i = (lo + hi) / 2; // taken from a
        let j = k + 1 - i; // taken from b
        if i < a_len && j > 0 && a_first(i, j - 1) {
            // a[i] comes before b[j - 1]: more from a.
            lo = i + 1;
        } else if i > 0 && j < b_len && !a_first(i - 1, j) {
            // b[j] comes before a[i - 1]: fewer from a.
            hi = i - 1;
        } else {
            return match (i.checked_sub(1), j.checked_sub(1)) {
                (Some(x), Some(y)) if a_first(x, y) => EdgeAt::Added(y),
                (Some(x), Some(_)) | (Some(x), None) => EdgeAt::Base(x),
                (None, Some(y)) => EdgeAt::Added(y),
                (None, None) => unreachable!("k + 1 >= 1 elements are taken"),
            };
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

impl GraphSource for GraphSnapshot {
    fn n_node_types(&self) -> usize {
        self.id_bounds.len()
    }

    fn edge_types(&self) -> &[(usize, usize)] {
        self.base.edge_types()
    }

    #[inline]
    fn is_node(&self, node_type: usize, node: u64) -> bool {
        let bound = self.id_bounds[node_type];
        if node >= bound {
            return false;
        }
        if self.n_nodes[node_type] == bound {
            // No gaps: every id below the bound is a node.
            return true;
        }
        // Past the index's bound every id is a node (the dense rule); below
        // it, the index's known-node bitmap, or an update named it.
        node >= self.base.id_bound(node_type)
            || self.base.is_node(node_type, node)
            || self.filled[node_type].get(node as u32).is_some()
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
    /// delta): the same on a replica that compacted and on one that did
    /// not, so sampling picks the same nodes on both.
    fn neighbor(&self, edge_type: usize, node: u64, i: u32) -> u64 {
        let node = node as u32;
        let base = self.base.csr(edge_type).neighbors(node);
        let added = self.added_row(edge_type, node);
        if added.is_empty() {
            return u64::from(base[i as usize]);
        }
        if !self.data[edge_type].is_empty() {
            return u64::from(match self.edge_at(edge_type, node, i) {
                EdgeAt::Base(i) => base[i],
                EdgeAt::Added(j) => added[j],
            });
        }
        u64::from(kth_of_union(base, added, i as usize))
    }

    /// The index's row and the added edges are each sorted by time, and
    /// the row's order merges them by time: those at most `limit` are the
    /// first of both.
    fn valid_degree(&self, edge_type: usize, node: u64, degree: u32, limit: i64) -> u32 {
        let csr = self.base.csr(edge_type);
        if !csr.edge_data().time {
            return degree;
        }
        let node = node as u32;
        let valid = |times: &[i64]| times.partition_point(|&t| t <= limit) as u32;
        valid(csr.edge_row(node).times) + valid(self.added_times(edge_type, node))
    }
}

/// A one-type graph's view: node type 0, edge type 0 (the 1x1 graph's).
impl NeighborSource for GraphSnapshot {
    #[inline]
    fn degree(&self, node: u64) -> Option<u32> {
        if !self.is_node(0, node) {
            return None;
        }
        let node = node as u32;
        Some(self.base.csr(0).degree(node) + self.added_row(0, node).len() as u32)
    }

    #[inline]
    fn neighbor(&self, node: u64, i: u32) -> u64 {
        GraphSource::neighbor(self, 0, node, i)
    }
}

/// What a compaction wrote.
#[derive(Debug, Clone, Copy)]
pub struct Compacted {
    pub n_nodes: u64,
    pub n_edges: u64,
    pub generation: u64,
    pub seconds: f64,
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
    /// Delta entries plus added edges past which a compaction starts by
    /// itself; `None`: only when asked.
    compact_after: Option<u64>,
    /// Compactions completed.
    compactions: AtomicU64,
}

/// The served graph: the current snapshot, replaced atomically by updates.
/// Cloning it is cheap; the clones share the graph.
#[derive(Debug, Clone)]
pub struct LiveGraph {
    shared: Arc<Shared>,
}

impl LiveGraph {
    /// Serves `base` as its index holds it, compacting only when asked.
    pub fn new(base: TypedGraph) -> Self {
        Self::with_auto_compact(base, None)
    }

    /// A graph that compacts by itself (in a background thread) once its
    /// delta entries plus added edges pass `compact_after`.
    pub fn with_auto_compact(base: TypedGraph, compact_after: Option<u64>) -> Self {
        Self {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(GraphSnapshot::fresh(Arc::new(base))),
                changes: Arc::new(Changes::new()),
                writer: Mutex::new(WriterState::default()),
                compact_after,
                compactions: AtomicU64::new(0),
            }),
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

    /// Applies one update (the admin socket's), logged.
    pub fn update(&self, update: GraphUpdate) -> anyhow::Result<UpdateStats> {
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
    /// publishes one snapshot for all of them. `position`, when given, is
    /// the update-stream entry the batch ends at and the count of entries
    /// consumed up to it. Costs time and memory in proportion to the
    /// updates (their ids' paths in the deltas, and the added rows of the
    /// nodes they touch), not to the graph or the deltas.
    pub fn apply(
        &self,
        updates: &[GraphUpdate],
        position: Option<(StreamPosition, u64)>,
    ) -> Vec<anyhow::Result<UpdateStats>> {
        let mut writer = self.writer();
        let old = self.shared.current.load_full();
        let mut next = old.next();
        if let Some((at, consumed)) = position {
            next.position = at;
            next.consumed = consumed;
        }
        let mut touched = Vec::new();
        let outcomes: Vec<anyhow::Result<UpdateStats>> = updates
            .iter()
            .map(|update| {
                next.check(update)?;
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
        let wants_compaction = self.shared.compact_after.is_some_and(|after| {
            writer.compacting.is_none() && next.delta_entries() + next.added_edges() >= after
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
        let Some(after) = self.shared.compact_after else {
            return;
        };
        let graph = self.clone();
        let spawned = std::thread::Builder::new()
            .name("graph-compact".into())
            .spawn(move || loop {
                let delta = graph.snapshot().delta_entries();
                match graph.compact() {
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
                if now.delta_entries() + now.added_edges() < after {
                    return;
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start a graph compaction thread");
        }
    }

    /// Rewrites the index where it lives with every update folded in and
    /// switches to it. Updates and sampling go on while it builds: the
    /// updates applied meanwhile are replayed on the new base when it
    /// switches.
    pub fn compact(&self) -> anyhow::Result<Compacted> {
        let started = Instant::now();
        let snapshot = {
            let mut writer = self.writer();
            if writer.compacting.is_some() {
                bail!("a graph compaction is already running; wait for it to finish");
            }
            writer.compacting = Some(Vec::new());
            self.snapshot()
        };
        let built = write_compacted(&snapshot);
        let mut writer = self.writer();
        let recorded = writer.compacting.take().unwrap_or_default();
        let mut next = GraphSnapshot::fresh(Arc::new(built?));
        for update in &recorded {
            // Checked once already, against the same bounds; marked when
            // first applied (the graph served does not change here).
            next.apply(update, &mut Vec::new());
        }
        let current = self.snapshot();
        next.position = current.position;
        next.consumed = current.consumed;
        debug_assert_eq!(next.generation, current.generation);
        debug_assert_eq!(next.n_edges(), current.n_edges());
        let compacted = Compacted {
            n_nodes: next.n_nodes(),
            n_edges: next.n_edges(),
            generation: next.generation,
            seconds: started.elapsed().as_secs_f64(),
        };
        self.shared.current.store(Arc::new(next));
        drop(writer);
        self.shared.compactions.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            edges = compacted.n_edges,
            nodes = compacted.n_nodes,
            replayed = recorded.len(),
            "graph compacted into a new index"
        );
        Ok(compacted)
    }
}

/// Writes edge type `e` of `snapshot` as `(row, entry)` pairs, row by
/// row in each row's order, into `edge_file`; `flip` writes `(entry, row)`
/// (a typed index's edge files are `(src, dst)` and its rows
/// destinations). Edge data, if the edge type carries any, goes in the
/// same order into files beside `edge_file`, returned for the build.
fn write_edges(
    snapshot: &GraphSnapshot,
    e: usize,
    edge_file: &Path,
    flip: bool,
) -> anyhow::Result<EdgeDataFiles> {
    let (_, dst) = snapshot.base.edge_types()[e];
    let shape = snapshot.base.csr(e).edge_data();
    let path = |what: &str| edge_file.with_extension(format!("{what}.tmp"));
    let files = EdgeDataFiles {
        attrs: (shape.attr_dim > 0).then(|| (path("attrs"), shape.attr_dim)),
        weight: shape.weight.then(|| path("weights")),
        time: shape.time.then(|| path("times")),
    };
    let create = |file: Option<&std::path::PathBuf>| -> anyhow::Result<_> {
        file.map(|path| {
            std::fs::File::create(path)
                .map(|f| std::io::BufWriter::with_capacity(1 << 20, f))
                .with_context(|| format!("creating {}", path.display()))
        })
        .transpose()
    };
    let mut out = create(Some(&edge_file.to_path_buf()))?.expect("an edge file");
    // The data's parts, in the order edge_data_bytes gives them.
    let mut parts = [
        create(files.attrs.as_ref().map(|(path, _)| path))?,
        create(files.weight.as_ref())?,
        create(files.time.as_ref())?,
    ];
    let mut failed = None;
    for node in 0..snapshot.id_bounds[dst] as u32 {
        snapshot.for_each_edge(e, node, |v, at| {
            if failed.is_some() {
                return;
            }
            let (a, b) = if flip { (v, node) } else { (node, v) };
            let mut pair = [0u8; 8];
            pair[..4].copy_from_slice(&a.to_le_bytes());
            pair[4..].copy_from_slice(&b.to_le_bytes());
            failed = out.write_all(&pair).err();
            let mut part = 0;
            snapshot.edge_data_bytes(e, node, at, |bytes| {
                if let Some(file) = &mut parts[part] {
                    if failed.is_none() {
                        failed = file.write_all(bytes).err();
                    }
                }
                part += 1;
            });
        });
    }
    if let Some(e) = failed {
        return Err(e).with_context(|| format!("writing {} and its data", edge_file.display()));
    }
    out.flush()?;
    for file in parts.iter_mut().flatten() {
        file.flush()?;
    }
    Ok(files)
}

/// Removes a compaction's temporary edge file and the data files beside it.
fn remove_edge_files(edge_file: &Path, data: &EdgeDataFiles) {
    let _ = std::fs::remove_file(edge_file);
    let attrs = data.attrs.as_ref().map(|(path, _)| path);
    for path in [attrs, data.weight.as_ref(), data.time.as_ref()]
        .into_iter()
        .flatten()
    {
        let _ = std::fs::remove_file(path);
    }
}

/// Writes `snapshot` where its index lives and maps the result.
fn write_compacted(snapshot: &GraphSnapshot) -> anyhow::Result<TypedGraph> {
    match snapshot.base.location() {
        Location::OneType(path) => {
            write_index_file(snapshot, path)?;
            TypedGraph::open_one_type(path, snapshot.schema().node_types[0].feature_dim)
        }
        Location::Typed(data_dir) => {
            write_index_dir(snapshot, data_dir)?;
            TypedGraph::open(data_dir)
        }
    }
}

/// A one-type graph as a CSR index at `index_path` (temporary name, then
/// rename), with a known-node bitmap where the index it replaces left gaps
/// an update did not fill.
fn write_index_file(snapshot: &GraphSnapshot, index_path: &Path) -> anyhow::Result<()> {
    let edge_file = index_path.with_extension("compact.edges.tmp");
    let n_nodes = snapshot.id_bounds[0];
    let known = (snapshot.gaps(0) > 0).then(|| {
        let mut bits = vec![0u64; n_nodes.div_ceil(64) as usize];
        for node in (0..n_nodes).filter(|&node| snapshot.is_node(0, node)) {
            bits[node as usize / 64] |= 1 << (node % 64);
        }
        bits
    });
    let mut written = EdgeDataFiles::default();
    let built = write_edges(snapshot, 0, &edge_file, false).and_then(|edge_data| {
        written = edge_data.clone();
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
                edge_data,
            },
        )
    });
    remove_edge_files(&edge_file, &written);
    built.map(drop)
}

/// A typed graph as a typed index in `<data_dir>/typed-graph.tmp`, then
/// swapped in for `typed-graph` (the old one renamed `typed-graph.old`
/// first, and removed once the new one is in place:
/// [`typed::recover_interrupted_compaction`] puts it back if a crash comes
/// between the two renames).
fn write_index_dir(snapshot: &GraphSnapshot, data_dir: &Path) -> anyhow::Result<()> {
    let schema = snapshot.schema();
    ensure!(
        (0..schema.node_types.len()).all(|t| snapshot.gaps(t) == 0),
        "a typed index has no known-node bitmap: its node types cannot have gaps"
    );
    let tmp = data_dir.join(format!("{}.tmp", typed::TYPED_DIR));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("removing the leftover {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    for (e, &(src, dst)) in snapshot.base.edge_types().iter().enumerate() {
        let key = schema.edge_types[e].key();
        let edge_file = tmp.join(format!("{key}.edges.tmp"));
        let edge_data = write_edges(snapshot, e, &edge_file, true)?;
        let written = edge_data.clone();
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
                edge_data,
            },
        )
        .with_context(|| format!("compacting edge type {key}"))?;
        remove_edge_files(&edge_file, &written);
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
        out.gauge(
            "graph_nodes",
            "nodes of the served graph, over every node type",
            c.nodes,
        )?;
        out.gauge(
            "graph_edges",
            "edges of the served graph, over every edge type",
            c.edges,
        )?;
        out.gauge(
            "graph_generation",
            "updates applied to the graph since its import (kept by compaction)",
            c.generation,
        )?;
        out.gauge(
            "graph_delta_entries",
            "entries of the graph's in-memory deltas (nodes with added edges, nodes added in \
             the index's gaps)",
            c.delta_entries,
        )?;
        out.counter(
            "graph_compactions",
            "graph compactions completed (asked for or automatic)",
            c.compactions,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::typed::import_typed;

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
        let graph = LiveGraph::new(small_graph(dir.path()));
        let before = graph.snapshot();
        let checksum = before.checksum();
        assert_eq!(before.sources(0, 0), vec![0, 1]);
        let stats = graph
            .update(GraphUpdate {
                nodes: vec![(1, 2)],
                edges: vec![(0, vec![(4, 2), (2, 0), (0, 0)]), (1, vec![(1, 1)])],
                values: Vec::new(),
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
        assert_eq!(GraphSource::degree(&*after, 0, 0), Some(3));
        assert_eq!(GraphSource::neighbor(&*after, 0, 0, 2), 2);
        assert_eq!(after.sources(0, 2), vec![4]);
        assert_eq!(
            GraphSource::degree(&*after, 0, 3),
            None,
            "item 3 is not a node"
        );
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
        let graph = LiveGraph::new(small_graph(dir.path()));
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
            .update(GraphUpdate {
                nodes: vec![],
                edges: vec![(0, vec![(2, 0)]), (1, vec![(2, 0)])],
                values: Vec::new(),
            })
            .unwrap();
        assert_eq!(
            graph.snapshot().top_degree(4, all),
            [(0, 0), (0, 2), (1, 0), (0, 1)]
        );
    }

    #[test]
    fn a_typed_compaction_writes_what_is_served_and_a_restart_maps_it() {
        let dir = tempfile::tempdir().unwrap();
        let graph = LiveGraph::new(small_graph(dir.path()));
        graph
            .update(GraphUpdate {
                nodes: vec![(1, 3)],
                edges: vec![(0, vec![(4, 3), (2, 0)]), (1, vec![(2, 4)])],
                values: Vec::new(),
            })
            .unwrap();
        let served = graph.snapshot();
        let compacted = graph.compact().unwrap();
        assert_eq!(compacted.n_edges, served.n_edges());
        let now = graph.snapshot();
        assert_eq!(now.checksum(), served.checksum());
        assert_eq!(now.delta_entries(), 0, "everything in the index");
        assert_eq!(now.base_generation(), now.generation());
        // A restart maps what the compaction wrote.
        let reopened = LiveGraph::new(TypedGraph::open(&dir.path().join("data")).unwrap());
        let reopened = reopened.snapshot();
        assert_eq!(reopened.checksum(), served.checksum());
        assert_eq!((reopened.id_bound(0), reopened.id_bound(1)), (5, 4));
        assert_eq!(reopened.sources(0, 0), vec![0, 1, 2]);
        assert_eq!(reopened.generation(), served.generation());
    }

    #[test]
    fn an_id_too_far_past_its_type_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let graph = LiveGraph::new(small_graph(dir.path()));
        let far = 3 + MAX_ID_GROWTH;
        let err = graph
            .update(GraphUpdate {
                nodes: vec![(1, 2)],
                edges: vec![(0, vec![(far, 0)])],
                values: Vec::new(),
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

    /// A one-type index of 4 nodes whose node 2 is a gap (a known-node
    /// bitmap, as an earlier release's compaction left): 0-1, 1-3.
    fn gapped_one_type(dir: &std::path::Path) -> std::path::PathBuf {
        let edges = dir.join("edges.bin");
        let pairs: Vec<u8> = [(0u32, 1u32), (1, 0), (1, 3), (3, 1)]
            .iter()
            .flat_map(|&(s, d)| [s.to_le_bytes(), d.to_le_bytes()])
            .flatten()
            .collect();
        std::fs::write(&edges, pairs).unwrap();
        let path = dir.join("graph.csr");
        build::build(
            &EdgeFile {
                path: edges,
                n_nodes: Some(4),
            },
            &path,
            &BuildOptions {
                known: Some(vec![0b1011]),
                ..BuildOptions::default()
            },
        )
        .unwrap();
        path
    }

    #[test]
    fn a_gap_stays_unknown_until_named_and_ids_past_the_end_fill_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = gapped_one_type(dir.path());
        let graph = LiveGraph::new(TypedGraph::open_one_type(&path, 0).unwrap());
        let s = graph.snapshot();
        assert_eq!((s.n_nodes(), s.id_bound(0)), (3, 4));
        assert!(!s.is_node(0, 2), "the bitmap's gap");
        // Past the end: 4 and 5 become nodes with 6.
        let stats = graph
            .update(GraphUpdate::one_type(&[6], &[], false))
            .unwrap();
        assert_eq!(stats.nodes_added, 3);
        let s = graph.snapshot();
        assert!(s.is_node(0, 4) && s.is_node(0, 5) && s.is_node(0, 6));
        assert!(!s.is_node(0, 2), "a gap below the old end stays one");
        let gapped = s.checksum();
        // Compacted, the gap is kept (a bitmap) and the digest is the same.
        graph.compact().unwrap();
        let s = graph.snapshot();
        assert_eq!(s.checksum(), gapped);
        assert!(!s.is_node(0, 2) && s.is_node(0, 5));
        // Named, the gap becomes a node, and with an edge a neighbour.
        graph
            .update(GraphUpdate::one_type(&[], &[(2, 0)], true))
            .unwrap();
        let s = graph.snapshot();
        assert!(s.is_node(0, 2));
        assert_eq!(s.sources(0, 2), vec![0]);
        assert_eq!(s.sources(0, 0), vec![1, 2]);
        assert_eq!(s.n_nodes(), 7);
        let filled = s.checksum();
        graph.compact().unwrap();
        let s = graph.snapshot();
        assert_eq!(s.checksum(), filled);
        assert_eq!(s.n_nodes(), 7);
        assert_eq!(s.delta_entries(), 0);
        let reopened = LiveGraph::new(TypedGraph::open_one_type(&path, 0).unwrap()).snapshot();
        assert_eq!(reopened.checksum(), filled);
    }
}
