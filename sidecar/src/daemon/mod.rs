//! The state the serving loop, the admin socket and the metrics endpoint
//! share: the sidecar's [`Phase`], its run-time [`Knobs`], the loaded
//! [`Core`] (graph, tiers, stores), the [`ring::Ring`], the drain's state,
//! its readiness latches and its [`metrics`]. Below both `serve` (which
//! fills it in) and `admin` (which reads it and asks for drains and stops):
//! neither imports the other for it.
//!
//! Readiness is the latches' (`daemon_kit::readiness`), made here in the
//! order a reader is told why the sidecar is not ready: its lifecycle
//! (starting, draining, stopping), the update follower (replaying, or the
//! stream trimmed past it), the graph, the feature store, the invalidation
//! listener, the tiers' warm-up, the ring. Each subsystem releases its own
//! as it comes up.

pub mod events;
mod features;
pub mod metrics;
pub mod ring;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::ensure;
use daemon_kit::logging::LogHandle;
use daemon_kit::readiness::{Latch, Readiness};
use protocol::graph_schema::GraphSchema;
use protocol::layout::MAX_HOPS;
use protocol::server::RingMonitor;

use crate::config::ServeConfig;
use crate::features::invalidation::InvalidationStats;
use crate::graph::live::LiveGraph;
use crate::updates::follower::FollowerStats;
use events::{Event, Poster};
pub use features::{GraphFeatures, TypeFeatures};
use metrics::{DaemonTelemetry, Metrics};
use ring::Ring;

/// Where the sidecar is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Starting = 0,
    Loading = 1,
    WarmingUp = 2,
    Ready = 3,
    Draining = 4,
    Stopping = 5,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Phase::Starting,
            1 => Phase::Loading,
            2 => Phase::WarmingUp,
            3 => Phase::Ready,
            4 => Phase::Draining,
            _ => Phase::Stopping,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Loading => "loading",
            Phase::WarmingUp => "warming-up",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
            Phase::Stopping => "stopping",
        }
    }
}

/// The settings an operator changes while the sidecar runs.
#[derive(Debug)]
pub struct Knobs {
    /// Hop 1 in the high half, hop 2 in the low half.
    fanouts: AtomicU64,
    deadline_ns: AtomicU64,
    max_fanouts: [u32; MAX_HOPS],
}

impl Knobs {
    fn new(config: &ServeConfig) -> Self {
        let knobs = Self {
            fanouts: AtomicU64::new(0),
            deadline_ns: AtomicU64::new(config.deadline().as_nanos() as u64),
            max_fanouts: config.max_fanouts(),
        };
        knobs.store_fanouts(config.fanouts());
        knobs
    }

    fn store_fanouts(&self, [f1, f2]: [u32; MAX_HOPS]) {
        self.fanouts
            .store((u64::from(f1) << 32) | u64::from(f2), Ordering::Release);
    }

    /// Fanouts of requests that leave them to the sidecar.
    pub fn fanouts(&self) -> [u32; MAX_HOPS] {
        let v = self.fanouts.load(Ordering::Acquire);
        [(v >> 32) as u32, v as u32]
    }

    pub fn max_fanouts(&self) -> [u32; MAX_HOPS] {
        self.max_fanouts
    }

    /// Sets the fanouts; each must be within 1..=its max, or
    /// `daemon_kit::config::EVERY_NEIGHBOUR` (-1), which is the max.
    pub fn set_fanouts(&self, fanouts: [u32; MAX_HOPS]) -> anyhow::Result<()> {
        let fanouts = daemon_kit::config::Fanouts(fanouts).at_caps(self.max_fanouts);
        for (hop, (&fanout, &cap)) in fanouts.iter().zip(&self.max_fanouts).enumerate() {
            ensure!(
                (1..=cap).contains(&fanout),
                "fanout {fanout} of hop {} is outside 1..={cap} (max_fanouts): choose a smaller \
                 one, or restart the sidecar with a larger max_fanouts",
                hop + 1,
            );
        }
        self.store_fanouts(fanouts);
        Ok(())
    }

    /// Longest a batch waits for feature rows from L2/L3.
    pub fn deadline(&self) -> Duration {
        Duration::from_nanos(self.deadline_ns.load(Ordering::Acquire))
    }

    pub fn set_deadline_ms(&self, ms: f64) -> anyhow::Result<()> {
        use crate::config::{MAX_DEADLINE_MS, MIN_DEADLINE_MS};
        ensure!(
            (MIN_DEADLINE_MS..=MAX_DEADLINE_MS).contains(&ms),
            "deadline {ms} ms is outside {MIN_DEADLINE_MS}..={MAX_DEADLINE_MS} ms (the \
             configuration's deadline_ms range)"
        );
        self.deadline_ns
            .store((ms * 1e6).round() as u64, Ordering::Release);
        Ok(())
    }
}

