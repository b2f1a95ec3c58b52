//! Readiness as latches, in the manner of linkerd2-proxy: every subsystem
//! that must be up before the daemon takes work holds a [`Latch`], created
//! held with the reason it gives meanwhile, and releases it when it is up.
//! The daemon is ready when every latch is released. A latch may be held
//! again (a drain begins, an update stream was trimmed past this replica):
//! readiness is then false with that subsystem's reason.
//!
//! The reason reported is the first held latch's, in the order the latches
//! were made: make them in the order a reader should be told why.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The daemon's latches.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    latches: Arc<Mutex<Vec<Arc<LatchState>>>>,
}

#[derive(Debug)]
struct LatchState {
    name: &'static str,
    held: AtomicBool,
    reason: Mutex<String>,
}

/// One subsystem's say in readiness. Dropping it does not release it.
#[derive(Debug, Clone)]
pub struct Latch {
    state: Arc<LatchState>,
}

impl Readiness {
    /// A new latch named `name` (the subsystem), held with `reason`.
    pub fn latch(&self, name: &'static str, reason: impl Into<String>) -> Latch {
        let state = Arc::new(LatchState {
            name,
            held: AtomicBool::new(true),
            reason: Mutex::new(reason.into()),
        });
        self.latches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(state.clone());
        Latch { state }
    }

    /// `Ok` when every latch is released; otherwise the first held latch's
    /// reason.
    pub fn check(&self) -> Result<(), String> {
        match self.held().into_iter().next() {
            None => Ok(()),
            Some((_, reason)) => Err(reason),
        }
    }

    /// Every held latch: its name and reason, in the order they were made.
    pub fn held(&self) -> Vec<(&'static str, String)> {
        self.latches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|l| l.held.load(Ordering::Acquire))
            .map(|l| (l.name, l.reason()))
            .collect()
    }
}

impl LatchState {
    fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Latch {
    /// The subsystem is up.
    pub fn release(&self) {
        self.state.held.store(false, Ordering::Release);
    }

    /// The subsystem is not up (again), for `reason`.
    pub fn hold(&self, reason: impl Into<String>) {
        *self
            .state
            .reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = reason.into();
        self.state.held.store(true, Ordering::Release);
    }

    pub fn is_released(&self) -> bool {
        !self.state.held.load(Ordering::Acquire)
    }

    pub fn name(&self) -> &'static str {
        self.state.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_latch_is_released_and_the_first_held_one_says_why() {
        let readiness = Readiness::default();
        let drain = readiness.latch("lifecycle", "starting");
        let graph = readiness.latch("graph", "loading");
        let ring = readiness.latch("ring", "no ring yet");
        assert_eq!(readiness.check(), Err("starting".into()));
        drain.release();
        assert_eq!(readiness.check(), Err("loading".into()));
        graph.release();
        assert_eq!(readiness.held(), [("ring", "no ring yet".to_string())]);
        ring.release();
        assert_eq!(readiness.check(), Ok(()));
        // Held again: not ready, for the reason given now.
        ring.clone().hold("the stream was trimmed");
        assert!(!ring.is_released());
        assert_eq!(readiness.check(), Err("the stream was trimmed".into()));
        drain.hold("draining");
        assert_eq!(readiness.check(), Err("draining".into()));
        drop(drain);
        assert_eq!(readiness.held().len(), 2, "a dropped latch stays held");
    }
}
