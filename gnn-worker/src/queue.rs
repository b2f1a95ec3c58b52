//! The bound on the calls that wait for the batcher's threads (docs/serving.md,
//! "Overload"): a call holds a [`Place`] from when it is accepted until a
//! ring or student thread takes it, and a lane holds at most
//! [`MAX_QUEUED_CALLS`] places; the next call is refused at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Calls that may wait for one lane's threads at once; one more is refused
/// as overloaded.
pub const MAX_QUEUED_CALLS: usize = 4096;

/// The calls of one lane (the GNN's, the student's) accepted and not yet
/// taken by a thread.
#[derive(Debug, Default)]
pub struct Waiting(AtomicUsize);

impl Waiting {
    /// Calls waiting now.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// A place for one more call, or `None` when [`MAX_QUEUED_CALLS`]
    /// already wait.
    pub fn place(self: &Arc<Self>) -> Option<Place> {
        let before = self.0.fetch_add(1, Ordering::AcqRel);
        if before >= MAX_QUEUED_CALLS {
            self.0.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Place(Some(self.clone())))
    }
}

/// One call's place among its lane's waiting calls: given back when a
/// thread takes the call ([`Place::release`]) or, at the latest, when the
/// call is dropped.
#[derive(Debug)]
pub struct Place(Option<Arc<Waiting>>);

impl Place {
    pub fn release(&mut self) {
        if let Some(waiting) = self.0.take() {
            waiting.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_refuses_one_more_and_places_come_back() {
        let waiting = Arc::new(Waiting::default());
        let mut places: Vec<Place> = (0..MAX_QUEUED_CALLS)
            .map(|_| waiting.place().expect("a place"))
            .collect();
        assert_eq!(waiting.count(), MAX_QUEUED_CALLS);
        assert!(waiting.place().is_none(), "one more is refused");
        assert_eq!(waiting.count(), MAX_QUEUED_CALLS, "a refusal holds nothing");
        places[0].release();
        places[0].release();
        assert_eq!(waiting.count(), MAX_QUEUED_CALLS - 1, "released once");
        assert!(waiting.place().is_some(), "taken and dropped at once");
        drop(places);
        assert_eq!(waiting.count(), 0, "dropping a call gives its place back");
    }
}
