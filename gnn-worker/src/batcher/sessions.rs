//! The model's ONNX Runtime sessions, shared by the model executors and
//! the run-to-completion path: whoever runs a batch takes an idle session
//! and gives it back. The most recently used one is taken first (a stack):
//! its weights are the likeliest still in the CPU's caches, so a lone call
//! does not alternate between sessions whose weights went cold meanwhile
//! (bench/src/bin/onnx-in-place.rs measures the difference).
//!
//! A session whose run panicked is retired (its state may be
//! inconsistent); once none is left, taking one fails at once instead of
//! waiting for ever, and the worker is not ready.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::metrics::WorkerMetrics;
use crate::model::Model;

/// A session, counted among the live ones (the worker's
/// `gnn_worker_executors_alive` and its predictor's) while it exists.
pub(super) struct Session {
    pub(super) model: Model,
    _alive: Alive,
}

/// Decrements the live-session counts (the worker's, the predictor's) when
/// its session is dropped, however that happens.
struct Alive(Arc<WorkerMetrics>, Arc<AtomicUsize>);

impl Alive {
    fn new(metrics: &Arc<WorkerMetrics>, mine: &Arc<AtomicUsize>) -> Self {
        metrics.executors_alive.fetch_add(1, Ordering::AcqRel);
        mine.fetch_add(1, Ordering::AcqRel);
        Self(metrics.clone(), mine.clone())
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.executors_alive.fetch_sub(1, Ordering::AcqRel);
        self.1.fetch_sub(1, Ordering::AcqRel);
    }
}

struct State {
    /// Idle sessions, the most recently used last.
    idle: Vec<Session>,
    /// Sessions not retired (idle or in a run).
    live: usize,
    /// Threads waiting in [`Sessions::take`] (a session given back wakes
    /// one only when some wait: no system call otherwise).
    waiting: usize,
}

/// The pool of one predictor's sessions.
pub(super) struct Sessions {
    state: Mutex<State>,
    given_back: Condvar,
}

impl Sessions {
    /// A pool of `models`, counted in `metrics` and `alive`.
    pub(super) fn new(
        models: Vec<Model>,
        metrics: &Arc<WorkerMetrics>,
        alive: &Arc<AtomicUsize>,
    ) -> Self {
        let idle: Vec<Session> = models
            .into_iter()
            .map(|model| Session {
                model,
                _alive: Alive::new(metrics, alive),
            })
            .collect();
        Self {
            state: Mutex::new(State {
                live: idle.len(),
                idle,
                waiting: 0,
            }),
            given_back: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic never happens while the lock is held (only pushes and
        // pops under it): a poisoned lock's state is whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle session, waiting for one while all are
    /// in runs; `None` once every session has been retired.
    pub(super) fn take(&self) -> Option<Session> {
        let mut state = self.lock();
        loop {
            if let Some(session) = state.idle.pop() {
                return Some(session);
            }
            if state.live == 0 {
                return None;
            }
            state.waiting += 1;
            state = self
                .given_back
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
            state.waiting -= 1;
        }
    }

    /// The most recently used idle session, if one is idle now.
    pub(super) fn try_take(&self) -> Option<Session> {
        self.lock().idle.pop()
    }

    /// Gives a session back after a run.
    pub(super) fn put(&self, session: Session) {
        let mut state = self.lock();
        state.idle.push(session);
        if state.waiting > 0 {
            self.given_back.notify_one();
        }
    }

    /// Drops a session whose run panicked.
    pub(super) fn retire(&self, session: Session) {
        drop(session);
        self.lock().live -= 1;
        // Waiters must see that none may be left.
        self.given_back.notify_all();
    }
}

#[cfg(test)]
mod tests {
    //! The pool's rules without ONNX Runtime: a pool of no sessions and
    //! the retire-wakes-waiters rule are what can be checked without a
    //! model; taking and giving back real sessions is covered by the
    //! worker's tests (tests/tests/worker.rs) and the fault tests.
    use super::*;

    #[derive(Debug)]
    struct AlwaysReady;

    impl crate::metrics::Health for AlwaysReady {
        fn ready(&self) -> bool {
            true
        }
    }

    #[test]
    fn an_empty_pool_refuses_at_once_rather_than_waiting() {
        let health = Arc::new(AlwaysReady);
        let weak = Arc::downgrade(&health) as std::sync::Weak<dyn crate::metrics::Health>;
        let metrics = Arc::new(WorkerMetrics::new(weak));
        let alive = Arc::new(AtomicUsize::new(0));
        let pool = Sessions::new(Vec::new(), &metrics, &alive);
        assert!(pool.try_take().is_none());
        assert!(pool.take().is_none());
        assert_eq!(alive.load(Ordering::Acquire), 0);
    }
}
