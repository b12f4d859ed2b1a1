//! Address resolution and the endpoint API: `rdma_getaddrinfo`, `rdma_create_ep`,
//! `rdma_get_request`, and the remaining id calls (ports, devices, `rdma_migrate_id`,
//! `rdma_notify`, `rdma_init_qp_attr`).

use super::*;

/// `rdma_getaddrinfo(node, service, hints, &res)`: IP literals and names the system
/// resolver knows; one entry.
///
/// # Safety
/// `node`, `service` NULL or strings; `hints` NULL or readable; `res` writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if res.is_null() {
                return Err(FfiError::Invalid("res is NULL"));
            }
            // SAFETY: caller guarantee.
            let (node, service) = unsafe { (opt_str(node), opt_str(service)) };
            let port: u16 = match service {
                None => 0,
                Some(s) => s
                    .parse()
                    .map_err(|_| FfiError::Invalid("service must be a port number"))?,
            };
            let (flags, ps, qpt, hint_src, hint_dst) = if hints.is_null() {
                (0, RDMA_PS_TCP, IBV_QPT_RC as c_int, None, None)
            } else {
                // SAFETY: caller guarantee: readable hints.
                let h = unsafe { &*hints };
                // SAFETY: the hints' addresses are NULL or socket addresses.
                let (s, d) =
                    unsafe { (from_sockaddr(h.ai_src_addr)?, from_sockaddr(h.ai_dst_addr)?) };
                let ps = if h.ai_port_space != 0 {
                    h.ai_port_space
                } else if h.ai_qp_type == IBV_QPT_UD as c_int {
                    RDMA_PS_UDP
                } else {
                    RDMA_PS_TCP
                };
                let qpt = if h.ai_qp_type != 0 {
                    h.ai_qp_type
                } else if ps == RDMA_PS_UDP {
                    IBV_QPT_UD as c_int
                } else {
                    IBV_QPT_RC as c_int
                };
                (h.ai_flags, ps, qpt, s, d)
            };
            let ip = match node {
                None => None,
                Some(n) => Some(match n.parse::<IpAddr>() {
                    Ok(ip) => ip,
                    Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(n, port))
                        .ok()
                        .and_then(|mut a| a.next())
                        .map(|a| a.ip())
                        .ok_or(FfiError::Refused {
                            op: "rdma_getaddrinfo",
                            errno: libc::ENODEV,
                            reason: format!("cannot resolve {n}"),
                        })?,
                }),
            };
            // A hint's address keeps its own port unless `service` names one (libfabric's
            // verbs provider passes the peer's or its own address, port included, as
            // hints with neither node nor service).
            let with_service = |a: SocketAddr| match service {
                Some(_) => SocketAddr::new(a.ip(), port),
                None => a,
            };
            let (src, dst) = if flags & RAI_PASSIVE != 0 {
                let src = match (ip, hint_src) {
                    (Some(ip), _) => SocketAddr::new(ip, port),
                    (None, Some(h)) => with_service(h),
                    (None, None) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
                };
                (Some(src), None)
            } else if let Some(ip) = ip {
                (hint_src, Some(SocketAddr::new(ip, port)))
            } else if let Some(d) = hint_dst {
                (hint_src, Some(with_service(d)))
            } else if hint_src.is_some() {
                // No node and no destination: the source of the hints alone, as
                // librdmacm's (pyverbs' `AddrInfo(src=…)` names a multicast group so).
                (hint_src, None)
            } else {
                return Err(FfiError::Invalid("no node for an active rdma_getaddrinfo"));
            };
            let family = match src.or(dst) {
                Some(SocketAddr::V6(_)) => libc::AF_INET6,
                _ => libc::AF_INET,
            };
            let len_of = |a: &SocketAddr| -> libc::socklen_t {
                let n = if a.is_ipv4() {
                    std::mem::size_of::<libc::sockaddr_in>()
                } else {
                    std::mem::size_of::<libc::sockaddr_in6>()
                };
                libc::socklen_t::try_from(n).unwrap_or(0)
            };
            let mut src_box = src.map(|a| Box::new(to_storage(a)));
            let mut dst_box = dst.map(|a| Box::new(to_storage(a)));
            let ai = rdma_addrinfo {
                ai_flags: flags,
                ai_family: family,
                ai_qp_type: qpt,
                ai_port_space: ps,
                ai_src_len: src.as_ref().map_or(0, len_of),
                ai_dst_len: dst.as_ref().map_or(0, len_of),
                ai_src_addr: src_box.as_deref_mut().map_or(std::ptr::null_mut(), |s| {
                    (s as *mut libc::sockaddr_storage).cast()
                }),
                ai_dst_addr: dst_box.as_deref_mut().map_or(std::ptr::null_mut(), |s| {
                    (s as *mut libc::sockaddr_storage).cast()
                }),
                ai_src_canonname: std::ptr::null_mut(),
                ai_dst_canonname: std::ptr::null_mut(),
                ai_route_len: 0,
                ai_route: std::ptr::null_mut(),
                ai_connect_len: 0,
                ai_connect: std::ptr::null_mut(),
                ai_next: std::ptr::null_mut(),
            };
            let raw = CBox::new(ai);
            let p = raw.ptr();
            reg().addrinfos.insert(
                p as usize,
                AddrInfoEntry {
                    _raw: raw,
                    _src: src_box,
                    _dst: dst_box,
                },
            );
            // SAFETY: caller guarantee (checked non-NULL).
            unsafe { *res = p };
            Ok(())
        })())
    })
}

