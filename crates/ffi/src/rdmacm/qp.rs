//! The verbs objects of an id: `rdma_create_qp(_ex)`, `rdma_create_srq(_ex)` and their
//! destruction, with the CQs and completion channels this library makes for them.

use super::*;

/// Destroys a CQ and its completion channel this library made (either may be NULL).
/// Both are NULL or objects of this library that nothing else uses any more (pointers the
/// registry does not know are refused, never dereferenced).
pub(super) fn destroy_cq_pair(cq: *mut ibv_cq, ch: *mut ibv_comp_channel) {
    if !cq.is_null() {
        crate::entry::ignore(crate::cq::destroy_cq(cq));
    }
    if !ch.is_null() {
        crate::entry::ignore(crate::cq::destroy_comp_channel(ch));
    }
}

/// A CQ of `size` entries with its own completion channel, its context the id (as
/// librdmacm makes them when the caller gives none).
pub(super) fn make_cq(
    verbs: *mut ibv_context,
    size: u32,
    id: *mut rdma_cm_id,
) -> Result<(*mut ibv_cq, *mut ibv_comp_channel), FfiError> {
    let ch = crate::cq::create_comp_channel(verbs).map_err(|e| {
        crate::entry::report(&e);
        FfiError::Invalid("cannot create a completion channel for the id")
    })?;
    let cq = crate::cq::create_cq(
        verbs,
        c_int::try_from(size.max(1)).unwrap_or(1),
        id.cast(),
        ch,
        0,
        0,
        std::ptr::null_mut(),
    );
    match cq {
        Ok(cq) => Ok((cq.cast(), ch)),
        Err(e) => {
            crate::entry::report(&e);
            // The channel just made, unused.
            destroy_cq_pair(std::ptr::null_mut(), ch);
            Err(FfiError::Invalid("cannot create a CQ for the id"))
        }
    }
}

