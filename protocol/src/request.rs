//! The request a worker writes into a slot: a [`RequestHeader`], the
//! target node ids after it and, with `NEW_NODE`, the new node's feature
//! row and edges after those.

use std::mem::size_of;

use crate::graph_schema::GraphSchema;
use crate::layout::{
    align_up, request_flags, FeatureSchema, Geometry, RequestHeader, MAX_HOPS, MAX_SUBGRAPH_HOPS,
    SLOT_ALIGN,
};

/// Offset of the target ids in the request area.
pub const TARGETS_OFFSET: usize = size_of::<RequestHeader>();

/// Bytes of request area a segment needs for `max_targets` targets, whole
/// pages (4096 bytes) so that the response area after it starts on a page
/// and each process can map the areas its peer writes read-only.
pub fn request_bytes_for(max_targets: u32) -> Option<u64> {
    let targets = u64::from(max_targets).checked_mul(8)?;
    align_up(
        (TARGETS_OFFSET as u64).checked_add(targets)?,
        SLOT_ALIGN as u64,
    )
}

/// Bytes of request area a segment needs for `max_targets` targets and for
/// a new node (`NEW_NODE`) with a row of `feature_dim` values and
/// `new_node_edges` edges, whole pages.
pub fn request_bytes_with_new_node(
    max_targets: u32,
    feature_dim: u32,
    new_node_edges: u32,
) -> Option<u64> {
    let (_, edges_at) = new_node_offsets(feature_dim)?;
    let new_node = edges_at.checked_add(u64::from(new_node_edges).checked_mul(8)?)?;
    Some(request_bytes_for(max_targets)?.max(align_up(new_node, SLOT_ALIGN as u64)?))
}

/// Where a new node's feature row and its edges start in the request area
/// (after the request's one target id): the row at 136, the edges at the
/// next multiple of 8 after the row's `4 x feature_dim` bytes.
pub fn new_node_offsets(feature_dim: u32) -> Option<(u64, u64)> {
    let row_at = TARGETS_OFFSET as u64 + 8;
    let row_bytes = u64::from(feature_dim).checked_mul(4)?;
    Some((row_at, align_up(row_at.checked_add(row_bytes)?, 8)?))
}

/// The most edges a new node may carry in a request to this segment: what
/// fits its request area after the row.
pub fn max_new_node_edges(geometry: &Geometry, schema: &FeatureSchema) -> u64 {
    new_node_offsets(schema.feature_dim).map_or(0, |(_, edges_at)| {
        geometry.request_bytes.saturating_sub(edges_at) / 8
    })
}

/// What a sidecar would refuse in `node` that its caller can see before
/// asking: a row not of the segment's width, a value that is not a finite
/// number, more edges than the request area holds. The message names the
/// problem and the fix.
pub fn new_node_problem(
    node: &NewNode,
    geometry: &Geometry,
    schema: &FeatureSchema,
) -> Option<String> {
    let dim = schema.feature_dim as usize;
    if node.features.len() != dim {
        return Some(format!(
            "the new node's row has {} features; this graph's rows have {dim}",
            node.features.len()
        ));
    }
    if let Some(problem) = not_finite(&node.features) {
        return Some(problem);
    }
    let max = max_new_node_edges(geometry, schema);
    if node.neighbors.len() as u64 > max {
        return Some(format!(
            "the new node has {} edges; the sidecar takes at most {max}: send fewer, or raise \
             the sidecar's max_new_node_edges",
            node.neighbors.len()
        ));
    }
    None
}

/// The first value of a new node's row that is not a finite number, named.
fn not_finite(features: &[f32]) -> Option<String> {
    let (i, v) = features.iter().enumerate().find(|(_, v)| !v.is_finite())?;
    Some(format!(
        "the new node's feature {i} is {v}: every feature must be a finite number"
    ))
}

/// A node the graph does not have, carried in a request (`NEW_NODE`): the
/// sidecar samples its neighbourhood as if it had been added with these
/// edges, without adding it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewNode {
    /// Its feature row, `feature_dim` values.
    pub features: Vec<f32>,
    /// Its neighbours: known node ids.
    pub neighbors: Vec<u64>,
    /// The edges go from the new node only (`NEW_NODE_DIRECTED`); otherwise
    /// both ways.
    pub directed: bool,
}

/// A typed graph's request (`TYPED`, docs/protocol.md, "Typed requests"):
/// the targets' node type, the hops of the subgraph, and per edge type (in
/// the graph schema's order) and hop a fanout, edge type `e`'s hop `h` at
/// `fanouts[e * hops + h]`; 0: that edge type is not sampled at that hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedAsk {
    pub target_type: u32,
    pub hops: u32,
    pub fanouts: Vec<u32>,
}

impl TypedAsk {
    /// Edge type `edge_type`'s fanout at `hop` (0-based).
    pub fn fanout(&self, edge_type: usize, hop: usize) -> u32 {
        self.fanouts[edge_type * self.hops as usize + hop]
    }
}

/// A node the typed graph does not have, carried in a typed request
/// (`TYPED` with `NEW_NODE`, docs/protocol.md, "A new node in a typed
/// request"): the request's one target, of its `target_type`. The sidecar
/// samples as if it had been added with this row and these edges, without
/// adding it.
#[derive(Debug, Clone, PartialEq)]
pub struct TypedNewNode {
    /// Its feature row: its type's width (empty for a type without
    /// features).
    pub features: Vec<f32>,
    /// Per edge type, in the graph schema's order, `(src, dst)` pairs: each
    /// has the new node at an end of the target type and a node of the
    /// graph at the other.
    pub edges: Vec<Vec<(u64, u64)>>,
}

impl TypedNewNode {
    /// Its edges over every edge type.
    pub fn n_edges(&self) -> usize {
        self.edges.iter().map(Vec::len).sum()
    }
}

