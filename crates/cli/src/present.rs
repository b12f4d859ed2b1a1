//! What `uroce run` shows a program besides the libraries: the device as the kernel's
//! verbs stack would, so that programs which look for it outside the library find it.
//!
//! * `/sys/class/infiniband/<dev>/`: `node_guid`, `sys_image_guid`, `node_type`,
//!   `node_desc`, `fw_ver`, `hw_rev`, `board_id`, `hca_type`, `device/net/<ifname>` (a link
//!   to `/sys/class/net/<ifname>`, the netdev that owns the device's address: `lo` for a
//!   loopback address), and `ports/1/` with `state`, `phys_state`, `link_layer`, `rate`,
//!   `lid`, `sm_lid`, `lid_mask_count`, `cap_mask`, `pkeys/0`, `gids/0…1023`,
//!   `hw_counters/` (rxe's counter names, kept current by the device once it opens),
//!   `gid_attrs/types/0` and `gid_attrs/ndevs/0` (the populated entry; the kernel fails
//!   reads of the others' attributes, here they are absent);
//! * `/sys/class/infiniband_verbs/`: `abi_version` and `uverbs0/` (`ibdev`, `abi_version`,
//!   `dev`, `device` → the device's);
//! * `/dev/infiniband/uverbs0` and `/dev/infiniband/rdma_cm` (character devices: binds of
//!   `/dev/null`; the libraries never open them).
//!
//! How, without privileges on the host: the runner enters a new user namespace (the
//! caller's uid and gid mapped to themselves, not to root) and mount namespace
//! (`unshare(CLONE_NEWUSER | CLONE_NEWNS)`), mounts a tmpfs on its private directory, writes
//! the tree there and binds it over the real paths. Where `/sys/class/infiniband` (or
//! `/dev/infiniband`) does not exist — a host without RDMA — the parent directory is
//! replaced by a copy of binds of all its other entries plus the new one, so nothing else
//! disappears. The mounts exist only in the program's namespace (and its children's).
//!
//! Values agree with the library: the node GUID and GID are derived from the address as
//! `uroce_ffi` does; without `UROCE_ADDR` the address is chosen when the device opens, so
//! the runner writes the one that would be chosen now and the library rewrites `gids/0`
//! with the one it took (`UROCE_PRESENTED=1`, set here).
//!
//! With `UROCE_NETNS=1` the program also gets a network namespace of its own
//! (`CLONE_NEWNET`), whose `lo` the runner sets up before the exec.
//!
//! Where the kernel refuses (unprivileged user namespaces off, e.g.
//! `kernel.unprivileged_userns_clone=0`, `user.max_user_namespaces=0` or an AppArmor
//! restriction), [`present`] returns the reason and the program runs without the tree.

use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use std::os::fd::{AsRawFd as _, OwnedFd};

use uroce_net::{NetConfig, ADDR_ENV};
use uroce_verbs::device::{node_guid_for, GID_TABLE_LEN, PORT_RATE_TEXT};
use uroce_verbs::Gid;

use crate::userns;

/// Set in the program's environment when the tree is presented.
pub const PRESENTED_ENV: &str = "UROCE_PRESENTED";
/// `UROCE_PRESENT=0` turns the presentation off (the program then runs as before).
pub const PRESENT_ENV: &str = "UROCE_PRESENT";
/// `UROCE_NETNS=1`: the program also gets a network namespace of its own (only `lo`, up).
pub const NETNS_ENV: &str = "UROCE_NETNS";
/// The RoCEv2 UDP port (IBA Annex A17).
const ROCE_PORT: u16 = 4791;
/// How many loopback addresses the library tries without `UROCE_ADDR`
/// (`uroce_ffi::device::AUTO_ADDRS`).
const AUTO_ADDRS: u8 = 64;
/// The firmware version the library reports (`uroce_ffi::device::FW_VER`).
const FW_VER: &str = concat!("uroce ", env!("CARGO_PKG_VERSION"));
/// The uverbs ABI version of rdma-core 44's kernel interface.
const UVERBS_ABI: &str = "6";

