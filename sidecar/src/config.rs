//! `sidecar serve`'s configuration: every setting, its default, its range.
//!
//! [`ServeConfig`] is the one declaration: each field is a key of the TOML
//! file, an environment variable `SIDECAR_<KEY>` and a flag `--<key>`
//! ([`ServeFlags`], checked against it by a test). Its `Default` is the one
//! set of defaults (the ring's geometry defaults come from
//! [`protocol::segment::defaults`]). Precedence and error reporting are
//! `daemon_kit::config`'s: flags > environment > file > defaults.
//! `docs/configuration.md` has the table of every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use daemon_kit::config::{Fanouts, Invalid, RingSpin, Spec, Validate};
use daemon_kit::logging::LogFormat;
use protocol::layout::{MAX_FANOUT, MAX_HOPS, MAX_SLOTS};
use protocol::segment::defaults;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use daemon_kit::redact::redact_url as redact;

/// The sidecar's layering: `SIDECAR_*` variables, keys documented in
/// docs/configuration.md.
pub const SPEC: Spec = Spec {
    env_prefix: "SIDECAR_",
    docs: "docs/configuration.md",
};

/// Which default row a fallback gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultRowKind {
    Zeros,
    Mean,
}

/// A file mode written in octal: `"660"` (a string in TOML; a bare `660`
/// from a flag or variable is read as octal digits too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmMode(pub u32);

impl std::str::FromStr for ShmMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let digits = s.trim_start_matches("0o");
        u32::from_str_radix(digits, 8)
            .map(ShmMode)
            .map_err(|_| format!("{s:?} is not an octal file mode such as \"600\" or \"660\""))
    }
}

impl Serialize for ShmMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:o}", self.0))
    }
}

impl<'de> Deserialize<'de> for ShmMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Number(u64),
        }
        let text = match Either::deserialize(d)
            .map_err(|_| serde::de::Error::custom("expected an octal file mode such as \"660\""))?
        {
            Either::Text(text) => text,
            // An environment variable or flag `660` arrives as a number:
            // its decimal digits are the octal digits that were typed.
            Either::Number(n) => n.to_string(),
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Redis URLs: one string (comma-separated for several) or a list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisUrls(pub Vec<String>);

impl Serialize for RedisUrls {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for RedisUrls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            List(Vec<String>),
        }
        Ok(RedisUrls(
            match Either::deserialize(d)
                .map_err(|_| serde::de::Error::custom("expected a Redis URL or a list of them"))?
            {
                Either::Text(text) => daemon_kit::redact::url_list(&text)
                    .iter()
                    .map(|u| u.trim())
                    .filter(|u| !u.is_empty())
                    .map(str::to_string)
                    .collect(),
                Either::List(list) => list,
            },
        ))
    }
}

