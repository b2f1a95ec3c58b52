//! The sidecar's side of the ring: create the segment, take submitted
//! requests in batches, answer each in place, beat the heartbeat, and reclaim
//! the slots of dead workers.
#![allow(unsafe_code)]

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::layout::{server_state, status};
use crate::liveness::{self, ClientWatch};
use crate::payload::{self, NodeColumns, PayloadShape, SchemaCache, TargetColumns, WriteError};
use crate::request::{self, Request, RequestError};
use crate::segment::{CreateError, Segment, SegmentConfig};
use crate::slot::{state, ReclaimOutcome, SlotWord};
use crate::submit::SubmitQueue;
use crate::sync::Ordering;
use crate::wait::{notify, wait_for, WaitPolicy};

/// How the sidecar runs the ring.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub segment: SegmentConfig,
    /// How [`RingServer::next_batch`] waits for work.
    pub wait: WaitPolicy,
    /// A worker whose heartbeat stands still this long is dead: its slots are
    /// reclaimed.
    pub client_timeout: Duration,
}

impl ServerOptions {
    pub fn new(segment: SegmentConfig) -> Self {
        Self {
            segment,
            wait: WaitPolicy::default(),
            client_timeout: crate::segment::defaults::CLIENT_TIMEOUT,
        }
    }
}

/// Slots per state, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotOccupancy {
    pub free: u32,
    pub claimed: u32,
    pub submitted: u32,
    pub serving: u32,
    pub published: u32,
    pub abandoned: u32,
}

impl SlotOccupancy {
    /// Requests submitted but not yet answered.
    pub fn pending(&self) -> u32 {
        self.submitted + self.serving
    }

    /// Slots not free.
    pub fn used(&self) -> u32 {
        self.claimed + self.submitted + self.serving + self.published + self.abandoned
    }
}

/// Reads a running ring's state; cheap to clone, usable from any thread.
#[derive(Debug, Clone)]
pub struct RingMonitor {
    shared: Arc<Shared>,
}

impl RingMonitor {
    /// How many slots are in each state now (a racy snapshot, for metrics).
    pub fn occupancy(&self) -> SlotOccupancy {
        let mut occupancy = SlotOccupancy::default();
        for slot in self.shared.segment.slots() {
            match slot.load().state {
                state::FREE => occupancy.free += 1,
                state::CLAIMED => occupancy.claimed += 1,
                state::SUBMITTED => occupancy.submitted += 1,
                state::SERVING => occupancy.serving += 1,
                state::PUBLISHED => occupancy.published += 1,
                _ => occupancy.abandoned += 1,
            }
        }
        occupancy
    }

    /// Workers registered in the segment's client table now.
    pub fn registered_clients(&self) -> u32 {
        liveness::registered_count(self.shared.segment.header())
    }

    /// The housekeeping thread's counters.
    pub fn counters(&self) -> &ServerCounters {
        &self.shared.counters
    }

    /// Slots of the ring.
    pub fn slot_count(&self) -> u32 {
        self.shared.segment.geometry().slot_count
    }
}

/// Counters of the housekeeping thread.
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub clients_reaped: std::sync::atomic::AtomicU64,
    pub slots_reclaimed: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct Shared {
    segment: Segment,
    schemas: SchemaCache,
    stop: AtomicBool,
    counters: ServerCounters,
}

/// The sidecar's handle on its segment. Dropping it stops the sidecar side
/// cleanly: state STOPPED, waiters woken, segment unlinked.
#[derive(Debug)]
pub struct RingServer {
    shared: Arc<Shared>,
    wait: WaitPolicy,
    housekeeper: Option<JoinHandle<()>>,
}

impl RingServer {
    /// Creates the segment (taking over a stale one) and starts the
    /// heartbeat and reaper thread.
    pub fn create(options: ServerOptions) -> Result<Self, CreateError> {
        let segment = Segment::create(&options.segment)?;
        let shared = Arc::new(Shared {
            segment,
            schemas: SchemaCache::default(),
            stop: AtomicBool::new(false),
            counters: ServerCounters::default(),
        });
        let interval = options.segment.heartbeat_interval;
        let client_timeout = options.client_timeout;
        let for_thread = shared.clone();
        let housekeeper = std::thread::Builder::new()
            .name("ring-housekeeper".into())
            .spawn(move || housekeep(&for_thread, interval, client_timeout))
            .map_err(|e| CreateError::Os {
                name: options.segment.name.clone(),
                op: "spawning the heartbeat thread",
                source: e,
            })?;
        tracing::info!(
            segment = %options.segment.name,
            epoch = format_args!("{:#x}", shared.segment.epoch()),
            slots = options.segment.slot_count,
            bytes = shared.segment.len(),
            "shared-memory ring created"
        );
        Ok(Self {
            shared,
            wait: options.wait,
            housekeeper: Some(housekeeper),
        })
    }

