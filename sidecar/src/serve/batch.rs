//! Serving one ring batch: every request taken together is sampled in one
//! pass (per distinct fanouts), its unique rows fetched in one call through
//! the tiers, and each request's own response written in place.
//!
//! A response is self-contained: its node table holds only the rows its own
//! targets reference. When several requests share a batch, the batch-wide
//! sample is split per request by remapping row indices, and the rows are
//! copied from the batch's fetch buffer; a batch of one request (the common
//! case at low load) is fetched straight into its slot.

use std::borrow::Cow;
use std::time::Instant;

use protocol::layout::{status, MAX_HOPS};
use protocol::payload::{NodeColumns, PayloadShape, TargetColumns};
use protocol::request::{FreshSince, HubH1, Request};
use protocol::server::ServeTicket;
use rustc_hash::FxHashMap;

use crate::daemon::metrics::Metrics;
use crate::daemon::GraphFeatures;
use crate::daemon::Knobs;
use crate::features::{FeatureTiers, RowSource};
use crate::graph::changes::Changes;
use crate::graph::live::GraphSnapshot;
use crate::graph::sampler::{
    hop1_of, GraphFanouts, GraphSource, Sampled, Sampler, SubgraphLimits, SubgraphTooLarge,
};
use protocol::payload::schema::tier;

mod graph;

/// Most of a request's remaining time kept back from the feature fetch for
/// writing its response (docs/serving.md, "Deadlines").
pub const RESPONSE_RESERVE: std::time::Duration = std::time::Duration::from_millis(5);

/// Per-thread state reused across batches.
#[derive(Debug, Default)]
pub struct BatchServer {
    sampler: Sampler,
    remap: Vec<i32>,
}

/// The seed of every batch's sampling: a target's neighbourhood depends on
/// the graph alone, so every call, and every replica with the same graph,
/// samples the same one (docs/graph-index.md, "Sampling").
pub const SAMPLING_SEED: u64 = 0x676e_6e2d_7365_6564;

/// What the serving loop needs besides the tickets.
#[derive(Debug)]
pub struct BatchContext<'a> {
    pub graph: &'a GraphSnapshot,
    /// The change clock, and its tick read before `graph` was loaded.
    pub changes: &'a Changes,
    pub change_tick: u64,
    /// Per node type: its tiers and stores.
    pub features: &'a GraphFeatures,
    pub runtime: &'a tokio::runtime::Handle,
    /// The fanouts for requests that leave them to the sidecar, and the
    /// feature-fetch deadline.
    pub knobs: &'a Knobs,
    pub max_nodes: u32,
    /// Bytes of a slot's response area.
    pub response_bytes: u64,
    pub metrics: &'a Metrics,
}

impl BatchContext<'_> {
    /// A one-type graph's tiers: its one type's. A one-type request is
    /// decoded only against a one-type graph's segment, whose one type has
    /// features (the load opens them).
    fn tiers(&self) -> &FeatureTiers {
        &self
            .features
            .of(0)
            .expect("a one-type graph's features are loaded with it")
            .tiers
    }
}

/// What one sampling pass is for: the fanouts, whether the requests want
/// their targets' own rows only (`OWN_ROWS_ONLY`), and the point of the
/// change clock unchanged targets are answered `FRESH` against
/// (`FRESH_SINCE`), and the hubs the caller holds layer-1 embeddings of
/// (`HUB_H1`). (A graph-layout request is a sampling pass of its own: a
/// `NeighborLoader` batch is its targets'.)
type SampleKey = ([u32; MAX_HOPS], bool, Option<FreshSince>, Option<HubH1>);

struct Pending {
    ticket: ServeTicket,
    request: Request,
    /// Range of this request's targets in its group's sample.
    first_target: usize,
}

impl BatchServer {
    /// Answers every ticket of a batch.
    pub fn serve(&mut self, ctx: &BatchContext<'_>, tickets: Vec<ServeTicket>) {
        let started = Instant::now();
        self.serve_batch(ctx, tickets);
        ctx.metrics
            .stage("batch")
            .observe(started.elapsed().as_secs_f64());
    }