/// What the tree says about the device.
#[derive(Debug, Clone)]
pub struct Facts {
    /// Device name (`uroce0`).
    pub name: String,
    /// The address the device will (most likely) take.
    pub addr: IpAddr,
    /// Node GUID (host order), from the configured address as the library derives it.
    pub guid: u64,
    /// The netdev owning `addr` (name), if found.
    pub ifname: Option<String>,
}

impl Facts {
    /// The facts for this environment (`UROCE_ADDR` or the first free loopback address).
    ///
    /// # Errors
    /// An unparsable `UROCE_ADDR` (the library would refuse it too).
    pub fn from_env() -> anyhow::Result<Facts> {
        let cfg = NetConfig::from_env()?;
        let explicit = std::env::var_os(ADDR_ENV).is_some_and(|v| !v.is_empty());
        let addr = if explicit {
            cfg.addr
        } else {
            (1..=AUTO_ADDRS)
                .map(|x| IpAddr::V4(Ipv4Addr::new(127, 0, 0, x)))
                .find(|ip| UdpSocket::bind((*ip, ROCE_PORT)).is_ok())
                .unwrap_or(cfg.addr)
        };
        Ok(Facts {
            name: cfg.name.clone(),
            addr,
            guid: node_guid_for(cfg.addr),
            ifname: uroce_net::ifaddr::netdev_of(addr).map(|n| n.name),
        })
    }
}

/// A GUID as sysfs prints it (`xxxx:xxxx:xxxx:xxxx`).
fn guid_text(g: u64) -> String {
    let b = g.to_be_bytes();
    b.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// A GID as sysfs prints it (eight groups of four hex digits).
fn gid_text(g: &Gid) -> String {
    g.0.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn write(dir: &Path, file: &str, text: &str) -> io::Result<()> {
    let path = dir.join(file);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, format!("{text}\n"))
}

/// Writes the device's `/sys/class/infiniband/<name>` directory into `dir` (created).
pub fn write_ib_device(dir: &Path, f: &Facts) -> io::Result<()> {
    let guid = guid_text(f.guid);
    for (file, text) in [
        ("node_guid", guid.as_str()),
        ("sys_image_guid", &guid),
        ("node_type", "1: CA"),
        ("node_desc", &format!("uroce {}", f.name)),
        ("fw_ver", FW_VER),
        ("hw_rev", "0"),
        ("board_id", "uroce"),
        ("hca_type", "uroce"),
        // The width and speed the library reports.
        ("ports/1/state", "4: ACTIVE"),
        ("ports/1/phys_state", "5: LinkUp"),
        ("ports/1/link_layer", "Ethernet"),
        ("ports/1/rate", PORT_RATE_TEXT),
        ("ports/1/lid", "0x0"),
        ("ports/1/sm_lid", "0x0"),
        ("ports/1/sm_sl", "0"),
        ("ports/1/lid_mask_count", "0"),
        ("ports/1/cap_mask", "0x00010000"),
        ("ports/1/pkeys/0", "0xffff"),
        ("ports/1/gid_attrs/types/0", "RoCE v2"),
    ] {
        write(dir, file, text)?;
    }
    // The port's counters under rxe's names, zero until the device opens and keeps them
    // current (`uroce_net::stats`).
    for (name, _) in uroce_net::stats::RXE_NAMES {
        write(dir, &format!("ports/1/hw_counters/{name}"), "0")?;
    }
    let zero = gid_text(&Gid::ZERO);
    write(dir, "ports/1/gids/0", &gid_text(&Gid::from_ip(f.addr)))?;
    for i in 1..GID_TABLE_LEN {
        write(dir, &format!("ports/1/gids/{i}"), &zero)?;
    }
    std::fs::create_dir_all(dir.join("device/net"))?;
    if let Some(ifname) = &f.ifname {
        write(dir, "ports/1/gid_attrs/ndevs/0", ifname)?;
        std::os::unix::fs::symlink(
            Path::new("/sys/class/net").join(ifname),
            dir.join("device/net").join(ifname),
        )?;
    }
    Ok(())
}

/// Writes `/sys/class/infiniband_verbs` into `dir` (created).
pub fn write_verbs_class(dir: &Path, f: &Facts) -> io::Result<()> {
    write(dir, "abi_version", UVERBS_ABI)?;
    write(dir, "uverbs0/ibdev", &f.name)?;
    write(dir, "uverbs0/abi_version", "1")?;
    write(dir, "uverbs0/dev", "231:192")?;
    std::os::unix::fs::symlink(
        format!("../../infiniband/{}/device", f.name),
        dir.join("uverbs0/device"),
    )
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `mount(2)`.
fn mount(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(cstr).transpose()?;
    let dst = cstr(dst)?;
    let fstype = fstype.map(|s| CString::new(s).unwrap_or_default());
    let data = data.map(|s| CString::new(s).unwrap_or_default());
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NULL or a NUL-terminated string alive for the call.
    check(unsafe { libc::mount(p(&src), dst.as_ptr(), p(&fstype), flags, p(&data).cast()) })
        .map_err(|e| io::Error::new(e.kind(), format!("mount {}: {e}", dst.to_string_lossy())))
}

fn bind(src: &Path, dst: &Path) -> io::Result<()> {
    mount(Some(src), dst, None, libc::MS_BIND | libc::MS_REC, None)
}

/// Makes `dst` a copy of directory `src`'s entries except `skip`: directories and files
/// are bind mounts of the originals, symbolic links are recreated.
fn mirror(src: &Path, dst: &Path, skip: &[&str]) -> io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let name = entry.file_name();
        if skip.iter().any(|s| name.as_bytes() == s.as_bytes()) {
            continue;
        }
        let (from, to) = (entry.path(), dst.join(&name));
        let ty = entry.file_type()?;
        if ty.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else {
            if ty.is_dir() {
                std::fs::create_dir(&to)?;
            } else {
                std::fs::File::create(&to)?;
            }
            bind(&from, &to)?;
        }
    }
    Ok(())
}