/// Where a typed new node's parts start in the request area: its row
/// after the fanouts (`n_fanouts` u32) at the next multiple of 8, the
/// per-edge-type edge counts (`n_edge_types` u32) after the row's
/// `4 x feature_dim` bytes at the next multiple of 8, the edges (u64
/// pairs) after the counts at the next multiple of 8.
pub fn typed_new_node_offsets(
    n_fanouts: usize,
    feature_dim: u32,
    n_edge_types: usize,
) -> Option<(u64, u64, u64)> {
    let fanouts_end = typed_fanouts_offset(1).checked_add((n_fanouts as u64).checked_mul(4)?)?;
    let row_at = align_up(fanouts_end, 8)?;
    let counts_at = align_up(
        row_at.checked_add(u64::from(feature_dim).checked_mul(4)?)?,
        8,
    )?;
    let edges_at = align_up(
        counts_at.checked_add((n_edge_types as u64).checked_mul(4)?)?,
        8,
    )?;
    Some((row_at, counts_at, edges_at))
}

/// Bytes of request area a typed graph's segment needs for a new node of
/// its widest type at [`MAX_SUBGRAPH_HOPS`] hops with `new_node_edges`
/// edges, whole pages.
pub fn request_bytes_for_typed_new_node(graph: &GraphSchema, new_node_edges: u32) -> Option<u64> {
    let widest = graph.node_types.iter().map(|t| t.feature_dim).max()?;
    let n_edge_types = graph.edge_types.len();
    let (_, _, edges_at) =
        typed_new_node_offsets(n_edge_types * MAX_SUBGRAPH_HOPS, widest, n_edge_types)?;
    align_up(
        edges_at.checked_add(u64::from(new_node_edges).checked_mul(16)?)?,
        SLOT_ALIGN as u64,
    )
}

/// What a sidecar would refuse in typed new node `node` (id `id`, asked
/// with `ask`) that its caller can see before asking: one row of its type's
/// width with finite values, one edge list per edge type, each edge with
/// the new node at an end of its type, edges that fit the request area.
/// Whether the other ends are nodes of the graph only the sidecar knows.
pub fn typed_new_node_problem(
    id: u64,
    node: &TypedNewNode,
    ask: &TypedAsk,
    geometry: &Geometry,
    graph: &GraphSchema,
) -> Option<String> {
    let target = graph.node_types.get(ask.target_type as usize)?;
    let dim = target.feature_dim as usize;
    if node.features.len() != dim {
        return Some(format!(
            "the new {} node's row has {} features; rows of node type {} have {dim}",
            target.name,
            node.features.len(),
            target.name
        ));
    }
    if let Some(problem) = not_finite(&node.features) {
        return Some(problem);
    }
    if node.edges.len() != graph.edge_types.len() {
        return Some(format!(
            "the new node has edge lists for {} edge types; this graph has {}: one list per \
             edge type, in the graph's order (empty where it has none)",
            node.edges.len(),
            graph.edge_types.len()
        ));
    }
    for (e, pairs) in node.edges.iter().enumerate() {
        let desc = &graph.edge_types[e];
        let t = ask.target_type;
        if let Some(&(src, dst)) = pairs
            .iter()
            .find(|&&(src, dst)| !((desc.src == t && src == id) || (desc.dst == t && dst == id)))
        {
            return Some(format!(
                "edge ({src}, {dst}) of edge type {}: an edge of the new node has it ({id}) at \
                 an end of node type {}",
                graph.edge_key(e),
                target.name
            ));
        }
    }
    let (_, _, edges_at) = typed_new_node_offsets(
        ask.fanouts.len(),
        target.feature_dim,
        graph.edge_types.len(),
    )?;
    let max = geometry.request_bytes.saturating_sub(edges_at) / 16;
    if node.n_edges() as u64 > max {
        return Some(format!(
            "the new node has {} edges; the sidecar takes at most {max}: send fewer, or raise \
             the sidecar's max_new_node_edges",
            node.n_edges()
        ));
    }
    None
}

/// Where a typed request's fanouts start: right after the target ids.
pub fn typed_fanouts_offset(n_targets: u32) -> u64 {
    TARGETS_OFFSET as u64 + 8 * u64::from(n_targets)
}

/// Bytes of request area a typed graph's segment needs: `max_targets` ids
/// and [`MAX_SUBGRAPH_HOPS`] fanouts per edge type after them, whole pages.
pub fn request_bytes_for_typed(max_targets: u32, n_edge_types: usize) -> Option<u64> {
    let fanouts = (n_edge_types as u64)
        .checked_mul(MAX_SUBGRAPH_HOPS as u64)?
        .checked_mul(4)?;
    align_up(
        typed_fanouts_offset(max_targets).checked_add(fanouts)?,
        SLOT_ALIGN as u64,
    )
}

/// What a sidecar would refuse in a typed request that its caller can see
/// before asking: a node type or a count of fanouts the graph does not
/// have, hops outside 1 to 3, a fanout above its hop's cap.
pub fn typed_problem(ask: &TypedAsk, geometry: &Geometry, graph: &GraphSchema) -> Option<String> {
    let hops = ask.hops as usize;
    if !(1..=MAX_SUBGRAPH_HOPS).contains(&hops) {
        return Some(format!(
            "a typed request has {hops} hops; it samples 1 to {MAX_SUBGRAPH_HOPS}"
        ));
    }
    if ask.target_type as usize >= graph.node_types.len() {
        return Some(format!(
            "target type {} is not a node type of this graph ({} types: {})",
            ask.target_type,
            graph.node_types.len(),
            graph.describe()
        ));
    }
    let n_edge_types = graph.edge_types.len();
    if ask.fanouts.len() != n_edge_types * hops {
        return Some(format!(
            "a typed request has {} fanouts; this graph has {n_edge_types} edge types, so \
             {hops} hops need {}",
            ask.fanouts.len(),
            n_edge_types * hops
        ));
    }
    for e in 0..n_edge_types {
        for hop in 0..hops {
            let cap = geometry.max_fanouts[hop.min(MAX_HOPS - 1)];
            let fanout = ask.fanout(e, hop);
            if fanout > cap {
                return Some(format!(
                    "fanout {fanout} of edge type {} at hop {} exceeds the cap {cap}: ask for \
                     at most {cap}, or raise the sidecar's max_fanouts (--max-fanouts)",
                    graph.edge_key(e),
                    hop + 1
                ));
            }
        }
    }
    None
}

