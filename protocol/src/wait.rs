//! Spin, then park on a futex word, until a condition holds or a deadline
//! passes.
//!
//! The waiter announces itself in a `waiters` counter before it reads the
//! futex word and re-checks its condition; the notifier bumps the word and
//! makes the wake system call only if someone announced itself.
//!
//! Both reads of this handshake (the waiter's read of the word, the
//! notifier's read of `waiters`) are read-modify-writes (`fetch_add(0)`): an
//! RMW always reads the latest value in the variable's modification order,
//! so the two RMW pairs order each other and the handshake holds under
//! acquire/release alone, not only under `SeqCst` loads (which loom, the
//! model checker, does not model). Either the notifier sees the waiter and
//! wakes it, or the waiter reads the bumped word and sees the new state: no
//! lost wake-up. A wake-up is only a hint; the condition is always re-checked.
//!
//! How long a waiter spins before it parks is [`Spin`]: learned by each
//! thread from its own recent waits and how busy the machine's CPUs are
//! (the default, [`learn`]), or fixed.

mod learn;

use std::time::{Duration, Instant};

use crate::futex;
use crate::sync::{spin_hint, AtomicU32, Ordering};

pub use learn::{WaitSite, FALLBACK_SPIN, SPIN_CAP};

/// How long a waiter busy-waits before it parks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Spin {
    /// Spin while it pays: about twice this thread's recent wait at the
    /// same site, at most [`SPIN_CAP`]; not at all while the other
    /// threads running or ready to run fill the machine's CPUs, or where the
    /// caller says the wait is crowded (docs/serving.md, "Spinning").
    #[default]
    Adaptive,
    /// Spin this long, every wait. Zero parks at once (lowest CPU use).
    Fixed(Duration),
}

impl From<Option<Duration>> for Spin {
    /// A fixed spin, or adaptive where none is given.
    fn from(fixed: Option<Duration>) -> Self {
        fixed.map_or(Spin::Adaptive, Spin::Fixed)
    }
}

/// How to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Time to spin re-checking the condition before the first park.
    pub spin: Spin,
    /// Longest single park; the waiter wakes at least this often to check
    /// liveness and deadlines.
    pub max_park: Duration,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        Self {
            spin: Spin::Adaptive,
            max_park: Duration::from_millis(50),
        }
    }
}

/// Bumps `word` and wakes whoever is parked on it.
// SYNC POINT: the word bump pairs with the waiter's RMW read of the word in
// `wait_for`; the RMW read of `waiters` pairs with its `waiters` increment.
pub fn notify(word: &AtomicU32, waiters: &AtomicU32) {
    word.fetch_add(1, Ordering::SeqCst);
    if waiters.fetch_add(0, Ordering::SeqCst) != 0 {
        futex::wake(word, u32::MAX);
    }
}

/// Calls `check` until it returns `Some`, spinning first and then parking on
/// `word`; gives up (returns `None`) once `deadline` has passed. `site` says
/// which kind of wait this is and `crowded` whether the caller knows that
/// its peers' work wants the cores (a full ring, a sidecar thread serving),
/// for [`Spin::Adaptive`], which learns from every wait and spins in none
/// that is crowded.
pub fn wait_for<T>(
    word: &AtomicU32,
    waiters: &AtomicU32,
    policy: WaitPolicy,
    site: WaitSite,
    crowded: bool,
    deadline: Option<Instant>,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    if let Some(done) = check() {
        return Some(done);
    }
    let started = Instant::now();
    match policy.spin {
        Spin::Fixed(spin) => spin_then_park(word, waiters, policy, spin, started, deadline, check),
        Spin::Adaptive => {
            let spin = if crowded {
                Duration::ZERO
            } else {
                learn::spin_for(site, started)
            };
            let result = spin_then_park(word, waiters, policy, spin, started, deadline, check);
            learn::waited(site, started.elapsed());
            result
        }
    }
}

fn spin_then_park<T>(
    word: &AtomicU32,
    waiters: &AtomicU32,
    policy: WaitPolicy,
    spin: Duration,
    started: Instant,
    deadline: Option<Instant>,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    // A spin ends by the deadline: past it the waiter must give up at once.
    let spin = deadline.map_or(spin, |deadline| {
        spin.min(deadline.saturating_duration_since(started))
    });
    let mut spins: u32 = 0;
    while !spin.is_zero() {
        spin_hint();
        if let Some(done) = check() {
            return Some(done);
        }
        spins = spins.wrapping_add(1);
        // Reading the clock costs ~20 ns; do it every 64 spins.
        if spins.is_multiple_of(64) && started.elapsed() >= spin {
            break;
        }
    }
    waiters.fetch_add(1, Ordering::SeqCst);
    let result = loop {
        // SYNC POINT: an RMW read, see the module doc.
        let seen = word.fetch_add(0, Ordering::SeqCst);
        if let Some(done) = check() {
            break Some(done);
        }
        let mut park = policy.max_park;
        if let Some(deadline) = deadline {
            let now = Instant::now();
            if now >= deadline {
                break None;
            }
            park = park.min(deadline - now);
        }
        futex::wait(word, seen, park);
    };
    waiters.fetch_sub(1, Ordering::SeqCst);
    result
}
