//! `ibv_attach_mcast` / `ibv_detach_mcast`: a UD QP joins or leaves a multicast group
//! (see `uroce_verbs::mcast` for the rules and `uroce_net::mcast` for the IP side).
//!
//! Both return 0 or an errno value (as rdma-core's, which return the provider's result):
//! `EINVAL` for a bad QP handle or NULL GID, a QP that is not UD, a GID that is not a
//! RoCEv2 multicast GID (IPv6 `ff00::/8` or IPv4-mapped `::ffff:224.0.0.0/4`), or a
//! detach of a QP not attached to the group; `ENOMEM` beyond the device's multicast limits
//! (`max_mcast_grp`, `max_mcast_qp_attach`); the socket error when the device cannot join
//! the IP group. The LID is ignored (RoCE has none). `errno` is set as well.
//!
//! The `ibv_context_ops` slots for attach/detach are compatibility slots that no inline
//! function of `verbs.h` calls: programs reach these two through the exported symbols only.

use std::ffi::c_int;

use uroce_verbs::mcast::McastError;
use uroce_verbs::Gid;

use crate::abi::*;
use crate::entry::*;
use crate::error::FfiError;
use crate::handle::Handle;
use crate::objects::*;

symver!("uroce_ibv_attach_mcast", "ibv_attach_mcast@@IBVERBS_1.1");
symver!("uroce_ibv_detach_mcast", "ibv_detach_mcast@@IBVERBS_1.1");

fn errno_of(e: &McastError) -> c_int {
    match e {
        McastError::NotMulticast(_) | McastError::WrongQpType | McastError::NotAttached => {
            libc::EINVAL
        }
        McastError::Limit(_) => libc::ENOMEM,
        McastError::Join(io) => io.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// Reads the GID argument.
///
/// # Safety
/// `gid` is NULL or points to 16 readable bytes.
unsafe fn read_gid(gid: *const ibv_gid) -> Result<Gid, FfiError> {
    if gid.is_null() {
        return Err(FfiError::Invalid("gid is NULL"));
    }
    // SAFETY: non-NULL, and the caller passes a `union ibv_gid` (16 bytes, any bit
    // pattern is a valid `raw`).
    Ok(Gid(unsafe { (*gid).raw }))
}

fn mcast_op(
    op: &'static str,
    qp: *mut ibv_qp,
    gid: Gid,
    lid: u16,
    attach: bool,
) -> Result<(), FfiError> {
    let g = Handle::<QpKind>::enter(qp.cast()).ok_or(FfiError::BadHandle { what: "qp" })?;
    let body = g.body().ok_or(FfiError::BadHandle { what: "qp" })?;
    let r = if attach {
        body.qp.attach_mcast(gid, lid)
    } else {
        body.qp.detach_mcast(gid, lid)
    };
    r.map_err(|e| FfiError::Refused {
        op,
        errno: errno_of(&e),
        reason: e.to_string(),
    })
}

/// `ibv_attach_mcast(qp, gid, lid)`: attaches the UD QP to the multicast group `gid`.
///
/// # Safety
/// `gid` is NULL or points to a `union ibv_gid`; `qp` is checked against the registry.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the caller's contract, see above.
        errno_value(
            unsafe { read_gid(gid) }.and_then(|g| mcast_op("ibv_attach_mcast", qp, g, lid, true)),
        )
    })
}

/// `ibv_detach_mcast(qp, gid, lid)`: detaches the QP from the multicast group `gid`.
///
/// # Safety
/// `gid` is NULL or points to a `union ibv_gid`; `qp` is checked against the registry.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    lid: u16,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the caller's contract, see above.
        errno_value(
            unsafe { read_gid(gid) }.and_then(|g| mcast_op("ibv_detach_mcast", qp, g, lid, false)),
        )
    })
}
