//! Uniform neighbour sampling without replacement, with a hard cap per hop.
//!
//! A node's neighbours are sampled by *index*: Floyd's algorithm draws `k`
//! distinct indices out of `0..degree` with exactly `k` random draws, so the
//! cost of a node is O(fanout) whatever its degree (a node with ten million
//! edges costs what a node with twenty costs). Nodes are deduplicated across
//! hops and across the targets of a batch: each unique node gets one row. The
//! output has the shape of the response's target table: the dense layout's
//! per-target hop arrays ([`Sampler::sample`]), or a graph layout's edge
//! lists per edge type, shaped as PyTorch Geometric's `NeighborLoader`
//! shapes a batch ([`Sampler::sample_graph`]; a one-type graph's subgraph
//! layout is the 1x1 graph's, through [`OneType`]). Both draw a node's
//! neighbours with the same [`pick`] from a generator seeded by the node's
//! id, and share the row deduplication.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;

use protocol::layout::MAX_HOPS;
use protocol::payload::schema::{target_status, HOP2_CACHED, NO_ROW};
use protocol::payload::{GraphColumns, TargetColumns};

/// Read access to a graph by neighbour index.
pub trait NeighborSource {
    /// Degree of `node`, or `None` if the node is not in the graph.
    fn degree(&self, node: u64) -> Option<u32>;
    /// The `i`-th neighbour of `node` (`i < degree(node)`).
    fn neighbor(&self, node: u64, i: u32) -> u64;
}

impl NeighborSource for crate::graph::CsrIndex {
    fn degree(&self, node: u64) -> Option<u32> {
        let node = u32::try_from(node).ok()?;
        self.is_known(node).then(|| self.degree(node))
    }

    fn neighbor(&self, node: u64, i: u32) -> u64 {
        u64::from(self.neighbors(node as u32)[i as usize])
    }
}

/// One batch's sampled neighbourhoods, laid out like the target table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sampled {
    pub fanouts: [u32; MAX_HOPS],
    /// Unique node ids, in node-table row order (targets first).
    pub nodes: Vec<u64>,
    pub status: Vec<u8>,
    pub target_row: Vec<i32>,
    pub hop1_count: Vec<i32>,
    /// `n_targets x f1`; padding holds the target's row.
    pub hop1_rows: Vec<i32>,
    /// `n_targets x f1`; 0 for padding entries.
    pub hop2_count: Vec<i32>,
    /// `n_targets x f1 x f2`; padding holds the target's row.
    pub hop2_rows: Vec<i32>,
    /// Random draws and set probes spent: the sampling work, for tests that
    /// prove it does not grow with degree.
    pub work: u64,
}

/// Why a subgraph was not sampled whole: it outgrew a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubgraphTooLarge {
    /// More unique nodes than `max_nodes`.
    Nodes { max_nodes: usize },
    /// More edges than `max_edges`.
    Edges { max_edges: usize },
}

/// What a subgraph may hold before sampling stops (a response's bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubgraphLimits {
    pub max_nodes: usize,
    pub max_edges: usize,
}

impl Sampled {
    pub fn n_targets(&self) -> usize {
        self.status.len()
    }

    /// Copies a dense-layout sample into a response's target table (the
    /// columns have exactly these shapes; the node table's ids are
    /// [`Sampled::nodes`]).
    pub fn write_targets(&self, targets: &[u64], columns: &mut TargetColumns<'_>) {
        columns.target_id.copy_from_slice(targets);
        columns.status.copy_from_slice(&self.status);
        columns.target_row.copy_from_slice(&self.target_row);
        columns.hop1_count.copy_from_slice(&self.hop1_count);
        columns.hop1_rows.copy_from_slice(&self.hop1_rows);
        columns.hop2_count.copy_from_slice(&self.hop2_count);
        columns.hop2_rows.copy_from_slice(&self.hop2_rows);
    }
}

