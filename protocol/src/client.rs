//! The worker's side of the ring: attach, submit from many threads, wait,
//! read the response in place, and survive sidecar restarts.
//!
//! A [`RingClient`] holds the current attachment (one sidecar epoch). When
//! that sidecar stops, is replaced, or its heartbeat stands still for
//! `sidecar_timeout`, the next call attaches to whatever segment now has the
//! name, registers again, and carries on: the worker is never restarted.
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use arrow_buffer::Buffer;

use crate::layout::{server_state, status, FeatureSchema, Geometry, ResponseHeader, MAX_HOPS};
use crate::liveness::{self, ClientId, HeartbeatWatch};
use crate::payload::{self, DecodeError, DecodeLimits, ResponseTables, SchemaCache};
use crate::request::{self, NewNode};
use crate::segment::{server_state_name, AttachError, Segment};
use crate::slot::{state, AbandonOutcome, SlotWord};
use crate::submit::SubmitQueue;
use crate::sync::Ordering;
use crate::wait::{notify, wait_for, WaitPolicy, WaitSite};

/// How the worker uses the ring.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub wait: WaitPolicy,
    /// A sidecar whose heartbeat stands still this long is gone.
    pub sidecar_timeout: Duration,
    /// How often this client beats and checks the sidecar.
    pub heartbeat_interval: Duration,
    /// Deadline of a call that sets none.
    pub default_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            wait: WaitPolicy::default(),
            sidecar_timeout: Duration::from_secs(1),
            heartbeat_interval: Duration::from_millis(100),
            default_timeout: Duration::from_secs(1),
        }
    }
}

/// One call: the targets and, optionally, fanouts and a deadline.
#[derive(Debug, Clone, Copy)]
pub struct CallRequest<'a> {
    pub targets: &'a [u64],
    /// 0 = the sidecar's default for that hop.
    pub fanouts: [u32; MAX_HOPS],
    /// `None` = [`ClientOptions::default_timeout`].
    pub timeout: Option<Duration>,
    pub request_id: u64,
    /// Only the targets' own rows, no neighbours (`OWN_ROWS_ONLY`).
    pub own_rows_only: bool,
    /// The one target is this node (of `graph`'s target type; the dense
    /// layout's: node type 0), which the graph does not have (`NEW_NODE`);
    /// `targets` is its id alone.
    pub new_node: Option<&'a NewNode>,
    /// Unchanged targets come back `FRESH` with their own row alone
    /// (`FRESH_SINCE`).
    pub fresh: Option<request::FreshSince>,
    /// Unchanged hubs among the hop-1 nodes come without their hop-2
    /// neighbours (`HUB_H1`); with `fresh` as well, both carry the same
    /// point of the change clock.
    pub hub_h1: Option<request::HubH1>,
    /// The graph layout (docs/protocol.md, "Graph requests"): the targets'
    /// node type, the hops and a fanout per edge type and hop (a one-type
    /// graph's: [`request::GraphAsk::one_type`]); `fanouts` is not used.
    /// Decode the answer with [`Response::graph_tables`]. `None`: the dense
    /// layout at `fanouts`.
    pub graph: Option<&'a request::GraphAsk>,
    /// With `fresh` and `graph`: the hops and fanouts the caller's answers
    /// were computed at, when not `graph`'s own (`fresh_hops`, docs/protocol.md,
    /// "Freshness").
    pub fresh_at: Option<&'a request::GraphAsk>,
    /// The call this request is part of, accepted while the sidecar was
    /// READY ([`RingClient::accept`]): submitted even once it is DRAINING,
    /// if the sidecar is the one it was accepted on. `None`: submitted only
    /// while READY.
    pub accepted: Option<&'a Accepted>,
    /// The trace this request is part of (docs/protocol.md, "Trace
    /// context"); `None`: untraced.
    pub trace: Option<request::TraceContext>,
    /// With `graph`: temporal sampling at each target's seed time
    /// (`SEED_TIME`, docs/protocol.md, "Temporal sampling").
    pub seed_times: Option<&'a request::SeedTimes>,
}

impl<'a> CallRequest<'a> {
    pub fn new(targets: &'a [u64]) -> Self {
        Self {
            targets,
            fanouts: [0; MAX_HOPS],
            timeout: None,
            request_id: 0,
            own_rows_only: false,
            new_node: None,
            fresh: None,
            hub_h1: None,
            graph: None,
            fresh_at: None,
            accepted: None,
            trace: None,
            seed_times: None,
        }
    }