/// `rdma_freeaddrinfo(res)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let e = reg().addrinfos.remove(&(res as usize));
        drop(e);
    });
}

/// `rdma_create_ep(&id, res, pd, qp_init_attr)`: a synchronous id, bound (passive) or
/// resolved (active), with a QP when attributes are given (a listener keeps them for
/// `rdma_get_request`).
///
/// # Safety
/// `id` writable; `res` a readable `rdma_addrinfo`; `attr` NULL or readable/writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if id.is_null() || res.is_null() {
                return Err(FfiError::Invalid("id or res is NULL"));
            }
            // SAFETY: caller guarantee: readable addrinfo.
            let ai = unsafe { &*res };
            let mut p = std::ptr::null_mut();
            // SAFETY: `p` is writable.
            let rc = unsafe {
                uroce_rdmacm_rdma_create_id(
                    std::ptr::null_mut(),
                    &mut p,
                    std::ptr::null_mut(),
                    ai.ai_port_space,
                )
            };
            if rc != 0 {
                return Err(FfiError::Invalid("rdma_create_id failed"));
            }
            let made = p;
            let fail = move |e: FfiError| {
                let _ = destroy_id(made);
                e
            };
            let qpt = match ai.ai_qp_type {
                0 => None,
                t => Some(
                    u32::try_from(t)
                        .ok()
                        .filter(|t| {
                            matches!(
                                *t,
                                IBV_QPT_RC | IBV_QPT_UD | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV
                            )
                        })
                        .ok_or_else(|| fail(einval("rdma_create_ep", "QP type")))?,
                ),
            };
            // SAFETY: live id just made.
            unsafe {
                if !pd.is_null() {
                    (*p).pd = pd;
                }
                if let Some(t) = qpt {
                    (*p).qp_type = t;
                }
            }
            // librdmacm creates the endpoint's QP with the addrinfo's type.
            let attr_typed = |attr: *mut ibv_qp_init_attr| {
                if let Some(t) = qpt {
                    // SAFETY: caller guarantee: writable (checked non-NULL by the caller).
                    unsafe { (*attr).qp_type = t };
                }
            };
            if ai.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the addrinfo's source address.
                if unsafe { uroce_rdmacm_rdma_bind_addr(p, ai.ai_src_addr) } != 0 {
                    return Err(fail(FfiError::Invalid("rdma_bind_addr failed")));
                }
                if !attr.is_null() {
                    attr_typed(attr);
                    // SAFETY: caller guarantee: readable.
                    let a = unsafe { attr.read() };
                    if let Some(e) = reg().ids.get_mut(&(p as usize)) {
                        e.ep_qp_attr = Some(QpAttrs(a));
                    }
                }
            } else {
                // SAFETY: the addrinfo's addresses.
                if unsafe {
                    uroce_rdmacm_rdma_resolve_addr(p, ai.ai_src_addr, ai.ai_dst_addr, 2000)
                } != 0
                {
                    return Err(fail(FfiError::Invalid("rdma_resolve_addr failed")));
                }
                // SAFETY: live id.
                if unsafe { uroce_rdmacm_rdma_resolve_route(p, 2000) } != 0 {
                    return Err(fail(FfiError::Invalid("rdma_resolve_route failed")));
                }
                if !attr.is_null() {
                    attr_typed(attr);
                    create_qp(p, pd, attr).map_err(fail)?;
                }
            }
            // SAFETY: caller guarantee (checked non-NULL).
            unsafe { *id = p };
            Ok(())
        })())
    })
}