/// A `FRESH_SINCE` request's point of the change clock: targets whose
/// sample at `fanouts` has not changed since `tick` of `clock` come back
/// `FRESH` (in the dense layout with their own row alone; in the subgraph
/// and typed layouts with no row). A typed request's answers were computed
/// at the request's own hops and fanouts ([`FreshSince::typed`]: `fanouts`
/// 0 and `subgraph` `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreshSince {
    /// The sidecar's change clock id ([`crate::layout::ResponseHeader::change_clock`]).
    pub clock: u64,
    pub tick: u64,
    /// The fanouts the caller's answers were computed with: the dense
    /// layout's two hops, or the first two hops of `subgraph` (0 past its
    /// last hop).
    pub fanouts: [u32; MAX_HOPS],
    /// Subgraph-layout answers: the hops and fanouts of the subgraph each
    /// was computed on, the target alone in its request; `None`: dense
    /// answers, computed on the dense sample at `fanouts`.
    pub subgraph: Option<SubgraphFanouts>,
}

impl FreshSince {
    /// Answers of the dense layout, computed at `fanouts`.
    pub fn dense(clock: u64, tick: u64, fanouts: [u32; MAX_HOPS]) -> Self {
        Self {
            clock,
            tick,
            fanouts,
            subgraph: None,
        }
    }

    /// Answers of the typed layout, each computed on its target's own
    /// subgraph at the typed request's hops and fanouts.
    pub fn typed(clock: u64, tick: u64) -> Self {
        Self {
            clock,
            tick,
            fanouts: [0; MAX_HOPS],
            subgraph: None,
        }
    }

    /// Answers of the subgraph layout, each computed on its target's own
    /// subgraph at `subgraph`.
    pub fn subgraph(clock: u64, tick: u64, subgraph: SubgraphFanouts) -> Self {
        let [f1, f2, _] = subgraph.padded();
        Self {
            clock,
            tick,
            fanouts: [f1, f2],
            subgraph: Some(subgraph),
        }
    }
}

/// A `HUB_H1` request's ask: the caller holds the layer-1 embedding of
/// every node as computed at `since`, and wants hop-1 nodes of degree at
/// least `min_degree` whose own hop-1 sample at `since.fanouts[0]` has not
/// changed sent without their hop-2 neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubH1 {
    pub since: FreshSince,
    pub min_degree: u32,
}

/// The fanouts of a subgraph-layout request, one per hop (1 to
/// [`MAX_SUBGRAPH_HOPS`] hops; docs/protocol.md, "The subgraph layout"). A
/// 0 asks for the sidecar's current fanout of that hop (hop 3: of hop 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubgraphFanouts {
    hops: u8,
    fanouts: [u32; MAX_SUBGRAPH_HOPS],
}

impl SubgraphFanouts {
    /// `None` unless `fanouts` has 1 to [`MAX_SUBGRAPH_HOPS`] entries.
    pub fn new(fanouts: &[u32]) -> Option<Self> {
        if fanouts.is_empty() || fanouts.len() > MAX_SUBGRAPH_HOPS {
            return None;
        }
        let mut all = [0; MAX_SUBGRAPH_HOPS];
        all[..fanouts.len()].copy_from_slice(fanouts);
        Some(Self {
            hops: fanouts.len() as u8,
            fanouts: all,
        })
    }

    pub fn hops(&self) -> usize {
        usize::from(self.hops)
    }

    /// One fanout per hop.
    pub fn as_slice(&self) -> &[u32] {
        &self.fanouts[..self.hops()]
    }

    /// Every hop's fanout, 0 past the last hop (as the headers carry them).
    pub fn padded(&self) -> [u32; MAX_SUBGRAPH_HOPS] {
        self.fanouts
    }
}

/// The bytes of a request area holding `header` (whose `n_targets` and
/// `new_node_edges` are those of `targets` and `new_node`), the target ids
/// after it and, with a new node, its row and edges: for the client to copy
/// in. The caller has already checked `targets.len() <= max_targets` and the
/// new node against the segment, which the area was sized for.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn encoded(
    header: &RequestHeader,
    targets: &[u64],
    new_node: Option<&NewNode>,
    typed: Option<&TypedAsk>,
    typed_new_node: Option<(&TypedNewNode, &GraphSchema)>,
) -> Vec<u8> {
    // Copied in eight bytes at a time: a typed request's u32 fanouts are
    // padded to a whole word.
    let mut len = TARGETS_OFFSET
        + targets.len() * 8
        + typed.map_or(0, |t| (t.fanouts.len() * 4).next_multiple_of(8));
    let offsets = new_node.map(|node| {
        let (row_at, edges_at) =
            new_node_offsets(node.features.len() as u32).expect("a row the segment holds");
        len = edges_at as usize + node.neighbors.len() * 8;
        (row_at as usize, edges_at as usize)
    });
    let typed_offsets = typed.zip(typed_new_node).map(|(ask, (node, graph))| {
        let (row_at, counts_at, edges_at) = typed_new_node_offsets(
            ask.fanouts.len(),
            node.features.len() as u32,
            graph.edge_types.len(),
        )
        .expect("a new node the segment holds");
        len = edges_at as usize + node.n_edges() * 16;
        (row_at as usize, counts_at as usize, edges_at as usize)
    });
    let mut area = vec![0u8; len];
    area[..TARGETS_OFFSET].copy_from_slice(bytemuck::bytes_of(header));
    let ids = &mut area[TARGETS_OFFSET..TARGETS_OFFSET + targets.len() * 8];
    for (chunk, id) in ids.chunks_exact_mut(8).zip(targets) {
        chunk.copy_from_slice(&id.to_le_bytes());
    }
    if let Some(typed) = typed {
        let at = typed_fanouts_offset(targets.len() as u32) as usize;
        let fanouts = &mut area[at..at + typed.fanouts.len() * 4];
        for (chunk, fanout) in fanouts.chunks_exact_mut(4).zip(&typed.fanouts) {
            chunk.copy_from_slice(&fanout.to_le_bytes());
        }
    }
    if let (Some((node, _)), Some((row_at, counts_at, edges_at))) = (typed_new_node, typed_offsets)
    {
        for (chunk, v) in area[row_at..].chunks_exact_mut(4).zip(&node.features) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        for (chunk, pairs) in area[counts_at..].chunks_exact_mut(4).zip(&node.edges) {
            chunk.copy_from_slice(&(pairs.len() as u32).to_le_bytes());
        }
        let flat = node.edges.iter().flatten().flat_map(|&(s, d)| [s, d]);
        for (chunk, id) in area[edges_at..].chunks_exact_mut(8).zip(flat) {
            chunk.copy_from_slice(&id.to_le_bytes());
        }
    }
    if let (Some(node), Some((row_at, edges_at))) = (new_node, offsets) {
        let row = &mut area[row_at..row_at + node.features.len() * 4];
        for (chunk, v) in row.chunks_exact_mut(4).zip(&node.features) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        let edges = &mut area[edges_at..edges_at + node.neighbors.len() * 8];
        for (chunk, id) in edges.chunks_exact_mut(8).zip(&node.neighbors) {
            chunk.copy_from_slice(&id.to_le_bytes());
        }
    }
    area
}

