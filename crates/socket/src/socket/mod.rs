//! [`RoceSocket`]: RoCEv2 packets on a Linux UDP socket, sent and received in batches.
//!
//! # The socket
//! One UDP socket bound to a specific address and (normally) port 4791 (alone, or as one
//! member of a host-wide device's reuseport group: [`RoceSocket::bind_member`]),
//! **unconnected**, non-blocking, with `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4) or
//! `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO` (IPv6), and socket buffers of
//! [`SocketConfig::buffer_bytes`] asked for (the kernel caps them at `net.core.rmem_max` /
//! `wmem_max`; [`RoceSocket::buffer_sizes`] says what it granted).
//!
//! # The ICRC contract
//! The ICRC covers the IPv4 Identification and flags, the total length, the addresses and
//! the UDP ports and length, none of which a UDP socket chooses or sees. For an
//! unconnected socket with `IP_PMTUDISC_DO` Linux sends every IPv4 datagram with
//! Identification 0 and DF (segment k of a GSO message: Identification k), so a sender
//! can compute the ICRC for the header its kernel emits: [`seal_for`] does. A receiver
//! rebuilds the sender's header for Identification 0 with DF and compares (the fast path:
//! one CRC, as for any uroce peer); on a mismatch, an IPv4 packet's ICRC may still be
//! valid for another Identification (a GSO segment, a Linux Soft-RoCE peer, which numbers
//! its datagrams with a per-destination counter) or DF clear. The CRC is affine in those
//! 17 bits, so `uroce_wire::icrc_ident` finds the one header that makes it valid, if any,
//! by elimination. The [`IcrcPolicy`] says which headers are accepted (default: any
//! Identification, DF set or clear; `UROCE_ICRC`), the counters say which path every
//! packet took, and [`Received::ident`] carries the Identification found. IPv6 has no
//! Identification: its ICRC is checked exactly. `docs/ICRC.md` has the algebra, the
//! false-accept rates, and the kernel measurements behind the Identifications.
//!
//! Because of `IP_PMTUDISC_DO` the kernel never fragments: a datagram larger than the path
//! MTU is refused (`EMSGSIZE`, counted in `send_errors`), so the transport's PMTU must fit
//! the interface MTU with the headers (Ethernet 1500 → RoCE PMTU 1024 at most).
//!
//! # Batches
//! [`RoceSocket::send_batch`] hands up to 64 datagrams to one `sendmmsg`;
//! [`RoceSocket::recv_batch`] reads up to 64 with one `recvmmsg` into the preallocated
//! slots of a [`RecvBatch`], checks each (truncation, source, ICRC, packet structure) and
//! exposes the accepted ones through [`RecvBatch::iter`];
//! [`RoceSocket::recv_batch_with`] hands each accepted packet to the caller as soon as it
//! is checked, with the [`PacketRepr`] the structure check parsed, so that a packet is
//! parsed once (the device's receive path). Neither path allocates per packet (fault
//! injection, when enabled, copies packets).
//!
//! # Trains: segmentation offload (GSO) and receive coalescing (GRO)
//! One datagram per system call tops out near 1.4 GB/s on loopback (baselines.md), so
//! [`RoceSocket::send_train`] sends a run of equal-size packets to one destination as
//! *GSO messages*: one `sendmmsg` entry carrying up to [`GSO_MAX_SEGMENTS`] packets laid
//! end to end (and at most 64 KiB) with a `UDP_SEGMENT` control message; the kernel cuts
//! it into one datagram per packet. On the receiving side the socket turns `UDP_GRO` on,
//! so the kernel may hand over several datagrams of one flow as one buffer with their
//! size in a control message; [`RoceSocket::recv_batch`] cuts it up again, and every
//! packet is checked, counted, captured and handed out on its own. The kernel's support
//! for both is probed when the socket is bound ([`RoceSocket::gso_supported`],
//! [`RoceSocket::gro_supported`]).
//!
//! **The IPv4 Identification of a segment.** Linux gives the *k*-th datagram of a GSO
//! message the Identification k (the message's own 0 plus k), with DF, whether it cuts
//! the message in software, on the receiving side, or in a NIC (measured on loopback and
//! veth; `docs/ICRC.md`, checked by `tests/gso.rs`). So segment k is sealed for
//! Identification k, the header every observer that sees it as a datagram sees, and a
//! receiving uroce socket finds k from the ICRC (even under [`IcrcPolicy::Strict`], which
//! accepts Identifications below [`TRAIN_ID_SPAN`] with DF).
//!
//! Fault injection and packet capture see individual packets, each sealed for ID 0, so
//! with either of them on [`RoceSocket::send_train`] sends packet by packet; so it does
//! when GSO is switched off ([`SocketConfig::gso`], [`RoceSocket::set_gso`]), not
//! supported, for a single packet, or after the kernel refused a GSO message with `EIO`
//! or `EINVAL` (then for the rest of the socket's life).
//!
//! A coalesced datagram can be up to 64 KiB long and would be cut short in a smaller
//! receive slot, so `UDP_GRO` is on only while the socket receives into slots of at least
//! [`RecvBatch::GRO_SLOT_LEN`] bytes (as [`RecvBatch::default`] has). It is switched on by
//! the first receive into such slots (datagrams queued before stay single), and off by a
//! receive into smaller slots that finds the queue drained (one `setsockopt`, only when it
//! changes). A coalesced datagram read into a slot too small for it (queued before the
//! switch) keeps the complete packets at its front, and the rest is counted as one
//! truncated packet; one that arrives between the drain and the switch has no segment
//! size any more (the kernel reports it only while `UDP_GRO` is on) and is dropped whole
//! as truncated.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use uroce_wire::icrc_ident::{IdentSolver, Ipv4Ident};
use uroce_wire::ip::{self, Endpoints, IpFields, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use uroce_wire::{icrc, HeaderKind, PacketRepr, WireError, ICRC_LEN, ROCEV2_UDP_PORT};

use crate::capture::Capture;
use crate::counters::{CounterSnapshot, Counters};
use crate::faults::{FaultConfig, FaultInjector, Outgoing};
use crate::fork::{DupFd, ForkHidden};
use crate::sys::{self, OutMessage, Readiness, RecvMeta, MAX_BATCH};
use crate::SocketError;

mod icrc_check;
mod recv;
pub use icrc_check::*;
pub use recv::*;

/// The most datagrams one system call sends or receives.
pub const BATCH_MAX: usize = MAX_BATCH;
/// Socket buffer size asked for by default (4 MiB).
pub const DEFAULT_BUFFER_BYTES: usize = 4 << 20;
/// How often a batch call retries a system call interrupted by a signal.
const MAX_EINTR_RETRIES: u32 = 16;
/// Room for the largest IP + UDP header (IPv6).
const MAX_HEADERS_LEN: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN;
/// The most packets [`RoceSocket::send_train`] puts in one GSO message (fewer when 64 KiB
/// is reached first). Linux accepts 64 per message, recent kernels (6.18) 128.
pub const GSO_MAX_SEGMENTS: usize = 64;
/// A receiver accepts an IPv4 packet whose ICRC matches a header with an Identification
/// below this: the segments of a GSO message carry 0, 1, 2, … (see the module docs), and
/// Linux puts at most 128 segments in one message.
pub const TRAIN_ID_SPAN: u16 = 128;
/// The smallest RoCEv2 packet: a BTH and an ICRC.
const MIN_PACKET_LEN: usize = 12 + ICRC_LEN;
/// The largest UDP payload of an IPv4 datagram (65535 − 20 − 8).
const MAX_UDP_PAYLOAD_V4: usize = 65_535 - IPV4_HEADER_LEN - UDP_HEADER_LEN;
/// The largest UDP payload of an IPv6 datagram (the payload length, 65535, covers the UDP
/// header).
const MAX_UDP_PAYLOAD_V6: usize = 65_535 - UDP_HEADER_LEN;
/// Segments of one received coalesced datagram a [`RecvBatch`] makes room for (Linux
/// coalesces at most 64 on receive and lets a sender put at most 128 in one message).
const MAX_SEGMENTS_PER_DATAGRAM: usize = 128;

/// One packet to send: the destination and the UDP payload (BTH..ICRC, sealed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutPacket<'a> {
    /// Destination address and port (port 4791 for a RoCEv2 peer).
    pub dst: SocketAddr,
    /// BTH..pad followed by the ICRC, sealed for this socket and `dst` ([`seal_for`]).
    pub roce: &'a [u8],
}

