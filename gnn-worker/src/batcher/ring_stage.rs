//! The ring stage: `ring_concurrency` threads take batches, drop their
//! dead calls, make their ring calls (one request per `max_targets` chunk,
//! split in halves on TOO_LARGE) and hand the responses to the model stage.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::client::{Accepted, CallError, CallRequest, ClientStatus, Response, RingClient};
use protocol::layout::{status, FeatureSchema, MAX_HOPS};
use protocol::request::{GraphAsk, NewNode};

use super::{answer, panic_text, BatchConfig, Capacity, Job, PredictError};
use crate::ladder::{Costs, Rung};
use crate::metrics::WorkerMetrics;
use crate::precomputed::{Precomputed, PrecomputedSet};
use crossbeam_channel::{Receiver, Sender};

/// A thread takes `batch` at `now`: every call gives its place back, and
/// the calls nobody waits for any more are dropped before the ring (docs/
/// serving.md, "Overload"): those whose caller has gone (an HTTP client
/// that closed its connection, a gRPC call ended at its deadline) and those
/// that waited past [`Job::deadline`] (answered DEADLINE_EXCEEDED).
pub(super) fn take_live(batch: Vec<Job>, now: Instant, metrics: &WorkerMetrics) -> Vec<Job> {
    let mut live = Vec::with_capacity(batch.len());
    for mut job in batch {
        job.place.release();
        // Its wait in the queue ends here.
        job.queue = tracing::Span::none();
        if job.reply.is_closed() {
            metrics.calls_dropped("gone");
        } else if job.deadline <= now {
            metrics.calls_dropped("deadline");
            let waited = now.duration_since(job.enqueued).as_secs_f64();
            let _ = job.reply.send(Err(PredictError::DeadlineExceeded(format!(
                "the call waited {waited:.3} s for the batcher, past its deadline (the worker's \
                 call_timeout_ms, or its own if later), before it reached the sidecar: give it \
                 more time, or add replicas"
            ))));
        } else {
            live.push(job);
        }
    }
    live
}

/// A batch whose ring round trips are done: its callers, its ids, and the
/// responses (one per chunk, in order) or why there are none.
pub(super) struct RingDone {
    pub(super) batch: Vec<Job>,
    pub(super) ids: Vec<u64>,
    pub(super) responses: Result<Vec<Response>, PredictError>,
    /// Whether answering this gives the batch's pipeline place back (the
    /// last part of a batch that was split per call).
    pub(super) releases: bool,
    /// The precomputed set the ring calls asked about (`FRESH` targets are
    /// answered from it).
    pub(super) store: Option<Arc<PrecomputedSet>>,
    /// When the ring stage took the batch.
    pub(super) taken: Instant,
    /// The batch's span (traces): a child of its first traced call's.
    pub(super) span: tracing::Span,
    /// The ring slots reserved for the responses, given back once every
    /// part holding them is dropped (after its model run): declared after
    /// `responses`, so dropped after them.
    #[allow(dead_code)] // held for its Drop
    pub(super) slots: Option<Arc<super::slots::Reserved>>,
}

/// The span of a batch: a child of its first traced call's span, so that
/// the trace of a call shows the batch it went in (the batch's other calls
/// have their own `predict` and `queue` spans); disabled when no call of it
/// is traced.
pub(super) fn batch_span(batch: &[Job]) -> tracing::Span {
    match batch.iter().find(|job| !job.span.is_none()) {
        Some(first) => tracing::trace_span!(
            parent: &first.span,
            "batch",
            calls = batch.len(),
            targets = batch.iter().map(|j| j.ids.len()).sum::<usize>()
        ),
        None => tracing::Span::none(),
    }
}

/// What a ring call needs of the worker.
pub(super) struct Ring<'a> {
    pub(super) client: &'a RingClient,
    pub(super) schema: FeatureSchema,
    pub(super) config: &'a BatchConfig,
    pub(super) metrics: &'a WorkerMetrics,
    pub(super) precomputed: Option<&'a Precomputed>,
    pub(super) costs: &'a Costs,
    /// The ring slots this process's batches hold.
    pub(super) slots: &'a Arc<super::slots::SlotBudget>,
}

/// A ring call failed because one target's own neighbourhood does not fit
/// the response area, however the batch is split.
pub(super) fn is_too_large_alone(result: &Result<Vec<Response>, PredictError>) -> bool {
    matches!(result, Err(PredictError::InvalidArgument(m)) if m.starts_with(TOO_LARGE_ALONE))
}

