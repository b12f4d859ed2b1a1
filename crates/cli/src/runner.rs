//! `uroce run -- PROGRAM ARGS…`: runs an unmodified verbs / RDMA-CM program on uroce.
//!
//! It presents uroce's two C libraries under their system names in a private directory
//! (`libibverbs.so.1` → `liburoce_ffi.so`, `librdmacm.so.1` → `liburoce_ffi_rdmacm.so`;
//! `<tmp>/uroce-run-<uid>-<hash>`, mode 0700, reused by later runs of the same build),
//! puts that directory first in `LD_LIBRARY_PATH` and executes the program in place of
//! itself, so the program's exit status, signals and time limits are its own.
//!
//! The libraries are looked for in `UROCE_LIB_DIR` when set, else next to the `uroce`
//! binary (both are build outputs of one `cargo build`: `target/release/` or
//! `target/debug/`), else in `../lib` beside it. Every process's device is the host's
//! shared device on `UROCE_ADDR` (default 127.0.0.1; see `uroce_ffi::device`), so a
//! server and a client started with `uroce run` on one host find each other at
//! 127.0.0.1, as on a host with one RoCE NIC; `UROCE_SHARED=0` gives a process a device
//! of its own (without `UROCE_ADDR`, on the first 127.0.0.x whose UDP 4791 is free).
//!
//! Before it executes the program, the runner presents the device as the kernel's verbs
//! stack would (`/sys/class/infiniband/uroce0`, `/sys/class/infiniband_verbs/uverbs0`,
//! `/dev/infiniband/uverbs0`) in a private user + mount namespace ([`present`]); where the
//! kernel does not allow that without privileges, one line on stderr says why and the
//! program runs without them. `UROCE_PRESENT=0` turns the presentation off.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::present;

/// The built libraries and the names programs load them by.
pub const LIBS: [(&str, &str); 2] = [
    ("liburoce_ffi.so", "libibverbs.so.1"),
    ("liburoce_ffi_rdmacm.so", "librdmacm.so.1"),
];

/// Where the libraries are: the first candidate directory that has both.
pub fn find_lib_dir() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(d) = std::env::var_os("UROCE_LIB_DIR") {
        candidates.push(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("locating the uroce binary")?;
    if let Some(dir) = exe.parent() {
        candidates.push(dir.to_path_buf());
        candidates.push(dir.join("../lib"));
    }
    for c in &candidates {
        if LIBS.iter().all(|(built, _)| c.join(built).is_file()) {
            return Ok(c.clone());
        }
    }
    bail!(
        "cannot find {} and {} (looked in {}); build them with \
         `cargo build --release -p uroce-ffi -p uroce-ffi-rdmacm` or set UROCE_LIB_DIR",
        LIBS[0].0,
        LIBS[1].0,
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The directory of links for `lib_dir`: `<tmp>/uroce-run-<uid>-<hash of lib_dir>`, mode
/// 0700, made once and reused while its links point at `lib_dir`'s libraries (a fresh one is
/// built beside it and renamed into place, so concurrent runs never see it half made).
fn link_dir(lib_dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    let canon = lib_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", lib_dir.display()))?;
    // FNV-1a of the path: a stable name per library directory.
    let hash = canon
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    let base = std::env::temp_dir();
    let dir = base.join(format!("uroce-run-{uid}-{hash:016x}"));
    let good = |d: &Path| {
        std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid)
            && LIBS.iter().all(|(built, name)| {
                std::fs::read_link(d.join(name)).is_ok_and(|t| t == canon.join(built))
            })
    };
    if good(&dir) {
        return Ok(dir);
    }
    let fresh = base.join(format!(
        "uroce-run-{uid}-{hash:016x}.{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&fresh);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&fresh)
        .with_context(|| format!("creating {}", fresh.display()))?;
    for (built, name) in LIBS {
        std::os::unix::fs::symlink(canon.join(built), fresh.join(name))
            .with_context(|| format!("linking {name} in {}", fresh.display()))?;
    }
    // A stale directory of ours is replaced; another user's is left alone (then this run
    // uses its own fresh one). A good one is never removed: a concurrent run may have just
    // renamed it into place and be staging its presentation in it.
    if !good(&dir) && std::fs::symlink_metadata(&dir).is_ok_and(|m| m.uid() == uid) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if std::fs::rename(&fresh, &dir).is_ok() || good(&dir) {
        let _ = std::fs::remove_dir_all(&fresh);
        return Ok(dir);
    }
    Ok(fresh)
}

/// `LD_LIBRARY_PATH` with `dir` first.
fn library_path(dir: &Path) -> OsString {
    let mut v = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Presents the device's sysfs and `/dev` entries to this process and its children
/// ([`present`]), staged in `<dir>/present`.
fn presentation(dir: &Path) -> Result<(), String> {
    let facts = present::Facts::from_env().map_err(|e| e.to_string())?;
    let stage = dir.join("present");
    match std::fs::create_dir(&stage) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", stage.display())),
    }
    let netns = std::env::var_os(present::NETNS_ENV).is_some_and(|v| v == "1");
    present::present(&facts, &stage, netns)
}

/// Runs `program` on uroce's libraries: replaces this process with it (`execvp`), so
/// that signals and time limits reach the program itself; returns only on failure.
pub fn run_cmd(program: &[OsString]) -> Result<u8> {
    use std::os::unix::process::CommandExt as _;
    let Some((prog, args)) = program.split_first() else {
        bail!("usage: uroce run -- PROGRAM [ARGS…]");
    };
    let lib_dir = find_lib_dir()?;
    let dir = link_dir(&lib_dir)?;
    let mut cmd = Command::new(prog);
    cmd.args(args).env("LD_LIBRARY_PATH", library_path(&dir));
    if std::env::var_os(present::PRESENT_ENV).is_some_and(|v| v == "0") {
        cmd.env_remove(present::PRESENTED_ENV);
    } else {
        match presentation(&dir) {
            Ok(()) => {
                cmd.env(present::PRESENTED_ENV, "1");
            }
            Err(why) => {
                cmd.env_remove(present::PRESENTED_ENV);
                eprintln!(
                    "uroce run: running without /sys/class/infiniband and /dev/infiniband: {why}"
                );
            }
        }
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("starting {}", prog.to_string_lossy()))
}
