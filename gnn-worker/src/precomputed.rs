//! Precomputed answers (docs/serving.md, "Precomputed answers"): what
//! `gnn-worker precompute` stores in Redis and what `gnn-worker serve
//! --precomputed-redis` answers from while the sidecar vouches that nothing
//! a node's answer depends on has changed.
//!
//! A *set* is every known node's output (a dense-layout model's logits,
//! then its layer-1 embedding `h1`; a subgraph-layout model's output row,
//! logits or embedding, computed on the node's own subgraph with the node
//! alone in its request; little-endian f32) computed by one model against
//! one sidecar start, at one point of its change clock (docs/protocol.md,
//! "Freshness"). Keys, with `model` the first 16 hex digits of the XXH3-128
//! of `model.onnx` and `clock` the sidecar's change clock id in hex:
//!
//! - `gnn:precomputed:<model>:<clock>`: the set's description (JSON,
//!   [`SetMeta`]), written last;
//! - `gnn:precomputed:<model>:<clock>:<tick>:<node>`: one node's output.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwapOption;
use protocol::layout::MAX_HOPS;
use serde::{Deserialize, Serialize};

/// The key prefix of every precomputed set.
pub const KEY_PREFIX: &str = "gnn:precomputed";

/// Ids per MGET or MSET.
const CHUNK: usize = 1024;

/// A set's description, the value of its pointer key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetMeta {
    /// The model's identity ([`model_id`]).
    pub model: String,
    /// The sidecar's change clock id and the tick the set was computed at:
    /// answers stand for nodes with no change after it.
    pub clock: u64,
    pub tick: u64,
    /// The fanouts the outputs were computed with: the dense layout's two,
    /// or the first two hops of `subgraph` (0 past its last hop).
    pub fanouts: [u32; MAX_HOPS],
    /// A subgraph-layout model's set: the fanouts, one per hop, of the
    /// subgraph each node's output was computed on (the node alone in its
    /// request); absent for a dense-layout model's set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subgraph: Option<Vec<u32>>,
    /// A typed graph's model's set: the typed request each node's output
    /// was computed with (the node alone in it); absent otherwise. A worker
    /// whose typed request differs does not use the set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typed: Option<TypedSet>,
    /// Node ids below this were asked for; `nodes` of them were known.
    pub id_bound: u64,
    pub nodes: u64,
    /// The width of a node's answer: the classes, or an embedding model's
    /// vector width.
    pub classes: u32,
    /// The width of a node's stored layer-1 embedding (0: none stored).
    pub hidden: u32,
    /// Wall-clock seconds the precompute took, and when it finished (Unix
    /// seconds).
    pub seconds: f64,
    pub created_unix: u64,
}

/// The graph-layout request a set was computed with
/// ([`protocol::request::GraphAsk`]'s fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypedSet {
    /// The target type's index in the graph schema.
    pub target_type: u32,
    pub hops: u32,
    /// Per edge type of the graph, one per hop.
    pub fanouts: Vec<u32>,
}

impl From<&protocol::request::GraphAsk> for TypedSet {
    fn from(ask: &protocol::request::GraphAsk) -> Self {
        Self {
            target_type: ask.target_type,
            hops: ask.hops,
            fanouts: ask.fanouts.clone(),
        }
    }
}

impl SetMeta {
    /// The key prefix of this set's node outputs.
    pub fn node_prefix(&self) -> String {
        node_prefix(&self.model, self.clock, self.tick)
    }

    /// The fanouts the outputs were computed at, one per hop (a typed
    /// set's: per edge type, one per hop).
    pub fn computed_at(&self) -> Vec<u32> {
        match (&self.typed, &self.subgraph) {
            (Some(typed), _) => typed.fanouts.clone(),
            (None, Some(subgraph)) => subgraph.clone(),
            (None, None) => self.fanouts.to_vec(),
        }
    }

