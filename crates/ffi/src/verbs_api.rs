//! The exported verbs object and data-path functions (second slice): protection domains,
//! memory regions, completion channels and CQs (with events), shared receive queues, RC QPs
//! (create/modify/query/destroy, optionally attached to an SRQ), and the `ibv_context.ops`
//! slots the header inlines call (`poll_cq`, `req_notify_cq`, `post_send`, `post_recv`,
//! `post_srq_recv`). Enough for the unmodified `ibv_rc_pingpong` and `ibv_srq_pingpong`.
//!
//! Conventions as in [`crate::exports`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure. Return conventions follow
//! rdma-core 44: constructors return NULL + `errno`; `ibv_dealloc_pd`, `ibv_dereg_mr`,
//! `ibv_destroy_*`, `ibv_modify_qp`, `ibv_query_qp` and the ops slots return 0 or the errno
//! value; `ibv_get_cq_event` returns 0 or -1 + `errno`.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::os::fd::AsRawFd as _;
use std::sync::{Arc, LazyLock};

use uroce_verbs::{
    AccessFlags, Children, CompChannel, CqRef, CreateQpError, DestroyError, MemBlock, ObjectKind,
    QpInitAttr, QpType, SrqAttr, SrqAttrMask, SrqInitAttr, WcStatus, WorkCompletion,
};

use crate::abi::*;
use crate::async_events::ObjKind;
use crate::device::{FfiError, Registry};
use crate::entry::*;
use crate::handle::{Handle, HandlePtr};
use crate::objects::*;

/// A verbs-layer refusal with its errno.
fn refused(op: &'static str, errno: c_int, e: impl std::fmt::Display) -> FfiError {
    FfiError::Refused {
        op,
        errno,
        reason: e.to_string(),
    }
}

/// `EBUSY` for `op` while `object` has live `children`. Checked under the registry lock
/// before the object is unpublished, so that a refused destroy leaves it registered
/// throughout: threads using it meanwhile (polling a CQ, posting to an SRQ, registering
/// memory in a PD) never find it missing. The verbs layer checks again when it destroys.
fn refuse_if_busy(
    op: &'static str,
    object: ObjectKind,
    children: Children,
) -> Result<(), FfiError> {
    if children.is_empty() {
        return Ok(());
    }
    Err(refused(
        op,
        libc::EBUSY,
        DestroyError::Busy { object, children },
    ))
}

symver!("uroce_ibv_alloc_pd", "ibv_alloc_pd@@IBVERBS_1.1");
symver!("uroce_ibv_create_ah", "ibv_create_ah@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_ah", "ibv_destroy_ah@@IBVERBS_1.1");
symver!("uroce_ibv_dealloc_pd", "ibv_dealloc_pd@@IBVERBS_1.1");
symver!("uroce_ibv_reg_mr", "ibv_reg_mr@@IBVERBS_1.1");
symver!("uroce_ibv_reg_mr_iova2", "ibv_reg_mr_iova2@@IBVERBS_1.8");
symver!("uroce_ibv_dereg_mr", "ibv_dereg_mr@@IBVERBS_1.1");
symver!(
    "uroce_ibv_create_comp_channel",
    "ibv_create_comp_channel@@IBVERBS_1.0"
);
symver!(
    "uroce_ibv_destroy_comp_channel",
    "ibv_destroy_comp_channel@@IBVERBS_1.0"
);
symver!("uroce_ibv_create_cq", "ibv_create_cq@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_cq", "ibv_destroy_cq@@IBVERBS_1.1");
symver!("uroce_ibv_get_cq_event", "ibv_get_cq_event@@IBVERBS_1.1");
symver!("uroce_ibv_ack_cq_events", "ibv_ack_cq_events@@IBVERBS_1.1");
symver!("uroce_ibv_create_srq", "ibv_create_srq@@IBVERBS_1.1");
symver!("uroce_ibv_modify_srq", "ibv_modify_srq@@IBVERBS_1.1");
symver!("uroce_ibv_query_srq", "ibv_query_srq@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_srq", "ibv_destroy_srq@@IBVERBS_1.1");
symver!("uroce_ibv_create_qp", "ibv_create_qp@@IBVERBS_1.1");
symver!("uroce_ibv_modify_qp", "ibv_modify_qp@@IBVERBS_1.1");
symver!("uroce_ibv_query_qp", "ibv_query_qp@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_qp", "ibv_destroy_qp@@IBVERBS_1.1");
symver!("uroce_ibv_wc_status_str", "ibv_wc_status_str@@IBVERBS_1.1");
symver!("uroce_ibv_qp_to_qp_ex", "ibv_qp_to_qp_ex@@IBVERBS_1.6");

// ---------------------------------------------------------------------------------------
// Protection domains.
// ---------------------------------------------------------------------------------------

/// `ibv_alloc_pd(context)`: a new PD, or NULL + `errno` (`EINVAL` bad context, `ENOMEM`).
/// Its `handle` is the PD's number in the context's device file (what `ibv_import_pd`
/// takes).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || ptr_or_null(alloc_pd(context)))
}

/// The body of `ibv_alloc_pd` (the exported `uroce_ibv_alloc_pd`), for callers inside the library.
pub(crate) fn alloc_pd(context: *mut ibv_context) -> Result<*mut ibv_pd, FfiError> {
    let net = Registry::net(context)?;
    let file = Registry::file(context)?;
    let pd = net
        .context()
        .alloc_pd()
        .map_err(|e| refused("ibv_alloc_pd", libc::ENOMEM, e))?;
    let obj = (file, pd.id());
    let raw = CBox::new(ibv_pd {
        context,
        handle: pd.id(),
    });
    let p = raw.ptr();
    let mut objs = objects();
    objs.pd_objs.insert(obj, PdEntry { pd, net });
    objs.pds.insert(p as usize, PdHandle { raw, obj });
    Ok(p)
}

