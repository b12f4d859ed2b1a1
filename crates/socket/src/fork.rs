//! Keeping a shared device's member sockets out of forked children.
//!
//! A member socket of the host-wide device (see [`crate::steer`]) holds an index in the
//! kernel's reuseport group, and the host registry models that group's order: when the
//! member leaves, the registry records the close and the last member moving into its
//! index. A process that forks without `exec` (Python's `multiprocessing`, servers that
//! fork workers) would hand its children a copy of the descriptor, and the socket — with
//! its index — would outlive the member's close for as long as any child holds it: the
//! kernel's order and the registry's would disagree, and the steering program would send
//! other members' datagrams to a socket nobody reads. (`O_CLOEXEC` covers `exec` only;
//! Linux has no close-on-fork flag.)
//!
//! So every descriptor of a member socket is registered here ([`ForkHidden`]), and a
//! `pthread_atfork` handler that runs in the child right after `fork` points each of them
//! at `/dev/null` (`dup3`, which closes the child's reference to the socket atomically and
//! keeps the descriptor number valid, so the child's copy of the owning Rust value still
//! closes a descriptor of its own later). The child can use none of its parent's devices
//! anyway (their progress threads do not exist in it, as with a kernel verbs context); it
//! opens its own. Only the parent's leave closes the socket, and the registry's model
//! stays true.
//!
//! The table is a fixed array of atomic descriptor numbers, so the handler, which runs in
//! a child where other threads' locks may be held forever, takes no lock and allocates
//! nothing. A descriptor is removed from the table before it is closed (the owner drops
//! its [`ForkHidden`] first), so the handler never touches a number that was reused; a
//! fork in between leaves the child one reference, as before this module existed.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

use crate::sys;

/// How many descriptors can be hidden at once (two per shared device: its socket and the
/// progress thread's duplicate).
const SLOTS: usize = 256;
/// An empty slot.
const EMPTY: i32 = -1;

static HIDDEN: [AtomicI32; SLOTS] = [const { AtomicI32::new(EMPTY) }; SLOTS];
static INSTALL: Once = Once::new();

/// The descriptors in the table now (the child handler's view).
pub(crate) fn hidden_fds() -> impl Iterator<Item = RawFd> {
    HIDDEN
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .filter(|fd| *fd >= 0)
}

/// A descriptor registered to be hidden from forked children while this value lives.
#[derive(Debug)]
pub struct ForkHidden {
    slot: usize,
}

impl ForkHidden {
    /// Registers `fd`; `None` when the table is full (the descriptor then stays visible
    /// to children, as any descriptor is) or the handler cannot be installed.
    pub fn new(fd: BorrowedFd<'_>) -> Option<ForkHidden> {
        let mut installed = true;
        INSTALL.call_once(|| installed = sys::install_atfork_child().is_ok());
        if !installed {
            return None;
        }
        let raw = fd.as_raw_fd();
        HIDDEN.iter().enumerate().find_map(|(slot, s)| {
            s.compare_exchange(EMPTY, raw, Ordering::AcqRel, Ordering::Relaxed)
                .ok()
                .map(|_| ForkHidden { slot })
        })
    }
}

impl Drop for ForkHidden {
    fn drop(&mut self) {
        if let Some(s) = HIDDEN.get(self.slot) {
            s.store(EMPTY, Ordering::Release);
        }
    }
}

/// A duplicate of a member socket's descriptor (for another thread's `poll`), hidden from
/// forked children like the socket itself: [`crate::RoceSocket::duplicate_fd`].
#[derive(Debug)]
pub struct DupFd {
    // Declared first: dropped (unregistered) before the descriptor closes.
    _hidden: Option<ForkHidden>,
    fd: OwnedFd,
}

impl DupFd {
    pub(crate) fn new(fd: OwnedFd, hide: bool) -> DupFd {
        let hidden = if hide {
            ForkHidden::new(fd.as_fd())
        } else {
            None
        };
        DupFd {
            _hidden: hidden,
            fd,
        }
    }
}

impl AsFd for DupFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_while_alive() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let raw = sock.as_raw_fd();
        let h = ForkHidden::new(sock.as_fd()).expect("a slot");
        assert!(hidden_fds().any(|fd| fd == raw));
        drop(h);
        assert!(!hidden_fds().any(|fd| fd == raw));
    }
}