    /// A request for a node the graph does not have: `id` with `node`'s row
    /// and edges (`NEW_NODE`).
    pub fn new_node(id: &'a [u64; 1], node: &'a NewNode) -> Self {
        Self {
            new_node: Some(node),
            ..Self::new(id)
        }
    }

    /// The same targets, their own rows only.
    pub fn own_rows_only(mut self) -> Self {
        self.own_rows_only = true;
        self
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("sidecar unavailable: {0}")]
    Attach(#[from] AttachError),
    #[error(
        "sidecar on /dev/shm/{name} is gone ({reason}) and no new one appeared before the deadline"
    )]
    SidecarGone { name: String, reason: String },
    #[error(
        "sidecar on /dev/shm/{name} is draining: it answers what was submitted and takes no \
         new requests; retry once its replacement is up"
    )]
    Draining { name: String },
    #[error("deadline exceeded {stage}")]
    DeadlineExceeded { stage: &'static str },
    #[error(
        "no ring slot came free before the deadline: all {slots} slots of the sidecar on \
         /dev/shm/{name} are busy (it is saturated); retry shortly, or add capacity"
    )]
    RingFull { name: String, slots: u32 },
    #[error(
        "{n_targets} targets in one call; the sidecar allows at most {max_targets}: split the \
         batch, or raise the sidecar's max_targets (--max-targets)"
    )]
    TooManyTargets { n_targets: usize, max_targets: u32 },
    #[error("{0}")]
    NewNode(String),
    /// A graph-layout request the graph cannot serve, or a dense one to a
    /// typed graph (docs/protocol.md, "Graph requests").
    #[error("{0}")]
    Graph(String),
    #[error(
        "all {0} client entries of the segment are in use: too many worker processes attached"
    )]
    RegistryFull(usize),
    #[error("sidecar answered {status_name}: {message}")]
    Status {
        status: u32,
        status_name: &'static str,
        message: String,
    },
}

/// The request header of a call.
fn request_header(
    request: &CallRequest<'_>,
    deadline_mono_ns: u64,
) -> crate::layout::RequestHeader {
    debug_assert!(
        request.fresh.is_none()
            || request.hub_h1.is_none()
            || request.fresh == request.hub_h1.map(|h| h.since),
        "FRESH_SINCE and HUB_H1 share the request's point of the change clock"
    );
    let since = request.fresh.or(request.hub_h1.map(|h| h.since));
    crate::layout::RequestHeader {
        request_id: request.request_id,
        deadline_mono_ns,
        n_targets: request.targets.len() as u32,
        fanouts: match request.graph {
            Some(_) => [0; MAX_HOPS],
            None => request.fanouts,
        },
        flags: request_flags(request),
        new_node_edges: request.new_node.map_or(0, |node| node.n_edges() as u32),
        hub_min_degree: request.hub_h1.map_or(0, |h| h.min_degree),
        fresh_clock: since.map_or(0, |f| f.clock),
        fresh_tick: since.map_or(0, |f| f.tick),
        fresh_fanouts: since.map_or([0; MAX_HOPS], |f| f.fanouts),
        hops: request.graph.map_or(0, |g| g.hops),
        _reserved_68: 0,
        fresh_hops: request
            .fresh_at
            .filter(|_| request.fresh.is_some() && request.graph.is_some())
            .map_or(0, |g| g.hops),
        _reserved_76: 0,
        trace_id: request.trace.map_or([0; 16], |t| t.trace_id),
        trace_parent: request.trace.map_or([0; 8], |t| t.parent),
        trace_flags: request.trace.map_or(0, |t| u32::from(t.sampled)),
        target_type: request.graph.map_or(0, |g| g.target_type),
        _reserved: [0; 16],
    }
}

/// The flag bits of a call.
fn request_flags(request: &CallRequest<'_>) -> u32 {
    use crate::layout::request_flags::{FRESH_SINCE, HUB_H1, NEW_NODE, OWN_ROWS_ONLY};
    let mut flags = 0;
    if request.fresh.is_some() {
        flags |= FRESH_SINCE;
    }
    if request.hub_h1.is_some() {
        flags |= HUB_H1;
    }
    if request.own_rows_only {
        flags |= OWN_ROWS_ONLY;
    }
    if request.new_node.is_some() {
        flags |= NEW_NODE;
    }
    flags
        | request.graph.map_or(0, |g| g.edge_data.flags())
        | request.seed_times.map_or(0, request::SeedTimes::flags)
}

