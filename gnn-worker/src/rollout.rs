//! The model a worker serves, loaded at start and replaced without a
//! restart (docs/operations.md, "Rolling out a model").
//!
//! A model is [`Loader::load`]ed from the configured `model` directory
//! (its manifest, one ONNX Runtime session per executor, the student of
//! `student` checked against it) and [`Loader::install`]ed: checked against
//! the attached sidecar's segment header (feature schema, graph version,
//! fanouts and caps) and started as a [`Predictor`] with its own executor
//! threads and, with `precomputed_redis`, its own follower of the answers
//! stored for that model.
//!
//! [`watch`] rolls out a new model: when the directory changes (checked
//! every `model_watch_s`; a change is loaded once it has stood still for
//! one period, so a copy still being written is not read) or on SIGHUP, it
//! loads the directory again beside the model serving, checks it, and only
//! then switches (`Service::set_predictor`): calls that start from then on
//! go to the new model, calls already running finish on the old one, whose
//! threads end with its last call. A directory that fails to load or to
//! check is refused by name and the old model keeps serving; a directory
//! whose files are the ones serving is left alone.
//!
//! The directory is read through its path each time, so the usual way to
//! roll out is a symlink swapped to a new version directory (`ln -sfn
//! v2 current.tmp && mv -T current.tmp current`), or a volume the platform
//! updates. A model's student can live in the model directory
//! (`student/`), so that the swap switches both at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use protocol::client::{ClientStatus, RingClient};
use protocol::layout::MAX_HOPS;

use crate::batcher::{BatchConfig, Predictor, Sessions};
use crate::config::WorkerConfig;
use crate::metrics::RolloutOutcome;
use crate::model::{Manifest, Model, ModelIdentity, ModelLayout};
use crate::precomputed::Precomputed;
use crate::service::Service;

/// Loads models the way the configuration says (device, executors,
/// threads, student), with one ONNX Runtime environment for all of them.
pub struct Loader {
    env: ort::environment::Environment,
    config: WorkerConfig,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("model", &self.config.model)
            .finish()
    }
}

/// A model read from its directory, not yet checked against a sidecar.
#[derive(Debug)]
pub struct Loaded {
    pub manifest: Manifest,
    sessions: Sessions,
    /// The files as they were when loading began.
    stamp: Stamp,
    /// The sha256 of everything that makes the model: model.onnx, the
    /// manifest, and the student's two.
    content: String,
}

impl Loaded {
    pub fn identity(&self) -> &Arc<ModelIdentity> {
        &self.sessions.identity
    }
}

/// What a model directory's files are now (path resolved, length, change
/// time, inode): cheap to read, and different after any copy, edit or
/// symlink swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp(Vec<(PathBuf, Option<FileStamp>)>);

/// A file's length, change time and inode.
type FileStamp = (u64, SystemTime, u64);

/// The files of a model directory that make the model.
const MODEL_FILES: [&str; 2] = [Manifest::FILE, Manifest::MODEL];

/// A model directory's own student, loaded with it when `student` is unset
/// (so that one rollout switches both).
pub const OWN_STUDENT: &str = "student";

impl Stamp {
    fn of(dirs: &[&Path]) -> Self {
        use std::os::unix::fs::MetadataExt;
        let mut files = Vec::new();
        for dir in dirs {
            let resolved = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            for file in MODEL_FILES {
                let path = resolved.join(file);
                let meta = std::fs::metadata(&path).ok().map(|m| {
                    (
                        m.len(),
                        m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        m.ino(),
                    )
                });
                files.push((path, meta));
            }
        }
        Self(files)
    }
}

impl Loader {
    /// Starts ONNX Runtime from `onnxruntime_lib`.
    pub fn new(config: WorkerConfig) -> anyhow::Result<Self> {
        let env = crate::onnxruntime::init(config.onnxruntime_lib.as_deref())?;
        Ok(Self { env, config })
    }

    /// The configuration it loads by.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// The model directory's files now (its student's included).
    pub fn stamp(&self) -> Stamp {
        let own = self.config.model.join(OWN_STUDENT);
        let mut dirs = vec![self.config.model.as_path()];
        match &self.config.student {
            Some(student) => dirs.push(student),
            None => dirs.push(&own),
        }
        Stamp::of(&dirs)
    }

