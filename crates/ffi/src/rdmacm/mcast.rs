//! Multicast: `rdma_join_multicast`, `rdma_join_multicast_ex`, `rdma_leave_multicast`.

use super::*;

/// Joins `addr` for `id`; a synchronous id waits for the MULTICAST_JOIN event (kept as
/// `id->event`, as librdmacm's).
///
/// # Safety
/// `addr` is NULL or a socket address.
pub(super) unsafe fn join(
    op: &'static str,
    id: *mut rdma_cm_id,
    addr: *const libc::sockaddr,
    send_only: bool,
    context: *mut c_void,
) -> Result<(), FfiError> {
    trace(op, id as usize);
    // SAFETY: caller guarantee.
    let a = unsafe { from_sockaddr(addr) }?.ok_or(FfiError::Invalid("addr is NULL"))?;
    let (r, sync) = id_ref(id)?;
    // Recorded before the join queues its event (delivered under the registry lock); a
    // second join of the group is refused below and leaves the first one's context.
    let earlier = reg().id_mut(id)?.mcast_ctx.insert(a.ip(), context as usize);
    if let Err(e) = r.join_multicast(a.ip(), send_only) {
        if let Ok(e) = reg().id_mut(id) {
            match earlier {
                Some(ctx) => e.mcast_ctx.insert(a.ip(), ctx),
                None => e.mcast_ctx.remove(&a.ip()),
            };
        }
        return Err(cm_error(op, &e));
    }
    if sync {
        let ev = sync_wait(id, EventKind::MulticastJoin)?;
        hold(id, ev)?;
    }
    Ok(())
}

/// `rdma_join_multicast(id, addr, context)`: joins the multicast group `addr` (an IPv4 or
/// IPv6 multicast address) as a full member. On RoCE the MGID is the address as a GID
/// (IPv4-mapped for IPv4), the id's QP, if it has one, is attached to it, and
/// `RDMA_CM_EVENT_MULTICAST_JOIN` reports `param.ud`: an AH attribute to the MGID, QPN
/// 0xFFFFFF and the port space's Q_Key, with `context` as `param.ud.private_data` (length
/// 0), as librdmacm reports it.
///
/// # Safety
/// `addr` is NULL or a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        minus_one(unsafe { join("rdma_join_multicast", id, addr, false, context) })
    })
}

/// `rdma_join_multicast_ex(id, mc_join_attr, context)`: as `rdma_join_multicast`, with
/// join flags (`comp_mask` must have the address and the flags, as librdmacm's):
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`, or `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` (the QP is
/// not attached: it only sends). Other flags, `EINVAL`.
///
/// # Safety
/// `mc_join_attr` is NULL or points to a `struct rdma_cm_join_mc_attr_ex` whose `addr` is
/// NULL or a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if mc_join_attr.is_null() {
                return Err(FfiError::Invalid("mc_join_attr is NULL"));
            }
            // SAFETY: caller guarantee (checked non-NULL).
            let (mask, flags, addr) = unsafe {
                (
                    (*mc_join_attr).comp_mask,
                    (*mc_join_attr).join_flags,
                    (*mc_join_attr).addr,
                )
            };
            let need = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
            if mask & need != need || mask & !need != 0 {
                return Err(FfiError::Invalid("comp_mask needs ADDRESS and JOIN_FLAGS"));
            }
            let send_only = match flags {
                RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
                RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
                _ => return Err(FfiError::Invalid("unknown join flags")),
            };
            // SAFETY: caller guarantee.
            unsafe { join("rdma_join_multicast_ex", id, addr, send_only, context) }
        })())
    })
}

/// `rdma_leave_multicast(id, addr)`: leaves a group the id joined (its QP is detached);
/// `EADDRNOTAVAIL` for a group it has not joined.
///
/// # Safety
/// `addr` is NULL or a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        trace("rdma_leave_multicast", id as usize);
        minus_one((|| {
            // SAFETY: caller guarantee.
            let a = unsafe { from_sockaddr(addr) }?.ok_or(FfiError::Invalid("addr is NULL"))?;
            let (r, _) = id_ref(id)?;
            r.leave_multicast(a.ip())
                .map_err(|e| cm_error("rdma_leave_multicast", &e))?;
            if let Ok(e) = reg().id_mut(id) {
                e.mcast_ctx.remove(&a.ip());
            }
            Ok(())
        })())
    })
}
