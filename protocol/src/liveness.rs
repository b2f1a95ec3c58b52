//! Liveness by heartbeats in the segment, never by process ids (the sidecar
//! and the worker run in separate PID namespaces).
//!
//! - The sidecar increments `Preamble::server_heartbeat` every
//!   `heartbeat_interval`. A worker that sees it stand still for
//!   `sidecar_timeout` (1 s by default), or sees `server_state` leave
//!   READY/DRAINING, considers that sidecar gone and re-attaches by name.
//! - Each client registers in `Header::clients` and increments its entry's
//!   heartbeat. The sidecar reaps a client whose heartbeat stands still for
//!   `client_timeout`: its slots are reclaimed and the entry freed.
//!
//! Counters are compared for *change* on the observer's own monotonic clock,
//! so the two processes need no common clock for liveness.

use std::time::{Duration, Instant};

use crate::layout::{client_state, ClientEntry, Header, MAX_CLIENTS};
use crate::slot::OwnerTag;
use crate::sync::Ordering;

/// When a heartbeat counter last changed, on the observer's clock.
#[derive(Debug, Clone, Copy)]
pub struct HeartbeatWatch {
    value: u64,
    changed_at: Instant,
}

impl HeartbeatWatch {
    pub fn new(value: u64, now: Instant) -> Self {
        Self {
            value,
            changed_at: now,
        }
    }

    /// Records a reading; returns how long the counter has stood still.
    pub fn observe(&mut self, value: u64, now: Instant) -> Duration {
        if value != self.value {
            self.value = value;
            self.changed_at = now;
        }
        now.saturating_duration_since(self.changed_at)
    }
}

fn entry_word(generation: u64, state: u64) -> u64 {
    (generation << 8) | state
}

/// A registered client: its entry index and the generation it registered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientId {
    pub index: u16,
    pub generation: u64,
}

impl ClientId {
    /// The owner tag this client writes into the slots it claims.
    pub const fn tag(self) -> OwnerTag {
        OwnerTag::new(self.index, self.generation)
    }
}

/// Whether `owner` names a client that is registered (ACTIVE) now, with the
/// generation in the tag: the sidecar serves only such owners' slots.
pub fn owner_is_live(header: &Header, owner: OwnerTag) -> bool {
    header.clients.get(owner.index()).is_some_and(|entry| {
        let word = entry.state.load(Ordering::Acquire);
        word & 0xff == client_state::ACTIVE
            && ((word >> 8) & 0xffff) as u16 == owner.generation_low()
    })
}

/// Registers a client in the first free entry.
pub fn register(header: &Header) -> Option<ClientId> {
    register_with(header, |_| true)
}

/// Registers a client in the first free entry for which `lock(index)`
/// succeeds once the entry is ACTIVE (the caller takes the entry's lock
/// there); an entry whose lock fails is given back and the next one tried.
pub fn register_with(header: &Header, mut lock: impl FnMut(u16) -> bool) -> Option<ClientId> {
    for (index, entry) in header.clients.iter().enumerate() {
        let current = entry.state.load(Ordering::Acquire);
        if current & 0xff != client_state::FREE {
            continue;
        }
        let generation = (current >> 8) + 1;
        if entry
            .state
            .compare_exchange(
                current,
                entry_word(generation, client_state::ACTIVE),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            let id = ClientId {
                index: index as u16,
                generation,
            };
            if !lock(id.index) {
                unregister(header, id);
                continue;
            }
            entry.heartbeat.fetch_add(1, Ordering::Release);
            entry.pid.store(std::process::id(), Ordering::Relaxed);
            // A former holder's count is not this client's.
            entry.accepted.store(0, Ordering::SeqCst);
            return Some(id);
        }
    }
    None
}

/// Frees `id`'s entry if it is still `id`'s (not reaped and reused).
pub fn unregister(header: &Header, id: ClientId) -> bool {
    let Some(entry) = header.clients.get(id.index as usize) else {
        return false;
    };
    entry
        .state
        .compare_exchange(
            entry_word(id.generation, client_state::ACTIVE),
            entry_word(id.generation, client_state::FREE),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
}

/// Whether `id` is still registered (the sidecar has not reaped it).
pub fn is_registered(header: &Header, id: ClientId) -> bool {
    header.clients.get(id.index as usize).is_some_and(|entry| {
        entry.state.load(Ordering::Acquire) == entry_word(id.generation, client_state::ACTIVE)
    })
}

/// How many entries are registered (ACTIVE) now.
pub fn registered_count(header: &Header) -> u32 {
    header
        .clients
        .iter()
        .filter(|entry| entry.state.load(Ordering::Acquire) & 0xff == client_state::ACTIVE)
        .count() as u32
}

/// The calls that registered (ACTIVE) clients accepted and have not
/// finished: a drain is complete only when this and the ring's pending
/// requests are both 0 (docs/protocol.md, "Draining"). Read it after
/// storing DRAINING and before counting pending slots.
pub fn accepted_count(header: &Header) -> u64 {
    header
        .clients
        .iter()
        .filter(|entry| entry.state.load(Ordering::Acquire) & 0xff == client_state::ACTIVE)
        // SYNC POINT: pairs with the client's increment before it loads
        // `server_state` (client.rs, `RingClient::accept`): both SeqCst, so
        // either the client sees DRAINING or this sees its call.
        .map(|entry| u64::from(entry.accepted.load(Ordering::SeqCst)))
        .sum()
}

/// One client heartbeat.
pub fn beat(entry: &ClientEntry) {
    entry.heartbeat.fetch_add(1, Ordering::Release);
}

/// The sidecar's view of every client entry, to find dead ones.
#[derive(Debug)]
pub struct ClientWatch {
    /// Per entry: the entry word being watched, and its heartbeat watch.
    watched: Vec<Option<(u64, HeartbeatWatch)>>,
}

impl Default for ClientWatch {
    fn default() -> Self {
        Self {
            watched: vec![None; MAX_CLIENTS],
        }
    }
}

impl ClientWatch {
    /// Returns the clients whose heartbeat stood still for `timeout`.
    pub fn dead_clients(
        &mut self,
        header: &Header,
        timeout: Duration,
        now: Instant,
    ) -> Vec<ClientId> {
        let mut dead = Vec::new();
        for (index, entry) in header.clients.iter().enumerate() {
            let word = entry.state.load(Ordering::Acquire);
            if word & 0xff != client_state::ACTIVE {
                self.watched[index] = None;
                continue;
            }
            let heartbeat = entry.heartbeat.load(Ordering::Acquire);
            let watch = match &mut self.watched[index] {
                Some((watched_word, watch)) if *watched_word == word => watch,
                slot => {
                    *slot = Some((word, HeartbeatWatch::new(heartbeat, now)));
                    continue;
                }
            };
            if watch.observe(heartbeat, now) >= timeout {
                dead.push(ClientId {
                    index: index as u16,
                    generation: word >> 8,
                });
            }
        }
        dead
    }
}
