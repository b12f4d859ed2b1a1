//! [`RoceSocket`]: RoCEv2 packets on a Linux UDP socket, sent and received in batches.
//!
//! # The socket
//! One UDP socket bound to a specific address and (normally) port 4791, **unconnected**,
//! non-blocking, with `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4) or `IPV6_MTU_DISCOVER =
//! IPV6_PMTUDISC_DO` (IPv6), and socket buffers of [`SocketConfig::buffer_bytes`] asked
//! for (the kernel caps them at `net.core.rmem_max` / `wmem_max`; [`RoceSocket::buffer_sizes`]
//! says what it granted).
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
use crate::sys::{self, OutMessage, Readiness, RecvMeta, MAX_BATCH};
use crate::SocketError;

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

/// Which received packets a socket accepts by their ICRC (see the module docs and
/// `docs/ICRC.md`). Whatever the policy, a packet whose ICRC matches the header for
/// IPv4 Identification 0 with DF (or the IPv6 header) is accepted at the cost of one CRC
/// (counted in `icrc_exact`); the policies differ in what they do on a mismatch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IcrcPolicy {
    /// Only the uroce convention: an IPv4 ICRC must be valid for DF and an
    /// Identification below [`TRAIN_ID_SPAN`] (a GSO segment; `icrc_id_df`). Everything
    /// else is dropped (`bad_icrc`). `UROCE_ICRC=strict`.
    Strict,
    /// An IPv4 ICRC may be valid for any Identification, with DF set (`icrc_id_df`) or
    /// clear (`icrc_id_no_df`), as a Linux Soft-RoCE peer sends; anything else is dropped
    /// (`bad_icrc`). A corrupted packet passes with probability 2⁻¹⁵ instead of 2⁻³²
    /// (`docs/ICRC.md`). The default; `UROCE_ICRC=any-id`.
    #[default]
    AnyIdentification,
    /// As [`IcrcPolicy::AnyIdentification`], and an IPv4 packet whose ICRC is valid for
    /// no header is accepted anyway (`unverified_icrc`), protected only by the UDP
    /// checksum; IPv6 packets with a bad ICRC are still dropped.
    /// `UROCE_ICRC=unverified`.
    AcceptUnverified,
}

/// The environment variable [`IcrcPolicy::from_env`] reads.
pub const ICRC_ENV: &str = "UROCE_ICRC";

impl IcrcPolicy {
    /// Parses `strict`, `any-id` or `unverified` (surrounding blanks and case ignored).
    ///
    /// # Errors
    /// [`SocketError::BadIcrcPolicy`] for anything else.
    pub fn parse(value: &str) -> Result<IcrcPolicy, SocketError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "strict" => Ok(IcrcPolicy::Strict),
            "any-id" => Ok(IcrcPolicy::AnyIdentification),
            "unverified" => Ok(IcrcPolicy::AcceptUnverified),
            _ => Err(SocketError::BadIcrcPolicy {
                value: value.to_owned(),
            }),
        }
    }

    /// The policy in `UROCE_ICRC`: `None` when it is unset or blank.
    ///
    /// # Errors
    /// [`SocketError::BadIcrcPolicy`] if it is set to something else than the three names.
    pub fn from_env() -> Result<Option<IcrcPolicy>, SocketError> {
        match std::env::var(ICRC_ENV) {
            Ok(v) if !v.trim().is_empty() => IcrcPolicy::parse(&v).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(SocketError::BadIcrcPolicy {
                value: v.to_string_lossy().into_owned(),
            }),
        }
    }

    /// The name `UROCE_ICRC` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            IcrcPolicy::Strict => "strict",
            IcrcPolicy::AnyIdentification => "any-id",
            IcrcPolicy::AcceptUnverified => "unverified",
        }
    }

    /// Whether a packet whose ICRC is valid for `ident` (not the uroce header) is
    /// accepted.
    fn accepts(self, ident: Ipv4Ident) -> bool {
        match self {
            IcrcPolicy::Strict => ident.dont_fragment && ident.identification < TRAIN_ID_SPAN,
            IcrcPolicy::AnyIdentification | IcrcPolicy::AcceptUnverified => true,
        }
    }
}

