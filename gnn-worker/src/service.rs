//! The worker as its front ends (gRPC, HTTP) see it: predictions once the
//! worker has attached to a sidecar and checked the model against it,
//! truthful readiness before and after, and the metrics.
//!
//! The front ends are bound before the sidecar is found, so the pod's
//! probes get an answer (not ready, and why) from the start; calls made
//! meanwhile are answered UNAVAILABLE.
//!
//! The predictor (a model's sessions and its batcher) can be replaced while
//! serving (`crate::rollout`): a call takes the predictor current when it
//! starts and is answered by it alone, so a switch never fails a call nor
//! answers one with a mix of two models. The old predictor's threads end
//! once its last call is answered.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use crate::batcher::{NamedEdges, NewEdges, PredictError, Prediction, Predictor};
use crate::metrics::{Health, WorkerMetrics};
use crate::model::ModelIdentity;

/// What a client call asks for, whichever door it came through (native
/// gRPC and HTTP build it with [`Call::of`], the Open Inference Protocol
/// from its named inputs); [`Service::call`] answers it.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// Nodes of the graph, by id.
    Known(Vec<u64>),
    /// A node the graph does not have (of the model's target type): its
    /// id, row and edges.
    New {
        id: u64,
        features: Vec<f32>,
        edges: NewEdges,
    },
}

/// A new node as the native doors carry it: `neighbors` (and `directed`),
/// or `edges` per edge type.
#[derive(Debug, Clone, Default)]
pub struct NewNodeCall {
    pub id: u64,
    pub features: Vec<f32>,
    pub neighbors: Vec<u64>,
    pub directed: bool,
    /// `(edge type, [(src, dst)])`; `None` when the call gave none.
    pub edges: Option<NamedEdges>,
}

impl Call {
    /// The call of a native request: its node ids, or its new node, not
    /// both; a new node with `edges` gives no `neighbors` or `directed`.
    pub fn of(node_ids: Vec<u64>, new_node: Option<NewNodeCall>) -> Result<Self, PredictError> {
        let Some(node) = new_node else {
            return Ok(Call::Known(node_ids));
        };
        if !node_ids.is_empty() {
            return Err(PredictError::InvalidArgument(
                "a call gives node ids or a new node, not both: send the known nodes in a call \
                 of their own"
                    .into(),
            ));
        }
        let edges = match node.edges {
            Some(_) if !node.neighbors.is_empty() || node.directed => {
                return Err(PredictError::InvalidArgument(
                    "a new node gives `edges` per edge type or `neighbors` (and `directed`), \
                     not both"
                        .into(),
                ))
            }
            Some(named) => NewEdges::Named(named),
            None => NewEdges::Neighbors {
                neighbors: node.neighbors,
                directed: node.directed,
            },
        };
        Ok(Call::New {
            id: node.id,
            features: node.features,
            edges,
        })
    }
}

/// A call's answer: its predictions and the model that computed every one.
#[derive(Debug, Clone)]
pub struct Answer {
    pub predictions: Vec<Prediction>,
    pub model: Arc<ModelIdentity>,
}

/// The span of one client call (traces, docs/operations.md "Traces"): a
/// child of the client's `traceparent` when it sent one (the value of the
/// header, or of the gRPC metadata of that name), a root otherwise. The
/// call runs inside it (`tracing::Instrument`); with traces off, or the
/// call not sampled, it is disabled and costs nothing.
pub fn call_span(rpc: &'static str, traceparent: Option<&str>) -> tracing::Span {
    let span = tracing::trace_span!("predict", rpc);
    if let Some((trace_id, parent, sampled)) =
        traceparent.and_then(daemon_kit::traces::parse_traceparent)
    {
        daemon_kit::traces::remote_parent(&span, trace_id, parent, sampled);
    }
    // An unsampled call makes no spans at all: its stages' spans are
    // children of a disabled span, skipped at a branch each.
    match daemon_kit::traces::context_of(&span) {
        Some((_, _, true)) => span,
        _ => tracing::Span::none(),
    }
}

/// Shared by the front ends. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    predictor: ArcSwapOption<Predictor>,
    /// Set on SIGTERM: not ready from then on, still serving.
    stopping: std::sync::atomic::AtomicBool,
    /// Why there is no predictor yet.
    waiting: Mutex<String>,
    metrics: OnceLock<Arc<WorkerMetrics>>,
    /// The model served (or loaded, before the sidecar is found).
    model: ArcSwapOption<ModelIdentity>,
}

impl Health for Inner {
    fn ready(&self) -> bool {
        !self.stopping.load(std::sync::atomic::Ordering::Acquire)
            && self
                .predictor
                .load()
                .as_ref()
                .is_some_and(|p| p.readiness().is_ok())
    }
}

impl Default for Service {
    fn default() -> Self {
        Self::new()
    }
}