    fn serve_batch(&mut self, ctx: &BatchContext<'_>, tickets: Vec<ServeTicket>) {
        let m = ctx.metrics;
        m.batches.inc();
        m.requests.inc_by(tickets.len() as u64);
        m.batch_requests.observe(tickets.len() as f64);
        let Admitted {
            groups,
            new_nodes,
            graph,
            deadline,
        } = admit(ctx, tickets);
        // Traced: the batch's spans nest under its first sampled request's
        // worker span (docs/protocol.md, "Trace context").
        let span = batch_span(&groups, &new_nodes, &graph);
        let _traced = span.enter();
        for (pending, until) in new_nodes {
            self.serve_new_node(ctx, pending, until);
        }
        if !graph.is_empty() {
            self.serve_graph(ctx, graph);
        }
        if groups.is_empty() {
            return;
        }
        let sampling = Instant::now();
        let (groups, samples) = {
            let _span = daemon_kit::child_span!("sample").entered();
            self.sample_groups(ctx, groups)
        };
        m.stage("sample").observe(sampling.elapsed().as_secs_f64());
        if !groups.is_empty() {
            self.fetch_and_respond(ctx, groups, &samples, deadline);
        }
    }

    /// One sampling pass per group.
    fn sample_groups(
        &mut self,
        ctx: &BatchContext<'_>,
        mut groups: Vec<(SampleKey, Vec<Pending>)>,
    ) -> (Vec<(SampleKey, Vec<Pending>)>, Vec<Sampled>) {
        let mut samples: Vec<Sampled> = Vec::with_capacity(groups.len());
        for (key, pending) in &mut groups {
            let mut targets = Vec::new();
            for p in pending.iter_mut() {
                p.first_target = targets.len();
                targets.extend_from_slice(&p.request.targets);
            }
            samples.push(self.sample_group(ctx, key, &targets));
        }
        (groups, samples)
    }

    /// The sample of one group's `targets`, as its key asks.
    fn sample_group(
        &mut self,
        ctx: &BatchContext<'_>,
        (fanouts, own_rows_only, fresh, hub_h1): &SampleKey,
        targets: &[u64],
    ) -> Sampled {
        let m = ctx.metrics;
        let unchanged = match fresh {
            None => Vec::new(),
            Some(fresh) => {
                let unchanged = self.unchanged(ctx, targets, fresh);
                m.fresh_checked.inc_by(targets.len() as u64);
                m.fresh_targets
                    .inc_by(unchanged.iter().filter(|&&u| u).count() as u64);
                unchanged
            }
        };
        if *own_rows_only {
            return self.sampler.own_rows(ctx.graph, targets);
        }
        let mut hubs = hub_h1.map(|ask| HubCheck::new(ctx, ask));
        let sampled = self.sampler.sample_unless(
            ctx.graph,
            targets,
            *fanouts,
            SAMPLING_SEED,
            &unchanged,
            &mut |node, degree| hubs.as_mut().is_some_and(|h| h.cached(node, degree)),
        );
        if let Some(hubs) = hubs {
            m.hub_slots.inc_by(hubs.slots);
            m.hub_cached_slots.inc_by(hubs.cached_slots);
        }
        sampled
    }