/// What a graph response holds of a sample besides its node tables: the
/// targets' status and rows, per edge type its edges, per node type and
/// edge type its counts.
#[derive(Debug, Clone, Copy)]
pub struct GraphSample<'s> {
    pub status: &'s [u8],
    pub target_row: &'s [i32],
    pub edge_src: &'s [Vec<i64>],
    pub edge_dst: &'s [Vec<i64>],
    pub sampled_nodes: &'s [Vec<i64>],
    pub sampled_edges: &'s [Vec<i64>],
}

impl GraphSample<'_> {
    /// Copies the sample into a graph response's target table, edge lists
    /// and counts (the columns have exactly these shapes; the node tables
    /// are the caller's to fill).
    pub fn write(&self, targets: &[u64], cols: &mut GraphColumns<'_>) {
        cols.target_id.copy_from_slice(targets);
        cols.status.copy_from_slice(self.status);
        cols.target_row.copy_from_slice(self.target_row);
        for (e, index) in cols.edge_index.iter_mut().enumerate() {
            let (src, dst) = index.split_at_mut(self.edge_src[e].len());
            src.copy_from_slice(&self.edge_src[e]);
            dst.copy_from_slice(&self.edge_dst[e]);
        }
        for (counts, sampled) in cols.sampled_nodes.iter_mut().zip(self.sampled_nodes) {
            counts.copy_from_slice(sampled);
        }
        for (counts, sampled) in cols.sampled_edges.iter_mut().zip(self.sampled_edges) {
            counts.copy_from_slice(sampled);
        }
    }
}

/// A reusable sampler (keeps its scratch space between batches).
#[derive(Debug, Default)]
pub struct Sampler {
    rows: FxHashMap<u64, i32>,
    /// Per node type: each sampled node's row, in the typed sampler.
    typed_rows: Vec<FxHashMap<u64, i32>>,
    picked: Vec<u32>,
}

/// Read access to a typed graph: for each edge type `(src, relation, dst)`
/// (by index), each `dst` node's sources by index, as the typed index keeps
/// them (docs/graph-index.md, "Typed datasets").
pub trait GraphSource {
    fn n_node_types(&self) -> usize;
    /// Each edge type's (source type, destination type).
    fn edge_types(&self) -> &[(usize, usize)];
    /// Whether `node` is a node of `node_type`.
    fn is_node(&self, node_type: usize, node: u64) -> bool;
    /// How many sources `node` has; `None` when it is not a node of the
    /// edge type's `dst` type.
    fn degree(&self, edge_type: usize, node: u64) -> Option<u32>;
    /// Its `i`-th source (`i < degree`).
    fn neighbor(&self, edge_type: usize, node: u64, i: u32) -> u64;
    /// How many of `node`'s `degree` sources come through an edge whose
    /// time is at most `limit`: the first ones, as a row with times is
    /// sorted by time; `degree` where the edge type has no times.
    fn valid_degree(&self, _edge_type: usize, _node: u64, degree: u32, _limit: i64) -> u32 {
        degree
    }
}

/// Temporal sampling (the request flag `SEED_TIME`, docs/protocol.md,
/// "Temporal sampling"): each target's seed time, and whether a node takes
/// its most recent valid sources (`last`, PyG's `temporal_strategy="last"`)
/// or draws among them uniformly.
#[derive(Debug, Clone, Copy)]
pub struct Temporal<'a> {
    pub seed_times: &'a [i64],
    pub last: bool,
}

/// A one-type graph as a typed one: one node type, one edge type whose
/// sources of a node are its neighbours.
#[derive(Debug)]
pub struct OneType<'a, G>(pub &'a G);

impl<G: NeighborSource> GraphSource for OneType<'_, G> {
    fn n_node_types(&self) -> usize {
        1
    }

    fn edge_types(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }

    fn is_node(&self, _: usize, node: u64) -> bool {
        self.0.degree(node).is_some()
    }

    fn degree(&self, _: usize, node: u64) -> Option<u32> {
        self.0.degree(node)
    }

    fn neighbor(&self, _: usize, node: u64, i: u32) -> u64 {
        self.0.neighbor(node, i)
    }
}

