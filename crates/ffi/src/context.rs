//! Devices and contexts: the device list, `ibv_open_device` / `ibv_close_device`, the
//! device, port and GID queries, `ibv_read_sysfs_file` (the registry behind them:
//! [`crate::device`]).
//!
//! Each function has an internal `#[no_mangle]` name `uroce_<public name>`; a `.symver`
//! directive gives it its public versioned name (`ibv_get_device_list@@IBVERBS_1.1`, …),
//! and `libibverbs.map` defines the version nodes (docs/ARCHITECTURE.md, "ffi"). The
//! directives are left out of `cfg(test)` builds, which link into an executable without
//! the version script.
//!
//! Every entry point: catches panics (a panic never unwinds into C; it reports `EIO`),
//! checks pointers for NULL and context/device handles against the registry before using
//! them, and sets `errno` on failure. Return conventions follow rdma-core 44: functions
//! returning `int` report `0`/`-1` + `errno` (`ibv_close_device`, `ibv_query_gid`,
//! `ibv_query_gid_type`, `ibv_read_sysfs_file`) or `0`/the errno value
//! (`ibv_query_device`, `ibv_query_port`, `_ibv_query_gid_ex`), as documented per function.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::io::Read as _;
use std::mem::{offset_of, size_of};
use std::os::unix::ffi::OsStringExt as _;

use crate::abi::*;
use crate::device::{self, Registry};
use crate::entry::*;
use crate::error::FfiError;

symver!(
    "uroce_ibv_get_device_list",
    "ibv_get_device_list@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_free_device_list",
    "ibv_free_device_list@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_get_device_name",
    "ibv_get_device_name@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_get_device_guid",
    "ibv_get_device_guid@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_get_device_index",
    "ibv_get_device_index@@IBVERBS_1.9"
);
symver!("uroce_ibv_open_device", "ibv_open_device@@IBVERBS_1.1");
symver!("uroce_ibv_close_device", "ibv_close_device@@IBVERBS_1.1");
symver!("uroce_ibv_query_device", "ibv_query_device@@IBVERBS_1.1");
symver!("uroce_ibv_query_port", "ibv_query_port@@IBVERBS_1.1");
symver!("uroce_ibv_query_gid", "ibv_query_gid@@IBVERBS_1.1");
symver!(
    "uroce_ibv_query_gid_type",
    "ibv_query_gid_type@@IBVERBS_PRIVATE_34"
);
symver!("uroce__ibv_query_gid_ex", "_ibv_query_gid_ex@@IBVERBS_1.11");
symver!(
    "uroce_ibv_read_sysfs_file",
    "ibv_read_sysfs_file@@IBVERBS_1.0"
);

/// `ibv_get_device_list(int *num_devices)`: a NULL-terminated array holding the uroce
/// device, to be released with `ibv_free_device_list`. `NULL` + `errno` (`EINVAL` when
/// `UROCE_ADDR` does not parse, `ENOMEM`) on failure.
///
/// # Safety
/// `num_devices` is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_get_device_list(
    num_devices: *mut c_int,
) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let dev = match Registry::device() {
            Ok(d) => d,
            Err(e) => {
                crate::entry::report(&e);
                set_errno(e.errno());
                return std::ptr::null_mut();
            }
        };
        // SAFETY: calloc has no preconditions; the result is checked for NULL.
        let list =
            unsafe { libc::calloc(2, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        // SAFETY: `list` has room for two pointers (calloc above, zeroed: list[1] = NULL).
        unsafe { list.write(dev) };
        if !num_devices.is_null() {
            // SAFETY: the caller passes NULL or a writable int (checked non-NULL).
            unsafe { num_devices.write(1) };
        }
        list
    })
}

/// `ibv_free_device_list(list)`: frees an array from `ibv_get_device_list` (the devices and
/// contexts opened on them stay valid). NULL is ignored.
///
/// # Safety
/// `list` is NULL or a pointer returned by `ibv_get_device_list` not freed yet.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        // SAFETY: `list` came from calloc in `uroce_ibv_get_device_list` (or is NULL,
        // which free accepts).
        unsafe { libc::free(list.cast()) };
    })
}

/// `ibv_get_device_name(device)`: the device's NUL-terminated name, or NULL + `EINVAL`.
///
/// # Safety
/// None beyond the C contract: foreign pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || match Registry::check_device(device) {
        // SAFETY: `device` is the registry's live, never-freed device; taking a field's
        // address reads nothing.
        Ok(()) => unsafe { (&raw const (*device).name).cast::<c_char>() },
        Err(e) => {
            crate::entry::report(&e);
            set_errno(e.errno());
            std::ptr::null()
        }
    })
}