/// `rdma_destroy_ep(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: forwarded.
        unsafe {
            uroce_rdmacm_rdma_destroy_qp(id);
            uroce_rdmacm_rdma_destroy_srq(id);
        }
        let _ = destroy_id(id);
    });
}

/// `rdma_get_request(listen, &id)`: the next connection request of a synchronous
/// listener, with a QP when the listener was made with QP attributes.
///
/// # Safety
/// `id` writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if id.is_null() {
                return Err(FfiError::Invalid("id is NULL"));
            }
            let (attr, pd) = {
                let r = reg();
                let e = r.id(listen)?;
                if !e.sync {
                    return Err(FfiError::Invalid(
                        "rdma_get_request needs a synchronous listener",
                    ));
                }
                // SAFETY: live id (lock held).
                (e.ep_qp_attr, unsafe { (*e.raw.ptr()).pd })
            };
            let ev = sync_wait(listen, EventKind::ConnectRequest)?;
            // SAFETY: a live event of the registry.
            let new = unsafe { (*ev).id };
            // Its events arrive on the listener's channel (where the Rust id reports);
            // synchronous waits stash what is not theirs.
            if let Some(QpAttrs(mut a)) = attr {
                if let Err(e) = create_qp(new, pd, &mut a) {
                    let _ = ack(ev);
                    return Err(e);
                }
            }
            // SAFETY: caller guarantee (checked non-NULL).
            unsafe { *id = new };
            // The request stays as `new->event` until the next synchronous call or the
            // id's destruction, as in rdma-core.
            hold(new, ev)
        })())
    })
}

/// `rdma_get_src_port(id)` (network order).
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        id_ref(id)
            .ok()
            .and_then(|(r, _)| r.local_addr())
            .map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_dst_port(id)` (network order).
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        id_ref(id)
            .ok()
            .and_then(|(r, _)| r.peer_addr())
            .map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_devices(&num)`: the one context.
///
/// # Safety
/// `num` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            let (_, ctx) = reg().cm()?;
            let list = Box::leak(Box::new([ctx, std::ptr::null_mut()]));
            if !num.is_null() {
                // SAFETY: caller guarantee.
                unsafe { *num = 1 };
            }
            Ok(list.as_mut_ptr())
        })())
    })
}

/// `rdma_free_devices(list)`.
///
/// # Safety
/// `list` from [`uroce_rdmacm_rdma_get_devices`].
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_free_devices(list: *mut *mut ibv_context) {
    if !list.is_null() {
        // SAFETY: the two-element array leaked by rdma_get_devices.
        drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_context; 2]>()) });
    }
}