/// The result of checking a received packet's ICRC against the headers an
/// [`IcrcPolicy`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcrcCheck {
    /// The ICRC matches an accepted header (IPv4: the Identification and DF flag are
    /// reported with it; IPv6: the one header).
    Ok,
    /// It does not: the packet was corrupted, or (IPv4 only) its sender's kernel used a
    /// header the policy does not accept.
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

/// Builds the IP + UDP headers of a datagram `src` → `dst` carrying `roce_len` bytes,
/// as Linux emits them for a uroce socket, with IPv4 Identification `id` (0 for a single
/// datagram, k for the k-th segment of a GSO message; ignored for IPv6); returns the IP
/// header length.
fn kernel_headers(
    src: SocketAddr,
    dst: SocketAddr,
    roce_len: usize,
    id: u16,
    out: &mut [u8; MAX_HEADERS_LEN],
) -> Result<usize, WireError> {
    let ep = Endpoints {
        src: src.ip(),
        dst: dst.ip(),
        src_port: src.port(),
        dst_port: dst.port(),
    };
    let fields = IpFields {
        identification: id,
        ..IpFields::LINUX_UDP_SOCKET
    };
    let (ip_len, _) = ip::roce_headers_with(&ep, &fields, roce_len, out)?;
    Ok(ip_len)
}

/// Seals `roce` for the datagram `local` → `dst` with IPv4 Identification `id`, after
/// the addresses were checked.
fn seal_checked(
    local: SocketAddr,
    dst: SocketAddr,
    roce: &mut [u8],
    id: u16,
) -> Result<u32, SocketError> {
    let seal_err = |source| SocketError::Seal {
        local,
        remote: dst,
        source,
    };
    let mut headers = [0u8; MAX_HEADERS_LEN];
    let ip_len = kernel_headers(local, dst, roce.len(), id, &mut headers).map_err(seal_err)?;
    let (ip_header, rest) = headers.split_at(ip_len);
    let udp_header = rest.get(..UDP_HEADER_LEN).unwrap_or_default();
    icrc::seal(ip_header, udp_header, roce).map_err(seal_err)
}

/// Refuses a pair of addresses for which no ICRC can be computed.
fn check_pair(local: SocketAddr, dst: SocketAddr) -> Result<(), SocketError> {
    check_addr(local.ip())?;
    check_addr(dst.ip())?;
    if local.is_ipv4() != dst.is_ipv4() {
        return Err(SocketError::AddressFamily { local, remote: dst });
    }
    Ok(())
}

/// Seals the ICRC of `roce` (BTH..pad followed by 4 ICRC bytes, whose value is ignored)
/// for the datagram a uroce socket bound to `local` sends to `dst`: IPv4 with
/// Identification 0 and DF, or IPv6, with the real addresses and ports (IBA Annex A17,
/// RoCEv2; `docs/ICRC.md`). Returns the ICRC.
///
/// # Errors
/// [`SocketError::UnusableAddress`] for an unspecified or IPv4-mapped address,
/// [`SocketError::AddressFamily`] for mixed families, [`SocketError::Seal`] if `roce` is
/// shorter than a BTH and an ICRC or too long for one datagram.
pub fn seal_for(local: SocketAddr, dst: SocketAddr, roce: &mut [u8]) -> Result<u32, SocketError> {
    check_pair(local, dst)?;
    seal_checked(local, dst, roce, 0)
}

/// Checks the ICRC of `roce` (BTH..ICRC) received from `src` by a socket bound to
/// `local`, against the headers the uroce convention allows ([`IcrcPolicy::Strict`]: DF
/// and an IPv4 Identification below [`TRAIN_ID_SPAN`]).
pub fn verify_icrc(src: SocketAddr, local: SocketAddr, roce: &[u8]) -> IcrcCheck {
    verify_icrc_with(IcrcPolicy::Strict, src, local, roce).0
}

