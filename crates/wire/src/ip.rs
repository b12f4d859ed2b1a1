//! What a RoCEv2 packet travels in: Ethernet, IPv4 or IPv6, and UDP (IBA Vol 1 Annex A17).
//!
//! Two directions:
//! * **Building** ([`roce_headers`], [`build_datagram`]): the IP and UDP headers a sender's
//!   datagram will carry, needed because the ICRC covers most of them ([`crate::icrc`]).
//! * **Parsing** ([`Datagram::parse_ip`], [`Datagram::parse_ethernet`]): splits a captured
//!   frame or IP packet into the exact IP header, UDP header and UDP payload, with a typed
//!   [`WireError`] for anything a RoCEv2 datagram cannot be.
//!
//! # Which IP header a sender gets
//! The defaults ([`IpFields::LINUX_UDP_SOCKET`]) are what Linux emits for an
//! **unconnected UDP socket with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`** and no IP options
//! (docs/INTEROP-NOTES.md §1, verified on a loopback capture): IPv4 Identification 0, DF set,
//! TTL 64, TOS 0, a correct header checksum; IPv6 traffic class 0, flow label 0, hop
//! limit 64. With any other socket setup the kernel picks a changing IPv4
//! Identification, which the ICRC covers, so a userspace sender could not predict it.
//! The other fields can be changed with [`roce_headers_with`] (e.g. to model an rxe peer,
//! which sends TTL and TOS from its address vector and non-zero Identifications).
//!
//! The UDP checksum is written as 0 in both families, as rxe sends it. A kernel UDP
//! socket fills in its own checksum instead, but the ICRC masks that field, so the ICRC
//! is the same either way. (Dissectors flag a zero UDP checksum over IPv6, which RFC 8200
//! allows only for tunnels; RoCEv2 senders use it anyway.)
//!
//! Everything here is hand-written over byte slices: IPv4 without options, IPv6 without
//! extension headers, UDP, Ethernet II with up to two VLAN tags. Nothing panics on input.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{HeaderKind, WireError};
use crate::{icrc, ICRC_LEN, ROCEV2_UDP_PORT};

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Length of an Ethernet II header without VLAN tags.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Length of one 802.1Q / 802.1ad VLAN tag.
pub const VLAN_TAG_LEN: usize = 4;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// EtherType of an 802.1ad (QinQ) service tag.
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
/// IP protocol number of UDP.
pub const IP_PROTO_UDP: u8 = 17;

/// The addresses and ports of one RoCEv2 datagram; both addresses must be of the same
/// family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoints {
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// UDP source port (rxe uses one fixed port per QP in `0xC000..=0xFFFF`).
    pub src_port: u16,
    /// UDP destination port ([`ROCEV2_UDP_PORT`] for RoCEv2).
    pub dst_port: u16,
}

impl Endpoints {
    /// Endpoints with the RoCEv2 destination port 4791.
    pub const fn roce(src: IpAddr, dst: IpAddr, src_port: u16) -> Endpoints {
        Endpoints {
            src,
            dst,
            src_port,
            dst_port: ROCEV2_UDP_PORT,
        }
    }

    /// The same flow in the other direction.
    #[must_use]
    pub const fn reversed(&self) -> Endpoints {
        Endpoints {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }

    /// Length of the IP + UDP headers for these endpoints (28 or 48).
    ///
    /// # Errors
    /// [`WireError::InvalidField`] if the two addresses are of different families.
    pub fn headers_len(&self) -> Result<usize, WireError> {
        match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => Ok(IPV4_HEADER_LEN + UDP_HEADER_LEN),
            (IpAddr::V6(_), IpAddr::V6(_)) => Ok(IPV6_HEADER_LEN + UDP_HEADER_LEN),
            (IpAddr::V4(_), IpAddr::V6(_)) => Err(mixed_families(6)),
            (IpAddr::V6(_), IpAddr::V4(_)) => Err(mixed_families(4)),
        }
    }
}

impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} > {}",
            core::net::SocketAddr::new(self.src, self.src_port),
            core::net::SocketAddr::new(self.dst, self.dst_port)
        )
    }
}