/// How a [`RoceSocket`] is set up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SocketConfig {
    /// `SO_RCVBUF` and `SO_SNDBUF` to ask for, in bytes.
    pub buffer_bytes: usize,
    /// Which packets to accept by their ICRC (default
    /// [`IcrcPolicy::AnyIdentification`]; [`SocketConfig::with_env_icrc`] reads
    /// `UROCE_ICRC`).
    pub icrc_policy: IcrcPolicy,
    /// Faults to inject into outgoing packets, if any.
    pub faults: Option<FaultConfig>,
    /// Send trains with UDP segmentation offload when the kernel supports it (default
    /// true; see [`RoceSocket::send_train`]).
    pub gso: bool,
    /// Let the kernel coalesce received datagrams (`UDP_GRO`) when it supports it and the
    /// receive slots are large enough (default true; see the module docs).
    pub gro: bool,
}

impl Default for SocketConfig {
    fn default() -> SocketConfig {
        SocketConfig {
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            icrc_policy: IcrcPolicy::AnyIdentification,
            faults: None,
            gso: true,
            gro: true,
        }
    }
}

impl SocketConfig {
    /// This configuration with `faults` taken from `UROCE_FAULTS` (unchanged when the
    /// variable is unset or blank).
    ///
    /// # Errors
    /// [`SocketError::Faults`] if the variable does not parse.
    pub fn with_env_faults(mut self) -> Result<SocketConfig, SocketError> {
        if let Some(f) = FaultConfig::from_env()? {
            self.faults = Some(f);
        }
        Ok(self)
    }

    /// This configuration with `icrc_policy` taken from `UROCE_ICRC` (unchanged when the
    /// variable is unset or blank).
    ///
    /// # Errors
    /// [`SocketError::BadIcrcPolicy`] if the variable is not `strict`, `any-id` or
    /// `unverified`.
    pub fn with_env_icrc(mut self) -> Result<SocketConfig, SocketError> {
        if let Some(p) = IcrcPolicy::from_env()? {
            self.icrc_policy = p;
        }
        Ok(self)
    }
}

/// The socket buffer sizes the kernel granted, as `getsockopt` reports them (Linux
/// doubles the size asked for, for its bookkeeping, after capping it at
/// `net.core.rmem_max` / `wmem_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferSizes {
    /// `SO_RCVBUF`.
    pub recv: usize,
    /// `SO_SNDBUF`.
    pub send: usize,
}

/// Refuses addresses for which the kernel's IP header cannot be predicted.
fn check_addr(addr: IpAddr) -> Result<(), SocketError> {
    if addr.is_unspecified() {
        return Err(SocketError::UnusableAddress {
            addr,
            why: "unspecified: the kernel would choose the source address the ICRC covers",
        });
    }
    if let IpAddr::V6(v6) = addr {
        if v6.to_ipv4_mapped().is_some() {
            return Err(SocketError::UnusableAddress {
                addr,
                why: "IPv4-mapped: the datagram would travel as IPv4; use the IPv4 address",
            });
        }
    }
    Ok(())
}