/// Everything `sidecar serve` is told. Field docs are the keys' docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// The directory `sidecar import` wrote (graph.csr, the feature store).
    pub data_dir: PathBuf,
    /// A dataset directory imported into `data_dir` at start when it holds
    /// no graph index yet (embedded store only): a first start with no
    /// separate import step (demos, the dev pod).
    pub seed_dataset: Option<PathBuf>,
    /// Name of the shared-memory segment under /dev/shm.
    pub shm_name: String,
    /// Segment file mode, octal: 600, or 660 when the pod's containers
    /// share a group.
    pub shm_mode: ShmMode,
    /// Redis URL(s) of the feature store (when imported with --redis).
    pub redis: RedisUrls,
    /// The `redis` URLs are nodes of a Redis Cluster.
    pub redis_cluster: bool,
    /// PEM CA certificate for rediss:// servers signed by a private CA.
    pub redis_ca: Option<PathBuf>,
    /// Redis pub/sub channel of node ids to invalidate.
    pub invalidation_channel: Option<String>,
    /// Fanouts of requests that leave them to the sidecar (0); changeable
    /// at run time (`sidecarctl fanouts set`).
    pub fanouts: Fanouts,
    /// The most each hop's fanout may be.
    pub max_fanouts: Fanouts,
    /// Ring slots (requests in flight at once).
    pub slots: u32,
    /// Threads serving the ring: a batch waiting for its rows blocks only
    /// its own thread.
    pub serve_threads: usize,
    /// Most target ids per request.
    pub max_targets: u32,
    /// Most node-table rows per response.
    pub max_nodes: u32,
    /// Edges a new node carried in a predict request (`NEW_NODE`) may have:
    /// each slot's request area is sized for its feature row and this many.
    pub max_new_node_edges: u32,
    /// Response area per slot, MiB (tmpfs pages are only allocated when used).
    pub response_mib: u64,
    /// Longest a batch waits for feature rows from L2/L3 before serving
    /// default rows, milliseconds (a request's own earlier deadline wins);
    /// changeable at run time (`sidecarctl deadline set`).
    pub deadline_ms: f64,
    /// L1 cache size, MiB of row data (the pinned hot set comes on top).
    pub l1_mib: u64,
    /// Top-degree nodes pinned in L1 before the sidecar reports ready.
    pub warm_up: usize,
    /// Row served for a missing or late feature row: zeros or mean.
    pub default_row: DefaultRowKind,
    /// Admin Unix socket for sidecarctl (mode 0600).
    pub admin_socket: Option<PathBuf>,
    /// Seconds without a worker heartbeat before its slots are reclaimed.
    pub client_timeout_s: f64,
    /// How long the ring server spins, re-checking for a request, before it
    /// parks: auto (learned) or microseconds (docs/serving.md, "Spinning").
    pub ring_spin_us: RingSpin,
    /// Longest a drain (sidecarctl drain, SIGTERM) waits for submitted
    /// requests to be answered, seconds.
    pub drain_timeout_s: f64,
    /// L2 RocksDB cache in front of Redis (default: <data_dir>/l2-cache);
    /// put it on local NVMe. Kept across restarts.
    pub l2_dir: Option<PathBuf>,
    /// Size bound of the L2 cache, MiB.
    pub l2_mib: u64,
    /// Seconds an L2 row is served before it is fetched from Redis again.
    pub l2_ttl_s: u64,
    /// No L2 cache: L1 misses go straight to Redis.
    pub no_l2: bool,
    /// Address of the HTTP endpoint: GET /metrics, /healthz, /readyz.
    pub metrics_addr: Option<SocketAddr>,
    /// Log lines as text or json.
    pub log_format: LogFormat,
    /// Log level (tracing directives, e.g. info or sidecar=debug,warn);
    /// changeable at run time (`sidecarctl log-level set`).
    pub log_level: String,
    /// OTLP/gRPC endpoint the spans of traced requests go to (a collector,
    /// Jaeger), e.g. http://otel-collector:4317; unset: no traces.
    pub otlp_endpoint: Option<String>,
    /// Graph delta entries (nodes with added edges, added nodes, added
    /// edges) past which the graph compacts by itself in the background;
    /// 0: only on `sidecarctl graph compact`.
    pub compact_after: u64,
    /// The update stream (Redis Stream key) to follow (docs/updates.md).
    pub updates_stream: Option<String>,
    /// Redis URL(s) of the update stream (default: `redis`); several only
    /// with `redis_cluster`.
    pub updates_redis: RedisUrls,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::new(),
            seed_dataset: None,
            shm_name: "gnn-sidecar".into(),
            shm_mode: ShmMode(defaults::MODE),
            redis: RedisUrls::default(),
            redis_cluster: false,
            redis_ca: None,
            invalidation_channel: None,
            fanouts: Fanouts([20, 10]),
            max_fanouts: Fanouts(defaults::MAX_FANOUTS),
            slots: defaults::SLOT_COUNT,
            serve_threads: 2,
            max_targets: defaults::MAX_TARGETS,
            max_nodes: defaults::MAX_NODES,
            max_new_node_edges: defaults::MAX_NEW_NODE_EDGES,
            response_mib: defaults::RESPONSE_BYTES >> 20,
            deadline_ms: 20.0,
            l1_mib: 256,
            warm_up: 10_000,
            default_row: DefaultRowKind::Mean,
            admin_socket: None,
            client_timeout_s: defaults::CLIENT_TIMEOUT.as_secs_f64(),
            ring_spin_us: RingSpin::Auto,
            drain_timeout_s: 30.0,
            l2_dir: None,
            l2_mib: 4096,
            l2_ttl_s: 3600,
            no_l2: false,
            metrics_addr: None,
            log_format: LogFormat::Text,
            log_level: "info".into(),
            otlp_endpoint: None,
            compact_after: 1_000_000,
            updates_stream: None,
            updates_redis: RedisUrls::default(),
        }
    }
}