/// A request as the sidecar sees it after validation: fanouts resolved
/// against the segment defaults and checked against the caps.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub request_id: u64,
    /// CLOCK_MONOTONIC nanoseconds; 0 = the sidecar's default deadline.
    pub deadline_mono_ns: u64,
    pub fanouts: [u32; MAX_HOPS],
    /// The hops whose fanout the client left at 0 ("the sidecar's choice"):
    /// `fanouts` holds the segment default there, which a sidecar may
    /// replace with its current setting.
    pub defaulted: [bool; MAX_HOPS],
    /// `OWN_ROWS_ONLY`: the targets' rows, no neighbours.
    pub own_rows_only: bool,
    pub targets: Vec<u64>,
    /// `NEW_NODE`: the one target is this node, not the graph's.
    pub new_node: Option<NewNode>,
    /// `FRESH_SINCE`: answer unchanged targets with their own row alone.
    pub fresh: Option<FreshSince>,
    /// `HUB_H1`: send unchanged hubs among the hop-1 nodes without their
    /// hop-2 neighbours.
    pub hub_h1: Option<HubH1>,
    /// The subgraph layout's hops (1 to [`MAX_SUBGRAPH_HOPS`]); 0: the dense
    /// layout. Hops 1 and 2 use `fanouts`, hop 3 `fanout3`.
    pub hops: u32,
    /// With `hops` 3: the third hop's fanout (the segment's default hop-2
    /// fanout where the client left it at 0, see `fanout3_defaulted`).
    pub fanout3: u32,
    pub fanout3_defaulted: bool,
    /// The trace the request is part of, when it carries one.
    pub trace: Option<TraceContext>,
    /// `TYPED`: a typed graph's request (`hops` is its hops; `fanouts`
    /// and `fanout3` are not used).
    pub typed: Option<TypedAsk>,
    /// `TYPED` with `NEW_NODE`: the one target is this node of the target
    /// type, not the graph's.
    pub typed_new_node: Option<TypedNewNode>,
}

/// A request's W3C trace context (docs/protocol.md, "Trace context").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The span the sidecar's spans nest under.
    pub parent: [u8; 8],
    /// Whether the trace is sampled (recorded and exported).
    pub sampled: bool,
}

impl TraceContext {
    /// The context of a request header: `None` unless both ids are
    /// non-zero (W3C's all-zero ids mean none). Flag bits other than
    /// bit 0 are ignored, as W3C asks of unknown flags.
    fn of(header: &RequestHeader) -> Option<Self> {
        (header.trace_id != [0; 16] && header.trace_parent != [0; 8]).then_some(Self {
            trace_id: header.trace_id,
            parent: header.trace_parent,
            sampled: header.trace_flags & 1 == 1,
        })
    }
}

impl Request {
    /// The subgraph layout's fanouts, one per hop; `None` for the dense
    /// layout.
    pub fn subgraph(&self) -> Option<SubgraphFanouts> {
        let all = [self.fanouts[0], self.fanouts[1], self.fanout3];
        match self.hops {
            0 => None,
            hops => SubgraphFanouts::new(&all[..(hops as usize).min(MAX_SUBGRAPH_HOPS)]),
        }
    }

    /// Time left before the request's deadline, on CLOCK_MONOTONIC: `None`
    /// when the client set none (use the sidecar's default), `Some(ZERO)` once
    /// it has passed.
    pub fn remaining(&self) -> Option<std::time::Duration> {
        self.remaining_at(mono_now_ns())
    }

    fn remaining_at(&self, now_ns: u64) -> Option<std::time::Duration> {
        (self.deadline_mono_ns != 0)
            .then(|| std::time::Duration::from_nanos(self.deadline_mono_ns.saturating_sub(now_ns)))
    }
}

