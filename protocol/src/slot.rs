//! The slot lifecycle: one 64-bit state word per slot, moved only by
//! compare-and-swap on the whole word.
//!
//! The word is `generation (32 bits) << 32 | owner (24 bits) << 8 | state (8 bits)`,
//! where the owner is an [`OwnerTag`]: the client's registry index and the low
//! 16 bits of the generation it registered with, so a later client at the same
//! index never inherits its predecessor's slots. In a FREE word the owner bits
//! hold the last owner's tag and mean nothing. The generation increases on
//! every claim and every transition compares the whole word, so a stale ticket
//! (an old generation) can never move a slot that has since been reused: no
//! ABA.
//!
//! | from        | to          | by                          | when                                              |
//! |-------------|-------------|-----------------------------|---------------------------------------------------|
//! | `FREE`      | `CLAIMED`   | a client                    | it needs a slot (generation + 1, owner = client)  |
//! | `CLAIMED`   | `SUBMITTED` | the owner                   | the request is written; then it sets the slot's submission bit |
//! | `CLAIMED`   | `FREE`      | the owner, or the reaper    | the owner gives up before submitting, or died     |
//! | `SUBMITTED` | `SERVING`   | the sidecar                 | it takes the request                              |
//! | `SUBMITTED` | `ABANDONED` | the owner                   | its deadline passed                               |
//! | `SUBMITTED` | `FREE`      | the reaper                  | the owner died                                    |
//! | `SERVING`   | `PUBLISHED` | the sidecar                 | the response is written                           |
//! | `SERVING`   | `ABANDONED` | the owner, or the reaper    | deadline passed, or the owner died                |
//! | `PUBLISHED` | `FREE`      | the owner, or the reaper    | the owner is done with the response, or died      |
//! | `SERVING`   | `FREE`      | the sidecar                 | the owner is not a live registered client: the request is refused unanswered |
//! | `ABANDONED` | `FREE`      | the sidecar                 | it finds the slot abandoned when it takes or publishes it, or no serve thread holds it |
//! | any other code | `ABANDONED` | the reaper               | the owner wrote a code no state has, and died (then freed as any `ABANDONED` slot) |
//!
//! Memory ordering: every successful transition is `AcqRel`, every load that
//! decides something is `Acquire`.
//! - SYNC POINT (request): the owner's plain writes of the request happen
//!   before its `CLAIMED -> SUBMITTED` (Release); the sidecar's
//!   `SUBMITTED -> SERVING` (Acquire) makes them visible.
//! - SYNC POINT (response): the sidecar's plain writes of the response happen
//!   before `SERVING -> PUBLISHED` (Release); the owner's load of `PUBLISHED`
//!   (Acquire) makes them visible.
//! - SYNC POINT (reuse): `-> FREE` (Release) by whoever frees the slot happens
//!   before the next claim's CAS (Acquire), so the next owner's writes cannot
//!   race with the previous owner's reads.

use crate::layout::SlotControl;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The states of a slot (low byte of the state word).
pub mod state {
    pub const FREE: u8 = 0;
    pub const CLAIMED: u8 = 1;
    pub const SUBMITTED: u8 = 2;
    pub const SERVING: u8 = 3;
    pub const PUBLISHED: u8 = 4;
    pub const ABANDONED: u8 = 5;

    /// A name for logs and errors.
    pub fn name(state: u8) -> &'static str {
        match state {
            FREE => "FREE",
            CLAIMED => "CLAIMED",
            SUBMITTED => "SUBMITTED",
            SERVING => "SERVING",
            PUBLISHED => "PUBLISHED",
            ABANDONED => "ABANDONED",
            _ => "INVALID",
        }
    }
}

const GENERATION_BITS: u32 = 32;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
const OWNER_MASK: u32 = 0x00ff_ffff;

/// Who owns a slot: a client's registry index (low 8 bits) and the low 16
/// bits of the generation it registered with (bits 8..24). Two registrations
/// at the same index differ in their tag unless 65,536 registrations of that
/// index lie between them, and the sidecar reclaims a departed client's slots
/// within one heartbeat interval, long before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OwnerTag(pub u32);

impl OwnerTag {
    /// The tag of the client registered at `index` with `generation`.
    pub const fn new(index: u16, generation: u64) -> Self {
        Self((((generation & 0xffff) as u32) << 8) | (index as u32 & 0xff))
    }