pub(super) const TOO_LARGE_ALONE: &str = "the sampled neighbourhood of node";

/// A ring thread: takes batches, makes their ring calls, hands the
/// responses to the model stage.
pub(super) fn ring_stage(
    ring: &Ring<'_>,
    batches: &Receiver<Vec<Job>>,
    ready: &Sender<RingDone>,
    capacity: &Capacity,
) {
    let metrics = ring.metrics;
    loop {
        let Ok(batch) = batches.recv() else {
            return;
        };
        let emitted = ring_batch(ring, batch, &mut |done| {
            if let Err(crossbeam_channel::SendError(done)) = ready.send(done) {
                // No model executor is left to take it.
                answer(
                    done.batch,
                    &done.ids,
                    Err(PredictError::Unavailable(
                        "no executor is alive: restart the worker".into(),
                    )),
                    metrics,
                    None,
                );
                if done.releases {
                    capacity.release();
                }
            }
        });
        if !emitted {
            // Nothing of it goes to the model stage.
            capacity.release();
        }
    }
}

/// The ring slots `jobs` (sorted by [`job_kind`]) take at once: one per
/// `max_targets` chunk of each kind's targets, one per new node.
pub(super) fn slots_needed(
    jobs: &[Job],
    answers: Option<&PrecomputedSet>,
    max_targets: usize,
) -> usize {
    let mut per_kind = [0usize; 3];
    let mut new_nodes = 0;
    for job in jobs {
        match job_kind(job, answers) {
            3 => new_nodes += 1,
            kind => per_kind[kind as usize] += job.ids.len(),
        }
    }
    per_kind
        .iter()
        .map(|n| n.div_ceil(max_targets))
        .sum::<usize>()
        + new_nodes
}