/// Why a request read from a slot is refused. Every variant is the client's
/// mistake (or a hostile client's), answered with `INVALID_REQUEST`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "request has {n_targets} targets; the segment allows at most {max_targets}: send \
         fewer, or raise the sidecar's max_targets (--max-targets)"
    )]
    TooManyTargets { n_targets: u32, max_targets: u32 },
    #[error(
        "request fanout {fanout} for hop {hop} exceeds the cap {cap}; ask for at most {cap} or \
         raise the sidecar's max_fanouts (--max-fanouts)"
    )]
    FanoutAboveCap { hop: usize, fanout: u32, cap: u32 },
    #[error("request flags {flags:#x} contain bits this sidecar does not know")]
    UnknownFlags { flags: u32 },
    #[error(
        "request hub_min_degree is {degree} without the HUB_H1 flag (0x10): set the flag, or \
         leave it 0"
    )]
    HubDegreeWithoutFlag { degree: u32 },
    #[error(
        "request flag HUB_H1 (0x10) has hub_min_degree 0: send the smallest degree of the hubs \
         whose layer-1 embedding the caller holds (at least 1)"
    )]
    HubDegreeZero,
    #[error(
        "request has new_node_edges {edges} but not the NEW_NODE flag: set the flag, or leave \
         the count at 0"
    )]
    EdgesWithoutNewNode { edges: u32 },
    #[error(
        "request flag NEW_NODE_DIRECTED (0x4) is set without NEW_NODE (0x2): set both or neither"
    )]
    DirectedWithoutNewNode,
    #[error(
        "request bytes 40..80 (fresh_clock, fresh_tick, fresh_fanouts, fresh_hops, \
         fresh_fanout3) are set without the FRESH_SINCE (0x8) or HUB_H1 (0x10) flag: set one, \
         or leave them 0"
    )]
    FreshWithoutFlag,
    #[error(
        "request fresh_hops {fresh_hops} and fresh_fanout3 {fresh_fanout3} are for a \
         subgraph-layout request (hops 1 to 3) only: leave them 0 with hops 0"
    )]
    FreshHopsForDense { fresh_hops: u32, fresh_fanout3: u32 },
    #[error(
        "request fresh_hops {fresh_hops} with fresh fanouts {fanouts:?}: a subgraph-layout \
         FRESH_SINCE request names 1 to 3 hops, each hop's fanout within 1..={caps:?} (hop 3 \
         within hop 2's cap) and 0 past the last hop: send the fanouts the stored answers were \
         computed with"
    )]
    FreshSubgraph {
        fresh_hops: u32,
        fanouts: [u32; MAX_SUBGRAPH_HOPS],
        caps: [u32; MAX_HOPS],
    },
    #[error(
        "request fresh_fanouts [{f1}, {f2}] are not within 1..=max_fanouts {caps:?}: send the \
         fanouts the stored answers were computed with"
    )]
    FreshFanouts {
        f1: u32,
        f2: u32,
        caps: [u32; MAX_HOPS],
    },
    #[error(
        "a NEW_NODE request has {n_targets} targets; it carries exactly one (the new node's \
         id): send the known nodes in a request of their own"
    )]
    NewNodeTargets { n_targets: u32 },
    #[error(
        "the new node has {edges} edges; this segment's request area holds at most {max} with \
         a row of {feature_dim} values: send fewer edges, or raise the sidecar's \
         max_new_node_edges (--max-new-node-edges)"
    )]
    NewNodeTooManyEdges {
        edges: u32,
        max: u64,
        feature_dim: u32,
    },
    #[error("the new node's feature {index} is {value}: every feature must be a finite number")]
    NewNodeFeatureNotFinite { index: usize, value: String },
    #[error(
        "request hops {hops}: 0 asks for the dense layout, 1 to {MAX_SUBGRAPH_HOPS} for the \
         subgraph layout with that many hops"
    )]
    SubgraphHops { hops: u32 },
    #[error(
        "request fanout3 is {fanout3} but hops is {hops}: the third hop's fanout is for a \
         3-hop subgraph request only; leave it 0"
    )]
    Fanout3WithoutThirdHop { fanout3: u32, hops: u32 },
    #[error(
        "request flag {flag} is defined for the dense layout only: send it with hops 0, or \
         leave it unset"
    )]
    NotForSubgraph { flag: &'static str },
    #[error("request bytes 112..128 are reserved and must be zero")]
    Reserved,
    #[error(
        "this sidecar serves a typed graph ({graph}): send TYPED requests (flag 0x20) naming \
         the target type and a fanout per edge type"
    )]
    UntypedForTypedGraph { graph: String },
    #[error(
        "request flag TYPED (0x20) is for a typed graph; this sidecar serves a one-type graph: \
         leave it unset"
    )]
    TypedForOneTypeGraph,
    #[error("request target_type is {target_type} without the TYPED flag (0x20): leave it 0")]
    TargetTypeWithoutTyped { target_type: u32 },
    #[error(
        "request flag {flag} is not defined for a typed request (TYPED, 0x20): leave it unset"
    )]
    NotForTyped { flag: &'static str },
    #[error(
        "a typed FRESH_SINCE request's stored answers were computed at the request's own hops \
         and fanouts: leave fresh_fanouts, fresh_hops and fresh_fanout3 (bytes 56..64 and \
         72..80) 0, and ask at the fanouts the answers were computed with"
    )]
    TypedFreshFanouts,
    #[error(
        "a typed request carries its fanouts after the target ids: leave fanouts and fanout3 \
         (bytes 20..28 and 68..72) 0"
    )]
    TypedFanoutFields,
    #[error("{0}")]
    Typed(String),
}

/// How many bytes of the request area a request whose header is `head`
/// occupies (header, targets, new node), capped at `request_bytes`: what
/// the sidecar copies out before decoding. Trusts nothing in `head`.
pub fn occupied_bytes(
    head: &[u8],
    geometry: &Geometry,
    schema: &FeatureSchema,
    graph: Option<&GraphSchema>,
) -> usize {
    let cap = geometry.request_bytes;
    let Some(head) = head.get(..TARGETS_OFFSET) else {
        return TARGETS_OFFSET;
    };
    let header: RequestHeader = bytemuck::pod_read_unaligned(head);
    let targets = u64::from(header.n_targets.min(geometry.max_targets));
    let mut end = TARGETS_OFFSET as u64 + targets * 8;
    if header.flags & request_flags::NEW_NODE != 0 && header.n_targets == 1 {
        if let Some((_, edges_at)) = new_node_offsets(schema.feature_dim) {
            end = end.max(edges_at.saturating_add(u64::from(header.new_node_edges) * 8));
        }
    }
    if let (Some(graph), true) = (graph, header.flags & request_flags::TYPED != 0) {
        let hops = u64::from(header.hops.min(MAX_SUBGRAPH_HOPS as u32));
        let n_fanouts = graph.edge_types.len() as u64 * hops;
        end += n_fanouts * 4;
        let dim = graph
            .node_types
            .get(header.target_type as usize)
            .map_or(0, |t| t.feature_dim);
        if header.flags & request_flags::NEW_NODE != 0 && header.n_targets == 1 {
            if let Some((_, _, edges_at)) =
                typed_new_node_offsets(n_fanouts as usize, dim, graph.edge_types.len())
            {
                end = end.max(edges_at.saturating_add(u64::from(header.new_node_edges) * 16));
            }
        }
    }
    end.min(cap) as usize
}

