//! `gnn-worker serve`'s configuration: every setting, its default, its
//! range.
//!
//! [`WorkerConfig`] is the one declaration: each field is a key of the TOML
//! file, an environment variable `GNN_WORKER_<KEY>` and a flag `--<key>`
//! ([`WorkerFlags`], checked against it by a test); its `Default` is the one
//! set of defaults. Precedence and error reporting are
//! `daemon_kit::config`'s: flags > environment > file > defaults.
//! `docs/configuration.md` has the table of every key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use daemon_kit::config::{HopFanouts, Invalid, RingSpin, Spec, Validate};
use daemon_kit::logging::LogFormat;
use serde::{Deserialize, Serialize};

use crate::model::Device;

/// The worker's layering: `GNN_WORKER_*` variables, keys documented in
/// docs/configuration.md.
pub const SPEC: Spec = Spec {
    env_prefix: "GNN_WORKER_",
    docs: "docs/configuration.md",
};

/// Everything `gnn-worker serve` is told. Field docs are the keys' docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Model directory: model.onnx and manifest.json.
    pub model: PathBuf,
    /// How often the model directory is checked for a new model to roll
    /// out without a restart, seconds; 0: only on SIGHUP.
    pub model_watch_s: f64,
    /// The name the model is served under (`model` in answers, `/readyz`,
    /// the Open Inference Protocol's model name); unset: the manifest's
    /// `name`, else the model directory's name.
    pub model_name: Option<String>,
    /// An MLP student's directory (`sage.py distill`); unset: the model
    /// directory's own `student/` if it has one, else none. With one, calls
    /// that arrive while the batcher's queue is long are answered by it on
    /// their own rows.
    pub student: Option<PathBuf>,
    /// With a student: calls waiting for the batcher from which a new call
    /// is answered by the student (0: every call).
    pub degrade_queue_calls: usize,
    /// The fanouts of the ladder's reduced GNN rung, for calls whose
    /// deadline the full fanouts would miss (as many hops as the model's
    /// fanouts); unset: no such rung.
    pub degrade_fanouts: Option<HopFanouts>,
    /// Redis holding `gnn-worker precompute`'s answers; unset: none. With
    /// one, nodes whose sample has not changed since are answered from it.
    pub precomputed_redis: Option<String>,
    /// How often the worker looks for a new precomputed set, seconds.
    pub precomputed_check_s: f64,
    /// With precomputed_redis: whether fresh stored answers are served
    /// (false: the set only feeds the hub embeddings).
    pub precomputed_answers: bool,
    /// With precomputed_redis: hop-1 nodes of at least this degree whose
    /// stored layer-1 embedding stands are sent without their
    /// neighbourhood; 0: off.
    pub hub_min_degree: u32,
    /// The sidecar's shared-memory segment name.
    pub shm_name: String,
    /// gRPC listen address.
    pub grpc: SocketAddr,
    /// HTTP/JSON listen address (predict, healthz, readyz, metrics).
    pub http: SocketAddr,
    /// A plaintext listener of /healthz, /readyz and /metrics alone, for
    /// probes and scrapes when the front ends speak TLS; unset: none.
    pub health_addr: Option<SocketAddr>,
    /// The server certificate chain (PEM) of the gRPC and HTTP ports;
    /// with tls_key, both speak TLS only. Unset: plaintext.
    pub tls_cert: Option<PathBuf>,
    /// tls_cert's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// With TLS: the CA (PEM) whose certificate every client must present
    /// (mutual TLS); unset: no client certificate asked for.
    pub tls_client_ca: Option<PathBuf>,
    /// cpu, or cuda (never falls back to the CPU silently).
    pub device: Device,
    /// libonnxruntime.so to load; unset: $ORT_DYLIB_PATH, then the system
    /// library path.
    pub onnxruntime_lib: Option<PathBuf>,
    /// Fanouts sent with every ring request; unset: for a dense-layout
    /// model the sidecar's current fanouts (`sidecarctl fanouts set` then
    /// applies), for a subgraph-layout model its manifest's (one per hop:
    /// a value given here has as many).
    pub fanouts: Option<HopFanouts>,
    /// Rewrite a subgraph-layout model's row scatter-adds as `ScatterND`
    /// at load (same sums, a faster kernel; docs/model.md).
    pub fast_scatter: bool,
    /// Most targets gathered into one batch.
    pub max_batch: usize,
    /// Longest a call waits for others to batch with, milliseconds.
    pub max_delay_ms: f64,
    /// Most node ids one client call may ask for.
    pub max_request_targets: usize,
    /// Model executor threads, each with its own ONNX Runtime session.
    pub executors: usize,
    /// Batches in flight at once: on the ring, waiting for a model executor,
    /// or in a model run (each holds its slot until its run ends); calls
    /// gather into batches only while this many are in flight. At most the
    /// segment's slot count.
    pub ring_concurrency: usize,
    /// Whether a call that finds the worker idle runs to completion on the
    /// runtime thread that took it (docs/serving.md).
    pub run_to_completion: bool,
    /// ONNX Runtime intra-op threads per session.
    pub intra_threads: usize,
    /// Deadline of one ring call, milliseconds.
    pub ring_timeout_ms: f64,
    /// How long a ring call spins, re-checking for its response, before it
    /// parks: auto (learned) or microseconds (docs/serving.md, "Spinning").
    pub ring_spin_us: RingSpin,
    /// The deadline of a client call that brings none, milliseconds: past
    /// it, a call still waiting for the batcher is dropped.
    pub call_timeout_ms: f64,
    /// Seconds an HTTP connection may take to deliver a whole request head
    /// after connecting or after its previous answer (half-sent requests
    /// and idle keep-alive connections alike).
    pub http_read_timeout_s: f64,
    /// Connections each port holds at once.
    pub max_connections: usize,
    /// How long to wait for the sidecar's segment at start, seconds; 0
    /// waits for ever (not ready meanwhile).
    pub attach_timeout_s: f64,
    /// On SIGTERM, seconds the worker keeps serving while reporting not
    /// ready (so a load balancer stops sending first), before it stops.
    pub shutdown_delay_s: f64,
    /// Log lines as text or json.
    pub log_format: LogFormat,
    /// Log level (tracing directives); SIGHUP re-reads it.
    pub log_level: String,
    /// OTLP/gRPC endpoint the calls' spans go to (a collector, Jaeger),
    /// e.g. http://otel-collector:4317; unset: no traces.
    pub otlp_endpoint: Option<String>,
    /// With otlp_endpoint: the share of calls traced when the client sent
    /// no sampled `traceparent` (0 to 1).
    pub trace_sample_ratio: f64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::new(),
            model_watch_s: 5.0,
            model_name: None,
            student: None,
            degrade_queue_calls: 1024,
            degrade_fanouts: None,
            precomputed_redis: None,
            precomputed_check_s: 10.0,
            precomputed_answers: true,
            hub_min_degree: 0,
            shm_name: "gnn-sidecar".into(),
            grpc: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            health_addr: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            device: Device::Cpu,
            onnxruntime_lib: None,
            fanouts: None,
            fast_scatter: true,
            max_batch: 64,
            max_delay_ms: 2.0,
            max_request_targets: 4096,
            executors: 2,
            ring_concurrency: 2,
            run_to_completion: true,
            ring_spin_us: RingSpin::Auto,
            intra_threads: 1,
            ring_timeout_ms: 500.0,
            call_timeout_ms: 30_000.0,
            http_read_timeout_s: 10.0,
            max_connections: 512,
            attach_timeout_s: 0.0,
            shutdown_delay_s: 0.0,
            log_format: LogFormat::Text,
            log_level: "info".into(),
            otlp_endpoint: None,
            trace_sample_ratio: 0.01,
        }
    }
}