/// The process's XRC domain for ids (librdmacm opens one per device: `fd` -1,
/// `O_CREAT`), opened on first need and kept.
pub(super) fn ids_xrcd(verbs: *mut ibv_context) -> Result<*mut ibv_xrcd, FfiError> {
    let mut r = reg();
    if r.xrcd != 0 {
        return Ok(r.xrcd as *mut ibv_xrcd);
    }
    let mut a = ibv_xrcd_init_attr {
        comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: `verbs` is this library's context; `a` a readable attribute struct.
    let x = unsafe { crate::xrc::open_xrcd(verbs, &mut a) }
        .map_err(|e| refused_by_verbs("opening the ids' XRC domain", "ibv_open_xrcd failed", &e))?;
    r.xrcd = x as usize;
    Ok(x)
}

/// A verbs call's refusal as the CM call `op` reports it: the verbs call's `errno`, its
/// reason reported under `UROCE_DEBUG` (as the exported verbs function would report it).
fn refused_by_verbs(op: &'static str, reason: &'static str, e: &FfiError) -> FfiError {
    crate::entry::report(e);
    FfiError::Refused {
        op,
        errno: e.errno(),
        reason: reason.into(),
    }
}

pub(super) fn einval(op: &'static str, reason: &str) -> FfiError {
    FfiError::Refused {
        op,
        errno: libc::EINVAL,
        reason: reason.into(),
    }
}

/// The id's C struct (live while the application does not destroy the id).
pub(super) fn id_raw(id: *mut rdma_cm_id) -> Result<*mut rdma_cm_id, FfiError> {
    Ok(reg().id(id)?.raw.ptr())
}

/// `rdma_create_qp_ex`'s work: the id's QP through this library's `ibv_create_qp_ex`
/// (XRC_RECV: in the process's XRC domain), with CQs and channels for what the caller
/// and the id give none of, and a PD when neither has one; bound to the id. On a
/// `RDMA_PS_IB` id the attributes' QP type (RC, XRC_SEND, XRC_RECV) becomes the id's;
/// on TCP / UDP ids the port space's type is used.
pub(super) fn create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> Result<(), FfiError> {
    const OP: &str = "rdma_create_qp_ex";
    if attr.is_null() {
        return Err(FfiError::Invalid("qp_init_attr is NULL"));
    }
    let (rid, _) = id_ref(id)?;
    let c = id_raw(id)?;
    // SAFETY: live id of the registry.
    let cur = unsafe { &*c };
    if !cur.qp.is_null() {
        return Err(einval(OP, "the id has a QP"));
    }
    // SAFETY: caller guarantee: readable (checked non-NULL).
    let mut a = unsafe { attr.read() };
    if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 && !a.pd.is_null() {
        // SAFETY: a PD of the application (this library's).
        if unsafe { (*a.pd).context } != cur.verbs {
            return Err(einval(OP, "the PD is not of the id's context"));
        }
    } else {
        a.pd = cur.pd;
    }
    if (!cur.recv_cq.is_null() && !a.recv_cq.is_null() && cur.recv_cq != a.recv_cq)
        || (!cur.send_cq.is_null() && !a.send_cq.is_null() && cur.send_cq != a.send_cq)
    {
        return Err(einval(OP, "CQs other than the id's"));
    }
    if cur.ps == RDMA_PS_IB {
        if !matches!(a.qp_type, IBV_QPT_RC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV) {
            return Err(einval(
                OP,
                "RDMA_PS_IB ids take RC, XRC_SEND or XRC_RECV QPs",
            ));
        }
    } else {
        a.qp_type = cur.qp_type;
    }
    let qpt = a.qp_type;
    if qpt == IBV_QPT_XRC_RECV && (a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null()) {
        a.xrcd = ids_xrcd(cur.verbs)?;
        a.comp_mask |= IBV_QP_INIT_ATTR_XRCD;
    }
    // What this call makes, undone on failure.
    let mut made = Owned::default();
    let mut pd = a.pd;
    let (mut scq, mut sch) = (cur.send_cq, cur.send_cq_channel);
    let (mut rcq, mut rch) = (cur.recv_cq, cur.recv_cq_channel);
    let undo = |made: Owned,
                pd,
                s: (*mut ibv_cq, *mut ibv_comp_channel),
                r: (*mut ibv_cq, *mut ibv_comp_channel)| {
        // Objects this call made, not handed out.
        if made.send_cq {
            destroy_cq_pair(s.0, s.1);
        }
        if made.recv_cq {
            destroy_cq_pair(r.0, r.1);
        }
        if made.pd {
            crate::entry::ignore(crate::pd::dealloc_pd(pd));
        }
    };
    let r = (|| {
        if pd.is_null() {
            pd = crate::pd::alloc_pd(cur.verbs).map_err(|e| {
                crate::entry::report(&e);
                FfiError::Invalid("cannot allocate a PD for the id")
            })?;
            made.pd = true;
        }
        if qpt != IBV_QPT_XRC_RECV {
            if a.send_cq.is_null() && scq.is_null() {
                (scq, sch) = make_cq(cur.verbs, a.cap.max_send_wr, id)?;
                made.send_cq = true;
            }
            // An XRC initiator has no receive side.
            if qpt != IBV_QPT_XRC_SEND && a.recv_cq.is_null() && rcq.is_null() {
                (rcq, rch) = make_cq(cur.verbs, a.cap.max_recv_wr, id)?;
                made.recv_cq = true;
            }
        }
        if a.send_cq.is_null() {
            a.send_cq = scq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = rcq;
        }
        if a.srq.is_null() {
            a.srq = cur.srq;
        }
        a.pd = pd;
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        // Inline data at least as large as the send SGEs (16 bytes each, up to 64 bytes, far
        // below the device's limit), what the kernel's Soft-RoCE grants for such a request:
        // rdma_xclient sends 16 bytes inline on a QP that asked for one SGE and no inline
        // data.
        if qpt != IBV_QPT_XRC_RECV {
            a.cap.max_inline_data = a
                .cap
                .max_inline_data
                .max(a.cap.max_send_sge.saturating_mul(16).min(64));
        }
        // SAFETY: `a` is a valid, writable init attr on this library's objects.
        let qp = unsafe { crate::qp::create_qp_ex(cur.verbs, &mut a) }
            .map_err(|e| refused_by_verbs(OP, "ibv_create_qp_ex failed", &e))?;
        let bound = qp_ref(qp).and_then(|(q, _)| rid.bind_qp(&q).map_err(|e| cm_error(OP, &e)));
        if let Err(e) = bound {
            crate::entry::ignore(crate::qp::destroy_qp(qp));
            return Err(e);
        }
        Ok(qp)
    })();
    let qp = match r {
        Ok(qp) => qp,
        Err(e) => {
            undo(made, pd, (scq, sch), (rcq, rch));
            return Err(e);
        }
    };
    // SAFETY: caller guarantee: writable.
    unsafe { attr.write(a) };
    let mut g = reg();
    let e = g
        .ids
        .get_mut(&(id as usize))
        .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
    e.owned.pd |= made.pd;
    e.owned.send_cq |= made.send_cq;
    e.owned.recv_cq |= made.recv_cq;
    // SAFETY: live id (lock held).
    unsafe {
        (*c).qp = qp;
        (*c).pd = pd;
        (*c).qp_type = qpt;
        (*c).send_cq = scq;
        (*c).send_cq_channel = sch;
        (*c).recv_cq = rcq;
        (*c).recv_cq_channel = rch;
    }
    Ok(())
}

/// `rdma_create_qp`'s work: [`create_qp_ex`] on the same attributes with `pd` (or the
/// id's PD); the granted attributes are written back.
pub(super) fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), FfiError> {
    if attr.is_null() {
        return Err(FfiError::Invalid("qp_init_attr is NULL"));
    }
    // SAFETY: caller guarantee: readable (checked non-NULL).
    let a = unsafe { attr.read() };
    // SAFETY: ibv_qp_init_attr_ex is pointers and integers: valid zeroed.
    let mut x: ibv_qp_init_attr_ex = unsafe { zeroed() };
    x.qp_context = a.qp_context;
    x.send_cq = a.send_cq;
    x.recv_cq = a.recv_cq;
    x.srq = a.srq;
    x.cap = a.cap;
    x.qp_type = a.qp_type;
    x.sq_sig_all = a.sq_sig_all;
    x.comp_mask = IBV_QP_INIT_ATTR_PD;
    x.pd = pd;
    create_qp_ex(id, &mut x)?;
    // SAFETY: caller guarantee: writable.
    unsafe {
        attr.write(ibv_qp_init_attr {
            qp_context: x.qp_context,
            send_cq: x.send_cq,
            recv_cq: x.recv_cq,
            srq: x.srq,
            cap: x.cap,
            qp_type: x.qp_type,
            sq_sig_all: x.sq_sig_all,
        })
    };
    Ok(())
}

