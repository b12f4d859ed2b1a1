//! XRC through the `verbs_context` slots the header inlines call (IBA Vol 1 Annex A14):
//! `open_xrcd` / `close_xrcd` (`ibv_open_xrcd`, `ibv_close_xrcd`), `create_srq_ex`
//! (`ibv_create_srq_ex`, XRC or basic SRQs), `get_srq_num` (`ibv_get_srq_num`),
//! the XRC_RECV part of `create_qp_ex` (`ibv_create_qp_ex`, in [`crate::qp`]: target QPs
//! in a domain) and `open_qp` (`ibv_open_qp`: another handle for a target QP).
//!
//! Domains by file: `ibv_open_xrcd` with a file descriptor names the domain by the file's
//! inode (device and inode number from `fstat`); every open of the same inode in this
//! process is another user of the same [`uroce_verbs::Xrcd`] domain (`Xrcd::share`), each
//! with its own `ibv_xrcd` to close. `O_CREAT` creates the domain if the inode has none
//! (else `EINVAL`, as the kernel answers), `O_EXCL` refuses an inode that has one
//! (`EINVAL`). With fd -1 the domain is private to this open. The last close frees the
//! domain; it is refused with `EBUSY` while XRC SRQs or target QPs with handles exist.
//! On a shared device every open of a file is also one reference of this process in the
//! device's domains file (`uroce_net::xrc`): `O_CREAT` / `O_EXCL` are then decided by
//! whether any process of the host holds the domain, a close drops the reference, and
//! with slot SRQ numbers the domain's target QPs get numbers of its host-wide allotment.
//!
//! Target QP handles: the `ibv_qp` from `ibv_create_qp_ex` and every one from
//! `ibv_open_qp` (in any context of the process) are handles of the one QP, each closed
//! on its own by `ibv_destroy_qp` (`destroy_target_handle`): the QP goes on, held by its
//! domain, while another handle exists, and the last handle's destroy destroys it.
//!
//! The kernel's modify-QP command drops the responder attributes of an XRC initiator
//! (`max_dest_rd_atomic`, `min_rnr_timer`) and the requester attributes of an XRC target
//! (`max_rd_atomic`, `retry_cnt`, `rnr_retry`) from the mask before checking it, and
//! programs rely on it (perftest sets them for both); `strip_xrc_mask` does the same.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, MutexGuard};

use uroce_net::xrc::{DomainId, DomainOpenError, DomainRef};
use uroce_net::NetDevice;
use uroce_verbs::{AttrMask, CreateQpError, QpType, SrqInitAttr, Xrcd};

use crate::abi::*;
use crate::async_events::ObjKind;
use crate::device::Registry;
use crate::entry::*;
use crate::error::refused;
use crate::error::FfiError;
use crate::handle::{Handle, HandlePtr};
use crate::objects::*;

/// One `ibv_xrcd` handed out: a user of a domain.
pub(crate) struct XrcdEntry {
    pub(crate) raw: CBox<ibv_xrcd>,
    pub(crate) xrcd: Xrcd,
    /// `(st_dev, st_ino)` of the file that names the domain, if any.
    inode: Option<(u64, u64)>,
    /// This open's reference in the device's domains file: a domain on a file, of a shared
    /// device (`uroce_net::xrc`).
    shared: Option<Arc<DomainRef>>,
    net: Arc<NetDevice>,
}

impl Objects {
    /// The domain user behind `xrcd`.
    pub(crate) fn xrcd(&self, xrcd: *const ibv_xrcd) -> Result<&XrcdEntry, FfiError> {
        self.xrcds
            .get(&(xrcd as usize))
            .ok_or(FfiError::BadHandle { what: "xrcd" })
    }
}

/// The attributes the kernel's modify-QP command ignores for the XRC halves (see the
/// module doc).
pub(crate) fn strip_xrc_mask(t: QpType, mask: AttrMask) -> AttrMask {
    match t {
        QpType::XrcSend => mask - (AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER),
        QpType::XrcRecv => {
            mask - (AttrMask::MAX_QP_RD_ATOMIC | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY)
        }
        _ => mask,
    }
}