fn between(key: &'static str, value: f64, low: f64, high: f64) -> Result<(), Invalid> {
    if value.is_finite() && (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(Invalid::new(
            key,
            format!("{value} is outside {low}..={high}"),
            format!("set {key} between {low} and {high}"),
        ))
    }
}

impl Validate for WorkerConfig {
    fn validate(&self) -> Result<(), Invalid> {
        if self.model.as_os_str().is_empty() {
            return Err(Invalid::new(
                "model",
                "is not set",
                "pass --model, set GNN_WORKER_MODEL, or model in the config file",
            ));
        }
        if let Some(name) = &self.model_name {
            crate::model::check_model_name(name).map_err(|e| {
                Invalid::new(
                    "model_name",
                    e,
                    "use letters, digits, '.', '_' and '-' (a URL path segment), 1 to 128",
                )
            })?;
        }
        // The sidecar's rule, from the crate both link: a name one side
        // takes, the other takes too.
        protocol::segment::shm_path(&self.shm_name).map_err(|e| {
            Invalid::new(
                "shm_name",
                e,
                "use the sidecar's shm_name, a plain name such as gnn-sidecar",
            )
        })?;
        if self.grpc == self.http && self.http.port() != 0 {
            return Err(Invalid::new(
                "http",
                format!("{} is also the gRPC address", self.http),
                "give HTTP and gRPC different ports",
            ));
        }
        self.validate_tls()?;
        for (key, fanouts) in [
            ("fanouts", &self.fanouts),
            ("degrade_fanouts", &self.degrade_fanouts),
        ] {
            if let Some(fanouts) = fanouts {
                if fanouts.0.contains(&0) {
                    return Err(Invalid::new(
                        key,
                        format!("{fanouts} has a zero fanout"),
                        "leave it unset, or give fanouts of at least 1 (one per hop of the model)",
                    ));
                }
            }
        }
        between(
            "degrade_queue_calls",
            self.degrade_queue_calls as f64,
            0.0,
            crate::queue::MAX_QUEUED_CALLS as f64,
        )?;
        between(
            "precomputed_check_s",
            self.precomputed_check_s,
            0.1,
            3_600.0,
        )?;
        if let Some(problem) = self
            .precomputed_redis
            .as_deref()
            .and_then(daemon_kit::redact::redis_url_problem)
        {
            return Err(Invalid::new(
                "precomputed_redis",
                problem,
                "write it as redis://[:password@]host:port",
            ));
        }
        if self.hub_min_degree > 0 && self.precomputed_redis.is_none() {
            return Err(Invalid::new(
                "hub_min_degree",
                format!(
                    "is {} but precomputed_redis is not set: the hubs' layer-1 embeddings come \
                     from a precomputed set",
                    self.hub_min_degree
                ),
                "set precomputed_redis (and run gnn-worker precompute), or hub_min_degree 0",
            ));
        }
        if !self.precomputed_answers && self.precomputed_redis.is_none() {
            return Err(Invalid::new(
                "precomputed_answers",
                "is false but precomputed_redis is not set",
                "leave precomputed_answers at true, or set precomputed_redis",
            ));
        }
        between("max_batch", self.max_batch as f64, 1.0, 65_536.0)?;
        between("max_delay_ms", self.max_delay_ms, 0.0, 1_000.0)?;
        between(
            "max_request_targets",
            self.max_request_targets as f64,
            1.0,
            1_048_576.0,
        )?;
        between("executors", self.executors as f64, 1.0, 256.0)?;
        between(
            "ring_concurrency",
            self.ring_concurrency as f64,
            1.0,
            1024.0,
        )?;
        between("intra_threads", self.intra_threads as f64, 1.0, 256.0)?;
        between("ring_timeout_ms", self.ring_timeout_ms, 1.0, 600_000.0)?;
        between("call_timeout_ms", self.call_timeout_ms, 1.0, 3_600_000.0)?;
        between("http_read_timeout_s", self.http_read_timeout_s, 0.1, 3600.0)?;
        between("max_connections", self.max_connections as f64, 1.0, 65536.0)?;
        between("attach_timeout_s", self.attach_timeout_s, 0.0, 86_400.0)?;
        if self.model_watch_s != 0.0 {
            between("model_watch_s", self.model_watch_s, 0.1, 3_600.0).map_err(|_| {
                Invalid::new(
                    "model_watch_s",
                    format!("{} is neither 0 nor within 0.1..=3600", self.model_watch_s),
                    "set model_watch_s between 0.1 and 3600, or 0 to roll out on SIGHUP only",
                )
            })?;
        }
        between("shutdown_delay_s", self.shutdown_delay_s, 0.0, 3_600.0)?;
        daemon_kit::logging::parse_level(&self.log_level)
            .map_err(|e| Invalid::new("log_level", e, "set a level such as info"))?;
        between("trace_sample_ratio", self.trace_sample_ratio, 0.0, 1.0)?;
        daemon_kit::traces::check_endpoint(self.otlp_endpoint.as_deref())?;
        Ok(())
    }
}

