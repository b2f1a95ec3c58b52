//! The model stage: each executor thread runs its ONNX Runtime session on
//! a batch's responses in place and answers the callers; the student's
//! thread does both stages for the MLP student's lane.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use protocol::client::Response;
use protocol::graph_schema::GraphSchema;
use protocol::payload::schema::{target_status, HOP2_CACHED};
use protocol::payload::{GraphTables, ResponseTables};

use super::ring_stage::{
    ring_call_split, ring_calls, slots_needed, take_live, Ring, RingCall, RingDone,
};
use super::sessions::{Session, Sessions};
use super::{answer, panic_text, Capacity, Job, PredictError, Prediction};
use crate::ladder::Costs;
use crate::metrics::WorkerMetrics;
use crate::model::{AnsweredBy, Model, ModelLayout, OutputKind};
use crate::precomputed::PrecomputedSet;
use crossbeam_channel::Receiver;

/// A model executor: takes each batch's responses, runs the model on them
/// in place with an idle session and answers its callers. It retires when
/// a run panics.
pub(super) fn model_stage(
    sessions: &Sessions,
    metrics: &WorkerMetrics,
    costs: &Costs,
    ready: &Receiver<RingDone>,
    capacity: &Capacity,
) {
    while let Ok(done) = ready.recv() {
        let releases = done.releases;
        let retired = run_part(sessions, None, done, metrics, costs);
        if releases {
            capacity.release();
        }
        match retired {
            Ran::Retired => return,
            Ran::Kept(session) => sessions.put(session),
            Ran::NoSession => {}
        }
    }
}

/// What became of the session of a run.
// Kept once per run and moved straight on: boxing it would allocate per run.
#[allow(clippy::large_enum_variant)]
pub(super) enum Ran {
    /// It ran and is whole: give it back or run the next part with it.
    Kept(Session),
    /// Its run panicked: it was retired.
    Retired,
    /// No session was left to run it (the callers were told).
    NoSession,
}

/// Runs one part of a batch with `session` (or an idle one, waiting for
/// it) and answers its callers; a session whose run panics is retired.
pub(super) fn run_part(
    sessions: &Sessions,
    session: Option<Session>,
    done: RingDone,
    metrics: &WorkerMetrics,
    costs: &Costs,
) -> Ran {
    let RingDone {
        batch,
        ids,
        responses,
        store,
        taken,
        span,
        ..
    } = done;
    let Some(mut session) = session.or_else(|| sessions.take()) else {
        answer(
            batch,
            &ids,
            Err(PredictError::Unavailable(
                "no executor is alive (each was retired after a panic; see the log): restart \
                 the worker"
                    .into(),
            )),
            metrics,
            None,
        );
        return Ran::NoSession;
    };
    let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _traced = span.enter();
        fail::fail_point!("gnn-worker-executor");
        let _span = daemon_kit::child_span!("onnx", targets = ids.len()).entered();
        responses.and_then(|responses| {
            run_model(
                &mut session.model,
                metrics,
                &ids,
                responses,
                store.as_deref(),
            )
        })
    }));
    // The batch's span ends before its callers are answered (and their
    // call spans end).
    drop(span);
    let (result, kept) = match ran {
        Ok(result) => (result, Ran::Kept(session)),
        Err(panic) => {
            let what = panic_text(&*panic);
            tracing::error!(panic = %what, "an executor panicked; its batch gets an error and it retires");
            metrics.executor_panics.inc();
            sessions.retire(session);
            (
                Err(PredictError::Internal(format!(
                    "the executor running this call failed ({what}); retry"
                ))),
                Ran::Retired,
            )
        }
    };
    answer(batch, &ids, result, metrics, Some((costs, taken)));
    kept
}

