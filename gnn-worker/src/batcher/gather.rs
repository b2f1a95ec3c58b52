//! The batching rule (docs/serving.md, "Batching"): a call is dispatched
//! at once when the pipeline has room; calls that arrived together go
//! together; calls gather into one batch only while the pipeline is full,
//! until it frees up, `max_batch` targets wait, or `max_delay` has passed
//! (an upper bound, not a fixed wait).

use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::metrics::WorkerMetrics;

/// How many batches the pipeline can take now: dispatching claims one (the
/// count may go below zero when `max_delay` forces a batch into the queue),
/// a stage that finishes a batch gives it back and says so.
#[derive(Debug, Default)]
pub(super) struct Capacity {
    free: AtomicIsize,
    freed: tokio::sync::Notify,
}

impl Capacity {
    /// Room for `n` batches at once.
    pub(super) fn new(n: usize) -> Self {
        let capacity = Self::default();
        capacity.free.store(n as isize, Ordering::Release);
        capacity
    }

    pub(super) fn has_free(&self) -> bool {
        self.free.load(Ordering::Acquire) > 0
    }

    fn claim(&self) {
        self.free.fetch_sub(1, Ordering::AcqRel);
    }

    /// Claims room for one batch if there is some now (the
    /// run-to-completion path, which never pushes the count below zero).
    pub(super) fn try_claim(&self) -> bool {
        self.free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                (free > 0).then(|| free - 1)
            })
            .is_ok()
    }

    /// A batch left the pipeline.
    pub(super) fn release(&self) {
        self.free.fetch_add(1, Ordering::AcqRel);
        self.freed.notify_one();
    }
}

/// What the batching rule needs of a call: how many targets it brings.
pub(super) trait Targets {
    fn n_targets(&self) -> usize;
}

/// The rule's two settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rule {
    /// Targets gathered into one batch before it is sent without waiting.
    pub(super) max_batch: usize,
    /// The longest a gathering batch waits for the pipeline.
    pub(super) max_delay: Duration,
}

/// Moves every call already queued into `batch`, up to `max_batch`
/// targets.
fn take_queued<J: Targets>(
    calls: &mut mpsc::Receiver<J>,
    batch: &mut Vec<J>,
    n: &mut usize,
    max_batch: usize,
) {
    while *n < max_batch {
        match calls.try_recv() {
            Ok(call) => {
                *n += call.n_targets();
                batch.push(call);
            }
            Err(_) => return,
        }
    }
}