/// Mixed into the batch seed per edge type (times its index: edge type 0,
/// the one-type case, keeps the batch seed).
const EDGE_TYPE_SALT: u64 = 0xd6e8_feb8_6659_fd93;

/// Fanouts of a typed sample: for each edge type, one per hop (1 to
/// [`protocol::layout::MAX_SUBGRAPH_HOPS`]), 0 for "not at this hop".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphFanouts {
    hops: usize,
    /// Edge type `e`, hop `h` at `e * hops + h`.
    fanouts: Vec<u32>,
}

impl GraphFanouts {
    /// `None` unless `hops` is 1 to the most hops a subgraph has and
    /// `fanouts` holds `hops` values per edge type.
    pub fn new(hops: usize, fanouts: Vec<u32>) -> Option<Self> {
        let valid = (1..=protocol::layout::MAX_SUBGRAPH_HOPS).contains(&hops)
            && fanouts.len().is_multiple_of(hops);
        valid.then_some(Self { hops, fanouts })
    }

    pub fn hops(&self) -> usize {
        self.hops
    }

    pub fn n_edge_types(&self) -> usize {
        self.fanouts.len() / self.hops
    }

    /// Edge type `edge_type`'s fanout at `hop`.
    pub fn get(&self, edge_type: usize, hop: usize) -> u32 {
        self.fanouts[edge_type * self.hops + hop]
    }
}

/// One typed sample (see [`Sampler::sample_graph`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphSampled {
    /// Per node type: its unique node ids, in row order.
    pub nodes: Vec<Vec<u64>>,
    /// Per target: `OK`, `UNKNOWN_NODE` or `FRESH`.
    pub status: Vec<u8>,
    /// Per target: its row in the target type ([`NO_ROW`] when fresh).
    pub target_row: Vec<i32>,
    /// Per edge type: each edge's source row (in the source type).
    pub edge_src: Vec<Vec<i64>>,
    /// Per edge type: each edge's destination row (in the destination type).
    pub edge_dst: Vec<Vec<i64>>,
    /// Per edge type: each edge's place among its destination's sources
    /// (the `i` of [`GraphSource::neighbor`]), where its data lies.
    pub edge_pos: Vec<Vec<u32>>,
    /// A temporal sample's: per node type, the target (its index in the
    /// request) whose tree each row belongs to (PyG's `batch`); empty
    /// otherwise.
    pub tree: Vec<Vec<u32>>,
    /// Per node type: the nodes first reached at each hop (hop 0: the
    /// unique targets), hops + 1 counts (PyG's `num_sampled_nodes_dict`).
    pub sampled_nodes: Vec<Vec<i64>>,
    /// Per edge type: the edges sampled at each hop (PyG's
    /// `num_sampled_edges_dict`).
    pub sampled_edges: Vec<Vec<i64>>,
    /// Random draws and set probes spent.
    pub work: u64,
}

impl GraphSampled {
    /// What its response holds besides the node tables.
    pub fn graph(&self) -> GraphSample<'_> {
        GraphSample {
            status: &self.status,
            target_row: &self.target_row,
            edge_src: &self.edge_src,
            edge_dst: &self.edge_dst,
            sampled_nodes: &self.sampled_nodes,
            sampled_edges: &self.sampled_edges,
        }
    }
}

impl Sampler {
    /// Samples every target's 2-hop neighbourhood. Each target's draws come
    /// from a generator seeded by `seed` and the target's id alone, so a
    /// target's neighbourhood depends on the seed and the graph only: not on
    /// the other targets of the batch, nor on the order of the requests.
    /// Unknown targets get a row and status `UNKNOWN_NODE`, and no
    /// neighbours; the batch never fails for them.
    pub fn sample(
        &mut self,
        graph: &impl NeighborSource,
        targets: &[u64],
        fanouts: [u32; MAX_HOPS],
        seed: u64,
    ) -> Sampled {
        self.sample_hops(graph, targets, fanouts, seed, true, &[], &mut |_, _| false)
    }

