//! Serving a typed graph's request (docs/protocol.md, "Typed requests"):
//! one sampling pass per request over every edge type at its fanouts, one
//! fetch per node type with features through that type's tiers (all types
//! at once), and the typed response written in place.

use std::time::Instant;

use protocol::payload::schema::tier;
use protocol::payload::{TypedColumns, TypedShape};

use super::{respond_outgrew, subgraph_limits, BatchContext, BatchServer, Pending, SAMPLING_SEED};
use crate::features::RowSource;
use crate::graph::sampler::{TypedFanouts, TypedSampled};

impl BatchServer {
    /// Samples, fetches and answers one typed request.
    pub(super) fn serve_typed(&mut self, ctx: &BatchContext<'_>, pending: Pending, until: Instant) {
        let m = ctx.metrics;
        let request = &pending.request;
        let ask = request.typed.as_ref().expect("a typed request");
        let fanouts = TypedFanouts::new(ask.hops as usize, ask.fanouts.clone())
            .expect("hops and fanouts checked when the request was decoded");
        let sampling = Instant::now();
        let with_node;
        let mut graph = ctx.graph;
        if let Some(node) = &request.typed_new_node {
            m.new_node_requests.inc();
            match graph.with_new_node(ask.target_type as usize, request.targets[0], &node.edges) {
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
                    return;
                }
            }
        }
        let sampled = match self.sampler.sample_typed(
            graph,
            ask.target_type as usize,
            &request.targets,
            &fanouts,
            SAMPLING_SEED,
            subgraph_limits(ctx),
            &[],
        ) {
            Ok(sampled) => sampled,
            Err(outgrew) => return respond_outgrew(ctx, pending, outgrew),
        };
        m.stage("sample").observe(sampling.elapsed().as_secs_f64());
        let n_nodes: usize = sampled.nodes.iter().map(Vec::len).sum();
        m.neighbor_fetch_count.observe(n_nodes as f64);
        let shape = TypedShape {
            hops: ask.hops,
            n_targets: request.targets.len() as u32,
            node_rows: sampled.nodes.iter().map(|n| n.len() as u32).collect(),
            edges: sampled.edge_src.iter().map(|e| e.len() as u32).collect(),
        };
        let meta = protocol::payload::ResponseMeta {
            graph_version: graph.graph_version(),
            change_clock: ctx.changes.clock(),
            change_tick: ctx.change_tick,
            id_bound: graph.id_bound(ask.target_type as usize),
        };
        let request_id = request.request_id;
        let targets = request.targets.clone();
        // A new node is row 0 of its type (the targets come first), with the
        // row the request carried.
        let own_row = request
            .typed_new_node
            .as_ref()
            .map(|node| (ask.target_type as usize, node.features.clone()));
        let mut late = false;
        let written = pending
            .ticket
            .respond_typed(request_id, meta, shape, |cols| {
                write_sample(cols, &targets, &sampled);
                late = fetch_rows(ctx, &sampled, cols, until, own_row.as_ref());
            });
        if written.is_err() {
            m.too_large.inc();
        }
        if late {
            m.deadline_misses.inc();
        }
    }
}

/// The target table, the node ids, the edges and the counts.
fn write_sample(cols: &mut TypedColumns<'_>, targets: &[u64], sampled: &TypedSampled) {
    cols.target_id.copy_from_slice(targets);
    cols.status.copy_from_slice(&sampled.status);
    cols.target_row.copy_from_slice(&sampled.target_row);
    for (nodes, ids) in cols.nodes.iter_mut().zip(&sampled.nodes) {
        nodes.node_id.copy_from_slice(ids);
    }
    for (e, index) in cols.edge_index.iter_mut().enumerate() {
        let (src, dst) = index.split_at_mut(sampled.edge_src[e].len());
        src.copy_from_slice(&sampled.edge_src[e]);
        dst.copy_from_slice(&sampled.edge_dst[e]);
    }
    for (counts, sampled) in cols.sampled_nodes.iter_mut().zip(&sampled.sampled_nodes) {
        counts.copy_from_slice(sampled);
    }
    for (counts, sampled) in cols.sampled_edges.iter_mut().zip(&sampled.sampled_edges) {
        counts.copy_from_slice(sampled);
    }
}

/// Fetches every node type's rows straight into its node table, the types
/// concurrently (one Redis round trip for all of them), and writes each
/// row's tier and fallback flag. Returns whether a row missed the deadline.
fn fetch_rows(
    ctx: &BatchContext<'_>,
    sampled: &TypedSampled,
    cols: &mut TypedColumns<'_>,
    until: Instant,
    own_row: Option<&(usize, Vec<f32>)>,
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
