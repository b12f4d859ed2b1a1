//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq` and the `post_srq_recv` slot ([`crate::qp::post`]); XRC SRQs:
//! [`crate::xrc`].
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure; each exported function is a
//! thin wrapper around an internal one that the library's other modules call.

use std::ffi::c_int;

use uroce_verbs::{ObjectKind, SrqAttr, SrqAttrMask, SrqInitAttr};

use crate::abi::*;
use crate::async_events::ObjKind;
use crate::entry::*;
use crate::error::{refuse_if_busy, refused, FfiError};
use crate::handle::{Handle, HandlePtr};
use crate::objects::*;

symver!("uroce_ibv_create_srq", "ibv_create_srq@@IBVERBS_1.1");
symver!("uroce_ibv_modify_srq", "ibv_modify_srq@@IBVERBS_1.1");
symver!("uroce_ibv_query_srq", "ibv_query_srq@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_srq", "ibv_destroy_srq@@IBVERBS_1.1");

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

/// The body of `ibv_destroy_srq` (the exported [`uroce_ibv_destroy_srq`]), for callers
/// inside the library.
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