/// Checks the ICRC of `roce` (BTH..ICRC) received from `src` by a socket bound to
/// `local` as a socket with `policy` does: [`IcrcCheck::Ok`] when it is valid for a
/// header the policy accepts (for [`IcrcPolicy::AcceptUnverified`], the headers of
/// [`IcrcPolicy::AnyIdentification`]), with that header's IPv4 Identification and DF
/// flag (`None` for IPv6).
pub fn verify_icrc_with(
    policy: IcrcPolicy,
    src: SocketAddr,
    local: SocketAddr,
    roce: &[u8],
) -> (IcrcCheck, Option<Ipv4Ident>) {
    let (check, ident) = check_icrc(src, local, roce, &mut IdentSolver::new());
    match (check, ident) {
        (IcrcCheck::Ok, Some(found)) if found != Ipv4Ident::UROCE && !policy.accepts(found) => {
            (IcrcCheck::Mismatch, None)
        }
        other => other,
    }
}

/// For a packet whose ICRC verifies ([`verify_icrc`] gives [`IcrcCheck::Ok`]), the IPv4
/// Identification of the header it was sealed for: 0 for a single datagram, k for the
/// k-th segment of a GSO message. `None` for IPv6 and for a packet that does not verify.
pub fn verified_identification(src: SocketAddr, local: SocketAddr, roce: &[u8]) -> Option<u16> {
    match verify_icrc_with(IcrcPolicy::Strict, src, local, roce) {
        (IcrcCheck::Ok, Some(ident)) => Some(ident.identification),
        _ => None,
    }
}

/// Checks the ICRC of `roce` against every header: the fast path for Identification 0
/// with DF (one CRC), then, for IPv4, the header found by elimination
/// (`uroce_wire::icrc_ident`). Returns [`IcrcCheck::Ok`] with the IPv4 header found
/// (`None` for IPv6), whatever it is: the caller applies the policy.
fn check_icrc(
    src: SocketAddr,
    local: SocketAddr,
    roce: &[u8],
    solver: &mut IdentSolver,
) -> (IcrcCheck, Option<Ipv4Ident>) {
    if check_pair(src, local).is_err() || roce.len() < MIN_PACKET_LEN {
        return (IcrcCheck::Unverifiable, None);
    }
    let mut headers = [0u8; MAX_HEADERS_LEN];
    let Ok(ip_len) = kernel_headers(src, local, roce.len(), 0, &mut headers) else {
        return (IcrcCheck::Unverifiable, None);
    };
    let (ip_header, rest) = headers.split_at(ip_len);
    let udp_header = rest.get(..UDP_HEADER_LEN).unwrap_or_default();
    let Some((body, trailer)) = roce.split_at_checked(roce.len() - ICRC_LEN) else {
        return (IcrcCheck::Unverifiable, None);
    };
    let (Ok(computed), Ok(on_wire)) = (
        icrc::compute(ip_header, udp_header, body),
        <[u8; ICRC_LEN]>::try_from(trailer),
    ) else {
        return (IcrcCheck::Unverifiable, None);
    };
    let on_wire = u32::from_le_bytes(on_wire);
    let v4 = src.is_ipv4();
    if computed == on_wire {
        return (IcrcCheck::Ok, v4.then_some(Ipv4Ident::UROCE));
    }
    if v4 {
        if let Some(ident) = solver.solve(roce.len(), computed ^ on_wire) {
            return (IcrcCheck::Ok, Some(ident));
        }
    }
    (IcrcCheck::Mismatch, None)
}

