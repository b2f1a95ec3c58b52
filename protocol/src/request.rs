//! The request a worker writes into a slot: a [`RequestHeader`], the
//! target node ids after it, in the graph layout a fanout per edge type and
//! hop after those and, with `NEW_NODE`, the new node's feature row and
//! edges after all that.
//!
//! One form for every graph (docs/protocol.md, section 3.3): a one-type
//! graph is the 1x1 graph (node type 0, edge type 0), whose graph-layout
//! requests are a typed graph's with one edge type; the dense layout
//! (`hops` 0) is the one-type graph's own.

use std::mem::size_of;

use crate::graph_schema::{EdgeDataDesc, GraphSchema};
use crate::layout::{
    align_up, request_flags, FeatureSchema, Geometry, RequestHeader, MAX_HOPS, MAX_SUBGRAPH_HOPS,
    SLOT_ALIGN,
};

/// Offset of the target ids in the request area.
pub const TARGETS_OFFSET: usize = size_of::<RequestHeader>();

/// Where a graph-layout request's fanouts start: right after the target
/// ids.
pub fn fanouts_offset(n_targets: u32) -> u64 {
    TARGETS_OFFSET as u64 + 8 * u64::from(n_targets)
}

/// Where a `SEED_TIME` request's seed times start: after the target ids and
/// `n_fanouts` u32 fanouts, at the next multiple of 8.
pub fn seed_times_offset(n_targets: u32, n_fanouts: usize) -> Option<u64> {
    align_up(
        fanouts_offset(n_targets).checked_add((n_fanouts as u64).checked_mul(4)?)?,
        8,
    )
}

/// Bytes of request area a segment of a graph of `n_edge_types` edge types
/// needs for `max_targets` targets and, after them, [`MAX_SUBGRAPH_HOPS`]
/// fanouts per edge type and a seed time per target (`SEED_TIME`): whole
/// pages (4096 bytes), so that the response area after it starts on a page
/// and each process can map the areas its peer writes read-only.
pub fn request_bytes_for(max_targets: u32, n_edge_types: usize) -> Option<u64> {
    let times_at = seed_times_offset(max_targets, n_edge_types.checked_mul(MAX_SUBGRAPH_HOPS)?)?;
    align_up(
        times_at.checked_add(u64::from(max_targets).checked_mul(8)?)?,
        SLOT_ALIGN as u64,
    )
}

/// A temporal graph request's seed times (`SEED_TIME`, docs/protocol.md,
/// "Temporal sampling"): one per target; an edge later than its target's
/// seed time is not sampled. `last`: the most recent valid neighbours
/// (`TEMPORAL_LAST`) instead of uniform draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedTimes {
    pub times: Vec<i64>,
    pub last: bool,
}

impl SeedTimes {
    /// Its flag bits.
    pub fn flags(&self) -> u32 {
        request_flags::SEED_TIME
            | if self.last {
                request_flags::TEMPORAL_LAST
            } else {
                0
            }
    }
}

/// Bytes of request area a segment of `graph` needs for `max_targets`
/// targets and for a new node (`NEW_NODE`) of its widest node type at
/// [`MAX_SUBGRAPH_HOPS`] hops with `new_node_edges` edges, whole pages.
pub fn request_bytes_with_new_node(
    max_targets: u32,
    graph: &GraphSchema,
    new_node_edges: u32,
) -> Option<u64> {
    let widest = graph.node_types.iter().map(|t| t.feature_dim).max()?;
    let n_edge_types = graph.edge_types.len();
    let (_, _, edges_at) =
        new_node_offsets(n_edge_types * MAX_SUBGRAPH_HOPS, widest, n_edge_types)?;
    let new_node = align_up(
        edges_at.checked_add(u64::from(new_node_edges).checked_mul(16)?)?,
        SLOT_ALIGN as u64,
    )?;
    Some(request_bytes_for(max_targets, n_edge_types)?.max(new_node))
}

