//! uroce's drop-in `librdmacm.so.1`: rdma-core 44's librdmacm symbol table (RDMACM_1.0 …
//! 1.3), every function a forwarder.
//!
//! The RDMA-CM API itself lives in uroce's `libibverbs.so.1` (`uroce-ffi`, module
//! `rdmacm`), next to the verbs objects it must share with the program: `id->verbs` is a
//! context of that library and `id->qp` a QP of its registry, so the program's own verbs
//! calls on them work. This library finds those entry points (`uroce_rdmacm_<name>`) with
//! `dlsym` in the `libibverbs.so.1` the process loads (the one `LD_LIBRARY_PATH` presents,
//! as `uroce run` does); a `libibverbs.so.1` that is not uroce's is reported on stderr once
//! and every call fails with `ENOSYS`. docs/ARCHITECTURE.md ("librdmacm") says why the
//! implementation is not in this library.
//!
//! Functions uroce does not implement (rsockets, `rdma_reject_ece`) fail here
//! with `-1` (NULL-equivalent) and `errno` `ENOSYS`.
//!
//! Each function has an internal name `urcm_<name>`; a `.symver` directive gives it the
//! public versioned name (with the version nodes of `librdmacm.map`), as in `uroce-ffi`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::io::Write as _;
use std::sync::OnceLock;

/// The `libibverbs.so.1` handle, or `None` when it is not uroce's.
fn verbs_lib() -> Option<usize> {
    static LIB: OnceLock<Option<usize>> = OnceLock::new();
    *LIB.get_or_init(|| {
        // SAFETY: dlopen with a constant NUL-terminated name; the handle is kept for the
        // life of the process.
        let h = unsafe {
            libc::dlopen(
                c"libibverbs.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_GLOBAL,
            )
        };
        // SAFETY: `h` is a live handle (checked non-NULL); constant symbol name.
        let ok = !h.is_null()
            && !unsafe { libc::dlsym(h, c"uroce_rdmacm_rdma_create_id".as_ptr()) }.is_null();
        if ok {
            Some(h as usize)
        } else {
            let _ = writeln!(
                std::io::stderr(),
                "uroce librdmacm: the libibverbs.so.1 this process loaded is not uroce's; \
                 run the program with `uroce run -- PROGRAM` (or put uroce's libibverbs.so.1 \
                 first in LD_LIBRARY_PATH)"
            );
            None
        }
    })
}

