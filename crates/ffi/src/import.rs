//! Shared contexts: `ibv_import_device`, `ibv_import_pd` / `ibv_unimport_pd`,
//! `ibv_import_mr` / `ibv_unimport_mr` (IBVERBS_1.10).
//!
//! With the kernel's verbs, every `ibv_open_device` opens a uverbs file (`cmd_fd`) that
//! holds the context's objects under small handle numbers; `ibv_import_device` on a
//! duplicate of that descriptor makes another `ibv_context` on the same file, and
//! `ibv_import_pd` / `ibv_import_mr` make new `ibv_pd` / `ibv_mr` structures for objects of
//! the file by their handle (rdma-core's documented semantics). uroce's "kernel" is the
//! library itself, inside the process, so the same sharing is real within one process:
//!
//! * Every `ibv_open_device` opens a *device file*: a process-unique id, and as `cmd_fd` a
//!   memfd (named `uroce-uverbs`) whose first bytes say so: [`MAGIC`], the id and the
//!   process id, sealed against change. The device file is identified by what the
//!   descriptor reads, not by its number (which `dup` changes) nor by `fstat`'s inode
//!   alone: a duplicate (`dup`, `SCM_RIGHTS`, inheritance) reads the same bytes, another
//!   process's device file reads another process id, and a pipe or any other file reads
//!   no [`MAGIC`].
//! * `ibv_import_device(fd)` reads the header: not a uroce device file → NULL, `EINVAL`
//!   (rdma-core answers `EINVAL` for a descriptor that is not a character device); a device
//!   file of another process (passed by `SCM_RIGHTS`, or inherited across `fork`/`exec`)
//!   → NULL, `EOPNOTSUPP` (the objects it names live in that process: cross-process sharing
//!   is not built); a device file of this process with an open context → a new context of
//!   that file (own event queue and `async_fd`; the device, the network device and the
//!   objects are shared), owning `fd`; one whose contexts are all closed → `EINVAL`.
//! * A PD or MR is an object of its device file (see `crate::objects`), named by its handle
//!   number: a PD's number in the uroce context ([`uroce_verbs::Pd::id`]), an MR's number
//!   given at registration (process-wide counter; it stays across `ibv_rereg_mr`).
//!   `ibv_import_pd(ctx, handle)` / `ibv_import_mr(pd, handle)` make a new C handle for
//!   the object of `ctx`'s (`pd`'s) device file with that number — `ENOENT` when there is
//!   none, as the kernel's object lookup answers an unknown handle — which works wherever
//!   the original does (QPs, SRQs, AHs, MWs and MRs on an imported PD, an imported MR's
//!   keys in work requests). An imported MR shows the region's address (rdma-core's is
//!   NULL: the kernel does not report it; uroce knows it).
//! * `ibv_unimport_pd` / `ibv_unimport_mr` free one C handle and leave the object;
//!   `ibv_dealloc_pd` / `ibv_dereg_mr` through any handle destroy the object for every
//!   handle (with the usual `EBUSY` rules), after which its other handles are refused
//!   (`EINVAL`) until unimported.
//! * Contexts close in any order: closing one closes its `cmd_fd` and event queue; the
//!   objects stay (as before, closing a context destroys none of its objects) and the other
//!   contexts of the file keep using and importing them.
//!
//! `ibv_import_dm` stays unsupported: uroce has no device memory (`max_dm_size` 0).

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use crate::abi::*;
use crate::device::Registry;
use crate::entry::*;
use crate::error::FfiError;
use crate::objects::*;

symver!("uroce_ibv_import_device", "ibv_import_device@@IBVERBS_1.10");
symver!("uroce_ibv_import_pd", "ibv_import_pd@@IBVERBS_1.10");
symver!("uroce_ibv_unimport_pd", "ibv_unimport_pd@@IBVERBS_1.10");
symver!("uroce_ibv_import_mr", "ibv_import_mr@@IBVERBS_1.10");
symver!("uroce_ibv_unimport_mr", "ibv_unimport_mr@@IBVERBS_1.10");

/// The first bytes of a device file's memfd.
pub const MAGIC: [u8; 8] = *b"uroceDF\x01";
/// The header: [`MAGIC`], the process id (u32, little-endian), 4 zero bytes, the device
/// file id (u64, little-endian).
const HEADER_LEN: usize = 24;

/// The header of device file `id` of this process.
fn header(id: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    h[16..].copy_from_slice(&id.to_le_bytes());
    h
}