    /// The registry index (0..=255; a valid one is below `MAX_CLIENTS`).
    pub const fn index(self) -> usize {
        (self.0 & 0xff) as usize
    }

    /// The low 16 bits of the owner's registration generation.
    pub const fn generation_low(self) -> u16 {
        ((self.0 >> 8) & 0xffff) as u16
    }
}

impl std::fmt::Display for OwnerTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "client {} (generation {})",
            self.index(),
            self.generation_low()
        )
    }
}

/// The decoded state word of a slot. Holding one is holding a *ticket*: the
/// exact word a later transition expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotWord {
    pub generation: u64,
    pub owner: OwnerTag,
    pub state: u8,
}

impl SlotWord {
    pub const fn pack(self) -> u64 {
        ((self.generation & GENERATION_MASK) << 32)
            | (((self.owner.0 & OWNER_MASK) as u64) << 8)
            | self.state as u64
    }

    pub const fn unpack(word: u64) -> Self {
        Self {
            generation: word >> 32,
            owner: OwnerTag(((word >> 8) as u32) & OWNER_MASK),
            state: (word & 0xff) as u8,
        }
    }

    const fn with_state(self, state: u8) -> Self {
        Self { state, ..self }
    }
}

/// What [`SlotControl::abandon`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbandonOutcome {
    /// The slot is now `ABANDONED`; the sidecar will free it.
    Abandoned,
    /// The response was published in the meantime and the slot was freed.
    Released,
    /// The ticket was stale: the slot was already reclaimed.
    Stale,
}

/// What [`SlotControl::reclaim`] did for a dead owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimOutcome {
    /// The slot was not the owner's (or already free).
    NotOwned,
    /// The slot is free again.
    Freed,
    /// The sidecar is serving it; it is marked abandoned and freed when served.
    Abandoned,
}

