//! Event channels and ids: `rdma_create_event_channel`, `rdma_create_id`, `rdma_destroy_id`,
//! `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route`.

use super::*;

/// `rdma_create_event_channel()`.
#[no_mangle]
pub extern "C" fn uroce_rdmacm_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            let mut r = reg();
            let (cm, _) = r.cm()?;
            r.new_channel(&cm)
        })())
    })
}

/// `rdma_destroy_event_channel(channel)`.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        let e = reg().chans.remove(&(channel as usize));
        drop(e);
    });
}

/// `rdma_create_id(channel, &id, context, ps)`.
///
/// # Safety
/// `id` is a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(-1, || {
        let r = (|| {
            if id.is_null() {
                return Err(FfiError::Invalid("id is NULL"));
            }
            let space = match ps {
                RDMA_PS_TCP => PortSpace::Tcp,
                RDMA_PS_UDP => PortSpace::Udp,
                RDMA_PS_IB => PortSpace::Ib,
                _ => {
                    return Err(FfiError::Unsupported(
                        "port space (only RDMA_PS_TCP, RDMA_PS_UDP and RDMA_PS_IB)",
                    ))
                }
            };
            let mut r = reg();
            let (cm, ctx) = r.cm()?;
            let (chan, sync) = if channel.is_null() {
                (r.new_channel(&cm)?, true)
            } else {
                (channel, false)
            };
            let ch = r
                .chans
                .get(&(chan as usize))
                .ok_or(FfiError::BadHandle {
                    what: "rdma_event_channel",
                })?
                .ch
                .clone();
            let new = cm
                .create_id(&ch, space)
                .map_err(|e| cm_error("rdma_create_id", &e))?;
            let p = r.add_id(new, chan, context, sync, ctx);
            if let Some(e) = r.ids.get_mut(&(p as usize)) {
                e.own_chan = sync;
            }
            // SAFETY: caller guarantee: writable (checked non-NULL).
            unsafe { *id = p };
            Ok(())
        })();
        minus_one(r)
    })
}

/// Frees what the library made for the id (QP, CQs, channels, PD) and the id.
pub(super) fn destroy_id(id: *mut rdma_cm_id) -> Result<(), FfiError> {
    let e = {
        let mut r = reg();
        let e = r
            .ids
            .remove(&(id as usize))
            .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
        r.by_token.remove(&e.id.token());
        e
    };
    let raw = e.raw.ptr();
    let IdEntry {
        raw: craw,
        id: rid,
        chan,
        sync,
        own_chan,
        owned,
        ep_qp_attr,
        held,
        mcast_ctx,
    } = e;
    if let Err((back, err)) = rid.destroy() {
        // Put it back: the application must acknowledge its events first.
        let mut r = reg();
        r.by_token.insert(back.token(), raw as usize);
        r.ids.insert(
            raw as usize,
            IdEntry {
                raw: craw,
                id: back,
                chan,
                sync,
                own_chan,
                owned,
                ep_qp_attr,
                held,
                mcast_ctx,
            },
        );
        return Err(cm_error("rdma_destroy_id", &err));
    }
    // SAFETY: `raw` is the id just removed from the registry, still allocated (`craw`).
    let c = unsafe { &mut *raw };
    drop(held);
    // CQs and channels this library created on the id's context.
    if owned.send_cq {
        destroy_cq_pair(c.send_cq, c.send_cq_channel);
    }
    if owned.recv_cq {
        destroy_cq_pair(c.recv_cq, c.recv_cq_channel);
    }
    if owned.pd {
        // A PD this library allocated.
        crate::entry::ignore(crate::pd::dealloc_pd(c.pd));
    }
    if own_chan {
        let ch = reg().chans.remove(&chan);
        drop(ch);
    }
    drop(craw);
    Ok(())
}

/// `rdma_destroy_id(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        trace("rdma_destroy_id", id as usize);
        minus_one(destroy_id(id))
    })
}

/// `rdma_bind_addr(id, addr)`: the unspecified address means the device's.
///
/// # Safety
/// `addr` points to a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        trace("rdma_bind_addr", id as usize);
        minus_one((|| {
            // SAFETY: caller guarantee.
            let a = unsafe { from_sockaddr(addr) }?.ok_or(FfiError::Invalid("addr is NULL"))?;
            let (cm, _) = reg().cm()?;
            let a = if a.ip().is_unspecified() {
                let ip = cm
                    .device_addrs()
                    .into_iter()
                    .find(|d| d.is_ipv4() == a.is_ipv4())
                    .ok_or(FfiError::Unsupported("no device of that address family"))?;
                SocketAddr::new(ip, a.port())
            } else {
                a
            };
            let (r, _) = id_ref(id)?;
            r.bind_addr(a).map_err(|e| cm_error("rdma_bind_addr", &e))?;
            after_call(id);
            Ok(())
        })())
    })
}

/// `rdma_resolve_addr(id, src, dst, timeout_ms)`.
///
/// # Safety
/// `src` is NULL or a socket address, `dst` a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        trace("rdma_resolve_addr", id as usize);
        minus_one((|| {
            // SAFETY: caller guarantee.
            let s = unsafe { from_sockaddr(src) }?;
            // SAFETY: caller guarantee.
            let d = unsafe { from_sockaddr(dst) }?.ok_or(FfiError::Invalid("dst is NULL"))?;
            let (r, sync) = id_ref(id)?;
            let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(2000));
            r.resolve_addr(s, d, t)
                .map_err(|e| cm_error("rdma_resolve_addr", &e))?;
            after_call(id);
            if sync {
                let ev = sync_wait(id, EventKind::AddrResolved)?;
                hold(id, ev)?;
            }
            Ok(())
        })())
    })
}

/// `rdma_resolve_route(id, timeout_ms)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            let (r, sync) = id_ref(id)?;
            let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(2000));
            r.resolve_route(t)
                .map_err(|e| cm_error("rdma_resolve_route", &e))?;
            if sync {
                let ev = sync_wait(id, EventKind::RouteResolved)?;
                hold(id, ev)?;
            }
            Ok(())
        })())
    })
}
