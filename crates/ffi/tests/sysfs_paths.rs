//! The device's place in sysfs as the C library reports it: `ibv_get_sysfs_path` follows
//! `SYSFS_PATH` (trailing slashes stripped, as rdma-core's), the device's `ibdev_path` /
//! `dev_path` / `dev_name` are built from it (`<sysfs>/class/infiniband/uroce0`,
//! `<sysfs>/class/infiniband_verbs/uverbs0`, `uverbs0`), and the GID entry names the
//! loopback interface (`ndev_ifindex` = the kernel's index of `lo`) for a loopback device.
//! One test function: the library reads its environment once per process.

use std::ffi::{c_char, CStr};
use std::net::Ipv4Addr;

use uroce_ffi::abi::*;
use uroce_ffi::context::*;
use uroce_ffi::utility::uroce_ibv_get_sysfs_path;

/// A loopback address no other test uses.
const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 41, 1);

fn text(field: &[c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn device_paths_follow_sysfs_path_and_the_gid_names_lo() {
    // Set before the library's first use in this process (one test function here).
    std::env::set_var("SYSFS_PATH", "/tmp/uroce-fake-sys//");
    std::env::set_var("UROCE_ADDR", ADDR.to_string());
    std::env::remove_var("UROCE_PRESENTED");

    // SAFETY: no arguments; the result is a static NUL-terminated string.
    let path = unsafe { CStr::from_ptr(uroce_ibv_get_sysfs_path()) };
    assert_eq!(path.to_str().expect("utf-8"), "/tmp/uroce-fake-sys");

    let mut n = 0;
    // SAFETY: `n` is writable.
    let list = unsafe { uroce_ibv_get_device_list(&mut n) };
    assert!(!list.is_null() && n == 1, "one device");
    // SAFETY: the list holds `n` device pointers.
    let dev = unsafe { *list };
    // SAFETY: `dev` is the live device of the list.
    let d = unsafe { &*dev };
    assert_eq!(text(&d.name), "uroce0");
    assert_eq!(text(&d.dev_name), "uverbs0");
    assert_eq!(
        text(&d.ibdev_path),
        "/tmp/uroce-fake-sys/class/infiniband/uroce0"
    );
    assert_eq!(
        text(&d.dev_path),
        "/tmp/uroce-fake-sys/class/infiniband_verbs/uverbs0"
    );

    // SAFETY: `dev` came from the list.
    let ctx = unsafe { uroce_ibv_open_device(dev) };
    assert!(!ctx.is_null(), "open {ADDR}");
    // SAFETY: all-zero bytes are a valid ibv_gid_entry (integers).
    let mut entry: ibv_gid_entry = unsafe { std::mem::zeroed() };
    // SAFETY: `entry` is writable for its size.
    let rc = unsafe {
        uroce__ibv_query_gid_ex(
            ctx,
            1,
            0,
            &mut entry,
            0,
            std::mem::size_of::<ibv_gid_entry>(),
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: a NUL-terminated name.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    assert!(lo > 0, "the loopback interface has an index");
    assert_eq!(entry.ndev_ifindex, lo, "a loopback device's netdev is lo");
    // SAFETY: both handles were handed out above and are released once.
    unsafe {
        assert_eq!(uroce_ibv_close_device(ctx), 0);
        uroce_ibv_free_device_list(list);
    }
}