/// The last OS error as an open failure of `what`.
fn os_error(what: &str) -> FfiError {
    FfiError::Open(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// Makes the `cmd_fd` of a new device file `id`: a sealed memfd holding its header.
///
/// # Errors
/// [`FfiError::Open`] when the memfd cannot be made or written.
pub(crate) fn device_file(id: u64) -> Result<OwnedFd, FfiError> {
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"uroce-uverbs".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(os_error("memfd_create"));
    }
    // SAFETY: a descriptor memfd_create just returned, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let h = header(id);
    // SAFETY: writes HEADER_LEN bytes from our array to the memfd we own.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), h.as_ptr().cast(), HEADER_LEN, 0) };
    if usize::try_from(n).ok() != Some(HEADER_LEN) {
        return Err(os_error("writing the device file"));
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS on the memfd we own, with valid seal bits.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_error("sealing the device file"));
    }
    Ok(fd)
}

/// The device file `fd` names, if it is one of this process's.
///
/// # Errors
/// [`FfiError::Invalid`] when `fd` is not a readable uroce device file,
/// [`FfiError::Unsupported`] when it is another process's.
pub(crate) fn read_device_file(fd: RawFd) -> Result<u64, FfiError> {
    let mut h = [0u8; HEADER_LEN];
    // SAFETY: reads at most HEADER_LEN bytes into our array; an invalid or unreadable
    // descriptor is reported by -1 (pread never moves the descriptor's offset).
    let n = unsafe { libc::pread(fd, h.as_mut_ptr().cast(), HEADER_LEN, 0) };
    if usize::try_from(n).ok() != Some(HEADER_LEN) || h[..8] != MAGIC {
        return Err(FfiError::Invalid(
            "ibv_import_device: the descriptor is not the cmd_fd of a uroce context",
        ));
    }
    let pid = h
        .get(8..12)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes);
    let id = h
        .get(16..24)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes);
    match (pid, id) {
        (Some(pid), Some(id)) if pid == std::process::id() => Ok(id),
        (Some(_), Some(_)) => Err(FfiError::Unsupported(
            "ibv_import_device: the descriptor is the cmd_fd of a uroce context of another \
             process; imports work only inside the process that opened the device",
        )),
        _ => Err(FfiError::Invalid(
            "ibv_import_device: bad device file header",
        )),
    }
}

/// A new descriptor (close-on-exec) for the open file of `fd`.
///
/// # Errors
/// [`FfiError::Refused`] with `dup`'s errno.
pub(crate) fn dup_fd(fd: RawFd) -> Result<OwnedFd, FfiError> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor number; an invalid one is reported by -1.
    let r = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return Err(FfiError::Refused {
            op: "ibv_import_device",
            errno: e.raw_os_error().unwrap_or(libc::EMFILE),
            reason: format!("duplicating cmd_fd: {e}"),
        });
    }
    // SAFETY: a descriptor fcntl just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// `ENOENT` for a handle number that names no object of the device file.
fn no_object(op: &'static str, what: &str, handle: u32) -> FfiError {
    FfiError::Refused {
        op,
        errno: libc::ENOENT,
        reason: format!("no {what} with handle {handle} in the context's device file"),
    }
}

/// `ibv_import_device(cmd_fd)`: a new context of the device file `cmd_fd` names (see the
/// module doc), which owns `cmd_fd` from then on; NULL + `errno` (`EINVAL`: not a uroce
/// device file, or none of its contexts is open; `EOPNOTSUPP`: another process's).
///
/// # Safety
/// None beyond the C contract: the descriptor is only read (`pread`) until it is known
/// to be a device file of this process.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        ptr_or_null(Registry::import(cmd_fd))
    })
}

/// `ibv_import_pd(context, pd_handle)`: a new `ibv_pd` of `context` for the PD with handle
/// number `pd_handle` of the context's device file; NULL + `errno` (`EINVAL`: bad
/// context; `ENOENT`: no such PD).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_import_pd(
    context: *mut ibv_context,
    pd_handle: u32,
) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            let obj = (Registry::file(context)?, pd_handle);
            let mut objs = objects();
            if !objs.pd_objs.contains_key(&obj) {
                return Err(no_object("ibv_import_pd", "PD", pd_handle));
            }
            let raw = CBox::new(ibv_pd {
                context,
                handle: pd_handle,
            });
            let p = raw.ptr();
            objs.pds.insert(p as usize, PdHandle { raw, obj });
            Ok(p)
        })())
    })
}

