//! The ring slots this worker's batches hold at once.
//!
//! A batch's responses hold their slots until its model run ends, and a
//! large call is many ring requests (one per `max_targets` chunk): two
//! 4,096-target calls are 128 requests on a 64-slot ring. Claimed one by
//! one, each would hold half the ring waiting for the other half, and both
//! would wait until `ring_timeout_ms` (hold and wait). So a batch reserves
//! every slot it needs before its first ring request, all at once and in
//! arrival order, and gives them back when its responses are dropped; a
//! batch that needs more than the ring has goes in groups of calls that
//! each fit (docs/serving.md, "Overload").

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

#[derive(Debug, Default)]
struct State {
    /// Slots reserved now.
    held: usize,
    /// Tickets of the reservations waiting, first come first.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// The slots reserved by this process's batches.
#[derive(Debug, Default)]
pub(crate) struct SlotBudget {
    state: Mutex<State>,
    freed: Condvar,
}

/// Slots reserved for one batch, given back when dropped.
#[derive(Debug)]
pub(crate) struct Reserved {
    budget: Arc<SlotBudget>,
    n: usize,
}

impl SlotBudget {
    /// Reserves `n` of `total` slots, waiting (behind earlier reservations)
    /// until they are free or `deadline` passes (`None`).
    pub(crate) fn reserve(
        self: &Arc<Self>,
        n: usize,
        total: usize,
        deadline: Instant,
    ) -> Option<Reserved> {
        let n = n.min(total);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push_back(ticket);
        loop {
            if state.queue.front() == Some(&ticket) && state.held + n <= total {
                state.queue.pop_front();
                state.held += n;
                // The next in line may fit too.
                self.freed.notify_all();
                return Some(Reserved {
                    budget: self.clone(),
                    n,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                state.queue.retain(|t| *t != ticket);
                self.freed.notify_all();
                return None;
            }
            state = self
                .freed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Whether `n` of `total` slots could be reserved now without
    /// waiting (none free, or others waiting first: no).
    pub(crate) fn has_room(&self, n: usize, total: usize) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.queue.is_empty() && state.held + n.min(total) <= total
    }

    /// Slots reserved now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.state.lock().unwrap().held
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut state = self.budget.state.lock().unwrap_or_else(|p| p.into_inner());
        state.held -= self.n;
        drop(state);
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reservations_wait_in_order_and_time_out() {
        let budget = Arc::new(SlotBudget::default());
        let soon = || Instant::now() + Duration::from_millis(50);
        let a = budget.reserve(40, 64, soon()).expect("fits");
        assert!(budget.reserve(40, 64, soon()).is_none(), "40 + 40 > 64");
        let b = budget.reserve(24, 64, soon()).expect("fits beside a");
        assert_eq!(budget.held(), 64);
        drop(a);
        // More than the ring has is capped to the ring.
        let c = budget.reserve(100, 64, soon());
        assert!(c.is_none(), "b still holds 24");
        drop(b);
        let c = budget.reserve(100, 64, soon()).expect("the whole ring");
        assert_eq!(budget.held(), 64);
        assert!(!budget.has_room(1, 64), "the ring is reserved whole");
        drop(c);
        assert_eq!(budget.held(), 0);
        assert!(budget.has_room(64, 64));
    }

    #[test]
    fn a_waiting_reservation_is_served_when_slots_come_back() {
        let budget = Arc::new(SlotBudget::default());
        let a = budget
            .reserve(64, 64, Instant::now() + Duration::from_secs(1))
            .unwrap();
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || {
                budget
                    .reserve(64, 64, Instant::now() + Duration::from_secs(30))
                    .is_some()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(a);
        assert!(waiter.join().unwrap());
    }
}
