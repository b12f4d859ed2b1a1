//! What every exported function shares: `errno`, the panic guard, the return conventions
//! of rdma-core 44, and the `.symver` directive that gives an internal `uroce_<name>` symbol
//! its public versioned name (with the version nodes of `libibverbs.map`; see
//! docs/ARCHITECTURE.md, "ffi").

use std::ffi::c_int;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::FfiError;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the address of the calling thread's errno, valid
    // and writable for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`, turning a panic into `on_panic` with `errno` = `EIO`: a panic never unwinds
/// into C.
pub(crate) fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        on_panic
    })
}

/// Whether `UROCE_DEBUG` is set to a non-empty value.
pub(crate) fn debug_enabled() -> bool {
    std::env::var_os("UROCE_DEBUG").is_some_and(|v| !v.is_empty())
}

/// Reports a refused call and its reason on stderr under `UROCE_DEBUG`. Every failure an
/// exported function returns passes through here (the return helpers below and the post
/// functions' `bad_wr` path), so that a program that stops with a bare "Couldn't …" can be
/// rerun with `UROCE_DEBUG=1` to learn why.
pub(crate) fn report(e: &FfiError) {
    if debug_enabled() {
        // A failed write to stderr is ignored: diagnostics must not fail the call.
        let _ = writeln!(
            std::io::stderr(),
            "uroce: refused ({}): {e}",
            std::io::Error::from_raw_os_error(e.errno())
        );
    }
}

/// A result the caller cannot act on (the cleanup of an object on another object's error
/// or destruction): reported and left in `errno` as the exported function would leave it,
/// then dropped.
pub(crate) fn ignore<T>(r: Result<T, FfiError>) {
    if let Err(e) = r {
        report(&e);
        set_errno(e.errno());
    }
}

/// `Ok` → 0, `Err` → -1 with `errno` set.
pub(crate) fn minus_one(r: Result<(), FfiError>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            report(&e);
            set_errno(e.errno());
            -1
        }
    }
}

/// `Ok` → 0, `Err` → the errno value (also stored in `errno`).
pub(crate) fn errno_value(r: Result<(), FfiError>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            report(&e);
            set_errno(e.errno());
            e.errno()
        }
    }
}

/// `Ok(p)` → `p`, `Err` → NULL with `errno` set.
pub(crate) fn ptr_or_null<T>(r: Result<*mut T, FfiError>) -> *mut T {
    r.unwrap_or_else(|e| {
        report(&e);
        set_errno(e.errno());
        std::ptr::null_mut()
    })
}

/// Attaches the public versioned name to an internal symbol (not in unit-test builds,
/// which link into an executable without the version script). `name@@NODE` is the
/// default version a program links against today; `name@NODE` a compatibility version
/// that only programs linked against an older library bind. A name must also be listed
/// in its node(s) in `libibverbs.map`.
macro_rules! symver {
    ($internal:literal, $public:literal) => {
        #[cfg(not(test))]
        std::arch::global_asm!(concat!(".symver ", $internal, ", ", $public));
    };
}
pub(crate) use symver;

extern "C-unwind" {
    /// libc's `poll(2)`, declared as a call that may unwind: thread cancellation unwinds
    /// out of it, and a call through the ordinary `extern "C"` declaration is assumed not
    /// to unwind (the unwinder finds no landing entry for it and aborts the process).
    #[link_name = "poll"]
    fn cancellable_poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
}

/// One non-blocking try of a call that may block (see [`blocking_call`]).
pub(crate) enum Attempt<R> {
    /// The call is done: return this.
    Done(R),
    /// Nothing yet: wait until `fd` is readable, then try again. `keep` holds whatever
    /// keeps `fd` open during the wait.
    Wait {
        fd: std::os::fd::RawFd,
        keep: Box<dyn std::any::Any>,
    },
}

/// How many wake-ups one blocking call tolerates (each one an item taken by another
/// thread between the wake-up and the retry) before it gives up with `EAGAIN`.
const MAX_WAKEUPS: u32 = 1_000_000;

/// Runs a call that may block (`ibv_get_cq_event`, `ibv_get_async_event`): `attempt`, run
/// under [`guard`], either finishes or names a descriptor to wait on. A descriptor with
/// `O_NONBLOCK` makes the call fail with `EAGAIN` instead, as rdma-core's do; otherwise
/// the thread waits in libc's `poll(2)` — a cancellation point, entered outside any
/// `catch_unwind` frame, so that `pthread_cancel` (rping cancels its CQ thread blocked
/// there) unwinds through the caller, which must be `extern "C-unwind"`. A signal ends the
/// wait with `EINTR`.
pub(crate) fn blocking_call<R: Copy>(on_error: R, mut attempt: impl FnMut() -> Attempt<R>) -> R {
    for _ in 0..MAX_WAKEUPS {
        let (fd, keep) = match guard(Attempt::Done(on_error), &mut attempt) {
            Attempt::Done(r) => return r,
            Attempt::Wait { fd, keep } => (fd, keep),
        };
        // SAFETY: F_GETFL reads the flags of a descriptor `keep` keeps open.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            set_errno(libc::EAGAIN);
            return on_error;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on a descriptor `keep` keeps open.
        let r = unsafe { cancellable_poll(&mut pfd, 1, -1) };
        drop(keep);
        if r < 0 {
            // errno is poll's (EINTR, ENOMEM).
            return on_error;
        }
    }
    set_errno(libc::EAGAIN);
    on_error
}
