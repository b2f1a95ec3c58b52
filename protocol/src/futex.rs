//! Cross-process futex wait and wake on a 32-bit word in shared memory.
//!
//! Invariants:
//! - The word lives in a `MAP_SHARED` mapping, so the *shared* futex operations
//!   are used (no `FUTEX_PRIVATE_FLAG`): the kernel keys the wait queue on the
//!   backing page, not on the virtual address, and the two processes can map
//!   the segment at different addresses.
//! - A wake-up is only a hint. Every caller re-reads the state it waits for;
//!   spurious returns (`EINTR`, `EAGAIN`, timeouts) are indistinguishable from
//!   a real wake on purpose.
//!
//! This is one of the two modules of the crate that contain `unsafe` code
//! (the other is `segment`).
#![allow(unsafe_code)]

use std::time::Duration;

use crate::sync::AtomicU32;

/// Sleeps while `*word == expected`, for at most `timeout`.
///
/// Returns when the word changed, a wake arrived, the timeout passed or a
/// signal interrupted the wait; the caller finds out which by looking at the
/// state it cares about.
#[cfg(not(loom))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned 4-byte atomic for the duration of the
    // call (it is borrowed); FUTEX_WAIT only reads it and compares it with
    // `expected` atomically in the kernel. `ts` outlives the call. The other
    // arguments are ignored by FUTEX_WAIT.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes up to `n` waiters parked on `word` (in any process).
#[cfg(not(loom))]
pub(crate) fn wake(word: &AtomicU32, n: u32) {
    // SAFETY: `word` is a valid, aligned 4-byte atomic; FUTEX_WAKE does not
    // access the memory, it only keys the wait queue on its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n.min(i32::MAX as u32),
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

// Under loom the futex is a condition variable: `wait` sleeps only while the
// word still holds `expected`, checked under the same lock `wake` takes, which
// is the kernel's guarantee. Timeouts are ignored, so a lost wake-up is a
// deadlock that loom reports instead of a delay that hides it.
#[cfg(loom)]
loom::lazy_static! {
    static ref FUTEX: (loom::sync::Mutex<()>, loom::sync::Condvar) =
        (loom::sync::Mutex::new(()), loom::sync::Condvar::new());
}

#[cfg(loom)]
pub(crate) fn wait(word: &AtomicU32, expected: u32, _timeout: Duration) {
    use crate::sync::Ordering;
    let (lock, condvar) = &*FUTEX;
    let guard = lock.lock().unwrap();
    if word.load(Ordering::SeqCst) == expected {
        drop(condvar.wait(guard).unwrap());
    }
}

#[cfg(loom)]
pub(crate) fn wake(_word: &AtomicU32, _n: u32) {
    let (lock, condvar) = &*FUTEX;
    let _guard = lock.lock().unwrap();
    condvar.notify_all();
}
