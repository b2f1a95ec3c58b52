//! The closed set of events the sidecar's control loop reacts to, and the
//! channel that carries them. Signals, the admin socket and the serving
//! threads post; the control loop (`serve::control`) alone receives.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::daemon::DrainOutcome;

/// What the control loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// SIGTERM, SIGINT or `sidecarctl shutdown`: drain, then stop.
    Stop,
    /// `sidecarctl drain`: drain and keep running; the outcome is sent to
    /// the asker (at once when the ring was drained already).
    Drain(Sender<DrainOutcome>),
    /// A serving thread found the segment file truncated by another
    /// process: the ring is retired and created again.
    RingDamaged,
}

/// The channel: made before the daemon, so that the signal thread (which
/// starts first) can post to it.
#[derive(Debug)]
pub struct Events {
    poster: Poster,
    receiver: Receiver<Event>,
}

/// Posts events; cheap to clone.
#[derive(Debug, Clone)]
pub struct Poster {
    sender: Sender<Event>,
    /// Set with the first [`Event::Stop`], for the start-up (which has no
    /// loop yet) to stop between its steps.
    stopping: Arc<AtomicBool>,
}

impl Default for Events {
    fn default() -> Self {
        let (sender, receiver) = crossbeam_channel::unbounded();
        Self {
            poster: Poster {
                sender,
                stopping: Arc::new(AtomicBool::new(false)),
            },
            receiver,
        }
    }
}

impl Events {
    pub fn poster(&self) -> Poster {
        self.poster.clone()
    }

    pub(crate) fn receiver(&self) -> &Receiver<Event> {
        &self.receiver
    }
}

impl Poster {
    pub fn post(&self, event: Event) {
        if matches!(event, Event::Stop) {
            self.stopping.store(true, Ordering::Release);
        }
        // The receiver lives as long as the daemon: a send fails only once
        // the sidecar is stopping, when nothing is left to tell.
        let _ = self.sender.send(event);
    }

    /// Whether a stop was posted.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}
