use super::*;

/// docs/INTEROP-NOTES.md §3, IPv4 RC SEND_ONLY "hello": the full IP datagram without the ICRC.
const V4_DATAGRAM: &str = "45000034000040004011b765c0a80101c0a80102c00112b7002000000430ffff\
                           000000118000006468656c6c6f000000";
/// docs/INTEROP-NOTES.md §3: the ICRC bytes on the wire after [`V4_DATAGRAM`].
const V4_ICRC_WIRE: [u8; 4] = [0x4a, 0x73, 0xe3, 0xb9];
/// docs/INTEROP-NOTES.md §3, IPv6 RC ACKNOWLEDGE: the full IP datagram without the ICRC.
const V6_DATAGRAM: &str = "61012345001c1140fe800000000000000000000000000001fe80000000000000\
                           0000000000000002c00112b7001c00001100ffff00000022000000101f000007";
/// docs/INTEROP-NOTES.md §3: the ICRC bytes on the wire after [`V6_DATAGRAM`].
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
