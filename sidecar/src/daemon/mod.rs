//! The state the serving loop, the admin socket and the metrics endpoint
//! share: the sidecar's [`Phase`], its run-time [`Knobs`], the loaded
//! [`Core`] (graph, tiers, stores), the ring's monitor, the drain's state,
//! and its [`metrics`]. Below both `serve` (which fills it in) and `admin`
//! (which reads it and asks for drains and stops): neither imports the
//! other for it.

pub mod metrics;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::ensure;
use daemon_kit::logging::LogHandle;
use protocol::layout::MAX_HOPS;
use protocol::server::RingMonitor;

use crate::config::ServeConfig;
use crate::features::invalidation::InvalidationStats;
use crate::features::redis_tier::RedisTier;
use crate::features::rocks::RocksStore;
use crate::features::FeatureTiers;
use crate::graph::live::LiveGraph;
use crate::updates::follower::FollowerStats;
use metrics::Metrics;

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
            max_fanouts: config.max_fanouts.0,
        };
        knobs.store_fanouts(config.fanouts.0);
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

    /// Sets the fanouts; each must be within 1..=its max.
    pub fn set_fanouts(&self, fanouts: [u32; MAX_HOPS]) -> anyhow::Result<()> {
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
    pub graph: LiveGraph,
    /// The graph index file (compaction rewrites it).
    pub index_path: PathBuf,
    pub tiers: FeatureTiers,
    /// The embedded store (store of record, or L2 cache in front of Redis).
    pub store: Option<Arc<RocksStore>>,
    pub redis: Option<RedisTier>,
    pub feature_dim: usize,
    /// Times the L2 cache was found corrupt at start and rebuilt empty.
    pub l2_rebuilds: u64,
    pub invalidation: Arc<InvalidationStats>,
    /// The update-stream follower's state, when one runs.
    pub updates: Option<Arc<FollowerStats>>,
    /// Held for the sidecar's life: no other process uses the data directory.
    pub data_dir_lock: crate::data_dir::DataDirLock,
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
    /// A drain was asked for with a delay: not ready, still serving.
    announced: AtomicBool,
    requested: AtomicBool,
    outcome: Mutex<Option<DrainOutcome>>,
    done: Condvar,
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
    pub log: Option<Arc<LogHandle>>,
    stop: AtomicBool,
    drain: DrainState,
    core: OnceLock<Core>,
    ring: arc_swap::ArcSwapOption<RingMonitor>,
    /// Milliseconds since `started` at the serving loop's last turn.
    last_turn_ms: AtomicU64,
}

/// How long the serving loop may go without a turn before the sidecar is
/// reported not live (on top of the feature deadline a batch may wait).
pub const LOOP_STALL: Duration = Duration::from_secs(10);

impl Daemon {
    pub(crate) fn new(config: ServeConfig, log: Option<Arc<LogHandle>>) -> Arc<Self> {
        Arc::new_cyclic(|weak| Self {
            knobs: Knobs::new(&config),
            metrics: Metrics::new(weak.clone()),
            config,
            started: Instant::now(),
            phase: AtomicU8::new(Phase::Starting as u8),
            log,
            stop: AtomicBool::new(false),
            drain: DrainState::default(),
            core: OnceLock::new(),
            ring: arc_swap::ArcSwapOption::empty(),
            last_turn_ms: AtomicU64::new(0),
        })
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
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

    /// The ring, once created.
    pub fn ring(&self) -> Option<Arc<RingMonitor>> {
        self.ring.load_full()
    }

    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Ready: the ring exists, the warm-up is done, and it is not draining.
    pub fn readiness(&self) -> Result<(), String> {
        match self.phase() {
            Phase::Ready if self.drain.announced.load(Ordering::Acquire) => {
                Err("not ready: about to drain".into())
            }
            Phase::Ready => match self.core().and_then(|c| c.updates.as_ref()?.stale()) {
                Some(why) => Err(format!("not ready: {why}")),
                None => Ok(()),
            },
            Phase::Draining => Err("not ready: draining (takes no new requests)".into()),
            Phase::Stopping => Err("not ready: stopping".into()),
            phase => Err(format!("not ready: {}", phase.name())),
        }
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
        self.stop.store(true, Ordering::Release);
    }

    /// Asks for a drain and waits for it to end (at most `wait` after the
    /// drain began). With a non-zero `after`, first reports not ready and
    /// keeps serving for that long.
    pub fn drain_and_wait(&self, after: Duration, wait: Duration) -> anyhow::Result<DrainOutcome> {
        ensure!(
            self.ring.load().is_some(),
            "the sidecar is still {}: there is no ring to drain yet",
            self.phase().name()
        );
        if !after.is_zero() && !self.drain.requested.load(Ordering::Acquire) {
            self.drain.announced.store(true, Ordering::Release);
            tracing::info!(
                seconds = after.as_secs_f64(),
                "not ready; draining after a delay"
            );
            std::thread::sleep(after);
        }
        self.drain.requested.store(true, Ordering::Release);
        let outcome = self.drain.outcome.lock().unwrap_or_else(|p| p.into_inner());
        let (outcome, _) = self
            .drain
            .done
            .wait_timeout_while(outcome, wait, |o| o.is_none())
            .unwrap_or_else(|p| p.into_inner());
        (*outcome)
            .ok_or_else(|| anyhow::anyhow!("the drain did not end within {} s", wait.as_secs()))
    }

    /// Whether a stop was asked for (`sidecarctl shutdown`).
    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Whether a drain was asked for (`sidecarctl drain`).
    pub(crate) fn drain_requested(&self) -> bool {
        self.drain.requested.load(Ordering::Acquire)
    }

    /// The graph and tiers are loaded.
    pub(crate) fn install_core(&self, core: Core) {
        let _ = self.core.set(core);
    }

    /// The ring exists (a new one replaces a retired one).
    pub(crate) fn install_ring(&self, ring: RingMonitor) {
        self.ring.store(Some(Arc::new(ring)));
    }

    /// The serving loop turned (liveness).
    pub(crate) fn loop_turned(&self) {
        self.last_turn_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Release);
    }

    pub(crate) fn finish_drain(&self, outcome: DrainOutcome) {
        *self.drain.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.drain.done.notify_all();
    }
}
