//! [`RoceSocket`]: RoCEv2 packets on a Linux UDP socket, sent and received in batches.
//!
//! # The socket
//! One UDP socket bound to a specific address and (normally) port 4791, **unconnected**,
//! non-blocking, with `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4) or `IPV6_MTU_DISCOVER =
//! IPV6_PMTUDISC_DO` (IPv6), and socket buffers of [`SocketConfig::buffer_bytes`] asked
//! for (the kernel caps them at `net.core.rmem_max` / `wmem_max`; [`RoceSocket::buffer_sizes`]
//! says what it granted).
//!
//! # The ICRC contract (roce-spec.md §2.3)
//! The ICRC covers the IPv4 Identification, flags and total length, the addresses and the
//! UDP ports and length. A UDP socket does not choose these, the kernel does; for an
//! unconnected socket with `IP_PMTUDISC_DO` Linux sends every IPv4 datagram with
//! Identification 0 and DF set (and a connected socket would use a per-socket counter,
//! which is why these sockets are never connected). So the sender can compute the ICRC
//! for exactly the header its kernel will emit: [`seal_for`] does, from the socket's own
//! address and the destination. Fields the ICRC masks (TOS, TTL, header and UDP
//! checksums; IPv6 traffic class, flow label, hop limit) may be anything.
//!
//! A receiver sees no IP header, so [`verify_icrc`] reconstructs the one the sender's
//! kernel emitted *under the same convention* (ID 0, DF). What happens to a packet whose
//! ICRC fails under that assumption is the socket's [`IcrcPolicy`]:
//! * [`IcrcPolicy::Strict`] (default): dropped and counted (`bad_icrc`).
//! * [`IcrcPolicy::AcceptUnverified`]: an IPv4 packet is accepted anyway and counted
//!   (`unverified_icrc`), because a peer that sends non-zero IPv4 Identifications (Linux
//!   rxe does) produces ICRCs a UDP socket cannot check: the Identification it covered is
//!   not visible to the receiver. Such a packet is protected only by the UDP checksum.
//!   IPv6 has no such field (everything variable is masked), so an IPv6 packet with a bad
//!   ICRC is dropped under either policy.
//!
//! Because of `IP_PMTUDISC_DO` the kernel never fragments: a datagram larger than the path
//! MTU is refused (`EMSGSIZE`, counted in `send_errors`), so the transport's PMTU must fit
//! the interface MTU with the headers (Ethernet 1500 → RoCE PMTU 1024 at most).
//!
//! # Batches
//! [`RoceSocket::send_batch`] hands up to 64 datagrams to one `sendmmsg`;
//! [`RoceSocket::recv_batch`] reads up to 64 with one `recvmmsg` into the preallocated
//! slots of a [`RecvBatch`], checks each (truncation, source, ICRC, packet structure) and
//! exposes the accepted ones through [`RecvBatch::iter`]. Neither path allocates per
//! packet (fault injection, when enabled, copies packets).

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use uroce_wire::ip::{self, Endpoints, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use uroce_wire::{icrc, PacketRepr, WireError, ROCEV2_UDP_PORT};

use crate::capture::Capture;
use crate::counters::{CounterSnapshot, Counters};
use crate::faults::{FaultConfig, FaultInjector, Outgoing};
use crate::sys::{self, Readiness, RecvMeta, MAX_BATCH};
use crate::NetError;

/// The most datagrams one system call sends or receives.
pub const BATCH_MAX: usize = MAX_BATCH;
/// Socket buffer size asked for by default (4 MiB).
pub const DEFAULT_BUFFER_BYTES: usize = 4 << 20;
/// How often a batch call retries a system call interrupted by a signal.
const MAX_EINTR_RETRIES: u32 = 16;
/// Room for the largest IP + UDP header (IPv6).
const MAX_HEADERS_LEN: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN;

/// One packet to send: the destination and the UDP payload (BTH..ICRC, sealed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutPacket<'a> {
    /// Destination address and port (port 4791 for a RoCEv2 peer).
    pub dst: SocketAddr,
    /// BTH..pad followed by the ICRC, sealed for this socket and `dst` ([`seal_for`]).
    pub roce: &'a [u8],
}