/// What [`RingClient::status`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientStatus {
    /// Attached to a sidecar that takes requests.
    Ready,
    /// The sidecar is draining: calls are refused until a new one is up.
    Draining,
    /// The sidecar was lost (the reason); the next call re-attaches.
    Lost(String),
    /// Never attached.
    NotAttached,
}

/// This client's registration in one sidecar epoch.
#[derive(Debug)]
struct Attachment {
    segment: Segment,
    id: ClientId,
    /// Set by the heartbeat thread when the sidecar is gone or evicted us.
    lost: AtomicBool,
    lost_reason: Mutex<String>,
    /// The sidecar's heartbeat when this attachment was marked lost.
    lost_heartbeat: AtomicU64,
    next_slot: AtomicUsize,
    schemas: SchemaCache,
}

impl Attachment {
    fn queue(&self) -> SubmitQueue<'_> {
        let header = self.segment.header();
        SubmitQueue {
            bits: &header.submit_bits,
            doorbell: &header.doorbell,
            server_parked: &header.server_parked,
        }
    }

    fn mark_lost(&self, reason: String) {
        let heartbeat = self
            .segment
            .header()
            .preamble
            .server_heartbeat
            .load(Ordering::Acquire);
        self.lost_heartbeat.store(heartbeat, Ordering::Release);
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::warn!(segment = %self.segment.name(), %reason, "lost the sidecar");
            *self.lost_reason.lock().unwrap_or_else(|p| p.into_inner()) = reason;
        }
    }

    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    fn lost_reason(&self) -> String {
        self.lost_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Claims a free slot, starting at a rotating index so that threads
    /// spread over the ring.
    fn try_claim(&self) -> Option<(usize, SlotWord)> {
        let n = self.segment.geometry().slot_count as usize;
        let start = self.next_slot.fetch_add(1, Ordering::Relaxed);
        (0..n).find_map(|i| {
            let slot_idx = (start + i) % n;
            self.segment
                .slot(slot_idx)
                .try_claim(self.id.tag())
                .map(|word| (slot_idx, word))
        })
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // Every lease holds the attachment, so no slot of ours is in use:
        // unregistering gives them all up (the sidecar reclaims any left).
        liveness::unregister(self.segment.header(), self.id);
        self.segment.unlock_client_entry(self.id.index);
    }
}

/// One call a client accepted while its sidecar was READY, counted in its
/// registry entry's `accepted` until this is dropped: a drain waits for it,
/// and its requests are submitted while DRAINING (docs/protocol.md,
/// "Draining"). Hold it until the call has been answered.
#[derive(Debug)]
pub struct Accepted {
    attachment: Arc<Attachment>,
}

impl Drop for Accepted {
    fn drop(&mut self) {
        let att = &self.attachment;
        // A reaped entry may belong to another client by now: its count is
        // not ours to lower.
        if liveness::is_registered(att.segment.header(), att.id) {
            let entry = &att.segment.header().clients[att.id.index as usize];
            let _ = entry
                .accepted
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    Some(n.saturating_sub(1))
                });
        }
    }
}

/// Beats this client's heartbeat and watches the sidecar's, until the
/// attachment is dropped or lost.
fn heartbeat_loop(attachment: Weak<Attachment>, interval: Duration, sidecar_timeout: Duration) {
    let mut watch: Option<HeartbeatWatch> = None;
    // Whether the sidecar's preamble lock was ever seen held: only then does
    // its release mean the sidecar died (docs/protocol.md, section 6).
    let mut lock_seen = false;
    loop {
        let Some(att) = attachment.upgrade() else {
            return;
        };
        let header = att.segment.header();
        let entry = &header.clients[att.id.index as usize];
        liveness::beat(entry);
        let now = Instant::now();
        let state_now = header.preamble.server_state.load(Ordering::Acquire);
        let beat = header.preamble.server_heartbeat.load(Ordering::Acquire);
        let still = watch
            .get_or_insert_with(|| HeartbeatWatch::new(beat, now))
            .observe(beat, now);
        let lock_held = att.segment.server_lock_held().ok();
        if lock_held == Some(true) {
            lock_seen = true;
        }
        if att.segment.damaged() {
            att.mark_lost(
                "the segment file was truncated (a process shrank it); attaching again".into(),
            );
        } else if !matches!(state_now, server_state::READY | server_state::DRAINING) {
            att.mark_lost(format!("sidecar state {}", server_state_name(state_now)));
        } else if lock_seen && lock_held == Some(false) {
            att.mark_lost("the sidecar process is gone (its segment lock was released)".into());
        } else if still >= sidecar_timeout {
            att.mark_lost(format!(
                "sidecar heartbeat stood still for {} ms",
                still.as_millis()
            ));
        } else if !liveness::is_registered(header, att.id) {
            att.mark_lost("the sidecar reaped this client (it stopped heartbeating)".into());
        }
        if att.is_lost() {
            // Wake any caller parked on this epoch's slots so it notices now.
            for slot in att.segment.slots() {
                if SlotWord::unpack(slot.state.load(Ordering::Acquire)).owner == att.id.tag() {
                    notify(&slot.wake, &slot.waiters);
                }
            }
            notify(&header.free_seq, &header.free_waiters);
            return;
        }
        drop(att);
        std::thread::sleep(interval);
    }
}

