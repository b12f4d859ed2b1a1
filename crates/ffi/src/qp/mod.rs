//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`,
//! `ibv_qp_to_qp_ex`, `ibv_create_qp_ex` (the `verbs_context.create_qp_ex` slot; its
//! XRC_RECV target QPs are made by [`crate::xrc`]); [`post`]: the posting slots of
//! `ibv_context.ops`; [`ex`]: the `ibv_wr_*` work-request API of `struct ibv_qp_ex`;
//! [`mcast`]: multicast attach/detach. `ibv_open_qp`: [`crate::xrc`].
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure; each exported function is a
//! thin wrapper around an internal one that the library's other modules call.

pub mod ex;
pub mod mcast;
pub mod post;

use std::ffi::c_int;
use std::sync::Arc;

use uroce_verbs::{CreateQpError, QpInitAttr, QpType};

use crate::abi::*;
use crate::async_events::ObjKind;
use crate::convert::*;
use crate::entry::*;
use crate::error::{refused, FfiError};
use crate::handle::{Handle, HandlePtr};
use crate::objects::*;

symver!("uroce_ibv_create_qp", "ibv_create_qp@@IBVERBS_1.1");
symver!("uroce_ibv_modify_qp", "ibv_modify_qp@@IBVERBS_1.1");
symver!("uroce_ibv_query_qp", "ibv_query_qp@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_qp", "ibv_destroy_qp@@IBVERBS_1.1");
symver!("uroce_ibv_qp_to_qp_ex", "ibv_qp_to_qp_ex@@IBVERBS_1.6");

/// `create_qp`'s refusal as the C library reports it: `EOPNOTSUPP` for a QP type no
/// transport engine carries (the verbs layer's typed `UnsupportedType`) or one that needs
/// an XRC domain (XRC_RECV: created with `ibv_create_qp_ex`, see [`crate::xrc`]),
/// `EINVAL` for the rest.
fn create_qp_error(e: CreateQpError) -> FfiError {
    let errno = match e {
        CreateQpError::UnsupportedType(_) | CreateQpError::NeedsXrcDomain(_) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    };
    refused("ibv_create_qp", errno, e)
}

/// `ibv_create_qp(pd, init_attr)`: a QP in RESET of a type the network device has a
/// transport engine for (RC, UC, UD), taking its receive WQEs from `init_attr->srq` when
/// that is set (`init_attr->cap` is updated to the granted sizes: no receive queue of its
/// own with an SRQ); NULL + `errno` (`EINVAL`; `EOPNOTSUPP` for the other QP types).
///
/// # Safety
/// `init_attr` is NULL or points to a readable and writable `struct ibv_qp_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller guarantee.
        ptr_or_null(unsafe { create_qp(pd, init_attr) })
    })
}

/// The body of `ibv_create_qp` (also used by `ibv_create_qp_ex`).
///
/// # Safety
/// `init_attr` is NULL or points to a readable and writable `struct ibv_qp_init_attr`.
pub(crate) unsafe fn create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, FfiError> {
    // SAFETY: forwarded caller guarantee.
    unsafe { create_qp_with_ops(pd, init_attr, None) }
}

