//! One of the two modules of uroce-socket with `unsafe` (the other is `ifaddr`): thin,
//! safe wrappers over the Linux system calls the socket layer needs and the standard
//! library does not offer (`setsockopt` / `getsockopt` with integer values,
//! `SO_ATTACH_REUSEPORT_CBPF` with a program, `sendmmsg` with optional `UDP_SEGMENT`
//! control messages, `recvmmsg` reading the `UDP_GRO` control message, `poll`).
//!
//! Every wrapper takes borrowed, correctly sized Rust values; the raw pointers handed to
//! the kernel point into locals of the wrapper's own stack frame or into slices the
//! caller lends for the duration of the call, and nothing the kernel writes is read
//! before the call has returned. Batches are capped at [`MAX_BATCH`], so the arrays of
//! `mmsghdr`, `iovec`, socket addresses and control-message buffers live on the stack and
//! no call allocates. Control messages are built and parsed as plain bytes at the offsets
//! `CMSG_LEN` / `CMSG_DATA` define, never through pointers into them.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};

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

/// `setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &sock_fprog)`: attaches the
/// classic BPF `program` to the reuseport group of `fd` (see [`crate::steer`]).
pub(crate) fn attach_reuseport_cbpf(
    fd: BorrowedFd<'_>,
    program: &[crate::steer::Insn],
) -> io::Result<()> {
    if program.is_empty() || program.len() > crate::steer::MAX_INSNS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut filters: Vec<libc::sock_filter> = program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let prog = libc::sock_fprog {
        // invariant: at most MAX_INSNS = 4096 instructions, checked above.
        len: filters.len() as libc::c_ushort,
        filter: filters.as_mut_ptr(),
    };
    // SAFETY: `prog` is a live `sock_fprog` on this frame, passed with its exact size;
    // its `filter` points at `filters`, a live vector of exactly `prog.len` initialised
    // `sock_filter`s that is neither moved nor dropped until the call returns. The kernel
    // only reads both (it copies the instructions) during the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Room for the control messages of one datagram: the one UDP GSO / GRO control message
/// (`CMSG_SPACE(sizeof(int))` = 24 bytes on 64-bit Linux) with margin, aligned like a
/// `cmsghdr`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Control([u8; 64]);

impl Control {
    const ZERO: Control = Control([0; 64]);
}

/// `CMSG_SPACE(len)`, computed without `unsafe`: the header and the data, each rounded up
/// to the alignment of `size_t` (what glibc and musl both do on Linux).
const fn cmsg_space(len: usize) -> usize {
    cmsg_align(mem::size_of::<libc::cmsghdr>()) + cmsg_align(len)
}

/// `CMSG_LEN(len)`: the aligned header followed by `len` data bytes.
const fn cmsg_len(len: usize) -> usize {
    cmsg_align(mem::size_of::<libc::cmsghdr>()) + len
}

/// Rounds `len` up to the alignment of `size_t`.
const fn cmsg_align(len: usize) -> usize {
    let a = mem::size_of::<usize>();
    (len + a - 1) & !(a - 1)
}

/// `SO_NETNS_COOKIE` (Linux 5.14+): the cookie of the network namespace, never reused
/// while the system runs (an inode of a destroyed namespace is). Read from a fresh UDP
/// socket; `None` when the kernel does not know the option.
/// An OFD byte-range lock (`fcntl` `F_OFD_SETLKW` when `wait`, else `F_OFD_SETLK`) of
/// `len` bytes at `start` of `fd`'s file: a write lock when `lock`, else an unlock. A lock
/// another open file description holds gives `EAGAIN` (or `EACCES`) without `wait`.
pub(crate) fn ofd_lock(
    fd: BorrowedFd<'_>,
    start: u64,
    len: u64,
    lock: bool,
    wait: bool,
) -> io::Result<()> {
    let bad = |_| io::Error::from(io::ErrorKind::InvalidInput);
    // SAFETY: `flock` is plain integers, valid zeroed (`l_pid` must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = libc::off_t::try_from(start).map_err(bad)?;
    fl.l_len = libc::off_t::try_from(len).map_err(bad)?;
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    // SAFETY: `fcntl` with an OFD lock command reads the `flock` we own; `fd` is borrowed,
    // so open for the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(crate) fn netns_cookie() -> Option<u64> {
    /// `SO_NETNS_COOKIE` on the architectures uroce builds for (asm-generic).
    const SO_NETNS_COOKIE: libc::c_int = 71;
    // SAFETY: plain integer arguments; the result is a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned by `socket` and is owned by nothing else.
    let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut value: u64 = 0;
    let mut len = mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals; `len` tells the kernel how many bytes it
    // may write into `value`, and it writes back how many it did.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut value as *mut u64).cast(),
            &mut len,
        )
    };
    (rc == 0 && len as usize == mem::size_of::<u64>()).then_some(value)
}

