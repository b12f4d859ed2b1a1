//! The RoCEv2 invariant CRC (ICRC) that ends every packet (roce-spec.md §2).
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
mod tests {
    use super::*;

    /// roce-spec.md §2.2, IPv4 RC SEND_ONLY "hello": the full IP datagram without the ICRC.
    const V4_DATAGRAM: &str = "45000034000040004011b765c0a80101c0a80102c00112b7002000000430ffff\
                               000000118000006468656c6c6f000000";
    /// roce-spec.md §2.2: the ICRC bytes on the wire after [`V4_DATAGRAM`].
    const V4_ICRC_WIRE: [u8; 4] = [0x4a, 0x73, 0xe3, 0xb9];
    /// roce-spec.md §2.2, IPv6 RC ACKNOWLEDGE: the full IP datagram without the ICRC.
    const V6_DATAGRAM: &str = "61012345001c1140fe800000000000000000000000000001fe80000000000000\
                               0000000000000002c00112b7001c00001100ffff00000022000000101f000007";
    /// roce-spec.md §2.2: the ICRC bytes on the wire after [`V6_DATAGRAM`].
    const V6_ICRC_WIRE: [u8; 4] = [0x0f, 0xc3, 0x6c, 0xd8];

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
            .collect()
    }

    /// Splits a datagram (no ICRC) into IP header, UDP header and BTH..pad.
    fn split(d: &[u8]) -> (&[u8], &[u8], &[u8]) {
        let ip_len = if d[0] >> 4 == 4 { 20 } else { 40 };
        let (ip, rest) = d.split_at(ip_len);
        let (udp, roce) = rest.split_at(8);
        (ip, udp, roce)
    }

    fn icrc_of(d: &[u8]) -> u32 {
        let (ip, udp, roce) = split(d);
        compute(ip, udp, roce).unwrap()
    }

    #[test]
    fn spec_vector_ipv4_send_only() {
        let d = hex(V4_DATAGRAM);
        assert_eq!(icrc_of(&d).to_le_bytes(), V4_ICRC_WIRE);
    }

    #[test]
    fn spec_vector_ipv6_acknowledge() {
        let d = hex(V6_DATAGRAM);
        assert_eq!(icrc_of(&d).to_le_bytes(), V6_ICRC_WIRE);
    }

    #[test]
    fn seal_writes_wire_bytes_and_verify_accepts_them() {
        for (datagram, wire) in [(V4_DATAGRAM, V4_ICRC_WIRE), (V6_DATAGRAM, V6_ICRC_WIRE)] {
            let d = hex(datagram);
            let (ip, udp, roce) = split(&d);
            let mut sealed = roce.to_vec();
            sealed.extend_from_slice(&[0; 4]);
            let crc = seal(ip, udp, &mut sealed).unwrap();
            assert_eq!(crc.to_le_bytes(), wire);
            assert_eq!(sealed[sealed.len() - 4..], wire);
            verify(ip, udp, &sealed).unwrap();

            let last = sealed.len() - 1;
            sealed[last] ^= 0x01;
            let err = verify(ip, udp, &sealed).unwrap_err();
            assert_eq!(
                err,
                WireError::IcrcMismatch {
                    computed: u32::from_le_bytes(wire),
                    on_wire: u32::from_le_bytes(wire) ^ 0x0100_0000,
                }
            );
        }
    }

    /// Byte positions (in the datagram) that the spec masks; flipping any bit there must
    /// not change the ICRC, flipping any other bit must.
    fn masked_bits(d: &[u8]) -> Vec<(usize, u8)> {
        let mut masked = Vec::new();
        let mut all = |byte: usize| (0..8).for_each(|bit| masked.push((byte, 1u8 << bit)));
        if d[0] >> 4 == 4 {
            // TOS, TTL, header checksum; UDP checksum at 20 + 6; BTH byte 4 at 28 + 4.
            [1, 8, 10, 11, 26, 27, 32].into_iter().for_each(&mut all);
        } else {
            // Traffic class: low nibble of byte 0 and high nibble of byte 1; flow label:
            // low nibble of byte 1 and bytes 2-3; hop limit byte 7.
            [1, 2, 3, 7, 46, 47, 52].into_iter().for_each(&mut all);
            (0..4).for_each(|bit| masked.push((0, 1u8 << bit)));
        }
        masked
    }

    #[test]
    fn masked_bits_do_not_change_the_icrc_and_all_others_do() {
        for datagram in [V4_DATAGRAM, V6_DATAGRAM] {
            let d = hex(datagram);
            let reference = icrc_of(&d);
            let masked = masked_bits(&d);
            for byte in 0..d.len() {
                for bit in 0..8 {
                    let flip = 1u8 << bit;
                    // The version nibble (and the IPv4 IHL) must stay valid for the split.
                    if byte == 0 && (bit >= 4 || d[0] >> 4 == 4) {
                        continue;
                    }
                    let mut m = d.clone();
                    m[byte] ^= flip;
                    let crc = icrc_of(&m);
                    if masked.contains(&(byte, flip)) {
                        assert_eq!(
                            crc, reference,
                            "masked bit {bit} of byte {byte} changed the ICRC"
                        );
                    } else {
                        assert_ne!(
                            crc, reference,
                            "covered bit {bit} of byte {byte} is ignored"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn named_mutable_fields_are_masked() {
        let d = hex(V4_DATAGRAM);
        let reference = icrc_of(&d);
        let mut m = d.clone();
        m[1] = 0xb8; // TOS: DSCP EF
        m[8] = 1; // TTL
        m[10] = 0x12; // IP checksum
        m[11] = 0x34;
        m[26] = 0xab; // UDP checksum
        m[27] = 0xcd;
        m[32] = 0xc0; // BTH FECN + BECN
        assert_eq!(icrc_of(&m), reference);

        let d6 = hex(V6_DATAGRAM);
        let reference6 = icrc_of(&d6);
        let mut m6 = d6.clone();
        m6[0] = 0x6f; // traffic class 0xff..., flow label 0xfffff
        m6[1] = 0xff;
        m6[2] = 0xff;
        m6[3] = 0xff;
        m6[7] = 1; // hop limit
        assert_eq!(icrc_of(&m6), reference6);
    }

    #[test]
    fn covered_ip_fields_change_the_icrc() {
        let d = hex(V4_DATAGRAM);
        let reference = icrc_of(&d);
        // Identification (byte 4), DF (byte 6), source address (byte 12), UDP source port.
        for byte in [4, 6, 12, 20] {
            let mut m = d.clone();
            m[byte] ^= 0x40;
            assert_ne!(icrc_of(&m), reference, "byte {byte}");
        }
    }

    #[test]
    fn rejects_headers_it_cannot_mask() {
        let d = hex(V4_DATAGRAM);
        let (ip, udp, roce) = split(&d);

        let mut with_options = ip.to_vec();
        with_options[0] = 0x46;
        with_options.extend_from_slice(&[1, 1, 1, 0]);
        assert_eq!(
            compute(&with_options, udp, roce),
            Err(WireError::IpOptions { ihl: 6 })
        );

        let mut v5 = ip.to_vec();
        v5[0] = 0x55;
        assert_eq!(
            compute(&v5, udp, roce),
            Err(WireError::UnsupportedIp { version: 5 })
        );

        assert!(matches!(
            compute(&ip[..19], udp, roce),
            Err(WireError::Truncated {
                header: HeaderKind::Ipv4,
                needed: 20,
                available: 19,
                ..
            })
        ));
        assert!(matches!(
            compute(&d[..21], udp, roce),
            Err(WireError::BadLength {
                header: HeaderKind::Ipv4,
                value: 21,
                expected: 20,
                ..
            })
        ));
        assert!(matches!(
            compute(ip, &udp[..7], roce),
            Err(WireError::Truncated {
                header: HeaderKind::Udp,
                ..
            })
        ));
        assert!(matches!(
            compute(ip, udp, &roce[..11]),
            Err(WireError::Truncated {
                header: HeaderKind::Bth,
                needed: 12,
                available: 11,
                ..
            })
        ));
        assert!(matches!(
            compute(&[], udp, roce),
            Err(WireError::Truncated { .. })
        ));
        let mut short = [0u8; 15];
        assert!(matches!(
            seal(ip, udp, &mut short),
            Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                ..
            })
        ));
    }

    #[test]
    fn matches_a_bitwise_crc32_over_the_masked_input() {
        // An independent bit-at-a-time CRC-32 over the masked input built by hand from
        // the spec's rules, to pin the CRC parameters (not just the library call).
        fn crc32_bitwise(data: &[u8]) -> u32 {
            let mut crc = 0xffff_ffffu32;
            for &b in data {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 != 0 {
                        (crc >> 1) ^ 0xedb8_8320
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let d = hex(V4_DATAGRAM);
        let mut input = vec![0xff; 8];
        let mut masked = d.clone();
        for i in [1, 8, 10, 11, 26, 27, 32] {
            masked[i] = 0xff;
        }
        input.extend_from_slice(&masked);
        assert_eq!(crc32_bitwise(&input), icrc_of(&d));
    }
}