/// Shows each `(name, dir)` as `parent/name`: binds it over an existing one, or, when
/// one is missing, replaces `parent` by a mirror of it (built in `stage`) that adds them.
fn overlay(parent: &Path, children: &[(&str, PathBuf)], stage: &Path) -> io::Result<()> {
    if children.iter().all(|(n, _)| parent.join(n).is_dir()) {
        for (n, dir) in children {
            bind(dir, &parent.join(n))?;
        }
        return Ok(());
    }
    let names: Vec<&str> = children.iter().map(|(n, _)| *n).collect();
    mirror(parent, stage, &names)?;
    for (n, dir) in children {
        let to = stage.join(n);
        std::fs::create_dir(&to)?;
        bind(dir, &to)?;
    }
    bind(stage, parent)
}

/// Why user namespaces are unavailable, from the kernel's switches (for the message).
fn userns_switches() -> String {
    [
        "/proc/sys/kernel/unprivileged_userns_clone",
        "/proc/sys/user/max_user_namespaces",
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
    ]
    .iter()
    .filter_map(|f| {
        let v = std::fs::read_to_string(f).ok()?;
        let key = f.trim_start_matches("/proc/sys/").replace('/', ".");
        Some(format!("{key}={}", v.trim()))
    })
    .collect::<Vec<_>>()
    .join(", ")
}