/// `ibv_get_device_guid(device)`: the node GUID in network byte order; 0 + `EINVAL` for a
/// foreign device.
///
/// # Safety
/// None beyond the C contract: foreign pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard(0, || match Registry::guid(device) {
        Ok(g) => g.to_be(),
        Err(e) => {
            crate::entry::report(&e);
            set_errno(e.errno());
            0
        }
    })
}

/// `ibv_get_device_index(device)`: 0 for the uroce device, -1 + `EINVAL` otherwise.
///
/// # Safety
/// None beyond the C contract: foreign pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_get_device_index(device: *mut ibv_device) -> c_int {
    guard(-1, || match Registry::check_device(device) {
        Ok(()) => 0,
        Err(e) => {
            crate::entry::report(&e);
            set_errno(e.errno());
            -1
        }
    })
}

/// `ibv_open_device(device)`: a new context (the `context` member of a `verbs_context`);
/// NULL + `errno` (`EINVAL` foreign device, `ENODEV` the network device cannot open).
///
/// # Safety
/// None beyond the C contract: foreign pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || match Registry::open(device) {
        Ok(c) => c,
        Err(e) => {
            // An `Open` failure was already printed, always, in one line (Registry::open).
            if !matches!(e, FfiError::Open(_)) {
                crate::entry::report(&e);
            }
            set_errno(e.errno());
            std::ptr::null_mut()
        }
    })
}

/// `ibv_close_device(context)`: 0, or -1 + `EINVAL` for a pointer that is not a live
/// uroce context.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(-1, || minus_one(Registry::close(context)))
}

/// `ibv_query_device(context, attr)`: 0 or the errno value (`EINVAL`).
///
/// # Safety
/// `device_attr` is NULL or points to a writable `struct ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        errno_value((|| {
            if device_attr.is_null() {
                return Err(FfiError::Invalid("device_attr is NULL"));
            }
            let net = Registry::net(context)?;
            let attr = device::device_attr(&net);
            // SAFETY: the caller passes a writable ibv_device_attr (checked non-NULL).
            unsafe { device_attr.write(attr) };
            Ok(())
        })())
    })
}

/// Writes the first `len` bytes of the port attributes of `port` to `out`.
///
/// # Safety
/// `out` is NULL or valid for writing `len` bytes.
unsafe fn query_port_into(
    context: *mut ibv_context,
    port: u8,
    out: *mut u8,
    len: usize,
) -> Result<(), FfiError> {
    if out.is_null() {
        return Err(FfiError::Invalid("port_attr is NULL"));
    }
    let net = Registry::net(context)?;
    let attr = device::port_attr(&net, port)?;
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: `attr` is a local of at least `n` bytes; the caller guarantees `out` is valid
    // for `len >= n` bytes; a stack local cannot overlap the caller's buffer.
    unsafe { std::ptr::copy_nonoverlapping((&raw const attr).cast::<u8>(), out, n) };
    Ok(())
}

/// Size of rdma-core's `struct _compat_ibv_port_attr` (the exported `ibv_query_port`'s
/// argument): `ibv_port_attr` without `port_cap_flags2`.
const COMPAT_PORT_ATTR_LEN: usize = offset_of!(ibv_port_attr, port_cap_flags2);

/// `ibv_query_port(context, port, attr)` (exported form, for programs compiled without the
/// header inline): fills the 48-byte legacy structure; 0 or the errno value.
///
/// # Safety
/// `port_attr` is NULL or valid for writing 48 bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: forwarded caller guarantee: `port_attr` is NULL or holds 48 bytes.
        errno_value(unsafe {
            query_port_into(context, port_num, port_attr.cast(), COMPAT_PORT_ATTR_LEN)
        })
    })
}

/// `verbs_context.query_port`, what the header's `ibv_query_port` inline calls with
/// `sizeof(struct ibv_port_attr)`; 0 or the errno value.
///
/// # Safety
/// `port_attr` is NULL or valid for writing `port_attr_len` bytes.
pub unsafe extern "C" fn vctx_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: forwarded caller guarantee on `port_attr` / `port_attr_len`.
        errno_value(unsafe { query_port_into(context, port_num, port_attr.cast(), port_attr_len) })
    })
}

/// `ibv_query_gid(context, port, index, gid)`: 0 (an empty entry reads as all zeros), or
/// -1 + `EINVAL`.
///
/// # Safety
/// `gid` is NULL or points to a writable `union ibv_gid`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if gid.is_null() {
                return Err(FfiError::Invalid("gid is NULL"));
            }
            let idx = u64::try_from(index).map_err(|_| FfiError::Invalid("negative GID index"))?;
            let net = Registry::net(context)?;
            let g = device::gid(&net, port_num.into(), idx)?.unwrap_or(uroce_verbs::Gid::ZERO);
            // SAFETY: the caller passes a writable ibv_gid (checked non-NULL).
            unsafe { gid.write(ibv_gid { raw: g.0 }) };
            Ok(())
        })())
    })
}