/// A RoCEv2 endpoint on a UDP socket (see the module docs).
#[derive(Debug)]
pub struct RoceSocket {
    /// A member socket's registration with [`crate::fork`] (declared before `socket`, so
    /// it is dropped, and the descriptor unregistered, before the socket closes).
    hidden: Option<ForkHidden>,
    socket: UdpSocket,
    local: SocketAddr,
    buffers: BufferSizes,
    policy: IcrcPolicy,
    counters: Arc<Counters>,
    faults: Option<FaultInjector>,
    /// Packets the fault injector let out that the kernel has not taken yet.
    backlog: VecDeque<Outgoing>,
    /// Scratch for the injector's output.
    fault_out: Vec<Outgoing>,
    capture: Option<Capture>,
    /// Segmentation offload: wanted, supported, and not refused by the kernel.
    gso: Offload,
    /// Receive coalescing: wanted and supported.
    gro: Offload,
    /// Whether `UDP_GRO` is on on the socket now.
    gro_on: bool,
    /// Finds the IPv4 Identification a received ICRC was computed for.
    ids: IdentSolver,
}

/// The state of one offload (GSO or GRO) of a socket.
#[derive(Debug, Clone, Copy)]
struct Offload {
    /// Asked for (configuration or `set_gso` / `set_gro`).
    wanted: bool,
    /// The kernel knows the option (probed at bind).
    supported: bool,
    /// The kernel refused it in use (GSO: a message failed with `EIO` / `EINVAL`).
    refused: bool,
}

impl Offload {
    fn usable(self) -> bool {
        self.wanted && self.supported && !self.refused
    }
}

/// How a failed `sendmmsg` is handled.
enum SendFailure {
    /// Socket buffer full: stop, the caller retries later.
    WouldBlock,
    /// Interrupted: retry.
    Interrupted,
    /// The kernel refused the first packet of the call: skip it, count it.
    Packet,
    /// Anything else: give up with an error.
    Fatal,
}

fn classify_send_error(e: &io::Error) -> SendFailure {
    if e.kind() == io::ErrorKind::WouldBlock {
        return SendFailure::WouldBlock;
    }
    if e.kind() == io::ErrorKind::Interrupted {
        return SendFailure::Interrupted;
    }
    match e.raw_os_error() {
        Some(libc::ENOBUFS) => SendFailure::WouldBlock,
        Some(
            libc::EMSGSIZE
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::EHOSTDOWN
            | libc::ENETDOWN
            | libc::ECONNREFUSED
            | libc::EPERM
            | libc::EACCES
            | libc::EADDRNOTAVAIL
            | libc::EINVAL,
        ) => SendFailure::Packet,
        _ => SendFailure::Fatal,
    }
}

impl RoceSocket {
    /// A socket on `(addr, 4791)` with the default [`SocketConfig`].
    ///
    /// # Errors
    /// As [`RoceSocket::bind_with`].
    pub fn bind(addr: IpAddr) -> Result<RoceSocket, SocketError> {
        RoceSocket::bind_port(addr, ROCEV2_UDP_PORT)
    }

    /// A socket on `(addr, port)` with the default [`SocketConfig`] (port 0: the kernel
    /// picks one; useful for tests and for a sender that only talks to port 4791).
    ///
    /// # Errors
    /// As [`RoceSocket::bind_with`].
    pub fn bind_port(addr: IpAddr, port: u16) -> Result<RoceSocket, SocketError> {
        RoceSocket::bind_with(SocketAddr::new(addr, port), SocketConfig::default())
    }

    /// A socket on `addr` set up as `config` says (see the module docs).
    ///
    /// # Errors
    /// [`SocketError::UnusableAddress`] for an unspecified or IPv4-mapped address,
    /// [`SocketError::Bind`] if the socket cannot be bound, [`SocketError::SocketOption`] if an
    /// option cannot be set (including the path-MTU-discovery mode not reading back as
    /// set).
    pub fn bind_with(addr: SocketAddr, config: SocketConfig) -> Result<RoceSocket, SocketError> {
        check_addr(addr.ip())?;
        let socket = UdpSocket::bind(addr).map_err(|source| SocketError::Bind { addr, source })?;
        Self::configure(socket, addr, config)
    }

    /// A member socket of the reuseport group of `addr` (a host-wide device, see
    /// [`crate::steer`]): bound with `SO_REUSEPORT` as the group's last member
    /// ([`crate::steer::bind_member`]) and configured as [`RoceSocket::bind_with`] does.
    /// The caller holds the host registry's lock while binding and records the bind
    /// ([`crate::host::Locked::joined_group`]). Its port must be explicit (see
    /// [`crate::steer`] on port 0).
    ///
    /// # Errors
    /// As [`RoceSocket::bind_with`].
    pub fn bind_member(addr: SocketAddr, config: SocketConfig) -> Result<RoceSocket, SocketError> {
        check_addr(addr.ip())?;
        let socket =
            crate::steer::bind_member(addr).map_err(|source| SocketError::Bind { addr, source })?;
        let hidden = ForkHidden::new(socket.as_fd());
        let mut sock = Self::configure(socket, addr, config)?;
        sock.hidden = hidden;
        Ok(sock)
    }

    /// A duplicate of the socket's descriptor (for another thread's `poll`), hidden from
    /// forked children when the socket is a member socket ([`crate::fork`]).
    ///
    /// # Errors
    /// The `dup` failing.
    pub fn duplicate_fd(&self) -> std::io::Result<DupFd> {
        let fd = self.socket.as_fd().try_clone_to_owned()?;
        Ok(DupFd::new(fd, self.hidden.is_some()))
    }

    /// A socket that receives the datagrams of the IP multicast group `group` on port
    /// `port` arriving on the interface of the local address `iface` (see
    /// [`crate::mcast`]): bound to `group:port` with `SO_REUSEADDR` (every device of the
    /// host joined to the group gets its own copy), member of the group on that
    /// interface, and configured as [`RoceSocket::bind_with`] does. Its local address is
    /// the group's, which is what the ICRC of a datagram sent to the group covers.
    ///
    /// # Errors
    /// [`SocketError::Bind`] if the socket cannot be created, bound or joined to the group;
    /// the option errors of [`RoceSocket::bind_with`].
    pub fn bind_group(
        group: IpAddr,
        iface: IpAddr,
        port: u16,
        config: SocketConfig,
    ) -> Result<RoceSocket, SocketError> {
        let addr = SocketAddr::new(group, port);
        let socket = crate::mcast::group_socket(group, iface, port)
            .map_err(|source| SocketError::Bind { addr, source })?;
        Self::configure(socket, addr, config)
    }