/// The inode identity of an open file descriptor.
fn inode_of(fd: c_int) -> Result<(u64, u64), FfiError> {
    // SAFETY: `stat` is plain integers, valid zeroed.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fstat` writes into the `stat` we own; an invalid fd is reported by -1.
    let r = unsafe { libc::fstat(fd, &mut st) };
    if r != 0 {
        return Err(refused(
            "ibv_open_xrcd",
            libc::EBADF,
            format!("fd {fd} is not an open file"),
        ));
    }
    Ok((st.st_dev, st.st_ino))
}

/// `verbs_context.open_xrcd(context, attr)`: see the module doc. NULL + `errno`.
///
/// # Safety
/// `attr` is NULL or points to a readable `struct ibv_xrcd_init_attr`.
pub unsafe extern "C" fn vctx_open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller guarantee.
        ptr_or_null(unsafe { open_xrcd(context, attr) })
    })
}

/// The body of the `verbs_context.open_xrcd` slot function [`vctx_open_xrcd`], for callers
/// inside the library.
///
/// # Safety
/// As for [`vctx_open_xrcd`].
pub(crate) unsafe fn open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> Result<*mut ibv_xrcd, FfiError> {
    if attr.is_null() {
        return Err(FfiError::Invalid("xrcd_init_attr is NULL"));
    }
    // SAFETY: caller guarantee: readable attr (checked non-NULL).
    let a = unsafe { attr.read() };
    if a.comp_mask & !(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS) != 0 {
        return Err(FfiError::Invalid("unknown xrcd_init_attr comp_mask bits"));
    }
    let fd = if a.comp_mask & IBV_XRCD_INIT_ATTR_FD != 0 {
        a.fd
    } else {
        -1
    };
    let oflags = if a.comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS != 0 {
        a.oflags
    } else {
        0
    };
    let net = Registry::net(context)?;
    let inode = if fd == -1 { None } else { Some(inode_of(fd)?) };
    let mut objs = objects();
    // A domain on a file of a shared device: one more reference of this process in the
    // device's domains file, where O_CREAT and O_EXCL are decided for the whole host.
    let shared = match inode {
        None => None,
        Some((dev, ino)) => net
            .open_xrc_domain(
                DomainId { dev, ino },
                oflags & libc::O_CREAT != 0,
                oflags & libc::O_EXCL != 0,
            )
            .map_err(|e| {
                let errno = match e {
                    DomainOpenError::Exists(_) | DomainOpenError::Absent(_) => libc::EINVAL,
                    DomainOpenError::File(_) => libc::EIO,
                };
                refused("ibv_open_xrcd", errno, e)
            })?
            .map(Arc::new),
    };
    let existing = inode.and_then(|ino| {
        objs.xrcds
            .values()
            .find(|e| e.inode == Some(ino) && Arc::ptr_eq(&e.net, &net))
    });
    let xrcd = match existing {
        // Decided host-wide above.
        Some(e) if shared.is_some() => e.xrcd.share(),
        Some(_) if oflags & libc::O_EXCL != 0 => {
            return Err(refused(
                "ibv_open_xrcd",
                libc::EINVAL,
                "O_EXCL: the file already names a domain",
            ))
        }
        Some(e) => e.xrcd.share(),
        None if shared.is_none() && inode.is_some() && oflags & libc::O_CREAT == 0 => {
            return Err(refused(
                "ibv_open_xrcd",
                libc::EINVAL,
                "the file names no domain and O_CREAT is not set",
            ))
        }
        None => net
            .context()
            .alloc_xrcd()
            .map_err(|e| refused("ibv_open_xrcd", libc::ENOMEM, e))?,
    };
    let raw = CBox::new(ibv_xrcd { context });
    let p = raw.ptr();
    objs.xrcds.insert(
        p as usize,
        XrcdEntry {
            raw,
            xrcd,
            inode,
            shared,
            net,
        },
    );
    Ok(p)
}