    /// The student to load with the model: the `student` directory, or
    /// else the model directory's own `student/` when it has one.
    fn student_dir(&self) -> Option<PathBuf> {
        self.config.student.clone().or_else(|| {
            let own = self.config.model.join(OWN_STUDENT);
            own.join(Manifest::FILE).is_file().then_some(own)
        })
    }

    /// Reads the `model` directory (and the `student` one) into sessions.
    /// Blocking: seconds for a large model.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let config = &self.config;
        let stamp = self.stamp();
        let manifest = Manifest::read(&config.model)?;
        let identity = Arc::new(crate::model::identity(
            &config.model,
            &manifest,
            config.model_name.as_deref(),
        )?);
        let mut content = vec![
            identity.sha256.clone(),
            crate::model::sha256_hex(&config.model.join(Manifest::FILE))?,
        ];
        let mut models = Vec::with_capacity(config.executors);
        for _ in 0..config.executors {
            models.push(Model::load_with(
                &self.env,
                &config.model,
                config.device,
                config.intra_threads,
                config.fast_scatter,
            )?);
        }
        tracing::info!(
            model = %config.model.display(),
            architecture = %manifest.architecture,
            layout = ?manifest.layout,
            output = ?manifest.output,
            scatters_rewritten = models.first().map_or(0, Model::scatters_rewritten),
            extrema_fixed = models.first().map_or(0, Model::extrema_fixed),
            weights = manifest.quantization.as_ref().map_or("f32", |q| q.weights.as_str()),
            device = ?config.device,
            executors = config.executors,
            name = %identity.name,
            sha256 = %identity.sha256,
            "model loaded"
        );
        let student = match &self.student_dir() {
            Some(dir) => {
                let student = Model::load_student(&self.env, dir, &manifest, config.intra_threads)?;
                for file in MODEL_FILES {
                    content.push(crate::model::sha256_hex(&dir.join(file))?);
                }
                tracing::info!(
                    student = %dir.display(),
                    degrade_queue_calls = config.degrade_queue_calls,
                    "student loaded: it answers calls that arrive while this many wait"
                );
                Some(student)
            }
            None => None,
        };
        Ok(Loaded {
            manifest,
            sessions: Sessions {
                models,
                student,
                identity,
            },
            stamp,
            content: content.join(","),
        })
    }

    /// Checks `loaded` against the sidecar `client` is attached to and
    /// starts its predictor (on the current tokio runtime).
    pub fn install(
        &self,
        loaded: Loaded,
        client: Arc<RingClient>,
        service: &Service,
    ) -> anyhow::Result<Predictor> {
        let Loaded {
            mut manifest,
            sessions,
            ..
        } = loaded;
        if let ClientStatus::Lost(why) = client.status() {
            bail!(
                "the sidecar is gone ({why}): a model is checked against the sidecar's graph \
                 before it serves"
            );
        }
        let (Some(schema), Some(geometry)) = (client.schema(), client.geometry()) else {
            bail!("no sidecar is attached: a model is checked against its graph before it serves");
        };
        // -1 (every neighbour) is this sidecar's cap of the hop.
        manifest.fanouts_at_caps(geometry.max_fanouts);
        let config = &self.config.fanouts_at_caps(geometry.max_fanouts);
        // What differs between the graph kinds is what is checked and how
        // the batcher asks; the predictor is one.
        let mut batching = match manifest.layout {
            ModelLayout::Subgraph => {
                check_on_graph(config, &client, &sessions, &schema, &geometry, &manifest)?
            }
            ModelLayout::Dense => check_on_dense(config, &schema, &geometry, &manifest)?,
        };
        batching.fit_to_ring(&geometry);
        self.start_predictor(client, sessions, schema, batching, &manifest, service)
    }

    /// The executor threads of a checked model and, with
    /// `precomputed_redis`, the follower of its precomputed answers (a
    /// graph-layout model's at its request, `batching.graph`).
    fn start_predictor(
        &self,
        client: Arc<RingClient>,
        sessions: Sessions,
        schema: protocol::FeatureSchema,
        batching: BatchConfig,
        manifest: &Manifest,
        service: &Service,
    ) -> anyhow::Result<Predictor> {
        let precomputed = match &self.config.precomputed_redis {
            None => None,
            Some(url) => {
                Some(self.precomputed(url, manifest, batching.graph.as_deref(), service)?)
            }
        };
        let predictor = Predictor::start(
            client,
            sessions,
            precomputed.as_ref().map(|(set, _)| set.clone()),
            schema,
            batching,
            service.metrics().clone(),
        )
        .context("starting the executor threads")?;
        if let Some((_, follower)) = precomputed {
            predictor.own(follower);
        }
        Ok(predictor)
    }

    /// The precomputed answers of the model in `config.model` and the task
    /// that follows them (ended with the predictor that uses them).
    fn precomputed(
        &self,
        url: &str,
        manifest: &Manifest,
        graph: Option<&protocol::request::GraphAsk>,
        service: &Service,
    ) -> anyhow::Result<(Arc<Precomputed>, tokio::task::AbortHandle)> {
        let config = &self.config;
        if manifest.layout == ModelLayout::Dense && manifest.outputs.len() < 2 {
            tracing::warn!(
                "the model has no h1 output; precomputed answers need a model exported by \
                 this release's sage.py (gnn-worker precompute refuses older ones)"
            );
        }
        redis::Client::open(url).map_err(|e| {
            anyhow::anyhow!(
                "precomputed_redis {:?} is not a Redis URL ({e}): give one such as \
                 redis://host:6379",
                daemon_kit::redact::redact_url(url)
            )
        })?;
        anyhow::ensure!(
            config.hub_min_degree == 0 || manifest.has_hub_input(),
            "hub_min_degree is {} but the model {} takes no stored hub embeddings (its \
             inputs have no {:?}): re-export it with this release's sage.py, or set \
             hub_min_degree 0",
            config.hub_min_degree,
            config.model.display(),
            crate::model::HUB_INPUT
        );
        let precomputed = Arc::new(Precomputed::default());
        let model_id = crate::precomputed::model_id(&config.model)?;
        let metrics = service.metrics().clone();
        let follower = tokio::spawn(precomputed.clone().follow(
            url.to_string(),
            model_id,
            manifest.output_width(),
            config.hub_min_degree > 0,
            graph.map(crate::precomputed::TypedSet::from),
            Duration::from_secs_f64(config.precomputed_check_s),
            move |set| {
                metrics
                    .precomputed_nodes
                    .set(set.map_or(0, |s| s.len() as i64));
            },
        ));
        Ok((precomputed, follower.abort_handle()))
    }
}

