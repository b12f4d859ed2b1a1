//! Thread domains and parent domains (`ibv_alloc_td`, `ibv_dealloc_td`,
//! `ibv_alloc_parent_domain`), and `ibv_query_rt_values_ex`: all header inlines that call
//! `verbs_context` slots (`alloc_td`, `dealloc_td`, `alloc_parent_domain`,
//! `query_rt_values`), so none of them is an exported symbol.
//!
//! A parent domain is an `ibv_pd` of its own that stands for the protection domain it was
//! made from: wherever a PD is taken (`ibv_create_qp`, `ibv_create_qp_ex`, `ibv_reg_mr`,
//! `ibv_create_srq`, `ibv_create_ah`, `ibv_alloc_mw`, `ibv_create_cq_ex` with
//! `IBV_CQ_INIT_ATTR_MASK_PD`), the registry resolves it to that PD
//! (`crate::objects::Objects::pd`); the objects keep the parent domain's pointer in their
//! `pd` field, as the program passed it. `ibv_dealloc_pd` of a parent domain frees it
//! (`EBUSY` while a QP, MR, SRQ, AH, memory window or extended CQ made through it lives);
//! the protection domain cannot be deallocated (`EBUSY`) while a parent domain refers to
//! it, nor a thread domain while a parent domain names it.
//!
//! The custom allocators (`IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`) and `pd_context` are
//! accepted and kept, and **never called**: uroce's queues (send and receive queues, CQ
//! entries, SRQs) are Rust collections of the verbs layer, not buffers a provider lays out
//! for a device to read, so there is nothing to allocate through them. The libibverbs
//! documentation of `ibv_alloc_parent_domain` says the provider *may* call them. A thread
//! domain is accepted and is a hint only: uroce's queues take their locks either way.
//!
//! `ibv_query_rt_values_ex` with `IBV_VALUES_MASK_RAW_CLOCK` returns the device clock that
//! stamps completions (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, see `crate::cq::ex`):
//! `CLOCK_MONOTONIC`, a 1 GHz clock (`hca_core_clock` = 1 000 000 kHz), as a `timespec`.

use std::ffi::{c_int, c_void};

use crate::abi::{ibv_context, ibv_pd};
use crate::device::Registry;
use crate::entry::{errno_value, guard, ptr_or_null};
use crate::error::FfiError;
use crate::objects::{objects, CBox, Objects};