/// Largest `response_mib`: a slot's response area is addressed with u32
/// offsets in places; 1 GiB per slot is far beyond any real neighbourhood.
pub const MAX_RESPONSE_MIB: u64 = 1024;
/// Smallest `deadline_ms` (10 microseconds).
pub const MIN_DEADLINE_MS: f64 = 0.01;

/// Largest `deadline_ms` (a minute).
pub const MAX_DEADLINE_MS: f64 = 60_000.0;

fn finite_between(
    key: &'static str,
    value: f64,
    low: f64,
    high: f64,
    unit: &str,
) -> Result<(), Invalid> {
    if value.is_finite() && (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(Invalid::new(
            key,
            format!("{value} is outside {low}..={high} {unit}"),
            format!("set {key} between {low} and {high}"),
        ))
    }
}

fn u64_between(key: &'static str, value: u64, low: u64, high: u64) -> Result<(), Invalid> {
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(Invalid::new(
            key,
            format!("{value} is outside {low}..={high}"),
            format!("set {key} between {low} and {high}"),
        ))
    }
}

impl Validate for ServeConfig {
    fn validate(&self) -> Result<(), Invalid> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(Invalid::new(
                "data_dir",
                "is not set",
                "pass --data-dir, set SIDECAR_DATA_DIR, or data_dir in the config file",
            ));
        }
        protocol::segment::shm_path(&self.shm_name)
            .map_err(|e| Invalid::new("shm_name", e, "choose a plain name such as gnn-sidecar"))?;
        let mode = self.shm_mode.0;
        if mode & 0o600 != 0o600 || mode & !0o660 != 0 {
            return Err(Invalid::new(
                "shm_mode",
                format!("{mode:o} is not a mode the owner can read and write without execute or world bits"),
                "use \"600\" (one user) or \"660\" (containers sharing a group), as a string of octal digits",
            ));
        }
        for (key, urls) in [
            ("redis", &self.redis),
            ("updates_redis", &self.updates_redis),
        ] {
            if let Some(problem) = urls
                .0
                .iter()
                .find_map(|url| daemon_kit::redact::redis_url_problem(url))
            {
                return Err(Invalid::new(
                    key,
                    problem,
                    "write it as redis://[:password@]host:port",
                ));
            }
        }
        for (key, urls) in [
            ("redis", &self.redis),
            ("updates_redis", &self.updates_redis),
        ] {
            if urls.0.len() > 1 && !self.redis_cluster {
                return Err(Invalid::new(
                    key,
                    format!("{} URLs given for a single Redis", urls.0.len()),
                    "give one URL, or set redis_cluster = true for the nodes of a cluster",
                ));
            }
        }
        if self.invalidation_channel.is_some() && self.redis.0.is_empty() {
            return Err(Invalid::new(
                "invalidation_channel",
                "is set without a Redis",
                "set redis too, or remove invalidation_channel",
            ));
        }
        let caps = self.max_fanouts();
        let fanouts = self.fanouts();
        for hop in 0..MAX_HOPS {
            let cap = caps[hop];
            if !(1..=MAX_FANOUT).contains(&cap) {
                return Err(Invalid::new(
                    "max_fanouts",
                    format!("hop {} is {cap}, outside 1..={MAX_FANOUT}", hop + 1),
                    format!("set each max fanout between 1 and {MAX_FANOUT}"),
                ));
            }
            let fanout = fanouts[hop];
            if !(1..=cap).contains(&fanout) {
                return Err(Invalid::new(
                    "fanouts",
                    format!(
                        "hop {} is {fanout}, outside 1..={cap} (max_fanouts)",
                        hop + 1
                    ),
                    "lower fanouts or raise max_fanouts",
                ));
            }
        }
        u64_between("slots", self.slots.into(), 1, MAX_SLOTS as u64)?;
        u64_between("serve_threads", self.serve_threads as u64, 1, 64)?;
        u64_between("max_targets", self.max_targets.into(), 1, 1 << 20)?;
        u64_between("max_nodes", self.max_nodes.into(), 1, u32::MAX.into())?;
        u64_between(
            "max_new_node_edges",
            self.max_new_node_edges.into(),
            0,
            1 << 20,
        )?;
        u64_between("response_mib", self.response_mib, 1, MAX_RESPONSE_MIB)?;
        // One target at the caps must fit a response: its hop arrays alone
        // (hop1_rows, hop2_count, hop2_rows: 4 bytes an entry).
        let [f1, f2] = caps.map(u64::from);
        let hop_bytes = 4 * f1 * (2 + f2);
        if hop_bytes > self.response_bytes() {
            return Err(Invalid::new(
                "max_fanouts",
                format!(
                    "{f1},{f2}: the hop arrays of one target take {hop_bytes} bytes, more than \
                     the {} MiB response area (response_mib)",
                    self.response_mib
                ),
                format!(
                    "raise response_mib (--response-mib) to at least {} or lower max_fanouts",
                    hop_bytes.div_ceil(1 << 20) + 1
                ),
            ));
        }
        finite_between(
            "deadline_ms",
            self.deadline_ms,
            MIN_DEADLINE_MS,
            MAX_DEADLINE_MS,
            "ms",
        )?;
        u64_between("l1_mib", self.l1_mib, 0, 1 << 20)?;
        u64_between("warm_up", self.warm_up as u64, 0, u32::MAX.into())?;
        finite_between("client_timeout_s", self.client_timeout_s, 0.5, 3600.0, "s")?;
        finite_between("drain_timeout_s", self.drain_timeout_s, 0.0, 3600.0, "s")?;
        u64_between("l2_mib", self.l2_mib, 1, 1 << 30)?;
        u64_between("l2_ttl_s", self.l2_ttl_s, 1, 10 * 365 * 86_400)?;
        if let Some(stream) = &self.updates_stream {
            if stream.is_empty() {
                return Err(Invalid::new(
                    "updates_stream",
                    "is empty",
                    "name the stream's key, e.g. gnn:updates",
                ));
            }
            if self.updates_redis.0.is_empty() && self.redis.0.is_empty() {
                return Err(Invalid::new(
                    "updates_stream",
                    "is set without a Redis to read it from",
                    "set updates_redis (or redis) to the stream's Redis URL",
                ));
            }
        }
        if self.no_l2 && self.l2_dir.is_some() {
            return Err(Invalid::new(
                "no_l2",
                "is set together with l2_dir",
                "remove one of them",
            ));
        }
        daemon_kit::logging::parse_level(&self.log_level)
            .map_err(|e| Invalid::new("log_level", e, "set a level such as info"))?;
        daemon_kit::traces::check_endpoint(self.otlp_endpoint.as_deref())?;
        Ok(())
    }
}