/// Forms batches from `calls` by the rule and sends them to `batches`,
/// claiming `capacity` for each, until either channel closes.
pub(super) async fn gather<J: Targets>(
    mut calls: mpsc::Receiver<J>,
    batches: crossbeam_channel::Sender<Vec<J>>,
    rule: Rule,
    metrics: Arc<WorkerMetrics>,
    capacity: Arc<Capacity>,
) {
    while let Some(first) = calls.recv().await {
        let mut n = first.n_targets();
        let mut batch = vec![first];
        // Calls that arrived together go together, whatever the pipeline does.
        take_queued(&mut calls, &mut batch, &mut n, rule.max_batch);
        if !capacity.has_free() && n < rule.max_batch {
            // The pipeline is full: gather until it frees up, the batch is
            // full, or max_delay has passed.
            metrics.batches_waited.inc();
            let until = tokio::time::sleep(rule.max_delay);
            tokio::pin!(until);
            loop {
                let freed = capacity.freed.notified();
                tokio::pin!(freed);
                // Registered before the check, so a release in between is
                // not missed.
                freed.as_mut().enable();
                if capacity.has_free() || n >= rule.max_batch {
                    break;
                }
                tokio::select! {
                    biased;
                    () = &mut freed => {}
                    call = calls.recv() => match call {
                        Some(call) => {
                            n += call.n_targets();
                            batch.push(call);
                            take_queued(&mut calls, &mut batch, &mut n, rule.max_batch);
                        }
                        None => break,
                    },
                    () = &mut until => {
                        metrics.batches_delayed.inc();
                        break;
                    }
                }
            }
        }
        capacity.claim();
        metrics.batch_formed(n, batch.len());
        if batches.send(batch).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    //! The rule on its own: calls are plain target counts, the pipeline a
    //! [`Capacity`] the test claims and releases.
    use super::*;

    impl Targets for usize {
        fn n_targets(&self) -> usize {
            *self
        }
    }

    #[derive(Debug)]
    struct AlwaysReady;

    impl crate::metrics::Health for AlwaysReady {
        fn ready(&self) -> bool {
            true
        }
    }

    struct Harness {
        calls: mpsc::Sender<usize>,
        batches: crossbeam_channel::Receiver<Vec<usize>>,
        capacity: Arc<Capacity>,
        metrics: Arc<WorkerMetrics>,
        runtime: tokio::runtime::Runtime,
    }

    impl Harness {
        fn new(free: usize, max_batch: usize, max_delay: Duration) -> Self {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let health = Arc::new(AlwaysReady);
            let weak = Arc::downgrade(&health) as std::sync::Weak<dyn crate::metrics::Health>;
            let metrics = Arc::new(WorkerMetrics::new(weak));
            let capacity = Arc::new(Capacity::new(free));
            let (calls, calls_rx) = mpsc::channel(1024);
            let (batches_tx, batches) = crossbeam_channel::unbounded();
            let rule = Rule {
                max_batch,
                max_delay,
            };
            runtime.spawn(gather(
                calls_rx,
                batches_tx,
                rule,
                metrics.clone(),
                capacity.clone(),
            ));
            Self {
                calls,
                batches,
                capacity,
                metrics,
                runtime,
            }
        }

        fn send(&self, calls: &[usize]) {
            for &n in calls {
                self.calls.try_send(n).unwrap();
            }
        }

        /// Runs the gathering task until it has sent a batch (or `limit`).
        fn next_batch(&self, limit: Duration) -> Option<Vec<usize>> {
            let batches = self.batches.clone();
            self.runtime.block_on(async move {
                let deadline = tokio::time::Instant::now() + limit;
                loop {
                    if let Ok(batch) = batches.try_recv() {
                        return Some(batch);
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        }
    }

    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn a_call_that_finds_room_is_dispatched_alone_at_once() {
        let h = Harness::new(1, 64, LONG);
        h.send(&[3]);
        assert_eq!(h.next_batch(Duration::from_secs(10)), Some(vec![3]));
        assert!(!h.capacity.has_free(), "the batch claimed the pipeline");
        assert_eq!(h.metrics.batches_waited.get(), 0, "it never waited");
    }

    #[test]
    fn calls_that_arrived_together_go_together_up_to_max_batch() {
        let h = Harness::new(4, 5, LONG);
        // Queued before the task runs: they arrived together.
        h.send(&[2, 2, 2, 1]);
        assert_eq!(h.next_batch(Duration::from_secs(10)), Some(vec![2, 2, 2]));
        assert_eq!(h.next_batch(Duration::from_secs(10)), Some(vec![1]));
    }

    #[test]
    fn while_the_pipeline_is_full_calls_gather_until_max_batch() {
        let h = Harness::new(0, 4, LONG);
        h.send(&[1]);
        assert_eq!(
            h.next_batch(Duration::from_millis(100)),
            None,
            "no room, no batch"
        );
        h.send(&[1, 1]);
        assert_eq!(
            h.next_batch(Duration::from_millis(100)),
            None,
            "3 of 4 targets"
        );
        h.send(&[1]);
        assert_eq!(
            h.next_batch(Duration::from_secs(10)),
            Some(vec![1, 1, 1, 1]),
            "a full batch goes without waiting for room"
        );
        assert_eq!(h.metrics.batches_waited.get(), 1);
        assert_eq!(h.metrics.batches_delayed.get(), 0);
    }

    #[test]
    fn a_gathering_batch_goes_when_the_pipeline_frees_up() {
        let h = Harness::new(0, 64, LONG);
        h.send(&[1, 1]);
        assert_eq!(h.next_batch(Duration::from_millis(100)), None);
        h.capacity.release();
        assert_eq!(h.next_batch(Duration::from_secs(10)), Some(vec![1, 1]));
        assert!(!h.capacity.has_free(), "the released place was claimed");
    }

    #[test]
    fn a_gathering_batch_goes_after_max_delay_even_without_room() {
        let h = Harness::new(0, 64, Duration::from_millis(20));
        h.send(&[1]);
        assert_eq!(h.next_batch(Duration::from_secs(10)), Some(vec![1]));
        assert_eq!(h.metrics.batches_delayed.get(), 1);
        assert!(
            h.capacity.free.load(Ordering::Acquire) < 0,
            "a forced batch is claimed past the room there is"
        );
    }
}