/// The worker's handle on the ring. Cheap to share between threads
/// (`Arc<RingClient>` or `&RingClient`); every method takes `&self`.
#[derive(Debug)]
pub struct RingClient {
    name: String,
    options: ClientOptions,
    current: ArcSwapOption<Attachment>,
    reattach: Mutex<()>,
}

impl RingClient {
    /// Attaches to the segment `name`, validating its header.
    pub fn attach(name: &str, options: ClientOptions) -> Result<Self, CallError> {
        let client = Self {
            name: name.to_string(),
            options,
            current: ArcSwapOption::empty(),
            reattach: Mutex::new(()),
        };
        let attachment = client.new_attachment(None)?;
        client.current.store(Some(attachment));
        Ok(client)
    }

    /// Attaches and registers. `lost` is the epoch and server heartbeat of
    /// the attachment being replaced: the same epoch is accepted again only
    /// if its heartbeat moved since (a stalled sidecar that recovered, or one
    /// that reaped this client), never while it still stands still.
    fn new_attachment(&self, lost: Option<(u64, u64)>) -> Result<Arc<Attachment>, CallError> {
        let segment = Segment::attach(&self.name)?;
        // Response areas are the sidecar's to write: read-only here.
        if let Err(e) = segment.protect_peer_areas(true) {
            tracing::warn!(segment = %self.name, error = %e, "cannot map the response areas read-only");
        }
        if let Some((epoch, heartbeat)) = lost {
            let now = segment
                .header()
                .preamble
                .server_heartbeat
                .load(Ordering::Acquire);
            if segment.epoch() == epoch && now == heartbeat {
                return Err(CallError::SidecarGone {
                    name: self.name.clone(),
                    reason: "the segment still belongs to the lost sidecar".into(),
                });
            }
        }
        // Register, then hold the entry's lock for as long as we are
        // registered: the sidecar then never takes our slots (nor the
        // responses we read in place) from under a live process, even one
        // whose heartbeat thread stalls (docs/protocol.md, section 6).
        let id = liveness::register_with(segment.header(), |index| {
            segment.lock_client_entry(index).unwrap_or(false)
        })
        .ok_or(CallError::RegistryFull(crate::layout::MAX_CLIENTS))?;
        let attachment = Arc::new(Attachment {
            segment,
            id,
            lost: AtomicBool::new(false),
            lost_reason: Mutex::new(String::new()),
            lost_heartbeat: AtomicU64::new(0),
            next_slot: AtomicUsize::new(id.index as usize * 7),
            schemas: SchemaCache::default(),
        });
        let weak = Arc::downgrade(&attachment);
        // Beat at least as often as the sidecar asks in its header.
        let (interval, timeout) = (
            self.options
                .heartbeat_interval
                .min(attachment.segment.heartbeat_interval()),
            self.options.sidecar_timeout,
        );
        std::thread::Builder::new()
            .name("ring-heartbeat".into())
            .spawn(move || heartbeat_loop(weak, interval, timeout))
            .map_err(|e| CallError::SidecarGone {
                name: self.name.clone(),
                reason: format!("cannot spawn the heartbeat thread: {e}"),
            })?;
        tracing::info!(
            segment = %self.name,
            epoch = format_args!("{:#x}", attachment.segment.epoch()),
            client = id.index,
            "attached to the sidecar"
        );
        Ok(attachment)
    }