/// The IP header fields that are not addresses or lengths. Only the IPv4 Identification
/// and DF flag are covered by the ICRC; the others are masked (IBA Vol 1 Annex A17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpFields {
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv4 TOS byte (DSCP + ECN) / IPv6 traffic class.
    pub traffic_class: u8,
    /// IPv4 Identification (ignored for IPv6).
    pub identification: u16,
    /// IPv4 Don't-Fragment flag (ignored for IPv6).
    pub dont_fragment: bool,
    /// IPv6 flow label, low 20 bits used (ignored for IPv4).
    pub flow_label: u32,
}

impl IpFields {
    /// What Linux emits for an unconnected UDP socket with `IP_PMTUDISC_DO`: ID 0, DF,
    /// TTL / hop limit 64, TOS / traffic class 0, flow label 0 (docs/INTEROP-NOTES.md §1).
    pub const LINUX_UDP_SOCKET: IpFields = IpFields {
        hop_limit: 64,
        traffic_class: 0,
        identification: 0,
        dont_fragment: true,
        flow_label: 0,
    };
}

impl Default for IpFields {
    fn default() -> IpFields {
        IpFields::LINUX_UDP_SOCKET
    }
}

/// Writes the IPv4 or IPv6 header and the UDP header of a RoCEv2 datagram whose UDP
/// payload (BTH..ICRC) is `roce_len` bytes into the front of `out`, with the fields of
/// [`IpFields::LINUX_UDP_SOCKET`]. Returns `(ip header length, udp header length)`.
///
/// # Errors
/// [`WireError::BufferTooSmall`] if `out` is shorter than the headers,
/// [`WireError::BadLength`] if the datagram would exceed 65535 bytes,
/// [`WireError::InvalidField`] for mixed address families.
pub fn roce_headers(
    ep: &Endpoints,
    roce_len: usize,
    out: &mut [u8],
) -> Result<(usize, usize), WireError> {
    roce_headers_with(ep, &IpFields::LINUX_UDP_SOCKET, roce_len, out)
}

/// [`roce_headers`] with explicit TTL / traffic class / Identification / DF / flow label.
///
/// # Errors
/// As [`roce_headers`].
pub fn roce_headers_with(
    ep: &Endpoints,
    fields: &IpFields,
    roce_len: usize,
    out: &mut [u8],
) -> Result<(usize, usize), WireError> {
    let headers_len = ep.headers_len()?;
    let available = out.len();
    let (ip, rest) = match out.split_at_mut_checked(headers_len - UDP_HEADER_LEN) {
        Some(parts) => parts,
        None => {
            return Err(WireError::BufferTooSmall {
                needed: headers_len,
                available,
            })
        }
    };
    let udp: &mut [u8; UDP_HEADER_LEN] = match rest.get_mut(..UDP_HEADER_LEN) {
        Some(udp) => udp.try_into().map_err(|_| WireError::BufferTooSmall {
            needed: headers_len,
            available,
        })?,
        None => {
            return Err(WireError::BufferTooSmall {
                needed: headers_len,
                available,
            })
        }
    };
    let udp_len = UDP_HEADER_LEN + roce_len;
    let udp_len16 = length_field(HeaderKind::Udp, "length", udp_len, usize::from(u16::MAX))?;

    match (ep.src, ep.dst, ip) {
        (IpAddr::V4(src), IpAddr::V4(dst), ip) => {
            let total = length_field(
                HeaderKind::Ipv4,
                "total length",
                IPV4_HEADER_LEN + udp_len,
                usize::from(u16::MAX),
            )?;
            write_ipv4(ip, fields, total, src, dst);
        }
        (IpAddr::V6(src), IpAddr::V6(dst), ip) => {
            write_ipv6(ip, fields, udp_len16, src, dst);
        }
        // Mixed families were rejected by `headers_len`.
        (_, dst, _) => return Err(mixed_families(if dst.is_ipv4() { 4 } else { 6 })),
    }

    udp[0..2].copy_from_slice(&ep.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&ep.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len16.to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]); // RoCEv2 sends UDP checksum 0.
    Ok((headers_len - UDP_HEADER_LEN, UDP_HEADER_LEN))
}