/// [`create_qp`] with the `ibv_wr_*` operations to enable (`None`: every one the QP type
/// supports; `Some(flags)`: `ibv_create_qp_ex`'s `send_ops_flags`, refused with
/// `EOPNOTSUPP` if they name operations the type cannot do).
///
/// # Safety
/// As for [`create_qp`].
pub(crate) unsafe fn create_qp_with_ops(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
    send_ops: Option<u64>,
) -> Result<*mut ibv_qp, FfiError> {
    (|| {
        if init_attr.is_null() {
            return Err(FfiError::Invalid("init_attr is NULL"));
        }
        // SAFETY: caller guarantee: readable init_attr (checked non-NULL).
        let ia = unsafe { init_attr.read() };
        let qp_type = QpType::from_u32(ia.qp_type).ok_or(FfiError::Invalid("unknown QP type"))?;
        if let Some(flags) = send_ops {
            crate::qp::ex::check_send_ops(qp_type, flags)?;
        }
        let mut objs = objects();
        let pd_entry = objs.pd(pd)?;
        let send_cq = objs.cq(ia.send_cq)?;
        // An XRC initiator has no receive side: its receive CQ and SRQ are ignored,
        // as the kernel does.
        let xrc_send = qp_type == QpType::XrcSend;
        let recv_cq = if xrc_send {
            None
        } else {
            Some(objs.cq(ia.recv_cq)?)
        };
        let srq = if ia.srq.is_null() || xrc_send {
            None
        } else {
            Some(objs.srq(ia.srq)?)
        };
        let attr = QpInitAttr {
            qp_type,
            send_cq: Some(send_cq),
            recv_cq,
            srq,
            cap: cap_from_c(&ia.cap),
            sq_sig_all: ia.sq_sig_all != 0,
        };
        let qp = pd_entry.pd.create_qp(&attr).map_err(create_qp_error)?;
        let cap = qp.query().1.cap;
        let net = Arc::clone(&pd_entry.net);
        // SAFETY: `pd` is a registered, live PD allocated by uroce (lock held).
        let context = unsafe { (*pd).context };
        // SAFETY: ibv_qp_ex is pointers, integers, `Option` of function pointers and
        // glibc pthread objects, all valid zeroed (the pthread ones are then their static
        // initialisers); `register_qp` fills its `wr_*` functions.
        let mut c: ibv_qp_ex = unsafe { zeroed() };
        let b = &mut c.qp_base;
        b.context = context;
        b.qp_context = ia.qp_context;
        b.pd = pd;
        b.send_cq = ia.send_cq;
        if !xrc_send {
            b.recv_cq = ia.recv_cq;
            b.srq = ia.srq;
        }
        b.handle = qp.qp_num();
        b.qp_num = qp.qp_num();
        b.state = qp.state().as_u32();
        b.qp_type = ia.qp_type;
        let send_ops = send_ops.unwrap_or_else(|| crate::qp::ex::supported_send_ops(qp_type));
        let p = register_qp(&mut objs, c, qp, send_ops, cap.max_inline_data, net);
        // SAFETY: caller guarantee: writable init_attr (checked non-NULL).
        unsafe { (*init_attr).cap = cap_to_c(&cap) };
        Ok(p)
    })()
}

/// Puts `qp` in a container whose C part is `c` and registers it; the `ibv_qp`. Every QP
/// goes through here: `c`'s `wr_*` pointers are filled for `send_ops_flags` (see
/// [`crate::qp::ex::init_ops`]) and the container gets the QP's `ibv_wr_*` builder.
pub(crate) fn register_qp(
    objs: &mut Objects,
    mut c: ibv_qp_ex,
    qp: uroce_verbs::Qp,
    send_ops_flags: u64,
    max_inline: u32,
    net: Arc<uroce_net::NetDevice>,
) -> *mut ibv_qp {
    let (num, context) = (qp.qp_num(), c.qp_base.context);
    crate::qp::ex::init_ops(&mut c, send_ops_flags);
    let builder = crate::qp::ex::WrBuilder::new(qp.qp_type());
    let h = Handle::<QpKind>::create(
        c,
        QpBody {
            qp,
            builder,
            max_inline,
        },
    );
    let p = Handle::c_ptr(h).cast::<ibv_qp>();
    crate::async_events::remember(ObjKind::Qp, num, context, p as usize);
    objs.qps.insert(
        p as usize,
        QpEntry {
            h: HandlePtr(h),
            net,
        },
    );
    p
}