    /// Fetches the sampled rows and answers every request: a lone request
    /// straight into its slot, several with one fetch of the batch's
    /// unique rows.
    fn fetch_and_respond(
        &mut self,
        ctx: &BatchContext<'_>,
        mut groups: Vec<(SampleKey, Vec<Pending>)>,
        samples: &[Sampled],
        deadline: Option<Instant>,
    ) {
        let m = ctx.metrics;
        if groups.len() == 1 && groups[0].1.len() == 1 {
            let pending = groups
                .pop()
                .expect("one group")
                .1
                .pop()
                .expect("one request");
            self.respond(ctx, pending, &samples[0], None, |ids, features, sources| {
                m.rows_fetched.inc_by(ids.len() as u64);
                let fetching = Instant::now();
                ctx.runtime
                    .block_on(ctx.tiers().fetch_into(ids, deadline, features, sources));
                m.stage("fetch").observe(fetching.elapsed().as_secs_f64());
            });
            return;
        }
        let mut unique: Vec<u64> = Vec::new();
        let mut index: FxHashMap<u64, u32> = FxHashMap::default();
        let group_rows: Vec<Vec<u32>> = samples
            .iter()
            .map(|s| {
                s.nodes
                    .iter()
                    .map(|&id| {
                        *index.entry(id).or_insert_with(|| {
                            unique.push(id);
                            (unique.len() - 1) as u32
                        })
                    })
                    .collect()
            })
            .collect();
        let dim = ctx.tiers().feature_dim();
        let mut features = vec![0f32; unique.len() * dim];
        let mut sources = vec![RowSource::default(); unique.len()];
        m.rows_fetched.inc_by(unique.len() as u64);
        let fetching = Instant::now();
        ctx.runtime.block_on(ctx.tiers().fetch_into(
            &unique,
            deadline,
            &mut features,
            &mut sources,
        ));
        m.stage("fetch").observe(fetching.elapsed().as_secs_f64());
        for ((_, pending), (sampled, rows)) in
            groups.into_iter().zip(samples.iter().zip(&group_rows))
        {
            for p in pending {
                let batch = BatchRows {
                    features: &features,
                    sources: &sources,
                    rows,
                    dim,
                };
                self.respond(ctx, p, sampled, Some(batch), |_, _, _| {});
            }
        }
    }

    /// Which targets' dense samples at the stored answers' fanouts hold no
    /// change since the stored answers' tick (docs/protocol.md,
    /// "Freshness"): the same sample is drawn again, from the index alone,
    /// and its nodes' marks are checked: every node's row, and the
    /// neighbour list of every node the sample expanded. (A graph-layout
    /// request's answers are checked by [`BatchServer::stands`].)
    fn unchanged(
        &mut self,
        ctx: &BatchContext<'_>,
        targets: &[u64],
        fresh: &FreshSince,
    ) -> Vec<bool> {
        targets
            .iter()
            .map(|&target| {
                if !ctx.graph.is_node(0, target) {
                    return false;
                }
                let sample =
                    self.sampler
                        .sample(ctx.graph, &[target], fresh.fanouts, SAMPLING_SEED);
                let f1 = fresh.fanouts[0] as usize;
                let hop1 = &sample.hop1_rows[..sample.hop1_count[0].clamp(0, f1 as i32) as usize];
                let mut listed = Vec::with_capacity(1 + hop1.len());
                listed.push(target);
                listed.extend(hop1.iter().map(|&row| sample.nodes[row as usize]));
                ctx.changes
                    .unchanged_since(fresh.tick, &sample.nodes, &listed)
            })
            .collect()
    }

    /// Whether the stored answer of `target`, computed at `tick` on its own
    /// subgraph at `fanouts` (the target alone in its request), still
    /// stands (docs/protocol.md, "Freshness"): that subgraph is drawn again
    /// from the index, and no node of it may have a feature mark after
    /// `tick`, nor a node it expanded (every node not first reached at its
    /// last hop) a neighbour-list mark. A target the graph does not have,
    /// or whose subgraph outgrows a response (never answered), is never
    /// vouched for. One check for one-type graphs (the 1x1 typed graph)
    /// and typed ones.
    pub(super) fn stands(
        &mut self,
        ctx: &BatchContext<'_>,
        graph: &impl GraphSource,
        target_type: usize,
        target: u64,
        fanouts: &GraphFanouts,
        tick: u64,
    ) -> bool {
        use crate::graph::changes::node_key;
        if !graph.is_node(target_type, target) {
            return false;
        }
        let Ok(sample) = self.sampler.sample_graph(
            graph,
            target_type,
            &[target],
            fanouts,
            SAMPLING_SEED,
            subgraph_limits(ctx),
            &[],
        ) else {
            return false;
        };
        let mut nodes = Vec::new();
        let mut expanded = Vec::new();
        for (t, (ids, sampled)) in sample.nodes.iter().zip(&sample.sampled_nodes).enumerate() {
            let last_hop = sampled.last().copied().unwrap_or(0).max(0) as usize;
            let keys = ids.iter().map(|&id| node_key(t, id));
            nodes.extend(keys.clone());
            expanded.extend(keys.take(ids.len().saturating_sub(last_hop)));
        }
        ctx.changes.unchanged_since(tick, &nodes, &expanded)
    }