/// Where and how big the L2 cache is.
#[derive(Debug, Clone)]
pub struct L2CacheConfig {
    /// Directory of the RocksDB cache (local NVMe in production).
    pub path: PathBuf,
    /// Size bound of its files, bytes.
    pub max_bytes: u64,
    /// How long a cached row is served before it is fetched again (bounds
    /// its staleness when an invalidation message is lost).
    pub ttl: Duration,
}

impl ServeConfig {
    /// Defaults for everything but the data directory and segment name.
    pub fn new(data_dir: impl Into<PathBuf>, shm_name: impl Into<String>) -> Self {
        Self {
            data_dir: data_dir.into(),
            shm_name: shm_name.into(),
            ..Self::default()
        }
    }

    /// The update stream's Redis URLs: `updates_redis`, else `redis`.
    pub fn updates_redis_urls(&self) -> &[String] {
        if self.updates_redis.0.is_empty() {
            &self.redis.0
        } else {
            &self.updates_redis.0
        }
    }

    pub fn deadline(&self) -> Duration {
        Duration::from_secs_f64(self.deadline_ms / 1e3)
    }

    pub fn client_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.client_timeout_s)
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.drain_timeout_s)
    }

    /// The most a request may ask for per hop; -1 (every neighbour) is the
    /// largest cap, [`MAX_FANOUT`].
    pub fn max_fanouts(&self) -> [u32; MAX_HOPS] {
        self.max_fanouts.at_caps([MAX_FANOUT; MAX_HOPS])
    }

    /// The fanouts of requests that leave them to the sidecar; -1 (every
    /// neighbour) is the hop's `max_fanouts`.
    pub fn fanouts(&self) -> [u32; MAX_HOPS] {
        self.fanouts.at_caps(self.max_fanouts())
    }

    pub fn response_bytes(&self) -> u64 {
        self.response_mib << 20
    }

    pub fn l1_bytes(&self) -> u64 {
        self.l1_mib << 20
    }

    /// The L2 cache in front of Redis, unless `no_l2`.
    pub fn l2_cache(&self) -> Option<L2CacheConfig> {
        (!self.no_l2).then(|| L2CacheConfig {
            path: self
                .l2_dir
                .clone()
                .unwrap_or_else(|| default_l2_dir(&self.data_dir)),
            max_bytes: self.l2_mib << 20,
            ttl: Duration::from_secs(self.l2_ttl_s),
        })
    }

    /// The configuration as `--print-config` shows it: Redis passwords
    /// replaced by `***`.
    pub fn redacted(&self) -> Self {
        Self {
            redis: RedisUrls(self.redis.0.iter().map(|u| redact(u)).collect()),
            updates_redis: RedisUrls(self.updates_redis.0.iter().map(|u| redact(u)).collect()),
            ..self.clone()
        }
    }
}