impl SlotControl {
    /// A free slot of generation 0 (the state of a zero-filled segment).
    pub fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            wake: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            _pad: [0; 48],
        }
    }

    /// The current word (Acquire).
    pub fn load(&self) -> SlotWord {
        SlotWord::unpack(self.state.load(Ordering::Acquire))
    }

    fn transition(&self, from: SlotWord, to: SlotWord) -> Result<SlotWord, SlotWord> {
        match self.state.compare_exchange(
            from.pack(),
            to.pack(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(to),
            Err(actual) => Err(SlotWord::unpack(actual)),
        }
    }

    /// `FREE -> CLAIMED` for `owner`, with the next generation.
    pub fn try_claim(&self, owner: OwnerTag) -> Option<SlotWord> {
        let current = self.load();
        if current.state != state::FREE {
            return None;
        }
        let claimed = SlotWord {
            generation: (current.generation + 1) & GENERATION_MASK,
            owner,
            state: state::CLAIMED,
        };
        self.transition(current, claimed).ok()
    }

    /// `CLAIMED -> SUBMITTED`. Err carries the word found instead.
    pub fn submit(&self, claimed: SlotWord) -> Result<SlotWord, SlotWord> {
        debug_assert_eq!(claimed.state, state::CLAIMED);
        self.transition(claimed, claimed.with_state(state::SUBMITTED))
    }

    /// `CLAIMED -> FREE`: the owner gives the slot back unused.
    pub fn cancel(&self, claimed: SlotWord) -> bool {
        self.transition(claimed, claimed.with_state(state::FREE))
            .is_ok()
    }

    /// Sidecar: `SUBMITTED -> SERVING`. Frees the slot instead if its owner
    /// abandoned it. `None` when there is nothing to serve (a stale
    /// submission bit, or an abandoned slot that was just freed).
    pub fn take(&self) -> Option<SlotWord> {
        let mut current = self.load();
        loop {
            let next = match current.state {
                state::SUBMITTED => current.with_state(state::SERVING),
                state::ABANDONED => current.with_state(state::FREE),
                _ => return None,
            };
            match self.transition(current, next) {
                Ok(word) if word.state == state::SERVING => return Some(word),
                Ok(_) => return None,
                Err(actual) => current = actual,
            }
        }
    }

    /// Sidecar: `SERVING -> PUBLISHED`. If the owner abandoned the slot
    /// meanwhile, frees it and returns `Err(FREE word)`.
    pub fn publish(&self, serving: SlotWord) -> Result<SlotWord, SlotWord> {
        debug_assert_eq!(serving.state, state::SERVING);
        match self.transition(serving, serving.with_state(state::PUBLISHED)) {
            Ok(word) => Ok(word),
            Err(actual) if actual == serving.with_state(state::ABANDONED) => {
                let freed = actual.with_state(state::FREE);
                // Only the sidecar moves an ABANDONED slot, and it holds it.
                match self.transition(actual, freed) {
                    Ok(word) => Err(word),
                    Err(other) => Err(other),
                }
            }
            Err(actual) => Err(actual),
        }
    }

    /// Owner: `PUBLISHED -> FREE`.
    pub fn release(&self, published: SlotWord) -> bool {
        debug_assert_eq!(published.state, state::PUBLISHED);
        self.transition(published, published.with_state(state::FREE))
            .is_ok()
    }

    /// Owner, after its deadline: `SUBMITTED | SERVING -> ABANDONED`, or
    /// release if the response arrived in the meantime.
    pub fn abandon(&self, submitted: SlotWord) -> AbandonOutcome {
        let mut current = self.load();
        loop {
            if current.generation != submitted.generation || current.owner != submitted.owner {
                return AbandonOutcome::Stale;
            }
            let (next, outcome) = match current.state {
                state::SUBMITTED | state::SERVING => (
                    current.with_state(state::ABANDONED),
                    AbandonOutcome::Abandoned,
                ),
                state::PUBLISHED => (current.with_state(state::FREE), AbandonOutcome::Released),
                _ => return AbandonOutcome::Stale,
            };
            match self.transition(current, next) {
                Ok(_) => return outcome,
                Err(actual) => current = actual,
            }
        }
    }

    /// Sidecar, holding the slot `SERVING`: the owner is not a live
    /// registered client, so the request is refused and the slot freed
    /// without an answer (nobody is waiting for one).
    pub fn refuse(&self, serving: SlotWord) -> bool {
        debug_assert_eq!(serving.state, state::SERVING);
        self.transition(serving, serving.with_state(state::FREE))
            .is_ok()
    }

    /// Sidecar housekeeping: frees the slot if it still holds exactly the
    /// `ABANDONED` word `abandoned` (the caller checked no serve thread holds
    /// it, so nobody else will).
    pub fn free_abandoned(&self, abandoned: SlotWord) -> bool {
        debug_assert_eq!(abandoned.state, state::ABANDONED);
        self.transition(abandoned, abandoned.with_state(state::FREE))
            .is_ok()
    }

    /// Reaper: the client `owner` is gone; give its slot back.
    pub fn reclaim(&self, owner: OwnerTag) -> ReclaimOutcome {
        let mut current = self.load();
        loop {
            if current.owner != owner {
                return ReclaimOutcome::NotOwned;
            }
            let (next, outcome) = match current.state {
                state::CLAIMED | state::SUBMITTED | state::PUBLISHED => {
                    (current.with_state(state::FREE), ReclaimOutcome::Freed)
                }
                // A serve thread may hold it; a code no state has (a broken
                // or hostile owner wrote it) may hide one too: abandoned,
                // then freed once no serve thread holds the slot.
                code if code == state::SERVING || code > state::ABANDONED => (
                    current.with_state(state::ABANDONED),
                    ReclaimOutcome::Abandoned,
                ),
                _ => return ReclaimOutcome::NotOwned,
            };
            match self.transition(current, next) {
                Ok(_) => return outcome,
                Err(actual) => current = actual,
            }
        }
    }
}