/// The fanouts a dense-layout model is served at: the configured two, or
/// the sidecar's default.
///
/// A dense model leaves them to the sidecar so that `sidecarctl fanouts
/// set` steers it at run time; where its manifest says it was trained at
/// others, that is logged, since its answers then differ from the
/// offline model's (docs/model.md, "The manifest").
fn dense_fanouts(
    config: &WorkerConfig,
    manifest: &Manifest,
    schema: &protocol::FeatureSchema,
) -> anyhow::Result<Vec<u32>> {
    match config.fanouts.as_ref().map(|f| f.0.clone()) {
        None => {
            let sidecar = schema.default_fanouts.to_vec();
            if manifest.fanouts != sidecar {
                tracing::warn!(
                    model = %config.model.display(),
                    trained = ?manifest.fanouts,
                    sidecar = ?sidecar,
                    "the dense model was trained at other fanouts than the sidecar's, \
                     which it is served at: set the worker's fanouts to the trained ones, \
                     or the sidecar's"
                );
            }
            Ok(sidecar)
        }
        Some(f) if f.len() == MAX_HOPS => Ok(f),
        Some(f) => bail!(
            "fanouts {f:?} has {} hops; the model {} reads the dense layout, which has two: \
             give two fanouts such as 20,10",
            f.len(),
            config.model.display()
        ),
    }
}

/// What set a rollout off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The model directory's files changed.
    FileChange,
    /// SIGHUP.
    Signal,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::FileChange => "file change",
            Trigger::Signal => "SIGHUP",
        }
    }
}

/// How a rollout ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The new model serves.
    Switched,
    /// The directory holds the model serving.
    Unchanged,
    /// The old model serves on; why the new one was refused.
    Refused(String),
}