/// `rdma_migrate_id(id, channel)`: the id's later events, and those not retrieved yet,
/// go to `channel`; NULL makes the id synchronous (a private channel, as librdmacm).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        trace("rdma_migrate_id", id as usize);
        minus_one((|| {
            let old = {
                let mut r = reg();
                let (cm, _) = r.cm()?;
                let e = r.id(id)?;
                let (old_chan, old_own, token) = (e.chan, e.own_chan, e.id.token());
                let (new_chan, sync) = if channel.is_null() {
                    (r.new_channel(&cm)?, true)
                } else {
                    if !r.chans.contains_key(&(channel as usize)) {
                        return Err(FfiError::BadHandle {
                            what: "rdma_event_channel",
                        });
                    }
                    (channel, false)
                };
                if new_chan as usize == old_chan {
                    return Ok(());
                }
                // Events a synchronous wait took off the old channel for this id move too.
                let moved: Vec<Event> = match r.chans.get_mut(&old_chan) {
                    Some(c) => {
                        let (mine, rest): (VecDeque<Event>, VecDeque<Event>) =
                            c.stash.drain(..).partition(|ev| ev.id.token() == token);
                        c.stash = rest;
                        mine.into()
                    }
                    None => Vec::new(),
                };
                let nc = r
                    .chans
                    .get_mut(&(new_chan as usize))
                    .ok_or(FfiError::BadHandle {
                        what: "rdma_event_channel",
                    })?;
                nc.stash.extend(moved);
                let ch = nc.ch.clone();
                let e = r
                    .ids
                    .get_mut(&(id as usize))
                    .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
                e.id.migrate(&ch);
                e.chan = new_chan as usize;
                e.sync = sync;
                e.own_chan = sync;
                // SAFETY: live id (lock held).
                unsafe { (*e.raw.ptr()).channel = new_chan };
                // The old private channel goes unless ids of the listener's requests still
                // report to it (then it stays, unowned, until the process ends).
                if old_own && !r.ids.values().any(|e| e.chan == old_chan) {
                    r.chans.remove(&old_chan)
                } else {
                    None
                }
            };
            drop(old);
            Ok(())
        })())
    })
}

/// `rdma_notify(id, event)`: `IBV_EVENT_COMM_EST` (data arrived on the QP of an accepted
/// connection before the RTU) establishes the connection; `EISCONN` when it is
/// established, `EINVAL` for other ids and other events.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    guard(-1, || {
        trace("rdma_notify", id as usize);
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            if u32::try_from(event).ok() != Some(IBV_EVENT_COMM_EST) {
                return Err(einval(
                    "rdma_notify",
                    "only IBV_EVENT_COMM_EST (no alternate paths)",
                ));
            }
            r.notify_established()
                .map_err(|e| cm_error("rdma_notify", &e))
        })())
    })
}

/// `rdma_init_qp_attr(id, qp_attr, qp_attr_mask)`: for `qp_attr->qp_state` INIT, RTR or
/// RTS, the attributes (all of `*qp_attr`) and mask that move a QP of the id's type to
/// it for the id's connection (see `CmIdRef::qp_attr`), for programs that move the QP
/// themselves (`conn_param.qp_num` without `rdma_create_qp`).
///
/// # Safety
/// `qp_attr` readable and writable; `mask` writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if qp_attr.is_null() || mask.is_null() {
                return Err(FfiError::Invalid("qp_attr or qp_attr_mask is NULL"));
            }
            let (r, _) = id_ref(id)?;
            let c = id_raw(id)?;
            // SAFETY: caller guarantee: readable (checked non-NULL).
            let want = unsafe { (*qp_attr).qp_state };
            let state = uroce_verbs::QpState::from_u32(want)
                .ok_or_else(|| einval("rdma_init_qp_attr", "unknown QP state"))?;
            // SAFETY: live id.
            let t = unsafe { (*c).qp_type };
            let qpt = uroce_verbs::QpType::from_u32(t)
                .ok_or_else(|| einval("rdma_init_qp_attr", "unknown QP type"))?;
            let (a, m) = r
                .qp_attr(qpt, state)
                .map_err(|e| cm_error("rdma_init_qp_attr", &e))?;
            // SAFETY: caller guarantee: writable (checked non-NULL).
            unsafe {
                qp_attr.write(crate::convert::qp_attr_to_c(&a));
                mask.write(c_int::try_from(m.bits()).unwrap_or(0));
            }
            Ok(())
        })())
    })
}