/// Reads and validates a request from a request area. Never panics, whatever
/// the bytes.
pub fn decode(
    area: &[u8],
    geometry: &Geometry,
    schema: &FeatureSchema,
    graph: Option<&GraphSchema>,
) -> Result<Request, RequestError> {
    // The area is request_bytes long, validated at attach/create to hold
    // the header and max_targets ids; check anyway rather than index blindly.
    let Some(head) = area.get(..TARGETS_OFFSET) else {
        return Err(RequestError::TooManyTargets {
            n_targets: 0,
            max_targets: geometry.max_targets,
        });
    };
    let header: RequestHeader = bytemuck::pod_read_unaligned(head);
    if header.flags & !request_flags::KNOWN != 0 {
        return Err(RequestError::UnknownFlags {
            flags: header.flags,
        });
    }
    if header._reserved.iter().any(|&b| b != 0) {
        return Err(RequestError::Reserved);
    }
    let typed_flag = header.flags & request_flags::TYPED != 0;
    match graph {
        Some(graph) if !typed_flag => {
            return Err(RequestError::UntypedForTypedGraph {
                graph: graph.describe(),
            })
        }
        None if typed_flag => return Err(RequestError::TypedForOneTypeGraph),
        _ => {}
    }
    if !typed_flag && header.target_type != 0 {
        return Err(RequestError::TargetTypeWithoutTyped {
            target_type: header.target_type,
        });
    }
    if let (Some(graph), true) = (graph, typed_flag) {
        return decode_typed(area, &header, geometry, graph);
    }
    if header.hops as usize > MAX_SUBGRAPH_HOPS {
        return Err(RequestError::SubgraphHops { hops: header.hops });
    }
    if header.hops != 3 && header.fanout3 != 0 {
        return Err(RequestError::Fanout3WithoutThirdHop {
            fanout3: header.fanout3,
            hops: header.hops,
        });
    }
    if header.hops != 0 {
        let dense_only = [
            (request_flags::OWN_ROWS_ONLY, "OWN_ROWS_ONLY (0x1)"),
            (request_flags::HUB_H1, "HUB_H1 (0x10)"),
        ];
        if let Some((_, flag)) = dense_only.iter().find(|(bit, _)| header.flags & bit != 0) {
            return Err(RequestError::NotForSubgraph { flag });
        }
    }
    if header.n_targets > geometry.max_targets {
        return Err(RequestError::TooManyTargets {
            n_targets: header.n_targets,
            max_targets: geometry.max_targets,
        });
    }
    let hub = header.flags & request_flags::HUB_H1 != 0;
    if !hub && header.hub_min_degree != 0 {
        return Err(RequestError::HubDegreeWithoutFlag {
            degree: header.hub_min_degree,
        });
    }
    if hub && header.hub_min_degree == 0 {
        return Err(RequestError::HubDegreeZero);
    }
    let since = if header.flags & (request_flags::FRESH_SINCE | request_flags::HUB_H1) != 0 {
        Some(decode_since(&header, geometry)?)
    } else if header.fresh_clock != 0
        || header.fresh_tick != 0
        || header.fresh_fanouts != [0; 2]
        || header.fresh_hops != 0
        || header.fresh_fanout3 != 0
    {
        return Err(RequestError::FreshWithoutFlag);
    } else {
        None
    };
    let fresh = since.filter(|_| header.flags & request_flags::FRESH_SINCE != 0);
    let hub_h1 = since.filter(|_| hub).map(|since| HubH1 {
        since,
        min_degree: header.hub_min_degree,
    });
    let new_node = header.flags & request_flags::NEW_NODE != 0;
    if !new_node && header.new_node_edges != 0 {
        return Err(RequestError::EdgesWithoutNewNode {
            edges: header.new_node_edges,
        });
    }
    if !new_node && header.flags & request_flags::NEW_NODE_DIRECTED != 0 {
        return Err(RequestError::DirectedWithoutNewNode);
    }
    if new_node && header.n_targets != 1 {
        return Err(RequestError::NewNodeTargets {
            n_targets: header.n_targets,
        });
    }
    let mut fanouts = [0; MAX_HOPS];
    let mut defaulted = [false; MAX_HOPS];
    for (hop, fanout) in fanouts.iter_mut().enumerate() {
        let asked = header.fanouts[hop];
        defaulted[hop] = asked == 0;
        let cap = geometry.max_fanouts[hop];
        *fanout = if asked == 0 {
            schema.default_fanouts[hop]
        } else {
            asked
        };
        if *fanout > cap {
            return Err(RequestError::FanoutAboveCap {
                hop: hop + 1,
                fanout: *fanout,
                cap,
            });
        }
    }
    let fanout3 = if header.fanout3 == 0 {
        schema.default_fanouts[1]
    } else {
        header.fanout3
    };
    if header.hops == 3 && fanout3 > geometry.max_fanouts[1] {
        return Err(RequestError::FanoutAboveCap {
            hop: 3,
            fanout: fanout3,
            cap: geometry.max_fanouts[1],
        });
    }
    let end = TARGETS_OFFSET + header.n_targets as usize * 8;
    let Some(ids) = area.get(TARGETS_OFFSET..end) else {
        return Err(RequestError::TooManyTargets {
            n_targets: header.n_targets,
            max_targets: geometry.max_targets,
        });
    };
    let targets = read_u64s(ids);
    let new_node = if new_node {
        Some(decode_new_node(area, &header, geometry, schema)?)
    } else {
        None
    };
    Ok(Request {
        request_id: header.request_id,
        deadline_mono_ns: header.deadline_mono_ns,
        fanouts,
        defaulted,
        own_rows_only: header.flags & request_flags::OWN_ROWS_ONLY != 0,
        targets,
        new_node,
        fresh,
        hub_h1,
        hops: header.hops,
        fanout3: if header.hops == 3 { fanout3 } else { 0 },
        fanout3_defaulted: header.hops == 3 && header.fanout3 == 0,
        trace: TraceContext::of(&header),
        typed: None,
        typed_new_node: None,
    })
}