/// Installs [`after_fork_in_child`] as a `pthread_atfork` child handler.
pub(crate) fn install_atfork_child() -> io::Result<()> {
    // SAFETY: the handler is an `extern "C"` function with no arguments that lives for the
    // whole program; the other two handlers are absent.
    let r = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// Runs in a child right after `fork`: points every descriptor of [`crate::fork`]'s table
/// at `/dev/null`. Only async-signal-safe calls (`open`, `dup3`, `close`) and atomic loads;
/// no lock, no allocation (the child may inherit locks held by threads that do not exist
/// in it).
extern "C" fn after_fork_in_child() {
    // SAFETY: a NUL-terminated literal path and plain flags.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        return;
    }
    for fd in crate::fork::hidden_fds() {
        if fd != null {
            // SAFETY: both are descriptor numbers; `dup3` closes the child's reference to
            // `fd`'s socket and makes `fd` another `/dev/null`, which the child's copy of
            // the owning value closes in time. Errors leave `fd` as it was.
            unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) };
        }
    }
    // SAFETY: `null` was opened above and nothing else refers to it.
    unsafe { libc::close(null) };
}

/// Whether this kernel knows the UDP segmentation offload option (`UDP_SEGMENT`, Linux
/// 4.18+): reading it succeeds on a UDP socket.
pub(crate) fn gso_supported(fd: BorrowedFd<'_>) -> bool {
    get_int_option(fd, libc::SOL_UDP, libc::UDP_SEGMENT).is_ok()
}

/// Whether this kernel knows the UDP receive coalescing option (`UDP_GRO`, Linux 5.0+).
pub(crate) fn gro_supported(fd: BorrowedFd<'_>) -> bool {
    get_int_option(fd, libc::SOL_UDP, libc::UDP_GRO).is_ok()
}

/// Switches UDP receive coalescing (`UDP_GRO`) on or off.
pub(crate) fn set_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_int_option(fd, libc::SOL_UDP, libc::UDP_GRO, libc::c_int::from(on))
}

/// One message for [`send_messages`]: destination, UDP payload, and the GSO segment size
/// (0: an ordinary datagram; otherwise the kernel cuts `bytes` into datagrams of
/// `segment` bytes, the last one possibly shorter).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutMessage<'a> {
    pub(crate) dst: SocketAddr,
    pub(crate) bytes: &'a [u8],
    pub(crate) segment: u16,
}

/// Sends up to [`MAX_BATCH`] datagrams `(destination, UDP payload)` with one
/// `sendmmsg(MSG_DONTWAIT)`. Returns how many the kernel took: the first `n` of
/// `packets`. An error is returned only when not even the first one was taken.
pub(crate) fn send_batch(fd: BorrowedFd<'_>, packets: &[(SocketAddr, &[u8])]) -> io::Result<usize> {
    // As `send_messages`: a few packets get arrays of their size.
    if packets.len() <= PROBE_BATCH {
        send_batch_up_to::<PROBE_BATCH>(fd, packets)
    } else {
        send_batch_up_to::<MAX_BATCH>(fd, packets)
    }
}

/// [`send_batch`] with an array of `N` messages: sends the first `min(len, N)`.
fn send_batch_up_to<const N: usize>(
    fd: BorrowedFd<'_>,
    packets: &[(SocketAddr, &[u8])],
) -> io::Result<usize> {
    let n = packets.len().min(N);
    let mut msgs = [OutMessage {
        dst: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
        bytes: &[],
        segment: 0,
    }; N];
    for (m, (dst, bytes)) in msgs.iter_mut().zip(packets).take(n) {
        *m = OutMessage {
            dst: *dst,
            bytes,
            segment: 0,
        };
    }
    send_up_to::<N>(fd, msgs.get(..n).unwrap_or_default())
}