/// What a receiver does with a packet whose ICRC does not match the header it
/// reconstructs (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IcrcPolicy {
    /// Drop it and count it (`bad_icrc`).
    #[default]
    Strict,
    /// Accept IPv4 packets anyway (counted as `unverified_icrc`); IPv6 packets are still
    /// dropped.
    AcceptUnverified,
}

/// The result of checking a received packet's ICRC under the uroce convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcrcCheck {
    /// The ICRC matches the header the sender's kernel emitted (IPv4: ID 0, DF).
    Ok,
    /// It does not: the packet was corrupted, or (IPv4 only) its sender's kernel used
    /// another Identification than 0 or no DF.
    Mismatch,
    /// No ICRC could be computed: the packet is shorter than a BTH and an ICRC, too long
    /// for a datagram, or the addresses are unusable (mixed families, unspecified,
    /// IPv4-mapped).
    Unverifiable,
}

/// How a [`RoceSocket`] is set up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SocketConfig {
    /// `SO_RCVBUF` and `SO_SNDBUF` to ask for, in bytes.
    pub buffer_bytes: usize,
    /// What to do with packets whose ICRC fails.
    pub icrc_policy: IcrcPolicy,
    /// Faults to inject into outgoing packets, if any.
    pub faults: Option<FaultConfig>,
}

impl Default for SocketConfig {
    fn default() -> SocketConfig {
        SocketConfig {
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            icrc_policy: IcrcPolicy::Strict,
            faults: None,
        }
    }
}