    /// The graph-layout request the set was computed with: a typed set's,
    /// or a subgraph-layout set's as the 1x1 graph's; `None` for a dense
    /// set.
    pub fn computed_with(&self) -> Option<TypedSet> {
        match (&self.typed, &self.subgraph) {
            (Some(typed), _) => Some(typed.clone()),
            (None, Some(fanouts)) => Some(TypedSet {
                target_type: 0,
                hops: fanouts.len() as u32,
                fanouts: fanouts.clone(),
            }),
            (None, None) => None,
        }
    }

    /// The `FRESH_SINCE` point that vouches for this set's answers (a
    /// graph-layout set's hops and fanouts go apart,
    /// [`SetMeta::computed_with`]).
    pub fn fresh_since(&self) -> protocol::request::FreshSince {
        use protocol::request::FreshSince;
        match self.computed_with() {
            Some(_) => FreshSince::graph(self.clock, self.tick),
            None => FreshSince::dense(self.clock, self.tick, self.fanouts),
        }
    }
}

/// Whether the sidecar can vouch for a set computed with `computed` beside
/// the worker's requests `served` (each `None` for the dense layout): both
/// dense (the dense layout names the set's fanouts), or both graph-layout
/// requests of one target type over as many edge types (a set computed at
/// other hops or fanouts is vouched for at its own, `fresh_hops`).
pub fn vouchable(computed: Option<&TypedSet>, served: Option<&TypedSet>) -> bool {
    match (computed, served) {
        (None, None) => true,
        (Some(c), Some(s)) => {
            let edge_types = |t: &TypedSet| {
                let hops = t.hops as usize;
                ((1..=protocol::layout::MAX_SUBGRAPH_HOPS).contains(&hops)
                    && t.fanouts.len().is_multiple_of(hops))
                .then(|| t.fanouts.len() / hops)
            };
            c.target_type == s.target_type
                && edge_types(c).is_some()
                && edge_types(c) == edge_types(s)
        }
        _ => false,
    }
}

/// The key prefix of the node outputs of `model`'s set at `tick` of the
/// sidecar start `clock`.
pub fn node_prefix(model: &str, clock: u64, tick: u64) -> String {
    format!("{KEY_PREFIX}:{model}:{clock:016x}:{tick}:")
}

/// The identity of a model directory: the first 16 hex digits of the
/// XXH3-128 of its `model.onnx`.
pub fn model_id(model_dir: &Path) -> anyhow::Result<String> {
    let path = model_dir.join(crate::model::Manifest::MODEL);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))[..16].to_string())
}

/// The pointer key of `model`'s set for the sidecar start `clock`.
pub fn pointer_key(model: &str, clock: u64) -> String {
    format!("{KEY_PREFIX}:{model}:{clock:016x}")
}