/// What the sidecar serves from, once loaded.
#[derive(Debug)]
pub struct Core {
    /// The served graph: a typed graph, or a one-type graph as the 1x1
    /// typed graph (it knows where its index lives: compaction rewrites it).
    pub graph: LiveGraph,
    /// Per node type (the one type of a one-type graph): its tiers and
    /// stores.
    pub features: GraphFeatures,
    /// A typed graph's types as the segment carries them; `None` for a
    /// one-type graph (the segment's one-type schema).
    pub ring_schema: Option<GraphSchema>,
    pub invalidation: Arc<InvalidationStats>,
    /// The update-stream follower's state, when one runs.
    pub updates: Option<Arc<FollowerStats>>,
    /// Held for the sidecar's life: no other process uses the data directory.
    pub data_dir_lock: crate::data_dir::DataDirLock,
}

impl Core {
    /// Whether the graph is typed (the segment carries its types).
    pub fn is_typed(&self) -> bool {
        self.ring_schema.is_some()
    }

    /// A one-type graph's features: its one type's. Refused for a typed
    /// graph, naming the types, for the commands made for one type.
    pub fn one_type(&self) -> anyhow::Result<&TypeFeatures> {
        if let Some(schema) = &self.ring_schema {
            anyhow::bail!(
                "this sidecar serves a typed graph ({}): name the node type",
                schema.describe()
            );
        }
        self.features
            .of(0)
            .ok_or_else(|| anyhow::anyhow!("the one-type graph has no feature rows"))
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrainOutcome {
    pub answered: u64,
    pub pending: u64,
    pub seconds: f64,
    pub complete: bool,
}

#[derive(Debug, Default)]
struct DrainState {
    requested: AtomicBool,
    /// The outcome of the drain, once one ran.
    outcome: Mutex<Option<DrainOutcome>>,
}

/// The readiness latches the start-up hands to the subsystems, in the
/// order their reasons are reported (the ring's is the ring's own).
#[derive(Debug)]
pub struct Latches {
    /// The daemon's own: starting, about to drain, draining, stopping.
    lifecycle: Latch,
    pub updates: Latch,
    pub graph: Latch,
    pub store: Latch,
    pub invalidation: Latch,
    pub warm_up: Latch,
}

/// The state the serving loop, the admin socket and the metrics endpoint
/// share.
#[derive(Debug)]
pub struct Daemon {
    pub config: ServeConfig,
    pub started: Instant,
    phase: AtomicU8,
    pub knobs: Knobs,
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub latches: Latches,
    pub log: Option<Arc<LogHandle>>,
    events: Poster,
    drain: DrainState,
    core: OnceLock<Core>,
    pub ring: Arc<Ring>,
    /// Milliseconds since `started` at the serving loop's last turn.
    last_turn_ms: AtomicU64,
}

/// How long the serving loop may go without a turn before the sidecar is
/// reported not live (on top of the feature deadline a batch may wait).
pub const LOOP_STALL: Duration = Duration::from_secs(10);

impl Daemon {
    pub(crate) fn new(
        config: ServeConfig,
        log: Option<Arc<LogHandle>>,
        events: Poster,
    ) -> Arc<Self> {
        let readiness = Readiness::default();
        let loading = Phase::Loading.name();
        let latches = Latches {
            lifecycle: readiness.latch("lifecycle", Phase::Starting.name()),
            updates: readiness.latch("updates", loading),
            graph: readiness.latch("graph", loading),
            store: readiness.latch("store", loading),
            invalidation: readiness.latch("invalidation", loading),
            warm_up: readiness.latch("warm-up", Phase::WarmingUp.name()),
        };
        let ring = Arc::new(Ring::new(readiness.latch("ring", Phase::WarmingUp.name())));
        let metrics = Metrics::new();
        metrics.register(Some("ring"), ring.clone());
        let daemon = Arc::new(Self {
            knobs: Knobs::new(&config),
            metrics,
            readiness,
            latches,
            config,
            started: Instant::now(),
            phase: AtomicU8::new(Phase::Starting as u8),
            log,
            events,
            drain: DrainState::default(),
            core: OnceLock::new(),
            ring,
            last_turn_ms: AtomicU64::new(0),
        });
        daemon
            .metrics
            .register(None, DaemonTelemetry(Arc::downgrade(&daemon)));
        daemon
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    /// Moves to `phase`; the lifecycle latch follows it (held while
    /// starting, draining and stopping).
    pub(crate) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
        let lifecycle = &self.latches.lifecycle;
        match phase {
            // The operator's surface is up: the subsystems' latches speak.
            Phase::Loading => lifecycle.release(),
            Phase::WarmingUp | Phase::Ready => {}
            Phase::Starting => lifecycle.hold(phase.name()),
            Phase::Draining => lifecycle.hold("draining (takes no new requests)"),
            Phase::Stopping => lifecycle.hold("stopping"),
        }
        tracing::info!(phase = phase.name(), "sidecar phase");
    }

    /// The graph and the tiers, once loaded.
    pub fn core(&self) -> Option<&Core> {
        self.core.get()
    }

    /// The loaded core, or the error an admin command reports before then.
    pub fn loaded(&self) -> anyhow::Result<&Core> {
        self.core.get().ok_or_else(|| {
            anyhow::anyhow!(
                "the sidecar is still {} (not ready yet): retry when `sidecarctl ready` succeeds",
                self.phase().name()
            )
        })
    }

    /// The ring's monitor, once created.
    pub fn ring(&self) -> Option<Arc<RingMonitor>> {
        self.ring.monitor()
    }

    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Ready: every latch released (the stores open, the update stream
    /// replayed, the warm-up done, the ring created, not draining).
    pub fn readiness(&self) -> Result<(), String> {
        self.readiness
            .check()
            .map_err(|reason| format!("not ready: {reason}"))
    }

    /// Live: the process answers and, once serving, the serving loop turns.
    pub fn liveness(&self) -> Result<(), String> {
        if !matches!(self.phase(), Phase::Ready | Phase::Draining) {
            return Ok(());
        }
        let now_ms = self.started.elapsed().as_millis() as u64;
        let last = self.last_turn_ms.load(Ordering::Acquire);
        let stalled = Duration::from_millis(now_ms.saturating_sub(last));
        if stalled > LOOP_STALL + self.knobs.deadline() {
            return Err(format!(
                "not live: the serving loop has not turned for {:.1} s",
                stalled.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// Asks the sidecar to drain and stop.
    pub fn request_stop(&self) {
        self.events.post(Event::Stop);
    }

    /// Asks for a drain and waits for it to end (at most `wait` after the
    /// drain began). With a non-zero `after`, first reports not ready and
    /// keeps serving for that long.
    pub fn drain_and_wait(&self, after: Duration, wait: Duration) -> anyhow::Result<DrainOutcome> {
        ensure!(
            self.ring.monitor().is_some(),
            "the sidecar is still {}: there is no ring to drain yet",
            self.phase().name()
        );
        if !after.is_zero() && !self.drain.requested.load(Ordering::Acquire) {
            self.latches.lifecycle.hold("about to drain");
            tracing::info!(
                seconds = after.as_secs_f64(),
                "not ready; draining after a delay"
            );
            std::thread::sleep(after);
        }
        self.drain.requested.store(true, Ordering::Release);
        let (reply, outcome) = crossbeam_channel::bounded(1);
        self.events.post(Event::Drain(reply));
        // The control loop answers; a stop that drains first (its loop then
        // ends without reading this request) keeps its outcome, looked at
        // every 50 ms.
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(outcome) = outcome.recv_timeout(left.min(Duration::from_millis(50))) {
                return Ok(outcome);
            }
            if let Some(outcome) = self.drain_outcome() {
                return Ok(outcome);
            }
            ensure!(
                !left.is_zero(),
                "the drain did not end within {} s",
                wait.as_secs()
            );
        }
    }

    /// How the drain ended, once one ran.
    pub(crate) fn drain_outcome(&self) -> Option<DrainOutcome> {
        *self.drain.outcome.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a stop was asked for (a signal, `sidecarctl shutdown`).
    pub(crate) fn stop_requested(&self) -> bool {
        self.events.stopping()
    }

    /// Posts an event to the control loop.
    pub(crate) fn post(&self, event: Event) {
        self.events.post(event);
    }

    /// The graph and tiers are loaded.
    pub(crate) fn install_core(&self, core: Core) {
        let _ = self.core.set(core);
    }

    /// The ring exists (a new one replaces a retired one).
    pub(crate) fn install_ring(&self, ring: RingMonitor) {
        self.ring.install(ring);
    }

    /// The serving loop turned (liveness).
    pub(crate) fn loop_turned(&self) {
        self.last_turn_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Release);
    }

    pub(crate) fn finish_drain(&self, outcome: DrainOutcome) {
        *self.drain.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
    }
}

/// `/metrics`, `/healthz` and `/readyz` (`daemon_kit::endpoint`).
impl daemon_kit::endpoint::Probes for Daemon {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }

    fn readiness(&self) -> Result<(), String> {
        Daemon::readiness(self)
    }

    fn liveness(&self) -> Result<(), String> {
        Daemon::liveness(self)
    }
}