/// Builds a complete, sealed RoCEv2 IP datagram in `out`: IP + UDP headers for `ep` and
/// `fields`, then `roce` (BTH..pad followed by 4 ICRC bytes, whose value is ignored), with
/// the ICRC computed for those headers written into the last four bytes. Returns the
/// datagram length and the ICRC.
///
/// # Errors
/// As [`roce_headers_with`] and [`icrc::seal`].
pub fn build_datagram(
    ep: &Endpoints,
    fields: &IpFields,
    roce: &[u8],
    out: &mut [u8],
) -> Result<(usize, u32), WireError> {
    let headers_len = ep.headers_len()?;
    let total = headers_len + roce.len();
    let available = out.len();
    let datagram = out.get_mut(..total).ok_or(WireError::BufferTooSmall {
        needed: total,
        available,
    })?;
    let (headers, body) = datagram.split_at_mut(headers_len);
    roce_headers_with(ep, fields, roce.len(), headers)?;
    body.copy_from_slice(roce);
    let (ip, udp) = headers.split_at(headers_len - UDP_HEADER_LEN);
    let crc = icrc::seal(ip, udp, body)?;
    Ok((total, crc))
}

/// Recomputes and writes the ICRC of a complete IP datagram (IP header, UDP header,
/// BTH..pad, 4 ICRC bytes) in place. Returns the ICRC.
///
/// # Errors
/// As [`Datagram::parse_ip`] and [`icrc::seal`].
pub fn seal_datagram(datagram: &mut [u8]) -> Result<u32, WireError> {
    let (ip_len, payload_start, payload_end) = {
        let d = Datagram::parse_ip(datagram)?;
        let start = d.ip_header.len() + d.udp_header.len();
        (d.ip_header.len(), start, start + d.payload.len())
    };
    // invariant: the parsed parts are sub-slices of `datagram`, so `payload_end` is
    // within it; the error only keeps this panic-free.
    let available = datagram.len();
    let datagram = datagram
        .get_mut(..payload_end)
        .ok_or(WireError::BufferTooSmall {
            needed: payload_end,
            available,
        })?;
    let (headers, roce) = datagram.split_at_mut(payload_start);
    let (ip, udp) = headers.split_at(ip_len);
    icrc::seal(ip, udp, roce)
}