impl Service {
    pub fn new() -> Self {
        let inner = Arc::new(Inner {
            predictor: ArcSwapOption::empty(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            waiting: Mutex::new("starting".into()),
            metrics: OnceLock::new(),
            model: ArcSwapOption::empty(),
        });
        let health: std::sync::Weak<dyn Health> = Arc::downgrade(&inner) as _;
        let _ = inner.metrics.set(Arc::new(WorkerMetrics::new(health)));
        Self { inner }
    }

    pub fn metrics(&self) -> &Arc<WorkerMetrics> {
        self.inner.metrics.get().expect("set in new")
    }

    /// Records the model served (`/readyz`, `gnn_worker_model_info`), in
    /// place of the one before.
    pub fn set_model(&self, model: Arc<ModelIdentity>) {
        let label = |m: &ModelIdentity| crate::metrics::ModelLabel {
            model: m.name.clone(),
            sha256: m.sha256.clone(),
        };
        let metrics = self.metrics();
        if let Some(before) = self.inner.model.swap(Some(model.clone())) {
            if *before != *model {
                metrics.model_info.remove(&label(&before));
            }
        }
        metrics.model_info.get_or_create(&label(&model)).set(1);
    }

    /// The model served.
    pub fn model(&self) -> Option<Arc<ModelIdentity>> {
        self.inner.model.load_full()
    }

    /// Records why the worker cannot serve yet (shown by `/readyz`).
    pub fn set_waiting(&self, why: impl Into<String>) {
        *self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner()) = why.into();
    }

    /// Installs a predictor (the first once the sidecar is attached and the
    /// model checked, later ones by a rollout): calls that start from now
    /// on are its; calls already running finish on the one before. From
    /// then on readiness is the predictor's.
    pub fn set_predictor(&self, predictor: Predictor) {
        let model = predictor.model().clone();
        self.inner.predictor.store(Some(Arc::new(predictor)));
        self.set_model(model);
    }

    /// The predictor calls that start now go to.
    pub fn predictor(&self) -> Option<Arc<Predictor>> {
        self.inner.predictor.load_full()
    }

    /// Reports not ready from now on (the worker is stopping); calls are
    /// still served.
    pub fn set_stopping(&self) {
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// `Ok` when the worker can serve; otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self
            .inner
            .stopping
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err("stopping (SIGTERM received)".into());
        }
        match self.inner.predictor.load().as_ref() {
            Some(predictor) => predictor.readiness(),
            None => Err(format!(
                "waiting for the sidecar: {}",
                self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner())
            )),
        }
    }

    /// One client call: counted, timed, batched. `left`: the time before
    /// the call's deadline, if the caller set one (docs/serving.md, "The
    /// ladder"). A new node is answered without being added
    /// (docs/serving.md, "A new node in one call").
    pub async fn call(&self, call: Call, left: Option<Duration>) -> Result<Answer, PredictError> {
        let metrics = self.metrics();
        metrics.calls.inc();
        let started = std::time::Instant::now();
        // The call is this predictor's to its end, whatever a rollout
        // installs meanwhile.
        let result = match self.inner.predictor.load_full() {
            Some(predictor) => match call {
                Call::Known(ids) => predictor.predict(ids, left).await,
                Call::New {
                    id,
                    features,
                    edges,
                } => predictor.predict_new_node(id, features, edges, left).await,
            }
            .map(|predictions| Answer {
                predictions,
                model: predictor.model().clone(),
            }),
            None => Err(PredictError::Unavailable(
                self.readiness().err().unwrap_or_default(),
            )),
        };
        metrics
            .call_seconds
            .observe(started.elapsed().as_secs_f64());
        match &result {
            Err(e) => metrics.call_failed(e.kind()),
            Ok(answer) => {
                for p in &answer.predictions {
                    metrics
                        .answers
                        .get_or_create(&crate::metrics::AnsweredByLabel {
                            by: p.answered_by.as_str(),
                        })
                        .inc();
                }
            }
        }
        result
    }

    /// Keeps the worker attached while no calls come: when the sidecar is
    /// lost (restarted, replaced), re-attaches every `period`, so readiness
    /// comes back without waiting for a call.
    pub fn spawn_reattacher(&self, period: Duration) -> tokio::task::JoinHandle<()> {
        let service = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Some(predictor) = service.predictor() else {
                    continue;
                };
                if matches!(
                    predictor.client().status(),
                    protocol::client::ClientStatus::Ready
                        | protocol::client::ClientStatus::Draining
                ) {
                    continue;
                }
                let client = predictor.client().clone();
                let attached = tokio::task::spawn_blocking(move || client.reattach()).await;
                if let Ok(Ok(())) = attached {
                    tracing::info!("re-attached to the sidecar");
                }
            }
        })
    }
}