/// `verbs_context.close_xrcd(xrcd)`: closes this user; 0, `EBUSY` (the last user, while
/// XRC SRQs or target QPs with handles exist) or `EINVAL`.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
pub unsafe extern "C" fn vctx_close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            let entry = objects()
                .xrcds
                .remove(&(xrcd as usize))
                .ok_or(FfiError::BadHandle { what: "xrcd" })?;
            let XrcdEntry {
                raw,
                xrcd: x,
                inode,
                shared,
                net,
            } = entry;
            // Outside the registry lock: closing the last user destroys the target QPs
            // only the domain holds, which waits for their references.
            match x.destroy() {
                Ok(()) => {
                    // This open's reference in the device's domains file goes (closed when
                    // the last clone drops: a target QP's destroy may hold one for a
                    // moment). A failure to write the file does not fail the close, as
                    // the domain is closed in this process: the reference stays until
                    // this process's exit is reaped.
                    drop(shared);
                    Ok(())
                }
                Err((x, e)) => {
                    let key = raw.ptr() as usize;
                    objects().xrcds.insert(
                        key,
                        XrcdEntry {
                            raw,
                            xrcd: x,
                            inode,
                            shared,
                            net,
                        },
                    );
                    Err(refused("ibv_close_xrcd", libc::EBUSY, e))
                }
            }
        })())
    })
}

/// `verbs_context.create_srq_ex(context, attr)`: an XRC SRQ (`srq_type` XRC with `pd`,
/// `xrcd` and `cq`) or a basic one (`pd`); `attr->attr` is updated to the granted sizes.
/// NULL + `errno` (`EINVAL`, `EOPNOTSUPP` for tag-matching SRQs, `ENOMEM`).
///
/// # Safety
/// `attr` is NULL or points to a readable and writable `struct ibv_srq_init_attr_ex`.
pub unsafe extern "C" fn vctx_create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded caller guarantee.
        ptr_or_null(unsafe { create_srq_ex(context, attr) })
    })
}

/// The body of the `verbs_context.create_srq_ex` slot function [`vctx_create_srq_ex`], for
/// callers inside the library.
///
/// # Safety
/// As for [`vctx_create_srq_ex`].
pub(crate) unsafe fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> Result<*mut ibv_srq, FfiError> {
    if attr.is_null() {
        return Err(FfiError::Invalid("srq_init_attr_ex is NULL"));
    }
    // SAFETY: caller guarantee: readable attr (checked non-NULL).
    let a = unsafe { attr.read() };
    let known = IBV_SRQ_INIT_ATTR_TYPE
        | IBV_SRQ_INIT_ATTR_PD
        | IBV_SRQ_INIT_ATTR_XRCD
        | IBV_SRQ_INIT_ATTR_CQ;
    if a.comp_mask & !known != 0 {
        return Err(FfiError::Unsupported("tag-matching SRQs"));
    }
    let srq_type = if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 {
        a.srq_type
    } else {
        IBV_SRQT_BASIC
    };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
        return Err(FfiError::Invalid("an SRQ needs a PD"));
    }
    let init = SrqInitAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    let mut objs = objects();
    let pd = &objs.pd(a.pd)?.pd;
    let made = match srq_type {
        IBV_SRQT_BASIC => pd.create_srq(&init),
        IBV_SRQT_XRC => {
            let need = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
            if a.comp_mask & need != need {
                return Err(FfiError::Invalid("an XRC SRQ needs an XRC domain and a CQ"));
            }
            let cq = objs.cq(a.cq)?;
            objs.xrcd(a.xrcd)?.xrcd.create_srq(pd, cq, &init)
        }
        _ => return Err(FfiError::Unsupported("tag-matching SRQs")),
    };
    let srq = made.map_err(|e| {
        let errno = match e {
            uroce_verbs::CreateSrqError::Limit { .. } => libc::ENOMEM,
            _ => libc::EINVAL,
        };
        refused("ibv_create_srq_ex", errno, e)
    })?;
    let granted = srq.query();
    // SAFETY: ibv_srq is pointers, integers and glibc pthread objects, all valid
    // zeroed (the pthread ones are then their static initialisers).
    let mut c: ibv_srq = unsafe { zeroed() };
    c.context = context;
    c.srq_context = a.srq_context;
    c.pd = a.pd;
    c.handle = srq.srq_num();
    let num = srq.srq_num();
    let h = Handle::<SrqKind>::create(c, srq);
    let p = Handle::c_ptr(h);
    objs.srqs.insert(p as usize, SrqEntry { h: HandlePtr(h) });
    crate::async_events::remember(crate::async_events::ObjKind::Srq, num, context, p as usize);
    // SAFETY: caller guarantee: writable attr (checked non-NULL).
    unsafe {
        (*attr).attr.max_wr = granted.max_wr;
        (*attr).attr.max_sge = granted.max_sge;
    }
    Ok(p)
}