/// A UDP datagram split into its parts, borrowed from the parsed buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The IP header: 20 bytes (IPv4, no options) or 40 bytes (IPv6).
    pub ip_header: &'a [u8],
    /// The 8-byte UDP header.
    pub udp_header: &'a [u8],
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The UDP payload (for RoCEv2: BTH..ICRC), exactly as long as the UDP length says.
    pub payload: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Parses an IP packet (IPv4 without options or IPv6 without extension headers)
    /// carrying UDP. Bytes after the IP total length (e.g. Ethernet padding) are ignored.
    ///
    /// # Errors
    /// [`WireError::UnsupportedIp`], [`WireError::IpOptions`], [`WireError::NotUdp`]
    /// (also for IPv6 extension headers), [`WireError::Truncated`] /
    /// [`WireError::BadLength`] for inconsistent lengths, [`WireError::InvalidField`] for
    /// IPv4 fragments and an IHL below 5.
    pub fn parse_ip(packet: &'a [u8]) -> Result<Datagram<'a>, WireError> {
        Datagram::parse_ip_at(packet, 0)
    }

    /// Parses an Ethernet II frame (with up to two 802.1Q / 802.1ad tags) carrying an
    /// IPv4 or IPv6 UDP datagram. Offsets in errors count from the start of the frame.
    ///
    /// # Errors
    /// [`WireError::Truncated`] for a short frame, [`WireError::InvalidField`] for an
    /// EtherType other than IPv4 / IPv6 (or an IP version that contradicts it); then as
    /// [`Datagram::parse_ip`].
    pub fn parse_ethernet(frame: &'a [u8]) -> Result<Datagram<'a>, WireError> {
        let mut offset = ETHERNET_HEADER_LEN - 2;
        let mut ethertype = be16(frame, offset, HeaderKind::Ethernet, 0, ETHERNET_HEADER_LEN)?;
        // At most two tags (802.1ad outer + 802.1Q inner): the loop is bounded.
        for _ in 0..2 {
            if ethertype != ETHERTYPE_VLAN && ethertype != ETHERTYPE_QINQ {
                break;
            }
            offset += VLAN_TAG_LEN;
            let tag_start = offset - 2;
            ethertype = be16(frame, offset, HeaderKind::Ethernet, tag_start, VLAN_TAG_LEN)?;
        }
        let ip_start = offset + 2;
        let packet = frame.get(ip_start..).unwrap_or_default();
        let family = match ethertype {
            ETHERTYPE_IPV4 => 4,
            ETHERTYPE_IPV6 => 6,
            other => {
                return Err(WireError::InvalidField {
                    header: HeaderKind::Ethernet,
                    field: "EtherType",
                    value: u64::from(other),
                })
            }
        };
        Datagram::parse_ip_family(packet, ip_start, family)
    }

    /// Parses an IP packet whose family is given by the link layer (EtherType or
    /// protocol field); `offset` is where `packet` starts in the captured buffer.
    ///
    /// # Errors
    /// As [`Datagram::parse_ip`]; [`WireError::InvalidField`] if the version nibble is
    /// not `family`.
    pub fn parse_ip_family(
        packet: &'a [u8],
        offset: usize,
        family: u8,
    ) -> Result<Datagram<'a>, WireError> {
        let header = if family == 6 {
            HeaderKind::Ipv6
        } else {
            HeaderKind::Ipv4
        };
        let version = packet.first().map(|b| b >> 4).ok_or(WireError::Truncated {
            header,
            offset,
            needed: if family == 6 {
                IPV6_HEADER_LEN
            } else {
                IPV4_HEADER_LEN
            },
            available: 0,
        })?;
        if version != family {
            return Err(WireError::InvalidField {
                header,
                field: "version",
                value: u64::from(version),
            });
        }
        Datagram::parse_ip_at(packet, offset)
    }

    /// The UDP payload if the destination port is RoCEv2's 4791.
    ///
    /// # Errors
    /// [`WireError::NotRoce`] for any other destination port.
    pub fn roce(&self) -> Result<&'a [u8], WireError> {
        if self.dst_port == ROCEV2_UDP_PORT {
            Ok(self.payload)
        } else {
            Err(WireError::NotRoce {
                dst_port: self.dst_port,
            })
        }
    }

    /// The addresses and ports of this datagram.
    pub fn endpoints(&self) -> Endpoints {
        Endpoints {
            src: self.src,
            dst: self.dst,
            src_port: self.src_port,
            dst_port: self.dst_port,
        }
    }

    /// Checks the ICRC at the end of the payload against the captured IP and UDP headers.
    ///
    /// # Errors
    /// As [`icrc::verify`].
    pub fn verify_icrc(&self) -> Result<(), WireError> {
        icrc::verify(self.ip_header, self.udp_header, self.payload)
    }

    /// The ICRC in the last four payload bytes (wire order: least-significant first).
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the payload is shorter than an ICRC.
    pub fn icrc_on_wire(&self) -> Result<u32, WireError> {
        let len = self.payload.len();
        let start = len.checked_sub(ICRC_LEN).ok_or(WireError::Truncated {
            header: HeaderKind::Icrc,
            offset: 0,
            needed: ICRC_LEN,
            available: len,
        })?;
        Ok(u32::from_le_bytes(crate::error::field::get(
            self.payload,
            start,
        )))
    }

    fn parse_ip_at(packet: &'a [u8], offset: usize) -> Result<Datagram<'a>, WireError> {
        let first = packet.first().copied().ok_or(WireError::Truncated {
            header: HeaderKind::Ipv4,
            offset,
            needed: IPV4_HEADER_LEN,
            available: 0,
        })?;
        match first >> 4 {
            4 => Datagram::parse_ipv4(packet, offset),
            6 => Datagram::parse_ipv6(packet, offset),
            version => Err(WireError::UnsupportedIp { version }),
        }
    }

    fn parse_ipv4(packet: &'a [u8], offset: usize) -> Result<Datagram<'a>, WireError> {
        let header = HeaderKind::Ipv4;
        let h: &[u8; IPV4_HEADER_LEN] = fixed(packet, header, offset)?;
        let ihl = h[0] & 0x0f;
        if ihl < 5 {
            return Err(WireError::InvalidField {
                header,
                field: "IHL",
                value: u64::from(ihl),
            });
        }
        if ihl > 5 {
            return Err(WireError::IpOptions { ihl });
        }
        let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
        if total < IPV4_HEADER_LEN + UDP_HEADER_LEN {
            return Err(WireError::BadLength {
                header,
                field: "total length",
                value: total,
                expected: IPV4_HEADER_LEN + UDP_HEADER_LEN,
            });
        }
        let packet = packet.get(..total).ok_or(WireError::Truncated {
            header,
            offset,
            needed: total,
            available: packet.len(),
        })?;
        // Flags (3 bits) + fragment offset (13 bits); only DF may be set.
        let frag = u16::from_be_bytes([h[6], h[7]]);
        if frag & 0xbfff != 0 {
            return Err(WireError::InvalidField {
                header,
                field: "flags/fragment offset",
                value: u64::from(frag),
            });
        }
        if h[9] != IP_PROTO_UDP {
            return Err(WireError::NotUdp { protocol: h[9] });
        }
        let src = IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15]));
        let dst = IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19]));
        Datagram::parse_udp(packet, IPV4_HEADER_LEN, offset, src, dst)
    }

    fn parse_ipv6(packet: &'a [u8], offset: usize) -> Result<Datagram<'a>, WireError> {
        let header = HeaderKind::Ipv6;
        let h: &[u8; IPV6_HEADER_LEN] = fixed(packet, header, offset)?;
        let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
        if payload_len < UDP_HEADER_LEN {
            // Also rejects 0, the jumbogram marker.
            return Err(WireError::BadLength {
                header,
                field: "payload length",
                value: payload_len,
                expected: UDP_HEADER_LEN,
            });
        }
        let total = IPV6_HEADER_LEN + payload_len;
        let packet = packet.get(..total).ok_or(WireError::Truncated {
            header,
            offset,
            needed: total,
            available: packet.len(),
        })?;
        if h[6] != IP_PROTO_UDP {
            return Err(WireError::NotUdp { protocol: h[6] });
        }
        let mut src = [0u8; 16];
        src.copy_from_slice(&h[8..24]);
        let mut dst = [0u8; 16];
        dst.copy_from_slice(&h[24..40]);
        let (src, dst) = (
            IpAddr::V6(Ipv6Addr::from(src)),
            IpAddr::V6(Ipv6Addr::from(dst)),
        );
        Datagram::parse_udp(packet, IPV6_HEADER_LEN, offset, src, dst)
    }

    /// `packet` is exactly the IP packet (cut to its length field); UDP starts at `ip_len`.
    fn parse_udp(
        packet: &'a [u8],
        ip_len: usize,
        offset: usize,
        src: IpAddr,
        dst: IpAddr,
    ) -> Result<Datagram<'a>, WireError> {
        let (ip_header, udp) = packet
            .split_at_checked(ip_len)
            .ok_or(WireError::Truncated {
                header: HeaderKind::Udp,
                offset: offset + ip_len,
                needed: UDP_HEADER_LEN,
                available: 0,
            })?;
        let u: &[u8; UDP_HEADER_LEN] = fixed(udp, HeaderKind::Udp, offset + ip_len)?;
        let udp_len = usize::from(u16::from_be_bytes([u[4], u[5]]));
        if udp_len != udp.len() {
            return Err(WireError::BadLength {
                header: HeaderKind::Udp,
                field: "length",
                value: udp_len,
                expected: udp.len(),
            });
        }
        let (udp_header, payload) = udp.split_at(UDP_HEADER_LEN);
        Ok(Datagram {
            ip_header,
            udp_header,
            src,
            dst,
            src_port: u16::from_be_bytes([u[0], u[1]]),
            dst_port: u16::from_be_bytes([u[2], u[3]]),
            payload,
        })
    }
}