/// Sends up to [`MAX_BATCH`] messages with one `sendmmsg(MSG_DONTWAIT)`; a message with a
/// non-zero `segment` carries a `UDP_SEGMENT` control message, so the kernel sends it as
/// a train of datagrams (generic segmentation offload). Returns how many messages the
/// kernel took: the first `n` of `msgs`. An error is returned only when not even the
/// first one was taken.
pub(crate) fn send_messages(fd: BorrowedFd<'_>, msgs: &[OutMessage<'_>]) -> io::Result<usize> {
    // The header arrays are built on the stack for every call: a few messages (a reply
    // and its ACK) get arrays of their size, not of MAX_BATCH.
    if msgs.len() <= PROBE_BATCH {
        send_up_to::<PROBE_BATCH>(fd, msgs)
    } else {
        send_up_to::<MAX_BATCH>(fd, msgs)
    }
}

/// [`send_messages`] with header arrays of `N` entries: sends the first `min(len, N)`.
fn send_up_to<const N: usize>(fd: BorrowedFd<'_>, msgs: &[OutMessage<'_>]) -> io::Result<usize> {
    let n = msgs.len().min(N);
    if n == 0 {
        return Ok(0);
    }
    let mut addrs = [RawAddr::zeroed(); N];
    let mut addr_lens = [0 as libc::socklen_t; N];
    let mut iovs = [empty_iovec(); N];
    let mut controls = [Control::ZERO; N];
    let mut control_lens = [0usize; N];
    for ((((addr, addr_len), iov), (control, control_len)), m) in addrs
        .iter_mut()
        .zip(addr_lens.iter_mut())
        .zip(iovs.iter_mut())
        .zip(controls.iter_mut().zip(control_lens.iter_mut()))
        .zip(msgs)
    {
        (*addr, *addr_len) = RawAddr::from_socket_addr(&m.dst);
        *iov = libc::iovec {
            // The kernel only reads through this pointer (sendmmsg).
            iov_base: m.bytes.as_ptr().cast_mut().cast(),
            iov_len: m.bytes.len(),
        };
        if m.segment != 0 {
            *control_len = write_segment_cmsg(control, m.segment);
        }
    }
    // All pointers handed to the kernel derive from these base pointers, taken after the
    // arrays were filled and used until the call returns.
    let addrs_base = addrs.as_mut_ptr();
    let iovs_base = iovs.as_mut_ptr();
    let controls_base = controls.as_mut_ptr();
    let mut hdrs = [zeroed_mmsghdr(); N];
    for (i, (hdr, (addr_len, control_len))) in hdrs
        .iter_mut()
        .zip(addr_lens.into_iter().zip(control_lens))
        .take(n)
        .enumerate()
    {
        hdr.msg_hdr.msg_name = addrs_base.wrapping_add(i).cast();
        hdr.msg_hdr.msg_namelen = addr_len;
        hdr.msg_hdr.msg_iov = iovs_base.wrapping_add(i);
        hdr.msg_hdr.msg_iovlen = 1;
        if control_len != 0 {
            hdr.msg_hdr.msg_control = controls_base.wrapping_add(i).cast();
            hdr.msg_hdr.msg_controllen = control_len as _;
        }
    }
    // SAFETY: `hdrs[..n]` are initialised headers whose name, iovec and control pointers
    // point at element i (< n <= N <= 64) of `addrs`, `iovs` and `controls`, locals of this
    // frame that are neither moved nor borrowed again until the call returns (the
    // control length never exceeds the 64 bytes of a `Control`), and whose iovecs point
    // into the caller's payload slices, which outlive the call. The kernel reads those
    // and writes only `msg_len` of each header. `n <= N <= 64` fits the kernel's
    // `unsigned int`; the integers are passed as `long`, as syscall(2) reads its
    // arguments (see `raw_mmsg_call` for why the call is made directly).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sendmmsg,
            libc::c_long::from(fd.as_raw_fd()),
            hdrs.as_mut_ptr(),
            n as libc::c_long,
            libc::c_long::from(libc::MSG_DONTWAIT),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        // invariant: sendmmsg returns at most `n`.
        Ok((rc as usize).min(n))
    }
}