/// `ibv_dealloc_pd(pd)`: 0, or `EBUSY` while MRs/QPs or parent domains use it, `EINVAL`
/// for an unknown PD or a handle whose PD was deallocated through another handle. A
/// parent domain is freed by `crate::parent_domain`. Through any handle (allocated or
/// imported) it deallocates the PD object; the handle is freed, the PD's other handles
/// name nothing afterwards (`ibv_unimport_pd` frees them).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || errno_value(dealloc_pd(pd)))
}

/// The body of `ibv_dealloc_pd` (the exported `uroce_ibv_dealloc_pd`), for callers inside the library.
pub(crate) fn dealloc_pd(pd: *mut ibv_pd) -> Result<(), FfiError> {
    if let Some(r) = crate::parent_domain::dealloc_parent_domain(pd) {
        return r;
    }
    let (obj, entry) = {
        let mut objs = objects();
        let obj = objs
            .pds
            .get(&(pd as usize))
            .map(|h| h.obj)
            .ok_or(FfiError::BadHandle { what: "pd" })?;
        if crate::parent_domain::has_parent_domains(&objs, obj) {
            return Err(refused(
                "ibv_dealloc_pd",
                libc::EBUSY,
                "a parent domain refers to the PD",
            ));
        }
        let children = objs.pd(pd)?.pd.children();
        refuse_if_busy("ibv_dealloc_pd", ObjectKind::Pd, children)?;
        let entry = objs
            .pd_objs
            .remove(&obj)
            .ok_or(FfiError::BadHandle { what: "pd" })?;
        (obj, entry)
    };
    let PdEntry { pd: p, net } = entry;
    match p.destroy() {
        Ok(()) => {
            objects().pds.remove(&(pd as usize));
            Ok(())
        }
        Err((p, e)) => {
            objects().pd_objs.insert(obj, PdEntry { pd: p, net });
            Err(refused("ibv_dealloc_pd", libc::EBUSY, e))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Address handles.
// ---------------------------------------------------------------------------------------

/// `ibv_create_ah(pd, attr)`: an address handle for `attr` (port 1, a non-zero destination
/// GID, a valid source GID index); NULL + `errno` (`EINVAL` for a bad handle or
/// attribute). UD work requests name it in `wr.ud.ah`; the PD cannot be deallocated
/// while it exists.
///
/// # Safety
/// `attr` is NULL or points to a readable `struct ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_ah(
    pd: *mut ibv_pd,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            if attr.is_null() {
                return Err(FfiError::Invalid("attr is NULL"));
            }
            // SAFETY: non-NULL and readable (caller guarantee).
            create_ah(pd, unsafe { &*attr })
        })())
    })
}

/// `ibv_create_ah` on a read attribute structure (also behind `ibv_create_ah_from_wc`).
pub(crate) fn create_ah(pd: *mut ibv_pd, attr: &ibv_ah_attr) -> Result<*mut ibv_ah, FfiError> {
    let a = ah_from_c(attr);
    let mut objs = objects();
    let p = objs.pd(pd)?;
    let ah =
        p.pd.create_ah(&a)
            .map_err(|e| refused("ibv_create_ah", libc::EINVAL, e))?;
    // SAFETY: `pd` is a registered, live PD allocated by uroce (lock held).
    let context = unsafe { (*pd).context };
    let h = Handle::<AhKind>::create(
        ibv_ah {
            context,
            pd,
            handle: 0,
        },
        ah,
    );
    let ptr = Handle::c_ptr(h);
    objs.ahs.insert(ptr as usize, AhEntry { h: HandlePtr(h) });
    Ok(ptr)
}

/// `ibv_destroy_ah(ah)`: 0, or `EINVAL` for a handle that is not a live address handle.
///
/// # Safety
/// None beyond the C contract: foreign pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            let AhEntry { h } = objects()
                .ahs
                .remove(&(ah as usize))
                .ok_or(FfiError::BadHandle { what: "ah" })?;
            // SAFETY: `h` was just unpublished by this thread.
            match unsafe { Handle::retire(h.0) } {
                Ok(a) => {
                    // Outside the registry lock.
                    a.destroy();
                    // SAFETY: retired above, not revived.
                    unsafe { Handle::recycle(h.0) };
                    Ok(())
                }
                Err(e) => {
                    objects().ahs.insert(ah as usize, AhEntry { h });
                    Err(refused("ibv_destroy_ah", libc::EBUSY, format!("{e:?}")))
                }
            }
        })())
    })
}

// ---------------------------------------------------------------------------------------
// Memory regions.
// ---------------------------------------------------------------------------------------

