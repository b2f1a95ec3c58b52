//! What a thread learns about its own waits, for [`Spin::Adaptive`]
//! (docs/serving.md, "Spinning"). Two things decide whether a spin pays:
//! - **the answer comes soon**: each thread keeps, per kind of wait, a
//!   running mean of how long its recent waits took (each counted at most
//!   `2 * SPIN_CAP`, so that one idle minute weighs like any long wait), and
//!   spins for twice that mean, at most `SPIN_CAP`, or not at all once the
//!   mean is past the cap;
//! - **a core is otherwise idle**: at most every `SAMPLE_EVERY`, as a wait
//!   begins, the thread reads how many threads the machine is running or
//!   has ready to run (`/proc/loadavg`'s fourth field, itself not counted)
//!   and keeps a running mean; where the others are more than the CPUs
//!   (`sysconf(_SC_NPROCESSORS_ONLN)`) by half a thread on average, a spin
//!   would take a core from one of them, and the thread parks at once.
//!
//! Where `/proc/loadavg` cannot be read the spin is held to
//! [`FALLBACK_SPIN`], the old fixed default.
//!
//! [`Spin::Adaptive`]: super::Spin::Adaptive

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The longest spin the learner grants.
pub const SPIN_CAP: Duration = Duration::from_micros(500);

/// The longest spin where `/proc/loadavg` cannot be read.
pub const FALLBACK_SPIN: Duration = Duration::from_micros(50);

/// How often a thread reads `/proc/loadavg`, at most.
const SAMPLE_EVERY: Duration = Duration::from_micros(500);

/// The kinds of wait a thread learns apart: their answer times differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitSite {
    /// A worker waiting for a free slot (the ring is full).
    Claim = 0,
    /// A worker waiting for its response.
    Response = 1,
    /// A sidecar serve thread waiting for the next request.
    Request = 2,
}

const SITES: usize = 3;

/// A running mean of wait times, nanoseconds (each wait weighs 1/8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Typical {
    ns: u64,
}

impl Typical {
    pub(crate) fn observe(&mut self, waited: Duration) {
        let clamp = 2 * SPIN_CAP.as_nanos() as u64;
        let waited = (waited.as_nanos() as u64).min(clamp);
        self.ns = self.ns - self.ns / 8 + waited / 8;
    }

    /// The spin this mean earns: twice the mean, at most `cap`; none once
    /// the mean is past `cap`.
    pub(crate) fn spin(&self, cap: Duration) -> Duration {
        let typical = Duration::from_nanos(self.ns);
        if typical > cap {
            Duration::ZERO
        } else {
            (typical * 2).min(cap)
        }
    }
}

/// A running mean of the threads running or ready to run besides this
/// one, in 1/256ths (each sample weighs 1/4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Others {
    x256: u32,
}

impl Others {
    pub(crate) fn sample(&mut self, others: u32) {
        let sample = others.min(1 << 16) << 8;
        self.x256 = self.x256 - self.x256 / 4 + sample / 4;
    }

    /// Whether they overfill `cpus`: more than one each, by half a thread
    /// on average, so that a spin would take a core from one of them. (As
    /// many as CPUs still lets a thread spin: the thread answering it and
    /// a peer going back to sleep are the usual two on two cores.)
    pub(crate) fn fill(&self, cpus: u32) -> bool {
        self.x256 > cpus.saturating_mul(256).saturating_add(128)
    }
}