impl fmt::Display for Datagram<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} udp len {}", self.endpoints(), self.payload.len())
    }
}

/// The first `N` bytes of `buf` as an array, or [`WireError::Truncated`].
fn fixed<const N: usize>(
    buf: &[u8],
    header: HeaderKind,
    offset: usize,
) -> Result<&[u8; N], WireError> {
    buf.get(..N)
        .and_then(|b| b.try_into().ok())
        .ok_or(WireError::Truncated {
            header,
            offset,
            needed: N,
            available: buf.len(),
        })
}

/// Big-endian u16 at `at` of `buf`, or a truncation of the `len`-byte `header` that starts
/// at `start`.
fn be16(
    buf: &[u8],
    at: usize,
    header: HeaderKind,
    start: usize,
    len: usize,
) -> Result<u16, WireError> {
    match buf.get(at..at + 2) {
        Some(&[a, b]) => Ok(u16::from_be_bytes([a, b])),
        _ => Err(WireError::Truncated {
            header,
            offset: start,
            needed: len,
            available: buf.len().saturating_sub(start),
        }),
    }
}

/// `value` as a 16-bit length field, or [`WireError::BadLength`] if it exceeds `max`.
fn length_field(
    header: HeaderKind,
    field: &'static str,
    value: usize,
    max: usize,
) -> Result<u16, WireError> {
    u16::try_from(value)
        .ok()
        .filter(|_| value <= max)
        .ok_or(WireError::BadLength {
            header,
            field,
            value,
            expected: max,
        })
}