/// `verbs_context.create_qp_ex(context, attr)`: an XRC_RECV QP in `attr->xrcd`
/// (`IBV_QP_INIT_ATTR_XRCD`; no PD, CQs or queues of its own), or any other type on
/// `attr->pd` as `ibv_create_qp` makes it (creation flags are not supported). With
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` the `ibv_wr_*` operations are those of
/// `send_ops_flags`, refused with `EOPNOTSUPP` if the QP type cannot do one of them (see
/// [`crate::qp::ex`]). NULL + `errno`.
///
/// # Safety
/// `attr` is NULL or points to a readable and writable `struct ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn vctx_create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller guarantee.
        ptr_or_null(unsafe { create_qp_ex(context, attr) })
    })
}

/// The body of the `verbs_context.create_qp_ex` slot function [`vctx_create_qp_ex`], for
/// callers inside the library.
///
/// # Safety
/// As for [`vctx_create_qp_ex`].
pub(crate) unsafe fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> Result<*mut ibv_qp, FfiError> {
    if attr.is_null() {
        return Err(FfiError::Invalid("qp_init_attr_ex is NULL"));
    }
    // SAFETY: caller guarantee: readable attr (checked non-NULL).
    let a = unsafe { attr.read() };
    let known = IBV_QP_INIT_ATTR_PD
        | IBV_QP_INIT_ATTR_XRCD
        | IBV_QP_INIT_ATTR_CREATE_FLAGS
        | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0
        || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
    {
        return Err(FfiError::Unsupported(
            "ibv_create_qp_ex with creation flags, TSO, RSS or source QPN",
        ));
    }
    let send_ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
    if a.qp_type == IBV_QPT_XRC_RECV {
        return crate::xrc::create_target_qp(context, &a, send_ops);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        return Err(FfiError::Invalid("ibv_create_qp_ex needs a PD"));
    }
    let mut ia = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: `ia` is a valid, writable ibv_qp_init_attr on our stack.
    let qp = unsafe { crate::qp::create_qp_with_ops(a.pd, &mut ia, send_ops) }?;
    // SAFETY: caller guarantee: writable attr (checked non-NULL).
    unsafe { (*attr).cap = ia.cap };
    Ok(qp)
}

/// `ibv_modify_qp(qp, attr, attr_mask)`: 0 or the errno value (`EINVAL`: unknown QP, bad
/// mask or values, transition not allowed). `qp->state` follows the new state.
///
/// # Safety
/// `attr` is NULL or points to a readable `struct ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if attr.is_null() {
                return Err(FfiError::Invalid("attr is NULL"));
            }
            // SAFETY: caller guarantee: readable attr (checked non-NULL).
            let a = unsafe { attr.read() };
            let (q, mask) = qp_attr_from_c(&a, attr_mask as u32)?;
            let (r, _) = qp_ref(qp)?;
            let mask = crate::xrc::strip_xrc_mask(r.qp_type(), mask);
            let res = r
                .modify(&q, mask)
                .map_err(|e| refused("ibv_modify_qp", libc::EINVAL, e));
            if let Some(g) = Handle::<QpKind>::enter(qp.cast()) {
                // SAFETY: a live QP container (counted in); `state` is the library's to
                // write, the application reads it.
                unsafe { (*Handle::c_ptr(g.handle())).qp_base.state = r.state().as_u32() };
            }
            res
        })())
    })
}

/// `ibv_query_qp(qp, attr, attr_mask, init_attr)`: fills both structures completely
/// (whatever the mask); 0 or the errno value (`EINVAL`). With `IBV_QP_STATE` in the mask
/// `qp->state` is refreshed from the result, as libibverbs does: the QP may have left the
/// state of the last `ibv_modify_qp` on its own (to ERR, after a transport error).
///
/// # Safety
/// `attr` and `init_attr` are NULL or point to writable structures.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if attr.is_null() || init_attr.is_null() {
                return Err(FfiError::Invalid("attr or init_attr is NULL"));
            }
            let g = Handle::<QpKind>::enter(qp.cast()).ok_or(FfiError::BadHandle { what: "qp" })?;
            let (q, info) = g
                .body()
                .ok_or(FfiError::BadHandle { what: "qp" })?
                .qp
                .query();
            let c = Handle::c_ptr(g.handle()).cast::<ibv_qp>();
            // SAFETY: registered, live QP allocated by uroce (lock held); the caller passes
            // writable output structures (checked non-NULL).
            unsafe {
                attr.write(qp_attr_to_c(&q));
                init_attr.write(ibv_qp_init_attr {
                    qp_context: (*c).qp_context,
                    send_cq: (*c).send_cq,
                    recv_cq: (*c).recv_cq,
                    srq: (*c).srq,
                    cap: cap_to_c(&info.cap),
                    qp_type: info.qp_type.as_u32(),
                    sq_sig_all: c_int::from(info.sq_sig_all),
                });
                if attr_mask as u32 & IBV_QP_STATE != 0 {
                    (*c).state = q.qp_state.as_u32();
                }
            }
            Ok(())
        })())
    })
}