/// Enters the namespaces: joins the user namespace `shared` (another `uroce run`
/// program's, [`userns`]) or makes a new one, then makes the namespaces of `rest` (mount,
/// and network with `UROCE_NETNS=1`) inside it. Returns whether the user namespace is new.
fn unshare(shared: Option<&OwnedFd>, rest: libc::c_int) -> io::Result<bool> {
    let ctx =
        |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    match shared {
        Some(ns) => {
            // SAFETY: setns on a descriptor we own, for a user namespace.
            check(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWUSER) })
                .map_err(ctx("setns"))?;
            // SAFETY: unshare takes flags only.
            check(unsafe { libc::unshare(rest) }).map_err(ctx("unshare"))?;
            Ok(false)
        }
        None => {
            // SAFETY: unshare takes flags only.
            check(unsafe { libc::unshare(libc::CLONE_NEWUSER | rest) }).map_err(ctx("unshare"))?;
            Ok(true)
        }
    }
}

/// In the namespaces just entered by [`unshare`]: in a new user namespace, maps
/// `uid`/`gid` to themselves; makes every mount private to the new mount namespace and
/// mounts a tmpfs on `stage`.
fn enter(
    new_user: bool,
    flags: libc::c_int,
    uid: libc::uid_t,
    gid: libc::gid_t,
    stage: &Path,
) -> io::Result<()> {
    let write = |file: &str, text: String| {
        std::fs::write(file, text).map_err(|e| io::Error::new(e.kind(), format!("{file}: {e}")))
    };
    if new_user {
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    mount(
        Some(Path::new("tmpfs")),
        stage,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some("mode=0755"),
    )?;
    if flags & libc::CLONE_NEWNET != 0 {
        loopback_up()?;
    }
    Ok(())
}

/// Sets `lo` of this (new) network namespace up.
fn loopback_up() -> io::Result<()> {
    // Binding the unspecified address needs no interface up.
    let sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    // SAFETY: all-zero bytes are a valid ifreq (a name and a union of integers).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in req.ifr_name.iter_mut().zip(b"lo") {
        *d = *b as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq naming "lo" for the duration of both calls; the
    // descriptor is a live socket.
    unsafe {
        check(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req))
    }
}

