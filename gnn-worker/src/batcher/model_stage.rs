//! The model stage: each executor thread runs its ONNX Runtime session on
//! a batch's responses in place and answers the callers; the student's
//! thread does both stages for the MLP student's lane.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use protocol::client::Response;
use protocol::payload::schema::{target_status, HOP2_CACHED, NO_ROW};
use protocol::payload::ResponseTables;

use super::ring_stage::{
    ring_call_split, ring_calls, slots_needed, take_live, Ring, RingCall, RingDone,
};
use super::sessions::{Session, Sessions};
use super::{answer, panic_text, Capacity, Job, PredictError, Prediction};
use crate::ladder::Costs;
use crate::metrics::WorkerMetrics;
use crate::model::{AnsweredBy, Model, OutputKind};
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
                    new_node: match &job.new_node {
                        Some(super::NewNodeCall::OneType(node)) => Some(node),
                        _ => None,
                    },
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

/// Runs the model on one response, appending its predictions to `out`.
pub(super) fn run_one(
    model: &mut Model,
    metrics: &WorkerMetrics,
    ids: &[u64],
    offset: &mut usize,
    response: &Response,
    store: Option<&PrecomputedSet>,
    out: &mut Vec<Prediction>,
) -> Result<(), PredictError> {
    if model.manifest().typed.is_some() {
        return run_one_typed(model, metrics, ids, offset, response, out);
    }
    let tables = response
        .tables()
        .map_err(|e| PredictError::Internal(format!("decoding the sidecar's response: {e}")))?;
    let start = (*offset).min(ids.len());
    let asked = &ids[start..(*offset + tables.target_ids().len()).min(ids.len())];
    if tables.target_ids() != asked || asked.is_empty() {
        return Err(PredictError::Internal(format!(
            "the sidecar answered {} targets that are not the ones asked: a malformed \
             response",
            tables.target_ids().len()
        )));
    }
    *offset += asked.len();
    let status = tables.target_status();
    // A FRESH target's stored answer stands: the model runs only when some
    // target needs it.
    let stored = |i: usize| -> Option<&[f32]> {
        if status[i] != target_status::FRESH {
            return None;
        }
        store.and_then(|s| s.logits(tables.target_ids()[i]))
    };
    if let Some(i) =
        (0..status.len()).find(|&i| status[i] == target_status::FRESH && stored(i).is_none())
    {
        return Err(PredictError::Internal(format!(
            "the sidecar answered node {} FRESH, but the worker holds no stored answer for it: \
             a malformed response",
            tables.target_ids()[i]
        )));
    }
    let logits = if (0..status.len()).all(|i| stored(i).is_some()) {
        Vec::new()
    } else {
        let hop1_h1 = hub_embeddings(&tables, store, model.manifest().hidden)?;
        let running = Instant::now();
        let logits = model
            .run_with_hubs(&tables, &hop1_h1)
            .map_err(model_failed)?;
        metrics
            .onnx_run_seconds
            .observe(running.elapsed().as_secs_f64());
        logits
    };
    let width = model.manifest().output_width() as usize;
    let embedding = model.manifest().output == OutputKind::Embedding;
    let fallbacks = FallbackCounter::new(&tables);
    for (i, &node_id) in tables.target_ids().iter().enumerate() {
        let (row, answered_by) = match stored(i) {
            Some(row) => (row, AnsweredBy::Precomputed),
            None => (&logits[i * width..(i + 1) * width], model.answered_by()),
        };
        let mut prediction = Prediction::of_row(node_id, row, embedding);
        prediction.known = status[i] != target_status::UNKNOWN_NODE;
        prediction.fallback_rows = fallbacks.of(&tables, i);
        prediction.answered_by = answered_by;
        out.push(prediction);
    }
    Ok(())
}

