//! Serving a ring batch's graph-layout requests: a typed graph's
//! (docs/protocol.md, "Graph requests") and a one-type graph's subgraph
//! layout, which is the 1x1 typed graph's (node type 0, edge type 0), with
//! or without a new node. One sampling pass per request over every edge
//! type at its fanouts (a response is the `HeteroData`, or the `Data`, of
//! its own targets), then one fetch per node type with features through
//! that type's tiers for every request of the ring batch (the types at
//! once, each unique row once), and each response written in place. A
//! lone request is fetched straight into its slot.

use std::time::Instant;

use protocol::payload::schema::tier;
use protocol::payload::{GraphColumns, GraphShape, ResponseMeta};
use rustc_hash::FxHashMap;

use super::{respond_outgrew, subgraph_limits, BatchContext, BatchServer, Pending, SAMPLING_SEED};
use crate::features::RowSource;
use crate::graph::index::EdgeRow;
use crate::graph::sampler::{GraphFanouts, GraphSampled, GraphSource};
use crate::graph::{EdgeDatum, GraphSnapshot};
use protocol::request::EdgeColumns;

/// A new node's edges: per edge type, `(src, dst)` pairs.
type EdgeLists = [Vec<(u64, u64)>];

/// The edge data a response carries, per edge type, in its `edge_index`'s
/// column order (empty where not sent).
#[derive(Default)]
struct EdgeData {
    attrs: Vec<f32>,
    weights: Vec<f32>,
    times: Vec<i64>,
}

/// A graph-layout request sampled, waiting for its rows.
struct Job {
    pending: Pending,
    sampled: GraphSampled,
    /// Per edge type, where the request asked for edge data.
    edge_data: Vec<EdgeData>,
    shape: GraphShape,
    meta: ResponseMeta,
    /// A new node's `(node type, row)`: row 0 of its type, from the
    /// request (the targets come first).
    own_row: Option<(usize, Vec<f32>)>,
}