/// Registers `[addr, addr + length)` with byte 0 at `iova` (`None`: the address itself).
///
/// # Safety
/// The range is application memory that stays valid until the MR is deregistered.
unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: Option<u64>,
    access: AccessFlags,
) -> Result<*mut ibv_mr, FfiError> {
    let mut objs = objects();
    let file = objs.pd_key(pd)?.0;
    let entry = objs.pd(pd)?;
    let context = {
        // SAFETY: `pd` is a live registered PD (checked above, lock held), allocated by
        // uroce; reading one field.
        unsafe { (*pd).context }
    };
    // SAFETY: caller guarantee (the C contract of ibv_reg_mr): the range is live memory
    // until ibv_dereg_mr, which retires the block before returning.
    let block = unsafe { MemBlock::from_raw(addr.cast(), length) }
        .map_err(|e| refused("ibv_reg_mr", libc::EINVAL, e))?;
    let mr = match iova {
        Some(iova) => entry.pd.reg_mr_iova(block, access, iova),
        None => entry.pd.reg_mr(block, access),
    }
    .map_err(|e| refused("ibv_reg_mr", libc::EINVAL, e))?;
    let handle = objs.new_mr_handle(file);
    let raw = CBox::new(ibv_mr {
        context,
        pd,
        addr,
        length,
        handle,
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    });
    let p = raw.ptr();
    let obj = (file, handle);
    objs.mr_objs.insert(
        obj,
        MrEntry {
            mr,
            addr: addr as usize,
            length,
        },
    );
    objs.mrs.insert(p as usize, MrHandle { raw, obj });
    Ok(p)
}

/// `ibv_reg_mr(pd, addr, length, access)`: a memory region over application memory, or
/// NULL + `errno` (`EINVAL`). Optional access bits (`IBV_ACCESS_OPTIONAL_RANGE`) are
/// ignored.
///
/// # Safety
/// `[addr, addr + length)` is application memory that stays allocated until
/// `ibv_dereg_mr` returns (the verbs contract).
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        ptr_or_null(
            // SAFETY: forwarded caller guarantee on the range.
            mr_access(access).and_then(|a| unsafe { reg_mr(pd, addr, length, None, a) }),
        )
    })
}

/// `ibv_reg_mr_iova2(pd, addr, length, iova, access)` (IBVERBS_1.8): like `ibv_reg_mr`
/// with an explicit virtual address for the first byte.
///
/// # Safety
/// As for [`uroce_ibv_reg_mr`].
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: forwarded caller guarantee.
    unsafe { reg_mr_iova(pd, addr, length, iova, access as c_int) }
}

/// `ibv_reg_mr_iova2` and `ibv_reg_mr_iova` (which differ in the type of `access`).
///
/// # Safety
/// `[addr, addr + length)` stays allocated until the MR is deregistered.
pub(crate) unsafe fn reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        ptr_or_null(mr_access(access).and_then(|a| {
            // SAFETY: forwarded caller guarantee on the range.
            unsafe { reg_mr(pd, addr, length, Some(iova), a) }
        }))
    })
}

/// `ibv_dereg_mr(mr)`: 0 once no access to the memory is in progress any more (the
/// application may free it then), or the errno value (`EINVAL`, `EBUSY`). Through any
/// handle (registered or imported) it deregisters the MR object; the handle is freed, the
/// MR's other handles name nothing afterwards (`ibv_unimport_mr` frees them).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            let (obj, entry) = {
                let mut objs = objects();
                let obj = objs
                    .mrs
                    .get(&(mr as usize))
                    .map(|h| h.obj)
                    .ok_or(FfiError::BadHandle { what: "mr" })?;
                let entry = objs
                    .mr_objs
                    .remove(&obj)
                    .ok_or(FfiError::BadHandle { what: "mr" })?;
                (obj, entry)
            };
            let MrEntry {
                mr: m,
                addr,
                length,
            } = entry;
            match m.destroy() {
                Ok(()) => {
                    objects().mrs.remove(&(mr as usize));
                    Ok(())
                }
                Err((m, e)) => {
                    objects().mr_objs.insert(
                        obj,
                        MrEntry {
                            mr: m,
                            addr,
                            length,
                        },
                    );
                    Err(refused("ibv_dereg_mr", libc::EBUSY, e))
                }
            }
        })())
    })
}

// ---------------------------------------------------------------------------------------
// Completion channels and CQs.
// ---------------------------------------------------------------------------------------

/// `ibv_create_comp_channel(context)`: a channel whose `fd` is readable while CQ events
/// are pending; NULL + `errno` on failure.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        ptr_or_null(create_comp_channel(context))
    })
}

/// The body of `ibv_create_comp_channel` (the exported `uroce_ibv_create_comp_channel`), for callers inside the library.
pub(crate) fn create_comp_channel(
    context: *mut ibv_context,
) -> Result<*mut ibv_comp_channel, FfiError> {
    let net = Registry::net(context)?;
    let ch = net
        .context()
        .create_comp_channel()
        .map_err(|e| refused("ibv_create_comp_channel", libc::ENOMEM, e))?;
    let raw = CBox::new(ibv_comp_channel {
        context,
        fd: ch.fd().as_raw_fd(),
        refcnt: 0,
    });
    let p = raw.ptr();
    objects().channels.insert(
        p as usize,
        ChannelEntry {
            raw,
            ch: Arc::new(ch),
            _net: net,
        },
    );
    Ok(p)
}

/// `ibv_destroy_comp_channel(channel)`: 0, or `EBUSY` while CQs use it or a thread waits
/// on it, `EINVAL` for an unknown channel.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || errno_value(destroy_comp_channel(channel)))
}