/// Where a new node's parts start in the request area, after its one target
/// id and `n_fanouts` u32 fanouts (none in the dense layout): its row at the
/// next multiple of 8, the per-edge-type edge counts (`n_edge_types` u32)
/// after the row's `4 x feature_dim` bytes at the next multiple of 8, the
/// edges (u64 (src, dst) pairs) after the counts at the next multiple of 8.
pub fn new_node_offsets(
    n_fanouts: usize,
    feature_dim: u32,
    n_edge_types: usize,
) -> Option<(u64, u64, u64)> {
    let fanouts_end = fanouts_offset(1).checked_add((n_fanouts as u64).checked_mul(4)?)?;
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

/// A node the graph does not have, carried in a request (`NEW_NODE`,
/// docs/protocol.md, "A new node in the request"): the request's one target,
/// of the request's target type (the dense layout's: node type 0). The
/// sidecar samples as if it had been added with this row and these edges,
/// without adding it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewNode {
    /// Its feature row: its type's width (empty for a type without
    /// features).
    pub features: Vec<f32>,
    /// Per edge type, in the graph schema's order, `(src, dst)` pairs: each
    /// has the new node at an end of its type and a node of the graph at
    /// the other.
    pub edges: Vec<Vec<(u64, u64)>>,
}

impl NewNode {
    /// A one-type graph's new node `id`: its row, and its `neighbors` as
    /// `sidecarctl graph add-node` adds them: each neighbour `n` is in the
    /// new node's neighbour list (the 1x1 graph's edge `(n, id)`: `n`'s
    /// messages reach the new node) and, unless `directed`, the new node in
    /// `n`'s (edge `(id, n)`).
    pub fn one_type(id: u64, features: Vec<f32>, neighbors: &[u64], directed: bool) -> Self {
        let out = neighbors.iter().map(|&n| (n, id));
        let back = neighbors.iter().filter(|_| !directed).map(|&n| (id, n));
        Self {
            features,
            edges: vec![out.chain(back).collect()],
        }
    }

    /// Its edges over every edge type.
    pub fn n_edges(&self) -> usize {
        self.edges.iter().map(Vec::len).sum()
    }
}

/// A graph-layout request's ask (docs/protocol.md, "Graph requests"): the
/// targets' node type, the hops of the subgraph, and per edge type (in the
/// graph schema's order) and hop a fanout, edge type `e`'s hop `h` at
/// `fanouts[e * hops + h]`; 0: that edge type is not sampled at that hop.
/// A one-type graph's is the 1x1 graph's ([`GraphAsk::one_type`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphAsk {
    pub target_type: u32,
    pub hops: u32,
    pub fanouts: Vec<u32>,
    /// The edge data the response carries (flags `EDGE_ATTR`,
    /// `EDGE_WEIGHT`, `EDGE_TIME`).
    pub edge_data: EdgeColumns,
}

/// Which edge data a graph request asks its response to carry, per edge
/// type that has it, in `edge_index`'s column order (docs/protocol.md,
/// "Edge data").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EdgeColumns {
    /// `edge_attr`: the edge's attributes (`EDGE_ATTR`).
    pub attr: bool,
    /// `edge_weight` (`EDGE_WEIGHT`).
    pub weight: bool,
    /// `edge_time` (`EDGE_TIME`).
    pub time: bool,
}

impl EdgeColumns {
    /// Every column.
    pub const ALL: Self = Self {
        attr: true,
        weight: true,
        time: true,
    };

    /// Whether it asks for any.
    pub fn any(&self) -> bool {
        self.attr || self.weight || self.time
    }

    /// Its request flag bits.
    pub fn flags(&self) -> u32 {
        use crate::layout::request_flags::{EDGE_ATTR, EDGE_TIME, EDGE_WEIGHT};
        (if self.attr { EDGE_ATTR } else { 0 })
            | (if self.weight { EDGE_WEIGHT } else { 0 })
            | (if self.time { EDGE_TIME } else { 0 })
    }

    /// The columns request flags `flags` ask for.
    pub fn of_flags(flags: u32) -> Self {
        use crate::layout::request_flags::{EDGE_ATTR, EDGE_TIME, EDGE_WEIGHT};
        Self {
            attr: flags & EDGE_ATTR != 0,
            weight: flags & EDGE_WEIGHT != 0,
            time: flags & EDGE_TIME != 0,
        }
    }

    /// What an edge type carrying `data` sends of them: the asked columns
    /// it has.
    pub fn sent(&self, data: &EdgeDataDesc) -> Self {
        Self {
            attr: self.attr && data.attr_dim > 0,
            weight: self.weight && data.weight,
            time: self.time && data.time,
        }
    }
}

impl GraphAsk {
    /// A one-type graph's ask: node type 0, one fanout per hop, no edge
    /// data.
    pub fn one_type(fanouts: &[u32]) -> Self {
        Self {
            target_type: 0,
            hops: fanouts.len() as u32,
            fanouts: fanouts.to_vec(),
            edge_data: EdgeColumns::default(),
        }
    }

