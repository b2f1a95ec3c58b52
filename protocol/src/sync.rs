//! The atomics every shared type is built from, behind one switch.
//!
//! Under `--cfg loom` these are loom's model-checked atomics and the futex
//! becomes a yield (loom explores every interleaving; a park is only an
//! optimisation of a loop that re-checks the state anyway). Everything else
//! is the standard library's, whose layout matches the plain integers the
//! segment documents (`AtomicU32` is 4 bytes, `AtomicU64` 8, same alignment).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};

pub(crate) use std::sync::atomic::Ordering;

/// One step of a busy-wait loop.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
