//! Protection domains: `ibv_alloc_pd`, `ibv_dealloc_pd` (parent domains: [`crate::parent_domain`];
//! shared PDs: [`crate::import`]).
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure; each exported function is a
//! thin wrapper around an internal one that the library's other modules call.

use std::ffi::c_int;

use uroce_verbs::ObjectKind;

use crate::abi::*;
use crate::device::Registry;
use crate::entry::*;
use crate::error::{refuse_if_busy, refused, FfiError};
use crate::objects::*;

symver!("uroce_ibv_alloc_pd", "ibv_alloc_pd@@IBVERBS_1.1");
symver!("uroce_ibv_dealloc_pd", "ibv_dealloc_pd@@IBVERBS_1.1");

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

/// The body of `ibv_alloc_pd` (the exported [`uroce_ibv_alloc_pd`]), for callers inside the
/// library.
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

/// The body of `ibv_dealloc_pd` (the exported [`uroce_ibv_dealloc_pd`]), for callers inside
/// the library.
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