    /// Answers a dense-layout request carrying a new node (a graph-layout
    /// one is served with the others, [`BatchServer::serve_graph`]):
    /// samples the graph as it would be with the node added (nothing is
    /// published), fetches its
    /// neighbours' rows through the tiers, and writes the node's own row
    /// from the request (tier L1, not a fallback).
    fn serve_new_node(&mut self, ctx: &BatchContext<'_>, pending: Pending, deadline: Instant) {
        let m = ctx.metrics;
        let request = &pending.request;
        let node = request.new_node.as_ref().expect("a new-node request");
        let id = request.targets[0];
        let graph = match ctx
            .graph
            .with_new_node(0, id, &node.edges, Default::default())
        {
            Ok(graph) => graph,
            Err(e) => {
                m.invalid_requests.inc();
                let request_id = request.request_id;
                pending.ticket.respond_error(
                    status::INVALID_REQUEST,
                    request_id,
                    &format!("{e:#}"),
                );
                return;
            }
        };
        let sampling = Instant::now();
        let sampled = match request.own_rows_only {
            true => self.sampler.own_rows(&graph, &request.targets),
            false => self
                .sampler
                .sample(&graph, &request.targets, request.fanouts, SAMPLING_SEED),
        };
        m.stage("sample").observe(sampling.elapsed().as_secs_f64());
        let row = node.features.clone();
        self.respond(ctx, pending, &sampled, None, |ids, features, sources| {
            // The target comes first in the node table: row 0 is the new
            // node, whose row the request carried.
            let dim = row.len();
            features[..dim].copy_from_slice(&row);
            sources[0] = RowSource {
                tier: tier::L1,
                fallback: false,
                late: false,
            };
            m.rows_fetched.inc_by(ids.len() as u64 - 1);
            let fetching = Instant::now();
            ctx.runtime.block_on(ctx.tiers().fetch_into(
                &ids[1..],
                Some(deadline),
                &mut features[dim..],
                &mut sources[1..],
            ));
            m.stage("fetch").observe(fetching.elapsed().as_secs_f64());
        });
    }