/// The rest of a `TYPED` request to a typed graph: no other flag, the
/// target type, the hops and the fanouts after the target ids.
fn decode_typed(
    area: &[u8],
    header: &RequestHeader,
    geometry: &Geometry,
    graph: &GraphSchema,
) -> Result<Request, RequestError> {
    // As in the one-type subgraph layout: OWN_ROWS_ONLY and HUB_H1 are
    // the dense layout's; a typed new node names each edge's direction.
    let others = [
        (request_flags::OWN_ROWS_ONLY, "OWN_ROWS_ONLY (0x1)"),
        (request_flags::NEW_NODE_DIRECTED, "NEW_NODE_DIRECTED (0x4)"),
        (request_flags::HUB_H1, "HUB_H1 (0x10)"),
    ];
    if let Some((_, flag)) = others.iter().find(|(bit, _)| header.flags & bit != 0) {
        return Err(RequestError::NotForTyped { flag });
    }
    let new_node = header.flags & request_flags::NEW_NODE != 0;
    if !new_node && header.new_node_edges != 0 {
        return Err(RequestError::EdgesWithoutNewNode {
            edges: header.new_node_edges,
        });
    }
    if new_node && header.n_targets != 1 {
        return Err(RequestError::NewNodeTargets {
            n_targets: header.n_targets,
        });
    }
    if header.hub_min_degree != 0 {
        return Err(RequestError::NotForTyped {
            flag: "HUB_H1's hub_min_degree (bytes 36..40)",
        });
    }
    // A typed FRESH_SINCE request's stored answers were computed at the
    // request's own hops and fanouts: its point of the change clock alone.
    let fresh = if header.flags & request_flags::FRESH_SINCE != 0 {
        if header.fresh_fanouts != [0; 2] || header.fresh_hops != 0 || header.fresh_fanout3 != 0 {
            return Err(RequestError::TypedFreshFanouts);
        }
        Some(FreshSince::typed(header.fresh_clock, header.fresh_tick))
    } else if header.fresh_clock != 0
        || header.fresh_tick != 0
        || header.fresh_fanouts != [0; 2]
        || header.fresh_hops != 0
        || header.fresh_fanout3 != 0
    {
        return Err(RequestError::FreshWithoutFlag);
    } else {
        None
    };
    if header.fanouts != [0; MAX_HOPS] || header.fanout3 != 0 {
        return Err(RequestError::TypedFanoutFields);
    }
    if header.n_targets > geometry.max_targets {
        return Err(RequestError::TooManyTargets {
            n_targets: header.n_targets,
            max_targets: geometry.max_targets,
        });
    }
    let hops = header.hops as usize;
    if !(1..=MAX_SUBGRAPH_HOPS).contains(&hops) {
        return Err(RequestError::Typed(format!(
            "a typed request has {hops} hops; it samples 1 to {MAX_SUBGRAPH_HOPS}"
        )));
    }
    let ids_end = typed_fanouts_offset(header.n_targets) as usize;
    let fanouts_end = ids_end + graph.edge_types.len() * hops * 4;
    let (Some(ids), Some(fanouts)) = (
        area.get(TARGETS_OFFSET..ids_end),
        area.get(ids_end..fanouts_end),
    ) else {
        return Err(RequestError::Typed(format!(
            "a typed request of {} targets and {hops} hops over {} edge types does not fit the \
             {} byte request area",
            header.n_targets,
            graph.edge_types.len(),
            geometry.request_bytes
        )));
    };
    let ask = TypedAsk {
        target_type: header.target_type,
        hops: header.hops,
        fanouts: fanouts
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("chunks of 4")))
            .collect(),
    };
    if let Some(problem) = typed_problem(&ask, geometry, graph) {
        return Err(RequestError::Typed(problem));
    }
    let targets = read_u64s(ids);
    let typed_new_node = if new_node {
        let node = decode_typed_new_node(area, header, &ask, graph)?;
        if let Some(problem) = typed_new_node_problem(targets[0], &node, &ask, geometry, graph) {
            return Err(RequestError::Typed(problem));
        }
        Some(node)
    } else {
        None
    };
    Ok(Request {
        request_id: header.request_id,
        deadline_mono_ns: header.deadline_mono_ns,
        fanouts: [0; MAX_HOPS],
        defaulted: [false; MAX_HOPS],
        own_rows_only: false,
        targets,
        new_node: None,
        fresh,
        hub_h1: None,
        hops: header.hops,
        fanout3: 0,
        fanout3_defaulted: false,
        trace: TraceContext::of(header),
        typed: Some(ask),
        typed_new_node,
    })
}

/// A typed request's new node: its row, its edge counts and its edges, in
/// the area, their total `new_node_edges`.
fn decode_typed_new_node(
    area: &[u8],
    header: &RequestHeader,
    ask: &TypedAsk,
    graph: &GraphSchema,
) -> Result<TypedNewNode, RequestError> {
    let dim = graph.node_types[ask.target_type as usize].feature_dim;
    let n_edge_types = graph.edge_types.len();
    let too_small = || {
        RequestError::Typed(format!(
            "a typed new node's row, edge counts and {} edges do not fit the {} byte request \
             area",
            header.new_node_edges,
            area.len()
        ))
    };
    let (row_at, counts_at, edges_at) =
        typed_new_node_offsets(ask.fanouts.len(), dim, n_edge_types).ok_or_else(too_small)?;
    let (row_at, counts_at, edges_at) = (row_at as usize, counts_at as usize, edges_at as usize);
    let row = area
        .get(row_at..row_at + dim as usize * 4)
        .ok_or_else(too_small)?;
    let counts = area
        .get(counts_at..counts_at + n_edge_types * 4)
        .ok_or_else(too_small)?;
    let counts: Vec<usize> = counts
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("chunks of 4")) as usize)
        .collect();
    let total: u64 = counts.iter().map(|&c| c as u64).sum();
    if total != u64::from(header.new_node_edges) {
        return Err(RequestError::Typed(format!(
            "a typed new node's edge counts add up to {total}, new_node_edges says {}",
            header.new_node_edges
        )));
    }
    let edges = area
        .get(edges_at..)
        .and_then(|rest| rest.get(..(total as usize).checked_mul(16)?))
        .ok_or_else(too_small)?;
    let mut pairs = read_u64s(edges).into_iter();
    Ok(TypedNewNode {
        features: row
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("chunks of 4")))
            .collect(),
        edges: counts
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|_| (pairs.next().unwrap_or(0), pairs.next().unwrap_or(0)))
                    .collect()
            })
            .collect(),
    })
}