impl WorkerConfig {
    /// TLS is both files or neither, a client CA only with TLS, and the
    /// health listener on a port of its own.
    fn validate_tls(&self) -> Result<(), Invalid> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => {
                return Err(Invalid::new(
                    "tls_key",
                    "is not set but tls_cert is",
                    "set tls_key to the certificate's private key (PEM), or unset tls_cert",
                ))
            }
            (None, Some(_)) => {
                return Err(Invalid::new(
                    "tls_cert",
                    "is not set but tls_key is",
                    "set tls_cert to the server's certificate chain (PEM), or unset tls_key",
                ))
            }
            _ => {}
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            return Err(Invalid::new(
                "tls_client_ca",
                "is set but TLS is off (no tls_cert)",
                "set tls_cert and tls_key too, or unset tls_client_ca",
            ));
        }
        if let Some(addr) = self.health_addr {
            if addr.port() != 0 && (addr == self.grpc || addr == self.http) {
                return Err(Invalid::new(
                    "health_addr",
                    format!("{addr} is also the gRPC or HTTP address"),
                    "give the health listener a port of its own",
                ));
            }
        }
        Ok(())
    }

    /// This configuration with each -1 fanout (every neighbour) made the
    /// sidecar's cap of its hop (a third hop capped as the second), as
    /// the sidecar it serves beside states them.
    pub fn fanouts_at_caps(&self, caps: [u32; protocol::layout::MAX_HOPS]) -> Self {
        let cap = |hop: usize| caps[hop.min(caps.len() - 1)];
        Self {
            fanouts: self.fanouts.as_ref().map(|f| f.at_caps(cap)),
            degrade_fanouts: self.degrade_fanouts.as_ref().map(|f| f.at_caps(cap)),
            ..self.clone()
        }
    }

    /// The configuration as `--print-config` shows it: the Redis password
    /// of `precomputed_redis` replaced by `***`.
    pub fn redacted(&self) -> Self {
        Self {
            precomputed_redis: self
                .precomputed_redis
                .as_deref()
                .map(daemon_kit::redact::redact_url),
            ..self.clone()
        }
    }

    pub fn max_delay(&self) -> Duration {
        Duration::from_secs_f64(self.max_delay_ms / 1e3)
    }

    pub fn ring_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.ring_timeout_ms / 1e3)
    }

    pub fn call_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.call_timeout_ms / 1e3)
    }

    pub fn shutdown_delay(&self) -> Duration {
        Duration::from_secs_f64(self.shutdown_delay_s)
    }

    /// `None`: the model directory is not watched (SIGHUP only).
    pub fn model_watch(&self) -> Option<Duration> {
        (self.model_watch_s > 0.0).then(|| Duration::from_secs_f64(self.model_watch_s))
    }

    /// `None`: wait for ever.
    pub fn attach_timeout(&self) -> Option<Duration> {
        (self.attach_timeout_s > 0.0).then(|| Duration::from_secs_f64(self.attach_timeout_s))
    }
}