impl Job {
    /// Writes the response in place: the sample, then the rows `fill`
    /// writes (it returns whether one missed the deadline); counts a
    /// response too large for its slot, or late.
    fn answer(
        self,
        ctx: &BatchContext<'_>,
        fill: impl FnOnce(&mut GraphColumns<'_>, &GraphSampled, Option<&(usize, Vec<f32>)>) -> bool,
    ) {
        let Job {
            pending: Pending {
                ticket, request, ..
            },
            sampled,
            edge_data,
            shape,
            meta,
            own_row,
        } = self;
        let _span =
            daemon_kit::child_span!("write_response", request_id = request.request_id).entered();
        let mut late = false;
        let written = ticket.respond_graph(request.request_id, meta, shape, |cols| {
            write_sample(cols, &request.targets, &sampled);
            for (e, data) in edge_data.iter().enumerate() {
                cols.edge_attr[e].copy_from_slice(&data.attrs);
                cols.edge_weight[e].copy_from_slice(&data.weights);
                cols.edge_time[e].copy_from_slice(&data.times);
            }
            late = fill(cols, &sampled, own_row.as_ref());
        });
        if written.is_err() {
            ctx.metrics.too_large.inc();
        }
        if late {
            ctx.metrics.deadline_misses.inc();
        }
    }

    /// Rows of node type `t` the tiers fetch: all but a new node's own.
    fn fetched(&self, t: usize) -> &[u64] {
        let skip = usize::from(self.own_row.as_ref().is_some_and(|(own, _)| *own == t));
        &self.sampled.nodes[t][skip..]
    }
}

impl BatchServer {
    /// Samples the ring batch's graph-layout requests, each its own pass,
    /// fetches their rows (a lone request's straight into its slot,
    /// several with one fetch per node type of the batch's unique rows)
    /// and answers each.
    pub(super) fn serve_graph(
        &mut self,
        ctx: &BatchContext<'_>,
        requests: Vec<(Pending, Instant)>,
    ) {
        let m = ctx.metrics;
        let sampling = Instant::now();
        let mut deadline: Option<Instant> = None;
        let mut jobs = Vec::with_capacity(requests.len());
        {
            let _span = daemon_kit::child_span!("sample").entered();
            for (pending, until) in requests {
                if let Some(job) = self.sample_request(ctx, pending) {
                    deadline = Some(deadline.map_or(until, |d| d.min(until)));
                    jobs.push(job);
                }
            }
        }
        m.stage("sample").observe(sampling.elapsed().as_secs_f64());
        let Some(deadline) = deadline else {
            return;
        };
        if jobs.len() == 1 {
            let job = jobs.pop().expect("one job");
            job.answer(ctx, |cols, sampled, own_row| {
                fetch_rows(ctx, sampled, own_row, cols, deadline)
            });
            return;
        }
        // Several: one fetch per node type of their unique rows, the types
        // concurrently, then each response written from them.
        let types = &ctx.features.types;
        // Per node type: its unique ids, and each job's rows among them.
        let mut unique: Vec<Vec<u64>> = vec![Vec::new(); types.len()];
        let mut rows: Vec<Vec<Vec<u32>>> = vec![vec![Vec::new(); types.len()]; jobs.len()];
        for (t, features) in types.iter().enumerate() {
            if features.is_none() {
                continue;
            }
            let mut index: FxHashMap<u64, u32> = FxHashMap::default();
            for (job, rows) in jobs.iter().zip(&mut rows) {
                rows[t] = job
                    .fetched(t)
                    .iter()
                    .map(|&id| {
                        *index.entry(id).or_insert_with(|| {
                            unique[t].push(id);
                            (unique[t].len() - 1) as u32
                        })
                    })
                    .collect();
            }
        }
        let fetching = Instant::now();
        let mut values: Vec<Vec<f32>> = types
            .iter()
            .zip(&unique)
            .map(|(f, ids)| vec![0f32; f.as_ref().map_or(0, |f| f.feature_dim()) * ids.len()])
            .collect();
        let mut sources: Vec<Vec<RowSource>> = unique
            .iter()
            .map(|ids| vec![RowSource::default(); ids.len()])
            .collect();
        let fetches = types
            .iter()
            .zip(&unique)
            .zip(values.iter_mut().zip(&mut sources))
            .filter_map(|((features, ids), (values, sources))| {
                let features = features.as_ref()?;
                m.rows_fetched.inc_by(ids.len() as u64);
                Some(
                    features
                        .tiers
                        .fetch_into(ids, Some(deadline), values, sources),
                )
            });
        ctx.runtime
            .block_on(futures_util::future::join_all(fetches));
        m.stage("fetch").observe(fetching.elapsed().as_secs_f64());
        for (job, rows) in jobs.into_iter().zip(&rows) {
            job.answer(ctx, |cols, _, own_row| {
                let mut late = false;
                for (t, nodes) in cols.nodes.iter_mut().enumerate() {
                    let Some(features) = &types[t] else { continue };
                    let dim = features.feature_dim();
                    let mut row = 0;
                    if let Some((_, own)) = own_row.as_ref().filter(|(own, _)| *own == t) {
                        nodes.features[..own.len()].copy_from_slice(own);
                        nodes.tier[0] = tier::L1;
                        nodes.set_fallback(0, false);
                        row = 1;
                    }
                    for &r in &rows[t] {
                        let r = r as usize;
                        nodes.features[row * dim..(row + 1) * dim]
                            .copy_from_slice(&values[t][r * dim..(r + 1) * dim]);
                        let source = sources[t][r];
                        nodes.tier[row] = source.tier;
                        nodes.set_fallback(row, source.fallback);
                        late |= source.late;
                        row += 1;
                    }
                }
                late
            });
        }
    }

