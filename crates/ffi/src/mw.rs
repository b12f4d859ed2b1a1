//! Memory windows in the C ABI: the `ibv_context.ops` slots `alloc_mw`, `bind_mw` and
//! `dealloc_mw` that the header inlines `ibv_alloc_mw`, `ibv_bind_mw` and `ibv_dealloc_mw`
//! call, and the conversion of a BIND_MW work request's `wr.bind_mw` for `ibv_post_send`
//! (LOCAL_INV and SEND_WITH_INV need only `invalidate_rkey`, converted with the rest of the
//! WR). The windows are entries of the object registry ([`crate::objects`], `windows`),
//! keyed by the address of their `struct ibv_mw`, like the regions and PDs they are checked
//! against; a pointer the registry does not know is never dereferenced.

use std::ffi::c_int;

use uroce_verbs::{AccessFlags, BindMwWr, Mw, MwBindInfo, MwType, SendFlags};

use crate::abi::*;
use crate::entry::{errno_value, guard, ptr_or_null};
use crate::error::{refused, FfiError};
use crate::objects::{objects, qp_ref, CBox, Objects};

/// A memory window handed to the application.
pub(crate) struct MwEntry {
    raw: CBox<ibv_mw>,
    mw: Mw,
}

/// Whether a live memory window of `objs` was allocated through `pd` (a PD handle or a
/// parent domain: the pointer the program passed to `ibv_alloc_mw`).
pub(crate) fn any_on(objs: &Objects, pd: *mut ibv_pd) -> bool {
    objs.windows.values().any(|e| {
        // SAFETY: a registered window's `ibv_mw` is uroce's and live while the registry
        // lock (held by whoever holds `objs`) is held; only its `pd` field is read.
        unsafe { (*e.raw.ptr()).pd == pd }
    })
}

/// The window's rights from `mw_access_flags`: the remote rights. `IBV_ACCESS_LOCAL_WRITE`
/// is accepted and ignored, as by the kernel's providers (a window grants remote access
/// only; rdma-core's own tests pass LOCAL_WRITE | REMOTE_WRITE); anything else is refused.
fn window_access(flags: u32) -> Result<AccessFlags, FfiError> {
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    AccessFlags::from_bits(flags)
        .filter(|a| (remote | AccessFlags::LOCAL_WRITE).contains(*a))
        .map(|a| a & remote)
        .ok_or(FfiError::Invalid("mw_access_flags"))
}

/// The bind's region (its L_Key; 0 for a NULL `mr`, allowed only for a type 1 unbind),
/// range and rights.
fn bind_info(info: &ibv_mw_bind_info) -> Result<MwBindInfo, FfiError> {
    let mr_lkey = if info.mr.is_null() {
        if info.length != 0 {
            return Err(FfiError::Invalid("bind_info.mr is NULL"));
        }
        0
    } else {
        objects().mr(info.mr).map(|e| e.mr.lkey())?
    };
    Ok(MwBindInfo {
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: window_access(info.mw_access_flags)?,
    })
}

/// `wr.bind_mw` of an `IBV_WR_BIND_MW` work request (type 2 windows): the window, the new
/// R_Key the application chose and the bind.
pub(crate) fn bind_mw_wr_from_c(b: &ibv_send_wr_bind_mw) -> Result<BindMwWr, FfiError> {
    let mw_rkey = objects()
        .windows
        .get(&(b.mw as usize))
        .map(|e| e.mw.rkey())
        .ok_or(FfiError::BadHandle { what: "mw" })?;
    Ok(BindMwWr::new(mw_rkey, b.rkey, bind_info(&b.bind_info)?))
}

/// `ibv_context.ops.alloc_mw(pd, type)`: a new unbound window, or NULL + `errno`
/// (`EINVAL` bad PD or type, `ENOMEM` at the limit).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
pub unsafe extern "C" fn ops_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            let mw_type = match type_ {
                IBV_MW_TYPE_1 => MwType::Type1,
                IBV_MW_TYPE_2 => MwType::Type2,
                _ => return Err(FfiError::Invalid("memory window type")),
            };
            let (mw, ctx) = {
                let objs = objects();
                let entry = objs.pd(pd)?;
                let mw = entry
                    .pd
                    .alloc_mw(mw_type)
                    .map_err(|e| refused("ibv_alloc_mw", libc::ENOMEM, e))?;
                // SAFETY: `pd` is a registered PD handle or parent domain (resolved above,
                // registry lock held), allocated by uroce and alive; only its `context`
                // field is read.
                (mw, unsafe { (*pd).context })
            };
            let raw = CBox::new(ibv_mw {
                context: ctx,
                pd,
                rkey: mw.rkey(),
                handle: mw.rkey(),
                type_,
            });
            let p = raw.ptr();
            objects().windows.insert(p as usize, MwEntry { raw, mw });
            Ok(p)
        })())
    })
}

/// `ibv_context.ops.bind_mw(qp, mw, mw_bind)` (type 1 windows, `ibv_bind_mw`): posts the
/// bind on the QP's send queue and sets `mw->rkey` to the key the window has once it
/// executes; 0 or the errno value.
///
/// # Safety
/// `mw_bind` is NULL or readable; `mw` is one of ours (checked against the registry
/// before it is written).
pub unsafe extern "C" fn ops_bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if mw_bind.is_null() {
                return Err(FfiError::Invalid("mw_bind is NULL"));
            }
            // SAFETY: caller guarantee: a non-NULL `mw_bind` is readable (plain data).
            let b = unsafe { *mw_bind };
            let info = bind_info(&b.bind_info)?;
            let flags = SendFlags::from_bits(b.send_flags)
                .ok_or(FfiError::Invalid("unknown send_flags"))?;
            let (q, _) = qp_ref(qp)?;
            let objs = objects();
            let entry = objs
                .windows
                .get(&(mw as usize))
                .ok_or(FfiError::BadHandle { what: "mw" })?;
            let rkey = entry
                .mw
                .bind(&q, b.wr_id, flags, info)
                .map_err(|e| refused("ibv_bind_mw", libc::EINVAL, e))?;
            // SAFETY: `mw` is the registered window's own `ibv_mw` (found above, kept alive
            // by the registry lock we hold); the application reads `rkey` after the call.
            unsafe { (*entry.raw.ptr()).rkey = rkey };
            Ok(())
        })())
    })
}

/// `ibv_context.ops.dealloc_mw(mw)`: frees the window (a bound window is invalidated);
/// 0 or the errno value (`EINVAL` unknown window).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
pub unsafe extern "C" fn ops_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            let MwEntry { raw, mw: m } = objects()
                .windows
                .remove(&(mw as usize))
                .ok_or(FfiError::BadHandle { what: "mw" })?;
            let r = m
                .destroy()
                .map_err(|(_, e)| refused("ibv_dealloc_mw", libc::EBUSY, e));
            drop(raw);
            r
        })())
    })
}