/// The model serving: the files it was loaded from and what they held.
struct Serving {
    stamp: Stamp,
    content: String,
}

/// Rolls out the model in the `model` directory when its files change
/// (every `period`, unless `None`) or a reload is signalled on `reloads`,
/// for as long as `reloads`' sender lives. `loaded`: the model serving.
pub async fn watch(
    loader: Arc<Loader>,
    service: Service,
    loaded: (Stamp, String),
    period: Option<Duration>,
    mut reloads: tokio::sync::watch::Receiver<u64>,
) {
    let mut serving = Serving {
        stamp: loaded.0,
        content: loaded.1,
    };
    // The stamp seen at the last tick (a change is loaded once it stands
    // still for one period) and the last refused one (not tried again until
    // the files change again, or SIGHUP).
    let mut seen = serving.stamp.clone();
    let mut refused: Option<Stamp> = None;
    let mut tick = period.map(|p| {
        let mut tick = tokio::time::interval(p);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    });
    loop {
        let trigger = tokio::select! {
            _ = async { tick.as_mut().expect("checked").tick().await }, if tick.is_some() => {
                Trigger::FileChange
            }
            changed = reloads.changed() => match changed {
                Ok(()) => Trigger::Signal,
                Err(_) => return,
            },
        };
        let stamp = {
            let loader = loader.clone();
            match tokio::task::spawn_blocking(move || loader.stamp()).await {
                Ok(stamp) => stamp,
                Err(_) => continue,
            }
        };
        if trigger == Trigger::FileChange {
            let settled = stamp == seen;
            seen = stamp.clone();
            if stamp == serving.stamp || refused.as_ref() == Some(&stamp) || !settled {
                continue;
            }
        }
        match rollout(&loader, &service, &serving.content, trigger).await {
            (Outcome::Refused(_), _) => refused = Some(stamp.clone()),
            (_, Some(now)) => {
                serving = now;
                refused = None;
            }
            (_, None) => {
                serving.stamp = stamp.clone();
                refused = None;
            }
        }
        seen = stamp;
    }
}

/// One rollout: load, compare, check, switch. Counted and logged.
async fn rollout(
    loader: &Arc<Loader>,
    service: &Service,
    serving: &str,
    trigger: Trigger,
) -> (Outcome, Option<Serving>) {
    let started = Instant::now();
    let model_dir = loader.config().model.display().to_string();
    let before = service.model();
    let attempt = async {
        let loaded = {
            let loader = loader.clone();
            tokio::task::spawn_blocking(move || loader.load())
                .await
                .context("the loading thread failed")??
        };
        if loaded.content == serving {
            return Ok((Outcome::Unchanged, None));
        }
        let client = service
            .predictor()
            .map(|p| p.client().clone())
            .context("the worker has no sidecar attached yet")?;
        let now = Serving {
            stamp: loaded.stamp.clone(),
            content: loaded.content.clone(),
        };
        let predictor = loader.install(loaded, client, service)?;
        service.set_predictor(predictor);
        anyhow::Ok((Outcome::Switched, Some(now)))
    };
    let (outcome, now) = match attempt.await {
        Ok(done) => done,
        Err(e) => (Outcome::Refused(format!("{e:#}")), None),
    };
    let after = service.model();
    let name = |m: &Option<Arc<ModelIdentity>>| m.as_ref().map(|m| m.to_string());
    match &outcome {
        Outcome::Switched => {
            service
                .metrics()
                .model_rollouts
                .get_or_create(&RolloutOutcome {
                    outcome: "switched",
                })
                .inc();
            tracing::info!(
                trigger = trigger.as_str(),
                from = ?name(&before),
                to = ?name(&after),
                seconds = started.elapsed().as_secs_f64(),
                "model switched: new calls go to the new model"
            );
        }
        Outcome::Unchanged => tracing::info!(
            trigger = trigger.as_str(),
            model = ?name(&after),
            "model directory unchanged: the model serving is the one there"
        ),
        Outcome::Refused(why) => {
            service
                .metrics()
                .model_rollouts
                .get_or_create(&RolloutOutcome { outcome: "refused" })
                .inc();
            tracing::warn!(
                trigger = trigger.as_str(),
                dir = %model_dir,
                serving = ?name(&after),
                error = %why,
                "model rollout refused; the model serving keeps serving (fix the directory, \
                 or send SIGHUP to try again)"
            );
        }
    }
    (outcome, now)
}