    /// The current attachment, re-attaching if the sidecar was lost.
    fn attachment(&self, deadline: Instant) -> Result<Arc<Attachment>, CallError> {
        let mut backoff = Duration::from_millis(2);
        loop {
            if let Some(att) = self.current.load_full() {
                if !att.is_lost() {
                    return Ok(att);
                }
            }
            {
                let _one_at_a_time = self.reattach.lock().unwrap_or_else(|p| p.into_inner());
                let current = self.current.load_full();
                match &current {
                    Some(att) if !att.is_lost() => return Ok(att.clone()),
                    _ => {}
                }
                let lost = current
                    .as_ref()
                    .map(|a| (a.segment.epoch(), a.lost_heartbeat.load(Ordering::Acquire)));
                let reason = current
                    .as_ref()
                    .map(|a| a.lost_reason())
                    .unwrap_or_default();
                match self.new_attachment(lost) {
                    Ok(att) => {
                        self.current.store(Some(att.clone()));
                        return Ok(att);
                    }
                    Err(
                        e @ (CallError::RegistryFull(_)
                        | CallError::Attach(AttachError::Mismatch { .. })),
                    ) => return Err(e),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(CallError::SidecarGone {
                            name: self.name.clone(),
                            reason: format!("{reason}; last attach attempt: {e}"),
                        })
                    }
                    Err(_) => {}
                }
            }
            // Nothing to park on while no segment exists: back off and retry.
            std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// Re-attaches now if the sidecar was lost: one attempt, no waiting.
    /// `Ok` when attached to a sidecar that has not been lost.
    pub fn reattach(&self) -> Result<(), CallError> {
        self.attachment(Instant::now()).map(|_| ())
    }

    /// Whether calls can be made now, without waiting or re-attaching.
    pub fn status(&self) -> ClientStatus {
        match self.current.load().as_ref() {
            None => ClientStatus::NotAttached,
            Some(att) if att.is_lost() => ClientStatus::Lost(att.lost_reason()),
            Some(att) => match att
                .segment
                .header()
                .preamble
                .server_state
                .load(Ordering::Acquire)
            {
                server_state::READY => ClientStatus::Ready,
                server_state::DRAINING => ClientStatus::Draining,
                other => ClientStatus::Lost(format!("sidecar state {}", server_state_name(other))),
            },
        }
    }

    /// The epoch of the sidecar currently attached.
    pub fn epoch(&self) -> Option<u64> {
        self.current.load().as_ref().map(|a| a.segment.epoch())
    }

    /// The validated geometry of the current segment.
    pub fn geometry(&self) -> Option<Geometry> {
        self.current.load().as_ref().map(|a| *a.segment.geometry())
    }

    /// The validated feature schema of the current segment.
    pub fn schema(&self) -> Option<FeatureSchema> {
        self.current.load().as_ref().map(|a| *a.segment.schema())
    }

    /// The typed graph schema of the current segment (`None`: not attached,
    /// or a one-type graph).
    pub fn graph_schema(&self) -> Option<crate::graph_schema::GraphSchema> {
        self.current
            .load()
            .as_ref()
            .and_then(|a| a.segment.graph_schema().cloned())
    }

    /// The graph of the current segment (`None`: not attached): a typed
    /// graph's, or a one-type graph's as the 1x1 graph.
    pub fn graph(&self) -> Option<crate::graph_schema::GraphSchema> {
        self.current
            .load()
            .as_ref()
            .map(|a| a.segment.graph().clone())
    }

    /// Submits one request and waits for its response. Retries on a new
    /// sidecar if the current one is lost, until the deadline.
    pub fn call(&self, request: &CallRequest<'_>) -> Result<Response, CallError> {
        let deadline = Instant::now() + request.timeout.unwrap_or(self.options.default_timeout);
        // A call starts by (re-)attaching, waiting up to its deadline for a
        // sidecar. A sidecar found gone while the call is in flight fails
        // it at once, unless a new one is already there to take it: the
        // caller decides whether to wait (docs/protocol.md, section 6).
        let mut att = self.attachment(deadline)?;
        loop {
            match self.call_once(&att, request, deadline) {
                Err(gone @ CallError::SidecarGone { .. }) => {
                    match self.attachment(Instant::now()) {
                        Ok(next) if Instant::now() < deadline && !Arc::ptr_eq(&next, &att) => {
                            att = next;
                        }
                        _ => return Err(gone),
                    }
                }
                other => return other,
            }
        }
    }

    /// Accepts one call on the current sidecar: counted in this client's
    /// registry entry until the returned guard is dropped, so that a drain
    /// begun after this returns waits for the call, and its requests
    /// ([`CallRequest::accepted`]) are still submitted. Refused with
    /// [`CallError::Draining`] once the sidecar is DRAINING, and when no
    /// sidecar is attached or the current one is lost.
    pub fn accept(&self) -> Result<Accepted, CallError> {
        let Some(att) = self.current.load_full() else {
            return Err(CallError::SidecarGone {
                name: self.name.clone(),
                reason: "not attached".into(),
            });
        };
        if att.is_lost() {
            return Err(self.gone(&att));
        }
        let header = att.segment.header();
        let entry = &header.clients[att.id.index as usize];
        // SYNC POINT: SeqCst, paired with the sidecar's SeqCst store of
        // DRAINING before it reads the counts (liveness::accepted_count):
        // either the load below sees DRAINING, or the drain sees this call.
        entry.accepted.fetch_add(1, Ordering::SeqCst);
        let accepted = Accepted {
            attachment: att.clone(),
        };
        if header.preamble.server_state.load(Ordering::SeqCst) == server_state::DRAINING {
            drop(accepted);
            return Err(CallError::Draining {
                name: self.name.clone(),
            });
        }
        Ok(accepted)
    }

    fn gone(&self, att: &Attachment) -> CallError {
        CallError::SidecarGone {
            name: self.name.clone(),
            reason: att.lost_reason(),
        }
    }

    fn call_once(
        &self,
        att: &Arc<Attachment>,
        request: &CallRequest<'_>,
        deadline: Instant,
    ) -> Result<Response, CallError> {
        let segment = &att.segment;
        let geometry = *segment.geometry();
        if request.targets.len() > geometry.max_targets as usize {
            return Err(CallError::TooManyTargets {
                n_targets: request.targets.len(),
                max_targets: geometry.max_targets,
            });
        }
        match (request.graph, segment.graph_schema()) {
            (Some(ask), _) => {
                if let Some(problem) = request::graph_problem(ask, &geometry, segment.graph()) {
                    return Err(CallError::Graph(problem));
                }
                let fresh_at = request.fresh_at.filter(|_| request.fresh.is_some());
                if let Some(at) = fresh_at {
                    if at.target_type != ask.target_type {
                        return Err(CallError::Graph(format!(
                            "the stored answers' target type {} is not the request's {}",
                            at.target_type, ask.target_type
                        )));
                    }
                    if let Some(problem) = request::graph_problem(at, &geometry, segment.graph()) {
                        return Err(CallError::Graph(format!(
                            "the stored answers' (fresh_at): {problem}"
                        )));
                    }
                }
            }
            (None, Some(graph)) => {
                return Err(CallError::Graph(format!(
                    "the sidecar serves a typed graph ({}): send a graph-layout request (`graph`)",
                    graph.describe()
                )))
            }
            (None, None) => {}
        }
        if let Some(seed) = request.seed_times {
            let problem = if request.graph.is_none() {
                Some("seed times go with a graph-layout call (`graph`)".to_string())
            } else if seed.times.len() != request.targets.len() {
                Some(format!(
                    "{} seed times for {} targets: give one per target",
                    seed.times.len(),
                    request.targets.len()
                ))
            } else if request.new_node.is_some() || request.fresh.is_some() {
                Some("seed times go with neither a new node nor FRESH_SINCE".to_string())
            } else {
                let n_fanouts = request.graph.map_or(0, |g| g.fanouts.len());
                let end = request::seed_times_offset(request.targets.len() as u32, n_fanouts)
                    .map(|at| at + 8 * request.targets.len() as u64);
                (end > Some(geometry.request_bytes) || end.is_none()).then(|| {
                    format!(
                        "the seed times of {} targets do not fit the sidecar's {} byte request \
                         area (a sidecar older than SEED_TIME): upgrade it",
                        request.targets.len(),
                        geometry.request_bytes
                    )
                })
            };
            if let Some(problem) = problem {
                return Err(CallError::Graph(problem));
            }
        }
        if let Some(node) = request.new_node {
            let problem = match request.targets {
                [id] => {
                    request::new_node_problem(*id, node, request.graph, &geometry, segment.graph())
                }
                _ => Some(format!(
                    "a new-node call has {} target ids; it carries exactly one (the new node's)",
                    request.targets.len()
                )),
            };
            if let Some(problem) = problem {
                return Err(CallError::NewNode(problem));
            }
        }
        let header = segment.header();
        // The client rule of DRAINING (docs/protocol.md): submit nothing
        // new; a call accepted on this sidecar before it began to drain is
        // not new.
        let accepted_here = request
            .accepted
            .is_some_and(|accepted| Arc::ptr_eq(&accepted.attachment, att));
        let draining =
            || header.preamble.server_state.load(Ordering::Acquire) == server_state::DRAINING;
        if !accepted_here && draining() {
            return Err(CallError::Draining {
                name: self.name.clone(),
            });
        }
        let policy = self.options.wait;
        // 1. Claim a slot, parking on free_seq while the ring is full.
        let claimed = wait_for(
            &header.free_seq,
            &header.free_waiters,
            policy,
            WaitSite::Claim,
            // The ring is full: every core is wanted by the calls in it.
            true,
            Some(deadline),
            || {
                if att.is_lost() {
                    return Some(None);
                }
                att.try_claim().map(Some)
            },
        );
        let (slot_idx, claimed) = match claimed {
            Some(Some(claimed)) => claimed,
            Some(None) => return Err(self.gone(att)),
            None => {
                return Err(CallError::RingFull {
                    name: self.name.clone(),
                    slots: geometry.slot_count,
                })
            }
        };
        let slot = segment.slot(slot_idx);
        if !liveness::is_registered(header, att.id) {
            slot.cancel(claimed);
            att.mark_lost("the sidecar reaped this client (it stopped heartbeating)".into());
            return Err(self.gone(att));
        }
        // 2. Write the request and submit it.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let deadline_ns = request::mono_now_ns().saturating_add(remaining.as_nanos() as u64);
        // The slot is CLAIMED by this client: the request area is its to
        // write until the submit below (copied in word by word, never
        // through a reference into the peer's mapping).
        segment.write_request(
            slot_idx,
            &request::encoded(
                &request_header(request, deadline_ns),
                request.targets,
                request.graph,
                request
                    .fresh_at
                    .filter(|_| request.fresh.is_some() && request.graph.is_some()),
                request.new_node,
                request.seed_times,
            ),
        );
        // The client rule of DRAINING, again: the sidecar may have begun
        // its drain while the request was written (docs/protocol.md, "Rules
        // a client follows").
        if !accepted_here && draining() {
            slot.cancel(claimed);
            return Err(CallError::Draining {
                name: self.name.clone(),
            });
        }
        let submitted = match slot.submit(claimed) {
            Ok(word) => word,
            Err(_) => return Err(self.gone(att)), // reclaimed under us
        };
        att.queue().push(slot_idx);
        // 3. Wait for the response.
        let answered = || {
            let word = slot.load();
            if word.generation != submitted.generation || word.owner != submitted.owner {
                return Some(Err(()));
            }
            match word.state {
                state::PUBLISHED => Some(Ok(word)),
                state::SUBMITTED | state::SERVING if !att.is_lost() => None,
                _ => Some(Err(())),
            }
        };
        let outcome = wait_for(
            &slot.wake,
            &slot.waiters,
            policy,
            WaitSite::Response,
            false,
            Some(deadline),
            answered,
        );
        match outcome {
            Some(Ok(published)) => {
                let lease = Arc::new(Lease {
                    attachment: att.clone(),
                    slot_idx,
                    word: published,
                });
                let response_header = payload::read_header(lease.area())
                    .expect("the response area is larger than its header");
                if response_header.status != status::OK {
                    return Err(CallError::Status {
                        status: response_header.status,
                        status_name: payload::status_name(response_header.status),
                        message: payload::header_message(&response_header),
                    });
                }
                Ok(Response {
                    header: response_header,
                    lease,
                })
            }
            Some(Err(())) => {
                slot.abandon(submitted);
                Err(self.gone(att))
            }
            None => match slot.abandon(submitted) {
                AbandonOutcome::Released => {
                    notify(&header.free_seq, &header.free_waiters);
                    Err(CallError::DeadlineExceeded {
                        stage: "waiting for the response",
                    })
                }
                _ => Err(CallError::DeadlineExceeded {
                    stage: "waiting for the response",
                }),
            },
        }
    }
}

/// Holds a published slot; the slot is released when the last response
/// object or Arrow array decoded from it is dropped.
#[derive(Debug)]
struct Lease {
    attachment: Arc<Attachment>,
    slot_idx: usize,
    word: SlotWord,
}

impl Lease {
    fn area_ptr(&self) -> (NonNull<u8>, usize) {
        let segment = &self.attachment.segment;
        (
            segment.response_ptr(self.slot_idx),
            segment.geometry().response_bytes as usize,
        )
    }