/// `batch` (sorted) in groups of calls whose ring requests fit `total`
/// slots at once, in order; a call that alone needs more is a group of
/// its own (refused by [`ring_batch`]).
fn slot_groups(
    batch: Vec<Job>,
    answers: Option<&PrecomputedSet>,
    max_targets: usize,
    total: usize,
) -> Vec<Vec<Job>> {
    let mut groups = Vec::new();
    let mut group: Vec<Job> = Vec::new();
    for job in batch {
        group.push(job);
        if group.len() > 1 && slots_needed(&group, answers, max_targets) > total {
            let job = group.pop().expect("just pushed");
            groups.push(std::mem::take(&mut group));
            group.push(job);
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// Makes the ring calls of a batch taken now and hands each part of
/// responses to `emit` as soon as it is ready: one part, or one per call
/// when one call's target cannot fit, for each group of calls whose ring
/// requests fit the ring at once ([`slot_groups`]). Every group's slots
/// are reserved before its first request (`crate::batcher::slots`).
/// Returns whether anything was emitted: nothing when every call was
/// dropped or answered already (the sidecar is gone). The last part
/// emitted `releases` the batch's place in the pipeline.
pub(super) fn ring_batch(ring: &Ring<'_>, batch: Vec<Job>, emit: &mut dyn FnMut(RingDone)) -> bool {
    let metrics = ring.metrics;
    let taken = Instant::now();
    let batch = take_live(batch, taken, metrics);
    if batch.is_empty() {
        return false;
    }
    if let ClientStatus::Lost(reason) = ring.client.status() {
        // The sidecar is gone: its calls fail now rather than wait
        // `ring_timeout` for a new one (the worker is not ready).
        let ids: Vec<u64> = batch.iter().flat_map(|j| j.ids.iter().copied()).collect();
        let gone = PredictError::Unavailable(format!("the sidecar is gone: {reason}"));
        answer(batch, &ids, Err(gone), metrics, None);
        return false;
    }
    for job in &batch {
        let wait = taken.duration_since(job.enqueued);
        metrics.queue_wait_seconds.observe(wait.as_secs_f64());
        ring.costs.observe_queue_wait(wait);
    }
    // The calls whose every node has a precomputed answer go to the ring
    // together (asking which answers still stand), then the other known
    // nodes, then each new node in a request of its own: the responses
    // come in the order of `ids`.
    let store = ring.precomputed.and_then(Precomputed::current);
    let mut batch = batch;
    let answers = store.as_deref().filter(|_| ring.config.precomputed_answers);
    batch.sort_by_cached_key(|job| job_kind(job, answers));
    metrics
        .targets
        .inc_by(batch.iter().map(|j| j.ids.len() as u64).sum());
    let geometry = ring.client.geometry();
    let max_targets = geometry.map_or(1, |g| g.max_targets as usize).max(1);
    let total = geometry.map_or(usize::MAX, |g| g.slot_count as usize);
    let groups = slot_groups(batch, answers, max_targets, total);
    let n_groups = groups.len();
    for (g, batch) in groups.into_iter().enumerate() {
        let last_group = g + 1 == n_groups;
        let ids: Vec<u64> = batch.iter().flat_map(|j| j.ids.iter().copied()).collect();
        let span = batch_span(&batch);
        let needed = slots_needed(&batch, answers, max_targets);
        // The group's slots, all at once, before its first request.
        let reserved = if needed > total {
            Err(PredictError::InvalidArgument(format!(
                "this call's {} targets take {needed} ring requests at once ({max_targets}                  targets each) and the sidecar's ring has {total} slots: send at most {}                  targets per call, or raise the sidecar's slots (--slots)",
                ids.len(),
                total * max_targets
            )))
        } else if geometry.is_none() {
            Ok(None)
        } else {
            // As long as the batch's calls may wait: the slots are busy
            // with other batches' requests, which end.
            let until = batch
                .iter()
                .map(|job| job.own_deadline.unwrap_or(job.deadline))
                .min()
                .unwrap_or_else(|| Instant::now() + ring.config.ring_timeout);
            ring.slots
                .reserve(needed, total, until)
                .map(|r| Some(Arc::new(r)))
                .ok_or_else(|| {
                    PredictError::Overloaded(format!(
                        "no {needed} ring slots came free within ring_timeout_ms: all {total}                          slots of the sidecar are busy (it is saturated); retry shortly, or                          add capacity"
                    ))
                })
        };
        let reserved = match reserved {
            Ok(reserved) => reserved,
            Err(e) => {
                emit(RingDone {
                    batch,
                    ids,
                    responses: Err(e),
                    releases: last_group,
                    store: store.clone(),
                    taken,
                    span,
                    slots: None,
                });
                continue;
            }
        };
        let call = |jobs: &[Job]| {
            let _traced = span.enter();
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                jobs_ring_calls(ring, jobs, store.as_deref())
            }))
            .unwrap_or_else(|panic| {
                let what = panic_text(&*panic);
                tracing::error!(panic = %what, "a ring call panicked; its batch gets an error");
                Err(PredictError::Internal(format!(
                    "the ring call failed ({what}); retry"
                )))
            })
        };
        let responses = call(&batch);
        if batch.len() > 1 && is_too_large_alone(&responses) {
            // One call's target cannot fit: answer every call on its own, so
            // that only that call gets the error.
            drop(responses);
            let n = batch.len();
            for (i, job) in batch.into_iter().enumerate() {
                let ids = job.ids.clone();
                let job = [job];
                let responses = call(&job);
                let [job] = job;
                emit(RingDone {
                    batch: vec![job],
                    ids,
                    responses,
                    releases: last_group && i + 1 == n,
                    store: store.clone(),
                    taken,
                    span: span.clone(),
                    slots: reserved.clone(),
                });
            }
        } else {
            emit(RingDone {
                batch,
                ids,
                responses,
                releases: last_group,
                store: store.clone(),
                taken,
                span,
                slots: reserved,
            });
        }
    }
    true
}

pub(super) static REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// How a job goes to the ring, in this order: its nodes all have a
/// precomputed answer (asked `FRESH_SINCE`; `answers` is the set when its
/// answers are served), known nodes, known nodes at the ladder's reduced
/// fanouts, a new node.
pub(super) fn job_kind(job: &Job, answers: Option<&PrecomputedSet>) -> u8 {
    if job.new_node.is_some() {
        3
    } else if job.rung == Rung::Reduced {
        2
    } else if answers.is_some_and(|s| s.covers(&job.ids)) {
        0
    } else {
        1
    }
}