    /// Edge type `edge_type`'s fanout at `hop` (0-based).
    pub fn fanout(&self, edge_type: usize, hop: usize) -> u32 {
        self.fanouts[edge_type * self.hops as usize + hop]
    }

    /// A one-type graph's ask as its fanouts, one per hop; `None` when it
    /// names more than one edge type or hops outside 1 to 3.
    pub fn one_type_fanouts(&self) -> Option<SubgraphFanouts> {
        (self.target_type == 0 && self.fanouts.len() == self.hops as usize)
            .then(|| SubgraphFanouts::new(&self.fanouts))
            .flatten()
    }
}

/// What a sidecar would refuse in new node `node` (id `id`, asked with
/// `ask`, or in the dense layout with `None`) that its caller can see
/// before asking: one row of its type's width with finite values, one edge
/// list per edge type, each edge with the new node at an end of its type,
/// edges that fit the request area. Whether the other ends are nodes of the
/// graph only the sidecar knows. The message names the problem and the fix.
pub fn new_node_problem(
    id: u64,
    node: &NewNode,
    ask: Option<&GraphAsk>,
    geometry: &Geometry,
    graph: &GraphSchema,
) -> Option<String> {
    let target_type = ask.map_or(0, |a| a.target_type);
    let target = graph.node_types.get(target_type as usize)?;
    let dim = target.feature_dim as usize;
    if node.features.len() != dim {
        let whose = match graph.node_types.len() {
            1 => "this graph's rows".to_string(),
            _ => format!("rows of node type {}", target.name),
        };
        return Some(format!(
            "the new node's row has {} features; {whose} have {dim}",
            node.features.len()
        ));
    }
    if let Some((i, v)) = node
        .features
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite())
    {
        return Some(format!(
            "the new node's feature {i} is {v}: every feature must be a finite number"
        ));
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
        let t = target_type;
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
    let n_fanouts = ask.map_or(0, |a| a.fanouts.len());
    let (_, _, edges_at) = new_node_offsets(n_fanouts, target.feature_dim, graph.edge_types.len())?;
    let max = geometry.request_bytes.saturating_sub(edges_at) / 16;
    if node.n_edges() as u64 > max {
        return Some(format!(
            "the new node has {} edges; the sidecar takes at most {max}: send fewer, or raise \
             the sidecar's max_new_node_edges (--max-new-node-edges)",
            node.n_edges()
        ));
    }
    None
}