fn mixed_families(dst_version: u8) -> WireError {
    WireError::InvalidField {
        header: if dst_version == 4 {
            HeaderKind::Ipv4
        } else {
            HeaderKind::Ipv6
        },
        field: "destination address family (source is the other family)",
        value: u64::from(dst_version),
    }
}

fn write_ipv4(ip: &mut [u8], fields: &IpFields, total: u16, src: Ipv4Addr, dst: Ipv4Addr) {
    let mut h = [0u8; IPV4_HEADER_LEN];
    h[0] = 0x45; // version 4, IHL 5
    h[1] = fields.traffic_class;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..6].copy_from_slice(&fields.identification.to_be_bytes());
    h[6] = if fields.dont_fragment { 0x40 } else { 0 };
    h[8] = fields.hop_limit;
    h[9] = IP_PROTO_UDP;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let checksum = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&checksum.to_be_bytes());
    // invariant: callers pass exactly IPV4_HEADER_LEN bytes (split by `headers_len`).
    if let Some(out) = ip.get_mut(..IPV4_HEADER_LEN) {
        out.copy_from_slice(&h);
    }
}

fn write_ipv6(ip: &mut [u8], fields: &IpFields, payload_len: u16, src: Ipv6Addr, dst: Ipv6Addr) {
    let mut h = [0u8; IPV6_HEADER_LEN];
    let word =
        (6u32 << 28) | (u32::from(fields.traffic_class) << 20) | (fields.flow_label & 0xf_ffff);
    h[0..4].copy_from_slice(&word.to_be_bytes());
    h[4..6].copy_from_slice(&payload_len.to_be_bytes());
    h[6] = IP_PROTO_UDP;
    h[7] = fields.hop_limit;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
    // invariant: callers pass exactly IPV6_HEADER_LEN bytes (split by `headers_len`).
    if let Some(out) = ip.get_mut(..IPV6_HEADER_LEN) {
        out.copy_from_slice(&h);
    }
}

/// The RFC 791 header checksum: one's complement of the one's-complement sum of the
/// header's 16-bit words, computed with the checksum field as zero.
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u64 = header
        .chunks(2)
        .enumerate()
        .filter(|(i, _)| *i != 5) // the checksum field itself
        .map(|(_, w)| match *w {
            [a, b] => u64::from(u16::from_be_bytes([a, b])),
            [a] => u64::from(a) << 8,
            _ => 0,
        })
        .sum();
    // Four folds bring any 64-bit sum down to 16 bits.
    for _ in 0..4 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // invariant: after the folds `sum <= 0xffff`, so the cast is lossless.
    !(sum as u16)
}

#[cfg(test)]
#[path = "tests/ip.rs"]
mod tests;