/// Runs a typed graph's model on one typed response, appending its
/// predictions to `out`. A prediction's `fallback_rows` counts the default
/// rows of the whole response (every type), which its request's targets
/// share.
fn run_one_typed(
    model: &mut Model,
    metrics: &WorkerMetrics,
    ids: &[u64],
    offset: &mut usize,
    response: &Response,
    out: &mut Vec<Prediction>,
) -> Result<(), PredictError> {
    let malformed =
        |what: String| PredictError::Internal(format!("the sidecar's response: {what}"));
    let graph = response
        .graph_schema()
        .ok_or_else(|| malformed("a one-type segment under a typed model".into()))?;
    let typed = model.manifest().typed.as_ref().expect("a typed model");
    let target_type = graph
        .node_type(&typed.target_type)
        .ok_or_else(|| malformed(format!("no node type {}", typed.target_type)))?;
    let tables = response
        .typed_tables(target_type)
        .map_err(|e| PredictError::Internal(format!("decoding the sidecar's response: {e}")))?;
    let start = (*offset).min(ids.len());
    let asked = &ids[start..(*offset + tables.target_ids().len()).min(ids.len())];
    if tables.target_ids() != asked || asked.is_empty() {
        return Err(malformed(format!(
            "{} targets that are not the ones asked",
            tables.target_ids().len()
        )));
    }
    *offset += asked.len();
    let running = Instant::now();
    let rows = model
        .run_typed(&tables, graph, target_type)
        .map_err(model_failed)?;
    metrics
        .onnx_run_seconds
        .observe(running.elapsed().as_secs_f64());
    let width = model.manifest().output_width() as usize;
    let embedding = model.manifest().output == OutputKind::Embedding;
    let fallback_rows: u32 = (0..graph.node_types.len())
        .map(|t| {
            (0..tables.n_rows(t))
                .filter(|&r| tables.fallback(t, r))
                .count() as u32
        })
        .sum();
    for (i, &node_id) in tables.target_ids().iter().enumerate() {
        let mut prediction =
            Prediction::of_row(node_id, &rows[i * width..(i + 1) * width], embedding);
        prediction.known = tables.target_status()[i] != target_status::UNKNOWN_NODE;
        prediction.fallback_rows = fallback_rows;
        prediction.answered_by = model.answered_by();
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
/// arrays reference, in the subgraph layout the rows its output depends on
/// (those within `hops` edges of it). Free when no row is a default.
pub(super) struct FallbackCounter {
    pub(super) any: bool,
}

impl FallbackCounter {
    fn new(tables: &ResponseTables) -> Self {
        let any = (0..tables.n_nodes()).any(|row| tables.fallback(row));
        Self { any }
    }

    fn of(&self, tables: &ResponseTables, t: usize) -> u32 {
        match (self.any, tables.hops()) {
            (false, _) => 0,
            (true, 0) => fallback_rows(tables, t),
            // A FRESH target of a subgraph response has no row: its stored
            // answer read none of these.
            (true, _) if tables.target_rows()[t] == NO_ROW => 0,
            (true, hops) => subgraph_fallback_rows(tables, t, hops),
        }
    }
}

/// Default rows within `hops` edges (against their direction) of target
/// `t`, itself included: the rows a `hops`-layer model's answer reads.
pub(super) fn subgraph_fallback_rows(tables: &ResponseTables, t: usize, hops: usize) -> u32 {
    let edges = tables.edge_index();
    let (src, dst) = edges.split_at(edges.len() / 2);
    let n = tables.n_nodes();
    let mut reached = vec![false; n];
    let mut frontier = vec![false; n];
    let target = tables.target_rows()[t] as usize;
    reached[target] = true;
    frontier[target] = true;
    for _ in 0..hops {
        let mut next = vec![false; n];
        for (&s, &d) in src.iter().zip(dst) {
            let (s, d) = (s as usize, d as usize);
            if frontier[d] && !reached[s] {
                reached[s] = true;
                next[s] = true;
            }
        }
        frontier = next;
    }
    (0..reached.len())
        .filter(|&row| reached[row] && tables.fallback(row))
        .count() as u32
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
