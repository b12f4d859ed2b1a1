//! Options of an id: enhanced connection establishment (`rdma_set_local_ece`,
//! `rdma_get_remote_ece`) and `rdma_set_option`.

use super::*;

/// The checks rdma-core's ECE calls make: an id of this library without a QP of its own
/// (ECE is for external QPs) and a non-NULL `ece`.
pub(super) fn ece_id(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
    op: &'static str,
) -> Result<(), FfiError> {
    if ece.is_null() {
        return Err(FfiError::Invalid(op));
    }
    let r = reg();
    let e = r.id(id)?;
    // SAFETY: live id (lock held).
    if !unsafe { (*e.raw.ptr()).qp }.is_null() {
        return Err(FfiError::Invalid(op));
    }
    Ok(())
}

/// `rdma_set_local_ece(id, ece)`: accepted for an id without QP; uroce's CM carries no ECE
/// in its REQ/REP, so the options are not sent (the peer reads none).
///
/// # Safety
/// `ece` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard(-1, || {
        minus_one(ece_id(
            id,
            ece,
            "rdma_set_local_ece: ece is NULL or the id has a QP",
        ))
    })
}

/// `rdma_get_remote_ece(id, ece)`: the peer's ECE, which uroce's CM does not carry: vendor
/// 0, no options (what rdma-core reports for a peer without ECE).
///
/// # Safety
/// `ece` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard(-1, || {
        minus_one(
            ece_id(
                id,
                ece,
                "rdma_get_remote_ece: ece is NULL or the id has a QP",
            )
            .map(|()| {
                // SAFETY: non-NULL (checked), writable per the caller's contract.
                unsafe {
                    ece.write(ibv_ece {
                        vendor_id: 0,
                        options: 0,
                        comp_mask: 0,
                    })
                };
            }),
        )
    })
}

/// `rdma_set_option(id, level, optname, optval, optlen)`: `RDMA_OPTION_ID_ACK_TIMEOUT`
/// sets the local ACK timeout of the id's QP (on either side, as the kernel's CM); the
/// other options (type of service, reuse address, IPv6 only, IB paths) are accepted and
/// ignored.
///
/// # Safety
/// `optval` is NULL or readable for `optlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    /// `RDMA_OPTION_ID` / `RDMA_OPTION_ID_ACK_TIMEOUT` (`<rdma/rdma_cma.h>`).
    const RDMA_OPTION_ID: c_int = 0;
    const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
    guard(-1, || {
        if level != RDMA_OPTION_ID || optname != RDMA_OPTION_ID_ACK_TIMEOUT {
            return 0;
        }
        minus_one((|| {
            if optval.is_null() || optlen != 1 {
                return Err(FfiError::Invalid(
                    "rdma_set_option(ACK_TIMEOUT): optval must be one uint8_t",
                ));
            }
            let (r, _) = id_ref(id)?;
            // SAFETY: `optval` is non-NULL and points to `optlen` = 1 readable byte
            // (caller contract).
            let timeout = unsafe { optval.cast::<u8>().read() };
            r.set_ack_timeout(timeout);
            Ok(())
        })())
    })
}

/// Reads the text `s` (NULL: `None`).
///
/// # Safety
/// `s` is NULL or a NUL-terminated string.
pub(super) unsafe fn opt_str<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        None
    } else {
        // SAFETY: caller guarantee.
        unsafe { CStr::from_ptr(s) }.to_str().ok()
    }
}