/// `ibv_unimport_pd(pd)`: frees the `ibv_pd` handle `pd` (imported or allocated) and
/// leaves the PD, which its other handles, and `ibv_import_pd`, still reach. Objects made
/// through `pd` are not affected. Anything else (NULL, a parent domain, an unknown
/// pointer) is ignored (reported under `UROCE_DEBUG`).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_unimport_pd(pd: *mut ibv_pd) {
    guard((), || {
        let h = objects().pds.remove(&(pd as usize));
        if h.is_none() {
            report(&FfiError::BadHandle {
                what: "pd (ibv_unimport_pd)",
            });
        }
        drop(h);
    });
}

/// `ibv_import_mr(pd, mr_handle)`: a new `ibv_mr` (in `pd`'s context, with `pd` as its
/// PD) for the MR with handle number `mr_handle` of `pd`'s device file: same handle,
/// keys, length and address; NULL + `errno` (`EINVAL`: bad or dead PD, or an MR of
/// another PD; `ENOENT`: no such MR).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            let mut objs = objects();
            let pd_obj = objs.pd_key(pd)?;
            let pd_id = objs.pd(pd)?.pd.id();
            let obj = (pd_obj.0, mr_handle);
            let m = objs
                .mr_objs
                .get(&obj)
                .ok_or_else(|| no_object("ibv_import_mr", "MR", mr_handle))?;
            if m.mr.pd_id() != pd_id {
                return Err(FfiError::Invalid(
                    "ibv_import_mr: the MR belongs to another PD",
                ));
            }
            let context = {
                // SAFETY: `pd` is a registered PD handle or parent domain (resolved above,
                // lock held), allocated by uroce; reading one field.
                unsafe { (*pd).context }
            };
            let raw = CBox::new(ibv_mr {
                context,
                pd,
                addr: m.addr as *mut c_void,
                length: m.length,
                handle: mr_handle,
                lkey: m.mr.lkey(),
                rkey: m.mr.rkey(),
            });
            let p = raw.ptr();
            objs.mrs.insert(p as usize, MrHandle { raw, obj });
            Ok(p)
        })())
    })
}

/// `ibv_unimport_mr(mr)`: frees the `ibv_mr` handle `mr` (imported or registered) and
/// leaves the region registered, reachable through its other handles and
/// `ibv_import_mr`. Anything else is ignored (reported under `UROCE_DEBUG`).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_unimport_mr(mr: *mut ibv_mr) {
    guard((), || {
        let h = objects().mrs.remove(&(mr as usize));
        if h.is_none() {
            report(&FfiError::BadHandle {
                what: "mr (ibv_unimport_mr)",
            });
        }
        drop(h);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_file_reads_back_and_others_are_refused() {
        let fd = device_file(42).expect("memfd");
        assert_eq!(read_device_file(fd.as_raw_fd()), Ok(42));
        let dup = dup_fd(fd.as_raw_fd()).expect("dup");
        assert_eq!(read_device_file(dup.as_raw_fd()), Ok(42));
        // Sealed: the header cannot be rewritten.
        let junk = [0u8; 4];
        // SAFETY: a 4-byte write from our array to our memfd (refused by the seal).
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), junk.as_ptr().cast(), 4, 0) };
        assert_eq!(n, -1);
        // A pipe, and no descriptor at all: not a device file.
        let mut p = [0 as c_int; 2];
        // SAFETY: pipe writes two descriptors into our array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: the two descriptors pipe just returned.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        assert_eq!(
            read_device_file(r.as_raw_fd()).map_err(|e| e.errno()),
            Err(libc::EINVAL)
        );
        drop((r, w));
        assert_eq!(
            read_device_file(-1).map_err(|e| e.errno()),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn another_process_header_is_unsupported() {
        // The same bytes as another process would write: its process id differs.
        let mut h = header(7);
        h[8..12].copy_from_slice(&(std::process::id() ^ 1).to_le_bytes());
        // SAFETY: a NUL-terminated name and valid flags; checked below.
        let other = unsafe { libc::memfd_create(c"other".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(other >= 0);
        // SAFETY: the descriptor just returned.
        let other = unsafe { OwnedFd::from_raw_fd(other) };
        // SAFETY: writes the 24 header bytes from our array.
        let n = unsafe { libc::pwrite(other.as_raw_fd(), h.as_ptr().cast(), HEADER_LEN, 0) };
        assert_eq!(n, HEADER_LEN as isize);
        assert_eq!(
            read_device_file(other.as_raw_fd()).map_err(|e| e.errno()),
            Err(libc::EOPNOTSUPP)
        );
    }
}