/// What a sidecar would refuse in a graph-layout request that its caller
/// can see before asking: a node type or a count of fanouts the graph does
/// not have, hops outside 1 to 3, a fanout above its hop's cap.
pub fn graph_problem(ask: &GraphAsk, geometry: &Geometry, graph: &GraphSchema) -> Option<String> {
    let hops = ask.hops as usize;
    if !(1..=MAX_SUBGRAPH_HOPS).contains(&hops) {
        return Some(format!(
            "a graph-layout request has {hops} hops; it samples 1 to {MAX_SUBGRAPH_HOPS}"
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
            "a graph-layout request has {} fanouts; this graph has {n_edge_types} edge types, \
             so {hops} hops need {}",
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
    // An asked column some edge type sends.
    let sent = |column: fn(EdgeColumns) -> bool| {
        graph
            .edge_types
            .iter()
            .any(|e| column(ask.edge_data.sent(&e.data)))
    };
    let missing = [
        (
            ask.edge_data.attr && !sent(|s| s.attr),
            "EDGE_ATTR (0x40): attributes",
        ),
        (
            ask.edge_data.weight && !sent(|s| s.weight),
            "EDGE_WEIGHT (0x80): a weight",
        ),
        (
            ask.edge_data.time && !sent(|s| s.time),
            "EDGE_TIME (0x100): a time",
        ),
    ];
    if let Some((_, what)) = missing.iter().find(|(missing, _)| *missing) {
        return Some(format!(
            "request flag {what} per edge, which no edge type of this graph carries ({}): \
             leave the flag unset, or import the graph with that edge data \
             (docs/graph-index.md, \"Edge data\")",
            graph.describe()
        ));
    }
    None
}

/// A `FRESH_SINCE` request's point of the change clock: targets whose
/// sample has not changed since `tick` of `clock` come back `FRESH` (in the
/// dense layout with their own row alone, in the graph layout with no row).
/// Dense answers were computed at `fanouts`; graph-layout answers at the
/// request's own hops and fanouts, or those the request names apart
/// ([`Request::fresh_at`]; [`FreshSince::graph`]: `fanouts` 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreshSince {
    /// The sidecar's change clock id ([`crate::layout::ResponseHeader::change_clock`]).
    pub clock: u64,
    pub tick: u64,
    /// The dense layout's fanouts the caller's answers were computed with;
    /// 0 in the graph layout.
    pub fanouts: [u32; MAX_HOPS],
}

impl FreshSince {
    /// Answers of the dense layout, computed at `fanouts`.
    pub fn dense(clock: u64, tick: u64, fanouts: [u32; MAX_HOPS]) -> Self {
        Self {
            clock,
            tick,
            fanouts,
        }
    }

    /// Answers of the graph layout, each computed on its target's own
    /// subgraph at the request's hops and fanouts.
    pub fn graph(clock: u64, tick: u64) -> Self {
        Self {
            clock,
            tick,
            fanouts: [0; MAX_HOPS],
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

/// The fanouts of a one-type graph's graph-layout request or response, one
/// per hop (1 to [`MAX_SUBGRAPH_HOPS`] hops; docs/protocol.md, "The
/// subgraph layout").
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

/// The bytes of a request area holding `header` (whose `n_targets`,
/// `hops`, `fresh_hops` and `new_node_edges` are those of `targets`,
/// `graph`, `fresh_at` and `new_node`), the target ids after it, the graph
/// layout's fanouts (the request's, then the stored answers') and,
/// with a new node, its row, edge counts and edges: for the client to copy
/// in. The caller has already checked `targets.len() <= max_targets` and the
/// new node against the segment, which the area was sized for.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn encoded(
    header: &RequestHeader,
    targets: &[u64],
    graph: Option<&GraphAsk>,
    fresh_at: Option<&GraphAsk>,
    new_node: Option<&NewNode>,
    seed_times: Option<&SeedTimes>,
) -> Vec<u8> {
    let fanouts: Vec<u32> = [graph, fresh_at]
        .into_iter()
        .flatten()
        .flat_map(|g| g.fanouts.iter().copied())
        .collect();
    // Copied in eight bytes at a time: the u32 fanouts are padded to a
    // whole word.
    let mut len =
        fanouts_offset(targets.len() as u32) as usize + (fanouts.len() * 4).next_multiple_of(8);
    let times_at = seed_times.map(|seed| {
        let at = seed_times_offset(targets.len() as u32, fanouts.len())
            .expect("seed times the segment holds") as usize;
        len = at + seed.times.len() * 8;
        at
    });
    let offsets = new_node.map(|node| {
        let (row_at, counts_at, edges_at) =
            new_node_offsets(fanouts.len(), node.features.len() as u32, node.edges.len())
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
    let at = fanouts_offset(targets.len() as u32) as usize;
    for (chunk, fanout) in area[at..].chunks_exact_mut(4).zip(&fanouts) {
        chunk.copy_from_slice(&fanout.to_le_bytes());
    }
    if let (Some(seed), Some(at)) = (seed_times, times_at) {
        for (chunk, time) in area[at..].chunks_exact_mut(8).zip(&seed.times) {
            chunk.copy_from_slice(&time.to_le_bytes());
        }
    }
    if let (Some(node), Some((row_at, counts_at, edges_at))) = (new_node, offsets) {
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
    area
}

/// A request as the sidecar sees it after validation: fanouts resolved
/// against the segment defaults and checked against the caps.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub request_id: u64,
    /// CLOCK_MONOTONIC nanoseconds; 0 = the sidecar's default deadline.
    pub deadline_mono_ns: u64,
    /// The dense layout's fanouts ([0, 0] in the graph layout).
    pub fanouts: [u32; MAX_HOPS],
    /// The hops whose fanout the client left at 0 ("the sidecar's choice"):
    /// `fanouts` holds the segment default there, which a sidecar may
    /// replace with its current setting.
    pub defaulted: [bool; MAX_HOPS],
    /// `OWN_ROWS_ONLY`: the targets' rows, no neighbours.
    pub own_rows_only: bool,
    pub targets: Vec<u64>,
    /// `NEW_NODE`: the one target is this node (of the graph ask's target
    /// type; the dense layout's: node type 0), not the graph's.
    pub new_node: Option<NewNode>,
    /// `FRESH_SINCE`: answer unchanged targets as `FRESH`.
    pub fresh: Option<FreshSince>,
    /// `HUB_H1`: send unchanged hubs among the hop-1 nodes without their
    /// hop-2 neighbours.
    pub hub_h1: Option<HubH1>,
    /// The trace the request is part of, when it carries one.
    pub trace: Option<TraceContext>,
    /// The graph layout's ask (`hops` 1 to 3); `None`: the dense layout.
    pub graph: Option<GraphAsk>,
    /// With `FRESH_SINCE` in the graph layout: the hops and fanouts the
    /// caller's answers were computed at (`fresh_hops`), when not the
    /// request's own.
    pub fresh_at: Option<GraphAsk>,
    /// `SEED_TIME`: each target's seed time, and the strategy.
    pub seed_times: Option<SeedTimes>,
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
        "request flags {flags:#x} contain a bit retired in layout version 4 (0x4 \
         NEW_NODE_DIRECTED: a new node's edges are (src, dst) pairs that name their \
         direction; 0x20 TYPED: hops 1 to 3 alone ask for the graph layout, on every graph): \
         see docs/protocol.md, \"The request\""
    )]
    RetiredFlags { flags: u32 },
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
        "request bytes 40..64 (fresh_clock, fresh_tick, fresh_fanouts) are set without the \
         FRESH_SINCE (0x8) or HUB_H1 (0x10) flag: set one, or leave them 0"
    )]
    FreshWithoutFlag,
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
        "request hops {hops}: 0 asks for the dense layout, 1 to {MAX_SUBGRAPH_HOPS} for the \
         graph layout with that many hops"
    )]
    Hops { hops: u32 },
    #[error(
        "request bytes 68..72, 76..80 and 112..128 are reserved and must be zero (bytes 68..72 \
         held the third hop's fanout until layout version 4: a graph-layout request's fanouts \
         follow its target ids)"
    )]
    Reserved,
    #[error(
        "this sidecar serves a typed graph ({graph}): send graph-layout requests (hops 1 to \
         3) naming the target type and a fanout per edge type and hop"
    )]
    DenseForTypedGraph { graph: String },
    #[error(
        "request target_type is {target_type} in the dense layout (hops 0), which has one node \
         type: leave it 0"
    )]
    TargetTypeForDense { target_type: u32 },
    #[error(
        "request flag {flag} is defined for the dense layout only (hops 0): leave it unset in \
         a graph-layout request"
    )]
    NotForGraph { flag: &'static str },
    #[error(
        "request flags {flags:#x} (EDGE_ATTR 0x40, EDGE_WEIGHT 0x80, EDGE_TIME 0x100) ask for \
         edge data, which the graph layout alone carries: send hops 1 to 3 with a fanout per \
         edge type and hop, or leave them unset"
    )]
    GraphOnly { flags: u32 },
    #[error(
        "a graph-layout FRESH_SINCE request's stored answers were computed at the request's \
         own hops and fanouts: leave fresh_fanouts (bytes 56..64) 0, and ask at the fanouts \
         the answers were computed with"
    )]
    GraphFreshFanouts,
    #[error(
        "a graph-layout request carries its fanouts after the target ids: leave fanouts \
         (bytes 20..28) 0"
    )]
    GraphFanoutFields,
    #[error(
        "request fresh_hops is {fresh_hops}: it names the stored answers' hops of a \
         graph-layout FRESH_SINCE request (hops 1 to 3 with flag 0x8) only; leave it 0"
    )]
    FreshHopsWithoutGraphFresh { fresh_hops: u32 },
    /// A graph-layout request or a new node the graph cannot serve, named.
    #[error("{0}")]
    Graph(String),
}

