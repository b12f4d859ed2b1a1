//! The RoCEv2 invariant CRC (ICRC) that ends every packet (IBA Vol 1 §7.8.1, Annex A17).
//!
//! The ICRC covers the IP header, the UDP header and the whole transport packet (BTH,
//! extension headers, payload, pad), with the fields that routers may change replaced by
//! all-ones ("masked") first:
//!
//! * IPv4: TOS (byte 1), TTL (byte 8), header checksum (bytes 10-11). Identification,
//!   flags, total length, protocol and addresses stay covered, so a sender must know the
//!   exact IPv4 header its datagram will carry (see [`crate::ip`]).
//! * IPv6: traffic class, flow label, hop limit.
//! * UDP: checksum.
//! * BTH: byte 4 (FECN, BECN and the six reserved bits).
//!
//! The CRC is the standard CRC-32 (IEEE 802.3, reflected, init and final XOR all-ones)
//! over `8 × 0xFF ‖ masked IP ‖ masked UDP ‖ masked BTH ‖ rest of the packet`, where the
//! eight 0xFF bytes stand in for the InfiniBand LRH that RoCEv2 does not carry. It travels
//! least-significant byte first, like an Ethernet FCS: [`seal`] writes
//! `crc.to_le_bytes()` into the last four bytes.
//!
//! Nothing here allocates: the masked headers are copied into a 68-byte stack buffer.

use crate::error::{HeaderKind, WireError};
use crate::ICRC_LEN;

/// Length of the BTH, the only transport header that is masked.
const BTH_LEN: usize = 12;
/// Length of a UDP header.
const UDP_LEN: usize = 8;
/// Length of an IPv4 header without options (the only form RoCEv2 uses).
const IPV4_LEN: usize = 20;
/// Length of the fixed IPv6 header.
const IPV6_LEN: usize = 40;
/// The stand-in for the masked LRH that opens the CRC input.
const LRH_STANDIN: [u8; 8] = [0xff; 8];
/// Room for the stand-in and the largest masked pseudo header (IPv6 + UDP + BTH).
const PSEUDO_MAX: usize = LRH_STANDIN.len() + IPV6_LEN + UDP_LEN + BTH_LEN;

/// Computes the ICRC of a RoCEv2 packet.
///
/// * `ip_header`: exactly the IP header the packet travels in: 20 bytes of IPv4 without
///   options, or the 40-byte fixed IPv6 header (chosen by the version nibble).
/// * `udp_header`: exactly the 8-byte UDP header.
/// * `roce`: the UDP payload from the BTH up to and including the pad bytes, **without**
///   the 4 ICRC bytes.
///
/// Returns the CRC value; its wire form is `value.to_le_bytes()`.
///
/// # Errors
/// [`WireError::UnsupportedIp`] for an IP version other than 4 or 6,
/// [`WireError::IpOptions`] for an IPv4 header with IHL > 5, [`WireError::InvalidField`]
/// for IHL < 5, [`WireError::Truncated`] / [`WireError::BadLength`] when a slice is
/// shorter / longer than its header (or `roce` shorter than a BTH).
pub fn compute(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32, WireError> {
    let mut pseudo = [0u8; PSEUDO_MAX];
    let used = masked_pseudo_header(ip_header, udp_header, roce, &mut pseudo)?;
    let mut crc = crc32fast::Hasher::new();
    // invariant: `used <= PSEUDO_MAX` (masked_pseudo_header writes within `pseudo`).
    crc.update(pseudo.get(..used).unwrap_or_default());
    // `roce` holds at least a BTH (checked above); the rest is covered unmasked.
    crc.update(roce.get(BTH_LEN..).unwrap_or_default());
    Ok(crc.finalize())
}

/// Computes the ICRC of `roce_with_icrc` (BTH..pad followed by 4 ICRC bytes) and writes it,
/// least-significant byte first, into its last four bytes. Returns the CRC value.
///
/// # Errors
/// As [`compute`]; [`WireError::Truncated`] if `roce_with_icrc` cannot hold a BTH and an
/// ICRC.
pub fn seal(
    ip_header: &[u8],
    udp_header: &[u8],
    roce_with_icrc: &mut [u8],
) -> Result<u32, WireError> {
    let body_len = body_len(roce_with_icrc)?;
    let (body, trailer) = roce_with_icrc.split_at_mut(body_len);
    let crc = compute(ip_header, udp_header, body)?;
    trailer.copy_from_slice(&crc.to_le_bytes());
    Ok(crc)
}

/// Checks the ICRC in the last four bytes of `roce_with_icrc` against the one computed for
/// the given IP and UDP headers.
///
/// # Errors
/// [`WireError::IcrcMismatch`] (with both values) when they differ; otherwise as [`seal`].
pub fn verify(ip_header: &[u8], udp_header: &[u8], roce_with_icrc: &[u8]) -> Result<(), WireError> {
    let body_len = body_len(roce_with_icrc)?;
    let (body, trailer) = roce_with_icrc.split_at(body_len);
    let computed = compute(ip_header, udp_header, body)?;
    let on_wire = u32::from_le_bytes(crate::error::field::get(trailer, 0));
    if computed == on_wire {
        Ok(())
    } else {
        Err(WireError::IcrcMismatch { computed, on_wire })
    }
}

/// Length of the part of `roce_with_icrc` in front of the ICRC, which must hold a BTH.
fn body_len(roce_with_icrc: &[u8]) -> Result<usize, WireError> {
    let len = roce_with_icrc.len();
    if len < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated {
            header: HeaderKind::Icrc,
            offset: BTH_LEN,
            needed: ICRC_LEN,
            available: len.saturating_sub(BTH_LEN),
        });
    }
    Ok(len - ICRC_LEN)
}