/// `rdma_create_qp(id, pd, qp_init_attr)`.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || minus_one(create_qp(id, pd, attr)))
}

/// `rdma_create_qp_ex(id, qp_init_attr_ex)`: see `create_qp_ex`.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || minus_one(create_qp_ex(id, attr)))
}

/// `rdma_create_srq_ex`'s work (librdmacm's rules): the id's PD when none is given; an
/// XRC SRQ in the process's XRC domain completing into the id's receive CQ (made when the
/// id has none); the SRQ becomes `id->srq`.
pub(super) fn create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> Result<(), FfiError> {
    const OP: &str = "rdma_create_srq_ex";
    if attr.is_null() {
        return Err(FfiError::Invalid("srq_init_attr is NULL"));
    }
    let c = id_raw(id)?;
    // SAFETY: live id of the registry.
    let cur = unsafe { &*c };
    // SAFETY: caller guarantee: readable (checked non-NULL).
    let mut a = unsafe { attr.read() };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return Err(einval(OP, "no SRQ type"));
    }
    let mut made = Owned::default();
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = cur.pd;
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if a.pd.is_null() {
        a.pd = crate::pd::alloc_pd(cur.verbs).map_err(|e| {
            crate::entry::report(&e);
            FfiError::Invalid("cannot allocate a PD for the id")
        })?;
        made.pd = true;
    }
    let (mut rcq, mut rch) = (cur.recv_cq, cur.recv_cq_channel);
    let r = (|| {
        if a.srq_type == IBV_SRQT_XRC {
            if a.comp_mask & IBV_SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
                a.xrcd = ids_xrcd(cur.verbs)?;
            }
            if a.comp_mask & IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
                if rcq.is_null() {
                    (rcq, rch) = make_cq(cur.verbs, a.attr.max_wr, id)?;
                    made.recv_cq = true;
                }
                a.cq = rcq;
            }
            a.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
        }
        // SAFETY: `a` is a valid, writable init attr on this library's objects.
        unsafe { crate::xrc::create_srq_ex(cur.verbs, &mut a) }
            .map_err(|e| refused_by_verbs(OP, "ibv_create_srq_ex failed", &e))
    })();
    let srq = match r {
        Ok(s) => s,
        Err(e) => {
            if made.recv_cq {
                // Objects this call made, not handed out.
                destroy_cq_pair(rcq, rch);
            }
            if made.pd {
                crate::entry::ignore(crate::pd::dealloc_pd(a.pd));
            }
            return Err(e);
        }
    };
    // SAFETY: caller guarantee: writable.
    unsafe { attr.write(a) };
    let mut g = reg();
    let e = g
        .ids
        .get_mut(&(id as usize))
        .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
    e.owned.pd |= made.pd;
    e.owned.recv_cq |= made.recv_cq;
    // SAFETY: live id (lock held).
    unsafe {
        if (*c).pd.is_null() {
            (*c).pd = a.pd;
        }
        (*c).srq = srq;
        (*c).recv_cq = rcq;
        (*c).recv_cq_channel = rch;
    }
    Ok(())
}

