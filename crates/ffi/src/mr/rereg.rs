//! `ibv_rereg_mr`: a memory region moved to another PD, given other access rights or
//! another address range, in place ([`uroce_verbs::Mr::rereg`]: same `ibv_mr`, same keys
//! unless a late in-flight reference still holds the old region's number).

use std::ffi::{c_int, c_void};

use uroce_verbs::{MemBlock, ReregMrError};

use crate::abi::{ibv_mr, ibv_pd};
use crate::convert::mr_access;
use crate::entry::{guard, report, set_errno, symver};
use crate::error::FfiError;
use crate::objects::{objects, MrEntry};

symver!("uroce_ibv_rereg_mr", "ibv_rereg_mr@@IBVERBS_1.1");

/// `IBV_REREG_MR_CHANGE_TRANSLATION`: new `addr` / `length`.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
/// `IBV_REREG_MR_CHANGE_PD`: new `pd`.
pub const IBV_REREG_MR_CHANGE_PD: c_int = 2;
/// `IBV_REREG_MR_CHANGE_ACCESS`: new `access`.
pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 4;
/// The flags uroce accepts (`IBV_REREG_MR_KEEP_VALID` is refused, as the kernel's uverbs
/// refuses it).
const SUPPORTED: c_int =
    IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;

/// `IBV_REREG_MR_ERR_INPUT`: the arguments were refused; the MR is unchanged and valid.
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`: the re-registration failed; the MR should not be used any
/// more (only deregistered).
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// The MR object of a region at `addr` of `length` bytes.
fn entry(mr: uroce_verbs::Mr, addr: *mut c_void, length: usize) -> MrEntry {
    MrEntry {
        mr,
        addr: addr as usize,
        length,
    }
}

/// Reports `e`, sets `errno` and returns `code`.
fn fail(code: c_int, e: &FfiError) -> c_int {
    report(e);
    set_errno(e.errno());
    code
}

/// `ibv_rereg_mr(mr, flags, pd, addr, length, access)`: 0, or `IBV_REREG_MR_ERR_INPUT`
/// with `errno` `EINVAL` (unknown MR or PD, flags 0 or unknown bits, a NULL or empty new
/// range, invalid access, a PD of another device file (see `crate::import`); the MR is
/// unchanged), or `IBV_REREG_MR_ERR_CMD` (`EBUSY`: an access to the old region did not
/// finish within the destroy timeout, which leaves the region unpublished; `ENOMEM`: the
/// new region could not be registered). On success `mr->pd`, `addr`, `length`, `lkey`,
/// `rkey` describe the new region; `mr->handle` stays (the same MR object; its other
/// handles, from `ibv_import_mr`, keep the values they were made with, as with rdma-core).
/// The registry lock is held throughout, so other object calls wait for an in-flight
/// access to the old region to finish.
///
/// # Safety
/// With `IBV_REREG_MR_CHANGE_TRANSLATION`, `[addr, addr + length)` is application memory
/// that stays allocated until the MR is deregistered (the contract of `ibv_reg_mr`).
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard(IBV_REREG_MR_ERR_CMD, || {
        let input = |why: &'static str| fail(IBV_REREG_MR_ERR_INPUT, &FfiError::Invalid(why));
        if flags == 0 || flags & !SUPPORTED != 0 {
            return input("ibv_rereg_mr: flags is 0 or has bits other than CHANGE_TRANSLATION, CHANGE_PD, CHANGE_ACCESS");
        }
        let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
        if translation && (addr.is_null() || length == 0) {
            return input("ibv_rereg_mr: CHANGE_TRANSLATION with a NULL address or length 0");
        }
        let mut objs = objects();
        let Some((obj, raw)) = objs.mrs.get(&(mr as usize)).map(|h| (h.obj, h.raw.ptr())) else {
            return fail(IBV_REREG_MR_ERR_INPUT, &FfiError::BadHandle { what: "mr" });
        };
        let Some(MrEntry {
            mr: old,
            addr: prev_addr,
            length: old_length,
        }) = objs.mr_objs.remove(&obj)
        else {
            return fail(IBV_REREG_MR_ERR_INPUT, &FfiError::BadHandle { what: "mr" });
        };
        let old_addr = prev_addr as *mut c_void;
        // SAFETY: `raw` is the registered, live ibv_mr handle allocated by uroce (registry
        // lock held); reading one field.
        let old_pd = unsafe { (*raw).pd };
        let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            pd
        } else {
            old_pd
        };
        let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            mr_access(access)
        } else {
            Ok(old.access())
        };
        let (new_addr, new_length, iova) = if translation {
            (addr, length, None)
        } else {
            (old_addr, old_length, Some(old.iova()))
        };
        // SAFETY: the new range is live application memory (caller contract for a new
        // translation; the original ibv_reg_mr contract for the old range).
        let block = unsafe { MemBlock::from_raw(new_addr.cast(), new_length) };
        let checked = new_access.and_then(|a| {
            if objs.pd_key(new_pd)?.0 != obj.0 {
                return Err(FfiError::Invalid(
                    "ibv_rereg_mr: the new PD belongs to another device file",
                ));
            }
            let p = objs.pd(new_pd)?;
            let b = block.map_err(|e| FfiError::Refused {
                op: "ibv_rereg_mr",
                errno: libc::EINVAL,
                reason: e.to_string(),
            })?;
            Ok((p, b, a))
        });
        let (pd_entry, block, new_access) = match checked {
            Ok(v) => v,
            Err(e) => {
                objs.mr_objs.insert(obj, entry(old, old_addr, old_length));
                return fail(IBV_REREG_MR_ERR_INPUT, &e);
            }
        };
        let refused = |errno: c_int, reason: String| FfiError::Refused {
            op: "ibv_rereg_mr",
            errno,
            reason,
        };
        match old.rereg(&pd_entry.pd, block, new_access, iova) {
            Ok(new) => {
                // SAFETY: `raw` is uroce's live ibv_mr (registry lock held); the application
                // only reads it. The handle number stays (the MR object is the same).
                unsafe {
                    let m = &mut *raw;
                    m.pd = new_pd;
                    m.addr = new_addr;
                    m.length = new_length;
                    m.lkey = new.lkey();
                    m.rkey = new.rkey();
                }
                objs.mr_objs.insert(obj, entry(new, new_addr, new_length));
                0
            }
            Err(ReregMrError::Invalid(m, e)) => {
                objs.mr_objs.insert(obj, entry(m, old_addr, old_length));
                fail(
                    IBV_REREG_MR_ERR_INPUT,
                    &refused(libc::EINVAL, e.to_string()),
                )
            }
            Err(ReregMrError::ForeignPd(m)) => {
                objs.mr_objs.insert(obj, entry(m, old_addr, old_length));
                let why = "the PD belongs to another context".to_string();
                fail(IBV_REREG_MR_ERR_INPUT, &refused(libc::EINVAL, why))
            }
            Err(ReregMrError::Busy(m, e)) => {
                objs.mr_objs.insert(obj, entry(m, old_addr, old_length));
                fail(IBV_REREG_MR_ERR_CMD, &refused(libc::EBUSY, e.to_string()))
            }
            Err(other) => {
                // The old region is gone and no new one exists: the MR object is gone, its
                // handles stay allocated (registered, naming nothing) so that the
                // application's pointers stay readable; ibv_dereg_mr on one reports EINVAL.
                fail(
                    IBV_REREG_MR_ERR_CMD,
                    &refused(libc::ENOMEM, other.to_string()),
                )
            }
        }
    })
}