/// Writes a `SOL_UDP` / `UDP_SEGMENT` control message carrying `segment` (a `u16`, as the
/// kernel reads it) into `control`; returns the control length to pass (`CMSG_SPACE`).
/// Plain byte writes at the offsets `CMSG_LEN` / `CMSG_DATA` use, so no pointer is
/// dereferenced here.
fn write_segment_cmsg(control: &mut Control, segment: u16) -> usize {
    let data_len = mem::size_of::<u16>();
    let header_len = cmsg_align(mem::size_of::<libc::cmsghdr>());
    // The header's layout differs between C libraries (`cmsg_len` is a `size_t` on
    // glibc, a `socklen_t` plus padding on musl), so it is built as a value of the
    // library's own type and copied byte for byte.
    let mut hdr: libc::cmsghdr = zeroed_cmsghdr();
    hdr.cmsg_len = cmsg_len(data_len) as _;
    hdr.cmsg_level = libc::SOL_UDP;
    hdr.cmsg_type = libc::UDP_SEGMENT;
    let bytes = &mut control.0;
    bytes.fill(0);
    // invariant: header_len + 2 <= cmsg_space(2) = 24 <= 64, and the header's size is at
    // most `header_len`.
    if let Some(dst) = bytes.get_mut(..mem::size_of::<libc::cmsghdr>()) {
        dst.copy_from_slice(cmsghdr_bytes(&hdr));
    }
    if let Some(dst) = bytes.get_mut(header_len..header_len + data_len) {
        dst.copy_from_slice(&segment.to_ne_bytes());
    }
    cmsg_space(data_len)
}

/// A `cmsghdr` with every field zero.
fn zeroed_cmsghdr() -> libc::cmsghdr {
    // SAFETY: `cmsghdr` consists of integers only (plus private padding fields on some
    // targets), for which all-zero bytes are valid values.
    unsafe { mem::zeroed() }
}

/// The bytes of a `cmsghdr` value.
fn cmsghdr_bytes(hdr: &libc::cmsghdr) -> &[u8] {
    // SAFETY: `hdr` is a live, initialised `cmsghdr` borrowed for the returned lifetime;
    // it is plain integers with no padding bytes between them on Linux targets (glibc:
    // size_t + 2 ints = 16 bytes; musl: explicit padding field), so every one of its
    // `size_of` bytes is initialised and may be read as `u8`.
    unsafe {
        std::slice::from_raw_parts(
            (hdr as *const libc::cmsghdr).cast::<u8>(),
            mem::size_of::<libc::cmsghdr>(),
        )
    }
}

/// Reads the `SOL_UDP` / `UDP_GRO` control message (the segment size of a coalesced
/// datagram, an `int`) from the first `len` bytes of `control`, if there is one.
fn read_gro_cmsg(control: &Control, len: usize) -> Option<usize> {
    let header_len = cmsg_align(mem::size_of::<libc::cmsghdr>());
    let bytes = control.0.get(..len.min(control.0.len()))?;
    let mut offset = 0;
    // Each pass moves `offset` forward by at least one aligned header: at most 4 passes
    // over 64 bytes.
    while offset + header_len <= bytes.len() {
        let hdr = read_cmsghdr(bytes.get(offset..offset + mem::size_of::<libc::cmsghdr>())?)?;
        // `size_t` on glibc, `socklen_t` on musl: both fit `usize`.
        let total = hdr.cmsg_len as usize;
        if total < header_len {
            return None;
        }
        if hdr.cmsg_level == libc::SOL_UDP && hdr.cmsg_type == libc::UDP_GRO {
            let data = bytes.get(offset + header_len..offset + total)?;
            let raw: [u8; 4] = data.get(..4)?.try_into().ok()?;
            return usize::try_from(i32::from_ne_bytes(raw)).ok();
        }
        offset += cmsg_align(total);
    }
    None
}

/// A `cmsghdr` read from its bytes.
fn read_cmsghdr(bytes: &[u8]) -> Option<libc::cmsghdr> {
    if bytes.len() != mem::size_of::<libc::cmsghdr>() {
        return None;
    }
    let mut hdr = zeroed_cmsghdr();
    // SAFETY: `hdr` is a live local of exactly `bytes.len()` bytes, exclusively borrowed
    // for the copy, and every bit pattern is a valid `cmsghdr` (integers only).
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            (&mut hdr as *mut libc::cmsghdr).cast::<u8>(),
            bytes.len(),
        );
    }
    Some(hdr)
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
    /// For a datagram the kernel coalesced from several (`UDP_GRO`): the size of each of
    /// them but the last, which may be shorter.
    pub(crate) segment: Option<usize>,
}

