//! Dynamic batching: concurrent client calls are gathered for at most
//! `max_delay` (or until `max_batch` targets are waiting), submitted to the
//! ring as one request per `max_targets` chunk, run through the model on
//! the response buffers in place, and the predictions handed back to each
//! caller.
//!
//! The gathering is one tokio task; the ring calls and ONNX runs happen on
//! dedicated executor threads (each with its own session), never on the
//! async runtime's workers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::client::{CallRequest, RingClient};
use protocol::layout::{FeatureSchema, MAX_HOPS};
use protocol::payload::schema::target_status;
use protocol::payload::ResponseTables;
use tokio::sync::{mpsc, oneshot};

use crate::model::Model;

/// How calls are batched.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// Targets gathered into one batch before it is sent without waiting.
    pub max_batch: usize,
    /// Longest the first call of a batch waits for others.
    pub max_delay: Duration,
    /// Fanouts sent with every ring request.
    pub fanouts: [u32; MAX_HOPS],
    /// Deadline of one ring call (sampling + features).
    pub ring_timeout: Duration,
    /// Most targets one client call may ask for.
    pub max_request_targets: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_batch: 64,
            max_delay: Duration::from_millis(2),
            fanouts: [20, 10],
            ring_timeout: Duration::from_millis(500),
            max_request_targets: 4096,
        }
    }
}

/// One node's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub node_id: u64,
    pub label: i32,
    pub logits: Vec<f32>,
    pub known: bool,
    pub fallback_rows: u32,
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
}

/// Counters, for logs and the readiness endpoint.
#[derive(Debug, Default)]
pub struct BatchStats {
    pub calls: AtomicU64,
    pub batches: AtomicU64,
    pub ring_requests: AtomicU64,
    pub targets: AtomicU64,
    pub errors: AtomicU64,
}

struct Job {
    ids: Vec<u64>,
    reply: oneshot::Sender<Result<Vec<Prediction>, PredictError>>,
}

/// The batching front of the worker. Cheap to clone.
#[derive(Clone)]
pub struct Predictor {
    jobs: mpsc::Sender<Job>,
    config: Arc<BatchConfig>,
    stats: Arc<BatchStats>,
    client: Arc<RingClient>,
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
    /// one is refused.
    pub fn start(
        client: Arc<RingClient>,
        models: Vec<Model>,
        schema: FeatureSchema,
        config: BatchConfig,
    ) -> Self {
        let config = Arc::new(config);
        let stats = Arc::new(BatchStats::default());
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>(4096);
        let (batch_tx, batch_rx) = std_mpsc::channel::<Vec<Job>>();
        let batch_rx = Arc::new(Mutex::new(batch_rx));
        for (i, model) in models.into_iter().enumerate() {
            let (client, config, stats, rx) = (
                client.clone(),
                config.clone(),
                stats.clone(),
                batch_rx.clone(),
            );
            std::thread::Builder::new()
                .name(format!("executor-{i}"))
                .spawn(move || executor(&client, model, schema, &config, &stats, &rx))
                .expect("spawning an executor thread");
        }
        tokio::spawn(gather(jobs_rx, batch_tx, config.clone(), stats.clone()));
        Self {
            jobs: jobs_tx,
            config,
            stats,
            client,
        }
    }

    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }

    /// Ready when attached to a live sidecar.
    pub fn is_ready(&self) -> bool {
        self.client.epoch().is_some()
    }

    /// Predicts `ids` (batched with concurrent calls).
    pub async fn predict(&self, ids: Vec<u64>) -> Result<Vec<Prediction>, PredictError> {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        if ids.len() > self.config.max_request_targets {
            return Err(PredictError::InvalidArgument(format!(
                "{} node ids in one call; at most {} (split the call)",
                ids.len(),
                self.config.max_request_targets
            )));
        }
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { ids, reply })
            .await
            .map_err(|_| PredictError::Unavailable("the worker is shutting down".into()))?;
        answer
            .await
            .map_err(|_| PredictError::Internal("the executor dropped the call".into()))?
    }
}

async fn gather(
    mut jobs: mpsc::Receiver<Job>,
    batches: std_mpsc::Sender<Vec<Job>>,
    config: Arc<BatchConfig>,
    stats: Arc<BatchStats>,
) {
    while let Some(first) = jobs.recv().await {
        let until = tokio::time::Instant::now() + config.max_delay;
        let mut n = first.ids.len();
        let mut batch = vec![first];
        while n < config.max_batch {
            match tokio::time::timeout_at(until, jobs.recv()).await {
                Ok(Some(job)) => {
                    n += job.ids.len();
                    batch.push(job);
                }
                _ => break,
            }
        }
        stats.batches.fetch_add(1, Ordering::Relaxed);
        if batches.send(batch).is_err() {
            return;
        }
    }
}

fn executor(
    client: &RingClient,
    mut model: Model,
    schema: FeatureSchema,
    config: &BatchConfig,
    stats: &BatchStats,
    batches: &Mutex<std_mpsc::Receiver<Vec<Job>>>,
) {
    loop {
        let batch = {
            let rx = batches.lock().unwrap_or_else(|p| p.into_inner());
            match rx.recv() {
                Ok(batch) => batch,
                Err(_) => return,
            }
        };
        let ids: Vec<u64> = batch.iter().flat_map(|j| j.ids.iter().copied()).collect();
        stats.targets.fetch_add(ids.len() as u64, Ordering::Relaxed);
        let result = run_batch(client, &mut model, &schema, config, stats, &ids);
        if result.is_err() {
            stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        let mut offset = 0;
        for job in batch {
            let n = job.ids.len();
            let answer = match &result {
                Ok(predictions) => Ok(predictions[offset..offset + n].to_vec()),
                Err(e) => Err(e.clone()),
            };
            offset += n;
            let _ = job.reply.send(answer);
        }
    }
}

static REQUEST_ID: AtomicU64 = AtomicU64::new(1);

fn run_batch(
    client: &RingClient,
    model: &mut Model,
    schema: &FeatureSchema,
    config: &BatchConfig,
    stats: &BatchStats,
    ids: &[u64],
) -> Result<Vec<Prediction>, PredictError> {
    let max_targets = client
        .geometry()
        .map(|g| g.max_targets as usize)
        .unwrap_or(1)
        .max(1);
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(max_targets) {
        let request = CallRequest {
            targets: chunk,
            fanouts: config.fanouts,
            timeout: Some(config.ring_timeout),
            request_id: REQUEST_ID.fetch_add(1, Ordering::Relaxed),
        };
        stats.ring_requests.fetch_add(1, Ordering::Relaxed);
        let response = client
            .call(&request)
            .map_err(|e| PredictError::Unavailable(e.to_string()))?;
        if client.schema().is_some_and(|s| s != *schema) {
            return Err(PredictError::Unavailable(
                "the sidecar now serves another feature schema or graph version than the \
                 model was checked against: restart the worker with a matching model"
                    .into(),
            ));
        }
        let tables = response
            .tables()
            .map_err(|e| PredictError::Internal(format!("decoding the sidecar's response: {e}")))?;
        let logits = model
            .run(&tables)
            .map_err(|e| PredictError::Internal(e.to_string()))?;
        let classes = model.manifest().num_classes as usize;
        for (i, &node_id) in tables.target_ids().iter().enumerate() {
            let row = &logits[i * classes..(i + 1) * classes];
            out.push(Prediction {
                node_id,
                label: argmax(row) as i32,
                logits: row.to_vec(),
                known: tables.target_status()[i] == target_status::OK,
                fallback_rows: fallback_rows(&tables, i),
            });
        }
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