/// The `fresh_*` fields of a `FRESH_SINCE` or `HUB_H1` request (`HUB_H1`
/// is refused with `hops` before this): the dense layout's two fanouts, or
/// a subgraph-layout request's `fresh_hops` and their fanouts.
fn decode_since(header: &RequestHeader, geometry: &Geometry) -> Result<FreshSince, RequestError> {
    let caps = geometry.max_fanouts;
    let (clock, tick) = (header.fresh_clock, header.fresh_tick);
    if header.hops == 0 {
        if header.fresh_hops != 0 || header.fresh_fanout3 != 0 {
            return Err(RequestError::FreshHopsForDense {
                fresh_hops: header.fresh_hops,
                fresh_fanout3: header.fresh_fanout3,
            });
        }
        let [f1, f2] = header.fresh_fanouts;
        if f1 == 0 || f2 == 0 || f1 > caps[0] || f2 > caps[1] {
            return Err(RequestError::FreshFanouts { f1, f2, caps });
        }
        return Ok(FreshSince::dense(clock, tick, header.fresh_fanouts));
    }
    let [f1, f2] = header.fresh_fanouts;
    let fanouts = [f1, f2, header.fresh_fanout3];
    let hop_caps = [caps[0], caps[1], caps[1]];
    let hops = header.fresh_hops as usize;
    let fits = (1..=MAX_SUBGRAPH_HOPS).contains(&hops)
        && fanouts[..hops]
            .iter()
            .zip(hop_caps)
            .all(|(&f, cap)| (1..=cap).contains(&f))
        && fanouts[hops.min(MAX_SUBGRAPH_HOPS)..]
            .iter()
            .all(|&f| f == 0);
    let subgraph = fits
        .then(|| SubgraphFanouts::new(&fanouts[..hops]))
        .flatten()
        .ok_or(RequestError::FreshSubgraph {
            fresh_hops: header.fresh_hops,
            fanouts,
            caps,
        })?;
    Ok(FreshSince::subgraph(clock, tick, subgraph))
}

fn read_u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect()
}

/// The new node after a `NEW_NODE` request's one target id.
fn decode_new_node(
    area: &[u8],
    header: &RequestHeader,
    geometry: &Geometry,
    schema: &FeatureSchema,
) -> Result<NewNode, RequestError> {
    let too_many = || RequestError::NewNodeTooManyEdges {
        edges: header.new_node_edges,
        max: max_new_node_edges(geometry, schema),
        feature_dim: schema.feature_dim,
    };
    let (row_at, edges_at) = new_node_offsets(schema.feature_dim).ok_or_else(too_many)?;
    let end = edges_at
        .checked_add(u64::from(header.new_node_edges) * 8)
        .filter(|&end| end <= geometry.request_bytes)
        .ok_or_else(too_many)?;
    let (Some(row), Some(edges)) = (
        area.get(row_at as usize..row_at as usize + schema.feature_dim as usize * 4),
        area.get(edges_at as usize..end as usize),
    ) else {
        return Err(too_many());
    };
    let features: Vec<f32> = row
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("chunks of 4")))
        .collect();
    if let Some((index, &value)) = features.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(RequestError::NewNodeFeatureNotFinite {
            index,
            value: value.to_string(),
        });
    }
    Ok(NewNode {
        features,
        neighbors: read_u64s(edges),
        directed: header.flags & request_flags::NEW_NODE_DIRECTED != 0,
    })
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of request deadlines. Both
/// containers of a pod share the kernel's monotonic clock (Kubernetes does not
/// create time namespaces).
pub fn mono_now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
        .unwrap_or(0)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_trace_context_is_read_only_with_both_ids() {
        let header = |trace_id: [u8; 16], trace_parent: [u8; 8], trace_flags: u32| RequestHeader {
            trace_id,
            trace_parent,
            trace_flags,
            ..bytemuck::Zeroable::zeroed()
        };
        assert_eq!(TraceContext::of(&header([0; 16], [0; 8], 0)), None);
        assert_eq!(TraceContext::of(&header([1; 16], [0; 8], 1)), None);
        assert_eq!(TraceContext::of(&header([0; 16], [2; 8], 1)), None);
        assert_eq!(
            TraceContext::of(&header([1; 16], [2; 8], 0xff)),
            Some(TraceContext {
                trace_id: [1; 16],
                parent: [2; 8],
                sampled: true
            })
        );
        assert!(
            !TraceContext::of(&header([1; 16], [2; 8], 2))
                .unwrap()
                .sampled
        );
    }

    #[test]
    fn remaining_time_follows_the_deadline() {
        let mut request = Request {
            request_id: 1,
            deadline_mono_ns: 0,
            fanouts: [1, 1],
            defaulted: [false; 2],
            own_rows_only: false,
            targets: vec![],
            new_node: None,
            fresh: None,
            hub_h1: None,
            hops: 0,
            fanout3: 0,
            fanout3_defaulted: false,
            trace: None,
            typed: None,
            typed_new_node: None,
        };
        assert_eq!(request.remaining_at(5_000), None, "no deadline");
        request.deadline_mono_ns = 8_000;
        assert_eq!(
            request.remaining_at(5_000),
            Some(Duration::from_nanos(3_000))
        );
        assert_eq!(request.remaining_at(9_000), Some(Duration::ZERO), "passed");
        assert!(mono_now_ns() > 0);
    }
}