/// `ibv_destroy_qp(qp)`: destroys the QP (the verbs layer first sends what it still owes
/// its peer, e.g. a deferred ACK); 0, or the errno value (`EINVAL` unknown QP, `EBUSY`).
/// A handle of an XRC target QP closes just that handle; the last handle's destroy
/// destroys the QP (see `crate::xrc::destroy_target_handle`).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || errno_value(destroy_qp(qp)))
}

/// The body of `ibv_destroy_qp` (the exported [`uroce_ibv_destroy_qp`]), for callers inside
/// the library.
pub(crate) fn destroy_qp(qp: *mut ibv_qp) -> Result<(), FfiError> {
    let mut objs = objects();
    let QpEntry { h, net } = objs
        .qps
        .remove(&(qp as usize))
        .ok_or(FfiError::BadHandle { what: "qp" })?;
    // SAFETY: the container's C part stays readable (type-stable memory).
    if unsafe { (*h.c_ptr()).qp_base.qp_type } == IBV_QPT_XRC_RECV {
        // One of possibly several handles of an XRC target QP: closes just this
        // handle (see `crate::xrc::destroy_target_handle`).
        return crate::xrc::destroy_target_handle(objs, qp, h, net);
    }
    drop(objs);
    // SAFETY: `h` was just unpublished by this thread.
    let QpBody {
        qp: q,
        builder,
        max_inline,
    } = match unsafe { Handle::retire(h.0) } {
        Ok(b) => b,
        Err(e) => {
            objects().qps.insert(qp as usize, QpEntry { h, net });
            return Err(refused("ibv_destroy_qp", libc::EBUSY, format!("{e:?}")));
        }
    };
    let num = q.qp_num();
    // SAFETY: the container's C part stays readable (type-stable memory).
    let context = unsafe { (*h.c_ptr()).qp_base.context };
    crate::async_events::forget(ObjKind::Qp, num, qp as usize);
    // `destroy` first sends what the QP still owes its peer (an ACK held back for
    // a post that will not come: the pingpongs destroy right after their last
    // completion); see `Transport::flush`. It waits for the references data-path
    // calls still hold.
    match q.destroy() {
        Ok(()) => {
            // SAFETY: retired above, not revived.
            unsafe { Handle::recycle(h.0) };
            Ok(())
        }
        Err((q, e)) => {
            crate::async_events::remember(ObjKind::Qp, num, context, qp as usize);
            let body = QpBody {
                qp: q,
                builder,
                max_inline,
            };
            // SAFETY: retired above by this thread.
            unsafe { Handle::revive(h.0, body) };
            objects().qps.insert(qp as usize, QpEntry { h, net });
            Err(refused("ibv_destroy_qp", libc::EBUSY, e))
        }
    }
}

/// `ibv_qp_to_qp_ex(qp)` (IBVERBS_1.6): the `struct ibv_qp_ex` of the `ibv_wr_*` API
/// around `qp` (every QP of this library has one; see [`crate::qp::ex`]), or NULL +
/// `EINVAL` for a pointer that is not a live QP.
///
/// # Safety
/// None beyond the C contract: the argument is checked as a QP handle (see
/// `crate::handle`) before anything else is read.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    crate::qp::ex::qp_to_qp_ex(qp)
}