    fn configure(
        socket: UdpSocket,
        addr: SocketAddr,
        config: SocketConfig,
    ) -> Result<RoceSocket, SocketError> {
        let local = socket
            .local_addr()
            .map_err(|source| SocketError::Bind { addr, source })?;
        let opt_err = |option| {
            move |source| SocketError::SocketOption {
                option,
                local,
                source,
            }
        };
        socket
            .set_nonblocking(true)
            .map_err(opt_err("O_NONBLOCK"))?;
        let fd = socket.as_fd();
        let (level, name, value, option) = if local.is_ipv4() {
            (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
                "IP_MTU_DISCOVER",
            )
        } else {
            (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
                "IPV6_MTU_DISCOVER",
            )
        };
        sys::set_int_option(fd, level, name, value).map_err(opt_err(option))?;
        let read_back = sys::get_int_option(fd, level, name).map_err(opt_err(option))?;
        if read_back != value {
            return Err(opt_err(option)(io::Error::other(format!(
                "reads back {read_back}, not {value}"
            ))));
        }
        let ask = libc::c_int::try_from(config.buffer_bytes).unwrap_or(libc::c_int::MAX);
        let mut granted = [0usize; 2];
        for (slot, (name, option)) in granted.iter_mut().zip([
            (libc::SO_RCVBUF, "SO_RCVBUF"),
            (libc::SO_SNDBUF, "SO_SNDBUF"),
        ]) {
            sys::set_int_option(fd, libc::SOL_SOCKET, name, ask).map_err(opt_err(option))?;
            let got = sys::get_int_option(fd, libc::SOL_SOCKET, name).map_err(opt_err(option))?;
            *slot = usize::try_from(got).unwrap_or(0);
        }
        let (gso_supported, gro_supported) = (sys::gso_supported(fd), sys::gro_supported(fd));
        Ok(RoceSocket {
            hidden: None,
            socket,
            local,
            buffers: BufferSizes {
                recv: granted[0],
                send: granted[1],
            },
            policy: config.icrc_policy,
            counters: Arc::new(Counters::default()),
            faults: config.faults.map(FaultInjector::new),
            backlog: VecDeque::new(),
            fault_out: Vec::new(),
            capture: None,
            gso: Offload {
                wanted: config.gso,
                supported: gso_supported,
                refused: false,
            },
            gro: Offload {
                wanted: config.gro,
                supported: gro_supported,
                refused: false,
            },
            gro_on: false,
            ids: IdentSolver::new(),
        })
    }

    /// The address and port the socket is bound to (the source of everything it sends).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The socket buffer sizes the kernel granted.
    pub fn buffer_sizes(&self) -> BufferSizes {
        self.buffers
    }

    /// The ICRC policy.
    pub fn icrc_policy(&self) -> IcrcPolicy {
        self.policy
    }

    /// Changes the ICRC policy for packets received from now on.
    pub fn set_icrc_policy(&mut self, policy: IcrcPolicy) {
        self.policy = policy;
    }