/// What became of one received packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecvStatus {
    /// Accepted: a well-formed RoCEv2 transport packet whose ICRC check gave this result
    /// ([`IcrcCheck::Ok`], or [`IcrcCheck::Mismatch`] for IPv4 under
    /// [`IcrcPolicy::AcceptUnverified`]).
    Accepted(IcrcCheck),
    /// Dropped: longer than its slot (`truncated`); for a coalesced datagram cut short,
    /// the part after its last complete packet.
    Truncated,
    /// Dropped: the kernel reported no IPv4/IPv6 source address (`bad_source`).
    BadSource,
    /// Dropped: the ICRC does not match (`bad_icrc`).
    BadIcrc,
    /// Dropped: no ICRC could be computed, e.g. shorter than BTH + ICRC
    /// (`icrc_unverifiable`).
    Unverifiable,
    /// Dropped: the ICRC is fine but the packet is not a valid RoCEv2 transport packet
    /// (`parse_errors`).
    ParseError,
}

/// One packet of a [`RecvBatch`]: where its bytes are and what became of it.
#[derive(Debug, Clone, Copy)]
struct PacketSlot {
    /// The datagram (receive slot) it came in.
    datagram: usize,
    /// Its first byte in the batch's storage.
    start: usize,
    /// Its length.
    len: usize,
    /// What became of it.
    status: RecvStatus,
    /// The IPv4 header its ICRC was found valid for (accepted IPv4 packets).
    ident: Option<Ipv4Ident>,
}

impl PacketSlot {
    const EMPTY: PacketSlot = PacketSlot {
        datagram: 0,
        start: 0,
        len: 0,
        status: RecvStatus::Truncated,
        ident: None,
    };
}

/// Preallocated buffers for [`RoceSocket::recv_batch`]: `slots` datagrams of up to
/// `slot_len` bytes each, and what happened to each packet in them (a datagram the kernel
/// coalesced carries several; see the module docs).
#[derive(Debug)]
pub struct RecvBatch {
    storage: Vec<u8>,
    slot_len: usize,
    meta: Vec<RecvMeta>,
    /// Room for every packet the slots can carry, preallocated; the first `filled` are
    /// the last receive's.
    packets: Vec<PacketSlot>,
    /// Entries of `packets` one datagram may use.
    per_datagram: usize,
    /// Packets of the last receive.
    filled: usize,
    /// Datagrams of the last receive.
    datagrams: usize,
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
    /// IPv4: the Identification and DF flag of the header the ICRC is valid for
    /// ([`Ipv4Ident::UROCE`] for a uroce peer's single datagram; `None` for IPv6 and for
    /// a packet accepted unverified). With the addresses and the length this is the
    /// sender's IPv4 header, e.g. for the GRH area of a UD receive.
    pub ident: Option<Ipv4Ident>,
    /// The parsed transport packet.
    pub packet: PacketRepr<'a>,
}

/// Any packet of a [`RecvBatch`], accepted or dropped: one datagram as its sender's
/// kernel emitted it (a coalesced datagram is split into the packets it carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvDatagram<'a> {
    /// Its source, if the kernel reported an IP address.
    pub src: Option<SocketAddr>,
    /// The bytes received (for a truncated datagram: only what fitted its slot).
    pub bytes: &'a [u8],
    /// What became of it.
    pub status: RecvStatus,
    /// As [`Received::ident`] (accepted IPv4 packets only).
    pub ident: Option<Ipv4Ident>,
}

impl RecvBatch {
    /// Slot size of [`RecvBatch::default`]: [`RecvBatch::GRO_SLOT_LEN`], so that the
    /// socket can let the kernel coalesce datagrams.
    pub const DEFAULT_SLOT_LEN: usize = Self::GRO_SLOT_LEN;
    /// Slots of [`RecvBatch::default`].
    pub const DEFAULT_SLOTS: usize = 32;
    /// The slot size from which a socket receiving into the batch turns `UDP_GRO` on:
    /// room for the largest UDP payload (65 527 bytes) and so for any coalesced datagram.
    pub const GRO_SLOT_LEN: usize = 64 << 10;
    /// The smallest useful slot: a BTH and an ICRC.
    pub const MIN_SLOT_LEN: usize = MIN_PACKET_LEN;

