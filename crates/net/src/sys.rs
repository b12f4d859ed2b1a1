//! The only module of uroce-net with `unsafe`: thin, safe wrappers over the Linux system
//! calls the socket layer needs and the standard library does not offer (`setsockopt` /
//! `getsockopt` with integer values, `sendmmsg`, `recvmmsg`, `poll`).
//!
//! Every wrapper takes borrowed, correctly sized Rust values; the raw pointers handed to
//! the kernel point into locals of the wrapper's own stack frame or into slices the
//! caller lends for the duration of the call, and nothing the kernel writes is read
//! before the call has returned. Batches are capped at [`MAX_BATCH`], so the arrays of
//! `mmsghdr`, `iovec` and socket addresses live on the stack and no call allocates.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

/// The most datagrams one `sendmmsg` / `recvmmsg` call handles.
pub(crate) const MAX_BATCH: usize = 64;

/// Room for either socket address family, as the kernel reads and writes it.
#[repr(C)]
#[derive(Clone, Copy)]
union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl RawAddr {
    /// An all-zero address (family `AF_UNSPEC`).
    fn zeroed() -> RawAddr {
        RawAddr {
            v6: libc::sockaddr_in6 {
                sin6_family: 0,
                sin6_port: 0,
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
                sin6_scope_id: 0,
            },
        }
    }

    /// The kernel form of `addr` and its length.
    fn from_socket_addr(addr: &SocketAddr) -> (RawAddr, libc::socklen_t) {
        match addr {
            SocketAddr::V4(a) => (
                RawAddr {
                    v4: libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: a.port().to_be(),
                        sin_addr: libc::in_addr {
                            s_addr: u32::from_ne_bytes(a.ip().octets()),
                        },
                        sin_zero: [0; 8],
                    },
                },
                mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            SocketAddr::V6(a) => (
                RawAddr {
                    v6: libc::sockaddr_in6 {
                        sin6_family: libc::AF_INET6 as libc::sa_family_t,
                        sin6_port: a.port().to_be(),
                        sin6_flowinfo: a.flowinfo().to_be(),
                        sin6_addr: libc::in6_addr {
                            s6_addr: a.ip().octets(),
                        },
                        sin6_scope_id: a.scope_id(),
                    },
                },
                mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }

    /// The address the kernel wrote, if it is IPv4 or IPv6.
    fn to_socket_addr(self) -> Option<SocketAddr> {
        // SAFETY: both union variants are plain integers and byte arrays without invalid
        // bit patterns, every byte was initialised by `zeroed` or written by the kernel,
        // and `sa_family_t` sits at offset 0 in both, so reading it through `v4` is
        // reading initialised memory of the right type.
        let family = i32::from(unsafe { self.v4.sin_family });
        if family == libc::AF_INET {
            // SAFETY: as above; the family says the kernel wrote a `sockaddr_in`.
            let a = unsafe { self.v4 };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(a.sin_port),
            )))
        } else if family == libc::AF_INET6 {
            // SAFETY: as above; the family says the kernel wrote a `sockaddr_in6`.
            let a = unsafe { self.v6 };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                u32::from_be(a.sin6_flowinfo),
                a.sin6_scope_id,
            )))
        } else {
            None
        }
    }
}

/// An `mmsghdr` with every field zero / null.
fn zeroed_mmsghdr() -> libc::mmsghdr {
    // SAFETY: `mmsghdr` (and the `msghdr` inside it) consists of integers and raw
    // pointers only, for which all-zero bytes are valid values (0 and null); some libc
    // targets add private padding fields, which is why it is not built field by field.
    unsafe { mem::zeroed() }
}

/// An empty `iovec`.
fn empty_iovec() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}