/// The body of `ibv_destroy_comp_channel` (the exported `uroce_ibv_destroy_comp_channel`), for callers inside the library.
pub(crate) fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> Result<(), FfiError> {
    let mut objs = objects();
    let entry = objs
        .channels
        .get(&(channel as usize))
        .ok_or(FfiError::BadHandle { what: "channel" })?;
    // SAFETY: registered, live channel allocated by uroce (lock held).
    let refcnt = unsafe { (*entry.raw.ptr()).refcnt };
    if refcnt > 0 || Arc::strong_count(&entry.ch) > 1 {
        return Err(FfiError::Refused {
            op: "ibv_destroy_comp_channel",
            errno: libc::EBUSY,
            reason: "CQs use the channel or a thread waits on it".into(),
        });
    }
    let ChannelEntry { raw, ch, _net } = objs
        .channels
        .remove(&(channel as usize))
        .ok_or(FfiError::BadHandle { what: "channel" })?;
    drop(objs);
    let ch = match Arc::try_unwrap(ch) {
        Ok(ch) => ch,
        Err(ch) => {
            let key = raw.ptr() as usize;
            objects()
                .channels
                .insert(key, ChannelEntry { raw, ch, _net });
            return Err(refused("ibv_destroy_comp_channel", libc::EBUSY, "in use"));
        }
    };
    match ch.destroy() {
        Ok(()) => Ok(()),
        Err((ch, e)) => {
            let key = raw.ptr() as usize;
            objects().channels.insert(
                key,
                ChannelEntry {
                    raw,
                    ch: Arc::new(ch),
                    _net,
                },
            );
            Err(refused("ibv_destroy_comp_channel", libc::EBUSY, e))
        }
    }
}

/// `ibv_create_cq(context, cqe, cq_context, channel, comp_vector)`: a CQ of `cqe`
/// entries, optionally reporting to `channel`; NULL + `errno` (`EINVAL`, `ENOMEM`).
/// `EINVAL` also for a `cqe` outside 1..=`max_cqe` and a `comp_vector` outside
/// 0..`num_comp_vectors`, as rdma-core over the kernel's uverbs reports them.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        ptr_or_null(
            create_cq(
                context,
                cqe,
                cq_context,
                channel,
                comp_vector,
                0,
                std::ptr::null_mut(),
            )
            .map(|c| c.cast()),
        )
    })
}

/// The body of `ibv_create_cq` and `ibv_create_cq_ex`: a CQ container (an `ibv_cq_ex`
/// whose accessors follow `wc_flags`, see [`crate::cq_ex`]), recorded as made in
/// `parent_domain` (NULL: none), which then cannot be deallocated before it.
pub(crate) fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    wc_flags: u64,
    parent_domain: *mut ibv_pd,
) -> Result<*mut ibv_cq_ex, FfiError> {
    let net = Registry::net(context)?;
    let cqe = u32::try_from(cqe).map_err(|_| FfiError::Invalid("negative cqe"))?;
    let vector = u32::try_from(comp_vector).map_err(|_| FfiError::Invalid("negative vector"))?;
    if comp_vector >= crate::device::NUM_COMP_VECTORS {
        return Err(FfiError::Invalid(
            "ibv_create_cq: comp_vector is not below the context's num_comp_vectors",
        ));
    }
    let mut objs = objects();
    let ch = if channel.is_null() {
        None
    } else {
        Some(
            objs.channels
                .get(&(channel as usize))
                .ok_or(FfiError::BadHandle { what: "channel" })?,
        )
    };
    let cq = net
        .context()
        .create_cq(cqe, ch.map(|c| &*c.ch), vector)
        .map_err(|e| refused("ibv_create_cq", libc::EINVAL, e))?;
    let clocks = crate::cq_ex::clocks(wc_flags);
    if !clocks.is_empty() {
        // A new CQ holds no completion: it stamps from its first one.
        cq.enable_timestamps(clocks);
    }
    if let Some(c) = ch {
        // SAFETY: registered, live channel allocated by uroce (lock held).
        unsafe { (*c.raw.ptr()).refcnt += 1 };
    }
    // SAFETY: ibv_cq_ex is pointers, integers, `Option` of function pointers and glibc
    // pthread objects, all valid zeroed (the pthread ones are then their static
    // initialisers).
    let mut c: ibv_cq_ex = unsafe { zeroed() };
    c.context = context;
    c.channel = channel;
    c.cq_context = cq_context;
    c.handle = cq.id();
    c.cqe = c_int::try_from(cq.capacity()).unwrap_or(c_int::MAX);
    crate::cq_ex::init_ops(&mut c, wc_flags);
    let id = cq.id();
    let h = Handle::<CqKind>::create(
        c,
        CqBody {
            cq,
            poll: crate::cq_ex::PollSession::new(),
        },
    );
    let p = Handle::c_ptr(h);
    objs.cq_by_id.insert(id, p as usize);
    crate::async_events::remember(ObjKind::Cq, id, context, p as usize);
    objs.cqs.insert(
        p as usize,
        CqEntry {
            h: HandlePtr(h),
            events: Vec::new(),
            channel: channel as usize,
            parent_domain: parent_domain as usize,
            _net: net,
        },
    );
    Ok(p)
}

/// `ibv_destroy_cq(cq)`: 0, or `EBUSY` while QPs use it, `EINVAL` for an unknown CQ.
/// Events got and not acknowledged are acknowledged implicitly.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || errno_value(destroy_cq(cq)))
}