/// `rdma_create_srq_ex(id, attr)`: see `create_srq_ex`.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard(-1, || minus_one(create_srq_ex(id, attr)))
}

/// `rdma_create_srq(id, pd, attr)`: an XRC SRQ on an XRC_RECV id, a basic one otherwise.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if attr.is_null() {
                return Err(FfiError::Invalid("srq_init_attr is NULL"));
            }
            let c = id_raw(id)?;
            // SAFETY: caller guarantee: readable (checked non-NULL).
            let a = unsafe { attr.read() };
            // SAFETY: ibv_srq_init_attr_ex is pointers and integers: valid zeroed.
            let mut x: ibv_srq_init_attr_ex = unsafe { zeroed() };
            x.srq_context = a.srq_context;
            x.attr = a.attr;
            x.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
            // SAFETY: live id.
            x.srq_type = if unsafe { (*c).qp_type } == IBV_QPT_XRC_RECV {
                IBV_SRQT_XRC
            } else {
                IBV_SRQT_BASIC
            };
            x.pd = pd;
            create_srq_ex(id, &mut x)?;
            // SAFETY: caller guarantee: writable.
            unsafe {
                attr.write(ibv_srq_init_attr {
                    srq_context: x.srq_context,
                    attr: x.attr,
                })
            };
            Ok(())
        })())
    })
}

/// `rdma_destroy_srq(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok(c) = id_raw(id) else { return };
        // SAFETY: live id.
        let srq = unsafe { std::mem::replace(&mut (*c).srq, std::ptr::null_mut()) };
        if !srq.is_null() {
            // The id's SRQ, made by this library.
            crate::entry::ignore(crate::srq::destroy_srq(srq));
        }
    });
}

/// `rdma_destroy_qp(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok((r, _)) = id_ref(id) else { return };
        let _ = r.destroy_qp();
        let qp = {
            let g = reg();
            let Ok(e) = g.id(id) else { return };
            let c = e.raw.ptr();
            // SAFETY: live id (lock held).
            unsafe { std::mem::replace(&mut (*c).qp, std::ptr::null_mut()) }
        };
        if !qp.is_null() {
            // The id's QP, created by this library.
            crate::entry::ignore(crate::qp::destroy_qp(qp));
        }
    });
}