/// The request area's layout for one segment: its geometry, its feature
/// schema, its graph (a one-type graph's: the 1x1 graph) and whether that
/// graph is typed (which serves the graph layout alone).
#[derive(Debug, Clone, Copy)]
pub struct Decoding<'a> {
    pub geometry: &'a Geometry,
    pub schema: &'a FeatureSchema,
    pub graph: &'a GraphSchema,
    pub typed: bool,
}

/// How many bytes of the request area a request whose header is `head`
/// occupies (header, targets, fanouts, new node), capped at
/// `request_bytes`: what the sidecar copies out before decoding. Trusts
/// nothing in `head`.
pub fn occupied_bytes(head: &[u8], on: Decoding<'_>) -> usize {
    let cap = on.geometry.request_bytes;
    let Some(head) = head.get(..TARGETS_OFFSET) else {
        return TARGETS_OFFSET;
    };
    let header: RequestHeader = bytemuck::pod_read_unaligned(head);
    let targets = header.n_targets.min(on.geometry.max_targets);
    let hops = u64::from(header.hops.min(MAX_SUBGRAPH_HOPS as u32));
    let n_edge_types = on.graph.edge_types.len();
    let fresh_hops = match header.flags & request_flags::FRESH_SINCE {
        0 => 0,
        _ => u64::from(header.fresh_hops.min(MAX_SUBGRAPH_HOPS as u32)),
    };
    let n_fanouts = n_edge_types as u64 * (hops + fresh_hops);
    let mut end = fanouts_offset(targets) + n_fanouts * 4;
    if header.flags & request_flags::SEED_TIME != 0 {
        if let Some(times_at) = seed_times_offset(targets, n_fanouts as usize) {
            end = end.max(times_at + 8 * u64::from(targets));
        }
    }
    if header.flags & request_flags::NEW_NODE != 0 && header.n_targets == 1 {
        let dim = on
            .graph
            .node_types
            .get(header.target_type as usize)
            .map_or(0, |t| t.feature_dim);
        if let Some((_, _, edges_at)) = new_node_offsets(n_fanouts as usize, dim, n_edge_types) {
            end = end.max(edges_at.saturating_add(u64::from(header.new_node_edges) * 16));
        }
    }
    end.min(cap) as usize
}