/// The body of `ibv_destroy_cq` (the exported `uroce_ibv_destroy_cq`), for callers inside the library.
pub(crate) fn destroy_cq(cq: *mut ibv_cq) -> Result<(), FfiError> {
    let entry = {
        let mut objs = objects();
        let children = objs.cq(cq)?.children();
        refuse_if_busy("ibv_destroy_cq", ObjectKind::Cq, children)?;
        objs.cqs
            .remove(&(cq as usize))
            .ok_or(FfiError::BadHandle { what: "cq" })?
    };
    let CqEntry {
        h,
        events,
        channel,
        parent_domain,
        _net,
    } = entry;
    drop(events);
    // SAFETY: `h` was just unpublished by this thread.
    let body = match unsafe { Handle::retire(h.0) } {
        Ok(b) => b,
        Err(e) => {
            // A poll session that does not end: the CQ stays (live again).
            objects().cqs.insert(
                cq as usize,
                CqEntry {
                    h,
                    events: Vec::new(),
                    channel,
                    parent_domain,
                    _net,
                },
            );
            return Err(refused("ibv_destroy_cq", libc::EBUSY, format!("{e:?}")));
        }
    };
    let CqBody { cq: c, poll } = body;
    let id = c.id();
    // SAFETY: the container's C part stays readable (type-stable memory).
    let context = unsafe { (*h.c_ptr()).context };
    crate::async_events::forget(ObjKind::Cq, id, cq as usize);
    match c.destroy() {
        Ok(()) => {
            let mut objs = objects();
            objs.cq_by_id.remove(&id);
            if let Some(ch) = objs.channels.get(&channel) {
                // SAFETY: registered, live channel allocated by uroce (lock held).
                unsafe { (*ch.raw.ptr()).refcnt -= 1 };
            }
            drop(objs);
            // SAFETY: retired above, not revived.
            unsafe { Handle::recycle(h.0) };
            Ok(())
        }
        Err((c, e)) => {
            crate::async_events::remember(ObjKind::Cq, id, context, cq as usize);
            // SAFETY: retired above by this thread.
            unsafe { Handle::revive(h.0, CqBody { cq: c, poll }) };
            objects().cqs.insert(
                cq as usize,
                CqEntry {
                    h,
                    events: Vec::new(),
                    channel,
                    parent_domain,
                    _net,
                },
            );
            Err(refused("ibv_destroy_cq", libc::EBUSY, e))
        }
    }
}

/// `ibv_get_cq_event(channel, &cq, &cq_context)`: the next CQ notification of `channel`,
/// waiting for one (in `poll(2)` on the channel's fd, a cancellation point) unless the fd
/// is non-blocking; 0, or -1 + `errno` (`EINVAL` for a bad handle or NULL output,
/// `EAGAIN` when non-blocking and none is pending, `EINTR` when a signal ended the wait).
///
/// # Safety
/// `cq` and `cq_context` are NULL or writable pointers.
#[no_mangle]
pub unsafe extern "C-unwind" fn uroce_ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if cq.is_null() || cq_context.is_null() {
        report(&FfiError::Invalid(
            "ibv_get_cq_event: cq or cq_context is NULL",
        ));
        set_errno(libc::EINVAL);
        return -1;
    }
    blocking_call(-1, || {
        let r: Result<Option<Arc<CompChannel>>, FfiError> = (|| {
            let ch: Arc<CompChannel> = objects()
                .channels
                .get(&(channel as usize))
                .map(|e| Arc::clone(&e.ch))
                .ok_or(FfiError::BadHandle { what: "channel" })?;
            let Some(ev) = ch.try_get_cq_event() else {
                return Ok(Some(ch));
            };
            drop(ch);
            let mut objs = objects();
            let key = *objs
                .cq_by_id
                .get(&ev.cq().id())
                .ok_or(FfiError::BadHandle { what: "cq" })?;
            let entry = objs
                .cqs
                .get_mut(&key)
                .ok_or(FfiError::BadHandle { what: "cq" })?;
            // SAFETY: registered, live CQ allocated by uroce (lock held).
            let user = unsafe { (*entry.raw()).cq_context };
            entry.events.push(ev);
            // SAFETY: the caller passes writable output pointers (checked non-NULL).
            unsafe {
                cq.write(key as *mut ibv_cq);
                cq_context.write(user);
            }
            Ok(None)
        })();
        match r {
            Ok(None) => Attempt::Done(0),
            Ok(Some(ch)) => Attempt::Wait {
                fd: ch.fd().as_raw_fd(),
                keep: Box::new(ch),
            },
            Err(e) => {
                crate::entry::report(&e);
                set_errno(e.errno());
                Attempt::Done(-1)
            }
        }
    })
}

/// `ibv_ack_cq_events(cq, nevents)`: acknowledges events got for `cq` (unknown CQs and
/// surplus counts are ignored).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard((), || {
        let mut objs = objects();
        if let Some(entry) = objs.cqs.get_mut(&(cq as usize)) {
            let n = entry
                .events
                .len()
                .min(usize::try_from(nevents).unwrap_or(usize::MAX));
            entry.events.drain(..n);
            // SAFETY: registered, live CQ allocated by uroce (lock held).
            unsafe {
                let c = entry.raw();
                (*c).comp_events_completed = (*c).comp_events_completed.wrapping_add(nevents);
            }
        }
    })
}

/// `ibv_context.ops.poll_cq(cq, num_entries, wc)`: up to `num_entries` completions into
/// `wc`; the count, or -1 (unknown CQ, negative count, NULL array).
///
/// # Safety
/// `wc` is valid for writing `num_entries` `struct ibv_wc`.
pub unsafe extern "C" fn ops_poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard(-1, || {
        let Ok(n) = usize::try_from(num_entries) else {
            return -1;
        };
        if n == 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let Ok(cq) = cq_ref(cq) else {
            return -1;
        };
        let got: Vec<WorkCompletion> = cq.poll(n);
        for (i, w) in got.iter().enumerate() {
            // SAFETY: `i < got.len() <= num_entries`, and the caller's array holds
            // `num_entries` writable entries.
            unsafe { wc.add(i).write(wc_to_c(w)) };
        }
        c_int::try_from(got.len()).unwrap_or(c_int::MAX)
    })
}