/// `<data_dir>/l2-cache`.
pub fn default_l2_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("l2-cache")
}

/// The flags of `sidecar serve`: one per key of [`ServeConfig`], all
/// optional (a flag not given leaves the lower layers' value).
#[derive(Debug, Default, clap::Args, Serialize)]
pub struct ServeFlags {
    /// The directory `sidecar import` wrote (graph.csr, features).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Dataset imported into --data-dir at start if it has no index yet.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed_dataset: Option<PathBuf>,
    /// Name of the shared-memory segment under /dev/shm [default: gnn-sidecar].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_name: Option<String>,
    /// Segment file mode, octal [default: 600; 660 when the containers share a group].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_mode: Option<ShmMode>,
    /// Redis URL of the feature store (repeat for cluster nodes).
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub redis: Vec<String>,
    /// The --redis URLs are nodes of a Redis Cluster.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub redis_cluster: bool,
    /// PEM CA certificate for rediss:// servers signed by a private CA.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_ca: Option<PathBuf>,
    /// Redis pub/sub channel of node ids to invalidate.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalidation_channel: Option<String>,
    /// Fanouts of requests that leave them to the sidecar [default: 20,10].
    #[arg(long, allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fanouts: Option<Fanouts>,
    /// The most each hop's fanout may be [default: 50,50].
    #[arg(long, allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_fanouts: Option<Fanouts>,
    /// Ring slots (requests in flight) [default: 64].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// Threads serving the ring [default: 2].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serve_threads: Option<usize>,
    /// Most target ids per request [default: 64].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_targets: Option<u32>,
    /// Most node-table rows per response [default: 65536].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<u32>,
    /// Edges a new node in a predict request may carry [default: 1024].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_new_node_edges: Option<u32>,
    /// Response area per slot, MiB [default: 8].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_mib: Option<u64>,
    /// Longest a batch waits for L2/L3 rows, milliseconds [default: 20].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<f64>,
    /// L1 cache size, MiB [default: 256].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l1_mib: Option<u64>,
    /// Top-degree nodes pinned in L1 before ready [default: 10000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_up: Option<usize>,
    /// Row served for a missing or late row [default: mean].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_row: Option<DefaultRowKind>,
    /// Admin Unix socket for sidecarctl.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_socket: Option<PathBuf>,
    /// Seconds without a worker heartbeat before its slots are reclaimed [default: 5].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_timeout_s: Option<f64>,
    /// How long the ring server spins for the next request before it
    /// parks: auto (learned) or microseconds 0 to 1000000 [default: auto].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_spin_us: Option<RingSpin>,
    /// Longest a drain waits for submitted requests, seconds [default: 30].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_timeout_s: Option<f64>,
    /// L2 RocksDB cache directory in front of Redis [default: <data-dir>/l2-cache].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l2_dir: Option<PathBuf>,
    /// Size bound of the L2 cache, MiB [default: 4096].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l2_mib: Option<u64>,
    /// Seconds an L2 row is served before it is fetched again [default: 3600].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l2_ttl_s: Option<u64>,
    /// No L2 cache: L1 misses go straight to Redis.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_l2: bool,
    /// Address of GET /metrics, /healthz, /readyz, e.g. 0.0.0.0:9100.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<SocketAddr>,
    /// Log lines as text or json [default: text].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// Log level, e.g. info or sidecar=debug,warn [default: info].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// OTLP/gRPC endpoint for traces, e.g. http://otel-collector:4317
    /// [default: none, no traces].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// Graph delta entries past which the graph compacts by itself; 0: never [default: 1000000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compact_after: Option<u64>,
    /// Follow this update stream (Redis Stream key, e.g. gnn:updates).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updates_stream: Option<String>,
    /// Redis URL(s) of the update stream [default: the --redis URLs].
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub updates_redis: Vec<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl daemon_kit::startup::Settings for ServeConfig {
    fn redacted(&self) -> Self {
        ServeConfig::redacted(self)
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
            // The worker decides: the sidecar traces the requests whose
            // trace context says sampled.
            sample_ratio: 0.0,
            service: "gnn-sidecar",
        }
    }

