//! Dynamic batching that never waits for nothing: a call is dispatched at
//! once when an executor is free; calls gather into one batch only while
//! every executor is busy, until one frees up, `max_batch` targets are
//! waiting, or `max_delay` has passed (an upper bound, not a fixed wait).
//! A batch is submitted to the ring as one request per `max_targets` chunk,
//! run through the model on the response buffers in place, and the
//! predictions handed back to each caller.
//!
//! Three stages, so that ring round trips overlap model runs:
//! - **gather** (one tokio task) forms batches;
//! - **ring** (`ring_concurrency` threads) submits a batch's chunks to the
//!   sidecar and waits for the responses: up to `ring_concurrency` batches
//!   are on the ring at once (each response holds its slot until its model
//!   run ends);
//! - **model** (`executors` threads, each with its own ONNX Runtime
//!   session) runs the model on each response in place and answers the
//!   callers.
//!
//! A batch never fails for its size: a ring request answered TOO_LARGE (its
//! merged neighbourhoods do not fit the slot's response area) is split in
//! halves and sent again, down to single targets; only a target whose own
//! neighbourhood cannot fit gets an error naming the limit, and then only
//! the call that asked for it (the batch's other calls are answered
//! separately).
//!
//! "An executor is free" for the batching rule means fewer than
//! `ring_concurrency` batches are between dispatch and answer (on the ring,
//! waiting for a model executor, or in a model run): up to that many are in
//! flight at once, and batches gather while the pipeline is full. A ring
//! thread whose responses find the model stage full waits with them. Nothing runs on the async runtime's workers but the
//! gathering. A model executor that panics answers its batch with an error
//! and retires (its session may be inconsistent); the worker is not ready
//! once no model executor is left.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::client::CallError;
use protocol::client::{Accepted, CallRequest, ClientStatus, Response, RingClient};
use protocol::layout::{status, FeatureSchema, MAX_HOPS};
use protocol::payload::schema::{target_status, HOP2_CACHED, NO_ROW};
use protocol::payload::ResponseTables;
use protocol::request::{NewNode, SubgraphFanouts};
use tokio::sync::{mpsc, oneshot};

use crate::config::WorkerConfig;
use crate::ladder::{Costs, Rung};
use crate::metrics::WorkerMetrics;
use crate::model::{AnsweredBy, Model, OutputKind};
use crate::precomputed::{Precomputed, PrecomputedSet};
use crate::queue::{Place, Waiting};

/// How calls are batched.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// Targets gathered into one batch before it is sent without waiting.
    pub max_batch: usize,
    /// Longest the first call of a batch waits for others.
    pub max_delay: Duration,
    /// Fanouts sent with every dense-layout ring request; `[0, 0]` leaves
    /// them to the sidecar.
    pub fanouts: [u32; MAX_HOPS],
    /// A subgraph-layout model's fanouts, one per hop: its GNN requests ask
    /// for the subgraph layout at these (`None`: a dense-layout model).
    pub subgraph: Option<SubgraphFanouts>,
    /// Deadline of one ring call (sampling + features).
    pub ring_timeout: Duration,
    /// The deadline of a call that brings none.
    pub call_timeout: Duration,
    /// Most targets one client call may ask for.
    pub max_request_targets: usize,
    /// Batches on the ring at once (ring threads).
    pub ring_concurrency: usize,
    /// With a student: calls waiting for the batcher from which a new call
    /// is answered by the student instead (docs/serving.md, "The ladder").
    pub degrade_queue_calls: usize,
    /// The fanouts of the ladder's reduced GNN rung (dense layout); `None`:
    /// no such rung.
    pub degrade_fanouts: Option<[u32; MAX_HOPS]>,
    /// The reduced rung of a subgraph-layout model.
    pub degrade_subgraph: Option<SubgraphFanouts>,
    /// With a precomputed set: whether its answers are served (otherwise
    /// it only feeds the hub embeddings).
    pub precomputed_answers: bool,
    /// With a precomputed set: the smallest degree of the hop-1 nodes whose
    /// stored layer-1 embedding stands in for their neighbourhood; 0: off.
    pub hub_min_degree: u32,
}

