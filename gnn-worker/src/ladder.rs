//! The degrade ladder (docs/serving.md, "The ladder"): which rung answers a
//! call, from the time left before its deadline and what each rung has been
//! measured to cost.
//!
//! Rungs, richest first: the GNN at the worker's fanouts (with precomputed
//! answers where they stand), the GNN at `degrade_fanouts`, the MLP student
//! on the targets' own rows. A rung's cost is the moving average
//! (EWMA, weight 0.2) of its calls' time from the batcher's dispatch to the
//! answer, plus, for the two GNN rungs, the moving average of the queue wait
//! while calls are waiting. A call takes the richest rung whose estimate
//! fits half its time left (an estimate is a mean; the deadline bounds the
//! tail); when none does, the cheapest rung there is. A rung
//! not measured yet is estimated at no cost but the queue's: the first call
//! that cannot afford a richer rung tries it, and from then on it is
//! measured. A richer rung passed over for [`PROBE_AFTER`] gets the next
//! call that would go below it, once, so that its estimate follows the
//! load back down after an overload (a rung's estimate moves only when it
//! answers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a richer rung may go without answering a call before one is
/// sent to it to measure it again.
pub const PROBE_AFTER: Duration = Duration::from_secs(1);

/// A rung of the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rung {
    /// The GNN at the worker's fanouts.
    Full,
    /// The GNN at `degrade_fanouts`.
    Reduced,
    /// The MLP student on the targets' own rows.
    Student,
}

/// A moving average of durations, in nanoseconds (0: none yet).
#[derive(Debug, Default)]
struct Ewma(AtomicU64);

impl Ewma {
    const WEIGHT: f64 = 0.2;

    fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    fn observe(&self, sample: Duration) {
        let sample = sample.as_nanos().clamp(1, u128::from(u64::MAX)) as u64;
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    sample
                } else {
                    (old as f64 * (1.0 - Self::WEIGHT) + sample as f64 * Self::WEIGHT) as u64
                })
            });
    }
}

/// What each rung costs, as measured.
#[derive(Debug)]
pub struct Costs {
    full: Ewma,
    reduced: Ewma,
    student: Ewma,
    queue_wait: Ewma,
    /// Nanoseconds after `epoch` when each rung (full, reduced, student)
    /// last answered or was probed.
    last_used: [AtomicU64; 3],
    epoch: Instant,
}

impl Default for Costs {
    fn default() -> Self {
        Self {
            full: Ewma::default(),
            reduced: Ewma::default(),
            student: Ewma::default(),
            queue_wait: Ewma::default(),
            last_used: Default::default(),
            epoch: Instant::now(),
        }
    }
}

fn slot(rung: Rung) -> usize {
    match rung {
        Rung::Full => 0,
        Rung::Reduced => 1,
        Rung::Student => 2,
    }
}

impl Costs {
    /// A call on `rung` took `service` from dispatch to answer.
    pub fn observe(&self, rung: Rung, service: Duration) {
        self.touch(rung);
        match rung {
            Rung::Full => self.full.observe(service),
            Rung::Reduced => self.reduced.observe(service),
            Rung::Student => self.student.observe(service),
        }
    }