/// `verbs_context.get_srq_num(srq, srq_num)`: the SRQ's 24-bit number; 0 or the errno
/// value (`EINVAL`).
///
/// # Safety
/// `srq_num` is NULL or points to a writable `uint32_t`.
pub unsafe extern "C" fn vctx_get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if srq_num.is_null() {
                return Err(FfiError::Invalid("srq_num is NULL"));
            }
            let n = srq_ref(srq)?.srq_num();
            // SAFETY: caller guarantee: writable srq_num (checked non-NULL).
            unsafe { srq_num.write(n) };
            Ok(())
        })())
    })
}

/// Registers a target QP handle and returns its `ibv_qp`.
fn register_target(
    objs: &mut Objects,
    qp: uroce_verbs::Qp,
    context: *mut ibv_context,
    qp_context: *mut c_void,
    net: Arc<NetDevice>,
) -> *mut ibv_qp {
    // SAFETY: ibv_qp_ex is pointers, integers, `Option` of function pointers and glibc
    // pthread objects, all valid zeroed (the pthread ones are then their static
    // initialisers).
    let mut c: ibv_qp_ex = unsafe { zeroed() };
    let b = &mut c.qp_base;
    b.context = context;
    b.qp_context = qp_context;
    b.handle = qp.qp_num();
    b.qp_num = qp.qp_num();
    b.state = qp.state().as_u32();
    b.qp_type = IBV_QPT_XRC_RECV;
    // A target QP has no send queue: every ibv_wr_* operation is refused.
    crate::qp::register_qp(objs, c, qp, 0, 0, net)
}

/// The XRC_RECV part of `ibv_create_qp_ex` ([`crate::qp::create_qp_ex`]): a target QP in
/// `a.xrcd` (`IBV_QP_INIT_ATTR_XRCD`; no PD, CQs or queues of its own), with its first
/// handle.
pub(crate) fn create_target_qp(
    context: *mut ibv_context,
    a: &ibv_qp_init_attr_ex,
    send_ops: Option<u64>,
) -> Result<*mut ibv_qp, FfiError> {
    if let Some(flags) = send_ops {
        crate::qp::ex::check_send_ops(QpType::XrcRecv, flags)?;
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 {
        return Err(FfiError::Invalid("an XRC_RECV QP needs an XRC domain"));
    }
    let mut objs = objects();
    let e = objs.xrcd(a.xrcd)?;
    let net = Arc::clone(&e.net);
    // A domain shared through the device's domains file numbers its target QPs host-wide
    // (with slot SRQ numbers: `uroce_net::xrc`).
    let number = match &e.shared {
        Some(r) => r
            .alloc_target_qpn()
            .map_err(|e| refused("ibv_create_qp_ex", libc::ENOMEM, e))?,
        None => None,
    };
    let made = match number {
        Some(n) => e.xrcd.create_qp_numbered(n),
        None => e.xrcd.create_qp(),
    };
    let qp = made.map_err(|err| {
        if let (Some(r), Some(n)) = (&e.shared, number) {
            let _ = r.release_target_qpn(n);
        }
        let errno = match err {
            CreateQpError::UnsupportedType(_) => libc::EOPNOTSUPP,
            CreateQpError::Limit { .. } | CreateQpError::QpnInUse(_) => libc::ENOMEM,
            _ => libc::EINVAL,
        };
        refused("ibv_create_qp_ex", errno, err)
    })?;
    Ok(register_target(&mut objs, qp, context, a.qp_context, net))
}

/// `verbs_context.open_qp(context, attr)`: another handle for XRC_RECV QP
/// `attr->qp_num` of `attr->xrcd` (`ibv_open_qp`). NULL + `errno` (`EINVAL`).
///
/// # Safety
/// `attr` is NULL or points to a readable `struct ibv_qp_open_attr`.
pub unsafe extern "C" fn vctx_open_qp(
    context: *mut ibv_context,
    attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            if attr.is_null() {
                return Err(FfiError::Invalid("qp_open_attr is NULL"));
            }
            // SAFETY: caller guarantee: readable attr (checked non-NULL).
            let a = unsafe { attr.read() };
            let need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
            if a.comp_mask & need != need || a.qp_type != IBV_QPT_XRC_RECV {
                return Err(FfiError::Invalid(
                    "ibv_open_qp needs qp_num, xrcd and qp_type XRC_RECV",
                ));
            }
            let qp_context = if a.comp_mask & IBV_QP_OPEN_ATTR_CONTEXT != 0 {
                a.qp_context
            } else {
                std::ptr::null_mut()
            };
            let mut objs = objects();
            let e = objs.xrcd(a.xrcd)?;
            let net = Arc::clone(&e.net);
            let qp = e
                .xrcd
                .open_qp(a.qp_num)
                .map_err(|e| refused("ibv_open_qp", libc::EINVAL, e))?;
            Ok(register_target(&mut objs, qp, context, qp_context, net))
        })())
    })
}

