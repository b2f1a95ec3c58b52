//! The submission queue: one bit per slot, and a doorbell the sidecar parks on.
//!
//! A submission is a single atomic `fetch_or` on the slot's bit: a client that
//! dies at any instruction leaves either no bit or a whole bit, never a torn
//! queue cell that would block the submissions behind it (the failure mode of
//! a ring of indices shared between processes). The sidecar takes every
//! pending bit of a word with one `swap(0)`, so all requests that arrived
//! together are served together, and none waits behind a later one for more
//! than one pass.
//!
//! A bit is a hint, the slot state is the truth: the sidecar serves a slot only
//! if it can move it `SUBMITTED -> SERVING` (see `slot`), so a stale or
//! duplicated bit costs one failed CAS.
//!
//! Wake-up protocol (`wait::notify` / `wait::wait_for`):
//! - client: set bit; bump `doorbell`; if `server_parked != 0` (an RMW read),
//!   futex-wake it.
//! - sidecar: increment `server_parked`; read `doorbell` (an RMW read);
//!   re-check the bits; futex-wait on the value it read.
//!
//! Either the client sees `server_parked` and wakes it, or the sidecar sees the
//! bit (or a changed doorbell, so the futex wait returns at once).

use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::wait::notify;

/// The submission side shared by every client and the sidecar.
#[derive(Debug, Clone, Copy)]
pub struct SubmitQueue<'a> {
    pub bits: &'a [AtomicU64],
    pub doorbell: &'a AtomicU32,
    pub server_parked: &'a AtomicU32,
}

impl<'a> SubmitQueue<'a> {
    /// Client: announce that `slot_idx` is `SUBMITTED`, and wake the sidecar.
    // SYNC POINT: the SeqCst fetch_or pairs with the sidecar's swap in
    // `drain_into`; the slot's own Release (CLAIMED -> SUBMITTED) precedes it.
    pub fn push(&self, slot_idx: usize) {
        self.bits[slot_idx / 64].fetch_or(1 << (slot_idx % 64), Ordering::SeqCst);
        notify(self.doorbell, self.server_parked);
    }

    /// Sidecar: take every pending slot index, calling `each` for each
    /// (ascending within a word).
    pub fn drain(&self, mut each: impl FnMut(u32)) {
        for (word_idx, word) in self.bits.iter().enumerate() {
            // Relaxed peek avoids a locked RMW on idle words.
            if word.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut pending = word.swap(0, Ordering::SeqCst);
            while pending != 0 {
                let bit = pending.trailing_zeros();
                pending &= pending - 1;
                each(word_idx as u32 * 64 + bit);
            }
        }
    }

    /// [`SubmitQueue::drain`] into a vector.
    pub fn drain_into(&self, out: &mut Vec<u32>) {
        self.drain(|slot_idx| out.push(slot_idx));
    }

    /// Whether any bit is set (SeqCst: the sidecar's re-check before parking).
    pub fn any_pending(&self) -> bool {
        self.bits.iter().any(|w| w.load(Ordering::SeqCst) != 0)
    }
}