/// Reads and validates a request from a request area. Never panics, whatever
/// the bytes.
pub fn decode(area: &[u8], on: Decoding<'_>) -> Result<Request, RequestError> {
    let Decoding {
        geometry,
        schema,
        graph,
        typed,
    } = on;
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
        let retired = (1 << 2) | (1 << 5);
        return Err(match header.flags & !(request_flags::KNOWN | retired) {
            0 => RequestError::RetiredFlags {
                flags: header.flags,
            },
            _ => RequestError::UnknownFlags {
                flags: header.flags,
            },
        });
    }
    if header._reserved.iter().any(|&b| b != 0)
        || header._reserved_68 != 0
        || header._reserved_76 != 0
    {
        return Err(RequestError::Reserved);
    }
    let hops = header.hops as usize;
    if hops > MAX_SUBGRAPH_HOPS {
        return Err(RequestError::Hops { hops: header.hops });
    }
    let graph_layout = hops != 0;
    if typed && !graph_layout {
        return Err(RequestError::DenseForTypedGraph {
            graph: graph.describe(),
        });
    }
    if !graph_layout && header.target_type != 0 {
        return Err(RequestError::TargetTypeForDense {
            target_type: header.target_type,
        });
    }
    if graph_layout {
        let dense_only = [
            (request_flags::OWN_ROWS_ONLY, "OWN_ROWS_ONLY (0x1)"),
            (request_flags::HUB_H1, "HUB_H1 (0x10)"),
        ];
        if let Some((_, flag)) = dense_only.iter().find(|(bit, _)| header.flags & bit != 0) {
            return Err(RequestError::NotForGraph { flag });
        }
        if header.hub_min_degree != 0 {
            return Err(RequestError::NotForGraph {
                flag: "HUB_H1's hub_min_degree (bytes 36..40)",
            });
        }
        if header.fanouts != [0; MAX_HOPS] {
            return Err(RequestError::GraphFanoutFields);
        }
    } else {
        let edge_data = EdgeColumns::of_flags(header.flags);
        if edge_data.any() {
            return Err(RequestError::GraphOnly {
                flags: edge_data.flags(),
            });
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
        Some(decode_since(&header, geometry, graph_layout)?)
    } else if header.fresh_clock != 0 || header.fresh_tick != 0 || header.fresh_fanouts != [0; 2] {
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
    if new_node && header.n_targets != 1 {
        return Err(RequestError::NewNodeTargets {
            n_targets: header.n_targets,
        });
    }
    let ids_end = fanouts_offset(header.n_targets) as usize;
    let Some(ids) = area.get(TARGETS_OFFSET..ids_end) else {
        return Err(RequestError::TooManyTargets {
            n_targets: header.n_targets,
            max_targets: geometry.max_targets,
        });
    };
    let targets = read_u64s(ids);
    if header.fresh_hops != 0 && (fresh.is_none() || !graph_layout) {
        return Err(RequestError::FreshHopsWithoutGraphFresh {
            fresh_hops: header.fresh_hops,
        });
    }
    let (fanouts, defaulted, ask) = match graph_layout {
        true => (
            [0; MAX_HOPS],
            [false; MAX_HOPS],
            Some(read_ask(area, &header, on, ids_end, header.hops, "")?),
        ),
        false => {
            let (fanouts, defaulted) = dense_fanouts(&header, geometry, schema)?;
            (fanouts, defaulted, None)
        }
    };
    let n_fanouts = ask.as_ref().map_or(0, |a| a.fanouts.len());
    let fresh_at = match header.fresh_hops {
        0 => None,
        fresh_hops => Some(read_ask(
            area,
            &header,
            on,
            ids_end + n_fanouts * 4,
            fresh_hops,
            "the stored answers' (fresh_hops): ",
        )?),
    };
    let n_fanouts = n_fanouts + fresh_at.as_ref().map_or(0, |a| a.fanouts.len());
    let seed_times = decode_seed_times(area, &header, ask.as_ref(), n_fanouts, graph)?;
    let new_node = if new_node {
        let node = decode_new_node(area, &header, ask.as_ref(), n_fanouts, graph)?;
        if let Some(problem) = new_node_problem(targets[0], &node, ask.as_ref(), geometry, graph) {
            return Err(RequestError::Graph(problem));
        }
        Some(node)
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
        trace: TraceContext::of(&header),
        graph: ask,
        fresh_at,
        seed_times,
    })
}