/// `ibv_destroy_qp` of a handle of an XRC target QP (IBA Vol 1 Annex A14: a target QP is
/// shared by the users of its domain, each through its own handle): closes just this
/// handle. While another handle of the QP exists (any context of the process) the QP goes
/// on, held by its domain — published, receiving, and the other handles work as before;
/// the last handle's destroy takes the QP back from its domain and destroys it.
///
/// Called by `ibv_destroy_qp` with the registry lock held (`objs`) and the entry of `qp`
/// (`h`, `net`) already removed from it. On a refusal (`EBUSY`) the handle is live again.
pub(crate) fn destroy_target_handle(
    mut objs: MutexGuard<'_, Objects>,
    qp: *mut ibv_qp,
    h: HandlePtr<QpKind>,
    net: Arc<NetDevice>,
) -> Result<(), FfiError> {
    // SAFETY: `h` was just unpublished by this thread, under the registry lock.
    let QpBody {
        qp: q,
        builder,
        max_inline,
    } = match unsafe { Handle::retire(h.0) } {
        Ok(b) => b,
        Err(e) => {
            objs.qps.insert(qp as usize, QpEntry { h, net });
            return Err(refused("ibv_destroy_qp", libc::EBUSY, format!("{e:?}")));
        }
    };
    let num = q.qp_num();
    // SAFETY: the container's C part stays readable (type-stable memory).
    let context = unsafe { (*h.c_ptr()).qp_base.context };
    crate::async_events::forget(ObjKind::Qp, num, qp as usize);
    // Another published handle of the same QP: same device, type and number (numbers are
    // unique among a device's live QPs).
    let others = objs.qps.values().any(|e| {
        // SAFETY: a published container: its C part is initialised and stays readable.
        let b = unsafe { &(*e.h.c_ptr()).qp_base };
        Arc::ptr_eq(&e.net, &net) && b.qp_type == IBV_QPT_XRC_RECV && b.qp_num == num
    });
    // This handle goes without destroying the QP: a target QP's `Qp` dropped without
    // `destroy` is handed to its domain (see `uroce_verbs::Xrcd`).
    drop(q);
    if others {
        drop(objs);
        // SAFETY: retired above, not revived.
        unsafe { Handle::recycle(h.0) };
        return Ok(());
    }
    // The last handle: the domain gives the QP back as the only reference, destroyed
    // below. A user of the domain exists in this process (its last close is refused while
    // target QPs have handles); were none left, the drop above has destroyed the QP.
    let taken = objs
        .xrcds
        .values()
        .filter(|e| Arc::ptr_eq(&e.net, &net) && e.xrcd.owned_qps().contains(&num))
        .find_map(|e| e.xrcd.open_qp(num).ok().map(|q| (q, e.shared.clone())));
    drop(objs);
    let (result, shared) = match taken {
        None => (Ok(()), None),
        Some((q, shared)) => (q.destroy().map_err(|(q, e)| (q, e.to_string())), shared),
    };
    match result {
        Ok(()) => {
            // Its number leaves the domain's host-wide allotment.
            if let Some(r) = shared.filter(|r| r.numbers_target_qps()) {
                let _ = r.release_target_qpn(num);
            }
            // SAFETY: retired above, not revived.
            unsafe { Handle::recycle(h.0) };
            Ok(())
        }
        Err((q, e)) => {
            // The QP stays unpublished (as any refused destroy leaves it); this handle is
            // live again so that the program can try again.
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