impl BatchConfig {
    /// The batching part of the worker's configuration.
    pub fn from_config(config: &WorkerConfig) -> Self {
        Self {
            max_batch: config.max_batch.max(1),
            max_delay: config.max_delay(),
            fanouts: dense_fanouts(config.fanouts.as_ref()).unwrap_or([0; MAX_HOPS]),
            subgraph: None,
            ring_timeout: config.ring_timeout(),
            call_timeout: config.call_timeout(),
            max_request_targets: config.max_request_targets,
            ring_concurrency: config.ring_concurrency.max(1),
            degrade_queue_calls: config.degrade_queue_calls,
            degrade_fanouts: dense_fanouts(config.degrade_fanouts.as_ref()),
            degrade_subgraph: None,
            precomputed_answers: config.precomputed_answers,
            hub_min_degree: config.hub_min_degree,
        }
    }
}

/// Two configured fanouts as the dense layout's; `None` for another count
/// (a subgraph-layout model's, set by the worker from its manifest).
fn dense_fanouts(fanouts: Option<&daemon_kit::config::HopFanouts>) -> Option<[u32; MAX_HOPS]> {
    match fanouts.map(|f| f.0.as_slice()) {
        Some(&[f1, f2]) => Some([f1, f2]),
        _ => None,
    }
}

impl BatchConfig {
    /// Whether the ladder has a reduced GNN rung.
    fn has_reduced(&self) -> bool {
        match self.subgraph {
            Some(_) => self.degrade_subgraph.is_some(),
            None => self.degrade_fanouts.is_some(),
        }
    }
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self::from_config(&WorkerConfig::default())
    }
}

/// One node's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub node_id: u64,
    /// Arg max of the logits; -1 from an embedding model.
    pub label: i32,
    /// Empty from an embedding model.
    pub logits: Vec<f32>,
    /// The node's embedding, from an embedding model (empty otherwise).
    pub embedding: Vec<f32>,
    pub known: bool,
    pub fallback_rows: u32,
    /// The model that computed it.
    pub answered_by: AnsweredBy,
}

impl Prediction {
    /// A known node's prediction from its output row: the label and logits
    /// of a classifier, or an embedding model's vector (label -1).
    pub fn of_row(node_id: u64, row: &[f32], embedding: bool) -> Self {
        let (label, logits, embedding) = if embedding {
            (-1, Vec::new(), row.to_vec())
        } else {
            (argmax(row) as i32, row.to_vec(), Vec::new())
        };
        Self {
            node_id,
            label,
            logits,
            embedding,
            known: true,
            fallback_rows: 0,
            answered_by: AnsweredBy::Gnn,
        }
    }
}

/// Why a call got no predictions.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PredictError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
    /// The worker or its sidecar is saturated: retry after a moment.
    #[error("{0}")]
    Overloaded(String),
    /// The call's deadline passed before it reached the ring.
    #[error("{0}")]
    DeadlineExceeded(String),
}

impl PredictError {
    /// The `kind` label of `gnn_worker_call_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            PredictError::InvalidArgument(_) => "invalid_argument",
            PredictError::Unavailable(_) => "unavailable",
            PredictError::Internal(_) => "internal",
            PredictError::Overloaded(_) => "overloaded",
            PredictError::DeadlineExceeded(_) => "deadline_exceeded",
        }
    }
}

pub use crate::queue::MAX_QUEUED_CALLS;

struct Job {
    ids: Vec<u64>,
    /// A node the graph does not have; `ids` is its id alone.
    new_node: Option<NewNode>,
    /// `Full` or `Reduced` (the student's calls never queue).
    rung: Rung,
    enqueued: Instant,
    /// When a call still waiting for a ring thread is dropped: after the
    /// worker's `call_timeout_ms`, or its own deadline if that is later (a
    /// deadline that nothing fits is the ladder's to answer on its
    /// cheapest rung, and a gRPC call past it is ended by the server).
    deadline: Instant,
    /// Its place among its lane's waiting calls, until a thread takes it.
    place: Place,
    /// Counted on the sidecar until the call is answered: a drain waits for
    /// it, and its ring requests are submitted while DRAINING.
    accepted: Accepted,
    reply: oneshot::Sender<Result<Vec<Prediction>, PredictError>>,
}

/// A queue of calls for the batcher: its channel and the count of the calls
/// that wait in it (bounded: docs/serving.md, "Overload").
#[derive(Clone)]
struct Lane {
    jobs: mpsc::Sender<Job>,
    waiting: Arc<Waiting>,
}