/// `struct ibv_td_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_td_init_attr {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_td`: a thread domain.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_td {
    /// The context it belongs to.
    pub context: *mut ibv_context,
}

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`: `alloc` and `free` are set.
pub const IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1 << 0;
/// `IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`: `pd_context` is set.
pub const IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 1 << 1;

/// The custom allocator of a parent domain.
pub type AllocFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void;
/// The custom free function of a parent domain.
pub type FreeFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64);

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_parent_domain_init_attr {
    /// The protection domain (not NULL).
    pub pd: *mut ibv_pd,
    /// A thread domain, or NULL.
    pub td: *mut ibv_td,
    /// `IBV_PARENT_DOMAIN_INIT_ATTR_*`.
    pub comp_mask: u32,
    /// Custom allocator (with `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`).
    pub alloc: Option<AllocFn>,
    /// Custom free (with `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`).
    pub free: Option<FreeFn>,
    /// Passed to `alloc`/`free` (with `IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`).
    pub pd_context: *mut c_void,
}

/// `IBV_VALUES_MASK_RAW_CLOCK`.
pub const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1 << 0;

/// `struct ibv_values_ex`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_values_ex {
    /// In: the values asked for; out: those returned.
    pub comp_mask: u32,
    /// The device's raw clock.
    pub raw_clock: libc::timespec,
}

/// A thread domain.
pub(crate) struct TdEntry {
    pub(crate) raw: CBox<ibv_td>,
}

/// A parent domain.
pub(crate) struct ParentDomainEntry {
    pub(crate) raw: CBox<ibv_pd>,
    /// The protection domain object (a key of `Objects::pd_objs`).
    pub(crate) protection: crate::objects::ObjKey,
    /// The address of its thread domain's `ibv_td` (0: none).
    pub(crate) td: usize,
    /// The custom allocators and their context: kept, never called (see the module docs).
    pub(crate) _allocators: (Option<AllocFn>, Option<FreeFn>, usize),
}

/// Checks that `pd` is a parent domain of `context` (a CQ's `IBV_CQ_INIT_ATTR_MASK_PD`).
pub(crate) fn check_parent_domain(
    context: *mut ibv_context,
    pd: *mut ibv_pd,
) -> Result<(), FfiError> {
    let objs = objects();
    let e = objs
        .parent_domains
        .get(&(pd as usize))
        .ok_or(FfiError::Invalid(
            "cq_init_attr_ex.parent_domain is not a parent domain",
        ))?;
    // SAFETY: a registered parent domain's `ibv_pd` is allocated by uroce and live while
    // the registry lock is held.
    if unsafe { (*e.raw.ptr()).context } != context {
        return Err(FfiError::Invalid(
            "cq_init_attr_ex.parent_domain belongs to another context",
        ));
    }
    Ok(())
}

/// Whether a QP, MR, SRQ, AH, extended CQ or memory window was made through the parent
/// domain at `pd`.
fn parent_domain_in_use(objs: &Objects, pd: *mut ibv_pd) -> bool {
    // Registered objects are live while the registry lock (held by whoever holds `objs`)
    // is held; only their `pd` field is read.
    let qp = |q: &crate::objects::QpEntry| {
        // SAFETY: a registered QP's container is live (see above).
        unsafe { (*q.h.c_ptr()).qp_base.pd == pd }
    };
    let mr = |m: &crate::objects::MrHandle| {
        // SAFETY: a registered MR's `ibv_mr` is uroce's and live (see above).
        unsafe { (*m.raw.ptr()).pd == pd }
    };
    let srq = |s: &crate::objects::SrqEntry| {
        // SAFETY: a registered SRQ's container is live (see above).
        unsafe { (*s.h.c_ptr()).pd == pd }
    };
    let ah = |a: &crate::objects::AhEntry| {
        // SAFETY: a registered AH's container is live (see above).
        unsafe { (*a.h.c_ptr()).pd == pd }
    };
    objs.qps.values().any(qp)
        || objs.mrs.values().any(mr)
        || objs.srqs.values().any(srq)
        || objs.ahs.values().any(ah)
        || objs.cqs.values().any(|c| c.parent_domain == pd as usize)
        || crate::mw::any_on(objs, pd)
}

/// The parent domain part of `ibv_dealloc_pd`: `None` when `pd` is not a parent domain,
/// else the result of freeing it (`EBUSY` while objects made through it live).
pub(crate) fn dealloc_parent_domain(pd: *mut ibv_pd) -> Option<Result<(), FfiError>> {
    let mut objs = objects();
    if !objs.parent_domains.contains_key(&(pd as usize)) {
        return None;
    }
    if parent_domain_in_use(&objs, pd) {
        return Some(Err(FfiError::Refused {
            op: "ibv_dealloc_pd",
            errno: libc::EBUSY,
            reason: "QPs, MRs, SRQs, AHs, CQs or MWs made through the parent domain live".into(),
        }));
    }
    objs.parent_domains.remove(&(pd as usize));
    Some(Ok(()))
}

/// Whether a parent domain refers to the protection domain object `pd`.
pub(crate) fn has_parent_domains(objs: &Objects, pd: crate::objects::ObjKey) -> bool {
    objs.parent_domains.values().any(|p| p.protection == pd)
}

/// `verbs_context.alloc_td(context, init_attr)`: a thread domain; NULL + `errno`
/// (`EINVAL` for a bad context or a non-zero `comp_mask`).
///
/// # Safety
/// `init_attr` is NULL or readable.
pub unsafe extern "C" fn vctx_alloc_td(
    context: *mut ibv_context,
    init_attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            if init_attr.is_null() {
                return Err(FfiError::Invalid("ibv_alloc_td: init_attr is NULL"));
            }
            // SAFETY: caller guarantee: readable (checked non-NULL).
            if unsafe { (*init_attr).comp_mask } != 0 {
                return Err(FfiError::Invalid("ibv_alloc_td: comp_mask is not 0"));
            }
            Registry::net(context)?;
            let raw = CBox::new(ibv_td { context });
            let p = raw.ptr();
            objects().tds.insert(p as usize, TdEntry { raw });
            Ok(p)
        })())
    })
}

/// `verbs_context.dealloc_td(td)`: 0, `EBUSY` while a parent domain names it, `EINVAL`
/// for an unknown thread domain.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
pub unsafe extern "C" fn vctx_dealloc_td(td: *mut ibv_td) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            let mut objs = objects();
            if !objs.tds.contains_key(&(td as usize)) {
                return Err(FfiError::BadHandle { what: "td" });
            }
            if objs.parent_domains.values().any(|p| p.td == td as usize) {
                return Err(FfiError::Refused {
                    op: "ibv_dealloc_td",
                    errno: libc::EBUSY,
                    reason: "a parent domain uses the thread domain".into(),
                });
            }
            objs.tds.remove(&(td as usize));
            Ok(())
        })())
    })
}

/// `verbs_context.alloc_parent_domain(context, attr)`: a parent domain of `attr->pd`;
/// NULL + `errno` (`EINVAL` for a NULL or foreign PD or TD, a parent domain as `pd`,
/// unknown `comp_mask` bits, or `ALLOCATORS` without both functions).
///
/// # Safety
/// `attr` is NULL or points to a readable `struct ibv_parent_domain_init_attr`.
pub unsafe extern "C" fn vctx_alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            if attr.is_null() {
                return Err(FfiError::Invalid("ibv_alloc_parent_domain: attr is NULL"));
            }
            // SAFETY: caller guarantee: readable attr (checked non-NULL).
            let a = unsafe { attr.read() };
            let known =
                IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
            if a.comp_mask & !known != 0 {
                return Err(FfiError::Invalid(
                    "ibv_alloc_parent_domain: unknown comp_mask bits",
                ));
            }
            let with_alloc = a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0;
            if with_alloc && (a.alloc.is_none() || a.free.is_none()) {
                return Err(FfiError::Invalid(
                    "ibv_alloc_parent_domain: ALLOCATORS without alloc and free",
                ));
            }
            Registry::net(context)?;
            let mut objs = objects();
            // Only a protection domain (a handle of a live PD object), not another parent
            // domain.
            let (handle, protection) = {
                let e = objs
                    .pds
                    .get(&(a.pd as usize))
                    .filter(|h| objs.pd_objs.contains_key(&h.obj))
                    .ok_or(FfiError::BadHandle { what: "pd" })?;
                // SAFETY: a registered PD's `ibv_pd` is uroce's and live (lock held).
                let (ctx, handle) = unsafe { ((*e.raw.ptr()).context, (*e.raw.ptr()).handle) };
                if ctx != context {
                    return Err(FfiError::Invalid(
                        "ibv_alloc_parent_domain: the PD belongs to another context",
                    ));
                }
                (handle, e.obj)
            };
            if !a.td.is_null() {
                let t = objs
                    .tds
                    .get(&(a.td as usize))
                    .ok_or(FfiError::BadHandle { what: "td" })?;
                // SAFETY: a registered TD is uroce's and live (lock held).
                if unsafe { (*t.raw.ptr()).context } != context {
                    return Err(FfiError::Invalid(
                        "ibv_alloc_parent_domain: the TD belongs to another context",
                    ));
                }
            }
            let pd_context = if a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
                a.pd_context as usize
            } else {
                0
            };
            let allocators = if with_alloc {
                (a.alloc, a.free, pd_context)
            } else {
                (None, None, pd_context)
            };
            let raw = CBox::new(ibv_pd { context, handle });
            let p = raw.ptr();
            objs.parent_domains.insert(
                p as usize,
                ParentDomainEntry {
                    raw,
                    protection,
                    td: a.td as usize,
                    _allocators: allocators,
                },
            );
            Ok(p)
        })())
    })
}

/// `verbs_context.query_rt_values(context, values)`: with `IBV_VALUES_MASK_RAW_CLOCK` the
/// device clock (`CLOCK_MONOTONIC`, 1 GHz) as a `timespec`; 0, `EINVAL` for a bad context
/// or NULL `values`, `EOPNOTSUPP` when no value uroce has is asked for.
///
/// # Safety
/// `values` is NULL or points to a readable and writable `struct ibv_values_ex`.
pub unsafe extern "C" fn vctx_query_rt_values(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if values.is_null() {
                return Err(FfiError::Invalid("ibv_query_rt_values_ex: values is NULL"));
            }
            Registry::net(context)?;
            // SAFETY: caller guarantee: readable and writable (checked non-NULL).
            let v = unsafe { &mut *values };
            if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK == 0 {
                return Err(FfiError::Unsupported(
                    "ibv_query_rt_values_ex: only IBV_VALUES_MASK_RAW_CLOCK",
                ));
            }
            let ns = uroce_verbs::cq::monotonic_ns();
            v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
            v.raw_clock = libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            };
            Ok(())
        })())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_rdma_core_44() {
        assert_eq!(size_of::<ibv_parent_domain_init_attr>(), 48);
        assert_eq!(
            std::mem::offset_of!(ibv_parent_domain_init_attr, comp_mask),
            16
        );
        assert_eq!(
            std::mem::offset_of!(ibv_parent_domain_init_attr, pd_context),
            40
        );
        assert_eq!(size_of::<ibv_values_ex>(), 24);
        assert_eq!(std::mem::offset_of!(ibv_values_ex, raw_clock), 8);
        assert_eq!(size_of::<ibv_td>(), 8);
    }
}