    /// Buffers for `slots` (1..=64) datagrams of up to `slot_len` (>= 16) bytes. With
    /// `slot_len` below [`RecvBatch::GRO_SLOT_LEN`] a socket receiving into it does not
    /// let the kernel coalesce datagrams.
    ///
    /// # Errors
    /// [`SocketError::BatchSize`] for sizes outside those bounds.
    pub fn new(slots: usize, slot_len: usize) -> Result<RecvBatch, SocketError> {
        let bad = |why| SocketError::BatchSize {
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
        // A coalesced datagram of a slot carries at most slot_len / 16 packets (and the
        // kernel puts no more than MAX_SEGMENTS_PER_DATAGRAM in one); one more entry
        // stands for a cut-off rest.
        let per_datagram = (slot_len / Self::MIN_SLOT_LEN).min(MAX_SEGMENTS_PER_DATAGRAM) + 1;
        Ok(RecvBatch {
            storage: vec![0; total],
            slot_len,
            meta: vec![RecvMeta::default(); slots],
            packets: vec![PacketSlot::EMPTY; slots * per_datagram],
            per_datagram,
            filled: 0,
            datagrams: 0,
        })
    }

    /// Number of slots: the most datagrams one receive reads.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Packets the last [`RoceSocket::recv_batch`] read, accepted or not (a coalesced
    /// datagram counts as the packets it carries).
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Datagrams the last [`RoceSocket::recv_batch`] took from the socket, a coalesced
    /// one counting once: compare with [`RecvBatch::capacity`] to tell whether more may
    /// be waiting.
    pub fn datagrams(&self) -> usize {
        self.datagrams
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
                    ident: d.ident,
                    packet,
                })
            }
            _ => None,
        })
    }

    /// Every packet of the last receive with what became of it, in arrival order.
    pub fn all(&self) -> impl Iterator<Item = RecvDatagram<'_>> + '_ {
        self.packets.iter().take(self.filled).map(|p| RecvDatagram {
            src: self.meta.get(p.datagram).and_then(|m| m.src),
            bytes: self
                .storage
                .get(p.start..p.start.saturating_add(p.len))
                .unwrap_or_default(),
            status: p.status,
            ident: p.ident,
        })
    }
}