    /// Writes one request's response: its slice of the group's sample,
    /// remapped to its own node table, with features from `batch` or, for a
    /// lone request, from `fetch` into the slot directly.
    fn respond(
        &mut self,
        ctx: &BatchContext<'_>,
        pending: Pending,
        sampled: &Sampled,
        batch: Option<BatchRows<'_>>,
        fetch: impl FnOnce(&[u64], &mut [f32], &mut [RowSource]),
    ) {
        let _span =
            daemon_kit::child_span!("write_response", request_id = pending.request.request_id)
                .entered();
        let n = pending.request.targets.len();
        let t0 = pending.first_target;
        let whole = t0 == 0 && n == sampled.n_targets();
        let (cols, local) = self.local_columns(sampled, t0, n, whole);
        let n_nodes = if whole {
            sampled.nodes.len()
        } else {
            local.len()
        };
        let request_id = pending.request.request_id;
        ctx.metrics.neighbor_fetch_count.observe(n_nodes as f64);
        if n_nodes > ctx.max_nodes as usize {
            ctx.metrics.too_large.inc();
            pending.ticket.respond_error(
                status::TOO_LARGE,
                request_id,
                &format!(
                    "{n_nodes} sampled nodes exceed the segment's max_nodes {}: send fewer \
                     targets per request, lower the fanouts, or raise the sidecar's max_nodes \
                     (--max-nodes)",
                    ctx.max_nodes
                ),
            );
            return;
        }
        let meta = protocol::payload::ResponseMeta {
            graph_version: ctx.graph.graph_version(),
            change_clock: ctx.changes.clock(),
            change_tick: ctx.change_tick,
            id_bound: ctx.graph.id_bound(0),
        };
        let targets = &pending.request.targets;
        let mut late = false;
        // The node table: the ids and rows of the group's sample this
        // request holds, copied from the batch's fetch or fetched into the
        // slot.
        let write_nodes = |nodes: &mut NodeColumns<'_>| {
            let sources = match batch {
                None => {
                    nodes.node_id.copy_from_slice(&sampled.nodes);
                    let mut sources = vec![RowSource::default(); n_nodes];
                    fetch(&sampled.nodes, nodes.features, &mut sources);
                    sources
                }
                Some(batch) => {
                    let rows = |i: usize| if whole { i } else { local[i] as usize };
                    copy_batch_rows(nodes, &batch, sampled, rows, n_nodes)
                }
            };
            late = sources.iter().any(|s| s.late);
            write_sources(nodes, &sources);
        };
        let shape = PayloadShape {
            n_targets: n as u32,
            n_nodes: n_nodes as u32,
            feature_dim: ctx.tiers().feature_dim() as u32,
            fanouts: sampled.fanouts,
        };
        let written = pending
            .ticket
            .respond(request_id, meta, shape, |nodes, out| {
                cols.write(targets, out);
                write_nodes(nodes);
            });
        if written.is_err() {
            ctx.metrics.too_large.inc();
        }
        if late {
            ctx.metrics.deadline_misses.inc();
        }
    }

    /// The columns of the request's `n` targets from `t0` of its group's
    /// sample, with rows renumbered to the request's own node table, and
    /// that table's group rows in order of first reference (empty, and the
    /// rows unchanged, when the request is the whole group).
    fn local_columns<'s>(
        &mut self,
        sampled: &'s Sampled,
        t0: usize,
        n: usize,
        whole: bool,
    ) -> (SampleSlice<'s>, Vec<u32>) {
        let [f1, f2] = sampled.fanouts.map(|f| f as usize);
        let mut local: Vec<u32> = Vec::new();
        let mut cols = SampleSlice::of(sampled, t0, n, f1, f2);
        if !whole {
            self.remap.clear();
            self.remap.resize(sampled.nodes.len(), -1);
            let remap = &mut self.remap;
            let mut map = |row: &mut i32| {
                let g = *row as usize;
                if remap[g] < 0 {
                    remap[g] = local.len() as i32;
                    local.push(g as u32);
                }
                *row = remap[g];
            };
            cols.target_row.to_mut().iter_mut().for_each(&mut map);
            cols.hop1_rows.to_mut().iter_mut().for_each(&mut map);
            cols.hop2_rows.to_mut().iter_mut().for_each(&mut map);
        }
        (cols, local)
    }
}

/// Copies a request's `n_nodes` rows from the batch's fetch buffer into
/// its node table (`rows(i)`: the group row of its row `i`); returns their
/// sources.
fn copy_batch_rows(
    nodes: &mut NodeColumns<'_>,
    batch: &BatchRows<'_>,
    sampled: &Sampled,
    rows: impl Fn(usize) -> usize,
    n_nodes: usize,
) -> Vec<RowSource> {
    let dim = batch.dim;
    let mut sources = Vec::with_capacity(n_nodes);
    for i in 0..n_nodes {
        let g = rows(i);
        let b = batch.rows[g] as usize;
        nodes.node_id[i] = sampled.nodes[g];
        nodes.features[i * dim..(i + 1) * dim]
            .copy_from_slice(&batch.features[b * dim..(b + 1) * dim]);
        sources.push(batch.sources[b]);
    }
    sources
}

