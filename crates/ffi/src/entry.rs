//! What every exported function shares: `errno`, the panic guard, the return conventions
//! of rdma-core 44, and the `.symver` directive that gives an internal `uroce_<name>` symbol
//! its public versioned name (docs ibverbs-abi.md §3.2, "Recipe A").

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::device::FfiError;

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

/// `Ok` → 0, `Err` → -1 with `errno` set.
pub(crate) fn minus_one(r: Result<(), FfiError>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
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
            set_errno(e.errno());
            e.errno()
        }
    }
}

/// `Ok(p)` → `p`, `Err` → NULL with `errno` set.
pub(crate) fn ptr_or_null<T>(r: Result<*mut T, FfiError>) -> *mut T {
    r.unwrap_or_else(|e| {
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