/// `ibv_query_gid_type(context, port, index, type)` (IBVERBS_PRIVATE_34, used by
/// ibv_devinfo): RoCE v2 for populated entries, `IB_ROCE_V1` (0) for empty ones; 0, or -1
/// + `EINVAL`.
///
/// # Safety
/// `type_` is NULL or points to a writable `unsigned int`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    type_: *mut ibv_gid_type_sysfs,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if type_.is_null() {
                return Err(FfiError::Invalid("type is NULL"));
            }
            let net = Registry::net(context)?;
            let t = match device::gid(&net, port_num.into(), index.into())? {
                Some(_) => IBV_GID_TYPE_SYSFS_ROCE_V2,
                None => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
            };
            // SAFETY: the caller passes a writable enum (checked non-NULL).
            unsafe { type_.write(t) };
            Ok(())
        })())
    })
}

/// `_ibv_query_gid_ex(context, port, index, entry, flags, entry_size)` (IBVERBS_1.11,
/// behind the header's `ibv_query_gid_ex`): 0, `ENODATA` for an empty entry, `EINVAL` for
/// bad arguments (non-zero `flags`, `entry_size` below 32, bad port/index) — the value is
/// returned, not only stored in `errno`.
///
/// # Safety
/// `entry` is NULL or valid for writing `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce__ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        let bad = if entry.is_null() {
            Some("ibv_query_gid_ex: entry is NULL")
        } else if flags != 0 {
            Some("ibv_query_gid_ex: flags is not 0")
        } else if entry_size < size_of::<ibv_gid_entry>() {
            Some("ibv_query_gid_ex: entry_size is below sizeof(struct ibv_gid_entry)")
        } else {
            None
        };
        if let Some(why) = bad {
            crate::entry::report(&FfiError::Invalid(why));
            set_errno(libc::EINVAL);
            return libc::EINVAL;
        }
        let r = Registry::net(context).and_then(|net| {
            let g = device::gid(&net, port_num, gid_index.into())?;
            Ok(g.map(|g| (g, crate::sysfs::ndev_ifindex(net.local_addr().ip()))))
        });
        match r {
            Ok(Some((g, ndev_ifindex))) => {
                let e = ibv_gid_entry {
                    gid: ibv_gid { raw: g.0 },
                    gid_index,
                    port_num,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex,
                };
                // SAFETY: `entry` is valid for `entry_size >= size_of::<ibv_gid_entry>()`
                // bytes (checked above; caller guarantee).
                unsafe { entry.write(e) };
                0
            }
            Ok(None) => {
                set_errno(libc::ENODATA);
                libc::ENODATA
            }
            Err(e) => {
                crate::entry::report(&e);
                set_errno(e.errno());
                e.errno()
            }
        }
    })
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: reads the file `dir/file` into `buf`
/// (at most `size - 1` bytes, one trailing newline removed, NUL-terminated); returns the
/// number of bytes read, or -1 + `errno` (uroce devices have no sysfs directory, so for
/// their `ibdev_path` this reports `ENOENT` and ibv_devinfo omits the board id).
///
/// # Safety
/// `dir` and `file` are NULL or NUL-terminated strings; `buf` is NULL or valid for writing
/// `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            crate::entry::report(&FfiError::Invalid(
                "ibv_read_sysfs_file: dir, file or buf is NULL, or size is 0",
            ));
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: non-NULL, NUL-terminated per the caller's contract; only read here.
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let mut path = d.to_bytes().to_vec();
        path.push(b'/');
        path.extend_from_slice(f.to_bytes());
        let path = std::path::PathBuf::from(std::ffi::OsString::from_vec(path));
        let mut data = Vec::new();
        let limit = u64::try_from(size - 1).unwrap_or(u64::MAX);
        let read = std::fs::File::open(&path).and_then(|fh| fh.take(limit).read_to_end(&mut data));
        let n = match read {
            Ok(n) => n,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                return -1;
            }
        };
        let text_len = if data.last() == Some(&b'\n') {
            data.len() - 1
        } else {
            data.len()
        };
        // SAFETY: `buf` is valid for `size` bytes (caller contract) and `text_len <
        // size` (at most `size - 1` bytes were read); the Vec cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr().cast::<c_char>(), buf, text_len);
            buf.add(text_len).write(0);
        }
        c_int::try_from(n).unwrap_or(c_int::MAX)
    })
}