    fn area(&self) -> &[u8] {
        let (ptr, len) = self.area_ptr();
        // SAFETY: the slot is PUBLISHED and owned by this lease: the sidecar
        // no longer writes it and no one else may claim it until the lease
        // releases it in Drop; the area lies inside the mapping, which the
        // lease keeps alive through its attachment.
        unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let segment = &self.attachment.segment;
        if segment.slot(self.slot_idx).release(self.word) {
            let header = segment.header();
            notify(&header.free_seq, &header.free_waiters);
        }
    }
}

/// An OK response, still in the slot. Decoding it borrows the slot's memory;
/// the slot returns to the ring when this and every array decoded from it
/// are dropped.
#[derive(Debug)]
pub struct Response {
    header: ResponseHeader,
    lease: Arc<Lease>,
}

impl Response {
    pub fn header(&self) -> &ResponseHeader {
        &self.header
    }

    /// The slot this response occupies.
    pub fn slot_index(&self) -> usize {
        self.lease.slot_idx
    }

    /// This response's area as one Arrow buffer that keeps the slot leased.
    fn area(&self) -> Buffer {
        let (ptr, len) = self.lease.area_ptr();
        let owner: Arc<dyn arrow_buffer::alloc::Allocation> = self.lease.clone();
        // SAFETY: `ptr..ptr+len` is the response area of a slot this lease
        // holds PUBLISHED: valid, initialised (the sidecar wrote it before
        // publishing, Acquire-synchronised), and not written by anyone until
        // the lease is dropped, which `owner` prevents while the buffer lives.
        unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
    }