    /// As [`Sampler::sample`], except that the targets whose `fresh` entry
    /// is true get their own row alone and status `FRESH` (the request flag
    /// `FRESH_SINCE`: their caller holds their answer), and that a hop-1
    /// node `n` of degree `d` for which `cached(n, d)` holds gets no hop-2
    /// neighbours and `hop2_count` [`HOP2_CACHED`] (the request flag
    /// `HUB_H1`: the caller holds its layer-1 embedding). The draws are
    /// made as by [`Sampler::sample`] (a cached node's are drawn and
    /// dropped), so every other node's sample is the one it gets there.
    pub fn sample_unless(
        &mut self,
        graph: &impl NeighborSource,
        targets: &[u64],
        fanouts: [u32; MAX_HOPS],
        seed: u64,
        fresh: &[bool],
        cached: &mut dyn FnMut(u64, u32) -> bool,
    ) -> Sampled {
        self.sample_hops(graph, targets, fanouts, seed, true, fresh, cached)
    }

    /// The targets' own rows only (the request flag `OWN_ROWS_ONLY`):
    /// fanouts [1, 1] with every count 0 and the padding holding the
    /// target's row; unknown targets are flagged as by [`Sampler::sample`].
    pub fn own_rows(&mut self, graph: &impl NeighborSource, targets: &[u64]) -> Sampled {
        self.sample_hops(graph, targets, [1, 1], 0, false, &[], &mut |_, _| false)
    }