/// One node's stored output: logits then h1.
pub fn encode_output(logits: &[f32], h1: &[f32]) -> Vec<u8> {
    logits
        .iter()
        .chain(h1)
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// A loaded set: every stored node's logits and, when loaded with them,
/// layer-1 embeddings, in memory.
#[derive(Debug)]
pub struct PrecomputedSet {
    pub meta: SetMeta,
    /// `id_bound x classes`, row-major.
    logits: Vec<f32>,
    /// `id_bound x hidden`, row-major; empty unless loaded with them.
    h1: Vec<f32>,
    present: Vec<bool>,
}

impl PrecomputedSet {
    /// The stored logits of `node`, if the set holds it.
    pub fn logits(&self, node: u64) -> Option<&[f32]> {
        let i = usize::try_from(node).ok()?;
        if !*self.present.get(i)? {
            return None;
        }
        let c = self.meta.classes as usize;
        Some(&self.logits[i * c..(i + 1) * c])
    }

    /// The stored layer-1 embedding of `node`, if the set holds it and was
    /// loaded with them.
    pub fn h1(&self, node: u64) -> Option<&[f32]> {
        if !self.has_h1() {
            return None;
        }
        let i = usize::try_from(node).ok()?;
        if !*self.present.get(i)? {
            return None;
        }
        let h = self.meta.hidden as usize;
        Some(&self.h1[i * h..(i + 1) * h])
    }

    /// Whether the set was loaded with the layer-1 embeddings.
    pub fn has_h1(&self) -> bool {
        !self.h1.is_empty()
    }

    /// Whether the set holds every one of `ids`.
    pub fn covers(&self, ids: &[u64]) -> bool {
        ids.iter().all(|&id| self.logits(id).is_some())
    }

    /// Nodes held.
    pub fn len(&self) -> usize {
        self.present.iter().filter(|&&p| p).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads `model`'s set for the sidecar start `clock`, if there is one:
    /// its description, then every node's logits and, `with_h1`, layer-1
    /// embeddings (MGET, 1,024 ids at a time). A set whose classes are not
    /// `classes` is refused.
    pub async fn load(
        redis: &mut redis::aio::MultiplexedConnection,
        model: &str,
        clock: u64,
        classes: u32,
        with_h1: bool,
    ) -> anyhow::Result<Option<Self>> {
        let pointer: Option<String> = redis::cmd("GET")
            .arg(pointer_key(model, clock))
            .query_async(redis)
            .await
            .context("reading the precomputed set's description")?;
        let Some(pointer) = pointer else {
            return Ok(None);
        };
        let meta: SetMeta = serde_json::from_str(&pointer)
            .with_context(|| format!("the description of a precomputed set: {pointer:?}"))?;
        anyhow::ensure!(
            meta.classes == classes,
            "the precomputed set has {} classes; the model has {classes}: run gnn-worker \
             precompute with this model",
            meta.classes
        );
        let c = classes as usize;
        let width = (meta.classes + meta.hidden) as usize * 4;
        let n = usize::try_from(meta.id_bound).context("id bound")?;
        let h = meta.hidden as usize;
        let mut logits = vec![0f32; n * c];
        let mut h1 = if with_h1 && h > 0 {
            vec![0f32; n * h]
        } else {
            Vec::new()
        };
        let mut present = vec![false; n];
        let prefix = meta.node_prefix();
        for start in (0..n).step_by(CHUNK) {
            let end = (start + CHUNK).min(n);
            let keys: Vec<String> = (start..end).map(|i| format!("{prefix}{i}")).collect();
            let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(redis)
                .await
                .context("reading precomputed outputs")?;
            for (i, value) in (start..end).zip(values) {
                let Some(bytes) = value.filter(|b| b.len() == width) else {
                    continue;
                };
                for (k, chunk) in bytes[..c * 4].chunks_exact(4).enumerate() {
                    logits[i * c + k] = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
                }
                if !h1.is_empty() {
                    for (k, chunk) in bytes[c * 4..].chunks_exact(4).enumerate() {
                        h1[i * h + k] = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
                    }
                }
                present[i] = true;
            }
        }
        Ok(Some(Self {
            meta,
            logits,
            h1,
            present,
        }))
    }
}

/// The worker's precomputed answers: the set in use (swapped when a newer
/// one appears) and the change clock of the sidecar it last heard from.
#[derive(Debug, Default)]
pub struct Precomputed {
    current: ArcSwapOption<PrecomputedSet>,
    /// The change clock id of the latest response (0: none yet).
    sidecar_clock: AtomicU64,
}

impl Precomputed {
    pub fn current(&self) -> Option<Arc<PrecomputedSet>> {
        self.current.load_full()
    }

    pub fn set(&self, set: Option<Arc<PrecomputedSet>>) {
        self.current.store(set);
    }

    pub fn sidecar_clock(&self) -> u64 {
        self.sidecar_clock.load(Ordering::Relaxed)
    }

    /// Called with every response's change clock.
    pub fn saw_clock(&self, clock: u64) {
        self.sidecar_clock.store(clock, Ordering::Relaxed);
    }

    /// Keeps the set in use matching the sidecar: every `period`, if the
    /// sidecar's clock or its set changed, loads the set stored for it (or
    /// drops the old one when there is none), `with_h1` with its layer-1
    /// embeddings. A set the sidecar cannot vouch for beside `served` (the
    /// worker's graph-layout request, `None` for a dense-layout model) is
    /// not used ([`vouchable`]). Runs for ever.
    #[allow(clippy::too_many_arguments)]
    pub async fn follow(
        self: Arc<Self>,
        redis_url: String,
        model: String,
        classes: u32,
        with_h1: bool,
        served: Option<TypedSet>,
        period: std::time::Duration,
        loaded: impl Fn(Option<&PrecomputedSet>) + Send + 'static,
    ) {
        let mut tick = tokio::time::interval(period);
        let mut connection: Option<redis::aio::MultiplexedConnection> = None;
        // Named in the log without its password; an outage is warned about
        // once, and its end said.
        let shown = daemon_kit::redact::redact_url(&redis_url);
        let mut failing = false;
        let mut refused_shown = false;
        let failed = |failing: &mut bool, what: &str, e: &dyn std::fmt::Display| {
            if std::mem::replace(failing, true) {
                tracing::debug!(redis = %shown, error = %e, "{what}");
            } else {
                tracing::warn!(redis = %shown, error = %e, "{what}; serving inductively meanwhile");
            }
        };
        loop {
            tick.tick().await;
            let clock = self.sidecar_clock();
            if clock == 0 {
                continue;
            }
            if connection.is_none() {
                match redis::Client::open(redis_url.as_str()) {
                    Ok(client) => match client.get_multiplexed_async_connection().await {
                        Ok(c) => connection = Some(c),
                        Err(e) => {
                            failed(
                                &mut failing,
                                "cannot reach the precomputed answers' Redis",
                                &e,
                            );
                            continue;
                        }
                    },
                    Err(e) => {
                        tracing::warn!(redis = %shown, error = %e, "bad precomputed_redis URL");
                        return;
                    }
                }
            }
            let Some(redis) = connection.as_mut() else {
                continue;
            };
            let pointer: redis::RedisResult<Option<String>> = redis::cmd("GET")
                .arg(pointer_key(&model, clock))
                .query_async(redis)
                .await;
            let pointer = match pointer {
                Ok(p) => p,
                Err(e) => {
                    failed(
                        &mut failing,
                        "reading the precomputed set's description failed",
                        &e,
                    );
                    connection = None;
                    continue;
                }
            };
            if std::mem::replace(&mut failing, false) {
                tracing::info!(redis = %shown, "the precomputed answers' Redis answers again");
            }
            let current = self.current();
            let current_meta = current.as_ref().map(|s| &s.meta);
            let wanted: Option<SetMeta> = pointer.and_then(|p| serde_json::from_str(&p).ok());
            if wanted.as_ref() == current_meta {
                continue;
            }
            if let Some(meta) = wanted
                .as_ref()
                .filter(|m| !vouchable(m.computed_with().as_ref(), served.as_ref()))
            {
                if !std::mem::replace(&mut refused_shown, true) {
                    tracing::warn!(
                        computed_at = ?meta.computed_with(),
                        served_at = ?served,
                        "the precomputed set was computed in another layout, for another \
                         target type or over another number of edge types than this worker \
                         asks for: serving inductively until gnn-worker precompute runs with \
                         this model"
                    );
                }
                self.set(None);
                loaded(None);
                continue;
            }
            refused_shown = false;
            if wanted.is_none() {
                if current.is_some() {
                    tracing::warn!(
                        clock = format_args!("{clock:016x}"),
                        "no precomputed answers for this sidecar start: serving inductively \
                         until gnn-worker precompute runs against it"
                    );
                }
                self.set(None);
                loaded(None);
                continue;
            }
            match PrecomputedSet::load(redis, &model, clock, classes, with_h1).await {
                Ok(Some(set)) => {
                    tracing::info!(
                        nodes = set.len(),
                        tick = set.meta.tick,
                        fanouts = ?set.meta.computed_at(),
                        "precomputed answers loaded"
                    );
                    loaded(Some(&set));
                    self.set(Some(Arc::new(set)));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "loading precomputed answers failed");
                }
            }
        }
    }
}

/// What `gnn-worker precompute` is asked to do.
#[derive(Debug, Clone)]
pub struct PrecomputeJob {
    pub model_dir: std::path::PathBuf,
    pub shm_name: String,
    pub redis_url: String,
    /// `None`: a dense-layout model's the segment's default fanouts (what
    /// a worker without `fanouts` serves with), a graph-layout model's its
    /// manifest's. One per hop (two for a dense-layout model); a
    /// graph-layout model's for every edge type it samples, as a worker's
    /// `fanouts` are.
    pub fanouts: Option<Vec<u32>>,
    /// Targets per ring request (at most the segment's `max_targets`); a
    /// subgraph-layout model's nodes go one per request.
    pub batch: usize,
    pub onnxruntime_lib: Option<std::path::PathBuf>,
    pub threads: usize,
}

/// Scores every node below the graph's id bound (a typed model's: of its
/// target type) through the sidecar's ring and the model, stores each
/// known node's output in Redis, then the set's description, and removes
/// the set it replaces. A dense-layout model's nodes go `batch` a request
/// (its answers do not depend on the batch); a subgraph-layout or typed
/// model's one a request, so that each output is the one its node's own
/// subgraph gives (the one a `FRESH_SINCE` check draws again). Prints its
/// progress to stderr. Returns the description written.
pub fn precompute(job: &PrecomputeJob) -> anyhow::Result<SetMeta> {
    use crate::model::ModelLayout;

    let started = std::time::Instant::now();
    let env = crate::onnxruntime::init(job.onnxruntime_lib.as_deref())?;
    let mut manifest = crate::model::Manifest::read(&job.model_dir)?;
    let mut model = crate::model::Model::load(
        &env,
        &job.model_dir,
        crate::model::Device::Cpu,
        job.threads.max(1),
    )?;
    let subgraph = manifest.layout == ModelLayout::Subgraph;
    anyhow::ensure!(
        subgraph || model.has_h1(),
        "{} has no h1 output: export the model with this release's sage.py (train, init or \
         quantize)",
        job.model_dir.display()
    );
    let model_id = model_id(&job.model_dir)?;
    let client = RingClientFor::attach(&job.shm_name)?;
    let (schema, geometry) = (client.schema, client.geometry);
    // -1 (every neighbour) is the sidecar's cap of the hop.
    manifest.fanouts_at_caps(geometry.max_fanouts);
    let fanouts: Option<Vec<u32>> = job.fanouts.as_ref().map(|f| {
        daemon_kit::config::HopFanouts(f.clone())
            .at_caps(|hop| geometry.max_fanouts[hop.min(MAX_HOPS - 1)])
            .0
    });
    let shape = if subgraph {
        // Computed at the request the worker serves with these fanouts.
        let graph = client
            .client
            .graph()
            .context("the sidecar went away while attaching")?;
        let configured = fanouts.as_deref().map(|f| ("--fanouts", f));
        let ask = manifest.check_graph_segment(&schema, &geometry, &graph, configured)?;
        let one_type = manifest.graph.as_ref().is_some_and(|g| g.one_type);
        Shape::Graph(Box::new(GraphShape {
            ask,
            graph,
            one_type,
        }))
    } else {
        let fanouts = fanouts.unwrap_or_else(|| schema.default_fanouts.to_vec());
        manifest.check_dense_segment(&schema, &geometry, &fanouts)?;
        let dense: [u32; MAX_HOPS] = fanouts.as_slice().try_into().map_err(|_| {
            anyhow::anyhow!(
                "fanouts {fanouts:?}: the model {} reads the dense layout, which has two hops: \
                 give two such as 20,10",
                job.model_dir.display()
            )
        })?;
        Shape::Dense(dense)
    };
    let batch = match shape {
        Shape::Graph(_) => 1,
        Shape::Dense(_) => job.batch.clamp(1, geometry.max_targets as usize),
    };
    let mut store = SetWriter::connect(&job.redis_url, &model_id)?;
    let classes = manifest.output_width() as usize;
    let hidden = if subgraph {
        0
    } else {
        manifest.hidden.unwrap_or(0) as usize
    };
    let mut nodes = 0u64;
    let mut next = 0u64;
    let mut last_report = std::time::Instant::now();
    loop {
        let bound = store.stamp.map_or(u64::MAX, |(_, _, bound)| bound);
        if next >= bound {
            break;
        }
        let ids: Vec<u64> = (next..(next + batch as u64).min(bound)).collect();
        let mut queue = vec![ids.as_slice()];
        while let Some(targets) = queue.pop() {
            let Some(response) = client.call(targets, &shape)? else {
                // Too large: the halves, one after the other.
                let (a, b) = targets.split_at(targets.len() / 2);
                queue.push(b);
                queue.push(a);
                continue;
            };
            let header = response.header();
            store.saw(header.change_clock, header.change_tick, header.id_bound)?;
            let decoding = "decoding the sidecar's response";
            let (outputs, h1, ids, statuses) = match &shape {
                Shape::Dense(_) => {
                    let tables = response.tables().context(decoding)?;
                    let (outputs, h1) = model.run_with_h1(&tables)?;
                    let ids = tables.target_ids().to_vec();
                    (outputs, h1, ids, tables.target_status().to_vec())
                }
                Shape::Graph(shape) => {
                    let target_type = shape.ask.target_type as usize;
                    let tables = response
                        .graph_tables_with_edge_data(target_type, shape.ask.edge_data)
                        .context(decoding)?;
                    let outputs = model.run_subgraph(&tables, &shape.graph, target_type)?;
                    let ids = tables.target_ids().to_vec();
                    (outputs, Vec::new(), ids, tables.target_status().to_vec())
                }
            };
            for (i, (&id, &status)) in ids.iter().zip(&statuses).enumerate() {
                if status != protocol::payload::schema::target_status::OK {
                    continue;
                }
                let h1 = h1.get(i * hidden..(i + 1) * hidden).unwrap_or(&[]);
                store.push(
                    id,
                    encode_output(&outputs[i * classes..(i + 1) * classes], h1),
                )?;
                nodes += 1;
            }
        }
        next += ids.len() as u64;
        let bound = store.stamp.map_or(next, |(_, _, bound)| bound).max(1);
        if last_report.elapsed() >= std::time::Duration::from_secs(1) || next >= bound {
            last_report = std::time::Instant::now();
            let secs = started.elapsed().as_secs_f64();
            eprintln!(
                "precompute: {:5.1}% ({next}/{bound} ids), {nodes} nodes, {:.0} nodes/s",
                100.0 * next.min(bound) as f64 / bound as f64,
                nodes as f64 / secs.max(1e-9)
            );
        }
    }
    let (clock, tick, id_bound) = store.stamp.context("the sidecar answered nothing")?;
    let meta = SetMeta {
        model: model_id.clone(),
        clock,
        tick,
        fanouts: match &shape {
            Shape::Dense(f) => *f,
            // A one-type set's first two hops (docs/serving.md).
            Shape::Graph(g) if g.one_type => {
                [0, 1].map(|hop| g.ask.fanouts.get(hop).copied().unwrap_or(0))
            }
            Shape::Graph(_) => [0; MAX_HOPS],
        },
        subgraph: match &shape {
            Shape::Graph(g) if g.one_type => Some(g.ask.fanouts.clone()),
            _ => None,
        },
        typed: match &shape {
            Shape::Graph(g) if !g.one_type => Some(TypedSet::from(&g.ask)),
            _ => None,
        },
        id_bound,
        nodes,
        classes: classes as u32,
        hidden: hidden as u32,
        seconds: started.elapsed().as_secs_f64(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    store.finish(&meta)?;
    Ok(meta)
}

/// The layout a precompute asks the sidecar for.
#[derive(Debug, Clone)]
enum Shape {
    Dense([u32; MAX_HOPS]),
    /// A graph-layout model's request and the graph it is of.
    Graph(Box<GraphShape>),
}

/// A graph-layout model's request, the segment's graph (a one-type graph's
/// as the 1x1 graph), and whether the model is a one-type graph's (whose
/// set is described by its fanouts, [`SetMeta::subgraph`]).
#[derive(Debug, Clone)]
struct GraphShape {
    ask: protocol::request::GraphAsk,
    graph: protocol::graph_schema::GraphSchema,
    one_type: bool,
}

/// The precompute's ring client, with the segment it attached to.
struct RingClientFor {
    client: protocol::client::RingClient,
    schema: protocol::FeatureSchema,
    geometry: protocol::layout::Geometry,
}

impl RingClientFor {
    fn attach(shm_name: &str) -> anyhow::Result<Self> {
        use protocol::client::{ClientOptions, RingClient};
        let client = RingClient::attach(shm_name, ClientOptions::default())
            .with_context(|| format!("attaching to the sidecar on /dev/shm/{shm_name}"))?;
        let (Some(schema), Some(geometry)) = (client.schema(), client.geometry()) else {
            anyhow::bail!("the sidecar went away while attaching");
        };
        Ok(Self {
            client,
            schema,
            geometry,
        })
    }

    /// The sidecar's answer for `targets`, or `None` when it does not fit
    /// one response and `targets` can be halved.
    fn call(
        &self,
        targets: &[u64],
        shape: &Shape,
    ) -> anyhow::Result<Option<protocol::client::Response>> {
        use protocol::client::{CallError, CallRequest};
        let (fanouts, graph) = match shape {
            Shape::Dense(f) => (*f, None),
            Shape::Graph(shape) => (self.schema.default_fanouts, Some(&shape.ask)),
        };
        let request = CallRequest {
            fanouts,
            graph,
            timeout: Some(std::time::Duration::from_secs(10)),
            ..CallRequest::new(targets)
        };
        match self.client.call(&request) {
            Ok(response) => Ok(Some(response)),
            Err(CallError::Status {
                status: protocol::layout::status::TOO_LARGE,
                message,
                ..
            }) => {
                anyhow::ensure!(
                    targets.len() > 1,
                    "the neighbourhood of node {} does not fit one response ({message}): \
                     lower --fanouts, or raise the sidecar's response_mib or max_nodes",
                    targets[0]
                );
                Ok(None)
            }
            Err(e) => Err(e).context("asking the sidecar for a batch"),
        }
    }
}

/// Writes a set's outputs to Redis as they come, then its description.
struct SetWriter {
    runtime: tokio::runtime::Runtime,
    redis: redis::aio::MultiplexedConnection,
    model_id: String,
    /// The change clock, tick and id bound of the first response (read by
    /// the sidecar before it sampled): every later output is at least as
    /// new.
    stamp: Option<(u64, u64, u64)>,
    prefix: String,
    writes: Vec<(String, Vec<u8>)>,
}

impl SetWriter {
    fn connect(redis_url: &str, model_id: &str) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let redis = runtime
            .block_on(async {
                redis::Client::open(redis_url)?
                    .get_multiplexed_async_connection()
                    .await
            })
            .with_context(|| {
                format!(
                    "connecting to Redis at {}",
                    daemon_kit::redact::redact_url(redis_url)
                )
            })?;
        Ok(Self {
            runtime,
            redis,
            model_id: model_id.to_string(),
            stamp: None,
            prefix: String::new(),
            writes: Vec::new(),
        })
    }

    /// Takes a response's change clock: the first stamps the set, a later
    /// one from another sidecar start fails the precompute.
    fn saw(&mut self, clock: u64, tick: u64, id_bound: u64) -> anyhow::Result<()> {
        anyhow::ensure!(
            clock != 0,
            "the sidecar has no change clock (an older release): upgrade it before precomputing"
        );
        match self.stamp {
            None => {
                self.stamp = Some((clock, tick, id_bound));
                self.prefix = node_prefix(&self.model_id, clock, tick);
            }
            Some((first, ..)) => anyhow::ensure!(
                first == clock,
                "the sidecar restarted during the precompute (its change clock moved from \
                 {first:016x} to {clock:016x}): run gnn-worker precompute again"
            ),
        }
        Ok(())
    }

    fn push(&mut self, id: u64, output: Vec<u8>) -> anyhow::Result<()> {
        self.writes.push((format!("{}{id}", self.prefix), output));
        if self.writes.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("MSET");
        for (key, value) in self.writes.drain(..) {
            cmd.arg(key).arg(value);
        }
        self.runtime
            .block_on(cmd.query_async::<()>(&mut self.redis))
            .context("writing precomputed outputs to Redis")
    }

    /// Writes what is left, then the set's description, and removes the
    /// set it replaces (same model, same sidecar start).
    fn finish(mut self, meta: &SetMeta) -> anyhow::Result<()> {
        self.flush()?;
        let pointer = pointer_key(&meta.model, meta.clock);
        let previous: Option<String> = self.runtime.block_on(
            redis::cmd("SET")
                .arg(&pointer)
                .arg(serde_json::to_string(meta)?)
                .arg("GET")
                .query_async(&mut self.redis),
        )?;
        // Removed once no worker can pick it up any more.
        if let Some(old) = previous.and_then(|p| serde_json::from_str::<SetMeta>(&p).ok()) {
            if old.node_prefix() != meta.node_prefix() {
                let old_prefix = old.node_prefix();
                let ids: Vec<u64> = (0..old.id_bound).collect();
                for chunk in ids.chunks(CHUNK) {
                    let mut cmd = redis::cmd("UNLINK");
                    for id in chunk {
                        cmd.arg(format!("{old_prefix}{id}"));
                    }
                    self.runtime
                        .block_on(cmd.query_async::<()>(&mut self.redis))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(target_type: u32, fanouts: &[u32], hops: u32) -> TypedSet {
        TypedSet {
            target_type,
            hops,
            fanouts: fanouts.to_vec(),
        }
    }

    /// A set is used where the sidecar can vouch for it: the same layout,
    /// and in the graph layout the same target type over as many edge
    /// types, at any hops and fanouts (named apart with `fresh_hops`).
    #[test]
    fn a_set_is_vouchable_in_its_layout_at_any_fanouts() {
        let served = set(0, &[20, 10], 2);
        assert!(vouchable(None, None));
        assert!(!vouchable(Some(&served), None));
        assert!(!vouchable(None, Some(&served)));
        assert!(vouchable(Some(&served), Some(&served)));
        // A one-type set at covering fanouts, or three hops.
        assert!(vouchable(Some(&set(0, &[168, 168], 2)), Some(&served)));
        assert!(vouchable(Some(&set(0, &[5, 5, 5], 3)), Some(&served)));
        // Another target type, or another count of edge types.
        assert!(!vouchable(Some(&set(1, &[20, 10], 2)), Some(&served)));
        assert!(!vouchable(Some(&set(0, &[1, 2, 3, 4], 2)), Some(&served)));
        // A description no request could have.
        assert!(!vouchable(Some(&set(0, &[1, 2, 3], 2)), Some(&served)));
        assert!(!vouchable(Some(&set(0, &[], 0)), Some(&set(0, &[], 0))));
        assert!(!vouchable(Some(&set(0, &[1; 4], 4)), Some(&served)));
    }

    /// A subgraph-layout set is the 1x1 graph's request; its FRESH_SINCE
    /// names the clock alone.
    #[test]
    fn a_subgraph_set_is_computed_with_the_one_type_graphs_request() {
        let meta = SetMeta {
            model: "m".into(),
            clock: 3,
            tick: 9,
            fanouts: [168, 168],
            subgraph: Some(vec![168, 168]),
            typed: None,
            id_bound: 10,
            nodes: 10,
            classes: 7,
            hidden: 0,
            seconds: 0.0,
            created_unix: 0,
        };
        assert_eq!(meta.computed_with(), Some(set(0, &[168, 168], 2)));
        assert_eq!(
            meta.fresh_since(),
            protocol::request::FreshSince::graph(3, 9)
        );
        let dense = SetMeta {
            subgraph: None,
            ..meta
        };
        assert_eq!(dense.computed_with(), None);
        assert_eq!(
            dense.fresh_since(),
            protocol::request::FreshSince::dense(3, 9, [168, 168])
        );
    }
}