/// The flags of `gnn-worker serve`: one per key of [`WorkerConfig`], all
/// optional (a flag not given leaves the lower layers' value).
#[derive(Debug, Default, clap::Args, Serialize)]
pub struct WorkerFlags {
    /// Model directory: model.onnx and manifest.json (gnn-worker/model/sage.py).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Seconds between checks of the model directory for a new model to
    /// roll out; 0: on SIGHUP only [default: 5].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_watch_s: Option<f64>,
    /// The name the model is served under (answers, /readyz, the Open
    /// Inference Protocol) [default: the manifest's name, else the model
    /// directory's name].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// An MLP student's directory (sage.py distill), answering on the
    /// targets' own rows when the batcher's queue is long [default: the
    /// model directory's student/ if it has one, else none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub student: Option<PathBuf>,
    /// With --student: calls waiting for the batcher from which a new call
    /// is answered by the student; 0: every call [default: 1024].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degrade_queue_calls: Option<usize>,
    /// Fanouts of the ladder's reduced GNN rung, e.g. 5,3 [default: none].
    #[arg(long, allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degrade_fanouts: Option<HopFanouts>,
    /// Redis URL of gnn-worker precompute's answers, served while they
    /// stand [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precomputed_redis: Option<String>,
    /// How often to look for a new precomputed set, seconds [default: 10].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precomputed_check_s: Option<f64>,
    /// With --precomputed-redis: serve fresh stored answers (false: the
    /// set only feeds the hub embeddings) [default: true].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precomputed_answers: Option<bool>,
    /// With --precomputed-redis: send hop-1 nodes of at least this degree
    /// without their neighbourhood while their stored layer-1 embedding
    /// stands; 0: off [default: 0].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_min_degree: Option<u32>,
    /// The sidecar's shared-memory segment name [default: gnn-sidecar].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_name: Option<String>,
    /// gRPC listen address [default: 127.0.0.1:50051].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc: Option<SocketAddr>,
    /// HTTP/JSON listen address [default: 127.0.0.1:8080].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
    /// Plaintext /healthz, /readyz and /metrics alone, for probes when the
    /// front ends speak TLS [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_addr: Option<SocketAddr>,
    /// Server certificate chain (PEM): the gRPC and HTTP ports speak TLS
    /// [default: none, plaintext].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM) [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// With TLS, the CA (PEM) whose certificate every client must present
    /// [default: none, no client certificate].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
    /// cpu or cuda [default: cpu].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<Device>,
    /// libonnxruntime.so to load [default: $ORT_DYLIB_PATH, then the system library path].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub onnxruntime_lib: Option<PathBuf>,
    /// Fanouts sent with every request, e.g. 20,10 (a subgraph-layout
    /// model: one per hop) [default: the sidecar's; a subgraph-layout
    /// model's manifest's].
    #[arg(long, allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fanouts: Option<HopFanouts>,
    /// Rewrite a subgraph-layout model's row scatter-adds at load
    /// [default: true].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_scatter: Option<bool>,
    /// Most targets gathered into one batch [default: 64].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<usize>,
    /// Longest a call waits for others to batch with, ms [default: 2].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<f64>,
    /// Most node ids one client call may ask for [default: 4096].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_request_targets: Option<usize>,
    /// Model executor threads [default: 2].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executors: Option<usize>,
    /// Batches in flight at once (on the ring or in a model run) [default: 2].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_concurrency: Option<usize>,
    /// Run a call that finds the worker idle to completion on the thread
    /// that took it (false: every call through the pipeline's threads)
    /// [default: true].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_to_completion: Option<bool>,
    /// How long a ring call spins for its response before it parks: auto
    /// (learned) or microseconds 0 to 1000000 [default: auto].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_spin_us: Option<RingSpin>,
    /// ONNX Runtime intra-op threads per session [default: 1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intra_threads: Option<usize>,
    /// Deadline of one ring call, ms [default: 500].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_timeout_ms: Option<f64>,
    /// Deadline of a call that brings none, ms [default: 30000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<f64>,
    /// Seconds an HTTP connection has to send a whole request head after
    /// connecting or after its previous answer [default: 10].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_read_timeout_s: Option<f64>,
    /// Connections each port (gRPC, HTTP) holds at once [default: 512].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// Seconds to wait for the sidecar at start; 0 waits for ever [default: 0].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_timeout_s: Option<f64>,
    /// Seconds to keep serving, not ready, after SIGTERM [default: 0].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_delay_s: Option<f64>,
    /// Log lines as text or json [default: text].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// Log level, e.g. info or gnn_worker=debug,warn [default: info].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// OTLP/gRPC endpoint for traces, e.g. http://otel-collector:4317
    /// [default: none, no traces].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// Share of calls traced without a sampled traceparent, 0 to 1
    /// [default: 0.01].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_sample_ratio: Option<f64>,
}

