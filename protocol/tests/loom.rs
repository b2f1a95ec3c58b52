//! Loom model tests: every interleaving (within a preemption bound) of
//! clients and the sidecar on the real slot state machine and the real
//! submission queue, built on loom's atomics.
//!
//! The request and response "areas" are loom `UnsafeCell`s: loom fails the
//! test if any access to them is not ordered by the state transitions, which
//! checks the SYNC POINTs of `slot` and `submit` (a request written before
//! submit is visible to the server after take; a response written before
//! publish is visible to the client after it sees PUBLISHED).
//!
//! Run with: `RUSTFLAGS="--cfg loom" cargo test -p protocol --test loom --release`
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64};
use loom::sync::Arc;
use loom::thread;
use protocol::layout::SlotControl;
use protocol::loom_hooks::{notify, wait_for};
use protocol::slot::{state, OwnerTag};
use protocol::submit::SubmitQueue;
use protocol::{Spin, WaitPolicy, WaitSite};

const PARK: WaitPolicy = WaitPolicy {
    spin: Spin::Fixed(std::time::Duration::ZERO),
    max_park: std::time::Duration::from_millis(1),
};

struct Ring {
    slots: Vec<SlotControl>,
    requests: Vec<UnsafeCell<u64>>,
    responses: Vec<UnsafeCell<u64>>,
    bits: [AtomicU64; 1],
    doorbell: AtomicU32,
    parked: AtomicU32,
    free_seq: AtomicU32,
    free_waiters: AtomicU32,
}

// SAFETY: the cells are only accessed by whoever holds the slot in the state
// that grants access; loom itself checks that claim.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(n: usize) -> Self {
        Self {
            slots: (0..n).map(|_| SlotControl::new()).collect(),
            requests: (0..n).map(|_| UnsafeCell::new(0)).collect(),
            responses: (0..n).map(|_| UnsafeCell::new(0)).collect(),
            bits: [AtomicU64::new(0)],
            doorbell: AtomicU32::new(0),
            parked: AtomicU32::new(0),
            free_seq: AtomicU32::new(0),
            free_waiters: AtomicU32::new(0),
        }
    }

    fn queue(&self) -> SubmitQueue<'_> {
        SubmitQueue {
            bits: &self.bits,
            doorbell: &self.doorbell,
            server_parked: &self.parked,
        }
    }

    /// A client's whole call: claim any slot, write, submit, wait, read, release.
    fn call(&self, client: u16, value: u64) -> u64 {
        let (idx, claimed) = wait_for(
            &self.free_seq,
            &self.free_waiters,
            PARK,
            WaitSite::Claim,
            false,
            None,
            || {
                (0..self.slots.len()).find_map(|i| {
                    self.slots[i]
                        .try_claim(OwnerTag(client.into()))
                        .map(|w| (i, w))
                })
            },
        )
        .expect("no deadline");
        // SAFETY: CLAIMED by this client: nobody else touches the request.
        self.requests[idx].with_mut(|p| unsafe { *p = value });
        let submitted = self.slots[idx]
            .submit(claimed)
            .expect("only the owner moves CLAIMED");
        self.queue().push(idx);
        let slot = &self.slots[idx];
        let published = wait_for(
            &slot.wake,
            &slot.waiters,
            PARK,
            WaitSite::Response,
            false,
            None,
            || {
                let word = slot.load();
                (word.state == state::PUBLISHED).then_some(word)
            },
        )
        .expect("no deadline");
        assert_eq!(published.generation, submitted.generation);
        // SAFETY: PUBLISHED and owned by this client until release.
        let answer = self.responses[idx].with(|p| unsafe { *p });
        assert!(slot.release(published));
        notify(&self.free_seq, &self.free_waiters);
        answer
    }

    /// The sidecar: serve `n` requests, answering `request + 100`.
    fn serve(&self, n: usize) {
        let mut served = 0;
        let mut pending = Vec::new();
        while served < n {
            pending.clear();
            self.queue().drain_into(&mut pending);
            for &idx in &pending {
                let idx = idx as usize;
                let Some(serving) = self.slots[idx].take() else {
                    continue;
                };
                // SAFETY: SERVING: the sidecar alone touches both areas.
                let request = self.requests[idx].with(|p| unsafe { *p });
                // SAFETY: as above.
                self.responses[idx].with_mut(|p| unsafe { *p = request + 100 });
                self.slots[idx]
                    .publish(serving)
                    .expect("nobody abandons here");
                notify(&self.slots[idx].wake, &self.slots[idx].waiters);
                served += 1;
            }
            if served < n {
                wait_for(
                    &self.doorbell,
                    &self.parked,
                    PARK,
                    WaitSite::Request,
                    false,
                    None,
                    || self.queue().any_pending().then_some(()),
                );
            }
        }
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(2, f);
}

fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
}

#[test]
fn one_client_one_slot_request_and_response_are_synchronised() {
    model(|| {
        let ring = Arc::new(Ring::new(1));
        let server = {
            let ring = ring.clone();
            thread::spawn(move || ring.serve(1))
        };
        assert_eq!(ring.call(0, 7), 107);
        server.join().unwrap();
        assert_eq!(ring.slots[0].load().state, state::FREE);
    });
}