    fn touch(&self, rung: Rung) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.last_used[slot(rung)].store(now, Ordering::Relaxed);
    }

    /// Whether `rung` has gone [`PROBE_AFTER`] without answering; if so,
    /// claims the probe (one caller gets it).
    fn take_probe(&self, rung: Rung) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = &self.last_used[slot(rung)];
        let seen = last.load(Ordering::Relaxed);
        now.saturating_sub(seen) >= PROBE_AFTER.as_nanos() as u64
            && last
                .compare_exchange(seen, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// A batch waited `wait` in the batcher's queue.
    pub fn observe_queue_wait(&self, wait: Duration) {
        self.queue_wait.observe(wait);
    }

    /// The estimated time of a call on `rung` now, with `waiting` calls in
    /// the batcher's queue.
    pub fn estimate(&self, rung: Rung, waiting: usize) -> Duration {
        let queue = if waiting > 0 {
            self.queue_wait.get().unwrap_or_default()
        } else {
            Duration::ZERO
        };
        match rung {
            Rung::Full => queue + self.full.get().unwrap_or_default(),
            Rung::Reduced => queue + self.reduced.get().unwrap_or_default(),
            Rung::Student => self.student.get().unwrap_or_default(),
        }
    }

    /// The rung for a call with `left` before its deadline, among those
    /// `available` (richest first): the first whose estimate fits half the
    /// time left (an estimate is a mean; the deadline bounds the tail), else
    /// the cheapest.
    pub fn choose(&self, left: Duration, waiting: usize, available: &[Rung]) -> Rung {
        let budget = left / 2;
        let chosen = available
            .iter()
            .copied()
            .find(|&rung| self.estimate(rung, waiting) <= budget)
            .or_else(|| {
                available
                    .iter()
                    .copied()
                    .min_by_key(|&rung| self.estimate(rung, waiting))
            })
            .unwrap_or(Rung::Full);
        // A richer rung not heard from for a while is measured again.
        available
            .iter()
            .copied()
            .take_while(|&rung| rung != chosen)
            .find(|&rung| self.take_probe(rung))
            .unwrap_or(chosen)
    }
}

/// The rungs a worker has below the full GNN, and when its queue sends
/// every call to the student.
#[derive(Debug, Clone, Copy)]
pub struct Rungs {
    /// `degrade_fanouts` is set.
    pub reduced: bool,
    /// An MLP student is loaded.
    pub student: bool,
    /// With a student: calls waiting for the batcher from which a new call
    /// goes to the student whatever its deadline (`degrade_queue_calls`).
    pub degrade_queue_calls: usize,
}

impl Costs {
    /// The rung that answers a call: with a student and `waiting` calls at
    /// `degrade_queue_calls` or more, the student; a call without a
    /// deadline (`left` `None`), the full GNN; otherwise [`Costs::choose`]
    /// among the rungs there are (a new node has no reduced rung: its
    /// edges come with it, whatever the fanouts).
    pub fn rung_for(
        &self,
        rungs: Rungs,
        left: Option<Duration>,
        new_node: bool,
        waiting: usize,
    ) -> Rung {
        if rungs.student && waiting >= rungs.degrade_queue_calls {
            return Rung::Student;
        }
        let Some(left) = left else {
            return Rung::Full;
        };
        let mut available = vec![Rung::Full];
        if rungs.reduced && !new_node {
            available.push(Rung::Reduced);
        }
        if rungs.student {
            available.push(Rung::Student);
        }
        self.choose(left, waiting, &available)
    }
}