/// Writes `8 × 0xFF ‖ masked IP ‖ masked UDP ‖ masked BTH` into `out` and returns how many
/// bytes it used.
fn masked_pseudo_header(
    ip_header: &[u8],
    udp_header: &[u8],
    roce: &[u8],
    out: &mut [u8; PSEUDO_MAX],
) -> Result<usize, WireError> {
    let ip_len = check_ip_header(ip_header)?;
    exact_len(HeaderKind::Udp, udp_header, UDP_LEN, ip_len)?;
    let bth = roce.get(..BTH_LEN).ok_or(WireError::Truncated {
        header: HeaderKind::Bth,
        offset: 0,
        needed: BTH_LEN,
        available: roce.len(),
    })?;

    let (lrh, rest) = out.split_at_mut(LRH_STANDIN.len());
    lrh.copy_from_slice(&LRH_STANDIN);
    let (ip, rest) = rest.split_at_mut(ip_len);
    let (udp, rest) = rest.split_at_mut(UDP_LEN);
    let (bth_out, _) = rest.split_at_mut(BTH_LEN);

    ip.copy_from_slice(ip_header);
    if ip_len == IPV4_LEN {
        ip[1] = 0xff; // TOS
        ip[8] = 0xff; // TTL
        ip[10] = 0xff; // header checksum
        ip[11] = 0xff;
    } else {
        // Version (bits 31:28) stays; traffic class (27:20) and flow label (19:0) are masked.
        ip[0] |= 0x0f;
        ip[1] = 0xff;
        ip[2] = 0xff;
        ip[3] = 0xff;
        ip[7] = 0xff; // hop limit
    }
    udp.copy_from_slice(udp_header);
    udp[6] = 0xff; // UDP checksum
    udp[7] = 0xff;
    bth_out.copy_from_slice(bth);
    bth_out[4] = 0xff; // FECN, BECN, Resv6

    Ok(LRH_STANDIN.len() + ip_len + UDP_LEN + BTH_LEN)
}

/// Validates an IP header for the ICRC and returns its length (20 or 40).
fn check_ip_header(ip_header: &[u8]) -> Result<usize, WireError> {
    let first = ip_header.first().copied().ok_or(WireError::Truncated {
        header: HeaderKind::Ipv4,
        offset: 0,
        needed: IPV4_LEN,
        available: 0,
    })?;
    match first >> 4 {
        4 => {
            let ihl = first & 0x0f;
            if ihl < 5 {
                return Err(WireError::InvalidField {
                    header: HeaderKind::Ipv4,
                    field: "IHL",
                    value: u64::from(ihl),
                });
            }
            if ihl > 5 {
                return Err(WireError::IpOptions { ihl });
            }
            exact_len(HeaderKind::Ipv4, ip_header, IPV4_LEN, 0)?;
            Ok(IPV4_LEN)
        }
        6 => {
            exact_len(HeaderKind::Ipv6, ip_header, IPV6_LEN, 0)?;
            Ok(IPV6_LEN)
        }
        version => Err(WireError::UnsupportedIp { version }),
    }
}

/// Requires `buf` to be exactly `len` bytes long (`offset` is where it would start in
/// the datagram, for the error).
fn exact_len(header: HeaderKind, buf: &[u8], len: usize, offset: usize) -> Result<(), WireError> {
    if buf.len() < len {
        Err(WireError::Truncated {
            header,
            offset,
            needed: len,
            available: buf.len(),
        })
    } else if buf.len() > len {
        Err(WireError::BadLength {
            header,
            field: "header slice length",
            value: buf.len(),
            expected: len,
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
#[path = "tests/icrc.rs"]
mod tests;
