//! Address handles: `ibv_create_ah`, `ibv_destroy_ah`; [`wc`]: `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc`.
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure; each exported function is a
//! thin wrapper around an internal one that the library's other modules call.

pub mod wc;

use std::ffi::c_int;

use crate::abi::*;
use crate::convert::*;
use crate::entry::*;
use crate::error::{refused, FfiError};
use crate::handle::{Handle, HandlePtr};
use crate::objects::*;

symver!("uroce_ibv_create_ah", "ibv_create_ah@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_ah", "ibv_destroy_ah@@IBVERBS_1.1");

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