/// The ring calls of a batch's jobs, sorted by [`job_kind`]: the nodes with
/// precomputed answers together, the other known nodes together, then each
/// new node's own request.
pub(super) fn jobs_ring_calls(
    ring: &Ring<'_>,
    jobs: &[Job],
    store: Option<&PrecomputedSet>,
) -> Result<Vec<Response>, PredictError> {
    let answers = store.filter(|_| ring.config.precomputed_answers);
    let kinds: Vec<u8> = jobs.iter().map(|j| job_kind(j, answers)).collect();
    let ids_of = |kind: u8| -> Vec<u64> {
        jobs.iter()
            .zip(&kinds)
            .filter(|(_, &k)| k == kind)
            .flat_map(|(j, _)| j.ids.iter().copied())
            .collect()
    };
    let since = store.map(|s| s.meta.fresh_since());
    // Hubs whose stored layer-1 embedding stands come without their
    // neighbourhood (docs/serving.md, "Hub layer-1 embeddings").
    let hub_h1 = since
        .filter(|_| ring.config.hub_min_degree > 0 && store.is_some_and(|s| s.has_h1()))
        .map(|since| protocol::request::HubH1 {
            since,
            min_degree: ring.config.hub_min_degree,
        });
    // A subgraph-layout model's GNN requests ask for its layout.
    let gnn = RingCall {
        graph: ring.config.graph.as_deref(),
        accepted: jobs.first().map(|job| &job.accepted),
        deadline: jobs.iter().filter_map(|job| job.own_deadline).min(),
        ..RingCall::default()
    };
    // A graph-layout set computed at other hops or fanouts than the
    // worker asks at names its own (`fresh_hops`).
    let fresh_at = store
        .and_then(|s| s.meta.computed_with())
        .map(|set| GraphAsk {
            target_type: set.target_type,
            hops: set.hops,
            fanouts: set.fanouts,
            edge_data: Default::default(),
        })
        .filter(|at| Some(at) != gnn.graph);
    let mut responses = ring_calls(
        ring,
        &ids_of(0),
        RingCall {
            fresh: since,
            fresh_at: fresh_at.as_ref(),
            hub_h1,
            ..gnn
        },
    )?;
    let known = RingCall { hub_h1, ..gnn };
    responses.extend(ring_calls(ring, &ids_of(1), known)?);
    let reduced = RingCall {
        fanouts: ring.config.degrade_fanouts,
        graph: ring.config.degrade_graph.as_deref(),
        hub_h1,
        ..gnn
    };
    responses.extend(ring_calls(ring, &ids_of(2), reduced)?);
    for job in jobs {
        let Some(node) = &job.new_node else {
            continue;
        };
        let call = RingCall {
            new_node: Some(node),
            ..gnn
        };
        ring_call_split(ring, &job.ids, call, &mut responses)?;
    }
    Ok(responses)
}

/// What a ring request asks for besides its targets.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RingCall<'a> {
    /// `OWN_ROWS_ONLY`.
    pub(super) own_rows_only: bool,
    /// `NEW_NODE`: the one target is this node.
    pub(super) new_node: Option<&'a NewNode>,
    /// `FRESH_SINCE`: unchanged targets come back `FRESH`.
    pub(super) fresh: Option<protocol::request::FreshSince>,
    /// With `fresh`, a graph-layout set's hops and fanouts when not
    /// `graph`'s own.
    pub(super) fresh_at: Option<&'a GraphAsk>,
    /// `HUB_H1`: unchanged hubs come without their neighbourhood.
    pub(super) hub_h1: Option<protocol::request::HubH1>,
    /// Fanouts other than the worker's (the ladder's reduced rung).
    pub(super) fanouts: Option<[u32; MAX_HOPS]>,
    /// The graph layout at this ask (a graph-layout model's GNN requests).
    pub(super) graph: Option<&'a GraphAsk>,
    /// One of the batch's calls, accepted on the sidecar: the requests are
    /// submitted while it drains.
    pub(super) accepted: Option<&'a Accepted>,
    /// The earliest deadline a caller of the batch gave: the requests'
    /// timeout, and so the sidecar's feature wait, end by it.
    pub(super) deadline: Option<Instant>,
}

impl RingCall<'_> {
    /// The targets' own rows only (the student's requests).
    pub(super) fn own_rows() -> Self {
        Self {
            own_rows_only: true,
            ..Self::default()
        }
    }
}

/// The ring calls of one batch: one per `max_targets` chunk, in order.
pub(super) fn ring_calls(
    ring: &Ring<'_>,
    ids: &[u64],
    call: RingCall<'_>,
) -> Result<Vec<Response>, PredictError> {
    let max_targets = ring
        .client
        .geometry()
        .map(|g| g.max_targets as usize)
        .unwrap_or(1)
        .max(1);
    let mut responses = Vec::with_capacity(ids.len().div_ceil(max_targets));
    for chunk in ids.chunks(max_targets) {
        ring_call_split(ring, chunk, call, &mut responses)?;
    }
    Ok(responses)
}