/// `ibv_context.ops.req_notify_cq(cq, solicited_only)`: arms the CQ; 0 or the errno value.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
pub unsafe extern "C" fn ops_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        errno_value(cq_ref(cq).and_then(|c: CqRef| {
            c.req_notify(solicited_only != 0)
                .map_err(|e| refused("ibv_req_notify_cq", libc::EINVAL, e))
        }))
    })
}

// ---------------------------------------------------------------------------------------
// Shared receive queues.
// ---------------------------------------------------------------------------------------

/// [`SrqAttr`] → `ibv_srq_attr`.
fn srq_attr_to_c(a: &SrqAttr) -> ibv_srq_attr {
    ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// `ibv_create_srq(pd, srq_init_attr)`: a basic SRQ (`srq_init_attr->attr` is updated to
/// the granted sizes); NULL + `errno` (`EINVAL`: unknown PD, sizes beyond the device's
/// limits or a limit above `max_wr`; `ENOMEM`: too many SRQs).
///
/// # Safety
/// `srq_init_attr` is NULL or points to a readable and writable `struct ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_srq(
    pd: *mut ibv_pd,
    srq_init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            if srq_init_attr.is_null() {
                return Err(FfiError::Invalid("srq_init_attr is NULL"));
            }
            // SAFETY: caller guarantee: readable srq_init_attr (checked non-NULL).
            let ia = unsafe { srq_init_attr.read() };
            let mut objs = objects();
            let pd_entry = objs.pd(pd)?;
            let srq = pd_entry
                .pd
                .create_srq(&SrqInitAttr {
                    max_wr: ia.attr.max_wr,
                    max_sge: ia.attr.max_sge,
                    srq_limit: ia.attr.srq_limit,
                })
                .map_err(|e| {
                    let errno = match e {
                        uroce_verbs::CreateSrqError::Limit { .. } => libc::ENOMEM,
                        _ => libc::EINVAL,
                    };
                    refused("ibv_create_srq", errno, e)
                })?;
            let granted = srq.query();
            // SAFETY: `pd` is a registered, live PD allocated by uroce (lock held).
            let context = unsafe { (*pd).context };
            // SAFETY: ibv_srq is pointers, integers and glibc pthread objects, all valid
            // zeroed (the pthread ones are then their static initialisers).
            let mut c: ibv_srq = unsafe { zeroed() };
            c.context = context;
            c.srq_context = ia.srq_context;
            c.pd = pd;
            c.handle = srq.srq_num();
            let num = srq.srq_num();
            let h = Handle::<SrqKind>::create(c, srq);
            let p = Handle::c_ptr(h);
            objs.srqs.insert(p as usize, SrqEntry { h: HandlePtr(h) });
            crate::async_events::remember(ObjKind::Srq, num, context, p as usize);
            // SAFETY: caller guarantee: writable srq_init_attr (checked non-NULL).
            unsafe { (*srq_init_attr).attr = srq_attr_to_c(&granted) };
            Ok(p)
        })())
    })
}

/// `ibv_modify_srq(srq, srq_attr, srq_attr_mask)`: resizes (`IBV_SRQ_MAX_WR`) and/or arms
/// the limit event (`IBV_SRQ_LIMIT`); 0 or the errno value (`EINVAL`).
///
/// # Safety
/// `srq_attr` is NULL or points to a readable `struct ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_modify_srq(
    srq: *mut ibv_srq,
    srq_attr: *mut ibv_srq_attr,
    srq_attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if srq_attr.is_null() {
                return Err(FfiError::Invalid("srq_attr is NULL"));
            }
            let mask = u32::try_from(srq_attr_mask)
                .ok()
                .and_then(SrqAttrMask::from_bits)
                .ok_or(FfiError::Invalid("unknown srq_attr_mask bits"))?;
            // SAFETY: caller guarantee: readable srq_attr (checked non-NULL).
            let a = unsafe { srq_attr.read() };
            srq_ref(srq)?
                .modify(
                    &SrqAttr {
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                        srq_limit: a.srq_limit,
                    },
                    mask,
                )
                .map_err(|e| refused("ibv_modify_srq", libc::EINVAL, e))
        })())
    })
}

/// `ibv_query_srq(srq, srq_attr)`: the current sizes and armed limit; 0 or the errno
/// value (`EINVAL`).
///
/// # Safety
/// `srq_attr` is NULL or points to a writable `struct ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_srq(
    srq: *mut ibv_srq,
    srq_attr: *mut ibv_srq_attr,
) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if srq_attr.is_null() {
                return Err(FfiError::Invalid("srq_attr is NULL"));
            }
            let a = srq_ref(srq)?.query();
            // SAFETY: caller guarantee: writable srq_attr (checked non-NULL).
            unsafe { srq_attr.write(srq_attr_to_c(&a)) };
            Ok(())
        })())
    })
}

/// `ibv_destroy_srq(srq)`: 0, or `EBUSY` while QPs are attached, `EINVAL` for an unknown
/// SRQ. Receive WRs still queued are discarded without completions.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || errno_value(destroy_srq(srq)))
}

