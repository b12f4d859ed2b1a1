//! `ibv_resize_cq`: a CQ's capacity changed in place ([`uroce_verbs::CqRef::resize`]);
//! `cq->cqe` reports the new size.

use std::ffi::c_int;

use crate::abi::ibv_cq;
use crate::entry::{errno_value, guard, symver};
use crate::error::FfiError;
use crate::handle::Handle;
use crate::objects::CqKind;

symver!("uroce_ibv_resize_cq", "ibv_resize_cq@@IBVERBS_1.1");

/// `ibv_resize_cq(cq, cqe)`: 0, or the errno value (`EINVAL` for an unknown CQ, a `cqe`
/// outside 1..=`max_cqe` or below the completions the CQ holds, as rdma-core over the
/// kernel's uverbs reports them). The completions already queued stay queued, in order.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            let g = Handle::<CqKind>::enter(cq.cast()).ok_or(FfiError::BadHandle { what: "cq" })?;
            let body = g.body().ok_or(FfiError::BadHandle { what: "cq" })?;
            let cqe = u32::try_from(cqe).map_err(|_| FfiError::Invalid("negative cqe"))?;
            let size = body.cq.resize(cqe).map_err(|e| FfiError::Refused {
                op: "ibv_resize_cq",
                errno: libc::EINVAL,
                reason: e.to_string(),
            })?;
            // SAFETY: a live CQ container (counted in); the application reads `cqe`, it
            // does not write it.
            unsafe {
                (*Handle::c_ptr(g.handle())).cqe = c_int::try_from(size).unwrap_or(c_int::MAX)
            };
            Ok(())
        })())
    })
}