impl SocketConfig {
    /// This configuration with `faults` taken from `UROCE_FAULTS` (unchanged when the
    /// variable is unset or blank).
    ///
    /// # Errors
    /// [`NetError::Faults`] if the variable does not parse.
    pub fn with_env_faults(mut self) -> Result<SocketConfig, NetError> {
        if let Some(f) = FaultConfig::from_env()? {
            self.faults = Some(f);
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
fn check_addr(addr: IpAddr) -> Result<(), NetError> {
    if addr.is_unspecified() {
        return Err(NetError::UnusableAddress {
            addr,
            why: "unspecified: the kernel would choose the source address the ICRC covers",
        });
    }
    if let IpAddr::V6(v6) = addr {
        if v6.to_ipv4_mapped().is_some() {
            return Err(NetError::UnusableAddress {
                addr,
                why: "IPv4-mapped: the datagram would travel as IPv4; use the IPv4 address",
            });
        }
    }
    Ok(())
}

/// Builds the IP + UDP headers of a datagram `src` → `dst` carrying `roce_len` bytes,
/// as Linux emits them for a uroce socket; returns the IP header length.
fn kernel_headers(
    src: SocketAddr,
    dst: SocketAddr,
    roce_len: usize,
    out: &mut [u8; MAX_HEADERS_LEN],
) -> Result<usize, WireError> {
    let ep = Endpoints {
        src: src.ip(),
        dst: dst.ip(),
        src_port: src.port(),
        dst_port: dst.port(),
    };
    let (ip_len, _) = ip::roce_headers(&ep, roce_len, out)?;
    Ok(ip_len)
}

/// Seals the ICRC of `roce` (BTH..pad followed by 4 ICRC bytes, whose value is ignored)
/// for the datagram a uroce socket bound to `local` sends to `dst`: IPv4 with
/// Identification 0 and DF, or IPv6, with the real addresses and ports (roce-spec.md
/// §2.3). Returns the ICRC.
///
/// # Errors
/// [`NetError::UnusableAddress`] for an unspecified or IPv4-mapped address,
/// [`NetError::AddressFamily`] for mixed families, [`NetError::Seal`] if `roce` is
/// shorter than a BTH and an ICRC or too long for one datagram.
pub fn seal_for(local: SocketAddr, dst: SocketAddr, roce: &mut [u8]) -> Result<u32, NetError> {
    check_addr(local.ip())?;
    check_addr(dst.ip())?;
    if local.is_ipv4() != dst.is_ipv4() {
        return Err(NetError::AddressFamily { local, remote: dst });
    }
    let seal_err = |source| NetError::Seal {
        local,
        remote: dst,
        source,
    };
    let mut headers = [0u8; MAX_HEADERS_LEN];
    let ip_len = kernel_headers(local, dst, roce.len(), &mut headers).map_err(seal_err)?;
    let (ip_header, rest) = headers.split_at(ip_len);
    let udp_header = rest.get(..UDP_HEADER_LEN).unwrap_or_default();
    icrc::seal(ip_header, udp_header, roce).map_err(seal_err)
}

/// Checks the ICRC of `roce` (BTH..ICRC) received from `src` by a socket bound to
/// `local`, against the header the sender's kernel emitted under the uroce convention
/// (IPv4 Identification 0 and DF; see the module docs for what a mismatch can mean).
pub fn verify_icrc(src: SocketAddr, local: SocketAddr, roce: &[u8]) -> IcrcCheck {
    if check_addr(src.ip()).is_err()
        || check_addr(local.ip()).is_err()
        || src.is_ipv4() != local.is_ipv4()
    {
        return IcrcCheck::Unverifiable;
    }
    let mut headers = [0u8; MAX_HEADERS_LEN];
    let Ok(ip_len) = kernel_headers(src, local, roce.len(), &mut headers) else {
        return IcrcCheck::Unverifiable;
    };
    let (ip_header, rest) = headers.split_at(ip_len);
    let udp_header = rest.get(..UDP_HEADER_LEN).unwrap_or_default();
    match icrc::verify(ip_header, udp_header, roce) {
        Ok(()) => IcrcCheck::Ok,
        Err(WireError::IcrcMismatch { .. }) => IcrcCheck::Mismatch,
        Err(_) => IcrcCheck::Unverifiable,
    }
}

/// What became of one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecvStatus {
    /// Accepted: a well-formed RoCEv2 transport packet whose ICRC check gave this result
    /// ([`IcrcCheck::Ok`], or [`IcrcCheck::Mismatch`] for IPv4 under
    /// [`IcrcPolicy::AcceptUnverified`]).
    Accepted(IcrcCheck),
    /// Dropped: longer than its slot (`truncated`).
    Truncated,
    /// Dropped: the kernel reported no IPv4/IPv6 source address (`bad_source`).
    BadSource,
    /// Dropped: the ICRC does not match (`bad_icrc`).
    BadIcrc,
    /// Dropped: no ICRC could be computed, e.g. shorter than BTH + ICRC
    /// (`unverified_icrc`).
    Unverifiable,
    /// Dropped: the ICRC is fine but the packet is not a valid RoCEv2 transport packet
    /// (`parse_errors`).
    ParseError,
}

/// Preallocated buffers for [`RoceSocket::recv_batch`]: `slots` datagrams of up to
/// `slot_len` bytes each, and what happened to each.
#[derive(Debug)]
pub struct RecvBatch {
    storage: Vec<u8>,
    slot_len: usize,
    meta: Vec<RecvMeta>,
    status: Vec<RecvStatus>,
    filled: usize,
}

/// An accepted packet of a [`RecvBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received<'a> {
    /// Its source address and port.
    pub src: SocketAddr,
    /// The UDP payload: BTH..ICRC.
    pub roce: &'a [u8],
    /// The ICRC check result.
    pub icrc: IcrcCheck,
    /// The parsed transport packet.
    pub packet: PacketRepr<'a>,
}

/// Any datagram of a [`RecvBatch`], accepted or dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvDatagram<'a> {
    /// Its source, if the kernel reported an IP address.
    pub src: Option<SocketAddr>,
    /// The bytes received (for a truncated datagram: only the first `slot_len`).
    pub bytes: &'a [u8],
    /// What became of it.
    pub status: RecvStatus,
}