    pub fn segment(&self) -> &Segment {
        &self.shared.segment
    }

    pub fn counters(&self) -> &ServerCounters {
        &self.shared.counters
    }

    fn queue(&self) -> SubmitQueue<'_> {
        let header = self.shared.segment.header();
        SubmitQueue {
            bits: &header.submit_bits,
            doorbell: &header.doorbell,
            server_parked: &header.server_parked,
        }
    }

    /// Waits (spin, then park) until at least one request is submitted or
    /// `timeout` passes, and takes every submitted request into `out`.
    /// Returns the number taken.
    pub fn next_batch(&self, out: &mut Vec<ServeTicket>, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let queue = self.queue();
        let before = out.len();
        let slot_count = self.shared.segment.geometry().slot_count;
        loop {
            queue.drain(|slot_idx| {
                if slot_idx >= slot_count {
                    return;
                }
                if let Some(word) = self.shared.segment.slot(slot_idx as usize).take() {
                    out.push(ServeTicket {
                        shared: self.shared.clone(),
                        slot_idx,
                        word,
                        taken_at: Instant::now(),
                        answered: false,
                    });
                } else {
                    // An abandoned slot was freed by `take`.
                    self.notify_free();
                }
            });
            if out.len() > before {
                return out.len() - before;
            }
            let header = self.shared.segment.header();
            let pending = wait_for(
                &header.doorbell,
                &header.server_parked,
                self.wait,
                Some(deadline),
                || queue.any_pending().then_some(()),
            );
            if pending.is_none() {
                return 0;
            }
        }
    }

    fn notify_free(&self) {
        let header = self.shared.segment.header();
        notify(&header.free_seq, &header.free_waiters);
    }

    /// A handle for reading the ring's state from other threads (metrics,
    /// the admin socket) while this one serves.
    pub fn monitor(&self) -> RingMonitor {
        RingMonitor {
            shared: self.shared.clone(),
        }
    }

    /// True while the segment is DRAINING.
    pub fn is_draining(&self) -> bool {
        self.shared
            .segment
            .header()
            .preamble
            .server_state
            .load(Ordering::Acquire)
            == server_state::DRAINING
    }

    /// Stops accepting new requests; in-flight ones can still be answered.
    /// Clients see the state and stop submitting (docs/protocol.md).
    pub fn set_draining(&self) {
        self.shared
            .segment
            .header()
            .preamble
            .server_state
            .store(server_state::DRAINING, Ordering::Release);
    }

    /// Stops the sidecar side: STOPPED, wake every waiter, unlink.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(handle) = self.housekeeper.take() {
            handle.thread().unpark();
            let _ = handle.join();
        }
        let segment = &self.shared.segment;
        let header = segment.header();
        header
            .preamble
            .server_state
            .store(server_state::STOPPED, Ordering::Release);
        for slot in segment.slots() {
            notify(&slot.wake, &slot.waiters);
        }
        notify(&header.free_seq, &header.free_waiters);
        match segment.unlink() {
            Ok(true) => tracing::info!(segment = %segment.name(), "shared-memory ring removed"),
            Ok(false) => tracing::warn!(
                segment = %segment.name(),
                "shared-memory ring name now belongs to another sidecar; left it alone"
            ),
            Err(e) => {
                tracing::error!(segment = %segment.name(), error = %e, "could not unlink the ring")
            }
        }
    }
}

impl Drop for RingServer {
    fn drop(&mut self) {
        if self.housekeeper.is_some() {
            self.stop_now();
        }
    }
}