/// The stamp and content key of a model loaded at start, for [`watch`].
pub fn serving_key(loaded: &Loaded) -> (Stamp, String) {
    (loaded.stamp.clone(), loaded.content.clone())
}

/// A dense-layout model checked against the sidecar's segment: its
/// fanouts (the configured ones, or the sidecar's) and its degraded
/// fanouts; returns how the batcher asks.
fn check_on_dense(
    config: &WorkerConfig,
    schema: &protocol::FeatureSchema,
    geometry: &protocol::Geometry,
    manifest: &Manifest,
) -> anyhow::Result<BatchConfig> {
    let fanouts = dense_fanouts(config, manifest, schema)?;
    manifest.check_dense_segment(schema, geometry, &fanouts)?;
    if let Some(reduced) = &config.degrade_fanouts {
        if reduced.0.len() != MAX_HOPS {
            bail!(
                "degrade_fanouts {reduced} has {} hops; the model {} reads the dense \
                 layout, which has two: give two fanouts such as 5,3",
                reduced.0.len(),
                config.model.display()
            );
        }
        for (hop, f) in reduced.0.iter().enumerate() {
            let cap = geometry.max_fanouts[hop];
            if *f > cap {
                bail!(
                    "degrade_fanouts {reduced}: hop {} is {f}, above the sidecar's max \
                     fanout {cap}; lower degrade_fanouts (it should be smaller than the \
                     worker's fanouts)",
                    hop + 1
                );
            }
        }
    }
    tracing::info!(
        fanouts = ?fanouts,
        "model checked against the sidecar (fanouts: the configured ones, or the sidecar's)"
    );
    Ok(BatchConfig::from_config(config))
}

/// A graph-layout model (a typed graph's, or a one-type graph's as the 1x1
/// graph) checked against the sidecar's graph: at its manifest's fanouts,
/// or the configured `fanouts` for every edge type it samples (PyG's
/// `num_neighbors` list on a HeteroData), and `degrade_fanouts` likewise;
/// returns how the batcher asks. Hub embeddings are the dense layout's; a
/// student is distilled from a one-type graph's model.
fn check_on_graph(
    config: &WorkerConfig,
    client: &RingClient,
    sessions: &Sessions,
    schema: &protocol::FeatureSchema,
    geometry: &protocol::Geometry,
    manifest: &Manifest,
) -> anyhow::Result<BatchConfig> {
    anyhow::ensure!(
        config.hub_min_degree == 0,
        "hub embeddings are a dense-layout feature (docs/strategies.md, \"PyTorch \
         Geometric models\"); the model {} reads the graph layout: set hub_min_degree 0",
        config.model.display()
    );
    let one_type = manifest.graph.as_ref().is_some_and(|g| g.one_type);
    anyhow::ensure!(
        one_type || sessions.student.is_none(),
        "the model {} is of a typed graph: a student (sage.py distill) stands in for a model of \
         a one-type graph, reading its one feature table; serve a typed model without one \
         (docs/model.md, \"Serving a heterogeneous model\")",
        config.model.display()
    );
    let graph = client
        .graph()
        .context("the sidecar went away while the model was checked")?;
    let configured = config
        .fanouts
        .as_ref()
        .map(|f| ("fanouts (--fanouts)", f.0.as_slice()));
    let ask = manifest.check_graph_segment(schema, geometry, &graph, configured)?;
    let degrade = match &config.degrade_fanouts {
        None => None,
        Some(f) => Some(Arc::new(manifest.check_graph_segment(
            schema,
            geometry,
            &graph,
            Some(("degrade_fanouts", f.0.as_slice())),
        )?)),
    };
    tracing::info!(
        target_type = ask.target_type,
        hops = ask.hops,
        fanouts = ?ask.fanouts,
        "model checked against the sidecar's graph (fanouts: per edge type of the graph and \
         hop)"
    );
    let mut batching = BatchConfig::from_config(config);
    batching.graph = Some(Arc::new(ask));
    batching.degrade_graph = degrade;
    Ok(batching)
}
