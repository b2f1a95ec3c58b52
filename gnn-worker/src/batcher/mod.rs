//! Dynamic batching that never waits for nothing: a call is dispatched at
//! once when an executor is free; calls gather into one batch only while
//! every executor is busy, until one frees up, `max_batch` targets are
//! waiting, or `max_delay` has passed (an upper bound, not a fixed wait).
//! A batch is submitted to the ring as one request per `max_targets` chunk,
//! run through the model on the response buffers in place, and the
//! predictions handed back to each caller.
//!
//! Three stages, so that ring round trips overlap model runs, a module each:
//! - **gather** (`gather.rs`, one tokio task) forms batches by the batching
//!   rule;
//! - **ring** (`ring_stage.rs`, `ring_concurrency` threads) submits a
//!   batch's chunks to the sidecar and waits for the responses: up to
//!   `ring_concurrency` batches are on the ring at once (each response
//!   holds its slot until its model run ends);
//! - **model** (`model_stage.rs`, `executors` threads) runs the model on
//!   each response in place and answers the callers. The MLP student's
//!   lane has a gather task of its own and one thread that does both of the
//!   other stages.
//!
//! The ONNX Runtime sessions (`sessions.rs`, one per executor) are shared:
//! whoever runs a batch takes the idle one used most recently. A call that
//! finds the worker idle (no call waiting, room in the pipeline, a session
//! idle) runs to completion on the runtime thread that took it
//! (`Predictor::run_to_completion`): the same ring call and model run, no
//! hand-off between threads. At most one call at a time does (one runtime
//! thread always stays free), and the batching rule is unchanged.
//!
//! This module holds the front ([`Predictor`]: the ladder's choice of rung,
//! from [`crate::ladder`], the bounded queues, accepting a call on the
//! sidecar) and what the stages share. The stages pass batches over
//! multi-consumer channels (crossbeam).
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
//! thread whose responses find the model stage full waits with them.
//! Nothing runs on the async runtime's workers but the gathering and the
//! run-to-completion path. A run that panics answers its batch with an
//! error and retires its session (its state may be inconsistent), and an
//! executor with it; the worker is not ready once no session is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::client::{Accepted, ClientStatus, RingClient};
use protocol::layout::{FeatureSchema, MAX_HOPS};
use protocol::request::{GraphAsk, NewNode};
use tokio::sync::{mpsc, oneshot};

use crate::config::WorkerConfig;
use crate::ladder::{Costs, Rung, Rungs};
use crate::metrics::WorkerMetrics;
use crate::model::{AnsweredBy, Model, ModelIdentity, OutputKind};
use crate::precomputed::Precomputed;
use crate::queue::{Place, Waiting};

mod gather;
mod model_stage;
mod ring_stage;
mod sessions;
mod slots;

use gather::{gather, Capacity, Rule, Targets};
pub use model_stage::argmax;
use model_stage::{model_stage, run_part, student_stage, Ran};
use ring_stage::{ring_batch, ring_stage, Ring, RingDone};

/// The ring slots every predictor of this process reserves from (old and
/// new model alike during a rollout: they share one sidecar's ring).
static SLOTS: std::sync::LazyLock<Arc<slots::SlotBudget>> = std::sync::LazyLock::new(Arc::default);

tokio::task_local! {
    /// Set on a task that reads further calls while its calls run (a gRPC
    /// stream's driver, which answers many calls of one stream at once):
    /// none of its calls runs to completion, which would hold the task and
    /// stop it reading its stream meanwhile.
    static PIPELINED: ();
}