/// The student's thread: takes the student lane's batches, asks for their
/// targets' own rows (`OWN_ROWS_ONLY`; each new node in a request of its
/// own), runs the student on them and answers the callers.
pub(super) fn student_stage(
    ring: &Ring<'_>,
    mut student: Model,
    batches: &Receiver<Vec<Job>>,
    capacity: &Capacity,
) {
    let metrics = ring.metrics;
    while let Ok(batch) = batches.recv() {
        let taken = Instant::now();
        let mut batch = take_live(batch, taken, metrics);
        if batch.is_empty() {
            capacity.release();
            continue;
        }
        batch.sort_by_key(|job| job.new_node.is_some());
        let ids: Vec<u64> = batch.iter().flat_map(|j| j.ids.iter().copied()).collect();
        metrics.targets.inc_by(ids.len() as u64);
        // Its ring slots, all at once (`crate::batcher::slots`).
        let _slots = match ring.client.geometry() {
            None => None,
            Some(geometry) => {
                let total = geometry.slot_count as usize;
                let needed = slots_needed(&batch, None, (geometry.max_targets as usize).max(1));
                let reserved = ring
                    .slots
                    .reserve(needed, total, Instant::now() + ring.config.ring_timeout)
                    .filter(|_| needed <= total);
                if reserved.is_none() {
                    let error = PredictError::Overloaded(format!(
                        "no {needed} ring slots came free within ring_timeout_ms (the \
                         sidecar's ring has {total}); retry shortly, or add capacity"
                    ));
                    answer(batch, &ids, Err(error), metrics, Some((ring.costs, taken)));
                    capacity.release();
                    continue;
                }
                reserved
            }
        };
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let known: Vec<u64> = batch
                .iter()
                .filter(|j| j.new_node.is_none())
                .flat_map(|j| j.ids.iter().copied())
                .collect();
            let own_rows = RingCall {
                accepted: batch.first().map(|job| &job.accepted),
                deadline: batch.iter().filter_map(|job| job.own_deadline).min(),
                ..RingCall::own_rows()
            };
            let mut responses = ring_calls(ring, &known, own_rows)?;
            for job in batch.iter().filter(|j| j.new_node.is_some()) {
                let call = RingCall {
                    // A typed model has no student (refused at install).
                    new_node: job.new_node.as_ref(),
                    ..own_rows
                };
                ring_call_split(ring, &job.ids, call, &mut responses)?;
            }
            run_model(&mut student, metrics, &ids, responses, None)
        }));
        let result = ran.unwrap_or_else(|panic| {
            let what = panic_text(&*panic);
            tracing::error!(panic = %what, "the student's run panicked; its batch gets an error");
            Err(PredictError::Internal(format!(
                "the student's run failed ({what}); retry"
            )))
        });
        answer(batch, &ids, result, metrics, Some((ring.costs, taken)));
        capacity.release();
    }
}

/// Runs the model on each response of a batch whose targets are `ids`.
pub(super) fn run_model(
    model: &mut Model,
    metrics: &WorkerMetrics,
    ids: &[u64],
    responses: Vec<Response>,
    store: Option<&PrecomputedSet>,
) -> Result<Vec<Prediction>, PredictError> {
    let mut out = Vec::with_capacity(ids.len());
    let mut offset = 0;
    for response in responses {
        let ran = run_one(model, metrics, ids, &mut offset, &response, store, &mut out);
        // A segment truncated under the response: what was read may be the
        // SIGBUS handler's zeros, so neither an error nor logits computed
        // from it say anything about the sidecar's answer.
        if response.segment_damaged() {
            return Err(PredictError::Unavailable(
                "the shared-memory segment was truncated while its response was read; the \
                 worker attaches to the sidecar's new one: retry"
                    .into(),
            ));
        }
        ran?;
    }
    Ok(out)
}

/// A response as the model reads it: the dense layout's tables, or a
/// subgraph (a typed graph's, or a one-type graph's read as the 1x1
/// graph's) with the segment's graph and the targets' node type.
enum Read<'r> {
    Dense(ResponseTables),
    Subgraph {
        tables: GraphTables,
        graph: &'r GraphSchema,
        target_type: usize,
    },
}

impl Read<'_> {
    fn target_ids(&self) -> &[u64] {
        match self {
            Read::Dense(tables) => tables.target_ids(),
            Read::Subgraph { tables, .. } => tables.target_ids(),
        }
    }

    fn target_status(&self) -> &[u8] {
        match self {
            Read::Dense(tables) => tables.target_status(),
            Read::Subgraph { tables, .. } => tables.target_status(),
        }
    }
}

/// Decodes `response` as `model` reads it; a graph without the model's
/// target type is a malformed response (the model was checked against the
/// segment's graph at attach).
fn read<'r>(model: &Model, response: &'r Response) -> Result<Read<'r>, PredictError> {
    let decode = |e: protocol::payload::DecodeError| {
        PredictError::Internal(format!("decoding the sidecar's response: {e}"))
    };
    let malformed = |what: &str| PredictError::Internal(format!("the sidecar's response: {what}"));
    if model.manifest().layout == ModelLayout::Dense {
        return Ok(Read::Dense(response.tables().map_err(decode)?));
    }
    let manifest = model.manifest();
    let model_graph = manifest
        .graph
        .as_ref()
        .ok_or_else(|| malformed("a graph-layout response under a dense model"))?;
    let target = &model_graph.target_type;
    let graph = response.graph();
    let target_type = graph
        .node_type(target)
        .ok_or_else(|| malformed(&format!("no node type {target}")))?;
    let asked = model_graph.edge_columns(&manifest.inputs);
    Ok(Read::Subgraph {
        tables: response
            .graph_tables_with_edge_data(target_type, asked)
            .map_err(decode)?,
        graph,
        target_type,
    })
}

