//! The posting slots of `ibv_context.ops` the header inlines call: `post_send`,
//! `post_recv`, `post_srq_recv` (a chain of C work requests, `bad_wr` on the first refused).
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure; each exported function is a
//! thin wrapper around an internal one that the library's other modules call.

use std::ffi::c_int;

use uroce_verbs::QpType;

use crate::abi::*;
use crate::convert::*;
use crate::entry::*;
use crate::error::{refused, FfiError};
use crate::objects::*;

/// Most work requests one post call walks (bounds the walk of a corrupt, cyclic list).
const MAX_CHAIN: usize = 1 << 20;

/// A C work request that links to the next one (`ibv_send_wr`, `ibv_recv_wr`).
trait ChainedWr {
    /// The next WR of the chain (NULL at the end).
    fn next_wr(&self) -> *mut Self;
}

impl ChainedWr for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl ChainedWr for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// A post the verbs layer refused, as verbs reports it: `ENOMEM` for a full queue,
/// `EINVAL` for anything else.
fn post_refused(op: &'static str, e: uroce_verbs::PostError) -> FfiError {
    let errno = match e {
        uroce_verbs::PostError::QueueFull { .. } => libc::ENOMEM,
        _ => libc::EINVAL,
    };
    refused(op, errno, e)
}

/// Reports a failed post: `*bad_wr` = `at` (if `bad_wr` is not NULL), errno set; returns
/// the errno value.
///
/// # Safety
/// `bad_wr` is NULL or writable.
unsafe fn chain_failed<W>(bad_wr: *mut *mut W, at: *mut W, e: FfiError) -> c_int {
    report(&e);
    if !bad_wr.is_null() {
        // SAFETY: caller guarantee: writable bad_wr (checked non-NULL).
        unsafe { bad_wr.write(at) };
    }
    crate::entry::report(&e);
    set_errno(e.errno());
    e.errno()
}

/// Posts the chain starting at `first` in order through `post`; 0, or the errno value with
/// `*bad_wr` = the first WR not posted. Walks at most [`MAX_CHAIN`] WRs.
///
/// # Safety
/// `first` is NULL or a valid chain of readable WRs (with readable SGE lists and inline
/// data, which `post` reads); `bad_wr` is NULL or writable.
unsafe fn post_chain<W: ChainedWr>(
    first: *mut W,
    bad_wr: *mut *mut W,
    mut post: impl FnMut(&W) -> Result<(), FfiError>,
) -> c_int {
    let mut cur = first;
    for _ in 0..MAX_CHAIN {
        if cur.is_null() {
            return 0;
        }
        // SAFETY: caller guarantee: every WR of the chain is readable (checked non-NULL).
        let w = unsafe { &*cur };
        if let Err(e) = post(w) {
            // SAFETY: caller guarantee on bad_wr.
            return unsafe { chain_failed(bad_wr, cur, e) };
        }
        cur = w.next_wr();
    }
    // SAFETY: caller guarantee on bad_wr.
    unsafe { chain_failed(bad_wr, cur, FfiError::Invalid("work request list too long")) }
}

/// `ibv_context.ops.post_send(qp, wr, bad_wr)`: posts the chain in order; 0, or the errno
/// value with `*bad_wr` = the first WR not posted (`EINVAL` invalid WR/state, `ENOMEM`
/// queue full).
///
/// # Safety
/// `wr` is NULL or a valid chain of `struct ibv_send_wr` whose SGE lists are readable;
/// `bad_wr` is NULL or writable.
pub unsafe extern "C" fn ops_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        let (r, max_inline) = match qp_ref(qp) {
            Ok(x) => x,
            // SAFETY: caller guarantee on bad_wr.
            Err(e) => return unsafe { chain_failed(bad_wr, wr, e) },
        };
        // Datagram QPs take their destination from each WR (`wr.ud`).
        let datagram = matches!(r.qp_type(), QpType::Ud | QpType::Gsi);
        let post = |w: &ibv_send_wr| {
            // SAFETY: caller guarantee: its SGE list (and inline data) is readable.
            let mut s = unsafe { send_wr_from_c(w, max_inline) }?;
            if datagram {
                s.ud = Some(ud_dest_from_c(w)?);
            }
            r.post_send(s).map_err(|e| post_refused("ibv_post_send", e))
        };
        // SAFETY: caller guarantees on the chain and bad_wr.
        unsafe { post_chain(wr, bad_wr, post) }
    })
}

/// `ibv_context.ops.post_recv(qp, wr, bad_wr)`: posts the chain in order; 0, or the errno
/// value with `*bad_wr` = the first WR not posted.
///
/// # Safety
/// `wr` is NULL or a valid chain of `struct ibv_recv_wr` whose SGE lists are readable;
/// `bad_wr` is NULL or writable.
pub unsafe extern "C" fn ops_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let (r, _) = match qp_ref(qp) {
            Ok(x) => x,
            // SAFETY: caller guarantee on bad_wr.
            Err(e) => return unsafe { chain_failed(bad_wr, wr, e) },
        };
        let post = |w: &ibv_recv_wr| {
            // SAFETY: caller guarantee: its SGE list is readable.
            let rw = unsafe { recv_wr_from_c(w) }?;
            r.post_recv(rw)
                .map_err(|e| post_refused("ibv_post_recv", e))
        };
        // SAFETY: caller guarantees on the chain and bad_wr.
        unsafe { post_chain(wr, bad_wr, post) }
    })
}

/// `ibv_context.ops.post_srq_recv(srq, wr, bad_wr)`: posts the chain to the SRQ in order;
/// 0, or the errno value with `*bad_wr` = the first WR not posted (`EINVAL` invalid WR or
/// unknown SRQ, `ENOMEM` queue full).
///
/// # Safety
/// `wr` is NULL or a valid chain of `struct ibv_recv_wr` whose SGE lists are readable;
/// `bad_wr` is NULL or writable.
pub unsafe extern "C" fn ops_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let r = match srq_ref(srq) {
            Ok(x) => x,
            // SAFETY: caller guarantee on bad_wr.
            Err(e) => return unsafe { chain_failed(bad_wr, wr, e) },
        };
        let post = |w: &ibv_recv_wr| {
            // SAFETY: caller guarantee: its SGE list is readable.
            let rw = unsafe { recv_wr_from_c(w) }?;
            r.post_recv(rw)
                .map_err(|e| post_refused("ibv_post_srq_recv", e))
        };
        // SAFETY: caller guarantees on the chain and bad_wr.
        unsafe { post_chain(wr, bad_wr, post) }
    })
}