impl Default for RecvBatch {
    /// [`RecvBatch::DEFAULT_SLOTS`] slots of [`RecvBatch::DEFAULT_SLOT_LEN`] bytes (2 MiB).
    fn default() -> RecvBatch {
        match RecvBatch::new(Self::DEFAULT_SLOTS, Self::DEFAULT_SLOT_LEN) {
            Ok(batch) => batch,
            // invariant: the defaults are within the bounds `new` checks.
            Err(_) => RecvBatch {
                storage: Vec::new(),
                slot_len: Self::DEFAULT_SLOT_LEN,
                meta: Vec::new(),
                packets: Vec::new(),
                per_datagram: 1,
                filled: 0,
                datagrams: 0,
            },
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
            for entry in entries.iter_mut().take(used) {
                entry.datagram = datagram;
                let bytes = bufs
                    .storage
                    .get(entry.start..entry.start + entry.len)
                    .unwrap_or_default();
                let mut packet = None;
                let (status, ident) = self.receive_one(meta.src, entry.status, bytes, &mut packet);
                entry.status = status;
                entry.ident = ident;
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
    /// packet's parse goes to `packet`.
    fn receive_one<'b>(
        &mut self,
        src: Option<SocketAddr>,
        status: RecvStatus,
        bytes: &'b [u8],
        packet: &mut Option<PacketRepr<'b>>,
    ) -> (RecvStatus, Option<Ipv4Ident>) {
        let c = &*self.counters;
        let (status, ident) = if status == RecvStatus::Truncated {
            (status, None)
        } else {
            classify(self.policy, self.local, src, bytes, &mut self.ids, packet)
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

/// How a received datagram of `len` bytes is cut into packets when it may hold at most
/// `room` of them: `(offset, length, complete)` of each piece, as the receive path lays
/// them out (`segment`: the GRO segment size the kernel reported; `truncated`: the datagram
/// was longer than its buffer). For the fuzz targets and tests of the splitting.
pub fn gro_pieces(
    len: usize,
    segment: Option<usize>,
    truncated: bool,
    room: usize,
) -> Vec<(usize, usize, bool)> {
    let meta = RecvMeta {
        len,
        truncated,
        src: None,
        segment,
    };
    let blank = PacketSlot {
        datagram: 0,
        start: 0,
        len: 0,
        status: RecvStatus::BadSource,
        ident: None,
    };
    let mut entries = vec![blank; room];
    let used = split_datagram(&meta, 0, &mut entries);
    entries
        .iter()
        .take(used)
        .map(|e| (e.start, e.len, e.status != RecvStatus::Truncated))
        .collect()
}

/// Lays out the packets of one received datagram (its slot starts at `base` in the
/// batch's storage) in `entries`: one for an ordinary datagram, one per segment for a
/// coalesced one (the segment size from the kernel; the last may be shorter), and one
/// `Truncated` entry for what follows the last complete segment of a datagram cut short
/// or beyond the entries available. Returns how many entries it used; their `status` is
/// `Truncated` for cut pieces and `BadSource` (a placeholder, to be classified) otherwise.
fn split_datagram(meta: &RecvMeta, base: usize, entries: &mut [PacketSlot]) -> usize {
    let pending = RecvStatus::BadSource;
    let segment = match meta.segment {
        Some(seg) if seg > 0 && seg < meta.len => seg,
        _ => {
            let Some(only) = entries.first_mut() else {
                return 0;
            };
            *only = PacketSlot {
                datagram: 0,
                start: base,
                len: meta.len,
                status: if meta.truncated {
                    RecvStatus::Truncated
                } else {
                    pending
                },
                ident: None,
            };
            return 1;
        }
    };
    // Keep one entry for a cut-off rest.
    let room = entries.len().saturating_sub(1);
    let mut used = 0;
    let mut offset = 0;
    // At most `room` passes: each fills one entry.
    while offset < meta.len && used < room {
        let len = segment.min(meta.len - offset);
        if len < segment && meta.truncated {
            // A piece of a cut datagram: the rest of this segment is lost.
            break;
        }
        if let Some(e) = entries.get_mut(used) {
            *e = PacketSlot {
                datagram: 0,
                start: base + offset,
                len,
                status: pending,
                ident: None,
            };
        }
        used += 1;
        offset += len;
    }
    if offset < meta.len || meta.truncated {
        if let Some(e) = entries.get_mut(used) {
            *e = PacketSlot {
                datagram: 0,
                start: base + offset,
                len: meta.len - offset,
                status: RecvStatus::Truncated,
                ident: None,
            };
            used += 1;
        }
    }
    used
}

/// Decides what becomes of one received packet; also returns the IPv4 header its ICRC
/// is valid for, when it was accepted for one. An accepted packet's parse (its structure
/// check) is written to `packet`.
fn classify<'b>(
    policy: IcrcPolicy,
    local: SocketAddr,
    src: Option<SocketAddr>,
    bytes: &'b [u8],
    ids: &mut IdentSolver,
    packet: &mut Option<PacketRepr<'b>>,
) -> (RecvStatus, Option<Ipv4Ident>) {
    let Some(src) = src else {
        return (RecvStatus::BadSource, None);
    };
    let (check, ident) = match check_icrc(src, local, bytes, ids) {
        (IcrcCheck::Ok, Some(found)) if found != Ipv4Ident::UROCE && !policy.accepts(found) => {
            (IcrcCheck::Mismatch, None)
        }
        other => other,
    };
    let accept = match check {
        IcrcCheck::Ok => true,
        IcrcCheck::Mismatch => policy == IcrcPolicy::AcceptUnverified && src.is_ipv4(),
        IcrcCheck::Unverifiable => return (RecvStatus::Unverifiable, None),
    };
    if !accept {
        return (RecvStatus::BadIcrc, None);
    }
    match PacketRepr::parse(bytes) {
        Ok(p) => {
            *packet = Some(p);
            (RecvStatus::Accepted(check), ident)
        }
        Err(_) => (RecvStatus::ParseError, ident),
    }
}

impl AsFd for RoceSocket {
    /// The socket's descriptor, for `poll` / `epoll` (it is non-blocking).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uroce_wire::opcode::op;
    use uroce_wire::{bth, reth, Psn};

    /// `recv_batch_with` hands over every accepted packet once, in arrival order, with
    /// the parse its check made: the same packets, sources and reprs as `RecvBatch::iter`
    /// (which parses again), and what does not pass the check is not handed over.
    #[test]
    fn packets_are_handed_over_with_their_one_parse() {
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        let mut tx = RoceSocket::bind_port(ip, 0).expect("bind");
        let mut rx = RoceSocket::bind_port(ip, 0).expect("bind");
        let dst = rx.local_addr();
        let bth = |opcode, psn| bth::Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: 0x12,
            ack_req: true,
            psn: Psn::new(psn),
        };
        let payload: Vec<u8> = (0..13u8).collect();
        let reprs = [
            PacketRepr::new(bth(op::RC_SEND_ONLY, 1), &payload[..]),
            PacketRepr {
                reth: Some(reth::Repr {
                    va: 0x1000,
                    rkey: 0x99,
                    dma_len: 12,
                }),
                ..PacketRepr::new(bth(op::RC_RDMA_WRITE_ONLY, 2), &payload[..12])
            },
            PacketRepr::new(bth(op::RC_SEND_ONLY, 3), &[]),
        ];
        let mut bufs: Vec<Vec<u8>> = reprs
            .iter()
            .map(|p| {
                let mut b = vec![0u8; p.buffer_len()];
                p.emit(&mut b).expect("emit");
                tx.seal(dst, &mut b).expect("seal");
                b
            })
            .collect();
        // A corrupted ICRC: dropped by the check, never handed over.
        let mut bad = bufs[0].clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        bufs.insert(1, bad);
        let out: Vec<OutPacket<'_>> = bufs.iter().map(|b| OutPacket { dst, roce: b }).collect();
        assert_eq!(tx.send_batch(&out).expect("send"), out.len());
        let mut batch = RecvBatch::new(8, 2048).expect("batch");
        let mut handed = Vec::new();
        let mut seen = Vec::new();
        let mut read = 0;
        // Bounded: 100 waits of at most 100 ms.
        for _ in 0..100 {
            if read == bufs.len() {
                break;
            }
            let _ = rx.wait_readable(Some(Duration::from_millis(100)));
            let n = rx
                .recv_batch_with(&mut batch, |r| {
                    assert_eq!(PacketRepr::parse(r.roce), Ok(r.packet));
                    handed.push((r.src, r.packet.bth.psn.value(), r.packet.payload.to_vec()));
                })
                .expect("recv");
            read += n;
            seen.extend(
                batch
                    .iter()
                    .map(|r| (r.src, r.packet.bth.psn.value(), r.packet.payload.to_vec())),
            );
        }
        assert_eq!(read, bufs.len());
        assert_eq!(handed, seen);
        let src = tx.local_addr();
        assert_eq!(
            handed,
            vec![
                (src, 1, payload.clone()),
                (src, 2, payload[..12].to_vec()),
                (src, 3, Vec::new()),
            ]
        );
        assert_eq!(rx.counters().bad_icrc, 1);
    }
}