/// Runs [`unshare`] + [`enter`] in a forked child (this process must be single-threaded).
/// The child writes the first refused step, in words, to a pipe and exits non-zero; the
/// error returned here carries those words.
fn probe(
    shared: Option<&OwnedFd>,
    flags: libc::c_int,
    uid: libc::uid_t,
    gid: libc::gid_t,
    stage: &Path,
) -> io::Result<()> {
    use std::io::{Read as _, Write as _};
    use std::os::fd::FromRawFd as _;
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two descriptors.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 just made both descriptors; each is owned once, here.
    let (mut rd, wr) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    // SAFETY: the process is single-threaded (caller contract of `present`), so the child
    // may use the allocator and the file system functions before `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        drop(rd);
        let r = unshare(shared, flags).and_then(|new_user| enter(new_user, flags, uid, gid, stage));
        let code = match r {
            Ok(()) => 0,
            Err(e) => {
                let mut wr = wr;
                let _ = wr.write_all(e.to_string().as_bytes());
                1
            }
        };
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    drop(wr);
    // Bounded: the child writes at most one message and exits, closing the pipe.
    let mut why = String::new();
    let _ = (&mut rd).take(4096).read_to_string(&mut why);
    let mut status = 0;
    // Bounded: the child does a few system calls and exits; a signal may interrupt the
    // wait (EINTR) a few times.
    let mut reaped = false;
    for _ in 0..1000 {
        // SAFETY: `pid` is our child; `status` is writable.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            reaped = true;
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    if !reaped {
        return Err(io::Error::from_raw_os_error(libc::EINTR));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else if libc::WIFEXITED(status) && !why.is_empty() {
        Err(io::Error::other(why))
    } else {
        Err(io::Error::other("the namespace probe ended abnormally"))
    }
}

/// Enters a user + mount namespace and presents the tree for `facts`, staging it under
/// `stage` (an existing directory of the caller's). Must run while the process has one
/// thread (the kernel refuses `CLONE_NEWUSER` otherwise).
///
/// # Errors
/// The reason, in words, when the kernel refuses a step; the program should then run
/// without the tree. The namespace steps are tried in a child first, so a refusal there
/// leaves this process untouched; a later refusal (rare: a bind over sysfs or `/dev`)
/// leaves it in the new namespaces, with the host's view of every path.
pub fn present(facts: &Facts, stage: &Path, netns: bool) -> Result<(), String> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let flags = libc::CLONE_NEWNS | if netns { libc::CLONE_NEWNET } else { 0 };
    // The user namespace of this user's other `uroce run` programs, joined when one lives
    // (held locked until this program is recorded as a member).
    let registry = userns::Registry::lock(uid).ok();
    let mut shared = registry.as_ref().and_then(userns::Registry::find);
    // Try the namespace steps in a child first, so that a kernel that allows the namespace
    // but not what follows (an AppArmor restriction, a seccomp filter) leaves this process
    // as it was. A shared namespace that cannot be joined is left for a new one.
    if shared.is_some() && probe(shared.as_ref(), flags, uid, gid, stage).is_err() {
        shared = None;
    }
    if shared.is_none() {
        probe(None, flags, uid, gid, stage)
            .map_err(|e| format!("no private namespaces here ({e}; {})", userns_switches()))?;
    }
    let new_user = unshare(shared.as_ref(), flags)
        .map_err(|e| format!("no private namespaces here ({e}; {})", userns_switches()))?;
    drop(shared);
    let step = || -> io::Result<()> {
        enter(new_user, flags, uid, gid, stage)?;
        let (ib, verbs, devib) = (stage.join("ib"), stage.join("verbs"), stage.join("devib"));
        write_ib_device(&ib.join(&facts.name), facts)?;
        write_verbs_class(&verbs, facts)?;
        std::fs::create_dir_all(&devib)?;
        for node in ["uverbs0", "rdma_cm"] {
            std::fs::File::create(devib.join(node))?;
            bind(Path::new("/dev/null"), &devib.join(node))?;
        }
        overlay(
            Path::new("/sys/class"),
            &[("infiniband", ib), ("infiniband_verbs", verbs)],
            &stage.join("class"),
        )?;
        overlay(
            Path::new("/dev"),
            &[("infiniband", devib)],
            &stage.join("dev"),
        )
    };
    step().map_err(|e| format!("{e} ({})", userns_switches()))?;
    if let Some(r) = registry {
        // Best effort: unrecorded, the next program makes a namespace of its own.
        let _ = r.join_as_member();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            name: "uroce0".into(),
            addr: "127.0.0.2".parse().expect("ip"),
            guid: 0x0200_7f00_0001_0000,
            ifname: Some("lo".into()),
        }
    }

    #[test]
    fn the_device_directory_has_what_programs_read() {
        let dir = std::env::temp_dir().join(format!("uroce-present-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_ib_device(&dir.join("uroce0"), &facts()).expect("write");
        write_verbs_class(&dir.join("verbs"), &facts()).expect("write");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect(f);
        assert_eq!(read("uroce0/node_guid"), "0200:7f00:0001:0000\n");
        assert_eq!(read("uroce0/ports/1/state"), "4: ACTIVE\n");
        assert_eq!(
            read("uroce0/ports/1/gids/0"),
            "0000:0000:0000:0000:0000:ffff:7f00:0002\n"
        );
        assert_eq!(
            read("uroce0/ports/1/gids/1023"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n"
        );
        assert!(!dir.join("uroce0/ports/1/gids/1024").exists());
        assert_eq!(read("uroce0/ports/1/gid_attrs/ndevs/0"), "lo\n");
        assert_eq!(read("uroce0/ports/1/gid_attrs/types/0"), "RoCE v2\n");
        assert_eq!(
            std::fs::read_link(dir.join("uroce0/device/net/lo")).expect("link"),
            Path::new("/sys/class/net/lo")
        );
        assert_eq!(read("verbs/uverbs0/ibdev"), "uroce0\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
