//! The exported functions called directly, the way C callers do, for the cases the Debian
//! tools do not exercise: the `verbs_context` dispatch fields, the 48-byte legacy
//! `ibv_query_port`, empty and out-of-range GIDs, error returns and `errno`, foreign and
//! stale handles, and `ibv_read_sysfs_file` on a real file.
//!
//! Everything runs in one test function: the library's device registry is process-wide
//! and is configured from `UROCE_ADDR` once.

use std::ffi::{c_char, c_int, CStr, CString};
use std::mem::{offset_of, size_of, MaybeUninit};
use std::net::Ipv4Addr;

use uroce_ffi::abi::*;
use uroce_ffi::context::*;
use uroce_ffi::utility::{uroce_ibv_get_pkey_index, uroce_ibv_query_pkey};

/// A loopback address no other test uses.
const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 55, 2);

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[test]
fn entry_points_behave_like_rdma_core() {
    // Set before the library reads the environment (this is the only test in the binary).
    std::env::set_var("UROCE_ADDR", ADDR.to_string());
    std::env::remove_var("UROCE_FAULTS");

    // Device list: one device, NULL-terminated.
    let mut n: c_int = -1;
    // SAFETY: `n` is a writable int.
    let list = unsafe { uroce_ibv_get_device_list(&mut n) };
    assert!(!list.is_null(), "errno {}", errno());
    assert_eq!(n, 1);
    // SAFETY: the list has n + 1 = 2 entries.
    let (dev, end) = unsafe { (*list, *list.add(1)) };
    assert!(!dev.is_null());
    assert!(end.is_null(), "list is NULL-terminated");
    // SAFETY: the returned name is a NUL-terminated string inside the device.
    let name = unsafe { CStr::from_ptr(uroce_ibv_get_device_name(dev)) };
    assert_eq!(name.to_str(), Ok("uroce0"));
    // SAFETY: plain call with a live device.
    assert_eq!(unsafe { uroce_ibv_get_device_index(dev) }, 0);
    // The GUID is big-endian: its first bytes in memory are those of the EUI-64,
    // 00:00:7f:ff:fe:00:37:02 for 127.0.55.2 (pseudo-MAC 02:00:7f:00:37:02).
    // SAFETY: plain call with a live device.
    let guid = unsafe { uroce_ibv_get_device_guid(dev) };
    assert_eq!(
        guid.to_ne_bytes(),
        [0x00, 0x00, 0x7f, 0xff, 0xfe, 0x00, 0x37, 0x02]
    );

    // Foreign device pointers are rejected without being dereferenced.
    let mut fake = MaybeUninit::<ibv_device>::zeroed();
    // SAFETY: the pointer is only compared, never read.
    unsafe {
        assert!(uroce_ibv_get_device_name(fake.as_mut_ptr()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(uroce_ibv_open_device(fake.as_mut_ptr()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(uroce_ibv_open_device(std::ptr::null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
    }

    // Two contexts share the device; the list can be freed while they are open.
    // SAFETY: `dev` is live; the list came from ibv_get_device_list.
    let (c1, c2) = unsafe {
        let c1 = uroce_ibv_open_device(dev);
        let c2 = uroce_ibv_open_device(dev);
        uroce_ibv_free_device_list(list);
        (c1, c2)
    };
    assert!(
        !c1.is_null() && !c2.is_null() && c1 != c2,
        "errno {}",
        errno()
    );

    // The context is the `context` member of an extended verbs_context (header rules:
    // abi_compat = UINTPTR_MAX, sz at ctx - 8 = 648, query_port at ctx - 320).
    // SAFETY: `c1` is a live context inside a verbs_context allocation.
    let vctx = unsafe {
        &*c1.cast::<u8>()
            .sub(offset_of!(verbs_context, context))
            .cast::<verbs_context>()
    };
    assert_eq!(vctx.context.abi_compat, usize::MAX as *mut std::ffi::c_void);
    assert_eq!(vctx.sz, 648);
    assert_eq!(vctx.context.device, dev);
    let qp = vctx.query_port.expect("query_port slot set");

    // Full structure through the slot.
    let mut full = MaybeUninit::<ibv_port_attr>::zeroed();
    // SAFETY: `full` is writable for its size.
    let rc = unsafe { qp(c1, 1, full.as_mut_ptr(), size_of::<ibv_port_attr>()) };
    assert_eq!(rc, 0);
    // SAFETY: zero-initialised and filled.
    let full = unsafe { full.assume_init() };
    assert_eq!(full.state, IBV_PORT_ACTIVE);
    assert_eq!(full.link_layer, IBV_LINK_LAYER_ETHERNET);
    // Loopback's 65536-byte interface MTU leaves room for the largest IB MTU.
    assert_eq!(full.active_mtu, IBV_MTU_4096);
    assert_eq!(full.gid_tbl_len, 1024);

    // The exported form writes the 48-byte legacy struct only.
    let mut buf = [0xa5u8; 52];
    // SAFETY: `buf` holds 52 writable bytes (more than the 48 written).
    let rc = unsafe { uroce_ibv_query_port(c2, 1, buf.as_mut_ptr().cast()) };
    assert_eq!(rc, 0);
    assert_eq!(
        &buf[48..],
        &[0xa5; 4],
        "bytes past the legacy struct untouched"
    );
    assert_eq!(
        u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]),
        IBV_PORT_ACTIVE
    );

    // Port 2 does not exist: the errno value is returned.
    let mut attr = MaybeUninit::<ibv_port_attr>::zeroed();
    // SAFETY: `attr` is writable.
    let rc = unsafe { qp(c1, 2, attr.as_mut_ptr(), size_of::<ibv_port_attr>()) };
    assert_eq!(rc, libc::EINVAL);

    // GIDs: entry 0 is ::ffff:127.0.55.2, entry 1 is empty, 1024 is out of range.
    let mut gid = ibv_gid { raw: [0xee; 16] };
    // SAFETY: `gid` is writable; reading the raw bytes of a plain-bytes union.
    unsafe {
        assert_eq!(uroce_ibv_query_gid(c1, 1, 0, &mut gid), 0);
        assert_eq!(gid.raw, ADDR.to_ipv6_mapped().octets());
        assert_eq!(uroce_ibv_query_gid(c1, 1, 1, &mut gid), 0);
        assert_eq!(gid.raw, [0; 16]);
        assert_eq!(uroce_ibv_query_gid(c1, 1, 1024, &mut gid), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(uroce_ibv_query_gid(c1, 1, -1, &mut gid), -1);
        assert_eq!(uroce_ibv_query_gid(c1, 1, 0, std::ptr::null_mut()), -1);

        // P_Keys: a table of pkey_tbl_len entries whose entry 0 is the default key 0xffff
        // and the rest the invalid key 0 (IBA 10.9.1.1), all in network byte order.
        let mut pa = MaybeUninit::<ibv_port_attr>::zeroed();
        assert_eq!(uroce_ibv_query_port(c1, 1, pa.as_mut_ptr()), 0);
        let pkeys = c_int::from(pa.assume_init().pkey_tbl_len);
        assert!(pkeys >= 1);
        let mut key = 0u16;
        assert_eq!(uroce_ibv_query_pkey(c1, 1, 0, &mut key), 0);
        assert_eq!(key.to_ne_bytes(), [0xff, 0xff]);
        if pkeys > 1 {
            assert_eq!(uroce_ibv_query_pkey(c1, 1, pkeys - 1, &mut key), 0);
            assert_eq!(key, 0);
        }
        assert_eq!(uroce_ibv_query_pkey(c1, 1, pkeys, &mut key), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(uroce_ibv_query_pkey(c1, 2, 0, &mut key), -1);
        assert_eq!(uroce_ibv_get_pkey_index(c1, 1, 0xffffu16.to_be()), 0);
        assert_eq!(
            uroce_ibv_get_pkey_index(c1, 1, 0x8001u16.to_be()),
            -libc::ENOENT
        );
    }
    let mut ty: ibv_gid_type_sysfs = 99;
    // SAFETY: `ty` is writable.
    unsafe {
        assert_eq!(uroce_ibv_query_gid_type(c1, 1, 0, &mut ty), 0);
        assert_eq!(ty, IBV_GID_TYPE_SYSFS_ROCE_V2);
        assert_eq!(uroce_ibv_query_gid_type(c1, 1, 5, &mut ty), 0);
        assert_eq!(ty, IBV_GID_TYPE_SYSFS_IB_ROCE_V1);
    }
    let mut entry = MaybeUninit::<ibv_gid_entry>::zeroed();
    let esz = size_of::<ibv_gid_entry>();
    // SAFETY: `entry` is writable for `esz` bytes.
    unsafe {
        assert_eq!(
            uroce__ibv_query_gid_ex(c1, 1, 0, entry.as_mut_ptr(), 0, esz),
            0
        );
        let e = entry.assume_init();
        assert_eq!(e.gid.raw, ADDR.to_ipv6_mapped().octets());
        assert_eq!(
            (e.gid_index, e.port_num, e.gid_type),
            (0, 1, IBV_GID_TYPE_ROCE_V2)
        );
        assert_eq!(
            uroce__ibv_query_gid_ex(c1, 1, 1, entry.as_mut_ptr(), 0, esz),
            libc::ENODATA
        );
        assert_eq!(
            uroce__ibv_query_gid_ex(c1, 1, 0, entry.as_mut_ptr(), 1, esz),
            libc::EINVAL
        );
        assert_eq!(
            uroce__ibv_query_gid_ex(c1, 1, 0, entry.as_mut_ptr(), 0, esz - 1),
            libc::EINVAL
        );
    }

    // Device attributes: GUID in network order, one port.
    let mut da = MaybeUninit::<ibv_device_attr>::zeroed();
    // SAFETY: `da` is writable.
    assert_eq!(unsafe { uroce_ibv_query_device(c2, da.as_mut_ptr()) }, 0);
    // SAFETY: filled above.
    let da = unsafe { da.assume_init() };
    assert_eq!(da.node_guid, guid);
    assert_eq!(da.phys_port_cnt, 1);

    // Closing: each context once; a stale pointer is rejected, not freed twice.
    // SAFETY: live contexts, then stale pointers (only compared).
    unsafe {
        assert_eq!(uroce_ibv_close_device(c1), 0);
        assert_eq!(uroce_ibv_close_device(c1), -1);
        assert_eq!(errno(), libc::EINVAL);
        let mut g = ibv_gid { raw: [0; 16] };
        assert_eq!(uroce_ibv_query_gid(c1, 1, 0, &mut g), -1, "stale context");
        assert_eq!(uroce_ibv_close_device(c2), 0);
    }
    // After the last close the device can be opened again (the socket was released).
    // SAFETY: `dev` stays valid after the list is freed.
    unsafe {
        let c3 = uroce_ibv_open_device(dev);
        assert!(!c3.is_null(), "reopen: errno {}", errno());
        assert_eq!(uroce_ibv_close_device(c3), 0);
    }

    // ibv_read_sysfs_file reads dir/file, strips one newline, NUL-terminates.
    let dir = std::env::temp_dir().join(format!("uroce-sysfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("board_id"), "UROCE_0001\n").expect("write");
    let cdir = CString::new(dir.to_str().expect("utf-8 temp dir")).expect("no NUL");
    let mut out = [0x55 as c_char; 32];
    // SAFETY: NUL-terminated strings; `out` is writable for its length.
    let n = unsafe {
        uroce_ibv_read_sysfs_file(
            cdir.as_ptr(),
            c"board_id".as_ptr(),
            out.as_mut_ptr(),
            out.len(),
        )
    };
    assert_eq!(n, 11, "bytes read, newline included");
    // SAFETY: NUL-terminated by the call.
    let text = unsafe { CStr::from_ptr(out.as_ptr()) };
    assert_eq!(text.to_str(), Ok("UROCE_0001"));
    // A buffer shorter than the file: truncated and terminated.
    let mut small = [0x55 as c_char; 4];
    // SAFETY: as above.
    let n = unsafe {
        uroce_ibv_read_sysfs_file(
            cdir.as_ptr(),
            c"board_id".as_ptr(),
            small.as_mut_ptr(),
            small.len(),
        )
    };
    assert_eq!(n, 3);
    // SAFETY: NUL-terminated by the call.
    let text = unsafe { CStr::from_ptr(small.as_ptr()) };
    assert_eq!(text.to_str(), Ok("URO"));
    // SAFETY: as above; the file does not exist.
    let n = unsafe {
        uroce_ibv_read_sysfs_file(
            cdir.as_ptr(),
            c"missing".as_ptr(),
            out.as_mut_ptr(),
            out.len(),
        )
    };
    assert_eq!((n, errno()), (-1, libc::ENOENT));
    let _ = std::fs::remove_dir_all(&dir);
}
