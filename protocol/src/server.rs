//! The sidecar's side of the ring: create the segment, take submitted
//! requests in batches, answer each in place, beat the heartbeat, and keep
//! every slot usable whatever the clients do.
//!
//! Housekeeping, every heartbeat interval (docs/protocol.md, section 6):
//! - a client whose heartbeat stood still for `client_timeout` and that
//!   holds no lock on its registry entry is dead: its entry is freed. One
//!   that still holds its lock is a live process that stalled: its slots
//!   (and the responses it may be reading) are left alone;
//! - a slot whose owner is not a live registered client (it died, was
//!   reaped, unregistered while owning slots, or never registered) is
//!   reclaimed, whatever its state;
//! - an `ABANDONED` slot that no serve thread holds is freed (a client that
//!   abandoned it before setting its submission bit);
//! - a `SUBMITTED` slot seen unchanged at two scans gets its submission bit
//!   set again (a client that died between the two steps of a submission).
//!
//! A request whose owner is not a live registered client is refused when
//! taken: the slot is freed unanswered.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU32 as StdAtomicU32};
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
use crate::wait::{notify, wait_for, WaitPolicy, WaitSite};

/// How the sidecar runs the ring.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub segment: SegmentConfig,
    /// How [`RingServer::next_batch`] waits for work.
    pub wait: WaitPolicy,
}