    /// Samples one graph-layout request (with its new node, if it carries
    /// one); a request refused or grown too large is answered here. A
    /// one-type graph's request is the 1x1 graph's: target type 0, its
    /// fanouts and a new node's edges those of edge type 0.
    fn sample_request(&mut self, ctx: &BatchContext<'_>, pending: Pending) -> Option<Job> {
        let m = ctx.metrics;
        let request = &pending.request;
        let ask = request
            .graph
            .as_ref()
            .expect("admitted as a graph-layout request");
        let target_type = ask.target_type as usize;
        let fanouts = GraphFanouts::new(ask.hops as usize, ask.fanouts.clone())
            .expect("hops and fanouts checked when the request was decoded");
        // A one-type graph answers in the subgraph layout (the 1x1 graph's
        // tables without a directory), a typed graph in the typed layout.
        let subgraph = ctx
            .graph
            .base()
            .is_one_type()
            .then(|| ask.one_type_fanouts())
            .flatten();
        let new_node: Option<(&[f32], &EdgeLists)> = request
            .new_node
            .as_ref()
            .map(|node| (&node.features[..], &node.edges[..]));
        let with_node;
        let mut graph = ctx.graph;
        if let Some((_, edges)) = new_node {
            match graph.with_new_node(target_type, request.targets[0], edges, ask.edge_data) {
                Ok(snapshot) => {
                    with_node = snapshot;
                    graph = &with_node;
                }
                Err(e) => {
                    m.invalid_requests.inc();
                    let request_id = request.request_id;
                    pending.ticket.respond_error(
                        protocol::layout::status::INVALID_REQUEST,
                        request_id,
                        &format!("{e:#}"),
                    );
                    return None;
                }
            }
        }
        // Stored answers are vouched for against this sidecar's clock, and
        // never with a new node (docs/protocol.md, "Freshness"), at the
        // hops and fanouts they were computed at: the request's own, or
        // those it names apart (`fresh_hops`).
        let unchanged = match request.fresh {
            Some(fresh) if fresh.clock == ctx.changes.clock() && new_node.is_none() => {
                let at = match &request.fresh_at {
                    Some(at) => GraphFanouts::new(at.hops as usize, at.fanouts.clone())
                        .expect("hops and fanouts checked when the request was decoded"),
                    None => fanouts.clone(),
                };
                let unchanged: Vec<bool> = request
                    .targets
                    .iter()
                    .map(|&target| self.stands(ctx, graph, target_type, target, &at, fresh.tick))
                    .collect();
                m.fresh_checked.inc_by(unchanged.len() as u64);
                m.fresh_targets
                    .inc_by(unchanged.iter().filter(|&&u| u).count() as u64);
                unchanged
            }
            _ => Vec::new(),
        };
        let temporal = request
            .seed_times
            .as_ref()
            .map(|seed| crate::graph::sampler::Temporal {
                seed_times: &seed.times,
                last: seed.last,
            });
        let sampled = match self.sampler.sample_graph_at(
            graph,
            target_type,
            &request.targets,
            &fanouts,
            SAMPLING_SEED,
            subgraph_limits(ctx),
            &unchanged,
            temporal,
        ) {
            Ok(sampled) => sampled,
            Err(outgrew) => {
                respond_outgrew(ctx, pending, outgrew);
                return None;
            }
        };
        let n_nodes: usize = sampled.nodes.iter().map(Vec::len).sum();
        m.neighbor_fetch_count.observe(n_nodes as f64);
        let n_targets = request.targets.len() as u32;
        let shape = match subgraph {
            Some(subgraph) => GraphShape::subgraph(
                subgraph,
                n_targets,
                n_nodes as u32,
                sampled.edge_src[0].len() as u32,
            ),
            None => GraphShape::typed(
                fanouts.hops() as u32,
                n_targets,
                sampled.nodes.iter().map(|n| n.len() as u32).collect(),
                sampled.edge_src.iter().map(|e| e.len() as u32).collect(),
            ),
        }
        .with_edge_data(ask.edge_data);
        let edge_data = match ask.edge_data.any() {
            true => sampled_edge_data(graph, &sampled, ask.edge_data),
            false => Vec::new(),
        };
        let meta = ResponseMeta {
            graph_version: graph.graph_version(),
            change_clock: ctx.changes.clock(),
            change_tick: ctx.change_tick,
            id_bound: graph.id_bound(target_type),
        };
        let own_row = new_node.map(|(row, _)| (target_type, row.to_vec()));
        Some(Job {
            pending,
            sampled,
            edge_data,
            shape,
            meta,
            own_row,
        })
    }
}

/// Each sampled edge's data of the columns `asked`, per edge type that
/// carries them, in its `edge_index`'s column order: the edge a sampled
/// source was drawn as (its place among its destination's sources), so a
/// directed edge's data is that edge's.
fn sampled_edge_data(
    graph: &GraphSnapshot,
    sampled: &GraphSampled,
    asked: EdgeColumns,
) -> Vec<EdgeData> {
    let schema = graph.schema();
    let ends = graph.edge_types();
    (0..ends.len())
        .map(|e| {
            let carried = schema.edge_types[e].data();
            let sent = asked.sent(&carried);
            let mut data = EdgeData::default();
            if !sent.any() {
                return data;
            }
            let dim = carried.attr_dim as usize;
            let n = sampled.edge_pos[e].len();
            data.attrs.reserve(if sent.attr { n * dim } else { 0 });
            let dst_nodes = &sampled.nodes[ends[e].1];
            // A destination's edges are consecutive: its row is looked up
            // once, and read in place where nothing was added to it.
            let mut current: Option<(u32, Option<EdgeRow<'_>>)> = None;
            for (&row, &i) in sampled.edge_dst[e].iter().zip(&sampled.edge_pos[e]) {
                let node = dst_nodes[row as usize] as u32;
                let base = match current {
                    Some((at, base)) if at == node => base,
                    _ => {
                        let base = graph.base_edge_row(e, node);
                        current = Some((node, base));
                        base
                    }
                };
                let datum = match base {
                    Some(base) => {
                        let i = i as usize;
                        EdgeDatum {
                            attrs: base.attrs.get(i * dim..(i + 1) * dim).unwrap_or_default(),
                            weight: base.weights.get(i).copied(),
                            time: base.times.get(i).copied(),
                        }
                    }
                    None => graph.edge_data_at(e, node, graph.edge_at(e, node, i)),
                };
                if sent.attr {
                    // Every edge of the type has `dim` (checked at import
                    // and update); a short row would be zeros, never a panic.
                    let start = data.attrs.len();
                    data.attrs.resize(start + dim, 0.0);
                    let k = datum.attrs.len().min(dim);
                    data.attrs[start..start + k].copy_from_slice(&datum.attrs[..k]);
                }
                if sent.weight {
                    data.weights.push(datum.weight.unwrap_or_default());
                }
                if sent.time {
                    data.times.push(datum.time.unwrap_or_default());
                }
            }
            data
        })
        .collect()
}

/// The target table, the node ids, the edges and the counts.
fn write_sample(cols: &mut GraphColumns<'_>, targets: &[u64], sampled: &GraphSampled) {
    sampled.graph().write(targets, cols);
    for (nodes, ids) in cols.nodes.iter_mut().zip(&sampled.nodes) {
        nodes.node_id.copy_from_slice(ids);
    }
}

/// Fetches every node type's rows straight into its node table, the types
/// concurrently (one Redis round trip for all of them), and writes each
/// row's tier and fallback flag. Returns whether a row missed the deadline.
fn fetch_rows(
    ctx: &BatchContext<'_>,
    sampled: &GraphSampled,
    own_row: Option<&(usize, Vec<f32>)>,
    cols: &mut GraphColumns<'_>,
    until: Instant,
) -> bool {
    let m = ctx.metrics;
    let fetching = Instant::now();
    let mut sources: Vec<Vec<RowSource>> = sampled
        .nodes
        .iter()
        .map(|ids| vec![RowSource::default(); ids.len()])
        .collect();
    let fetches = cols
        .nodes
        .iter_mut()
        .zip(&mut sources)
        .zip(&sampled.nodes)
        .zip(&ctx.features.types)
        .enumerate()
        .filter_map(|(t, (((nodes, sources), ids), features))| {
            let tiers = &features.as_ref()?.tiers;
            let (mut ids, mut features, mut sources) =
                (&ids[..], &mut *nodes.features, &mut sources[..]);
            if let Some((_, row)) = own_row.filter(|(own, _)| *own == t) {
                // Row 0 is the new node's: the request's row, not fetched.
                features[..row.len()].copy_from_slice(row);
                sources[0] = RowSource {
                    tier: tier::L1,
                    fallback: false,
                    late: false,
                };
                (ids, features, sources) =
                    (&ids[1..], &mut features[row.len()..], &mut sources[1..]);
            }
            m.rows_fetched.inc_by(ids.len() as u64);
            Some(tiers.fetch_into(ids, Some(until), features, sources))
        });
    ctx.runtime
        .block_on(futures_util::future::join_all(fetches));
    m.stage("fetch").observe(fetching.elapsed().as_secs_f64());
    let mut late = false;
    let types = &ctx.features.types;
    for ((nodes, sources), features) in cols.nodes.iter_mut().zip(&sources).zip(types) {
        if features.is_none() {
            continue;
        }
        for (row, source) in sources.iter().enumerate() {
            nodes.tier[row] = source.tier;
            nodes.set_fallback(row, source.fallback);
            late |= source.late;
        }
    }
    late
}