    fn traced_targets(&self) -> &'static [&'static str] {
        &["sidecar"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ServeFlags,
    }

    #[test]
    fn every_key_has_a_flag_and_every_flag_a_key() {
        let keys = daemon_kit::config::keys_of::<ServeConfig>();
        let flags: std::collections::BTreeSet<String> = Cli::command()
            .get_arguments()
            .filter(|a| a.get_long().is_some())
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(keys, flags);
    }

    #[test]
    fn the_defaults_are_valid_once_a_data_dir_is_given() {
        assert!(ServeConfig::default().validate().is_err());
        ServeConfig::new("/var/lib/sidecar", "ring")
            .validate()
            .unwrap();
    }

    #[test]
    fn modes_fanouts_and_urls_parse_from_text_or_lists() {
        assert_eq!("660".parse::<ShmMode>(), Ok(ShmMode(0o660)));
        assert_eq!("0o600".parse::<ShmMode>(), Ok(ShmMode(0o600)));
        assert!("9".parse::<ShmMode>().is_err());
        let from_toml: ServeConfig =
            toml::from_str("fanouts = [5, 3]\nshm_mode = \"660\"\nredis = \"redis://a:1\"")
                .unwrap();
        assert_eq!(from_toml.fanouts, Fanouts([5, 3]));
        assert_eq!(from_toml.shm_mode, ShmMode(0o660));
        assert_eq!(from_toml.redis.0, ["redis://a:1"]);
        let text: ServeConfig = toml::from_str("fanouts = \"7,2\"").unwrap();
        assert_eq!(text.fanouts, Fanouts([7, 2]));
        let mut c = ServeConfig::new("/d", "ring");
        c.shm_mode = ShmMode(0o432);
        assert_eq!(c.validate().unwrap_err().key, "shm_mode");
        c.shm_mode = ShmMode(0o666);
        assert_eq!(c.validate().unwrap_err().key, "shm_mode");
    }

    /// -1 (every neighbour) is the hop's max_fanouts, and in max_fanouts
    /// the largest cap; the hop arrays' check then applies to it.
    #[test]
    fn a_fanout_of_minus_one_is_the_hops_cap() {
        let c: ServeConfig = toml::from_str("fanouts = [-1, 4]\nmax_fanouts = \"60,-1\"").unwrap();
        assert_eq!(c.fanouts, Fanouts([daemon_kit::config::EVERY_NEIGHBOUR, 4]));
        assert_eq!(c.max_fanouts(), [60, MAX_FANOUT]);
        assert_eq!(c.fanouts(), [60, 4]);
        let mut c = ServeConfig {
            max_fanouts: Fanouts([60, 50]),
            ..c
        };
        c.data_dir = "/d".into();
        c.shm_name = "ring".into();
        c.validate().unwrap();
        c.max_fanouts = "-1,-1".parse().unwrap();
        let refused = c.validate().unwrap_err();
        assert_eq!(refused.key, "max_fanouts", "{refused:?}");
        assert!(refused.problem.contains("32768,32768"), "{refused:?}");
        assert!(toml::from_str::<ServeConfig>("fanouts = [-2, 4]").is_err());
    }

    #[test]
    fn printing_redacts_passwords() {
        let mut c = ServeConfig::new("/d", "ring");
        c.redis = RedisUrls(vec!["redis://:hunter2@cache:6379".into()]);
        let shown = toml::to_string(&c.redacted()).unwrap();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains(":***@cache:6379"), "{shown}");
    }
}