impl ServerOptions {
    pub fn new(segment: SegmentConfig) -> Self {
        Self {
            segment,
            wait: WaitPolicy::default(),
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
    /// What a drain still waits for: the calls registered clients accepted
    /// and have not finished, plus the requests pending in the ring (a call
    /// in the ring may count in both). The accepted counts are read first:
    /// a client counts a call out only after its requests were answered.
    pub fn unfinished(&self) -> u64 {
        let accepted = crate::liveness::accepted_count(self.shared.segment.header());
        accepted + u64::from(self.occupancy().pending())
    }

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

    /// Whether the segment file was truncated under the sidecar (by another
    /// process): the ring cannot serve any more; create a new one.
    pub fn damaged(&self) -> bool {
        self.shared.damaged.load(Ordering::Acquire)
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

/// Counters of the housekeeping thread and of refused requests.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Clients found dead (heartbeat still, no entry lock) and unregistered.
    pub clients_reaped: std::sync::atomic::AtomicU64,
    /// Times a client's heartbeat stood still past `client_timeout` while it
    /// still held its entry lock (a stalled, live process: kept).
    pub clients_stalled: std::sync::atomic::AtomicU64,
    /// Slots reclaimed from owners that are not live registered clients.
    pub slots_reclaimed: std::sync::atomic::AtomicU64,
    /// Abandoned slots freed by housekeeping (no serve thread held them).
    pub abandoned_freed: std::sync::atomic::AtomicU64,
    /// Submitted slots whose submission bit was set again.
    pub submissions_repaired: std::sync::atomic::AtomicU64,
    /// Requests refused unanswered: their owner is not a live registered client.
    pub requests_refused: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct Shared {
    segment: Segment,
    schemas: SchemaCache,
    stop: AtomicBool,
    counters: ServerCounters,
    /// Per slot: serve threads that hold it (or are about to) in SERVING.
    /// Housekeeping frees an ABANDONED slot only when this is 0.
    serving: Vec<StdAtomicU32>,
    /// Set by housekeeping once the segment file was found truncated.
    damaged: AtomicBool,
    /// Requests taken by serve threads and not answered yet.
    taken: StdAtomicU32,
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
        // Request areas are the workers' to write: read-only here.
        if let Err(e) = segment.protect_peer_areas(false) {
            tracing::warn!(segment = %options.segment.name, error = %e, "cannot map the request areas read-only");
        }
        let serving = (0..segment.geometry().slot_count)
            .map(|_| StdAtomicU32::new(0))
            .collect();
        let shared = Arc::new(Shared {
            segment,
            schemas: SchemaCache::default(),
            stop: AtomicBool::new(false),
            counters: ServerCounters::default(),
            serving,
            damaged: AtomicBool::new(false),
            taken: StdAtomicU32::new(0),
        });
        let interval = options.segment.heartbeat_interval;
        let client_timeout = options.segment.client_timeout;
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
        if self.damaged() {
            // A truncated segment serves nothing; its owner replaces it.
            std::thread::sleep(timeout.min(Duration::from_millis(10)));
            return 0;
        }
        let deadline = Instant::now() + timeout;
        let queue = self.queue();
        let before = out.len();
        let slot_count = self.shared.segment.geometry().slot_count;
        let header = self.shared.segment.header();
        loop {
            queue.drain(|slot_idx| {
                if slot_idx >= slot_count {
                    return;
                }
                let serving = &self.shared.serving[slot_idx as usize];
                // Counted before the take, so that housekeeping never frees
                // an ABANDONED slot this thread is about to hold or holds.
                serving.fetch_add(1, Ordering::SeqCst);
                let slot = self.shared.segment.slot(slot_idx as usize);
                match slot.take() {
                    Some(word) if liveness::owner_is_live(header, word.owner) => {
                        self.shared.taken.fetch_add(1, Ordering::Relaxed);
                        out.push(ServeTicket {
                            shared: self.shared.clone(),
                            slot_idx,
                            word,
                            taken_at: Instant::now(),
                            answered: false,
                        });
                    }
                    Some(word) => {
                        // Nobody registered is waiting for this answer.
                        let freed = slot.refuse(word);
                        serving.fetch_sub(1, Ordering::SeqCst);
                        self.shared
                            .counters
                            .requests_refused
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(
                            slot = slot_idx,
                            owner = %word.owner,
                            "refused a request whose owner is not a live registered client"
                        );
                        if freed {
                            notify(&slot.wake, &slot.waiters);
                            self.notify_free();
                        }
                    }
                    None => {
                        serving.fetch_sub(1, Ordering::SeqCst);
                        // An abandoned slot was freed by `take`.
                        self.notify_free();
                    }
                }
            });
            if out.len() > before {
                return out.len() - before;
            }
            let header = self.shared.segment.header();
            // Adaptive: no spin while another serve thread serves a
            // request (a lone call's next request comes only after its
            // answer; a busy ring's work wants the cores).
            let crowded = self.shared.taken.load(Ordering::Relaxed) > 0;
            let pending = wait_for(
                &header.doorbell,
                &header.server_parked,
                self.wait,
                WaitSite::Request,
                crowded,
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

    /// Whether the segment file was truncated by another process (see
    /// [`RingMonitor::damaged`]): drop this server and create a new one.
    pub fn damaged(&self) -> bool {
        self.shared.damaged.load(Ordering::Acquire)
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
    /// Clients see the state, accept no new calls and submit only those
    /// they had accepted (docs/protocol.md, "Draining").
    pub fn set_draining(&self) {
        // SYNC POINT: SeqCst, paired with a client's increment of its
        // `accepted` count before its SeqCst load of the state: either
        // that client sees DRAINING, or [`RingMonitor::unfinished`] sees
        // its call.
        self.shared
            .segment
            .header()
            .preamble
            .server_state
            .store(server_state::DRAINING, Ordering::SeqCst);
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

/// Heartbeat and housekeeping loop, until `stop`.
fn housekeep(shared: &Shared, interval: Duration, client_timeout: Duration) {
    let segment = &shared.segment;
    let header = segment.header();
    let mut watch = ClientWatch::default();
    // Per client entry: whether its stall was already logged.
    let mut stall_logged = [false; crate::layout::MAX_CLIENTS];
    let mut last_seen: Vec<Option<SlotWord>> = vec![None; segment.geometry().slot_count as usize];
    while !shared.stop.load(Ordering::Acquire) {
        if segment.damaged() {
            // Nothing in the file can be trusted any more, and every worker
            // detaches from it: stop beating and leave the rest to the owner
            // of this server, which creates a new segment.
            if !shared.damaged.swap(true, Ordering::AcqRel) {
                tracing::error!(
                    segment = %segment.name(),
                    "the segment file was truncated by another process; \
                     it is retired and a new segment must be created"
                );
            }
            std::thread::park_timeout(interval);
            continue;
        }
        header
            .preamble
            .server_heartbeat
            .fetch_add(1, Ordering::Release);
        let dead = watch.dead_clients(header, client_timeout, Instant::now());
        for (index, logged) in stall_logged.iter_mut().enumerate() {
            if !dead.iter().any(|d| d.index as usize == index) {
                *logged = false;
            }
        }
        for dead in dead {
            match segment.client_entry_locked(dead.index) {
                Ok(true) => {
                    if !stall_logged[dead.index as usize] {
                        stall_logged[dead.index as usize] = true;
                        shared
                            .counters
                            .clients_stalled
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            client = dead.index,
                            timeout_ms = client_timeout.as_millis() as u64,
                            "a worker stopped heartbeating but its process still holds its \
                             entry lock (stalled, not dead); its slots are kept"
                        );
                    }
                    continue;
                }
                Ok(false) => {}
                Err(e) => {
                    // Not known to be dead: its slots may still be read in
                    // place. Kept, and tested again at the next pass.
                    if !stall_logged[dead.index as usize] {
                        stall_logged[dead.index as usize] = true;
                        tracing::warn!(
                            client = dead.index,
                            error = %e,
                            "cannot test a silent worker's entry lock; its slots are kept \
                             until the test succeeds"
                        );
                    }
                    continue;
                }
            }
            if liveness::unregister(header, dead) {
                shared
                    .counters
                    .clients_reaped
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    client = dead.index,
                    timeout_ms = client_timeout.as_millis() as u64,
                    "worker stopped heartbeating and holds no entry lock (dead); \
                     reclaiming its slots"
                );
            }
        }
        scan_slots(shared, &mut last_seen);
        std::thread::park_timeout(interval);
    }
}

/// One pass over every slot: reclaims orphans, frees lone abandoned slots,
/// repairs lost submission bits (see the module doc).
fn scan_slots(shared: &Shared, last_seen: &mut [Option<SlotWord>]) {
    let segment = &shared.segment;
    let header = segment.header();
    let queue = SubmitQueue {
        bits: &header.submit_bits,
        doorbell: &header.doorbell,
        server_parked: &header.server_parked,
    };
    let mut freed = 0u64;
    for (slot_idx, slot) in segment.slots().enumerate() {
        let word = slot.load();
        let seen_before = last_seen[slot_idx].replace(word);
        match word.state {
            state::FREE => {}
            state::ABANDONED
                if shared.serving[slot_idx].load(Ordering::SeqCst) == 0
                    && slot.free_abandoned(word) =>
            {
                freed += 1;
                shared
                    .counters
                    .abandoned_freed
                    .fetch_add(1, Ordering::Relaxed);
            }
            state::ABANDONED => {}
            _ if !liveness::owner_is_live(header, word.owner) => match slot.reclaim(word.owner) {
                ReclaimOutcome::Abandoned if word.state > state::ABANDONED => {
                    tracing::warn!(
                        slot = slot_idx,
                        code = word.state,
                        "a client that is gone left a state code no slot state has; the slot \
                         is reclaimed"
                    );
                    shared
                        .counters
                        .slots_reclaimed
                        .fetch_add(1, Ordering::Relaxed);
                    notify(&slot.wake, &slot.waiters);
                }
                ReclaimOutcome::Freed => {
                    freed += 1;
                    shared
                        .counters
                        .slots_reclaimed
                        .fetch_add(1, Ordering::Relaxed);
                    notify(&slot.wake, &slot.waiters);
                }
                ReclaimOutcome::Abandoned => {
                    shared
                        .counters
                        .slots_reclaimed
                        .fetch_add(1, Ordering::Relaxed);
                    notify(&slot.wake, &slot.waiters);
                }
                ReclaimOutcome::NotOwned => {}
            },
            state::SUBMITTED if seen_before == Some(word) => {
                // Counted first: once the bit is pushed, a serving thread
                // may take and answer the request at once.
                shared
                    .counters
                    .submissions_repaired
                    .fetch_add(1, Ordering::Relaxed);
                queue.push(slot_idx);
            }
            _ => {}
        }
    }
    if freed > 0 {
        notify(&header.free_seq, &header.free_waiters);
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

    /// The request id as the client wrote it, even when the rest of the
    /// request is invalid: every answer echoes it.
    pub fn request_id(&self) -> u64 {
        let mut id = [0u8; 8];
        self.shared
            .segment
            .read_request(self.slot_idx as usize, 0, &mut id);
        u64::from_le_bytes(id)
    }

    /// Reads and validates the request: copied out of the request area
    /// first (see `Segment::read_request`), then decoded from the copy.
    pub fn request(&self) -> Result<Request, RequestError> {
        let segment = &self.shared.segment;
        let slot_idx = self.slot_idx as usize;
        let mut area = vec![0u8; request::TARGETS_OFFSET];
        segment.read_request(slot_idx, 0, &mut area);
        // The header says how much follows (targets, a new node), bounded by
        // the area; `decode` checks it all on the copy.
        let len = request::occupied_bytes(&area, segment.decoding());
        area.resize(len.next_multiple_of(8), 0);
        segment.read_request(
            slot_idx,
            request::TARGETS_OFFSET,
            &mut area[request::TARGETS_OFFSET..],
        );
        request::decode(&area, segment.decoding())
    }

    /// Writes an OK dense-layout response in place: `fill` gets mutable
    /// views of the final Arrow buffers. If the response does not fit,
    /// answers `TOO_LARGE` and returns the error.
    pub fn respond(
        mut self,
        request_id: u64,
        meta: impl Into<payload::ResponseMeta>,
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
                writer.finish(request_id, meta, server_ns);
                self.publish();
                Ok(())
            }
            Err(error) => {
                self.respond_error(status::TOO_LARGE, request_id, &error.to_string());
                Err(error)
            }
        }
    }

    /// Writes an OK graph response in place (the subgraph layout on a
    /// one-type graph's segment, the typed layout on a typed graph's, whose
    /// schema gives its tables): `fill` gets mutable views of the final
    /// Arrow buffers. If the response does not fit, answers `TOO_LARGE` and
    /// returns the error.
    pub fn respond_graph(
        mut self,
        request_id: u64,
        meta: impl Into<payload::ResponseMeta>,
        shape: payload::GraphShape,
        fill: impl FnOnce(&mut payload::GraphColumns<'_>),
    ) -> Result<(), WriteError> {
        let segment = &self.shared.segment;
        let graph = segment.graph();
        // SAFETY: as in `respond`.
        let area = unsafe { segment.response_area(self.slot_idx as usize) };
        match payload::GraphWriter::new(area, graph, shape, &self.shared.schemas) {
            Ok(mut writer) => {
                fill(&mut writer.columns());
                let server_ns = self.taken_at.elapsed().as_nanos() as u64;
                writer.finish(request_id, meta, server_ns);
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
        let published = slot.publish(self.word);
        self.shared.serving[self.slot_idx as usize].fetch_sub(1, Ordering::SeqCst);
        self.shared.taken.fetch_sub(1, Ordering::Relaxed);
        match published {
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
            let request_id = self.request_id();
            self.write_error(
                status::INTERNAL,
                request_id,
                "the sidecar dropped the request without answering (see its log)",
            );
            self.publish();
        }
    }
}