/// How many datagrams the first `recvmmsg` of [`recv_batch`] asks for. Its header arrays
/// (iovecs, addresses, control buffers, `mmsghdr`s: about 170 bytes a datagram) are built
/// on the stack for every call, so an empty poll, the common case of an application that
/// busy-polls its CQ, initialises 4 entries instead of [`MAX_BATCH`]; only when all 4
/// arrive does a second call take up to [`MAX_BATCH`] in all.
const PROBE_BATCH: usize = 4;

// `raw_mmsg_call`: `sendmmsg` and `recvmmsg` are made as direct system calls
// (`syscall(SYS_…)`), not through the C library's wrappers, which bracket each call with
// thread-cancellation bookkeeping (they are cancellation points). Both are made with
// MSG_DONTWAIT and never block, so a cancellation point there serves no thread (an
// application's blocking waits keep theirs: `poll` goes through the C library), and the
// bookkeeping showed as about 4 % of the samples of an empty busy poll.

/// Receives datagrams with `recvmmsg(MSG_DONTWAIT)` into `storage`, cut into slots of
/// `slot_len` bytes (datagram i goes to `storage[i * slot_len..][..slot_len]`), at most
/// `min(meta.len(), storage.len() / slot_len, MAX_BATCH)` of them, and writes their
/// metadata into `meta`, including the segment size of a datagram the kernel coalesced
/// (`UDP_GRO` control message). One call asks for [`PROBE_BATCH`]; when that many came, a
/// second asks for the rest. Returns how many were received; `Err(WouldBlock)` when none
/// was waiting.
pub(crate) fn recv_batch(
    fd: BorrowedFd<'_>,
    storage: &mut [u8],
    slot_len: usize,
    meta: &mut [RecvMeta],
) -> io::Result<usize> {
    let got = recv_up_to::<PROBE_BATCH>(fd, storage, slot_len, meta)?;
    if got < PROBE_BATCH {
        return Ok(got);
    }
    let limit = meta.len().min(MAX_BATCH);
    let (Some(rest), Some(rest_meta)) =
        (storage.get_mut(got * slot_len..), meta.get_mut(got..limit))
    else {
        return Ok(got);
    };
    // What the first call took is returned whatever the second one says (an error, if
    // lasting, comes back with the next call).
    Ok(got + recv_up_to::<MAX_BATCH>(fd, rest, slot_len, rest_meta).unwrap_or(0))
}