/// The body of `ibv_destroy_srq` (the exported `uroce_ibv_destroy_srq`), for callers inside the library.
pub(crate) fn destroy_srq(srq: *mut ibv_srq) -> Result<(), FfiError> {
    let SrqEntry { h } = {
        let mut objs = objects();
        let children = objs.srq(srq)?.children();
        refuse_if_busy("ibv_destroy_srq", ObjectKind::Srq, children)?;
        objs.srqs
            .remove(&(srq as usize))
            .ok_or(FfiError::BadHandle { what: "srq" })?
    };
    // SAFETY: `h` was just unpublished by this thread.
    let s = match unsafe { Handle::retire(h.0) } {
        Ok(s) => s,
        Err(e) => {
            objects().srqs.insert(srq as usize, SrqEntry { h });
            return Err(refused("ibv_destroy_srq", libc::EBUSY, format!("{e:?}")));
        }
    };
    let num = s.srq_num();
    // SAFETY: the container's C part stays readable (type-stable memory).
    let context = unsafe { (*h.c_ptr()).context };
    crate::async_events::forget(ObjKind::Srq, num, srq as usize);
    match s.destroy() {
        Ok(()) => {
            // SAFETY: retired above, not revived.
            unsafe { Handle::recycle(h.0) };
            Ok(())
        }
        Err((s, e)) => {
            crate::async_events::remember(ObjKind::Srq, num, context, srq as usize);
            // SAFETY: retired above by this thread.
            unsafe { Handle::revive(h.0, s) };
            objects().srqs.insert(srq as usize, SrqEntry { h });
            Err(refused("ibv_destroy_srq", libc::EBUSY, e))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Queue pairs.
// ---------------------------------------------------------------------------------------

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
            crate::qp_ex::check_send_ops(qp_type, flags)?;
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
        let send_ops = send_ops.unwrap_or_else(|| crate::qp_ex::supported_send_ops(qp_type));
        let p = register_qp(&mut objs, c, qp, send_ops, cap.max_inline_data, net);
        // SAFETY: caller guarantee: writable init_attr (checked non-NULL).
        unsafe { (*init_attr).cap = cap_to_c(&cap) };
        Ok(p)
    })()
}

/// Puts `qp` in a container whose C part is `c` and registers it; the `ibv_qp`. Every QP
/// goes through here: `c`'s `wr_*` pointers are filled for `send_ops_flags` (see
/// [`crate::qp_ex::init_ops`]) and the container gets the QP's `ibv_wr_*` builder.
pub(crate) fn register_qp(
    objs: &mut Objects,
    mut c: ibv_qp_ex,
    qp: uroce_verbs::Qp,
    send_ops_flags: u64,
    max_inline: u32,
    net: Arc<uroce_net::NetDevice>,
) -> *mut ibv_qp {
    let (num, context) = (qp.qp_num(), c.qp_base.context);
    crate::qp_ex::init_ops(&mut c, send_ops_flags);
    let builder = crate::qp_ex::WrBuilder::new(qp.qp_type());
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

/// The body of `ibv_destroy_qp` (the exported `uroce_ibv_destroy_qp`), for callers inside the library.
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
/// around `qp` (every QP of this library has one; see [`crate::qp_ex`]), or NULL +
/// `EINVAL` for a pointer that is not a live QP.
///
/// # Safety
/// None beyond the C contract: the argument is checked as a QP handle (see
/// `crate::handle`) before anything else is read.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    crate::qp_ex::qp_to_qp_ex(qp)
}

/// Most work requests one post call walks (bounds the walk of a corrupt, cyclic list).
const MAX_CHAIN: usize = 1 << 20;

/// A C work request that links to the next one (`ibv_send_wr`, `ibv_recv_wr`).
trait ChainedWr {
    /// The next WR of the chain (NULL at the end).
    fn next_wr(&self) -> *mut Self;
}

impl ChainedWr for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl ChainedWr for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// A post the verbs layer refused, as verbs reports it: `ENOMEM` for a full queue,
/// `EINVAL` for anything else.
fn post_refused(op: &'static str, e: uroce_verbs::PostError) -> FfiError {
    let errno = match e {
        uroce_verbs::PostError::QueueFull { .. } => libc::ENOMEM,
        _ => libc::EINVAL,
    };
    refused(op, errno, e)
}

/// Reports a failed post: `*bad_wr` = `at` (if `bad_wr` is not NULL), errno set; returns
/// the errno value.
///
/// # Safety
/// `bad_wr` is NULL or writable.
unsafe fn chain_failed<W>(bad_wr: *mut *mut W, at: *mut W, e: FfiError) -> c_int {
    report(&e);
    if !bad_wr.is_null() {
        // SAFETY: caller guarantee: writable bad_wr (checked non-NULL).
        unsafe { bad_wr.write(at) };
    }
    crate::entry::report(&e);
    set_errno(e.errno());
    e.errno()
}

/// Posts the chain starting at `first` in order through `post`; 0, or the errno value with
/// `*bad_wr` = the first WR not posted. Walks at most [`MAX_CHAIN`] WRs.
///
/// # Safety
/// `first` is NULL or a valid chain of readable WRs (with readable SGE lists and inline
/// data, which `post` reads); `bad_wr` is NULL or writable.
unsafe fn post_chain<W: ChainedWr>(
    first: *mut W,
    bad_wr: *mut *mut W,
    mut post: impl FnMut(&W) -> Result<(), FfiError>,
) -> c_int {
    let mut cur = first;
    for _ in 0..MAX_CHAIN {
        if cur.is_null() {
            return 0;
        }
        // SAFETY: caller guarantee: every WR of the chain is readable (checked non-NULL).
        let w = unsafe { &*cur };
        if let Err(e) = post(w) {
            // SAFETY: caller guarantee on bad_wr.
            return unsafe { chain_failed(bad_wr, cur, e) };
        }
        cur = w.next_wr();
    }
    // SAFETY: caller guarantee on bad_wr.
    unsafe { chain_failed(bad_wr, cur, FfiError::Invalid("work request list too long")) }
}