    /// A copy of the counters.
    pub fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }

    /// The live counters, to be read from elsewhere (e.g. a statistics thread).
    pub fn counters_handle(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// Starts (`Some`) or stops (`None`) fault injection on outgoing packets. Packets the
    /// previous injector still held back are sent first (if the socket takes them).
    ///
    /// # Errors
    /// As [`RoceSocket::flush_held`].
    pub fn set_faults(&mut self, faults: Option<FaultConfig>) -> Result<(), SocketError> {
        self.flush_held()?;
        self.faults = faults.map(FaultInjector::new);
        Ok(())
    }

    /// The fault-injection configuration in force, if any.
    pub fn faults(&self) -> Option<&FaultConfig> {
        self.faults.as_ref().map(FaultInjector::config)
    }

    /// Starts capturing every packet sent and received into `capture` (or stops, with
    /// `None`); returns the previous capture, if any.
    pub fn set_capture(&mut self, capture: Option<Capture>) -> Option<Capture> {
        std::mem::replace(&mut self.capture, capture)
    }

    /// The capture in use, if any (e.g. to flush it).
    pub fn capture_mut(&mut self) -> Option<&mut Capture> {
        self.capture.as_mut()
    }

    /// Whether the kernel supports UDP segmentation offload (`UDP_SEGMENT`), as probed
    /// when the socket was bound.
    pub fn gso_supported(&self) -> bool {
        self.gso.supported
    }

    /// Whether the kernel supports UDP receive coalescing (`UDP_GRO`), as probed when the
    /// socket was bound.
    pub fn gro_supported(&self) -> bool {
        self.gro.supported
    }

    /// Allows (`true`, the default of [`SocketConfig::gso`]) or forbids segmentation
    /// offload for [`RoceSocket::send_train`]. Allowing it again does not undo a refusal
    /// by the kernel (see [`RoceSocket::gso_active`]).
    pub fn set_gso(&mut self, on: bool) {
        self.gso.wanted = on;
    }

    /// Whether [`RoceSocket::send_train`] would use segmentation offload now: allowed,
    /// supported, never refused by the kernel on this socket, and neither fault
    /// injection nor a capture on (both work on individual packets).
    pub fn gso_active(&self) -> bool {
        self.gso.usable() && self.faults.is_none() && self.capture.is_none()
    }

    /// Allows (`true`, the default of [`SocketConfig::gro`]) or forbids receive
    /// coalescing. [`RoceSocket::recv_batch`] applies it: switching on before its next
    /// receive (into large enough slots), switching off after a receive that finds the
    /// queue drained.
    pub fn set_gro(&mut self, on: bool) {
        self.gro.wanted = on;
    }

    /// Whether `UDP_GRO` is on on the socket now (it follows the slot size of the last
    /// receive; see the module docs).
    pub fn gro_active(&self) -> bool {
        self.gro_on
    }

    /// [`seal_for`] from this socket's address.
    ///
    /// # Errors
    /// As [`seal_for`].
    pub fn seal(&self, dst: SocketAddr, roce: &mut [u8]) -> Result<u32, SocketError> {
        seal_for(self.local, dst, roce)
    }

    /// Waits up to `timeout` (None: forever) until a datagram can be received.
    ///
    /// # Errors
    /// [`SocketError::Poll`] if `poll` fails for another reason than a signal.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> Result<bool, SocketError> {
        self.wait(Readiness::Readable, timeout)
    }

    /// Waits up to `timeout` (None: forever) until a datagram can be sent.
    ///
    /// # Errors
    /// [`SocketError::Poll`] if `poll` fails for another reason than a signal.
    pub fn wait_writable(&self, timeout: Option<Duration>) -> Result<bool, SocketError> {
        self.wait(Readiness::Writable, timeout)
    }

    fn wait(&self, what: Readiness, timeout: Option<Duration>) -> Result<bool, SocketError> {
        let ms = match timeout {
            None => -1,
            // Round up so that a sub-millisecond timeout still waits.
            Some(t) => {
                libc::c_int::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
            }
        };
        match sys::poll(self.socket.as_fd(), what, ms) {
            Ok(ready) => Ok(ready),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(source) => Err(SocketError::Poll {
                local: self.local,
                source,
            }),
        }
    }

    /// Sends `packets` (each sealed for this socket and its destination), up to 64 per
    /// `sendmmsg`. Returns how many of them, from the front, were dealt with: sent, or
    /// refused by the kernel one by one (counted in `send_errors` and skipped, as a lossy
    /// network would lose them), or taken by the fault injector. When the result is less
    /// than `packets.len()`, the socket buffer is full (`EAGAIN`, counted): send the rest
    /// later ([`RoceSocket::wait_writable`]).
    ///
    /// With fault injection on, every packet goes through the injector and what it lets
    /// out is queued and sent; if the kernel does not take all of it, nothing of the next
    /// call is taken (it returns 0) until the queue is empty.
    ///
    /// # Errors
    /// [`SocketError::AddressFamily`] if a destination's family differs from the socket's
    /// (nothing is sent); [`SocketError::Send`] for a socket-level failure (packets before
    /// it may have been sent).
    pub fn send_batch(&mut self, packets: &[OutPacket<'_>]) -> Result<usize, SocketError> {
        for p in packets {
            if p.dst.is_ipv4() != self.local.is_ipv4() {
                return Err(SocketError::AddressFamily {
                    local: self.local,
                    remote: p.dst,
                });
            }
        }
        self.send_each(packets.len(), |i| packets.get(i).map(|p| (p.dst, p.roce)))
    }

    /// Sends packets `0..count` (as `get` yields them, sealed) one datagram each, through
    /// the fault injector when it is on; the contract of [`RoceSocket::send_batch`].
    fn send_each<'p>(
        &mut self,
        count: usize,
        get: impl Fn(usize) -> Option<(SocketAddr, &'p [u8])>,
    ) -> Result<usize, SocketError> {
        // Packets the injector let out earlier go first (also after injection was
        // switched off).
        if !self.backlog.is_empty() && !self.drain_backlog()? {
            return Ok(0);
        }
        let Some(injector) = self.faults.as_mut() else {
            return self.transmit(count, get);
        };
        for i in 0..count {
            // invariant: `get` yields every index below `count`; stop if not.
            let Some((dst, roce)) = get(i) else { break };
            self.fault_out.clear();
            let fx = injector.process(dst, roce, &mut self.fault_out);
            let c = &self.counters;
            Counters::add(&c.injected_drops, u64::from(fx.dropped));
            Counters::add(&c.injected_dups, u64::from(fx.duplicated));
            Counters::add(&c.injected_reorders, u64::from(fx.held_for.is_some()));
            Counters::add(
                &c.injected_corruptions,
                u64::from(fx.corrupted_bit.is_some()),
            );
            self.backlog.extend(self.fault_out.drain(..));
        }
        self.drain_backlog()?;
        Ok(count)
    }

    /// Sends a *train*: `buf` holds packets (BTH..pad followed by 4 ICRC bytes) laid end
    /// to end, every one `seg_len` bytes long except possibly the last, which may be
    /// shorter (`seg_len` 0 or at least `buf.len()`: `buf` is one packet), all to `dst`.
    ///
    /// This function seals every packet itself, overwriting its last four bytes: for the
    /// header the kernel emits for it, which depends on how it is sent. With segmentation
    /// offload ([`RoceSocket::gso_active`], two packets or more, and two fitting in a
    /// 64 KiB message) the packets go out as GSO messages of up to
    /// [`GSO_MAX_SEGMENTS`] packets, up to 64 messages per `sendmmsg`, and the k-th
    /// packet of a message is sealed for IPv4 Identification k (see the module docs);
    /// otherwise each packet is sealed for Identification 0 and sent as by
    /// [`RoceSocket::send_batch`] (through the fault injector when it is on, recorded by
    /// the capture when there is one).
    ///
    /// Returns how many packets, from the front, were dealt with (sent, refused by the
    /// kernel and counted in `send_errors`, or taken by the fault injector); fewer than
    /// the train holds when the socket buffer is full: send the rest later
    /// ([`RoceSocket::wait_writable`]), from the first packet not dealt with, with the
    /// same `seg_len`. Counters count packets, not messages. If the kernel refuses a GSO
    /// message with `EIO` or `EINVAL`, segmentation offload is switched off for good on
    /// this socket and the rest of the train goes packet by packet.
    ///
    /// # Errors
    /// [`SocketError::UnusableAddress`] / [`SocketError::AddressFamily`] for a destination the
    /// ICRC cannot be computed for; [`SocketError::Seal`] when a packet is shorter than a
    /// BTH and an ICRC or longer than a datagram can be (nothing is sent in these cases);
    /// [`SocketError::Send`] for a socket-level failure (packets before it may have been
    /// sent).
    pub fn send_train(
        &mut self,
        dst: SocketAddr,
        buf: &mut [u8],
        seg_len: usize,
    ) -> Result<usize, SocketError> {
        check_pair(self.local, dst)?;
        if buf.is_empty() {
            return Ok(0);
        }
        let seg_len = if seg_len == 0 || seg_len > buf.len() {
            buf.len()
        } else {
            seg_len
        };
        let count = buf.len().div_ceil(seg_len);
        let last_len = buf.len() - (count - 1) * seg_len;
        let max_payload = if dst.is_ipv4() {
            MAX_UDP_PAYLOAD_V4
        } else {
            MAX_UDP_PAYLOAD_V6
        };
        let seal_err = |source| SocketError::Seal {
            local: self.local,
            remote: dst,
            source,
        };
        if last_len.min(seg_len) < MIN_PACKET_LEN {
            return Err(seal_err(WireError::Truncated {
                header: HeaderKind::Icrc,
                offset: 12,
                needed: ICRC_LEN,
                available: last_len.min(seg_len).saturating_sub(12),
            }));
        }
        if seg_len > max_payload {
            return Err(seal_err(WireError::BadLength {
                header: HeaderKind::Udp,
                field: "payload length",
                value: seg_len,
                expected: max_payload,
            }));
        }
        let per_message = GSO_MAX_SEGMENTS.min(max_payload / seg_len);
        if !self.backlog.is_empty() && !self.drain_backlog()? {
            return Ok(0);
        }
        if count < 2 || per_message < 2 || !self.gso_active() {
            return self.send_train_each(dst, buf, seg_len);
        }
        self.send_train_gso(dst, buf, seg_len, per_message)
    }

    /// [`RoceSocket::send_train`] packet by packet, each sealed for Identification 0.
    fn send_train_each(
        &mut self,
        dst: SocketAddr,
        buf: &mut [u8],
        seg_len: usize,
    ) -> Result<usize, SocketError> {
        for packet in buf.chunks_mut(seg_len) {
            seal_checked(self.local, dst, packet, 0)?;
        }
        let buf = &*buf;
        let count = buf.len().div_ceil(seg_len);
        self.send_each(count, |i| {
            let start = i.checked_mul(seg_len)?;
            let end = start.saturating_add(seg_len).min(buf.len());
            buf.get(start..end).map(|p| (dst, p))
        })
    }

    /// [`RoceSocket::send_train`] as GSO messages of up to `per_message` (>= 2) packets.
    fn send_train_gso(
        &mut self,
        dst: SocketAddr,
        buf: &mut [u8],
        seg_len: usize,
        per_message: usize,
    ) -> Result<usize, SocketError> {
        let count = buf.len().div_ceil(seg_len);
        let message_len = per_message * seg_len;
        // invariant: per_message * seg_len <= 65535, checked by the caller.
        let segment = u16::try_from(seg_len).unwrap_or(u16::MAX);
        let placeholder = OutMessage {
            dst,
            bytes: &[],
            segment: 0,
        };
        let mut done = 0;
        let mut interrupts = 0;
        // Every pass advances `done` by at least one message, stops, or retries after a
        // signal at most MAX_EINTR_RETRIES times: at most count + 16 passes.
        while done < count {
            let rest = buf.get_mut(done * seg_len..).unwrap_or_default();
            // Seal the packets of the next (up to) 64 messages: packet k of a message
            // for Identification k.
            for message in rest.chunks_mut(message_len).take(MAX_BATCH) {
                for (k, packet) in message.chunks_mut(seg_len).enumerate() {
                    // invariant: k < per_message <= 64.
                    seal_checked(self.local, dst, packet, k as u16)?;
                }
            }
            let rest = &*rest;
            let mut msgs = [placeholder; MAX_BATCH];
            let mut n = 0;
            for (m, bytes) in msgs.iter_mut().zip(rest.chunks(message_len)) {
                *m = OutMessage {
                    dst,
                    bytes,
                    // A message of one packet is an ordinary datagram.
                    segment: if bytes.len() > seg_len { segment } else { 0 },
                };
                n += 1;
            }
            let msgs = msgs.get(..n).unwrap_or_default();
            let packets_in = |ms: &[OutMessage<'_>]| -> usize {
                ms.iter().map(|m| m.bytes.len().div_ceil(seg_len)).sum()
            };
            match sys::send_messages(self.socket.as_fd(), msgs) {
                Ok(0) => {
                    Counters::add(&self.counters.eagain, 1);
                    break;
                }
                Ok(sent) => {
                    let sent_msgs = msgs.get(..sent).unwrap_or_default();
                    let packets = packets_in(sent_msgs);
                    let bytes: usize = sent_msgs.iter().map(|m| m.bytes.len()).sum();
                    Counters::add(&self.counters.tx_packets, packets as u64);
                    Counters::add(&self.counters.tx_bytes, bytes as u64);
                    done += packets;
                }
                Err(e) => {
                    let first = msgs.get(..1).unwrap_or_default();
                    let is_gso = first.first().is_some_and(|m| m.segment != 0);
                    match classify_send_error(&e) {
                        SendFailure::WouldBlock => {
                            Counters::add(&self.counters.eagain, 1);
                            break;
                        }
                        SendFailure::Interrupted if interrupts < MAX_EINTR_RETRIES => {
                            interrupts += 1;
                        }
                        SendFailure::Packet
                            if is_gso
                                && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) =>
                        {
                            // The kernel will not segment for this socket (e.g. no
                            // checksum offload on the route): packet by packet from now on.
                            self.gso.refused = true;
                            let rest = buf.get_mut(done * seg_len..).unwrap_or_default();
                            return Ok(done + self.send_train_each(dst, rest, seg_len)?);
                        }
                        SendFailure::Packet => {
                            // Refused as a whole (e.g. EMSGSIZE: the packets exceed the
                            // path MTU): every packet of it is lost, as on a lossy network.
                            let lost = packets_in(first);
                            Counters::add(&self.counters.send_errors, lost as u64);
                            done += lost;
                        }
                        SendFailure::Interrupted | SendFailure::Fatal => {
                            return Err(SocketError::Send {
                                local: self.local,
                                source: e,
                            })
                        }
                    }
                }
            }
        }
        Ok(done)
    }

    /// Sends every packet the fault injector is holding back, and any packet it let out
    /// that the kernel has not taken yet. Returns how many are still waiting (the socket
    /// buffer filled up); 0 when all went out.
    ///
    /// # Errors
    /// [`SocketError::Send`] for a socket-level failure.
    pub fn flush_held(&mut self) -> Result<usize, SocketError> {
        if let Some(injector) = self.faults.as_mut() {
            self.fault_out.clear();
            injector.release_all(&mut self.fault_out);
            self.backlog.extend(self.fault_out.drain(..));
        }
        self.drain_backlog()?;
        Ok(self.backlog.len())
    }

    /// Sends from the fault backlog; true when it is empty afterwards.
    fn drain_backlog(&mut self) -> Result<bool, SocketError> {
        let mut backlog = std::mem::take(&mut self.backlog);
        let result = self.transmit(backlog.len(), |i| {
            backlog.get(i).map(|o| (o.dst, o.bytes.as_slice()))
        });
        if let Ok(n) = result {
            backlog.drain(..n.min(backlog.len()));
        }
        self.backlog = backlog;
        result.map(|_| self.backlog.is_empty())
    }

    /// Hands packets `0..count` (as `get` yields them) to the kernel in `sendmmsg` calls
    /// of up to 64; returns how many were dealt with (sent or refused one by one).
    fn transmit<'p>(
        &mut self,
        count: usize,
        get: impl Fn(usize) -> Option<(SocketAddr, &'p [u8])>,
    ) -> Result<usize, SocketError> {
        let placeholder = (self.local, &[][..]);
        let mut chunk = [placeholder; MAX_BATCH];
        let mut done = 0;
        let mut interrupts = 0;
        // Every pass either advances `done` by at least one, stops, or retries after a
        // signal at most MAX_EINTR_RETRIES times: at most count + 16 passes.
        while done < count {
            let mut n = 0;
            for slot in chunk.iter_mut().take(count - done) {
                match get(done + n) {
                    Some(item) => *slot = item,
                    // invariant: `get` yields every index below `count`; stop if not.
                    None => break,
                }
                n += 1;
            }
            if n == 0 {
                break;
            }
            let batch = chunk.get(..n).unwrap_or_default();
            match sys::send_batch(self.socket.as_fd(), batch) {
                Ok(0) => {
                    Counters::add(&self.counters.eagain, 1);
                    break;
                }
                Ok(sent) => {
                    let sent_packets = batch.get(..sent).unwrap_or_default();
                    let bytes: usize = sent_packets.iter().map(|(_, b)| b.len()).sum();
                    Counters::add(&self.counters.tx_packets, sent as u64);
                    Counters::add(&self.counters.tx_bytes, bytes as u64);
                    if let Some(capture) = self.capture.as_mut() {
                        for (dst, roce) in sent_packets {
                            if capture.record(self.local, *dst, roce).is_err() {
                                Counters::add(&self.counters.capture_errors, 1);
                            }
                        }
                    }
                    done += sent;
                }
                Err(e) => match classify_send_error(&e) {
                    SendFailure::WouldBlock => {
                        Counters::add(&self.counters.eagain, 1);
                        break;
                    }
                    SendFailure::Interrupted if interrupts < MAX_EINTR_RETRIES => {
                        interrupts += 1;
                    }
                    SendFailure::Packet => {
                        Counters::add(&self.counters.send_errors, 1);
                        done += 1;
                    }
                    SendFailure::Interrupted | SendFailure::Fatal => {
                        return Err(SocketError::Send {
                            local: self.local,
                            source: e,
                        })
                    }
                },
            }
        }
        Ok(done)
    }

    /// Receives up to `bufs.capacity()` datagrams with one `recvmmsg`, cuts every
    /// coalesced one into the packets it carries (see the module docs), and checks each
    /// packet: truncation, source address, ICRC ([`verify_icrc`] and the [`IcrcPolicy`]),
    /// then [`PacketRepr::parse`]. Returns how many packets were read (0: none waiting);
    /// [`RecvBatch::iter`] gives the accepted ones, [`RecvBatch::all`] every one. Every
    /// packet read is counted (`rx_packets`), every drop by its reason.
    ///
    /// Before receiving, `UDP_GRO` is switched on if it is wanted and supported and the
    /// batch's slots are at least [`RecvBatch::GRO_SLOT_LEN`] bytes; it is switched off
    /// otherwise, after a receive that found the queue drained (see the module docs).
    ///
    /// # Errors
    /// [`SocketError::Recv`] if `recvmmsg` fails other than for "nothing waiting".
    pub fn recv_batch(&mut self, bufs: &mut RecvBatch) -> Result<usize, SocketError> {
        self.recv_batch_with(bufs, |_| {})
    }

    /// [`RoceSocket::recv_batch`], handing each accepted packet to `deliver`, in arrival
    /// order, as soon as it is checked, with the [`PacketRepr`] the check parsed: the
    /// packet is parsed once, and nothing of the parse is stored (the device's receive
    /// path). [`RecvBatch::iter`] parses the accepted packets again; it is for callers
    /// that look at a batch later.
    ///
    /// # Errors
    /// As [`RoceSocket::recv_batch`].
    pub fn recv_batch_with<F>(
        &mut self,
        bufs: &mut RecvBatch,
        mut deliver: F,
    ) -> Result<usize, SocketError>
    where
        F: FnMut(Received<'_>),
    {
        bufs.filled = 0;
        bufs.datagrams = 0;
        bufs.probes = 0;
        let slot_len = bufs.slot_len;
        let want_gro = self.gro.usable() && slot_len >= RecvBatch::GRO_SLOT_LEN;
        if want_gro && !self.gro_on {
            match sys::set_gro(self.socket.as_fd(), true) {
                Ok(()) => self.gro_on = true,
                // The kernel does not support it after all.
                Err(_) => self.gro.refused = true,
            }
        }
        let mut interrupts = 0;
        // Bounded: returns, or retries after a signal at most MAX_EINTR_RETRIES times.
        let got = loop {
            match sys::recv_batch(
                self.socket.as_fd(),
                &mut bufs.storage,
                slot_len,
                &mut bufs.meta,
            ) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break 0,
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted && interrupts < MAX_EINTR_RETRIES =>
                {
                    interrupts += 1;
                }
                Err(source) => {
                    return Err(SocketError::Recv {
                        local: self.local,
                        source,
                    })
                }
            }
        };
        // Switched off only once the queue is drained (this receive did not fill the
        // batch): the kernel reports the segment size of a coalesced datagram only while
        // UDP_GRO is on, and those already queued can then still be split (their complete
        // packets kept).
        if !want_gro && self.gro_on && got < bufs.capacity() {
            // If it cannot be switched off, datagrams go on being coalesced and cut
            // short, and their complete packets kept.
            if sys::set_gro(self.socket.as_fd(), false).is_ok() {
                self.gro_on = false;
            }
        }
        let mut filled = 0;
        let mut bytes_in = 0;
        // Packets that took the fast path, counted once per batch.
        let mut exact = 0u64;
        for (datagram, meta) in bufs.meta.iter().enumerate().take(got) {
            let base = datagram * slot_len;
            let entries = bufs
                .packets
                .get_mut(filled..filled + bufs.per_datagram)
                .unwrap_or_default();
            let used = split_datagram(meta, base, entries);
            bytes_in += meta.len;
            for (index, entry) in entries.iter_mut().take(used).enumerate() {
                entry.datagram = datagram;
                // The k-th packet of a coalesced datagram is most likely the k-th segment
                // of its sender's GSO message, sealed for Identification k: checked first.
                let expected = u16::try_from(index)
                    .ok()
                    .filter(|&k| k < TRAIN_ID_SPAN)
                    .unwrap_or(0);
                let bytes = bufs
                    .storage
                    .get(entry.start..entry.start + entry.len)
                    .unwrap_or_default();
                let mut packet = None;
                let (status, ident) =
                    self.receive_one(meta.src, entry.status, bytes, expected, &mut packet);
                entry.status = status;
                entry.ident = ident;
                bufs.probes += usize::from(status == RecvStatus::Probe);
                if let (RecvStatus::Accepted(icrc), Some(packet), Some(src)) =
                    (status, packet, meta.src)
                {
                    deliver(Received {
                        src,
                        roce: bytes,
                        icrc,
                        ident,
                        packet,
                    });
                }
                exact += u64::from(
                    status == RecvStatus::Accepted(IcrcCheck::Ok)
                        && ident.is_none_or(|i| i == Ipv4Ident::UROCE),
                );
            }
            filled += used;
        }
        Counters::add(&self.counters.rx_packets, filled as u64);
        Counters::add(&self.counters.icrc_exact, exact);
        Counters::add(&self.counters.rx_bytes, bytes_in as u64);
        bufs.filled = filled;
        bufs.datagrams = got;
        Ok(filled)
    }

    /// Classifies, counts (drops and the slow ICRC paths; the caller counts packets,
    /// bytes and the fast path) and captures one received packet; `status` is
    /// `Truncated` for a piece that was cut short, anything else otherwise. Returns what
    /// became of it and the IPv4 header its ICRC was found valid for; an accepted
    /// packet's parse goes to `packet`. `expected`: the Identification checked first
    /// ([`check_icrc`]).
    fn receive_one<'b>(
        &mut self,
        src: Option<SocketAddr>,
        status: RecvStatus,
        bytes: &'b [u8],
        expected: u16,
        packet: &mut Option<PacketRepr<'b>>,
    ) -> (RecvStatus, Option<Ipv4Ident>) {
        let c = &*self.counters;
        let (status, ident) = if status == RecvStatus::Truncated {
            (status, None)
        } else {
            classify(
                self.policy,
                self.local,
                src,
                bytes,
                expected,
                &mut self.ids,
                packet,
            )
        };
        let counter = match (status, ident) {
            (RecvStatus::Accepted(IcrcCheck::Ok), None) => None,
            (RecvStatus::Accepted(IcrcCheck::Ok), Some(i)) if i == Ipv4Ident::UROCE => None,
            (RecvStatus::Accepted(IcrcCheck::Ok), Some(i)) if i.dont_fragment => {
                Some(&c.icrc_id_df)
            }
            (RecvStatus::Accepted(IcrcCheck::Ok), Some(_)) => Some(&c.icrc_id_no_df),
            (RecvStatus::Accepted(_), _) => Some(&c.unverified_icrc),
            (RecvStatus::Truncated, _) => Some(&c.truncated),
            (RecvStatus::BadSource, _) => Some(&c.bad_source),
            (RecvStatus::BadIcrc, _) => Some(&c.bad_icrc),
            (RecvStatus::Unverifiable, _) => Some(&c.icrc_unverifiable),
            (RecvStatus::ParseError, _) => Some(&c.parse_errors),
            (RecvStatus::Probe, _) => None,
        };
        if let Some(counter) = counter {
            Counters::add(counter, 1);
        }
        if let (Some(capture), Some(src), false) =
            (self.capture.as_mut(), src, status == RecvStatus::Truncated)
        {
            // Recorded with the header the sender sealed it for (a segment of a GSO
            // train, a Soft-RoCE peer's counter), so the capture shows it as it was on
            // the wire.
            let ident = ident.unwrap_or(Ipv4Ident::UROCE);
            if capture
                .record_with_ident(src, self.local, bytes, ident)
                .is_err()
            {
                Counters::add(&c.capture_errors, 1);
            }
        }
        (status, ident)
    }
}

impl AsFd for RoceSocket {
    /// The socket's descriptor, for `poll` / `epoll` (it is non-blocking).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

#[cfg(test)]
mod tests;