/// `setsockopt(fd, level, name, &value, sizeof(int))`.
pub(crate) fn set_int_option(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a live `c_int` on this stack frame and the length
    // passed is exactly its size; the kernel only reads it during the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `getsockopt(fd, level, name)` for an `int` option.
pub(crate) fn get_int_option(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals; `len` tells the kernel how many bytes it
    // may write into `value`, and it writes back how many it did.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends up to [`MAX_BATCH`] datagrams `(destination, UDP payload)` with one
/// `sendmmsg(MSG_DONTWAIT)`. Returns how many the kernel took: the first `n` of
/// `packets`. An error is returned only when not even the first one was taken.
pub(crate) fn send_batch(fd: BorrowedFd<'_>, packets: &[(SocketAddr, &[u8])]) -> io::Result<usize> {
    let n = packets.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut addrs = [RawAddr::zeroed(); MAX_BATCH];
    let mut addr_lens = [0 as libc::socklen_t; MAX_BATCH];
    let mut iovs = [empty_iovec(); MAX_BATCH];
    for (((addr, addr_len), iov), (dst, payload)) in addrs
        .iter_mut()
        .zip(addr_lens.iter_mut())
        .zip(iovs.iter_mut())
        .zip(packets)
    {
        (*addr, *addr_len) = RawAddr::from_socket_addr(dst);
        *iov = libc::iovec {
            // The kernel only reads through this pointer (sendmmsg).
            iov_base: payload.as_ptr().cast_mut().cast(),
            iov_len: payload.len(),
        };
    }
    // All pointers handed to the kernel derive from these two base pointers, taken
    // after the arrays were filled and used until the call returns.
    let addrs_base = addrs.as_mut_ptr();
    let iovs_base = iovs.as_mut_ptr();
    let mut msgs = [zeroed_mmsghdr(); MAX_BATCH];
    for (i, (msg, addr_len)) in msgs.iter_mut().zip(addr_lens).take(n).enumerate() {
        msg.msg_hdr.msg_name = addrs_base.wrapping_add(i).cast();
        msg.msg_hdr.msg_namelen = addr_len;
        msg.msg_hdr.msg_iov = iovs_base.wrapping_add(i);
        msg.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: `msgs[..n]` are initialised headers whose name and iovec pointers point at
    // element i (< n <= 64) of `addrs` and `iovs`, locals of this frame that are neither
    // moved nor borrowed again until the call returns, and whose iovecs point into the
    // caller's payload slices, which outlive the call. The kernel reads those and
    // writes only `msg_len` of each header. `n <= 64` fits `c_uint`.
    let rc = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        // invariant: sendmmsg returns at most `n`.
        Ok((rc as usize).min(n))
    }
}

/// What the kernel reported for one received datagram.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecvMeta {
    /// Bytes of the datagram placed in its buffer.
    pub(crate) len: usize,
    /// The datagram was longer than its buffer (`MSG_TRUNC`): the tail was discarded.
    pub(crate) truncated: bool,
    /// Where it came from (None if the kernel reported no IP address).
    pub(crate) src: Option<SocketAddr>,
}

/// Receives datagrams with one `recvmmsg(MSG_DONTWAIT)` into `storage`, cut into slots
/// of `slot_len` bytes (datagram i goes to `storage[i * slot_len..][..slot_len]`), at
/// most `min(meta.len(), storage.len() / slot_len, MAX_BATCH)` of them, and writes their
/// metadata into `meta`. Returns how many were received; `Err(WouldBlock)` when none
/// was waiting.
pub(crate) fn recv_batch(
    fd: BorrowedFd<'_>,
    storage: &mut [u8],
    slot_len: usize,
    meta: &mut [RecvMeta],
) -> io::Result<usize> {
    if slot_len == 0 {
        return Ok(0);
    }
    let n = (storage.len() / slot_len).min(meta.len()).min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let storage_base = storage.as_mut_ptr();
    let mut iovs = [empty_iovec(); MAX_BATCH];
    for (i, iov) in iovs.iter_mut().take(n).enumerate() {
        *iov = libc::iovec {
            // invariant: (i + 1) * slot_len <= n * slot_len <= storage.len().
            iov_base: storage_base.wrapping_add(i * slot_len).cast(),
            iov_len: slot_len,
        };
    }
    let mut addrs = [RawAddr::zeroed(); MAX_BATCH];
    // All pointers handed to the kernel derive from these base pointers, taken after the
    // arrays were filled and used until the call returns.
    let addrs_base = addrs.as_mut_ptr();
    let iovs_base = iovs.as_mut_ptr();
    let mut msgs = [zeroed_mmsghdr(); MAX_BATCH];
    for (i, msg) in msgs.iter_mut().take(n).enumerate() {
        msg.msg_hdr.msg_name = addrs_base.wrapping_add(i).cast();
        msg.msg_hdr.msg_namelen = mem::size_of::<RawAddr>() as libc::socklen_t;
        msg.msg_hdr.msg_iov = iovs_base.wrapping_add(i);
        msg.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: `msgs[..n]` are initialised headers whose name pointers point at element i
    // of `addrs` (with `msg_namelen` its full size) and whose iovecs point at element i
    // of `iovs`, which in turn points at slot i of `storage`: `slot_len` bytes that lie
    // within `storage` (n * slot_len <= storage.len()), exclusively borrowed for the
    // call. None of these is moved or borrowed again until the call returns, and the
    // kernel writes at most the lengths given. No timeout (null); `n <= 64` fits `c_uint`.
    let rc = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // invariant: recvmmsg returns at most `n`.
    let got = (rc as usize).min(n);
    for ((m, msg), addr) in meta.iter_mut().zip(&msgs).zip(&addrs).take(got) {
        *m = RecvMeta {
            len: (msg.msg_len as usize).min(slot_len),
            truncated: msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            src: addr.to_socket_addr(),
        };
    }
    Ok(got)
}

/// Which readiness [`poll`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// A datagram can be received.
    Readable,
    /// A datagram can be sent.
    Writable,
}

/// Waits up to `timeout_ms` (negative: forever) until `fd` is ready; true if it is.
pub(crate) fn poll(
    fd: BorrowedFd<'_>,
    what: Readiness,
    timeout_ms: libc::c_int,
) -> io::Result<bool> {
    let events = match what {
        Readiness::Readable => libc::POLLIN,
        Readiness::Writable => libc::POLLOUT,
    };
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one live `pollfd` on this frame, count 1; the kernel writes `revents`.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc > 0 && pfd.revents & (events | libc::POLLERR) != 0)
    }
}