impl daemon_kit::startup::Settings for WorkerConfig {
    fn redacted(&self) -> Self {
        WorkerConfig::redacted(self)
    }

    fn log_format(&self) -> daemon_kit::logging::LogFormat {
        self.log_format
    }

    fn log_level(&self) -> &str {
        &self.log_level
    }

    fn traces(&self) -> daemon_kit::traces::TraceSettings {
        daemon_kit::traces::TraceSettings {
            endpoint: self.otlp_endpoint.clone(),
            sample_ratio: self.trace_sample_ratio,
            service: "gnn-worker",
        }
    }

    fn traced_targets(&self) -> &'static [&'static str] {
        &["gnn_worker"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: WorkerFlags,
    }

    #[test]
    fn every_key_has_a_flag_and_every_flag_a_key() {
        let keys = daemon_kit::config::keys_of::<WorkerConfig>();
        let flags: std::collections::BTreeSet<String> = Cli::command()
            .get_arguments()
            .filter(|a| a.get_long().is_some())
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(keys, flags);
    }

    #[test]
    fn the_defaults_are_valid_once_a_model_is_given() {
        assert_eq!(WorkerConfig::default().validate().unwrap_err().key, "model");
        let config = WorkerConfig {
            model: "/models/cora".into(),
            ..WorkerConfig::default()
        };
        config.validate().unwrap();
        let bad = WorkerConfig {
            max_delay_ms: f64::NAN,
            ..config
        };
        assert_eq!(bad.validate().unwrap_err().key, "max_delay_ms");
    }
}