/// A batch's requests once checked: the dense-layout groups that share a
/// sampling pass, the dense-layout requests carrying a new node and the
/// graph-layout requests (each with its own fetch deadline), and the
/// earliest fetch deadline of the groups' requests.
struct Admitted {
    groups: Vec<(SampleKey, Vec<Pending>)>,
    new_nodes: Vec<(Pending, Instant)>,
    /// A typed graph's requests and a one-type graph's in the subgraph
    /// layout, each its own sampling pass, one fetch per node type for
    /// all of them.
    graph: Vec<(Pending, Instant)>,
    deadline: Option<Instant>,
}

/// The span of a batch with a sampled trace context among its requests: a
/// child of the first one's worker span; a disabled span otherwise (no
/// trace, or traces off).
fn batch_span(
    groups: &[(SampleKey, Vec<Pending>)],
    new_nodes: &[(Pending, Instant)],
    graph: &[(Pending, Instant)],
) -> tracing::Span {
    let requests = || {
        groups
            .iter()
            .flat_map(|(_, p)| p)
            .chain(new_nodes.iter().chain(graph).map(|(p, _)| p))
    };
    let Some(first) = requests().find(|p| p.request.trace.is_some_and(|t| t.sampled)) else {
        return tracing::Span::none();
    };
    let trace = first.request.trace.expect("found");
    let span = tracing::trace_span!(
        "sidecar.request",
        request_id = first.request.request_id,
        targets = first.request.targets.len(),
        batch_requests = requests().count()
    );
    daemon_kit::traces::remote_parent(&span, trace.trace_id, trace.parent, trace.sampled);
    span
}

/// Decodes and checks every ticket (a refusal is answered here), resolves
/// the fanouts a request leaves to the sidecar, and groups the dense-layout
/// requests that share a sampling pass.
fn admit(ctx: &BatchContext<'_>, tickets: Vec<ServeTicket>) -> Admitted {
    let now = Instant::now();
    let mut admitted = Admitted {
        groups: Vec::new(),
        new_nodes: Vec::new(),
        graph: Vec::new(),
        deadline: None,
    };
    for ticket in tickets {
        let Some((ticket, request, until)) = admit_one(ctx, ticket, now) else {
            continue;
        };
        let pending = Pending {
            ticket,
            request,
            first_target: 0,
        };
        let request = &pending.request;
        if request.new_node.is_some() {
            ctx.metrics.new_node_requests.inc();
        }
        if request.graph.is_some() {
            admitted.graph.push((pending, until));
            continue;
        }
        if request.new_node.is_some() {
            admitted.new_nodes.push((pending, until));
            continue;
        }
        admitted.deadline = Some(admitted.deadline.map_or(until, |d: Instant| d.min(until)));
        let key = sample_key(ctx, request);
        match admitted.groups.iter().position(|(k, _)| *k == key) {
            Some(i) => admitted.groups[i].1.push(pending),
            None => admitted.groups.push((key, vec![pending])),
        }
    }
    admitted
}