/// A `SEED_TIME` request's seed times (after the `n_fanouts` fanouts) and
/// strategy, checked: the graph layout, neither `NEW_NODE` nor
/// `FRESH_SINCE`, an edge type with times among those it samples;
/// `TEMPORAL_LAST` only with `SEED_TIME`.
fn decode_seed_times(
    area: &[u8],
    header: &RequestHeader,
    ask: Option<&GraphAsk>,
    n_fanouts: usize,
    graph: &GraphSchema,
) -> Result<Option<SeedTimes>, RequestError> {
    let refuse = |why: &str| Err(RequestError::Graph(why.to_string()));
    let flags = header.flags;
    if flags & request_flags::SEED_TIME == 0 {
        if flags & request_flags::TEMPORAL_LAST != 0 {
            return refuse(
                "request flag TEMPORAL_LAST (0x400) chooses how temporal sampling draws: set it \
                 with SEED_TIME (0x200) and the targets' seed times",
            );
        }
        return Ok(None);
    }
    let Some(ask) = ask else {
        return refuse(
            "request flag SEED_TIME (0x200) asks for temporal sampling, which the graph layout \
             alone does: send hops 1 to 3 with a fanout per edge type and hop",
        );
    };
    if flags & request_flags::NEW_NODE != 0 {
        return refuse(
            "request flags SEED_TIME (0x200) and NEW_NODE (0x2) together: a new node's edges \
             carry no time; add the node through an update, then ask by its id",
        );
    }
    if flags & request_flags::FRESH_SINCE != 0 {
        return refuse(
            "request flags SEED_TIME (0x200) and FRESH_SINCE (0x8) together: stored answers \
             are not vouched for at a seed time; send them apart",
        );
    }
    let timed = (0..graph.edge_types.len()).any(|e| {
        graph.edge_types[e].data.time && (0..ask.hops as usize).any(|h| ask.fanout(e, h) > 0)
    });
    if !timed {
        return Err(RequestError::Graph(format!(
            "request flag SEED_TIME (0x200): no edge type the request samples carries a time \
             ({}): sample an edge type with times, or leave the flag unset",
            graph.describe()
        )));
    }
    let n = header.n_targets as usize;
    let times = seed_times_offset(header.n_targets, n_fanouts)
        .and_then(|at| area.get(at as usize..at as usize + 8 * n));
    let Some(times) = times else {
        return Err(RequestError::Graph(format!(
            "the seed times of {n} targets do not fit the {} byte request area",
            area.len()
        )));
    };
    Ok(Some(SeedTimes {
        times: times
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect(),
        last: flags & request_flags::TEMPORAL_LAST != 0,
    }))
}