impl RecvBatch {
    /// Slot size of [`RecvBatch::default`]: room for any packet at PMTU 4096 with every
    /// header, with margin.
    pub const DEFAULT_SLOT_LEN: usize = 8192;
    /// The smallest useful slot: a BTH and an ICRC.
    pub const MIN_SLOT_LEN: usize = 16;

    /// Buffers for `slots` (1..=64) datagrams of up to `slot_len` (>= 16) bytes.
    ///
    /// # Errors
    /// [`NetError::BatchSize`] for sizes outside those bounds.
    pub fn new(slots: usize, slot_len: usize) -> Result<RecvBatch, NetError> {
        let bad = |why| NetError::BatchSize {
            slots,
            slot_len,
            why,
        };
        if slots == 0 || slots > BATCH_MAX {
            return Err(bad("slots must be 1..=64"));
        }
        if slot_len < Self::MIN_SLOT_LEN {
            return Err(bad("slot_len must be at least 16 (BTH + ICRC)"));
        }
        let total = slots
            .checked_mul(slot_len)
            .ok_or(bad("slots * slot_len overflows"))?;
        Ok(RecvBatch {
            storage: vec![0; total],
            slot_len,
            meta: vec![RecvMeta::default(); slots],
            status: vec![RecvStatus::Truncated; slots],
            filled: 0,
        })
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Datagrams the last [`RoceSocket::recv_batch`] read, accepted or not.
    pub fn len(&self) -> usize {
        self.filled
    }

    /// True when the last receive read nothing.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// The accepted packets of the last receive, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = Received<'_>> + '_ {
        self.all().filter_map(|d| match (d.status, d.src) {
            (RecvStatus::Accepted(icrc), Some(src)) => {
                // Accepted means it parsed; the filter only keeps this panic-free.
                PacketRepr::parse(d.bytes).ok().map(|packet| Received {
                    src,
                    roce: d.bytes,
                    icrc,
                    packet,
                })
            }
            _ => None,
        })
    }

    /// Every datagram of the last receive with what became of it, in arrival order.
    pub fn all(&self) -> impl Iterator<Item = RecvDatagram<'_>> + '_ {
        self.storage
            .chunks_exact(self.slot_len)
            .zip(&self.meta)
            .zip(&self.status)
            .take(self.filled)
            .map(|((slot, meta), &status)| RecvDatagram {
                src: meta.src,
                bytes: slot.get(..meta.len).unwrap_or(slot),
                status,
            })
    }
}

impl Default for RecvBatch {
    /// 64 slots of [`RecvBatch::DEFAULT_SLOT_LEN`] bytes.
    fn default() -> RecvBatch {
        RecvBatch {
            storage: vec![0; BATCH_MAX * Self::DEFAULT_SLOT_LEN],
            slot_len: Self::DEFAULT_SLOT_LEN,
            meta: vec![RecvMeta::default(); BATCH_MAX],
            status: vec![RecvStatus::Truncated; BATCH_MAX],
            filled: 0,
        }
    }
}

/// A RoCEv2 endpoint on a UDP socket (see the module docs).
#[derive(Debug)]
pub struct RoceSocket {
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
    pub fn bind(addr: IpAddr) -> Result<RoceSocket, NetError> {
        RoceSocket::bind_port(addr, ROCEV2_UDP_PORT)
    }