/// Runs the model on one response, appending its predictions to `out`:
/// one path for every model and graph. A target answered `FRESH` gets its
/// stored answer (`store`); the model runs when some target needs it.
pub(super) fn run_one(
    model: &mut Model,
    metrics: &WorkerMetrics,
    ids: &[u64],
    offset: &mut usize,
    response: &Response,
    store: Option<&PrecomputedSet>,
    out: &mut Vec<Prediction>,
) -> Result<(), PredictError> {
    let read = read(model, response)?;
    let targets = read.target_ids();
    let start = (*offset).min(ids.len());
    let asked = &ids[start..(*offset + targets.len()).min(ids.len())];
    if targets != asked || asked.is_empty() {
        return Err(PredictError::Internal(format!(
            "the sidecar answered {} targets that are not the ones asked: a malformed \
             response",
            targets.len()
        )));
    }
    *offset += asked.len();
    let status = read.target_status();
    // A FRESH target's stored answer stands: the model runs only when some
    // target needs it.
    let stored = |i: usize| -> Option<&[f32]> {
        if status[i] != target_status::FRESH {
            return None;
        }
        store.and_then(|s| s.logits(targets[i]))
    };
    if let Some(i) =
        (0..status.len()).find(|&i| status[i] == target_status::FRESH && stored(i).is_none())
    {
        return Err(PredictError::Internal(format!(
            "the sidecar answered node {} FRESH, but the worker holds no stored answer for it: \
             a malformed response",
            targets[i]
        )));
    }
    let logits = if (0..status.len()).all(|i| stored(i).is_some()) {
        Vec::new()
    } else {
        let running = Instant::now();
        let logits = match &read {
            Read::Dense(tables) => {
                let hop1_h1 = hub_embeddings(tables, store, model.manifest().hidden)?;
                model.run_with_hubs(tables, &hop1_h1)
            }
            Read::Subgraph {
                tables,
                graph,
                target_type,
            } => model.run_subgraph(tables, graph, *target_type),
        }
        .map_err(model_failed)?;
        metrics
            .onnx_run_seconds
            .observe(running.elapsed().as_secs_f64());
        logits
    };
    let width = model.manifest().output_width() as usize;
    let embedding = model.manifest().output == OutputKind::Embedding;
    let fallbacks = match &read {
        Read::Dense(tables) => Fallbacks::dense(tables),
        Read::Subgraph {
            tables,
            graph,
            target_type,
        } => Fallbacks::subgraph(tables, graph, *target_type),
    };
    for (i, &node_id) in targets.iter().enumerate() {
        let (row, answered_by) = match stored(i) {
            Some(row) => (row, AnsweredBy::Precomputed),
            None => (&logits[i * width..(i + 1) * width], model.answered_by()),
        };
        let mut prediction = Prediction::of_row(node_id, row, embedding);
        prediction.known = status[i] != target_status::UNKNOWN_NODE;
        prediction.fallback_rows = fallbacks.of(&read, i);
        prediction.answered_by = answered_by;
        out.push(prediction);
    }
    Ok(())
}

/// A model run that failed on a batch's inputs: the same inputs fail the
/// same way, so the caller is told that retrying does not help.
fn model_failed(e: crate::model::ModelError) -> PredictError {
    PredictError::Internal(format!(
        "the model cannot run this call's subgraph ({e}): retrying the same call fails the same \
         way; report it with the model and the node ids"
    ))
}

/// The model's `hop1_h1` input for a response: empty when no hop-1 slot
/// came without its neighbourhood, else `n_targets x f1 x hidden` with the
/// stored layer-1 embedding of each such slot's node (zeros elsewhere).
pub(super) fn hub_embeddings(
    tables: &ResponseTables,
    store: Option<&PrecomputedSet>,
    hidden: Option<u32>,
) -> Result<Vec<f32>, PredictError> {
    let counts = tables.hop2_counts();
    if !counts.contains(&HOP2_CACHED) {
        return Ok(Vec::new());
    }
    let hidden = hidden.unwrap_or(0) as usize;
    let mut out = vec![0f32; counts.len() * hidden];
    for (slot, _) in counts.iter().enumerate().filter(|(_, &c)| c == HOP2_CACHED) {
        let node = tables.node_ids()[tables.hop1_rows()[slot] as usize];
        let h1 = store.and_then(|s| s.h1(node)).ok_or_else(|| {
            PredictError::Internal(format!(
                "the sidecar sent hub {node} without its neighbourhood, but the worker holds no \
                 layer-1 embedding for it: a malformed response"
            ))
        })?;
        out[slot * hidden..(slot + 1) * hidden].copy_from_slice(h1);
    }
    Ok(out)
}