#[test]
fn two_clients_share_one_slot_and_each_gets_its_own_answer() {
    model(|| {
        let ring = Arc::new(Ring::new(1));
        let server = {
            let ring = ring.clone();
            thread::spawn(move || ring.serve(2))
        };
        let other = {
            let ring = ring.clone();
            thread::spawn(move || ring.call(1, 20))
        };
        assert_eq!(ring.call(0, 10), 110);
        assert_eq!(other.join().unwrap(), 120);
        server.join().unwrap();
        // Two claims, two generations.
        assert_eq!(ring.slots[0].load().generation, 2);
    });
}

#[test]
fn two_clients_two_slots_no_submission_is_lost_or_served_twice() {
    model(|| {
        let ring = Arc::new(Ring::new(2));
        let server = {
            let ring = ring.clone();
            thread::spawn(move || ring.serve(2))
        };
        let other = {
            let ring = ring.clone();
            thread::spawn(move || ring.call(1, 2))
        };
        assert_eq!(ring.call(0, 1), 101);
        assert_eq!(other.join().unwrap(), 102);
        server.join().unwrap();
        assert_eq!(ring.bits[0].load(std::sync::atomic::Ordering::SeqCst), 0);
    });
}

#[test]
fn abandon_races_publish_and_the_slot_always_comes_back() {
    model(|| {
        let slot = Arc::new(SlotControl::new());
        let submitted = slot.submit(slot.try_claim(OwnerTag(0)).unwrap()).unwrap();
        let server = {
            let slot = slot.clone();
            thread::spawn(move || {
                if let Some(serving) = slot.take() {
                    let _ = slot.publish(serving);
                }
            })
        };
        let outcome = slot.abandon(submitted);
        server.join().unwrap();
        let word = slot.load();
        // Whatever the order, nothing is stuck: either the slot is free, or
        // it is ABANDONED only if the server never took it (take frees it).
        match word.state {
            state::FREE => {}
            state::ABANDONED => {
                assert_eq!(outcome, protocol::slot::AbandonOutcome::Abandoned);
                assert!(slot.take().is_none());
                assert_eq!(slot.load().state, state::FREE);
            }
            other => panic!("slot stuck in {}", state::name(other)),
        }
    });
}

/// Housekeeping frees an ABANDONED slot only when no serve thread holds it
/// (the per-slot serving count, raised before the take): whatever the
/// interleaving of the owner abandoning, a serve thread taking and answering,
/// housekeeping freeing, and a new client claiming, the serve thread never
/// touches the data region while the new client owns it (loom would report
/// the unsynchronised cell accesses), and the slot never sticks.
#[test]
fn housekeeping_never_frees_a_slot_under_a_serve_thread() {
    model_bounded(3, || {
        let ring = Arc::new(Ring::new(1));
        let serving = Arc::new(AtomicU32::new(0));
        let submitted = {
            let slot = &ring.slots[0];
            slot.submit(slot.try_claim(OwnerTag(0)).unwrap()).unwrap()
        };
        let server = {
            let (ring, serving) = (ring.clone(), serving.clone());
            thread::spawn(move || {
                serving.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if let Some(word) = ring.slots[0].take() {
                    // SAFETY: SERVING: the sidecar alone touches the areas.
                    let request = ring.requests[0].with(|p| unsafe { *p });
                    // SAFETY: as above.
                    ring.responses[0].with_mut(|p| unsafe { *p = request + 1 });
                    let _ = ring.slots[0].publish(word);
                }
                serving.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            })
        };
        let housekeeper = {
            let (ring, serving) = (ring.clone(), serving.clone());
            thread::spawn(move || {
                let word = ring.slots[0].load();
                if word.state == state::ABANDONED
                    && serving.load(std::sync::atomic::Ordering::SeqCst) == 0
                {
                    ring.slots[0].free_abandoned(word);
                }
            })
        };
        let newcomer = {
            let ring = ring.clone();
            thread::spawn(move || {
                if let Some(claimed) = ring.slots[0].try_claim(OwnerTag(1)) {
                    // SAFETY: CLAIMED by this client: it alone touches the
                    // request area.
                    ring.requests[0].with_mut(|p| unsafe { *p = 9 });
                    // SAFETY: as above (a client may reuse the whole region).
                    ring.responses[0].with_mut(|p| unsafe { *p = 0 });
                    assert!(ring.slots[0].cancel(claimed));
                }
            })
        };
        let _ = ring.slots[0].abandon(submitted);
        server.join().unwrap();
        housekeeper.join().unwrap();
        newcomer.join().unwrap();
        // Nothing sticks: at most an ABANDONED slot that a later take frees.
        let word = ring.slots[0].load();
        match word.state {
            state::FREE => {}
            state::ABANDONED => {
                assert!(ring.slots[0].take().is_none());
                assert_eq!(ring.slots[0].load().state, state::FREE);
            }
            state::PUBLISHED => {
                // The answer arrived before the abandon: the owner releases it.
                assert!(ring.slots[0].release(word));
            }
            other => panic!("slot stuck in {}", state::name(other)),
        }
    });
}
