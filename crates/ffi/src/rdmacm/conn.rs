//! Connections and events: `rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`,
//! `rdma_disconnect`, `rdma_establish`, `rdma_get_cm_event`, `rdma_ack_cm_event`,
//! `rdma_event_str`.

use super::*;

/// `rdma_listen(id, backlog)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard(-1, || {
        trace("rdma_listen", id as usize);
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            r.listen(u32::try_from(backlog).unwrap_or(0))
                .map_err(|e| cm_error("rdma_listen", &e))
        })())
    })
}

/// `rdma_connect` / `rdma_accept`: the step `start` on the id, then, for an id without an
/// event channel (synchronous), the wait for ESTABLISHED and its acknowledgement.
pub(super) fn establishing(
    id: *mut rdma_cm_id,
    name: &'static str,
    start: impl FnOnce(&CmIdRef) -> Result<(), CmError>,
) -> Result<(), FfiError> {
    trace(name, id as usize);
    let (r, sync) = id_ref(id)?;
    start(&r).map_err(|e| cm_error(name, &e))?;
    if sync {
        // `id->event` stays: rdma_xclient reads the accept's private data from it.
        let ev = sync_wait(id, EventKind::Established)?;
        hold(id, ev)?;
    }
    Ok(())
}

/// `rdma_connect(id, conn_param)`.
///
/// # Safety
/// `param` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_connect(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        minus_one(establishing(id, "rdma_connect", |r| {
            r.connect(&conn_param_from_c(param))
        }))
    })
}

/// `rdma_accept(id, conn_param)`.
///
/// # Safety
/// `param` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_accept(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        minus_one(establishing(id, "rdma_accept", |r| {
            r.accept(&conn_param_from_c(param))
        }))
    })
}

/// `rdma_reject(id, private_data, len)`.
///
/// # Safety
/// `data` is NULL or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_reject(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    guard(-1, || {
        trace("rdma_reject", id as usize);
        minus_one((|| {
            let pd = if data.is_null() || len == 0 {
                Vec::new()
            } else {
                // SAFETY: caller guarantee.
                unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
            };
            let (r, _) = id_ref(id)?;
            r.reject(&pd).map_err(|e| cm_error("rdma_reject", &e))
        })())
    })
}

/// `rdma_disconnect(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        trace("rdma_disconnect", id as usize);
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            r.disconnect().map_err(|e| cm_error("rdma_disconnect", &e))
        })())
    })
}

/// `rdma_establish(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            r.establish().map_err(|e| cm_error("rdma_establish", &e))
        })())
    })
}

/// `rdma_get_cm_event(channel, &event)`: blocks unless the descriptor is `O_NONBLOCK`
/// (then `EAGAIN`); a cancellation point.
///
/// # Safety
/// `event` is writable.
#[no_mangle]
pub unsafe extern "C-unwind" fn uroce_rdmacm_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    blocking_call(-1, || {
        let mut r = reg();
        if event.is_null() {
            return Attempt::Done(minus_one(Err(FfiError::Invalid("event is NULL"))));
        }
        match next_event(&mut r, channel as usize) {
            Ok(Some(p)) => {
                // SAFETY: caller guarantee (checked non-NULL).
                unsafe { *event = p };
                Attempt::Done(0)
            }
            Ok(None) => {
                let c = &r.chans[&(channel as usize)];
                Attempt::Wait {
                    fd: c.ch.fd().as_raw_fd(),
                    keep: Box::new(c.ch.clone()),
                }
            }
            Err(e) => Attempt::Done(minus_one(Err(e))),
        }
    })
}

/// `rdma_ack_cm_event(event)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || minus_one(ack(event)))
}

/// `rdma_event_str(event)`.
#[no_mangle]
pub extern "C" fn uroce_rdmacm_rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static CStr = match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}