/// One ticket with its request, defaults filled in, and when its feature
/// fetch must end; `None` when it was refused (answered here).
fn admit_one(
    ctx: &BatchContext<'_>,
    ticket: ServeTicket,
    now: Instant,
) -> Option<(ServeTicket, Request, Instant)> {
    let m = ctx.metrics;
    let mut request = match ticket.request() {
        Ok(request) => request,
        Err(e) => {
            m.invalid_requests.inc();
            let request_id = ticket.request_id();
            ticket.respond_error(status::INVALID_REQUEST, request_id, &e.to_string());
            return None;
        }
    };
    if request.remaining() == Some(std::time::Duration::ZERO) {
        // Its client has given up or is about to: answering with rows
        // would be work nobody reads.
        m.expired_requests.inc();
        ticket.respond_error(
            status::DEADLINE_EXCEEDED,
            request.request_id,
            "the request's deadline had passed when the sidecar took it: give it \
             more time (the worker's ring_timeout_ms) or add capacity",
        );
        return None;
    }
    let knob_fanouts = ctx.knobs.fanouts();
    for ((fanout, defaulted), knob) in request
        .fanouts
        .iter_mut()
        .zip(request.defaulted)
        .zip(knob_fanouts)
    {
        if defaulted {
            *fanout = knob;
        }
    }
    if request.own_rows_only {
        // The targets alone: the smallest hop arrays (every count 0).
        request.fanouts = [1, 1];
    }
    // The padded hop arrays alone (4 bytes per entry of hop1_rows,
    // hop2_count and hop2_rows) must fit the response area: checked
    // before the sampler sets memory aside for them. (A subgraph's
    // size is the sample's own: the sampler stops where it outgrows
    // the response.)
    let [f1, f2] = request.fanouts.map(u64::from);
    let hop_bytes = request.targets.len() as u64 * f1 * (2 + f2) * 4;
    if request.graph.is_none() && hop_bytes > ctx.response_bytes {
        m.too_large.inc();
        ticket.respond_error(
            status::TOO_LARGE,
            request.request_id,
            &format!(
                "the hop arrays of {} targets at fanouts [{f1}, {f2}] take {hop_bytes} \
                 bytes, more than the slot's {} byte response area: send fewer targets \
                 per request, lower the fanouts, or raise the sidecar's response_mib \
                 (--response-mib)",
                request.targets.len(),
                ctx.response_bytes
            ),
        );
        return None;
    }
    m.targets.inc_by(request.targets.len() as u64);
    // The feature deadline: the sidecar's knob, or the request's own
    // earlier deadline. The fetch stops early enough to write the answer
    // before the request's own deadline: a tenth of the time left is kept
    // back (at most RESPONSE_RESERVE).
    let cap = ctx.knobs.deadline();
    let until = now
        + request.remaining().map_or(cap, |left| {
            left.saturating_sub((left / 10).min(RESPONSE_RESERVE))
                .min(cap)
        });
    Some((ticket, request, until))
}

/// What sampling pass a request belongs to. An answer stamped by another
/// clock (a sidecar since restarted) cannot be vouched for: every target
/// is sampled.
fn sample_key(ctx: &BatchContext<'_>, request: &Request) -> SampleKey {
    let clock = ctx.changes.clock();
    let fresh = request
        .fresh
        .filter(|f| f.clock == clock && !request.own_rows_only);
    let hub_h1 = request
        .hub_h1
        .filter(|h| h.since.clock == clock && !request.own_rows_only);
    (request.fanouts, request.own_rows_only, fresh, hub_h1)
}

/// How large a subgraph may grow before it cannot be a response: the
/// segment's `max_nodes`, and as many edges as the response area holds
/// (16 bytes each).
fn subgraph_limits(ctx: &BatchContext<'_>) -> SubgraphLimits {
    SubgraphLimits {
        max_nodes: ctx.max_nodes as usize,
        max_edges: (ctx.response_bytes / 16) as usize,
    }
}

/// Answers a subgraph request whose sample outgrew a response TOO_LARGE,
/// naming the limit and the fix.
fn respond_outgrew(ctx: &BatchContext<'_>, pending: Pending, outgrew: SubgraphTooLarge) {
    ctx.metrics.too_large.inc();
    let what = match outgrew {
        SubgraphTooLarge::Nodes { max_nodes } => format!(
            "the sampled subgraph has more than the segment's max_nodes {max_nodes} nodes: send \
             fewer targets per request, lower the fanouts, or raise the sidecar's max_nodes \
             (--max-nodes)"
        ),
        SubgraphTooLarge::Edges { max_edges } => format!(
            "the sampled subgraph has more than the {max_edges} edges the slot's {} byte response \
             area holds: send fewer targets per request, lower the fanouts, or raise the \
             sidecar's response_mib (--response-mib)",
            ctx.response_bytes
        ),
    };
    let request_id = pending.request.request_id;
    pending
        .ticket
        .respond_error(status::TOO_LARGE, request_id, &what);
}

