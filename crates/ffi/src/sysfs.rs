//! What the library says about the device's place in sysfs, consistent with the tree that
//! `uroce run` presents (docs/RUNNING.md):
//!
//! * [`sysfs_path`] (`ibv_get_sysfs_path()`): as rdma-core's — the calling user's
//!   `SYSFS_PATH` (ignored when the real and effective uid differ), at most
//!   [`SYSFS_PATH_MAX`] bytes, trailing slashes stripped; else `/sys`. Read once.
//! * the device's `ibdev_path` = `<sysfs>/class/infiniband/<name>`, `dev_path` =
//!   `<sysfs>/class/infiniband_verbs/uverbs0`, `dev_name` = `uverbs0` ([`UVERBS_NAME`]).
//! * [`ndev_ifindex`]: the interface index of the netdev that owns the device's address
//!   (`lo` for loopback addresses), the `ndev_ifindex` of its GID entry.
//! * [`publish_gid`]: when the device opens inside `uroce run`'s presentation
//!   (`UROCE_PRESENTED` set), the GID the device really took is written to
//!   `<ibdev_path>/ports/1/gids/0` (without `UROCE_ADDR` the address is chosen at open).

use std::ffi::{CStr, CString};
use std::net::IpAddr;
use std::sync::OnceLock;

use uroce_verbs::Gid;

/// rdma-core's `IBV_SYSFS_PATH_MAX`: the longest `SYSFS_PATH` taken.
pub const SYSFS_PATH_MAX: usize = 256;
/// The uverbs name of the (only) device.
pub const UVERBS_NAME: &str = "uverbs0";
/// Set by `uroce run` when it presents a sysfs tree whose GID file the library may update.
pub const PRESENTED_ENV: &str = "UROCE_PRESENTED";

/// The sysfs root for a `SYSFS_PATH` value (`None`: unset or not honoured): the value
/// truncated to [`SYSFS_PATH_MAX`] bytes, its trailing slashes removed; `/sys` without one.
pub fn sysfs_root(env: Option<&[u8]>) -> CString {
    match env {
        Some(v) => {
            let v = v.split(|b| *b == 0).next().unwrap_or_default();
            let mut v = &v[..v.len().min(SYSFS_PATH_MAX)];
            while let Some(rest) = v.strip_suffix(b"/") {
                v = rest;
            }
            // No interior NUL (cut at the first above).
            CString::new(v).unwrap_or_default()
        }
        None => c"/sys".to_owned(),
    }
}

/// `ibv_get_sysfs_path()`'s value for this process (computed on first use).
pub fn sysfs_path() -> &'static CStr {
    static PATH: OnceLock<CString> = OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: getuid/geteuid have no preconditions and cannot fail.
        let same = unsafe { libc::getuid() == libc::geteuid() };
        let env = std::env::var_os("SYSFS_PATH").filter(|_| same);
        sysfs_root(env.as_ref().map(|v| v.as_encoded_bytes()))
    })
}

/// `sysfs_path()` as UTF-8 (lossy) for building the device's paths.
fn root() -> String {
    sysfs_path().to_string_lossy().into_owned()
}

/// The device's `ibdev_path`.
pub fn ibdev_path(name: &str) -> String {
    format!("{}/class/infiniband/{name}", root())
}

/// The device's `dev_path`.
pub fn dev_path() -> String {
    format!("{}/class/infiniband_verbs/{UVERBS_NAME}", root())
}

/// The interface index of the netdev owning `addr`, 0 when none is found.
pub fn ndev_ifindex(addr: IpAddr) -> u32 {
    uroce_net::ifaddr::netdev_of(addr).map_or(0, |n| n.ifindex)
}

/// A GID as sysfs shows it: eight groups of four hex digits separated by colons.
pub fn gid_text(g: &Gid) -> String {
    g.0.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p.get(1).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(":")
}

/// Inside `uroce run`'s presentation, the presented `hw_counters` directory of device
/// `name`'s port, which the device keeps current (`uroce_net::stats`); `None` outside.
pub fn hw_counters_dir(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os(PRESENTED_ENV)
        .filter(|v| !v.is_empty())
        .map(|_| format!("{}/ports/1/hw_counters", ibdev_path(name)).into())
}

/// Inside `uroce run`'s presentation, records the GID the device `name` took in the
/// presented tree. Failures change nothing (the file keeps the runner's guess) and are
/// reported under `UROCE_DEBUG`.
pub fn publish_gid(name: &str, addr: IpAddr) {
    if std::env::var_os(PRESENTED_ENV).is_none_or(|v| v.is_empty()) {
        return;
    }
    let file = format!("{}/ports/1/gids/0", ibdev_path(name));
    let text = format!("{}\n", gid_text(&Gid::from_ip(addr)));
    if std::fs::read_to_string(&file).is_ok_and(|t| t == text) {
        return;
    }
    if let Err(e) = std::fs::write(&file, text) {
        if crate::entry::debug_enabled() {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("uroce: cannot record the GID in {file}: {e}\n").as_bytes(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_path_follows_rdma_core() {
        assert_eq!(sysfs_root(None).as_bytes(), b"/sys");
        assert_eq!(sysfs_root(Some(b"/tmp/x")).as_bytes(), b"/tmp/x");
        assert_eq!(sysfs_root(Some(b"/tmp/x///")).as_bytes(), b"/tmp/x");
        assert_eq!(sysfs_root(Some(b"/")).as_bytes(), b"");
        let long = vec![b'a'; 300];
        assert_eq!(sysfs_root(Some(&long)).as_bytes().len(), SYSFS_PATH_MAX);
    }

    #[test]
    fn gids_print_as_sysfs_does() {
        let g = Gid::from_ip("127.0.0.1".parse().expect("ip"));
        assert_eq!(gid_text(&g), "0000:0000:0000:0000:0000:ffff:7f00:0001");
    }

    #[test]
    fn loopback_devices_name_lo() {
        let lo = uroce_net::ifaddr::by_name("lo").expect("lo").ifindex;
        assert_eq!(ndev_ifindex("127.0.0.5".parse().expect("ip")), lo);
    }
}