/// `ibv_context.ops.post_send(qp, wr, bad_wr)`: posts the chain in order; 0, or the errno
/// value with `*bad_wr` = the first WR not posted (`EINVAL` invalid WR/state, `ENOMEM`
/// queue full).
///
/// # Safety
/// `wr` is NULL or a valid chain of `struct ibv_send_wr` whose SGE lists are readable;
/// `bad_wr` is NULL or writable.
pub unsafe extern "C" fn ops_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        let (r, max_inline) = match qp_ref(qp) {
            Ok(x) => x,
            // SAFETY: caller guarantee on bad_wr.
            Err(e) => return unsafe { chain_failed(bad_wr, wr, e) },
        };
        // Datagram QPs take their destination from each WR (`wr.ud`).
        let datagram = matches!(r.qp_type(), QpType::Ud | QpType::Gsi);
        let post = |w: &ibv_send_wr| {
            // SAFETY: caller guarantee: its SGE list (and inline data) is readable.
            let mut s = unsafe { send_wr_from_c(w, max_inline) }?;
            if datagram {
                s.ud = Some(ud_dest_from_c(w)?);
            }
            r.post_send(s).map_err(|e| post_refused("ibv_post_send", e))
        };
        // SAFETY: caller guarantees on the chain and bad_wr.
        unsafe { post_chain(wr, bad_wr, post) }
    })
}

/// `ibv_context.ops.post_recv(qp, wr, bad_wr)`: posts the chain in order; 0, or the errno
/// value with `*bad_wr` = the first WR not posted.
///
/// # Safety
/// `wr` is NULL or a valid chain of `struct ibv_recv_wr` whose SGE lists are readable;
/// `bad_wr` is NULL or writable.
pub unsafe extern "C" fn ops_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let (r, _) = match qp_ref(qp) {
            Ok(x) => x,
            // SAFETY: caller guarantee on bad_wr.
            Err(e) => return unsafe { chain_failed(bad_wr, wr, e) },
        };
        let post = |w: &ibv_recv_wr| {
            // SAFETY: caller guarantee: its SGE list is readable.
            let rw = unsafe { recv_wr_from_c(w) }?;
            r.post_recv(rw)
                .map_err(|e| post_refused("ibv_post_recv", e))
        };
        // SAFETY: caller guarantees on the chain and bad_wr.
        unsafe { post_chain(wr, bad_wr, post) }
    })
}

/// `ibv_context.ops.post_srq_recv(srq, wr, bad_wr)`: posts the chain to the SRQ in order;
/// 0, or the errno value with `*bad_wr` = the first WR not posted (`EINVAL` invalid WR or
/// unknown SRQ, `ENOMEM` queue full).
///
/// # Safety
/// `wr` is NULL or a valid chain of `struct ibv_recv_wr` whose SGE lists are readable;
/// `bad_wr` is NULL or writable.
pub unsafe extern "C" fn ops_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let r = match srq_ref(srq) {
            Ok(x) => x,
            // SAFETY: caller guarantee on bad_wr.
            Err(e) => return unsafe { chain_failed(bad_wr, wr, e) },
        };
        let post = |w: &ibv_recv_wr| {
            // SAFETY: caller guarantee: its SGE list is readable.
            let rw = unsafe { recv_wr_from_c(w) }?;
            r.post_recv(rw)
                .map_err(|e| post_refused("ibv_post_srq_recv", e))
        };
        // SAFETY: caller guarantees on the chain and bad_wr.
        unsafe { post_chain(wr, bad_wr, post) }
    })
}

// ---------------------------------------------------------------------------------------
// Strings.
// ---------------------------------------------------------------------------------------

/// NUL-terminated descriptions of every completion status, indexed by ABI value.
static WC_STATUS_STR: LazyLock<Vec<CString>> = LazyLock::new(|| {
    let max = WcStatus::ALL.iter().map(|s| s.as_u32()).max().unwrap_or(0);
    (0..=max.max(IBV_WC_TM_RNDV_INCOMPLETE))
        .map(|v| {
            // The tag-matching statuses have no uroce counterpart (no tag matching).
            let text = match v {
                IBV_WC_TM_ERR => "TM error",
                IBV_WC_TM_RNDV_INCOMPLETE => "TM software rendezvous",
                _ => WcStatus::from_u32(v).map_or("unknown", WcStatus::as_str),
            };
            CString::new(text).unwrap_or_default()
        })
        .collect()
});

/// The text for unknown status values.
const UNKNOWN: &std::ffi::CStr = c"unknown";

/// `ibv_wc_status_str(status)`: a static description ("unknown" for unknown values).
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_wc_status_str(status: c_int) -> *const c_char {
    guard(UNKNOWN.as_ptr(), || {
        usize::try_from(status)
            .ok()
            .and_then(|i| WC_STATUS_STR.get(i))
            .map_or(UNKNOWN.as_ptr(), |s| s.as_ptr())
    })
}