/// Runs `future` with every call it makes sent through the pipeline's
/// threads, never run to completion on its task's thread (see
/// `PIPELINED`).
pub fn through_the_pipeline<F: std::future::Future>(
    future: F,
) -> impl std::future::Future<Output = F::Output> {
    PIPELINED.scope((), future)
}

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
    /// A graph-layout model's ask (a typed graph's: target type, fanouts
    /// per edge type and hop; a one-type graph's: one fanout per hop): its
    /// GNN requests ask for the graph layout at it (`None`: a dense-layout
    /// model).
    pub graph: Option<std::sync::Arc<GraphAsk>>,
    /// Deadline of one ring call (sampling + features).
    pub ring_timeout: Duration,
    /// The deadline of a call that brings none.
    pub call_timeout: Duration,
    /// Most targets one client call may ask for.
    pub max_request_targets: usize,
    /// Batches on the ring at once (ring threads).
    pub ring_concurrency: usize,
    /// Whether a call that finds the worker idle runs to completion on the
    /// thread that took it.
    pub run_to_completion: bool,
    /// With a student: calls waiting for the batcher from which a new call
    /// is answered by the student instead (docs/serving.md, "The ladder").
    pub degrade_queue_calls: usize,
    /// The fanouts of the ladder's reduced GNN rung (dense layout); `None`:
    /// no such rung.
    pub degrade_fanouts: Option<[u32; MAX_HOPS]>,
    /// The reduced rung of a one-type graph's graph-layout model.
    pub degrade_graph: Option<std::sync::Arc<GraphAsk>>,
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
            graph: None,
            ring_timeout: config.ring_timeout(),
            call_timeout: config.call_timeout(),
            max_request_targets: config.max_request_targets,
            ring_concurrency: config.ring_concurrency.max(1),
            run_to_completion: config.run_to_completion,
            degrade_queue_calls: config.degrade_queue_calls,
            degrade_fanouts: dense_fanouts(config.degrade_fanouts.as_ref()),
            degrade_graph: None,
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
    /// Fits the settings to the sidecar's ring, each with a warning naming
    /// it: at most `slots` batches on the ring at once, and at most the
    /// targets a whole ring of requests holds in one call (a call's
    /// requests hold their slots until its model run ends, so a larger
    /// one could never be answered; it is refused by name instead).
    pub fn fit_to_ring(&mut self, geometry: &protocol::Geometry) {
        let slots = geometry.slot_count as usize;
        if self.ring_concurrency > slots {
            tracing::warn!(
                ring_concurrency = self.ring_concurrency,
                slots,
                "ring_concurrency exceeds the ring's slots; using the slot count"
            );
            self.ring_concurrency = slots;
        }
        let ring_targets = slots * (geometry.max_targets as usize).max(1);
        if self.max_request_targets > ring_targets {
            tracing::warn!(
                max_request_targets = self.max_request_targets,
                slots,
                max_targets = geometry.max_targets,
                "max_request_targets exceeds what the sidecar's ring holds at once (slots x \
                 max_targets); calls of more targets are refused naming the limit: raise the \
                 sidecar's slots, or lower max_request_targets"
            );
            self.max_request_targets = ring_targets;
        }
    }

    /// Whether the ladder has a reduced GNN rung.
    fn has_reduced(&self) -> bool {
        match self.graph {
            Some(_) => self.degrade_graph.is_some(),
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
    /// Whether the answer is less than the model's on the node's full,
    /// current data: some row it read was the default (missing, late or
    /// unreachable: `fallback_rows` > 0, an unknown node's own row
    /// included), or a rung below the GNN answered it (docs/serving.md,
    /// "Degraded answers").
    pub fn degraded(&self) -> bool {
        self.fallback_rows > 0 || self.answered_by.is_step_down()
    }

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
    /// The call's deadline passed before it was answered.
    #[error("{0}")]
    DeadlineExceeded(String),
}

impl PredictError {
    /// The HTTP status of this error, in every HTTP door (the native API
    /// and the Open Inference Protocol; docs/serving.md's table). An
    /// overload also gets `Retry-After: 1` ([`PredictError::retry_after`]).
    pub fn http_status(&self) -> http::StatusCode {
        match self {
            PredictError::InvalidArgument(_) => http::StatusCode::BAD_REQUEST,
            PredictError::Unavailable(_) | PredictError::Overloaded(_) => {
                http::StatusCode::SERVICE_UNAVAILABLE
            }
            PredictError::Internal(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            PredictError::DeadlineExceeded(_) => http::StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Whether the answer carries `Retry-After: 1`: the caller may try
    /// again in a moment.
    pub fn retry_after(&self) -> bool {
        matches!(self, PredictError::Overloaded(_))
    }

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

/// A new node's edges as a call gives them (docs/serving.md, "A new node in
/// one call").
#[derive(Debug, Clone, PartialEq)]
pub enum NewEdges {
    /// A one-type graph's: an edge to each neighbour, from the new node and,
    /// unless `directed`, back to it.
    Neighbors { neighbors: Vec<u64>, directed: bool },
    /// Per edge type, named by its key `src__relation__dst` or a relation
    /// only one edge type has, `(src, dst)` pairs (a one-type graph's one
    /// edge type is `node__to__node`).
    Named(NamedEdges),
}

/// A new node's edges per named edge type: `(edge type, [(src, dst)])`.
pub type NamedEdges = Vec<(String, Vec<(u64, u64)>)>;

impl NewEdges {
    /// New node `id` with `features` and these edges as `graph`'s (a
    /// one-type graph's: the 1x1 graph's; `typed`: a typed graph's), or
    /// what is wrong, named.
    pub fn resolve(
        self,
        id: u64,
        features: Vec<f32>,
        graph: &protocol::graph_schema::GraphSchema,
        typed: bool,
    ) -> Result<NewNode, String> {
        let named = match self {
            NewEdges::Neighbors { .. } if typed => {
                return Err(
                    "this model's graph is typed: a new node gives its edges per edge \
                            type (`edges`, docs/serving.md, \"A new node in one call\"), not \
                            `neighbors`"
                        .into(),
                )
            }
            NewEdges::Neighbors {
                neighbors,
                directed,
            } => return Ok(NewNode::one_type(id, features, &neighbors, directed)),
            NewEdges::Named(named) => named,
        };
        let n_edge_types = graph.edge_types.len();
        let mut edges = vec![Vec::new(); n_edge_types];
        for (name, pairs) in named {
            let e = (0..n_edge_types)
                .find(|&e| graph.edge_key(e) == name)
                .or_else(|| {
                    let mut by_relation =
                        (0..n_edge_types).filter(|&e| graph.edge_types[e].relation == name);
                    match (by_relation.next(), by_relation.next()) {
                        (Some(e), None) => Some(e),
                        _ => None,
                    }
                })
                .ok_or_else(|| {
                    let keys: Vec<String> = (0..n_edge_types).map(|e| graph.edge_key(e)).collect();
                    format!(
                        "the new node's edges name edge type {name:?}; this graph's edge types \
                         are {} (or a relation only one of them has)",
                        keys.join(", ")
                    )
                })?;
            edges[e].extend(pairs);
        }
        Ok(NewNode { features, edges })
    }
}

struct Job {
    ids: Vec<u64>,
    /// A node the graph does not have; `ids` is its id alone.
    new_node: Option<NewNode>,
    /// `Full` or `Reduced` (the student's calls never queue).
    rung: Rung,
    enqueued: Instant,
    /// When a call still waiting for a ring thread is dropped: after the
    /// worker's `call_timeout_ms`, or its own deadline if that is later (a
    /// call past its own deadline was answered DEADLINE_EXCEEDED then, and
    /// is dropped as gone).
    deadline: Instant,
    /// The caller's own deadline, when it gave one (`grpc-timeout`,
    /// `timeout_ms`, V2's `timeout`): it bounds the ring requests of the
    /// call's batch, and so the sidecar's wait for feature rows (rows that
    /// do not come in time are default rows, flagged), and the call is
    /// answered DEADLINE_EXCEEDED at it if not answered before.
    own_deadline: Option<Instant>,
    /// Its place among its lane's waiting calls, until a thread takes it.
    place: Place,
    /// Counted on the sidecar until the call is answered: a drain waits for
    /// it, and its ring requests are submitted while DRAINING.
    accepted: Accepted,
    reply: oneshot::Sender<Result<Vec<Prediction>, PredictError>>,
    /// The call's span (traces), and its `queue` span, closed when a ring
    /// thread takes the call.
    span: tracing::Span,
    queue: tracing::Span,
}

impl Targets for Job {
    fn n_targets(&self) -> usize {
        self.ids.len()
    }
}

/// A queue of calls for the batcher: its channel and the count of the calls
/// that wait in it (bounded: docs/serving.md, "Overload").
#[derive(Clone)]
struct Lane {
    jobs: mpsc::Sender<Job>,
    waiting: Arc<Waiting>,
}

/// One model's sessions: the executors' (one each), the student's, and
/// which model they are.
pub struct Sessions {
    pub models: Vec<Model>,
    pub student: Option<Model>,
    pub identity: Arc<ModelIdentity>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("models", &self.models.len())
            .field("student", &self.student.is_some())
            .field("identity", &self.identity)
            .finish()
    }
}

/// Tasks that serve one predictor alone (its precomputed set's follower),
/// aborted when its last clone is dropped.
#[derive(Default)]
struct Owned(std::sync::Mutex<Vec<tokio::task::AbortHandle>>);

impl Drop for Owned {
    fn drop(&mut self) {
        let tasks = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        for task in tasks.drain(..) {
            task.abort();
        }
    }
}

/// The batching front of one model. Cheap to clone; its threads end once
/// every clone is dropped and the calls it took are answered.
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
    /// The model its executors run.
    model: Arc<ModelIdentity>,
    /// Its sessions alive.
    alive: Arc<AtomicUsize>,
    owned: Arc<Owned>,
    /// Room in the GNN lane's pipeline (the batching rule's), which the
    /// run-to-completion path claims too.
    capacity: Arc<Capacity>,
    /// The GNN's sessions, shared by the executors and the
    /// run-to-completion path.
    sessions: Arc<sessions::Sessions>,
    /// Calls running to completion now.
    running_to_completion: Arc<AtomicUsize>,
}

/// When a call with `left` to its deadline, enqueued at `enqueued`, is
/// answered at the latest: a moment before its deadline (a tenth of the
/// time, at most 10 ms), so that the worker's answer, not the caller's
/// timer or tonic's (CANCELLED, whose clock starts before this one's), ends
/// the call, also on a loaded machine (2 ms was missed there).
fn answer_by(enqueued: Instant, left: Duration) -> Instant {
    enqueued + left - (left / 10).min(Duration::from_millis(10))
}

/// Decrements a count when dropped.
struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Predictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Predictor")
            .field("config", &self.config)
            .finish()
    }
}

impl Predictor {
    /// Starts the batching task (on the current tokio runtime) and one
    /// executor thread per model session. `schema` is the segment header the
    /// models were checked against: a sidecar that comes back with another
    /// one makes the worker not ready.
    pub fn start(
        client: Arc<RingClient>,
        sessions: Sessions,
        precomputed: Option<Arc<Precomputed>>,
        schema: FeatureSchema,
        config: BatchConfig,
        metrics: Arc<WorkerMetrics>,
    ) -> std::io::Result<Self> {
        let Sessions {
            models,
            student,
            identity,
        } = sessions;
        let alive = Arc::new(AtomicUsize::new(0));
        let config = Arc::new(config);
        let output = models
            .first()
            .map_or(OutputKind::Classes, |m| m.manifest().output);
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>(MAX_QUEUED_CALLS);
        let (batch_tx, batch_rx) = crossbeam_channel::unbounded::<Vec<Job>>();
        // The model stage takes at most one waiting batch per executor: a
        // ring thread with responses for a full stage waits (and keeps its
        // slots) instead of piling responses up.
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<RingDone>(models.len());
        let capacity = Arc::new(Capacity::new(config.ring_concurrency));
        let costs = Arc::new(Costs::default());
        let rule = Rule {
            max_batch: config.max_batch,
            max_delay: config.max_delay,
        };
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
                        slots: &SLOTS,
                    };
                    ring_stage(&ring, &rx, &tx, &capacity)
                })?;
        }
        drop(ready_tx);
        let executors = models.len();
        let sessions = Arc::new(sessions::Sessions::new(models, &metrics, &alive));
        for i in 0..executors {
            let (metrics, rx, capacity) = (metrics.clone(), ready_rx.clone(), capacity.clone());
            let (costs, sessions) = (costs.clone(), sessions.clone());
            std::thread::Builder::new()
                .name(format!("executor-{i}"))
                .spawn(move || model_stage(&sessions, &metrics, &costs, &rx, &capacity))?;
        }
        tokio::spawn(gather(
            jobs_rx,
            batch_tx,
            rule,
            metrics.clone(),
            capacity.clone(),
        ));
        let student_lane = match student {
            None => None,
            Some(student) => {
                let (lane_tx, lane_rx) = mpsc::channel::<Job>(MAX_QUEUED_CALLS);
                let (batch_tx, batch_rx) = crossbeam_channel::unbounded::<Vec<Job>>();
                // One student batch in flight: the next gathers meanwhile.
                let capacity = Arc::new(Capacity::new(1));
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
                            slots: &SLOTS,
                        };
                        student_stage(&ring, student, &batch_rx, &capacity2)
                    })?;
                tokio::spawn(gather(lane_rx, batch_tx, rule, metrics.clone(), capacity));
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
            model: identity,
            alive,
            owned: Arc::default(),
            capacity,
            sessions,
            running_to_completion: Arc::default(),
        })
    }

    /// The model it serves.
    pub fn model(&self) -> &Arc<ModelIdentity> {
        &self.model
    }

    /// Ends `task` when this predictor's last clone is dropped.
    pub fn own(&self, task: tokio::task::AbortHandle) {
        self.owned
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
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
                        the model was checked against: roll out a matching model \
                        (docs/operations.md, \"Rolling out a model\")"
                    .into(),
            );
        }
        if self.alive.load(Ordering::Acquire) == 0 {
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
                 max_request_targets, --max-request-targets, and if the sidecar's ring is \
                 what bounds it, its slots x max_targets)",
                ids.len(),
                self.config.max_request_targets
            )));
        }
        self.enqueue(ids, None, left).await
    }

    /// Predicts a node the graph does not have (of the model's target
    /// type), from its feature row and its edges, without adding it
    /// (docs/serving.md, "A new node in one call"): the sidecar samples as
    /// if it had been added (`NEW_NODE`), so the answer is the one the node
    /// gets once added with the same edges.
    pub async fn predict_new_node(
        &self,
        id: u64,
        features: Vec<f32>,
        edges: NewEdges,
        left: Option<Duration>,
    ) -> Result<Vec<Prediction>, PredictError> {
        let (Some(graph), Some(geometry)) = (self.client.graph(), self.client.geometry()) else {
            return Err(PredictError::Unavailable(
                "no sidecar is attached: retry once it is up".into(),
            ));
        };
        let ask = self.config.graph.as_deref();
        let node = edges
            .resolve(id, features, &graph, self.client.graph_schema().is_some())
            .map_err(PredictError::InvalidArgument)?;
        if let Some(problem) =
            protocol::request::new_node_problem(id, &node, ask, &geometry, &graph)
        {
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
        let rungs = Rungs {
            reduced: self.config.has_reduced(),
            student: self.student.is_some(),
            degrade_queue_calls: self.config.degrade_queue_calls,
        };
        let waiting = self.jobs.waiting.count();
        let rung = self
            .costs
            .rung_for(rungs, left, new_node.is_some(), waiting);
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
        let span = tracing::Span::current();
        let queue = daemon_kit::child_span!("queue");
        let job = Job {
            ids,
            new_node,
            rung,
            enqueued,
            deadline: enqueued + left.unwrap_or_default().max(self.config.call_timeout),
            own_deadline: left.map(|left| answer_by(enqueued, left)),
            place,
            accepted,
            reply,
            span,
            queue,
        };
        let job = if rung == Rung::Student || waiting > 0 || !self.config.run_to_completion {
            Some(job)
        } else {
            self.run_to_completion(job)
        };
        if let Some(job) = job {
            lane.jobs.try_send(job).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => overloaded(),
                mpsc::error::TrySendError::Closed(_) => {
                    PredictError::Unavailable("the worker is shutting down".into())
                }
            })?;
        }
        let answered = match left {
            // Answered by its deadline, or DEADLINE_EXCEEDED at it (the
            // job, if still waiting, is then dropped as gone).
            Some(left) => tokio::time::timeout_at(answer_by(enqueued, left).into(), answer)
                .await
                .map_err(|_| {
                    PredictError::DeadlineExceeded(format!(
                        "the call's deadline of {:.1} ms passed before it was answered: give \
                         it more time, or add replicas",
                        left.as_secs_f64() * 1e3
                    ))
                })?,
            None => answer.await,
        };
        answered.map_err(|_| {
            PredictError::Unavailable(
                "no executor took the call (all retired): restart the worker".into(),
            )
        })?
    }

    /// Runs `job` to completion on this thread when the GNN's pipeline has
    /// room and a session is idle (docs/serving.md, "`gnn-worker serve`"):
    /// its ring round trip and model run happen here, with no hand-off to
    /// the gather task, a ring thread or an executor, and it is answered
    /// before this returns. Called only when no other call waits for the
    /// batcher, so that it never overtakes one. Otherwise returns the job
    /// for the pipeline: also when the sidecar is not ready, for a task
    /// that reads further calls meanwhile ([`through_the_pipeline`]), for
    /// a call of more targets than one ring request carries (`max_targets`:
    /// a large call is many ring requests and model runs, during which the
    /// runtime thread's other tasks, probes and scrapes among them, would
    /// wait; its hand-off to the pipeline costs nothing beside them), when
    /// no ring slot is free now (the runtime thread never waits for one),
    /// and
    /// when as many calls run to completion as leave one runtime thread
    /// free (this blocks the runtime thread it runs on for one ring round
    /// trip and one model run: at most until `ring_timeout_ms` if the
    /// sidecar stalls, while the others serve).
    fn run_to_completion(&self, job: Job) -> Option<Job> {
        if PIPELINED.try_with(|_| ()).is_ok() {
            return Some(job);
        }
        // One ring request, whose slot is free now: the runtime thread
        // never waits for a slot (a saturated ring is the pipeline's).
        let one_request = self.client.geometry().is_some_and(|g| {
            job.ids.len() <= g.max_targets as usize && SLOTS.has_room(1, g.slot_count as usize)
        });
        if !one_request {
            return Some(job);
        }
        let threads =
            tokio::runtime::Handle::try_current().map_or(0, |h| match h.runtime_flavor() {
                tokio::runtime::RuntimeFlavor::MultiThread => h.metrics().num_workers(),
                _ => 0,
            });
        let running =
            self.running_to_completion
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n + 1 < threads).then_some(n + 1)
                });
        if running.is_err() {
            return Some(job);
        }
        let _running = Decrement(&self.running_to_completion);
        if !matches!(self.client.status(), ClientStatus::Ready) || !self.capacity.try_claim() {
            return Some(job);
        }
        let Some(session) = self.sessions.try_take() else {
            self.capacity.release();
            return Some(job);
        };
        self.metrics.batch_formed(job.ids.len(), 1);
        self.metrics.batches_run_to_completion.inc();
        {
            let ring = Ring {
                client: &self.client,
                schema: self.schema,
                config: &self.config,
                metrics: &self.metrics,
                precomputed: self.precomputed.as_deref(),
                costs: &self.costs,
                slots: &SLOTS,
            };
            let mut session = Some(session);
            let emitted = ring_batch(&ring, vec![job], &mut |done| {
                let releases = done.releases;
                let ran = run_part(
                    &self.sessions,
                    session.take(),
                    done,
                    &self.metrics,
                    &self.costs,
                );
                if releases {
                    self.capacity.release();
                }
                if let Ran::Kept(kept) = ran {
                    session = Some(kept);
                }
            });
            if !emitted {
                self.capacity.release();
            }
            if let Some(session) = session {
                self.sessions.put(session);
            }
        }
        None
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