    /// A socket on `(addr, port)` with the default [`SocketConfig`] (port 0: the kernel
    /// picks one; useful for tests and for a sender that only talks to port 4791).
    ///
    /// # Errors
    /// As [`RoceSocket::bind_with`].
    pub fn bind_port(addr: IpAddr, port: u16) -> Result<RoceSocket, NetError> {
        RoceSocket::bind_with(SocketAddr::new(addr, port), SocketConfig::default())
    }

    /// A socket on `addr` set up as `config` says (see the module docs).
    ///
    /// # Errors
    /// [`NetError::UnusableAddress`] for an unspecified or IPv4-mapped address,
    /// [`NetError::Bind`] if the socket cannot be bound, [`NetError::SocketOption`] if an
    /// option cannot be set (including the path-MTU-discovery mode not reading back as
    /// set).
    pub fn bind_with(addr: SocketAddr, config: SocketConfig) -> Result<RoceSocket, NetError> {
        check_addr(addr.ip())?;
        let socket = UdpSocket::bind(addr).map_err(|source| NetError::Bind { addr, source })?;
        let local = socket
            .local_addr()
            .map_err(|source| NetError::Bind { addr, source })?;
        let opt_err = |option| {
            move |source| NetError::SocketOption {
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
        Ok(RoceSocket {
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
    pub fn set_faults(&mut self, faults: Option<FaultConfig>) -> Result<(), NetError> {
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

    /// [`seal_for`] from this socket's address.
    ///
    /// # Errors
    /// As [`seal_for`].
    pub fn seal(&self, dst: SocketAddr, roce: &mut [u8]) -> Result<u32, NetError> {
        seal_for(self.local, dst, roce)
    }

    /// Waits up to `timeout` (None: forever) until a datagram can be received.
    ///
    /// # Errors
    /// [`NetError::Poll`] if `poll` fails for another reason than a signal.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> Result<bool, NetError> {
        self.wait(Readiness::Readable, timeout)
    }

    /// Waits up to `timeout` (None: forever) until a datagram can be sent.
    ///
    /// # Errors
    /// [`NetError::Poll`] if `poll` fails for another reason than a signal.
    pub fn wait_writable(&self, timeout: Option<Duration>) -> Result<bool, NetError> {
        self.wait(Readiness::Writable, timeout)
    }

    fn wait(&self, what: Readiness, timeout: Option<Duration>) -> Result<bool, NetError> {
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
            Err(source) => Err(NetError::Poll {
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
    /// [`NetError::AddressFamily`] if a destination's family differs from the socket's
    /// (nothing is sent); [`NetError::Send`] for a socket-level failure (packets before
    /// it may have been sent).
    pub fn send_batch(&mut self, packets: &[OutPacket<'_>]) -> Result<usize, NetError> {
        for p in packets {
            if p.dst.is_ipv4() != self.local.is_ipv4() {
                return Err(NetError::AddressFamily {
                    local: self.local,
                    remote: p.dst,
                });
            }
        }
        // Packets the injector let out earlier go first (also after injection was
        // switched off).
        if !self.backlog.is_empty() && !self.drain_backlog()? {
            return Ok(0);
        }
        if self.faults.is_none() {
            return self.transmit(packets.len(), |i| packets.get(i).map(|p| (p.dst, p.roce)));
        }
        if let Some(injector) = self.faults.as_mut() {
            for p in packets {
                self.fault_out.clear();
                let fx = injector.process(p.dst, p.roce, &mut self.fault_out);
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
        }
        self.drain_backlog()?;
        Ok(packets.len())
    }

    /// Sends every packet the fault injector is holding back, and any packet it let out
    /// that the kernel has not taken yet. Returns how many are still waiting (the socket
    /// buffer filled up); 0 when all went out.
    ///
    /// # Errors
    /// [`NetError::Send`] for a socket-level failure.
    pub fn flush_held(&mut self) -> Result<usize, NetError> {
        if let Some(injector) = self.faults.as_mut() {
            self.fault_out.clear();
            injector.release_all(&mut self.fault_out);
            self.backlog.extend(self.fault_out.drain(..));
        }
        self.drain_backlog()?;
        Ok(self.backlog.len())
    }

    /// Sends from the fault backlog; true when it is empty afterwards.
    fn drain_backlog(&mut self) -> Result<bool, NetError> {
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
    ) -> Result<usize, NetError> {
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
                        return Err(NetError::Send {
                            local: self.local,
                            source: e,
                        })
                    }
                },
            }
        }
        Ok(done)
    }

    /// Receives up to `bufs.capacity()` datagrams with one `recvmmsg` and checks each:
    /// truncation, source address, ICRC ([`verify_icrc`] and the [`IcrcPolicy`]), then
    /// [`PacketRepr::parse`]. Returns how many datagrams were read (0: none waiting);
    /// [`RecvBatch::iter`] gives the accepted ones, [`RecvBatch::all`] every one.
    /// Every datagram read is counted (`rx_packets`), every drop by its reason.
    ///
    /// # Errors
    /// [`NetError::Recv`] if `recvmmsg` fails other than for "nothing waiting".
    pub fn recv_batch(&mut self, bufs: &mut RecvBatch) -> Result<usize, NetError> {
        bufs.filled = 0;
        let slot_len = bufs.slot_len;
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
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted && interrupts < MAX_EINTR_RETRIES =>
                {
                    interrupts += 1;
                }
                Err(source) => {
                    return Err(NetError::Recv {
                        local: self.local,
                        source,
                    })
                }
            }
        };
        let c = &*self.counters;
        for ((slot, meta), status) in bufs
            .storage
            .chunks_exact(slot_len)
            .zip(&bufs.meta)
            .zip(bufs.status.iter_mut())
            .take(got)
        {
            let bytes = slot.get(..meta.len).unwrap_or(slot);
            Counters::add(&c.rx_packets, 1);
            Counters::add(&c.rx_bytes, bytes.len() as u64);
            *status = self::classify(self.policy, self.local, meta, bytes);
            let counter = match *status {
                RecvStatus::Accepted(IcrcCheck::Ok) => None,
                RecvStatus::Accepted(_) => Some(&c.unverified_icrc),
                RecvStatus::Truncated => Some(&c.truncated),
                RecvStatus::BadSource => Some(&c.bad_source),
                RecvStatus::BadIcrc => Some(&c.bad_icrc),
                RecvStatus::Unverifiable => Some(&c.unverified_icrc),
                RecvStatus::ParseError => Some(&c.parse_errors),
            };
            if let Some(counter) = counter {
                Counters::add(counter, 1);
            }
            if let (Some(capture), Some(src), false) =
                (self.capture.as_mut(), meta.src, meta.truncated)
            {
                if capture.record(src, self.local, bytes).is_err() {
                    Counters::add(&c.capture_errors, 1);
                }
            }
        }
        bufs.filled = got;
        Ok(got)
    }
}

/// Decides what becomes of one received datagram.
fn classify(policy: IcrcPolicy, local: SocketAddr, meta: &RecvMeta, bytes: &[u8]) -> RecvStatus {
    if meta.truncated {
        return RecvStatus::Truncated;
    }
    let Some(src) = meta.src else {
        return RecvStatus::BadSource;
    };
    let check = verify_icrc(src, local, bytes);
    let accept = match check {
        IcrcCheck::Ok => true,
        IcrcCheck::Mismatch => policy == IcrcPolicy::AcceptUnverified && src.is_ipv4(),
        IcrcCheck::Unverifiable => return RecvStatus::Unverifiable,
    };
    if !accept {
        return RecvStatus::BadIcrc;
    }
    match PacketRepr::parse(bytes) {
        Ok(_) => RecvStatus::Accepted(check),
        Err(_) => RecvStatus::ParseError,
    }
}

impl AsFd for RoceSocket {
    /// The socket's descriptor, for `poll` / `epoll` (it is non-blocking).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}
