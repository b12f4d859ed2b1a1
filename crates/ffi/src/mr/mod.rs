//! Memory regions: `ibv_reg_mr`, `ibv_reg_mr_iova2`, `ibv_dereg_mr`; [`rereg`]:
//! `ibv_rereg_mr` and the other registrations (shared MRs: [`crate::import`], memory
//! windows: [`crate::mw`]).
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure; each exported function is a
//! thin wrapper around an internal one that the library's other modules call.

pub mod rereg;

use std::ffi::{c_int, c_uint, c_void};

use uroce_verbs::{AccessFlags, MemBlock};

use crate::abi::*;
use crate::convert::*;
use crate::entry::*;
use crate::error::{refused, FfiError};
use crate::objects::*;

symver!("uroce_ibv_reg_mr", "ibv_reg_mr@@IBVERBS_1.1");
symver!("uroce_ibv_reg_mr_iova2", "ibv_reg_mr_iova2@@IBVERBS_1.8");
symver!("uroce_ibv_dereg_mr", "ibv_dereg_mr@@IBVERBS_1.1");

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