impl Default for SlotControl {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        let word = SlotWord {
            generation: GENERATION_MASK,
            owner: OwnerTag::new(63, 0xbeef),
            state: state::SERVING,
        };
        assert_eq!(SlotWord::unpack(word.pack()), word);
    }

    #[test]
    fn a_full_cycle_bumps_the_generation_once() {
        let slot = SlotControl::new();
        let claimed = slot.try_claim(OwnerTag(3)).unwrap();
        assert_eq!(claimed.generation, 1);
        assert!(
            slot.try_claim(OwnerTag(4)).is_none(),
            "a claimed slot cannot be claimed"
        );
        let submitted = slot.submit(claimed).unwrap();
        let serving = slot.take().unwrap();
        assert_eq!(serving.generation, submitted.generation);
        let published = slot.publish(serving).unwrap();
        assert!(slot.release(published));
        assert_eq!(slot.load().state, state::FREE);
        assert_eq!(slot.try_claim(OwnerTag(4)).unwrap().generation, 2);
    }

    #[test]
    fn a_stale_ticket_cannot_move_a_reused_slot() {
        let slot = SlotControl::new();
        let first = slot.try_claim(OwnerTag(1)).unwrap();
        assert!(slot.cancel(first));
        let second = slot.try_claim(OwnerTag(1)).unwrap();
        // Same owner, same state, older generation: refused.
        assert!(slot.submit(first).is_err());
        assert!(!slot.cancel(first));
        assert_eq!(slot.load(), second);
    }

    #[test]
    fn abandoned_while_serving_is_freed_at_publish() {
        let slot = SlotControl::new();
        let submitted = slot.submit(slot.try_claim(OwnerTag(1)).unwrap()).unwrap();
        let serving = slot.take().unwrap();
        assert_eq!(slot.abandon(submitted), AbandonOutcome::Abandoned);
        let freed = slot.publish(serving).unwrap_err();
        assert_eq!(freed.state, state::FREE);
        assert_eq!(slot.load().state, state::FREE);
    }

    #[test]
    fn abandoned_before_take_is_freed_by_take() {
        let slot = SlotControl::new();
        let submitted = slot.submit(slot.try_claim(OwnerTag(1)).unwrap()).unwrap();
        assert_eq!(slot.abandon(submitted), AbandonOutcome::Abandoned);
        assert!(slot.take().is_none());
        assert_eq!(slot.load().state, state::FREE);
    }

    #[test]
    fn reclaim_only_touches_the_dead_owners_slot() {
        let slot = SlotControl::new();
        let claimed = slot.try_claim(OwnerTag(7)).unwrap();
        assert_eq!(slot.reclaim(OwnerTag(8)), ReclaimOutcome::NotOwned);
        assert_eq!(slot.reclaim(OwnerTag(7)), ReclaimOutcome::Freed);
        assert!(slot.submit(claimed).is_err());
    }

    #[test]
    fn a_dead_owners_undefined_state_code_is_reclaimed() {
        let slot = SlotControl::new();
        let claimed = slot.try_claim(OwnerTag(7)).unwrap();
        let garbage = slot.transition(claimed, claimed.with_state(0x42)).unwrap();
        assert_eq!(slot.reclaim(OwnerTag(8)), ReclaimOutcome::NotOwned);
        assert_eq!(slot.reclaim(OwnerTag(7)), ReclaimOutcome::Abandoned);
        let abandoned = slot.load();
        assert_eq!(abandoned, garbage.with_state(state::ABANDONED));
        assert!(slot.free_abandoned(abandoned));
        assert!(
            slot.try_claim(OwnerTag(9)).is_some(),
            "the slot is usable again"
        );
    }

    #[test]
    fn a_later_client_at_the_same_index_does_not_own_its_predecessors_slots() {
        let slot = SlotControl::new();
        let before = OwnerTag::new(5, 1);
        let after = OwnerTag::new(5, 2);
        assert_eq!(before.index(), after.index());
        let claimed = slot.try_claim(before).unwrap();
        assert_eq!(slot.reclaim(after), ReclaimOutcome::NotOwned);
        assert_eq!(slot.load(), claimed);
        assert_eq!(slot.reclaim(before), ReclaimOutcome::Freed);
    }

    #[test]
    fn the_sidecar_refuses_a_taken_request_and_frees_a_lone_abandoned_slot() {
        let slot = SlotControl::new();
        slot.submit(slot.try_claim(OwnerTag(1)).unwrap()).unwrap();
        let serving = slot.take().unwrap();
        assert!(slot.refuse(serving));
        assert_eq!(slot.load().state, state::FREE);

        // Abandoned before the submission bit was ever set: nobody will take
        // it, so housekeeping frees it, once, from the exact word.
        let submitted = slot.submit(slot.try_claim(OwnerTag(1)).unwrap()).unwrap();
        assert_eq!(slot.abandon(submitted), AbandonOutcome::Abandoned);
        let abandoned = slot.load();
        assert!(slot.free_abandoned(abandoned));
        assert!(
            !slot.free_abandoned(abandoned),
            "a stale word moves nothing"
        );
        assert_eq!(slot.load().state, state::FREE);
    }
}