/// One ring request for `targets`; if its answer does not fit the response
/// area, the two halves are asked for separately (recursively), so that only
/// a target that cannot fit alone fails.
pub(super) fn ring_call_split(
    ring: &Ring<'_>,
    targets: &[u64],
    call: RingCall<'_>,
    responses: &mut Vec<Response>,
) -> Result<(), PredictError> {
    let Ring {
        client,
        schema,
        config,
        metrics,
        ..
    } = *ring;
    let span = daemon_kit::child_span!("ring", targets = targets.len());
    let _traced = span.enter();
    // The sidecar's spans nest under this one (docs/protocol.md, "Trace
    // context"): sent when the trace is sampled.
    let trace = daemon_kit::traces::context_of(&span)
        .filter(|(_, _, sampled)| *sampled)
        .map(
            |(trace_id, parent, sampled)| protocol::request::TraceContext {
                trace_id,
                parent,
                sampled,
            },
        );
    let timeout = match call.deadline {
        Some(deadline) => {
            // The model run and the answer come after the response: a tenth
            // of the time left (at most 5 ms) is kept back for them.
            let left = deadline.saturating_duration_since(Instant::now());
            let left = left - (left / 10).min(Duration::from_millis(5));
            if left.is_zero() {
                return Err(PredictError::DeadlineExceeded(
                    "the call's deadline passed before its ring request: give it more time, or \
                     add replicas"
                        .into(),
                ));
            }
            left.min(config.ring_timeout)
        }
        None => config.ring_timeout,
    };
    let request = CallRequest {
        trace,
        targets,
        fanouts: call.fanouts.unwrap_or(config.fanouts),
        timeout: Some(timeout),
        request_id: REQUEST_ID.fetch_add(1, Ordering::Relaxed),
        own_rows_only: call.own_rows_only,
        fresh: call.fresh,
        hub_h1: call.hub_h1,
        new_node: call.new_node,
        graph: call.graph,
        fresh_at: call.fresh_at,
        accepted: call.accepted,
        seed_times: None,
    };
    metrics.ring_requests.inc();
    let calling = Instant::now();
    let called = client.call(&request);
    metrics
        .ring_wait_seconds
        .observe(calling.elapsed().as_secs_f64());
    let response = match called {
        Ok(response) => response,
        Err(CallError::Status {
            status: status::TOO_LARGE,
            message,
            ..
        }) => {
            if targets.len() == 1 {
                return Err(PredictError::InvalidArgument(format!(
                    "{TOO_LARGE_ALONE} {} does not fit one response of the sidecar ({message}); \
                     ask for smaller fanouts, or raise the sidecar's response_mib or max_nodes",
                    targets[0]
                )));
            }
            metrics.ring_splits.inc();
            let (first, second) = targets.split_at(targets.len() / 2);
            ring_call_split(ring, first, call, responses)?;
            return ring_call_split(ring, second, call, responses);
        }
        // The ring request ran out of the call's own time (waiting for a
        // slot, or for a sidecar still busy with earlier requests, which
        // then finds its deadline passed when it takes it).
        Err(
            e @ (CallError::DeadlineExceeded { .. }
            | CallError::RingFull { .. }
            | CallError::Status {
                status: status::DEADLINE_EXCEEDED,
                ..
            }),
        ) if call.deadline.is_some() => {
            return Err(PredictError::DeadlineExceeded(format!(
                "the call's deadline passed on the ring ({e}): give it more time, or add \
                 replicas"
            )))
        }
        Err(e @ CallError::RingFull { .. }) => return Err(PredictError::Overloaded(e.to_string())),
        // What the caller sent about its new node (an unknown neighbour, an
        // id the graph has, too many edges): the caller's to fix.
        Err(e @ CallError::NewNode(_)) => return Err(PredictError::InvalidArgument(e.to_string())),
        Err(CallError::Status {
            status: status::INVALID_REQUEST,
            message,
            ..
        }) if call.new_node.is_some() => return Err(PredictError::InvalidArgument(message)),
        Err(e) => return Err(PredictError::Unavailable(e.to_string())),
    };
    if let Some(precomputed) = ring.precomputed {
        precomputed.saw_clock(response.header().change_clock);
    }
    if client.schema().is_some_and(|s| s != schema) {
        return Err(PredictError::Unavailable(
            "the sidecar now serves another feature schema or graph version than the \
             model was checked against: restart the worker with a matching model"
                .into(),
        ));
    }
    responses.push(response);
    Ok(())
}