/// One `recvmmsg(MSG_DONTWAIT)` for at most `min(meta.len(), storage.len() / slot_len, N)`
/// datagrams, as [`recv_batch`] describes; `N` sizes the header arrays.
fn recv_up_to<const N: usize>(
    fd: BorrowedFd<'_>,
    storage: &mut [u8],
    slot_len: usize,
    meta: &mut [RecvMeta],
) -> io::Result<usize> {
    if slot_len == 0 {
        return Ok(0);
    }
    let n = (storage.len() / slot_len).min(meta.len()).min(N);
    if n == 0 {
        return Ok(0);
    }
    let storage_base = storage.as_mut_ptr();
    let mut iovs = [empty_iovec(); N];
    for (i, iov) in iovs.iter_mut().take(n).enumerate() {
        *iov = libc::iovec {
            // invariant: (i + 1) * slot_len <= n * slot_len <= storage.len().
            iov_base: storage_base.wrapping_add(i * slot_len).cast(),
            iov_len: slot_len,
        };
    }
    let mut addrs = [RawAddr::zeroed(); N];
    let mut controls = [Control::ZERO; N];
    // All pointers handed to the kernel derive from these base pointers, taken after the
    // arrays were filled and used until the call returns.
    let addrs_base = addrs.as_mut_ptr();
    let iovs_base = iovs.as_mut_ptr();
    let controls_base = controls.as_mut_ptr();
    let mut msgs = [zeroed_mmsghdr(); N];
    for (i, msg) in msgs.iter_mut().take(n).enumerate() {
        msg.msg_hdr.msg_name = addrs_base.wrapping_add(i).cast();
        msg.msg_hdr.msg_namelen = mem::size_of::<RawAddr>() as libc::socklen_t;
        msg.msg_hdr.msg_iov = iovs_base.wrapping_add(i);
        msg.msg_hdr.msg_iovlen = 1;
        msg.msg_hdr.msg_control = controls_base.wrapping_add(i).cast();
        msg.msg_hdr.msg_controllen = mem::size_of::<Control>() as _;
    }
    // SAFETY: `msgs[..n]` are initialised headers whose name pointers point at element i
    // of `addrs` (with `msg_namelen` its full size), whose control pointers point at
    // element i of `controls` (with `msg_controllen` its full size) and whose iovecs
    // point at element i of `iovs`, which in turn points at slot i of `storage`:
    // `slot_len` bytes that lie within `storage` (n * slot_len <= storage.len()),
    // exclusively borrowed for the call. None of these is moved or borrowed again until
    // the call returns, and the kernel writes at most the lengths given. No timeout
    // (null); `n <= N <= MAX_BATCH = 64` fits the kernel's `unsigned int`; the integers
    // are passed as `long`, as syscall(2) reads its arguments (see `raw_mmsg_call`).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_recvmmsg,
            libc::c_long::from(fd.as_raw_fd()),
            msgs.as_mut_ptr(),
            n as libc::c_long,
            libc::c_long::from(libc::MSG_DONTWAIT),
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // invariant: recvmmsg returns at most `n`.
    let got = (rc as usize).min(n);
    for (((m, msg), addr), control) in meta
        .iter_mut()
        .zip(&msgs)
        .zip(&addrs)
        .zip(&controls)
        .take(got)
    {
        // `size_t` on glibc, `socklen_t` on musl: both fit `usize`.
        #[allow(clippy::unnecessary_cast)]
        let control_len = msg.msg_hdr.msg_controllen as usize;
        *m = RecvMeta {
            len: (msg.msg_len as usize).min(slot_len),
            truncated: msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            src: addr.to_socket_addr(),
            segment: read_gro_cmsg(control, control_len).filter(|&s| s > 0),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd as _;
    use std::time::Duration;

    /// Ten datagrams from two senders, queued before the receive: `recv_batch` takes them
    /// in order, the first `PROBE_BATCH` with its first `recvmmsg` and the rest with the
    /// second, each in its slot with its length and source; a smaller `meta` caps it.
    #[test]
    fn recv_batch_takes_a_queue_longer_than_its_probe_in_order() {
        let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let to = rx.local_addr().expect("addr");
        let senders = [
            UdpSocket::bind("127.0.0.1:0").expect("bind"),
            UdpSocket::bind("127.0.0.1:0").expect("bind"),
        ];
        let send_all = || {
            for i in 0..10u8 {
                let d = vec![i; 20 + usize::from(i)];
                senders[usize::from(i % 2)].send_to(&d, to).expect("send");
            }
            // Loopback delivery is done when the sends return; a moment for a loaded host.
            std::thread::sleep(Duration::from_millis(100));
        };
        let slot = 64;
        let check = |storage: &[u8], meta: &[RecvMeta], from: u8, got: usize| {
            for (k, m) in meta.iter().take(got).enumerate() {
                let i = from + k as u8;
                assert_eq!(m.len, 20 + usize::from(i), "datagram {i}");
                assert!(!m.truncated);
                assert_eq!(
                    m.src,
                    Some(senders[usize::from(i % 2)].local_addr().expect("addr"))
                );
                assert!(storage[k * slot..][..m.len].iter().all(|&b| b == i));
            }
        };

        send_all();
        let mut storage = vec![0u8; slot * MAX_BATCH];
        let mut meta = [RecvMeta::default(); MAX_BATCH];
        let got = recv_batch(rx.as_fd(), &mut storage, slot, &mut meta).expect("recv");
        assert_eq!(got, 10);
        check(&storage, &meta, 0, got);

        // Room for 6: 6 now (4 + 2), the other 4 with the next call.
        send_all();
        let mut small = [RecvMeta::default(); 6];
        let got = recv_batch(rx.as_fd(), &mut storage, slot, &mut small).expect("recv");
        assert_eq!(got, 6);
        check(&storage, &small, 0, got);
        let got = recv_batch(rx.as_fd(), &mut storage, slot, &mut small).expect("recv");
        assert_eq!(got, 4);
        check(&storage, &small, 6, got);

        // Empty: WouldBlock.
        let e = recv_batch(rx.as_fd(), &mut storage, slot, &mut meta).expect_err("empty");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}
