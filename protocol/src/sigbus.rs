//! Surviving a peer that truncates the segment file.
//!
//! Both processes map the same file. If either shrinks it (`ftruncate`), the
//! other's next access past the new end raises `SIGBUS`, which would kill it.
//! A mapping registered here is protected instead: the process's `SIGBUS`
//! handler, when the faulting address lies in a registered mapping, maps one
//! anonymous zero page over the faulting page (`MAP_FIXED | MAP_PRIVATE`) and
//! returns, so the access completes (reading zeros) and the mapping is marked
//! truncated. The owner of the mapping checks that mark (and the file's size)
//! and retires the segment: a worker detaches and attaches again, the sidecar
//! creates a new segment. Libwayland protects compositors from clients'
//! shared-memory pools the same way.
//!
//! A fault outside every registered mapping goes to the handler that was
//! installed before (the Rust runtime's stack-overflow report, for one) or
//! to the default action.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use nix::libc;

/// Mappings that can be registered at once in a process.
const MAX_RANGES: usize = 256;

struct Range {
    start: AtomicUsize,
    len: AtomicUsize,
    faults: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Range = Range {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faults: AtomicUsize::new(0),
};

static RANGES: [Range; MAX_RANGES] = [EMPTY; MAX_RANGES];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The disposition found when the handler was installed (`Err`: the install
/// failed, so no mapping is protected).
static INSTALLED: OnceLock<Result<libc::sigaction, i32>> = OnceLock::new();

/// A registered mapping; unregisters when dropped (before the unmap).
#[derive(Debug)]
pub struct BusGuard {
    index: Option<usize>,
}

impl BusGuard {
    /// Whether an access to the mapping faulted past the file's end (the
    /// file was truncated under this process).
    pub fn faulted(&self) -> bool {
        self.index
            .is_some_and(|i| RANGES[i].faults.load(Ordering::Acquire) > 0)
    }

    /// Whether the mapping is protected (the handler is installed and a
    /// registration entry was free).
    pub fn is_protected(&self) -> bool {
        self.index.is_some()
    }
}

impl Drop for BusGuard {
    fn drop(&mut self) {
        if let Some(i) = self.index {
            RANGES[i].len.store(0, Ordering::Release);
            RANGES[i].faults.store(0, Ordering::Release);
            RANGES[i].start.store(0, Ordering::Release);
        }
    }
}

/// Protects `start..start + len` (a live mapping of this process) from
/// `SIGBUS` until the guard is dropped.
pub fn protect(start: *const u8, len: usize) -> BusGuard {
    let start = start as usize;
    if start == 0 || len == 0 || install().is_err() {
        return BusGuard { index: None };
    }
    for (i, range) in RANGES.iter().enumerate() {
        if range
            .start
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            range.faults.store(0, Ordering::Release);
            // SYNC POINT: the handler matches only once `len` is set; until
            // then the entry covers nothing.
            range.len.store(len, Ordering::Release);
            return BusGuard { index: Some(i) };
        }
    }
    BusGuard { index: None }
}

fn install() -> Result<(), i32> {
    let installed = INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: `sigaction` is plain data; all-zero is valid (no flags, an
        // empty mask) and completed below. The handler is an `extern "C"` fn
        // of the SA_SIGINFO signature; `previous` receives the old action.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut previous) == 0 {
                Ok(previous)
            } else {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            }
        }
    });
    installed.as_ref().map(|_| ()).map_err(|&e| e)
}

/// The `SIGBUS` handler. Async-signal-safe: atomics, `mmap`, `sigaction`
/// and `raise` only.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for range in RANGES.iter() {
        let start = range.start.load(Ordering::Acquire);
        let len = range.len.load(Ordering::Acquire);
        if start == 0 || len == 0 || addr < start || addr - start >= len {
            continue;
        }
        let page = PAGE.load(Ordering::Relaxed);
        let at = addr & !(page - 1);
        // SAFETY: `at..at + page` lies inside a mapping this process made
        // and registered (page-aligned start, whole pages); replacing that
        // page with anonymous memory only changes what the page holds.
        let mapped = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            range.faults.fetch_add(1, Ordering::AcqRel);
            return;
        }
        break;
    }
    // Not a registered mapping: what was there before.
    if let Some(Ok(previous)) = INSTALLED.get() {
        let handler = previous.sa_sigaction;
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
            if previous.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO,
                // so it has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(handler) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a handler without SA_SIGINFO takes the signal only.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                f(sig);
            }
            return;
        }
    }
    // SAFETY: restoring the default action and re-raising are
    // async-signal-safe; the signal is delivered once this handler returns.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
        libc::raise(sig);
    }
}