/// Heartbeat and reaper loop, until `stop`.
fn housekeep(shared: &Shared, interval: Duration, client_timeout: Duration) {
    let segment = &shared.segment;
    let header = segment.header();
    let mut watch = ClientWatch::default();
    while !shared.stop.load(Ordering::Acquire) {
        header
            .preamble
            .server_heartbeat
            .fetch_add(1, Ordering::Release);
        for dead in watch.dead_clients(header, client_timeout, Instant::now()) {
            let mut reclaimed = 0u64;
            for slot in segment.slots() {
                match slot.reclaim(dead.index) {
                    ReclaimOutcome::Freed => {
                        reclaimed += 1;
                        notify(&slot.wake, &slot.waiters);
                    }
                    ReclaimOutcome::Abandoned => {
                        reclaimed += 1;
                        notify(&slot.wake, &slot.waiters);
                    }
                    ReclaimOutcome::NotOwned => {}
                }
            }
            let freed = liveness::unregister(header, dead);
            if reclaimed > 0 {
                notify(&header.free_seq, &header.free_waiters);
            }
            shared
                .counters
                .clients_reaped
                .fetch_add(u64::from(freed), Ordering::Relaxed);
            shared
                .counters
                .slots_reclaimed
                .fetch_add(reclaimed, Ordering::Relaxed);
            tracing::warn!(
                client = dead.index,
                slots = reclaimed,
                timeout_ms = client_timeout.as_millis() as u64,
                "worker stopped heartbeating; reclaimed its slots"
            );
        }
        std::thread::park_timeout(interval);
    }
}

/// A request the sidecar took (`SERVING`): read it, answer it. Dropping a
/// ticket without answering answers `INTERNAL`, so no worker waits forever.
#[derive(Debug)]
pub struct ServeTicket {
    shared: Arc<Shared>,
    slot_idx: u32,
    word: SlotWord,
    taken_at: Instant,
    answered: bool,
}

impl ServeTicket {
    pub fn slot_index(&self) -> u32 {
        self.slot_idx
    }

    /// Reads and validates the request (a copy; the request area is small).
    pub fn request(&self) -> Result<Request, RequestError> {
        let segment = &self.shared.segment;
        // SAFETY: this ticket holds the slot in SERVING, which gives the
        // sidecar exclusive access to its data region; the slice does not
        // outlive this call.
        let area = unsafe { segment.request_area(self.slot_idx as usize) };
        request::decode(area, segment.geometry(), segment.schema())
    }

    /// Writes an OK response in place: `fill` gets mutable views of the final
    /// Arrow buffers. If the response does not fit, answers `TOO_LARGE` and
    /// returns the error.
    pub fn respond(
        mut self,
        request_id: u64,
        graph_version: u64,
        shape: PayloadShape,
        fill: impl FnOnce(&mut NodeColumns<'_>, &mut TargetColumns<'_>),
    ) -> Result<(), WriteError> {
        let segment = &self.shared.segment;
        // SAFETY: SERVING gives the sidecar exclusive access to the response
        // area; the slice is dropped before the slot is published below.
        let area = unsafe { segment.response_area(self.slot_idx as usize) };
        match payload::ResponseWriter::new(area, shape, &self.shared.schemas) {
            Ok(mut writer) => {
                {
                    let (mut nodes, mut targets) = writer.columns();
                    fill(&mut nodes, &mut targets);
                }
                let server_ns = self.taken_at.elapsed().as_nanos() as u64;
                writer.finish(request_id, graph_version, server_ns);
                self.publish();
                Ok(())
            }
            Err(error) => {
                self.respond_error(status::TOO_LARGE, request_id, &error.to_string());
                Err(error)
            }
        }
    }

    /// Answers with an error status and a message.
    pub fn respond_error(mut self, status_code: u32, request_id: u64, message: &str) {
        self.write_error(status_code, request_id, message);
        self.publish();
    }

    fn write_error(&mut self, status_code: u32, request_id: u64, message: &str) {
        // SAFETY: as in `respond`.
        let area = unsafe { self.shared.segment.response_area(self.slot_idx as usize) };
        payload::write_error(area, status_code, request_id, message);
    }

    fn publish(&mut self) {
        self.answered = true;
        let segment = &self.shared.segment;
        let slot = segment.slot(self.slot_idx as usize);
        match slot.publish(self.word) {
            Ok(_) => notify(&slot.wake, &slot.waiters),
            Err(_) => {
                // The worker abandoned it (deadline) or died: the slot is free.
                let header = segment.header();
                notify(&header.free_seq, &header.free_waiters);
            }
        }
    }
}

impl Drop for ServeTicket {
    fn drop(&mut self) {
        if !self.answered {
            self.write_error(
                status::INTERNAL,
                0,
                "the sidecar dropped the request without answering (see its log)",
            );
            self.publish();
        }
    }
}