/// Index of the largest value (the first on ties).
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Counts each target's default rows: in the dense layout the rows its hop
/// arrays reference, in a subgraph the rows its output depends on (those
/// within `hops` edges of it, over every edge type). Free when no row is a
/// default.
pub(super) struct Fallbacks<'g> {
    pub(super) any: bool,
    /// A subgraph's schema and its targets' node type.
    graph: Option<(&'g GraphSchema, usize)>,
}

impl<'g> Fallbacks<'g> {
    fn dense(tables: &ResponseTables) -> Self {
        let any = (0..tables.n_nodes()).any(|row| tables.fallback(row));
        Self { any, graph: None }
    }

    fn subgraph(tables: &GraphTables, graph: &'g GraphSchema, target_type: usize) -> Self {
        let any = (0..tables.nodes.len())
            .any(|t| (0..tables.n_rows(t)).any(|row| tables.fallback(t, row)));
        Self {
            any,
            graph: Some((graph, target_type)),
        }
    }

    fn of(&self, read: &Read<'_>, t: usize) -> u32 {
        if !self.any {
            return 0;
        }
        match (read, self.graph) {
            (Read::Dense(tables), _) => fallback_rows(tables, t),
            (Read::Subgraph { tables, .. }, Some((graph, target_type))) => {
                subgraph_fallback_rows(tables, graph, target_type, t)
            }
            (Read::Subgraph { .. }, None) => 0,
        }
    }
}

/// Default rows within `hops` edges (against their direction, over every
/// edge type) of target `t`, itself included: the rows a `hops`-layer
/// model's answer reads. A `FRESH` target has no row: its stored answer
/// read none of these.
pub(super) fn subgraph_fallback_rows(
    tables: &GraphTables,
    graph: &GraphSchema,
    target_type: usize,
    t: usize,
) -> u32 {
    let Ok(target) = usize::try_from(tables.target_rows()[t]) else {
        return 0;
    };
    let n_types = tables.nodes.len();
    let mut reached: Vec<Vec<bool>> = (0..n_types)
        .map(|k| vec![false; tables.n_rows(k)])
        .collect();
    let mut frontier = reached.clone();
    reached[target_type][target] = true;
    frontier[target_type][target] = true;
    for _ in 0..tables.hops() {
        let mut next: Vec<Vec<bool>> = (0..n_types)
            .map(|k| vec![false; tables.n_rows(k)])
            .collect();
        for (e, ends) in graph.edge_types.iter().enumerate() {
            let (src_type, dst_type) = (ends.src as usize, ends.dst as usize);
            let edges = tables.edge_index(e);
            let (src, dst) = edges.split_at(edges.len() / 2);
            for (&s, &d) in src.iter().zip(dst) {
                let (s, d) = (s as usize, d as usize);
                if frontier[dst_type][d] && !reached[src_type][s] {
                    reached[src_type][s] = true;
                    next[src_type][s] = true;
                }
            }
        }
        frontier = next;
    }
    (0..n_types)
        .map(|k| {
            (0..tables.n_rows(k))
                .filter(|&row| reached[k][row] && tables.fallback(k, row))
                .count() as u32
        })
        .sum()
}

/// Default rows among the rows target `t` references (itself, its sampled
/// neighbours and theirs).
pub(super) fn fallback_rows(tables: &ResponseTables, t: usize) -> u32 {
    let [f1, f2] = tables.fanouts().map(|f| f as usize);
    let flag = |row: i32| u32::from(tables.fallback(row as usize));
    let mut n = flag(tables.target_rows()[t]);
    let count1 = tables.hop1_counts()[t].clamp(0, f1 as i32) as usize;
    for j in 0..count1 {
        n += flag(tables.hop1_rows()[t * f1 + j]);
        let count2 = tables.hop2_counts()[t * f1 + j].clamp(0, f2 as i32) as usize;
        for k in 0..count2 {
            n += flag(tables.hop2_rows()[(t * f1 + j) * f2 + k]);
        }
    }
    n
}