/// The uroce entry point `name` (a NUL-terminated `uroce_rdmacm_…` name), NULL if none.
fn entry(name: &CStr) -> *mut c_void {
    match verbs_lib() {
        // SAFETY: a live handle and a NUL-terminated name.
        Some(h) => unsafe { libc::dlsym(h as *mut c_void, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno location, valid for the thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// Attaches the public versioned name to an internal symbol.
macro_rules! symver {
    ($name:ident, $ver:literal) => {
        std::arch::global_asm!(concat!(
            ".symver urcm_",
            stringify!($name),
            ", ",
            stringify!($name),
            "@@",
            $ver
        ));
    };
}

/// A forwarder to `uroce_rdmacm_<name>` of uroce's libibverbs (resolved once); `$fail`
/// with `ENOSYS` when there is none. Forwarder and target have one ABI: `"C"` for every
/// function but those that block in a cancellation point (`rdma_get_cm_event`), which are
/// `"C-unwind"` on both sides so that `pthread_cancel` unwinds through them.
macro_rules! forward {
    ($name:ident, $ver:literal, ($($arg:ident: $ty:ty),*) -> $ret:ty, $fail:expr) => {
        forward!(@abi "C", $name, $ver, ($($arg: $ty),*) -> $ret, $fail);
    };
    (unwind $name:ident, $ver:literal, ($($arg:ident: $ty:ty),*) -> $ret:ty, $fail:expr) => {
        forward!(@abi "C-unwind", $name, $ver, ($($arg: $ty),*) -> $ret, $fail);
    };
    (@abi $abi:literal, $name:ident, $ver:literal, ($($arg:ident: $ty:ty),*) -> $ret:ty, $fail:expr) => {
        symver!($name, $ver);
        #[doc = concat!("`", stringify!($name), "`, forwarded to uroce's libibverbs.")]
        ///
        /// # Safety
        /// The C contract of the rdma-core function.
        #[export_name = concat!("urcm_", stringify!($name))]
        pub unsafe extern $abi fn $name($($arg: $ty),*) -> $ret {
            static PTR: OnceLock<usize> = OnceLock::new();
            let p = *PTR.get_or_init(|| {
                entry(
                    CStr::from_bytes_with_nul(concat!("uroce_rdmacm_", stringify!($name), "\0").as_bytes())
                        .unwrap_or(c"?"),
                ) as usize
            });
            if p == 0 {
                set_errno(libc::ENOSYS);
                return $fail;
            }
            // SAFETY: `p` is uroce's entry point of this very signature and ABI (uroce-ffi's
            // `rdmacm` module defines it with these parameter and return types, `extern
            // "C-unwind"` exactly for the forwarders marked `unwind`).
            let f: unsafe extern $abi fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
            // SAFETY: forwarded caller contract.
            unsafe { f($($arg),*) }
        }
    };
}

/// A function uroce does not implement: `-1` (NULL, for pointer results) with `errno`
/// `ENOSYS`, whatever its arguments (the C calling convention lets a callee ignore them).
macro_rules! unsupported {
    ($name:ident, $ver:literal) => {
        symver!($name, $ver);
        #[doc = concat!("`", stringify!($name), "`: not supported by uroce (`ENOSYS`).")]
        #[export_name = concat!("urcm_", stringify!($name))]
        pub extern "C" fn $name() -> isize {
            set_errno(libc::ENOSYS);
            -1
        }
    };
}

/// Every function of rdma-core 44's librdmacm, in its version node.
pub mod api {
    #![allow(clippy::missing_safety_doc)]
    // `-> ()` keeps the five `void` functions in the same table form as the others.
    #![allow(clippy::unused_unit)]
    use super::*;
    unsupported!(raccept, "RDMACM_1.0");
    unsupported!(rbind, "RDMACM_1.0");
    unsupported!(rclose, "RDMACM_1.0");
    unsupported!(rconnect, "RDMACM_1.0");
    forward!(rdma_accept, "RDMACM_1.0", (id: *mut c_void, param: *mut c_void) -> c_int, -1);
    forward!(rdma_ack_cm_event, "RDMACM_1.0", (event: *mut c_void) -> c_int, -1);
    forward!(rdma_bind_addr, "RDMACM_1.0", (id: *mut c_void, addr: *mut c_void) -> c_int, -1);
    forward!(rdma_connect, "RDMACM_1.0", (id: *mut c_void, param: *mut c_void) -> c_int, -1);
    forward!(rdma_create_ep, "RDMACM_1.0", (id: *mut c_void, res: *mut c_void, pd: *mut c_void, attr: *mut c_void) -> c_int, -1);
    forward!(rdma_create_event_channel, "RDMACM_1.0", () -> *mut c_void, std::ptr::null_mut());
    forward!(rdma_create_id, "RDMACM_1.0", (channel: *mut c_void, id: *mut c_void, context: *mut c_void, ps: c_int) -> c_int, -1);
    forward!(rdma_create_qp, "RDMACM_1.0", (id: *mut c_void, pd: *mut c_void, attr: *mut c_void) -> c_int, -1);
    forward!(rdma_create_qp_ex, "RDMACM_1.0", (id: *mut c_void, attr: *mut c_void) -> c_int, -1);
    forward!(rdma_create_srq, "RDMACM_1.0", (id: *mut c_void, pd: *mut c_void, attr: *mut c_void) -> c_int, -1);
    forward!(rdma_create_srq_ex, "RDMACM_1.0", (id: *mut c_void, attr: *mut c_void) -> c_int, -1);
    forward!(rdma_destroy_ep, "RDMACM_1.0", (id: *mut c_void) -> (), ());
    forward!(rdma_destroy_event_channel, "RDMACM_1.0", (channel: *mut c_void) -> (), ());
    forward!(rdma_destroy_id, "RDMACM_1.0", (id: *mut c_void) -> c_int, -1);
    forward!(rdma_destroy_qp, "RDMACM_1.0", (id: *mut c_void) -> (), ());
    forward!(rdma_destroy_srq, "RDMACM_1.0", (id: *mut c_void) -> (), ());
    forward!(rdma_disconnect, "RDMACM_1.0", (id: *mut c_void) -> c_int, -1);
    forward!(rdma_event_str, "RDMACM_1.0", (event: c_int) -> *const c_char, c"UNKNOWN EVENT".as_ptr());
    forward!(rdma_free_devices, "RDMACM_1.0", (list: *mut c_void) -> (), ());
    forward!(rdma_freeaddrinfo, "RDMACM_1.0", (res: *mut c_void) -> (), ());
    forward!(unwind rdma_get_cm_event, "RDMACM_1.0", (channel: *mut c_void, event: *mut c_void) -> c_int, -1);
    forward!(rdma_get_devices, "RDMACM_1.0", (num: *mut c_void) -> *mut c_void, std::ptr::null_mut());
    forward!(rdma_get_dst_port, "RDMACM_1.0", (id: *mut c_void) -> u16, 0);
    forward!(rdma_get_request, "RDMACM_1.0", (listen: *mut c_void, id: *mut c_void) -> c_int, -1);
    forward!(rdma_get_src_port, "RDMACM_1.0", (id: *mut c_void) -> u16, 0);
    forward!(rdma_getaddrinfo, "RDMACM_1.0", (node: *mut c_void, service: *mut c_void, hints: *mut c_void, res: *mut c_void) -> c_int, -1);
    forward!(rdma_join_multicast, "RDMACM_1.0", (id: *mut c_void, addr: *mut c_void, context: *mut c_void) -> c_int, -1);
    forward!(rdma_leave_multicast, "RDMACM_1.0", (id: *mut c_void, addr: *mut c_void) -> c_int, -1);
    forward!(rdma_listen, "RDMACM_1.0", (id: *mut c_void, backlog: c_int) -> c_int, -1);
    forward!(rdma_migrate_id, "RDMACM_1.0", (id: *mut c_void, channel: *mut c_void) -> c_int, -1);
    forward!(rdma_notify, "RDMACM_1.0", (id: *mut c_void, event: c_int) -> c_int, -1);
    forward!(rdma_reject, "RDMACM_1.0", (id: *mut c_void, data: *mut c_void, len: u8) -> c_int, -1);
    forward!(rdma_resolve_addr, "RDMACM_1.0", (id: *mut c_void, src: *mut c_void, dst: *mut c_void, timeout_ms: c_int) -> c_int, -1);
    forward!(rdma_resolve_route, "RDMACM_1.0", (id: *mut c_void, timeout_ms: c_int) -> c_int, -1);
    forward!(rdma_set_option, "RDMACM_1.0", (id: *mut c_void, level: c_int, optname: c_int, optval: *mut c_void, optlen: usize) -> c_int, -1);
    unsupported!(rfcntl, "RDMACM_1.0");
    unsupported!(rgetpeername, "RDMACM_1.0");
    unsupported!(rgetsockname, "RDMACM_1.0");
    unsupported!(rgetsockopt, "RDMACM_1.0");
    unsupported!(riomap, "RDMACM_1.0");
    unsupported!(riounmap, "RDMACM_1.0");
    unsupported!(riowrite, "RDMACM_1.0");
    unsupported!(rlisten, "RDMACM_1.0");
    unsupported!(rpoll, "RDMACM_1.0");
    unsupported!(rread, "RDMACM_1.0");
    unsupported!(rreadv, "RDMACM_1.0");
    unsupported!(rrecv, "RDMACM_1.0");
    unsupported!(rrecvfrom, "RDMACM_1.0");
    unsupported!(rrecvmsg, "RDMACM_1.0");
    unsupported!(rselect, "RDMACM_1.0");
    unsupported!(rsend, "RDMACM_1.0");
    unsupported!(rsendmsg, "RDMACM_1.0");
    unsupported!(rsendto, "RDMACM_1.0");
    unsupported!(rsetsockopt, "RDMACM_1.0");
    unsupported!(rshutdown, "RDMACM_1.0");
    unsupported!(rsocket, "RDMACM_1.0");
    unsupported!(rwrite, "RDMACM_1.0");
    unsupported!(rwritev, "RDMACM_1.0");
    forward!(rdma_join_multicast_ex, "RDMACM_1.1", (id: *mut c_void, attr: *mut c_void, context: *mut c_void) -> c_int, -1);
    forward!(rdma_establish, "RDMACM_1.2", (id: *mut c_void) -> c_int, -1);
    forward!(rdma_init_qp_attr, "RDMACM_1.2", (id: *mut c_void, qp_attr: *mut c_void, qp_attr_mask: *mut c_int) -> c_int, -1);
    forward!(rdma_get_remote_ece, "RDMACM_1.3", (id: *mut c_void, ece: *mut c_void) -> c_int, -1);
    unsupported!(rdma_reject_ece, "RDMACM_1.3");
    forward!(rdma_set_local_ece, "RDMACM_1.3", (id: *mut c_void, ece: *mut c_void) -> c_int, -1);
}