/// The batch's fetched rows and where each group row lives in them.
struct BatchRows<'a> {
    features: &'a [f32],
    sources: &'a [RowSource],
    /// Group row -> batch row.
    rows: &'a [u32],
    dim: usize,
}

fn write_sources(nodes: &mut NodeColumns<'_>, sources: &[RowSource]) {
    for (i, source) in sources.iter().enumerate() {
        nodes.tier[i] = source.tier;
        nodes.set_fallback(i, source.fallback);
    }
}

/// One request's part of a group's sample. The row columns borrow the
/// sample and are copied only when a request's rows must be remapped (it
/// shares its group with others).
struct SampleSlice<'a> {
    status: &'a [u8],
    hop1_count: &'a [i32],
    hop2_count: &'a [i32],
    target_row: Cow<'a, [i32]>,
    hop1_rows: Cow<'a, [i32]>,
    hop2_rows: Cow<'a, [i32]>,
}

impl<'a> SampleSlice<'a> {
    fn of(s: &'a Sampled, t0: usize, n: usize, f1: usize, f2: usize) -> Self {
        Self {
            status: &s.status[t0..t0 + n],
            hop1_count: &s.hop1_count[t0..t0 + n],
            hop2_count: &s.hop2_count[t0 * f1..(t0 + n) * f1],
            target_row: Cow::Borrowed(&s.target_row[t0..t0 + n]),
            hop1_rows: Cow::Borrowed(&s.hop1_rows[t0 * f1..(t0 + n) * f1]),
            hop2_rows: Cow::Borrowed(&s.hop2_rows[t0 * f1 * f2..(t0 + n) * f1 * f2]),
        }
    }

    fn write(&self, targets: &[u64], out: &mut TargetColumns<'_>) {
        out.target_id.copy_from_slice(targets);
        out.status.copy_from_slice(self.status);
        out.target_row.copy_from_slice(&self.target_row);
        out.hop1_count.copy_from_slice(self.hop1_count);
        out.hop1_rows.copy_from_slice(&self.hop1_rows);
        out.hop2_count.copy_from_slice(self.hop2_count);
        out.hop2_rows.copy_from_slice(&self.hop2_rows);
    }
}

/// A `HUB_H1` request's hubs within one sampling pass: whether each hub's
/// stored layer-1 embedding still stands, checked once per hub.
struct HubCheck<'a, 'c> {
    ctx: &'a BatchContext<'c>,
    ask: HubH1,
    memo: FxHashMap<u64, bool>,
    picked: Vec<u32>,
    hop1: Vec<u64>,
    slots: u64,
    cached_slots: u64,
}

impl<'a, 'c> HubCheck<'a, 'c> {
    fn new(ctx: &'a BatchContext<'c>, ask: HubH1) -> Self {
        Self {
            ctx,
            ask,
            memo: FxHashMap::default(),
            picked: Vec::new(),
            hop1: Vec::new(),
            slots: 0,
            cached_slots: 0,
        }
    }

    /// Whether the hop-1 node `node` of degree `degree` goes without its
    /// hop-2 neighbours: it is a hub, and the layer-1 embedding the caller
    /// holds for it still stands (docs/protocol.md, "Hub layer-1
    /// embeddings"): its own hop-1 sample at the stored fanouts, drawn
    /// again, holds no node with a feature mark after the stored tick, and
    /// its neighbour list has no mark after it.
    fn cached(&mut self, node: u64, degree: u32) -> bool {
        if degree < self.ask.min_degree {
            return false;
        }
        self.slots += 1;
        let Self {
            ctx,
            ask,
            memo,
            picked,
            hop1,
            ..
        } = self;
        let cached = *memo.entry(node).or_insert_with(|| {
            hop1_of(
                ctx.graph,
                node,
                ask.since.fanouts[0],
                SAMPLING_SEED,
                picked,
                hop1,
            );
            hop1.push(node);
            ctx.changes.unchanged_since(ask.since.tick, hop1, &[node])
        });
        self.cached_slots += u64::from(cached);
        cached
    }
}