/// The batching front of the worker. Cheap to clone.
#[derive(Clone)]
pub struct Predictor {
    jobs: Lane,
    config: Arc<BatchConfig>,
    metrics: Arc<WorkerMetrics>,
    client: Arc<RingClient>,
    schema: FeatureSchema,
    /// The MLP student's lane: its own queue, gathered into batches like
    /// the GNN's and answered by one thread (docs/serving.md, "The ladder").
    student: Option<Lane>,
    /// Precomputed answers, when the worker has them.
    precomputed: Option<Arc<Precomputed>>,
    /// What the GNN's output rows are (and so the stored answers).
    output: OutputKind,
    /// What each rung of the ladder costs.
    costs: Arc<Costs>,
}

impl std::fmt::Debug for Predictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Predictor")
            .field("config", &self.config)
            .finish()
    }
}

/// How many executors can take a batch now: dispatching claims one (the
/// count may go below zero when `max_delay` forces a batch into the queue),
/// an executor that finishes a batch gives it back and says so.
#[derive(Debug, Default)]
struct Capacity {
    free: std::sync::atomic::AtomicIsize,
    freed: tokio::sync::Notify,
}

impl Capacity {
    fn has_free(&self) -> bool {
        self.free.load(Ordering::Acquire) > 0
    }

    fn release(&self) {
        self.free.fetch_add(1, Ordering::AcqRel);
        self.freed.notify_one();
    }
}

