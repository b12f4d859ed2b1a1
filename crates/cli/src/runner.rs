//! `uroce run -- PROGRAM ARGS…`: runs an unmodified verbs / RDMA-CM program on uroce.
//!
//! It presents uroce's two C libraries under their system names in a private directory
//! (`libibverbs.so.1` → `liburoce_ffi.so`, `librdmacm.so.1` → `liburoce_ffi_rdmacm.so`),
//! puts that directory first in `LD_LIBRARY_PATH`, runs the program, removes the directory
//! and exits with the program's status (128 + signal number when a signal ended it).
//!
//! The libraries are looked for in `UROCE_LIB_DIR` when set, else next to the `uroce`
//! binary (both are build outputs of one `cargo build`: `target/release/` or
//! `target/debug/`), else in `../lib` beside it. Without `UROCE_ADDR`, each process's
//! device takes the first free address of 127.0.0.1, 127.0.0.2, … (see
//! `uroce_ffi::device`), so a server and a client started with `uroce run` on one host
//! find each other at 127.0.0.1.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

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

/// A private directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        // Bounded: a name taken (a leftover) moves on to the next.
        for i in 0..100u32 {
            let p = base.join(format!("uroce-run-{}-{nanos}-{i}", std::process::id()));
            if std::fs::create_dir(&p).is_ok() {
                return Ok(TempDir(p));
            }
        }
        bail!("cannot create a directory in {}", base.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Makes the library directory: links under the system names.
fn present(lib_dir: &Path, dir: &Path) -> Result<()> {
    for (built, name) in LIBS {
        let target = lib_dir
            .join(built)
            .canonicalize()
            .with_context(|| format!("resolving {}", lib_dir.join(built).display()))?;
        std::os::unix::fs::symlink(&target, dir.join(name))
            .with_context(|| format!("linking {name} in {}", dir.display()))?;
    }
    Ok(())
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

/// Runs `program` on uroce's libraries; returns its exit status.
pub fn run_cmd(program: &[OsString]) -> Result<u8> {
    let Some((prog, args)) = program.split_first() else {
        bail!("usage: uroce run -- PROGRAM [ARGS…]");
    };
    let lib_dir = find_lib_dir()?;
    let dir = TempDir::new()?;
    present(&lib_dir, &dir.0)?;
    let status = Command::new(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", library_path(&dir.0))
        .status()
        .with_context(|| format!("starting {}", prog.to_string_lossy()))?;
    drop(dir);
    if let Some(code) = status.code() {
        return Ok(u8::try_from(code).unwrap_or(1));
    }
    let sig = std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0);
    Ok(u8::try_from(128 + sig).unwrap_or(255))
}
