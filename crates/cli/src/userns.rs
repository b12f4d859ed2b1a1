//! One user namespace for every program `uroce run` starts for a user.
//!
//! `uroce run` presents the device in a private user + mount namespace ([`crate::present`]).
//! Were each program given a user namespace of its own, two of them could not reach each
//! other's memory with `process_vm_readv`/`process_vm_writev`: the kernel lets a process
//! read another's memory only from the same user namespace (or with `CAP_SYS_PTRACE` in
//! the other's), whatever their uids. Shared-memory transports of the programs people run
//! on RDMA do exactly that between processes of one host (UCX's `cma`, chosen by default
//! next to the network device), so two programs of one user must share one user
//! namespace, as they would share the host's without `uroce run`.
//!
//! So the first program makes the namespace, and later ones join it (`setns`: a process of
//! the namespace's owner in the parent namespace has every capability in it, so no
//! privilege is needed) before each makes its own mount (and network) namespace inside it.
//! Members are recorded in `<tmp>/uroce-run-<uid>-userns/`, one file per program named by
//! its pid and holding the namespace's inode number; a namespace lives while one of its
//! members does, and a member is believed only if `/proc/<pid>/ns/user` is that inode and
//! is owned by this uid (so a dead pid, a reused one or a planted file is ignored and
//! removed). The directory is locked (`flock`) from the look-up until the new member is
//! recorded, so programs started together all land in one namespace.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

/// `NS_GET_OWNER_UID` of `<linux/nsfs.h>`: `_IO(0xb7, 0x4)`.
const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;

/// The registry of this user's `uroce run` namespace, locked while it is held.
pub struct Registry {
    dir: PathBuf,
    uid: libc::uid_t,
    /// Holds the `flock` until dropped.
    _lock: File,
}

impl Registry {
    /// Opens (creating it, mode 0700) and locks `<tmp>/uroce-run-<uid>-userns`.
    ///
    /// # Errors
    /// The directory cannot be made, is not a directory of this user's, or cannot be
    /// locked: the caller then makes a namespace of its own, as before.
    pub fn lock(uid: libc::uid_t) -> io::Result<Registry> {
        let dir = std::env::temp_dir().join(format!("uroce-run-{uid}-userns"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let m = std::fs::symlink_metadata(&dir)?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "{} is not a private directory of uid {uid}",
                dir.display()
            )));
        }
        let lock = File::create(dir.join("lock"))?;
        // Bounded: the holder is another `uroce run` between its look-up and its exec (a
        // few system calls); the kernel drops the lock when the holder exits.
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(Registry {
            dir,
            uid,
            _lock: lock,
        })
    }

    /// The user namespace of a living member, as a descriptor for `setns`; stale entries
    /// are removed on the way.
    pub fn find(&self) -> Option<OwnedFd> {
        let entries = std::fs::read_dir(&self.dir).ok()?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            match self.member(pid, &entry.path()) {
                Some(fd) => return Some(fd),
                None => {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        None
    }

    /// `/proc/<pid>/ns/user` if it is the namespace recorded in `file` and this user's.
    fn member(&self, pid: u32, file: &Path) -> Option<OwnedFd> {
        let recorded: u64 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
        let ns = File::open(format!("/proc/{pid}/ns/user")).ok()?;
        if ns.metadata().ok()?.ino() != recorded {
            return None;
        }
        let mut owner: libc::uid_t = 0;
        // SAFETY: NS_GET_OWNER_UID writes one uid_t through the pointer, which is valid.
        let rc = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_OWNER_UID, &mut owner) };
        (rc == 0 && owner == self.uid).then(|| OwnedFd::from(ns))
    }

    /// Records this process as a member of the user namespace it is in now.
    ///
    /// # Errors
    /// The namespace or the record cannot be read or written (the next program then makes
    /// a namespace of its own).
    pub fn join_as_member(&self) -> io::Result<()> {
        let ino = std::fs::metadata("/proc/self/ns/user")?.ino();
        let pid = std::process::id();
        let tmp = self.dir.join(format!(".{pid}"));
        std::fs::write(&tmp, format!("{ino}\n"))?;
        std::fs::rename(&tmp, self.dir.join(pid.to_string()))
    }
}