    /// Samples a typed subgraph as PyG's `NeighborLoader` samples a
    /// `HeteroData` for seeds of one node type (`target_type`): per node
    /// type its unique nodes (the targets first in theirs, then each hop's
    /// newly reached nodes), per edge type its edges in local ids. Each
    /// hop, every edge type `(src, relation, dst)` in the graph's order
    /// draws, for each `dst` node the hop before reached (in row order), up
    /// to its fanout at that hop of the node's sources, uniformly without
    /// replacement ([`pick`], O(fanout)); a fanout of 0 draws nothing. A
    /// node's draws for an edge type come from a generator seeded by
    /// `seed`, the edge type and the node's id alone (edge type 0: the
    /// one-type sampler's seed), so they are those [`hop1_of`] makes at its
    /// fanout. The unique targets come first, in request order; an unknown
    /// target gets a row, status `UNKNOWN_NODE` and no edges. The targets
    /// whose `fresh` entry is true (the request flag `FRESH_SINCE`: their
    /// caller holds their answer) get status `FRESH` and no row
    /// ([`NO_ROW`]), and are left out of the sample: the subgraph is the
    /// one the other targets get alone. A one-type graph's subgraph layout
    /// is this sample of the 1x1 graph ([`OneType`]), shaped as
    /// `NeighborLoader(num_neighbors=fanouts, replace=False)` builds a
    /// batch (docs/protocol.md, "The subgraph layout"). Stops, with what
    /// outgrew, once the nodes of all types or the edges of all types pass
    /// `limits`.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_graph(
        &mut self,
        graph: &impl GraphSource,
        target_type: usize,
        targets: &[u64],
        fanouts: &GraphFanouts,
        seed: u64,
        limits: SubgraphLimits,
        fresh: &[bool],
    ) -> Result<GraphSampled, SubgraphTooLarge> {
        self.sample_graph_at(
            graph,
            target_type,
            targets,
            fanouts,
            seed,
            limits,
            fresh,
            None,
        )
    }

    /// [`Sampler::sample_graph`], temporal with `temporal` (PyG's
    /// `NeighborLoader` with `time_attr` on the edges, which samples
    /// disjoint trees): each target is the root of its own tree, a node
    /// reached in two trees has a row in each (`tree` says whose), and a
    /// node of target `t`'s tree draws only among its sources through an
    /// edge whose time is at most `seed_times[t]` (the first ones of its
    /// row, sorted by time; every source for an edge type without times),
    /// at every hop: uniformly, or with `last` the most recent `fanout` of
    /// them, in the row's order. The trees are laid out hop by hop, as
    /// the batch of PyG's disjoint sampling is: the targets first, one row
    /// each, then each hop's new rows of every tree in frontier order.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_graph_at(
        &mut self,
        graph: &impl GraphSource,
        target_type: usize,
        targets: &[u64],
        fanouts: &GraphFanouts,
        seed: u64,
        limits: SubgraphLimits,
        fresh: &[bool],
        temporal: Option<Temporal<'_>>,
    ) -> Result<GraphSampled, SubgraphTooLarge> {
        let ends = graph.edge_types();
        let n_types = graph.n_node_types();
        assert_eq!(
            fanouts.n_edge_types(),
            ends.len(),
            "one fanout list per edge type"
        );
        let mut out = GraphSampled {
            nodes: vec![Vec::new(); n_types],
            status: Vec::with_capacity(targets.len()),
            target_row: Vec::with_capacity(targets.len()),
            edge_src: vec![Vec::new(); ends.len()],
            edge_dst: vec![Vec::new(); ends.len()],
            edge_pos: vec![Vec::new(); ends.len()],
            tree: vec![Vec::new(); if temporal.is_some() { n_types } else { 0 }],
            sampled_nodes: vec![Vec::with_capacity(fanouts.hops() + 1); n_types],
            sampled_edges: vec![Vec::with_capacity(fanouts.hops()); ends.len()],
            work: 0,
        };
        out.nodes[target_type].reserve(targets.len() * 16);
        self.typed_rows.resize_with(n_types, FxHashMap::default);
        for rows in &mut self.typed_rows {
            rows.clear();
        }
        let rows = &mut self.typed_rows;
        for (t, &target) in targets.iter().enumerate() {
            if fresh.get(t) == Some(&true) {
                out.target_row.push(NO_ROW);
                out.status.push(target_status::FRESH);
                continue;
            }
            // A temporal sample's rows are per tree: keyed by the tree too.
            let key = tree_key(temporal.is_some(), t as u32, target);
            let before = out.nodes[target_type].len();
            out.target_row.push(row_in_keyed(
                &mut rows[target_type],
                &mut out.nodes[target_type],
                key,
                target,
            ));
            if temporal.is_some() && out.nodes[target_type].len() > before {
                out.tree[target_type].push(t as u32);
            }
            out.status.push(if graph.is_node(target_type, target) {
                target_status::OK
            } else {
                target_status::UNKNOWN_NODE
            });
        }
        let mut n_nodes: usize = 0;
        let mut n_edges: usize = 0;
        let mut frontier = Vec::with_capacity(n_types);
        for (t, nodes) in out.nodes.iter().enumerate() {
            out.sampled_nodes[t].push(nodes.len() as i64);
            frontier.push(0..nodes.len());
            n_nodes += nodes.len();
        }
        let mut before = vec![0usize; n_types];
        for hop in 0..fanouts.hops() {
            for (t, nodes) in out.nodes.iter().enumerate() {
                before[t] = nodes.len();
            }
            for (e, &(src, dst)) in ends.iter().enumerate() {
                let fanout = fanouts.get(e, hop);
                let edges_before = out.edge_src[e].len();
                let salted = seed ^ (e as u64).wrapping_mul(EDGE_TYPE_SALT);
                for local in frontier[dst].clone() {
                    if fanout == 0 {
                        break;
                    }
                    let node = out.nodes[dst][local];
                    let Some(degree) = graph.degree(e, node) else {
                        continue;
                    };
                    let tree = temporal.map(|_| out.tree[dst][local]);
                    match (temporal, tree) {
                        (Some(temporal), Some(tree)) => {
                            let limit = temporal.seed_times[tree as usize];
                            let valid = graph.valid_degree(e, node, degree, limit);
                            out.work += u64::from(32 - degree.leading_zeros());
                            if temporal.last {
                                self.picked.clear();
                                self.picked.extend(valid.saturating_sub(fanout)..valid);
                                out.work += u64::from(valid.min(fanout));
                            } else {
                                let mut rng = SmallRng::seed_from_u64(target_seed(salted, node));
                                out.work += pick(&mut rng, valid, fanout, &mut self.picked);
                            }
                        }
                        _ => {
                            let mut rng = SmallRng::seed_from_u64(target_seed(salted, node));
                            out.work += pick(&mut rng, degree, fanout, &mut self.picked);
                        }
                    }
                    let (rows, nodes) = (&mut rows[src], &mut out.nodes[src]);
                    let (sources, destinations) = (&mut out.edge_src[e], &mut out.edge_dst[e]);
                    let added_before = nodes.len();
                    for &i in &self.picked {
                        let neighbour = graph.neighbor(e, node, i);
                        let key = tree_key(tree.is_some(), tree.unwrap_or(0), neighbour);
                        let before = nodes.len();
                        let row = row_in_keyed(rows, nodes, key, neighbour);
                        if let (Some(tree), true) = (tree, nodes.len() > before) {
                            out.tree[src].push(tree);
                        }
                        sources.push(i64::from(row));
                        destinations.push(local as i64);
                    }
                    out.edge_pos[e].extend_from_slice(&self.picked);
                    n_nodes += nodes.len() - added_before;
                    n_edges += self.picked.len();
                    if n_nodes > limits.max_nodes {
                        return Err(SubgraphTooLarge::Nodes {
                            max_nodes: limits.max_nodes,
                        });
                    }
                    if n_edges > limits.max_edges {
                        return Err(SubgraphTooLarge::Edges {
                            max_edges: limits.max_edges,
                        });
                    }
                }
                out.sampled_edges[e].push((out.edge_src[e].len() - edges_before) as i64);
            }
            for (t, nodes) in out.nodes.iter().enumerate() {
                out.sampled_nodes[t].push((nodes.len() - before[t]) as i64);
                frontier[t] = before[t]..nodes.len();
            }
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn sample_hops(
        &mut self,
        graph: &impl NeighborSource,
        targets: &[u64],
        fanouts: [u32; MAX_HOPS],
        seed: u64,
        neighbours: bool,
        fresh: &[bool],
        cached: &mut dyn FnMut(u64, u32) -> bool,
    ) -> Sampled {
        let [f1, f2] = fanouts;
        let (f1u, f2u) = (f1 as usize, f2 as usize);
        let n = targets.len();
        let mut out = Sampled {
            fanouts,
            nodes: Vec::with_capacity(n * (1 + f1u + f1u * f2u).min(4096)),
            status: Vec::with_capacity(n),
            target_row: Vec::with_capacity(n),
            hop1_count: Vec::with_capacity(n),
            hop1_rows: Vec::with_capacity(n * f1u),
            hop2_count: Vec::with_capacity(n * f1u),
            hop2_rows: Vec::with_capacity(n * f1u * f2u),
            ..Sampled::default()
        };
        self.rows.clear();
        let rows = &mut self.rows;
        let nodes = &mut out.nodes;
        let mut row_of = |node: u64| -> i32 {
            *rows.entry(node).or_insert_with(|| {
                nodes.push(node);
                (nodes.len() - 1) as i32
            })
        };
        for &target in targets {
            out.target_row.push(row_of(target));
        }
        let mut hop1: Vec<u64> = Vec::with_capacity(f1u);
        for (t, &target) in targets.iter().enumerate() {
            let target_row = out.target_row[t];
            let mut rng = SmallRng::seed_from_u64(target_seed(seed, target));
            hop1.clear();
            match graph.degree(target) {
                None => out.status.push(target_status::UNKNOWN_NODE),
                Some(_) if fresh.get(t) == Some(&true) => out.status.push(target_status::FRESH),
                Some(_) if !neighbours => out.status.push(target_status::OK),
                Some(degree) => {
                    out.status.push(target_status::OK);
                    out.work += pick(&mut rng, degree, f1, &mut self.picked);
                    hop1.extend(self.picked.iter().map(|&i| graph.neighbor(target, i)));
                }
            }
            out.hop1_count.push(hop1.len() as i32);
            for i in 0..f1u {
                let Some(&n1) = hop1.get(i) else {
                    out.hop1_rows.push(target_row);
                    out.hop2_count.push(0);
                    out.hop2_rows.extend(std::iter::repeat_n(target_row, f2u));
                    continue;
                };
                out.hop1_rows.push(row_of(n1));
                let degree = graph.degree(n1).unwrap_or(0);
                out.work += pick(&mut rng, degree, f2, &mut self.picked);
                if cached(n1, degree) {
                    out.hop2_count.push(HOP2_CACHED);
                    out.hop2_rows.extend(std::iter::repeat_n(target_row, f2u));
                    continue;
                }
                out.hop2_count.push(self.picked.len() as i32);
                for j in 0..f2u {
                    let row = match self.picked.get(j) {
                        Some(&idx) => row_of(graph.neighbor(n1, idx)),
                        None => target_row,
                    };
                    out.hop2_rows.push(row);
                }
            }
        }
        out
    }
}

/// The row of `node` in `nodes`, appending it the first time.
/// A row's key in a sample's row map: the node id, and in a temporal
/// sample (disjoint trees) its tree too. Ids are below 2^32 (the index's
/// u32 ids; a request's new node is not sampled temporally).
fn tree_key(temporal: bool, tree: u32, node: u64) -> u64 {
    if temporal {
        u64::from(tree) << 32 | (node & 0xffff_ffff)
    } else {
        node
    }
}

/// The row of `key` (a [`tree_key`]), appending `node` to `nodes` when it
/// is new.
fn row_in_keyed(rows: &mut FxHashMap<u64, i32>, nodes: &mut Vec<u64>, key: u64, node: u64) -> i32 {
    *rows.entry(key).or_insert_with(|| {
        nodes.push(node);
        (nodes.len() - 1) as i32
    })
}

/// The hop-1 sample of `node` at fanout `f1` as [`Sampler::sample`] draws
/// it for `node` as a target with `seed`, into `out` (`picked`: scratch).
pub fn hop1_of(
    graph: &impl NeighborSource,
    node: u64,
    f1: u32,
    seed: u64,
    picked: &mut Vec<u32>,
    out: &mut Vec<u64>,
) {
    out.clear();
    let Some(degree) = graph.degree(node) else {
        return;
    };
    let mut rng = SmallRng::seed_from_u64(target_seed(seed, node));
    pick(&mut rng, degree, f1, picked);
    out.extend(picked.iter().map(|&i| graph.neighbor(node, i)));
}

/// The seed of one target's draws: SplitMix64's finaliser over the batch
/// seed and the target id.
fn target_seed(seed: u64, target: u64) -> u64 {
    let mut z = seed ^ target.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Above this many picks, membership is a hash set rather than a scan.
const PICK_SCAN_MAX: u32 = 64;

/// Picks `min(k, degree)` distinct indices of `0..degree` uniformly at random
/// into `out` (Floyd's algorithm). Returns the work spent: one unit per draw
/// and per set probe, bounded by `k + k^2` (a scan of the picks, up to
/// [`PICK_SCAN_MAX`] of them) or `2k` (a hash set, above) whatever the
/// degree. Both give the same picks in the same order.
pub fn pick(rng: &mut SmallRng, degree: u32, k: u32, out: &mut Vec<u32>) -> u64 {
    out.clear();
    if degree <= k {
        out.extend(0..degree);
        return u64::from(degree);
    }
    let mut work = 0u64;
    if k > PICK_SCAN_MAX {
        let mut seen =
            rustc_hash::FxHashSet::with_capacity_and_hasher(k as usize, Default::default());
        for j in degree - k..degree {
            let t = rng.random_range(0..=j);
            work += 2;
            // j is above every earlier draw's range: never seen yet.
            let next = if seen.insert(t) { t } else { j };
            seen.insert(next);
            out.push(next);
        }
        return work;
    }
    for j in degree - k..degree {
        let t = rng.random_range(0..=j);
        work += 1 + out.len() as u64;
        if out.contains(&t) {
            out.push(j);
        } else {
            out.push(t);
        }
    }
    work
}