/// The dense layout's fanouts, each asked or (0) the segment's default,
/// within the caps, and which were defaulted.
fn dense_fanouts(
    header: &RequestHeader,
    geometry: &Geometry,
    schema: &FeatureSchema,
) -> Result<([u32; MAX_HOPS], [bool; MAX_HOPS]), RequestError> {
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
    Ok((fanouts, defaulted))
}

/// A graph-layout ask of `hops` hops with the request's target type: the
/// fanouts at `at` (the request's own after the target ids, or the stored
/// answers' after those), checked against the graph; a refusal starts with
/// `what`.
fn read_ask(
    area: &[u8],
    header: &RequestHeader,
    on: Decoding<'_>,
    at: usize,
    hops: u32,
    what: &str,
) -> Result<GraphAsk, RequestError> {
    if !(1..=MAX_SUBGRAPH_HOPS as u32).contains(&hops) {
        return Err(RequestError::Graph(format!(
            "{what}a graph-layout request has {hops} hops; it samples 1 to {MAX_SUBGRAPH_HOPS}"
        )));
    }
    let n_edge_types = on.graph.edge_types.len();
    let n = n_edge_types * hops as usize;
    let Some(fanouts) = area.get(at..at + n * 4) else {
        return Err(RequestError::Graph(format!(
            "{what}a graph-layout request of {} targets and {hops} hops over {n_edge_types} \
             edge types does not fit the {} byte request area",
            header.n_targets, on.geometry.request_bytes
        )));
    };
    let ask = GraphAsk {
        target_type: header.target_type,
        hops,
        fanouts: fanouts
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("chunks of 4")))
            .collect(),
        // The request's own ask carries the edge data flags; the stored
        // answers' (fresh_hops) none.
        edge_data: match what {
            "" => EdgeColumns::of_flags(header.flags),
            _ => EdgeColumns::default(),
        },
    };
    match graph_problem(&ask, on.geometry, on.graph) {
        Some(problem) => Err(RequestError::Graph(format!("{what}{problem}"))),
        None => Ok(ask),
    }
}

/// A request's new node: its row, its edge counts and its edges, in the
/// area after the target id and the `n_fanouts` fanouts, their total
/// `new_node_edges`.
fn decode_new_node(
    area: &[u8],
    header: &RequestHeader,
    ask: Option<&GraphAsk>,
    n_fanouts: usize,
    graph: &GraphSchema,
) -> Result<NewNode, RequestError> {
    let target_type = ask.map_or(0, |a| a.target_type) as usize;
    let dim = graph.node_types[target_type].feature_dim;
    let n_edge_types = graph.edge_types.len();
    let too_small = || {
        RequestError::Graph(format!(
            "the new node's row, edge counts and {} edges do not fit the {} byte request \
             area: send fewer edges, or raise the sidecar's max_new_node_edges \
             (--max-new-node-edges)",
            header.new_node_edges,
            area.len()
        ))
    };
    let (row_at, counts_at, edges_at) =
        new_node_offsets(n_fanouts, dim, n_edge_types).ok_or_else(too_small)?;
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
        return Err(RequestError::Graph(format!(
            "the new node's edge counts add up to {total}, new_node_edges says {}",
            header.new_node_edges
        )));
    }
    let edges = area
        .get(edges_at..)
        .and_then(|rest| rest.get(..(total as usize).checked_mul(16)?))
        .ok_or_else(too_small)?;
    let mut pairs = read_u64s(edges).into_iter();
    Ok(NewNode {
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
/// is refused in the graph layout before this): the dense layout's two
/// fanouts, or none in the graph layout, whose answers were computed at the
/// request's own.
fn decode_since(
    header: &RequestHeader,
    geometry: &Geometry,
    graph_layout: bool,
) -> Result<FreshSince, RequestError> {
    let (clock, tick) = (header.fresh_clock, header.fresh_tick);
    if graph_layout {
        if header.fresh_fanouts != [0; MAX_HOPS] {
            return Err(RequestError::GraphFreshFanouts);
        }
        return Ok(FreshSince::graph(clock, tick));
    }
    let caps = geometry.max_fanouts;
    let [f1, f2] = header.fresh_fanouts;
    if f1 == 0 || f2 == 0 || f1 > caps[0] || f2 > caps[1] {
        return Err(RequestError::FreshFanouts { f1, f2, caps });
    }
    Ok(FreshSince::dense(clock, tick, header.fresh_fanouts))
}

fn read_u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect()
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
            trace: None,
            graph: None,
            fresh_at: None,
            seed_times: None,
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