/// The number of threads running or ready to run on the machine:
/// `/proc/loadavg`'s fourth field, `running/total`.
pub(crate) fn parse_loadavg(text: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(text).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

#[derive(Debug)]
struct Learner {
    typical: [Typical; SITES],
    others: Others,
    /// `None` once it could not be opened or read.
    loadavg: Option<File>,
    sampled_at: Option<Instant>,
}

impl Learner {
    fn new() -> Self {
        Self {
            typical: [Typical::default(); SITES],
            others: Others::default(),
            loadavg: File::open("/proc/loadavg").ok(),
            sampled_at: None,
        }
    }

    fn spin(&mut self, site: WaitSite, now: Instant) -> Duration {
        let due = self
            .sampled_at
            .is_none_or(|at| now.duration_since(at) >= SAMPLE_EVERY);
        if due {
            if let Some(file) = &self.loadavg {
                let mut buf = [0u8; 128];
                let read = file.read_at(&mut buf, 0).ok();
                match read.and_then(|n| parse_loadavg(&buf[..n])) {
                    // This thread is running: not one of the others.
                    Some(running) => self.others.sample(running.saturating_sub(1)),
                    None => self.loadavg = None,
                }
                self.sampled_at = Some(now);
            }
        }
        let typical = self.typical[site as usize];
        match &self.loadavg {
            None => typical.spin(SPIN_CAP).min(FALLBACK_SPIN),
            Some(_) if self.others.fill(online_cpus()) => Duration::ZERO,
            Some(_) => typical.spin(SPIN_CAP),
        }
    }
}

thread_local! {
    static LEARNER: RefCell<Option<Learner>> = const { RefCell::new(None) };
}

/// How long this thread should spin now for a wait at `site`.
pub(crate) fn spin_for(site: WaitSite, now: Instant) -> Duration {
    LEARNER
        .try_with(|cell| {
            let mut cell = cell.borrow_mut();
            cell.get_or_insert_with(Learner::new).spin(site, now)
        })
        .unwrap_or(Duration::ZERO)
}

/// Records how long a wait at `site` took, from its first failed check.
pub(crate) fn waited(site: WaitSite, took: Duration) {
    let _ = LEARNER.try_with(|cell| {
        cell.borrow_mut().get_or_insert_with(Learner::new).typical[site as usize].observe(took)
    });
}

/// The machine's online CPUs, which `/proc/loadavg` counts threads across.
fn online_cpus() -> u32 {
    static CPUS: OnceLock<u32> = OnceLock::new();
    *CPUS.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
            .ok()
            .flatten()
            .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX).max(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(waits: &[u64]) -> Typical {
        let mut typical = Typical::default();
        for &us in waits {
            typical.observe(Duration::from_micros(us));
        }
        typical
    }

    #[test]
    fn quick_answers_earn_a_spin_of_twice_their_mean() {
        let spin = after(&[100; 64]).spin(SPIN_CAP);
        // The mean converges on 100 us from below (integer 1/8 steps).
        assert!(
            spin > Duration::from_micros(190) && spin <= Duration::from_micros(200),
            "{spin:?}"
        );
    }

    #[test]
    fn long_or_idle_waits_earn_no_spin_and_count_at_most_twice_the_cap() {
        let idle = after(&[60_000_000; 64]);
        assert_eq!(idle.spin(SPIN_CAP), Duration::ZERO);
        assert!(idle.ns <= 2 * SPIN_CAP.as_nanos() as u64);
        // Quick answers after an idle spell earn the spin back within a few
        // waits, not after a minute's worth.
        let mut back = idle;
        let mut waits = 0;
        while back.spin(SPIN_CAP).is_zero() {
            back.observe(Duration::from_micros(100));
            waits += 1;
        }
        assert!(waits <= 8, "{waits} waits to spin again");
    }

    #[test]
    fn a_mean_between_half_the_cap_and_the_cap_spins_the_cap() {
        assert_eq!(after(&[400; 64]).spin(SPIN_CAP), SPIN_CAP);
    }

    #[test]
    fn each_thread_and_each_site_learns_apart() {
        let typical = |site: WaitSite| {
            LEARNER.with(|cell| cell.borrow().as_ref().unwrap().typical[site as usize])
        };
        std::thread::spawn(move || {
            for _ in 0..64 {
                waited(WaitSite::Response, Duration::from_micros(100));
            }
            assert!(typical(WaitSite::Response).spin(SPIN_CAP) > Duration::from_micros(150));
            assert_eq!(typical(WaitSite::Request).spin(SPIN_CAP), Duration::ZERO);
            std::thread::spawn(move || {
                waited(WaitSite::Request, Duration::ZERO);
                assert_eq!(typical(WaitSite::Response), Typical::default());
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn other_threads_filling_the_cpus_are_learned_from_a_few_samples() {
        let mut others = Others::default();
        assert!(!others.fill(2));
        for _ in 0..8 {
            others.sample(4);
        }
        assert!(others.fill(2));
        assert!(!others.fill(4));
        for _ in 0..8 {
            others.sample(2);
        }
        assert!(!others.fill(2));
    }

    #[test]
    fn loadavg_lines_parse_and_odd_ones_do_not() {
        assert_eq!(parse_loadavg(b"0.52 0.40 0.33 3/412 98765\n"), Some(3));
        assert_eq!(parse_loadavg(b"0.52 0.40 0.33"), None);
        assert_eq!(parse_loadavg(b"a b c d/e f"), None);
        let mut buf = [0u8; 128];
        let n = File::open("/proc/loadavg")
            .unwrap()
            .read_at(&mut buf, 0)
            .unwrap();
        // This thread is running: at least one.
        assert!(parse_loadavg(&buf[..n]).unwrap() >= 1);
    }

    #[test]
    fn a_thread_parks_at_once_while_others_fill_the_cpus() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        std::thread::spawn(|| {
            for _ in 0..64 {
                waited(WaitSite::Response, Duration::from_micros(100));
            }
            // Twice as many runnable threads as CPUs besides this one.
            let stop = Arc::new(AtomicBool::new(false));
            let hogs: Vec<_> = (0..2 * online_cpus())
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                    })
                })
                .collect();
            let started = Instant::now();
            let mut parked_at_once = false;
            while started.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
                if spin_for(WaitSite::Response, Instant::now()).is_zero() {
                    parked_at_once = true;
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            for hog in hogs {
                hog.join().unwrap();
            }
            assert!(parked_at_once, "a thread among busy CPUs still spins");
        })
        .join()
        .unwrap();
    }
}