    fn limits(&self) -> DecodeLimits {
        let segment = &self.lease.attachment.segment;
        let geometry = segment.geometry();
        DecodeLimits {
            feature_dim: segment.schema().feature_dim,
            max_nodes: geometry.max_nodes,
            max_targets: geometry.max_targets,
            max_fanouts: geometry.max_fanouts,
        }
    }

    /// Decodes a dense-layout response's two tables without copying: their
    /// buffers point into the shared-memory slot and keep it leased.
    pub fn tables(&self) -> Result<ResponseTables, DecodeError> {
        payload::decode(&self.area(), &self.limits(), &self.lease.attachment.schemas)
    }

    /// Decodes a graph response without copying, like [`Response::tables`]:
    /// a one-type graph's subgraph layout (read as the 1x1 graph's,
    /// `target_type` 0) or a typed graph's layout, to a request whose
    /// targets are of node type `target_type`.
    pub fn graph_tables(&self, target_type: usize) -> Result<payload::GraphTables, DecodeError> {
        payload::decode_graph(
            &self.area(),
            &self.limits(),
            self.lease.attachment.segment.graph_schema(),
            target_type,
            &self.lease.attachment.schemas,
        )
    }

    /// [`Response::graph_tables`] of a response to a request that asked
    /// for the edge data `asked` ([`crate::request::GraphAsk::edge_data`]):
    /// each edge type's data table, where it carries any, read in place.
    pub fn graph_tables_with_edge_data(
        &self,
        target_type: usize,
        asked: crate::request::EdgeColumns,
    ) -> Result<payload::GraphTables, DecodeError> {
        let segment = &self.lease.attachment.segment;
        payload::decode_graph_with(
            &self.area(),
            &self.limits(),
            segment.graph(),
            segment.graph_schema().is_some(),
            target_type,
            asked,
            &self.lease.attachment.schemas,
        )
    }

    /// The graph schema of the segment this response came from (`None`
    /// for a one-type graph).
    pub fn graph_schema(&self) -> Option<&crate::graph_schema::GraphSchema> {
        self.lease.attachment.segment.graph_schema()
    }

    /// The graph of the segment this response came from: a typed graph's,
    /// or a one-type graph's as the 1x1 graph.
    pub fn graph(&self) -> &crate::graph_schema::GraphSchema {
        self.lease.attachment.segment.graph()
    }

    /// The address range of the mapping this response lives in.
    pub fn mapping_range(&self) -> std::ops::Range<usize> {
        self.lease.attachment.segment.address_range()
    }

    /// Whether the segment under this response was truncated by some
    /// process: bytes read from it since may be the zeros of the SIGBUS
    /// handler's page instead of the sidecar's rows (docs/protocol.md,
    /// section Truncation). Ask after using the response: anything decoded
    /// or computed from a damaged one is lost; fail it as unavailable and
    /// retry.
    pub fn segment_damaged(&self) -> bool {
        self.lease.attachment.segment.damaged()
    }
}
