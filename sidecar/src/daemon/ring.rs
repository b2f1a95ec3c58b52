//! The ring as the daemon holds it: the current segment's monitor (a new
//! one replaces a segment another process truncated), its readiness latch,
//! and its telemetry (`sidecar_ring_*`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use daemon_kit::metrics::{Out, Telemetry};
use daemon_kit::readiness::Latch;
use protocol::server::{RingMonitor, SlotOccupancy};

/// The ring subsystem's state outside the ring server itself.
#[derive(Debug)]
pub struct Ring {
    monitor: arc_swap::ArcSwapOption<RingMonitor>,
    segments_replaced: AtomicU64,
    latch: Latch,
}

/// The ring at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingSnapshot {
    /// `None` before the first segment exists.
    pub segment: Option<SegmentSnapshot>,
    pub segments_replaced: u64,
}

/// The current segment at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSnapshot {
    pub slots: u32,
    pub occupancy: SlotOccupancy,
    pub clients: u32,
    pub clients_reaped: u64,
    pub slots_reclaimed: u64,
    pub clients_stalled: u64,
    pub abandoned_freed: u64,
    pub submissions_repaired: u64,
    pub requests_refused: u64,
}

impl Ring {
    /// No segment yet; `latch` is held until one is installed.
    pub(crate) fn new(latch: Latch) -> Self {
        Self {
            monitor: arc_swap::ArcSwapOption::empty(),
            segments_replaced: AtomicU64::new(0),
            latch,
        }
    }

    /// The current segment's monitor, once created.
    pub fn monitor(&self) -> Option<Arc<RingMonitor>> {
        self.monitor.load_full()
    }

    /// A segment exists (a new one replaces a retired one): ready.
    pub(crate) fn install(&self, monitor: RingMonitor) {
        self.monitor.store(Some(Arc::new(monitor)));
        self.latch.release();
    }

    /// Another process truncated the segment: not ready until a new one
    /// is installed.
    pub(crate) fn retire(&self) {
        self.segments_replaced.fetch_add(1, Ordering::Relaxed);
        self.latch
            .hold("the shared-memory ring is being created again (its segment was truncated)");
    }

    pub fn snapshot(&self) -> RingSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RingSnapshot {
            segment: self.monitor().map(|ring| {
                let c = ring.counters();
                SegmentSnapshot {
                    slots: ring.slot_count(),
                    occupancy: ring.occupancy(),
                    clients: ring.registered_clients(),
                    clients_reaped: load(&c.clients_reaped),
                    slots_reclaimed: load(&c.slots_reclaimed),
                    clients_stalled: load(&c.clients_stalled),
                    abandoned_freed: load(&c.abandoned_freed),
                    submissions_repaired: load(&c.submissions_repaired),
                    requests_refused: load(&c.requests_refused),
                }
            }),
            segments_replaced: load(&self.segments_replaced),
        }
    }
}

/// Registered under the `ring` prefix.
impl Telemetry for Ring {
    fn encode(&self, out: &mut Out<'_>) -> fmt::Result {
        let s = self.snapshot();
        out.counter(
            "segments_replaced",
            "rings retired because another process truncated the segment file, and created again",
            s.segments_replaced,
        )?;
        let Some(r) = s.segment else {
            return Ok(());
        };
        let o = r.occupancy;
        out.gauges(
            "slots",
            "ring slots per state",
            "state",
            &[
                ("free", o.free.into()),
                ("claimed", o.claimed.into()),
                ("submitted", o.submitted.into()),
                ("serving", o.serving.into()),
                ("published", o.published.into()),
                ("abandoned", o.abandoned.into()),
            ],
        )?;
        out.gauge("clients", "workers registered in the segment", r.clients)?;
        out.counter(
            "clients_reaped",
            "workers whose heartbeat stopped and whose slots were reclaimed",
            r.clients_reaped,
        )?;
        out.counter(
            "slots_reclaimed",
            "slots reclaimed from owners that are not live registered workers",
            r.slots_reclaimed,
        )?;
        out.counter(
            "clients_stalled",
            "times a worker's heartbeat stopped while its process still held its entry lock \
             (kept, not reaped)",
            r.clients_stalled,
        )?;
        out.counter(
            "abandoned_freed",
            "abandoned slots freed by housekeeping (no serve thread held them)",
            r.abandoned_freed,
        )?;
        out.counter(
            "submissions_repaired",
            "submitted slots whose lost submission bit housekeeping set again",
            r.submissions_repaired,
        )?;
        out.counter(
            "requests_refused",
            "requests freed unanswered: their owner is not a live registered worker",
            r.requests_refused,
        )
    }
}