/// Decrements the live-executor count when its thread ends, however it ends.
struct Alive(Arc<WorkerMetrics>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.executors_alive.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Predictor {
    /// Starts the batching task (on the current tokio runtime) and one
    /// executor thread per model session. `schema` is the segment header the
    /// models were checked against: a sidecar that comes back with another
    /// one makes the worker not ready.
    pub fn start(
        client: Arc<RingClient>,
        models: Vec<Model>,
        student: Option<Model>,
        precomputed: Option<Arc<Precomputed>>,
        schema: FeatureSchema,
        config: BatchConfig,
        metrics: Arc<WorkerMetrics>,
    ) -> std::io::Result<Self> {
        let config = Arc::new(config);
        let output = models
            .first()
            .map_or(OutputKind::Classes, |m| m.manifest().output);
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>(MAX_QUEUED_CALLS);
        let (batch_tx, batch_rx) = std_mpsc::channel::<Vec<Job>>();
        let batch_rx = Arc::new(Mutex::new(batch_rx));
        // The model stage takes at most one waiting batch per executor: a
        // ring thread with responses for a full stage waits (and keeps its
        // slots) instead of piling responses up.
        let (ready_tx, ready_rx) = std_mpsc::sync_channel::<RingDone>(models.len());
        let ready_rx = Arc::new(Mutex::new(ready_rx));
        let capacity = Arc::new(Capacity::default());
        let costs = Arc::new(Costs::default());
        capacity
            .free
            .store(config.ring_concurrency as isize, Ordering::Release);
        for i in 0..config.ring_concurrency {
            let (client, config, metrics, rx, tx, capacity) = (
                client.clone(),
                config.clone(),
                metrics.clone(),
                batch_rx.clone(),
                ready_tx.clone(),
                capacity.clone(),
            );
            let (precomputed, costs) = (precomputed.clone(), costs.clone());
            std::thread::Builder::new()
                .name(format!("ring-{i}"))
                .spawn(move || {
                    let ring = Ring {
                        client: &client,
                        schema,
                        config: &config,
                        metrics: &metrics,
                        precomputed: precomputed.as_deref(),
                        costs: &costs,
                    };
                    ring_stage(&ring, &rx, &tx, &capacity)
                })?;
        }
        drop(ready_tx);
        for (i, model) in models.into_iter().enumerate() {
            let (metrics, rx, capacity) = (metrics.clone(), ready_rx.clone(), capacity.clone());
            let costs = costs.clone();
            metrics.executors_alive.fetch_add(1, Ordering::AcqRel);
            let alive = Alive(metrics.clone());
            std::thread::Builder::new()
                .name(format!("executor-{i}"))
                .spawn(move || {
                    let _alive = alive;
                    model_stage(model, &metrics, &costs, &rx, &capacity)
                })?;
        }
        tokio::spawn(gather(
            jobs_rx,
            batch_tx,
            config.clone(),
            metrics.clone(),
            capacity,
        ));
        let student_lane = match student {
            None => None,
            Some(student) => {
                let (lane_tx, lane_rx) = mpsc::channel::<Job>(MAX_QUEUED_CALLS);
                let (batch_tx, batch_rx) = std_mpsc::channel::<Vec<Job>>();
                // One student batch in flight: the next gathers meanwhile.
                let capacity = Arc::new(Capacity::default());
                capacity.free.store(1, Ordering::Release);
                let (client, config2, metrics2, precomputed, costs, capacity2) = (
                    client.clone(),
                    config.clone(),
                    metrics.clone(),
                    precomputed.clone(),
                    costs.clone(),
                    capacity.clone(),
                );
                std::thread::Builder::new()
                    .name("student".into())
                    .spawn(move || {
                        let ring = Ring {
                            client: &client,
                            schema,
                            config: &config2,
                            metrics: &metrics2,
                            precomputed: precomputed.as_deref(),
                            costs: &costs,
                        };
                        student_stage(&ring, student, &batch_rx, &capacity2)
                    })?;
                tokio::spawn(gather(
                    lane_rx,
                    batch_tx,
                    config.clone(),
                    metrics.clone(),
                    capacity,
                ));
                Some(Lane {
                    jobs: lane_tx,
                    waiting: Arc::new(Waiting::default()),
                })
            }
        };
        Ok(Self {
            jobs: Lane {
                jobs: jobs_tx,
                waiting: Arc::new(Waiting::default()),
            },
            config,
            metrics,
            client,
            schema,
            student: student_lane,
            precomputed,
            output,
            costs,
        })
    }

    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// The ring client (for re-attaching while idle).
    pub fn client(&self) -> &Arc<RingClient> {
        &self.client
    }

    /// Ready: attached to a sidecar that is not draining, whose schema is
    /// the one the model was checked against, with an executor alive.
    pub fn readiness(&self) -> Result<(), String> {
        match self.client.status() {
            ClientStatus::Ready => {}
            ClientStatus::Draining => {
                return Err("the sidecar is draining: it takes no new requests".into())
            }
            ClientStatus::Lost(reason) => return Err(format!("the sidecar is gone: {reason}")),
            ClientStatus::NotAttached => return Err("not attached to a sidecar".into()),
        }
        if self.client.schema() != Some(self.schema) {
            return Err(
                "the sidecar now serves another feature schema or graph version than \
                        the model was checked against: restart the worker with a matching model"
                    .into(),
            );
        }
        if self.metrics.executors_alive.load(Ordering::Acquire) == 0 {
            return Err(
                "no executor is alive (each was retired after a panic; see the log): \
                        restart the worker"
                    .into(),
            );
        }
        Ok(())
    }

    /// Predicts `ids` (batched with concurrent calls); `left`: the time
    /// before the call's deadline, if it has one (the ladder's input).
    pub async fn predict(
        &self,
        ids: Vec<u64>,
        left: Option<Duration>,
    ) -> Result<Vec<Prediction>, PredictError> {
        if ids.is_empty() {
            return Err(PredictError::InvalidArgument(
                "a call with no node ids: send 1 or more node_ids (or a new_node)".into(),
            ));
        }
        if ids.len() > self.config.max_request_targets {
            return Err(PredictError::InvalidArgument(format!(
                "{} node ids in one call; at most {} (split the call, or raise the worker's \
                 max_request_targets, --max-request-targets)",
                ids.len(),
                self.config.max_request_targets
            )));
        }
        self.enqueue(ids, None, left).await
    }

    /// Predicts a node the graph does not have, from its feature row and
    /// its edges to known nodes, without adding it (docs/serving.md, "A new
    /// node in one call"): the sidecar samples as if it had been added
    /// (`NEW_NODE`), so the answer is the one the node gets once added with
    /// the same edges.
    pub async fn predict_new_node(
        &self,
        id: u64,
        node: NewNode,
        left: Option<Duration>,
    ) -> Result<Vec<Prediction>, PredictError> {
        let problem = self.client.geometry().and_then(|geometry| {
            protocol::request::new_node_problem(&node, &geometry, &self.schema)
        });
        if let Some(problem) = problem {
            return Err(PredictError::InvalidArgument(problem));
        }
        self.enqueue(vec![id], Some(node), left).await
    }

    /// Answers a checked call on the rung the ladder picks (docs/serving.md,
    /// "The ladder"); when the sidecar is unavailable, from the precomputed
    /// answers unchecked if they hold every node.
    async fn enqueue(
        &self,
        ids: Vec<u64>,
        new_node: Option<NewNode>,
        left: Option<Duration>,
    ) -> Result<Vec<Prediction>, PredictError> {
        if let Err(why) = self.readiness() {
            return self.unchecked(&ids).ok_or(PredictError::Unavailable(why));
        }
        // Kept for the fallback only when there are stored answers.
        let fallback = self.precomputed.is_some().then(|| ids.clone());
        let result = self.climb(ids, new_node, left).await;
        match (result, fallback) {
            (Err(PredictError::Unavailable(why)), Some(ids)) => {
                self.unchecked(&ids).ok_or(PredictError::Unavailable(why))
            }
            (result, _) => result,
        }
    }

    /// The ladder's choice, and the call on that rung.
    async fn climb(
        &self,
        ids: Vec<u64>,
        new_node: Option<NewNode>,
        left: Option<Duration>,
    ) -> Result<Vec<Prediction>, PredictError> {
        let waiting = self.jobs.waiting.count();
        let mut available = vec![Rung::Full];
        if self.config.has_reduced() && new_node.is_none() {
            available.push(Rung::Reduced);
        }
        if self.student.is_some() {
            available.push(Rung::Student);
        }
        let rung = if self.student.is_some() && waiting >= self.config.degrade_queue_calls {
            Rung::Student
        } else {
            left.map_or(Rung::Full, |left| {
                self.costs.choose(left, waiting, &available)
            })
        };
        let lane = match (rung, &self.student) {
            (Rung::Student, Some(lane)) => lane,
            _ => &self.jobs,
        };
        // A bounded count of waiting calls, never a wait for room: one more
        // is an explicit overload error the caller can retry elsewhere.
        let overloaded = || {
            PredictError::Overloaded(format!(
                "the worker is saturated ({MAX_QUEUED_CALLS} calls already wait for the \
                 batcher); retry after a moment, or add replicas"
            ))
        };
        let place = lane.waiting.place().ok_or_else(overloaded)?;
        // Accepted on the sidecar, or refused now if it began to drain.
        let accepted = self
            .client
            .accept()
            .map_err(|e| PredictError::Unavailable(e.to_string()))?;
        let (reply, answer) = oneshot::channel();
        let enqueued = Instant::now();
        lane.jobs
            .try_send(Job {
                ids,
                new_node,
                rung,
                enqueued,
                deadline: enqueued + left.unwrap_or_default().max(self.config.call_timeout),
                place,
                accepted,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => overloaded(),
                mpsc::error::TrySendError::Closed(_) => {
                    PredictError::Unavailable("the worker is shutting down".into())
                }
            })?;
        answer.await.map_err(|_| {
            PredictError::Unavailable(
                "no executor took the call (all retired): restart the worker".into(),
            )
        })?
    }

    /// The precomputed answers of `ids`, unchecked (the sidecar cannot say
    /// whether they stand), if the set in use holds every one.
    fn unchecked(&self, ids: &[u64]) -> Option<Vec<Prediction>> {
        let store = self.precomputed.as_ref()?.current()?;
        if ids.is_empty() || !store.covers(ids) || !self.config.precomputed_answers {
            return None;
        }
        let embedding = self.output == OutputKind::Embedding;
        Some(
            ids.iter()
                .map(|&id| {
                    let row = store.logits(id).expect("covered");
                    let mut prediction = Prediction::of_row(id, row, embedding);
                    prediction.answered_by = AnsweredBy::PrecomputedUnchecked;
                    prediction
                })
                .collect(),
        )
    }
}

/// The student's thread: takes the student lane's batches, asks for their
/// targets' own rows (`OWN_ROWS_ONLY`; each new node in a request of its
/// own), runs the student on them and answers the callers.
fn student_stage(
    ring: &Ring<'_>,
    mut student: Model,
    batches: &std_mpsc::Receiver<Vec<Job>>,
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
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let known: Vec<u64> = batch
                .iter()
                .filter(|j| j.new_node.is_none())
                .flat_map(|j| j.ids.iter().copied())
                .collect();
            let own_rows = RingCall {
                accepted: batch.first().map(|job| &job.accepted),
                ..RingCall::own_rows()
            };
            let mut responses = ring_calls(ring, &known, own_rows)?;
            for job in batch.iter().filter(|j| j.new_node.is_some()) {
                let call = RingCall {
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

/// A thread takes `batch` at `now`: every call gives its place back, and
/// the calls nobody waits for any more are dropped before the ring (docs/
/// serving.md, "Overload"): those whose caller has gone (an HTTP client
/// that closed its connection, a gRPC call ended at its deadline) and those
/// that waited past [`Job::deadline`] (answered DEADLINE_EXCEEDED).
fn take_live(batch: Vec<Job>, now: Instant, metrics: &WorkerMetrics) -> Vec<Job> {
    let mut live = Vec::with_capacity(batch.len());
    for mut job in batch {
        job.place.release();
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

/// Moves every job already queued into `batch`, up to `max_batch` targets.
fn take_queued(
    jobs: &mut mpsc::Receiver<Job>,
    batch: &mut Vec<Job>,
    n: &mut usize,
    max_batch: usize,
) {
    while *n < max_batch {
        match jobs.try_recv() {
            Ok(job) => {
                *n += job.ids.len();
                batch.push(job);
            }
            Err(_) => return,
        }
    }
}

async fn gather(
    mut jobs: mpsc::Receiver<Job>,
    batches: std_mpsc::Sender<Vec<Job>>,
    config: Arc<BatchConfig>,
    metrics: Arc<WorkerMetrics>,
    capacity: Arc<Capacity>,
) {
    while let Some(first) = jobs.recv().await {
        let mut n = first.ids.len();
        let mut batch = vec![first];
        // Calls that arrived together go together, whatever the executors do.
        take_queued(&mut jobs, &mut batch, &mut n, config.max_batch);
        if !capacity.has_free() && n < config.max_batch {
            // Every executor is busy: gather until one frees up, the batch is
            // full, or max_delay has passed.
            metrics.batches_waited.inc();
            let until = tokio::time::sleep(config.max_delay);
            tokio::pin!(until);
            loop {
                let freed = capacity.freed.notified();
                tokio::pin!(freed);
                // Registered before the check, so a release in between is
                // not missed.
                freed.as_mut().enable();
                if capacity.has_free() || n >= config.max_batch {
                    break;
                }
                tokio::select! {
                    biased;
                    () = &mut freed => {}
                    job = jobs.recv() => match job {
                        Some(job) => {
                            n += job.ids.len();
                            batch.push(job);
                            take_queued(&mut jobs, &mut batch, &mut n, config.max_batch);
                        }
                        None => break,
                    },
                    () = &mut until => {
                        metrics.batches_delayed.inc();
                        break;
                    }
                }
            }
        }
        capacity.free.fetch_sub(1, Ordering::AcqRel);
        metrics.batches.inc();
        metrics.batch_targets.observe(n as f64);
        metrics.batch_calls.observe(batch.len() as f64);
        if batches.send(batch).is_err() {
            return;
        }
    }
}

/// A batch whose ring round trips are done: its callers, its ids, and the
/// responses (one per chunk, in order) or why there are none.
struct RingDone {
    batch: Vec<Job>,
    ids: Vec<u64>,
    responses: Result<Vec<Response>, PredictError>,
    /// Whether answering this gives the batch's pipeline place back (the
    /// last part of a batch that was split per call).
    releases: bool,
    /// The precomputed set the ring calls asked about (`FRESH` targets are
    /// answered from it).
    store: Option<Arc<PrecomputedSet>>,
    /// When the ring stage took the batch.
    taken: Instant,
}

/// What a ring call needs of the worker.
struct Ring<'a> {
    client: &'a RingClient,
    schema: FeatureSchema,
    config: &'a BatchConfig,
    metrics: &'a WorkerMetrics,
    precomputed: Option<&'a Precomputed>,
    costs: &'a Costs,
}

/// A ring call failed because one target's own neighbourhood does not fit
/// the response area, however the batch is split.
fn is_too_large_alone(result: &Result<Vec<Response>, PredictError>) -> bool {
    matches!(result, Err(PredictError::InvalidArgument(m)) if m.starts_with(TOO_LARGE_ALONE))
}

const TOO_LARGE_ALONE: &str = "the sampled neighbourhood of node";

/// The description of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Sends every caller of `batch` its share of `result`.
/// `timed`: the ladder's costs and when the batch was dispatched, to
/// measure each call's rung.
fn answer(
    batch: Vec<Job>,
    ids: &[u64],
    result: Result<Vec<Prediction>, PredictError>,
    metrics: &WorkerMetrics,
    timed: Option<(&Costs, Instant)>,
) {
    let result = result.and_then(|predictions| {
        if predictions.len() == ids.len() {
            Ok(predictions)
        } else {
            Err(PredictError::Internal(format!(
                "{} predictions for {} targets: the sidecar's response does not match the \
                 request",
                predictions.len(),
                ids.len()
            )))
        }
    });
    if result.is_err() {
        metrics.batch_errors.inc();
    }
    let mut offset = 0;
    for job in batch {
        let n = job.ids.len();
        let answer = match &result {
            Ok(predictions) => {
                let mut mine = predictions[offset..offset + n].to_vec();
                if job.rung == Rung::Reduced {
                    for p in &mut mine {
                        if p.answered_by == AnsweredBy::Gnn {
                            p.answered_by = AnsweredBy::GnnReduced;
                        }
                    }
                }
                if let Some((costs, dispatched)) = timed {
                    costs.observe(job.rung, dispatched.elapsed());
                }
                Ok(mine)
            }
            Err(e) => Err(e.clone()),
        };
        offset += n;
        let _ = job.reply.send(answer);
    }
}

/// A ring thread: takes batches, makes their ring calls, hands the
/// responses to the model stage.
fn ring_stage(
    ring: &Ring<'_>,
    batches: &Mutex<std_mpsc::Receiver<Vec<Job>>>,
    ready: &std_mpsc::SyncSender<RingDone>,
    capacity: &Capacity,
) {
    let metrics = ring.metrics;
    loop {
        let batch = {
            let rx = batches.lock().unwrap_or_else(|p| p.into_inner());
            match rx.recv() {
                Ok(batch) => batch,
                Err(_) => return,
            }
        };
        let taken = Instant::now();
        let batch = take_live(batch, taken, metrics);
        if batch.is_empty() {
            // Every call of it was dropped: nothing goes to the ring.
            capacity.release();
            continue;
        }
        if let ClientStatus::Lost(reason) = ring.client.status() {
            // The sidecar is gone: its calls fail now rather than wait
            // `ring_timeout` for a new one (the worker is not ready).
            let ids: Vec<u64> = batch.iter().flat_map(|j| j.ids.iter().copied()).collect();
            let gone = PredictError::Unavailable(format!("the sidecar is gone: {reason}"));
            answer(batch, &ids, Err(gone), metrics, None);
            capacity.release();
            continue;
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
        let ids: Vec<u64> = batch.iter().flat_map(|j| j.ids.iter().copied()).collect();
        metrics.targets.inc_by(ids.len() as u64);
        let call = |jobs: &[Job]| {
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
        let mut parts = Vec::new();
        if batch.len() > 1 && is_too_large_alone(&responses) {
            // One call's target cannot fit: answer every call on its own,
            // so that only that call gets the error.
            drop(responses);
            let n = batch.len();
            for (i, job) in batch.into_iter().enumerate() {
                let ids = job.ids.clone();
                let job = [job];
                let responses = call(&job);
                let [job] = job;
                parts.push(RingDone {
                    batch: vec![job],
                    ids,
                    responses,
                    releases: i + 1 == n,
                    store: store.clone(),
                    taken,
                });
            }
        } else {
            parts.push(RingDone {
                batch,
                ids,
                responses,
                releases: true,
                store,
                taken,
            });
        }
        for done in parts {
            if let Err(std_mpsc::SendError(done)) = ready.send(done) {
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
        }
    }
}

/// A model executor: runs the model on each batch's responses in place and
/// answers its callers.
fn model_stage(
    mut model: Model,
    metrics: &WorkerMetrics,
    costs: &Costs,
    ready: &Mutex<std_mpsc::Receiver<RingDone>>,
    capacity: &Capacity,
) {
    loop {
        let done = {
            let rx = ready.lock().unwrap_or_else(|p| p.into_inner());
            match rx.recv() {
                Ok(done) => done,
                Err(_) => return,
            }
        };
        let RingDone {
            batch,
            ids,
            responses,
            releases,
            store,
            taken,
        } = done;
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fail::fail_point!("gnn-worker-executor");
            responses.and_then(|responses| {
                run_model(&mut model, metrics, &ids, responses, store.as_deref())
            })
        }));
        let (result, retire) = match ran {
            Ok(result) => (result, false),
            Err(panic) => {
                let what = panic_text(&*panic);
                tracing::error!(panic = %what, "an executor panicked; its batch gets an error and it retires");
                metrics.executor_panics.inc();
                (
                    Err(PredictError::Internal(format!(
                        "the executor running this call failed ({what}); retry"
                    ))),
                    true,
                )
            }
        };
        answer(batch, &ids, result, metrics, Some((costs, taken)));
        if releases {
            capacity.release();
        }
        if retire {
            return;
        }
    }
}

static REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// How a job goes to the ring, in this order: its nodes all have a
/// precomputed answer (asked `FRESH_SINCE`; `answers` is the set when its
/// answers are served), known nodes, known nodes at the ladder's reduced
/// fanouts, a new node.
fn job_kind(job: &Job, answers: Option<&PrecomputedSet>) -> u8 {
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
fn jobs_ring_calls(
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
        subgraph: ring.config.subgraph,
        accepted: jobs.first().map(|job| &job.accepted),
        ..RingCall::default()
    };
    let mut responses = ring_calls(
        ring,
        &ids_of(0),
        RingCall {
            fresh: since,
            hub_h1,
            ..gnn
        },
    )?;
    let known = RingCall { hub_h1, ..gnn };
    responses.extend(ring_calls(ring, &ids_of(1), known)?);
    let reduced = RingCall {
        fanouts: ring.config.degrade_fanouts,
        subgraph: ring.config.degrade_subgraph,
        hub_h1,
        ..gnn
    };
    responses.extend(ring_calls(ring, &ids_of(2), reduced)?);
    for job in jobs {
        if let Some(node) = &job.new_node {
            let call = RingCall {
                new_node: Some(node),
                ..gnn
            };
            ring_call_split(ring, &job.ids, call, &mut responses)?;
        }
    }
    Ok(responses)
}

/// What a ring request asks for besides its targets.
#[derive(Debug, Clone, Copy, Default)]
struct RingCall<'a> {
    /// `OWN_ROWS_ONLY`.
    own_rows_only: bool,
    /// `NEW_NODE`: the one target is this node.
    new_node: Option<&'a NewNode>,
    /// `FRESH_SINCE`: unchanged targets come back `FRESH`.
    fresh: Option<protocol::request::FreshSince>,
    /// `HUB_H1`: unchanged hubs come without their neighbourhood.
    hub_h1: Option<protocol::request::HubH1>,
    /// Fanouts other than the worker's (the ladder's reduced rung).
    fanouts: Option<[u32; MAX_HOPS]>,
    /// The subgraph layout at these fanouts (a subgraph-layout model's
    /// GNN requests).
    subgraph: Option<SubgraphFanouts>,
    /// One of the batch's calls, accepted on the sidecar: the requests are
    /// submitted while it drains.
    accepted: Option<&'a Accepted>,
}

impl RingCall<'_> {
    /// The targets' own rows only (the student's requests).
    fn own_rows() -> Self {
        Self {
            own_rows_only: true,
            ..Self::default()
        }
    }
}

/// The ring calls of one batch: one per `max_targets` chunk, in order.
fn ring_calls(
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
fn ring_call_split(
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
    let request = CallRequest {
        targets,
        fanouts: call.fanouts.unwrap_or(config.fanouts),
        timeout: Some(config.ring_timeout),
        request_id: REQUEST_ID.fetch_add(1, Ordering::Relaxed),
        own_rows_only: call.own_rows_only,
        fresh: call.fresh,
        hub_h1: call.hub_h1,
        new_node: call.new_node,
        subgraph: call.subgraph,
        accepted: call.accepted,
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

/// Runs the model on each response of a batch whose targets are `ids`.
fn run_model(
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
fn run_one(
    model: &mut Model,
    metrics: &WorkerMetrics,
    ids: &[u64],
    offset: &mut usize,
    response: &Response,
    store: Option<&PrecomputedSet>,
    out: &mut Vec<Prediction>,
) -> Result<(), PredictError> {
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
            .map_err(|e| PredictError::Internal(e.to_string()))?;
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

/// The model's `hop1_h1` input for a response: empty when no hop-1 slot
/// came without its neighbourhood, else `n_targets x f1 x hidden` with the
/// stored layer-1 embedding of each such slot's node (zeros elsewhere).
fn hub_embeddings(
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
struct FallbackCounter {
    any: bool,
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
fn subgraph_fallback_rows(tables: &ResponseTables, t: usize, hops: usize) -> u32 {
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
fn fallback_rows(tables: &ResponseTables, t: usize) -> u32 {
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