/// Parses a gRPC `grpc-timeout` header value: up to 8 digits and a unit
/// (`H`, `M`, `S`, `m`, `u`, `n`).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_richest_rung_that_fits_is_chosen_else_the_cheapest() {
        let costs = Costs::default();
        let all = [Rung::Full, Rung::Reduced, Rung::Student];
        // Nothing measured: the top; then each rung below is tried once.
        assert_eq!(costs.choose(Duration::ZERO, 0, &all), Rung::Full);
        costs.observe(Rung::Full, Duration::from_millis(4));
        assert_eq!(costs.choose(Duration::ZERO, 0, &all), Rung::Reduced);
        costs.observe(Rung::Reduced, Duration::from_millis(2));
        assert_eq!(costs.choose(Duration::ZERO, 0, &all), Rung::Student);
        costs.observe(Rung::Student, Duration::from_millis(1));
        let ms = Duration::from_millis;
        // An estimate must fit half the time left.
        assert_eq!(costs.choose(ms(10), 0, &all), Rung::Full);
        assert_eq!(costs.choose(ms(7), 0, &all), Rung::Reduced);
        assert_eq!(costs.choose(ms(2), 0, &all), Rung::Student);
        assert_eq!(
            costs.choose(Duration::ZERO, 0, &all),
            Rung::Student,
            "the cheapest"
        );
        // A queue makes the GNN rungs dearer, not the student.
        costs.observe_queue_wait(ms(10));
        assert_eq!(costs.choose(ms(10), 0, &all), Rung::Full, "no call waits");
        assert_eq!(costs.choose(ms(10), 3, &all), Rung::Student);
        assert_eq!(costs.estimate(Rung::Full, 3), ms(14));
        // Without a student, the cheapest GNN rung.
        assert_eq!(
            costs.choose(ms(1), 3, &[Rung::Full, Rung::Reduced]),
            Rung::Reduced
        );
        // The moving average follows new samples.
        for _ in 0..50 {
            costs.observe(Rung::Full, ms(1));
        }
        assert!(costs.estimate(Rung::Full, 0) < Duration::from_micros(1100));
    }

    #[test]
    fn a_rung_passed_over_for_a_while_is_probed_once() {
        let costs = Costs::default();
        let all = [Rung::Full, Rung::Student];
        let ms = Duration::from_millis;
        costs.observe(Rung::Full, ms(50));
        costs.observe(Rung::Student, ms(1));
        assert_eq!(costs.choose(ms(10), 0, &all), Rung::Student);
        // Make the full rung's last answer older than PROBE_AFTER.
        costs.last_used[slot(Rung::Full)].store(0, Ordering::Relaxed);
        std::thread::sleep(PROBE_AFTER.saturating_sub(costs.epoch.elapsed()));
        assert_eq!(costs.choose(ms(10), 0, &all), Rung::Full, "the probe");
        assert_eq!(
            costs.choose(ms(10), 0, &all),
            Rung::Student,
            "one probe only"
        );
    }

    #[test]
    fn the_rung_for_a_call_follows_the_queue_the_deadline_and_the_call() {
        let ms = Duration::from_millis;
        let costs = Costs::default();
        costs.observe(Rung::Full, ms(8));
        costs.observe(Rung::Reduced, ms(2));
        costs.observe(Rung::Student, ms(1));
        let all = Rungs {
            reduced: true,
            student: true,
            degrade_queue_calls: 100,
        };
        // No deadline: the full GNN, however dear.
        assert_eq!(costs.rung_for(all, None, false, 0), Rung::Full);
        // A deadline: the richest rung whose estimate fits half of it.
        assert_eq!(costs.rung_for(all, Some(ms(20)), false, 0), Rung::Full);
        assert_eq!(costs.rung_for(all, Some(ms(6)), false, 0), Rung::Reduced);
        // A new node has no reduced rung: the student.
        assert_eq!(costs.rung_for(all, Some(ms(6)), true, 0), Rung::Student);
        // A long queue sends every call to the student, deadline or not.
        assert_eq!(costs.rung_for(all, None, false, 100), Rung::Student);
        assert_eq!(
            costs.rung_for(all, Some(ms(60_000)), false, 150),
            Rung::Student
        );
        // Without a student the queue changes nothing but the estimates.
        let gnn_only = Rungs {
            student: false,
            ..all
        };
        assert_eq!(costs.rung_for(gnn_only, None, false, 150), Rung::Full);
        assert_eq!(
            costs.rung_for(gnn_only, Some(ms(6)), false, 0),
            Rung::Reduced
        );
        // Nothing fits and no reduced rung: the cheapest there is.
        let full_only = Rungs {
            reduced: false,
            student: false,
            degrade_queue_calls: 100,
        };
        assert_eq!(costs.rung_for(full_only, Some(ms(1)), false, 0), Rung::Full);
    }

    #[test]
    fn grpc_timeouts_are_parsed_by_the_spec() {
        assert_eq!(parse_grpc_timeout("5m"), Some(Duration::from_millis(5)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("100u"), Some(Duration::from_micros(100)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("123456789m"), None, "at most 8 digits");
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }
}
