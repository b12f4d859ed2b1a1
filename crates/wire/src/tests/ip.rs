use super::*;

fn v4_ep() -> Endpoints {
    Endpoints::roce(
        IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1)),
        IpAddr::V4(Ipv4Addr::new(192, 168, 1, 2)),
        0xc001,
    )
}

#[test]
fn ipv4_headers_match_the_spec_vector() {
    // docs/INTEROP-NOTES.md §3: the IPv4 vector was captured with exactly the Linux
    // unconnected-socket defaults, for a 24-byte UDP payload.
    let expected: [u8; 28] = [
        0x45, 0x00, 0x00, 0x34, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb7, 0x65, 0xc0, 0xa8, 0x01,
        0x01, 0xc0, 0xa8, 0x01, 0x02, 0xc0, 0x01, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00,
    ];
    let mut out = [0u8; 28];
    assert_eq!(roce_headers(&v4_ep(), 24, &mut out), Ok((20, 8)));
    assert_eq!(out, expected);
}

#[test]
fn ipv6_headers_match_the_spec_vector() {
    // docs/INTEROP-NOTES.md §3 IPv6 vector: TC 0x10, flow label 0x12345, hop limit 64.
    let expected: [u8; 48] = [
        0x61, 0x01, 0x23, 0x45, 0x00, 0x1c, 0x11, 0x40, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 1, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0xc0, 0x01, 0x12, 0xb7,
        0x00, 0x1c, 0x00, 0x00,
    ];
    let ep = Endpoints::roce(
        "fe80::1".parse().unwrap(),
        "fe80::2".parse().unwrap(),
        0xc001,
    );
    let fields = IpFields {
        traffic_class: 0x10,
        flow_label: 0x12345,
        ..IpFields::LINUX_UDP_SOCKET
    };
    let mut out = [0u8; 48];
    assert_eq!(roce_headers_with(&ep, &fields, 20, &mut out), Ok((40, 8)));
    assert_eq!(out, expected);
}

#[test]
fn header_errors() {
    let mut small = [0u8; 27];
    assert_eq!(
        roce_headers(&v4_ep(), 24, &mut small),
        Err(WireError::BufferTooSmall {
            needed: 28,
            available: 27
        })
    );
    let mut out = [0u8; 48];
    let too_long = usize::from(u16::MAX) - 28 + 1;
    assert!(matches!(
        roce_headers(&v4_ep(), too_long, &mut out),
        Err(WireError::BadLength {
            header: HeaderKind::Ipv4,
            ..
        })
    ));
    let mixed = Endpoints::roce(IpAddr::V4(Ipv4Addr::LOCALHOST), "::1".parse().unwrap(), 1);
    assert!(matches!(
        roce_headers(&mixed, 24, &mut out),
        Err(WireError::InvalidField { value: 6, .. })
    ));
}

#[test]
fn checksum_of_a_known_header() {
    // The RFC 1071 style example header used widely (checksum 0xb861).
    let h = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(ipv4_checksum(&h), 0xb861);
}

#[test]
fn build_parse_roundtrip_and_icrc() {
    let roce = [
        0x04, 0x30, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 0x64, b'h', b'e', b'l', b'l', b'o', 0,
        0, 0, 0, 0, 0, 0,
    ];
    let mut buf = [0u8; 128];
    let (len, crc) = build_datagram(&v4_ep(), &IpFields::default(), &roce, &mut buf).unwrap();
    assert_eq!(len, 52);
    // docs/INTEROP-NOTES.md §3 IPv4 vector ICRC on the wire.
    assert_eq!(crc.to_le_bytes(), [0x4a, 0x73, 0xe3, 0xb9]);
    let d = Datagram::parse_ip(&buf[..len]).unwrap();
    assert_eq!(d.endpoints(), v4_ep());
    assert_eq!(d.ip_header.len(), 20);
    assert_eq!(d.roce().unwrap().len(), roce.len());
    assert_eq!(d.icrc_on_wire(), Ok(crc));
    d.verify_icrc().unwrap();

    let mut again = buf;
    again[len - 1] ^= 0xff;
    assert_eq!(seal_datagram(&mut again[..len]), Ok(crc));
    assert_eq!(again[..len], buf[..len]);
}

fn sample_frame(vlan_tags: usize) -> Vec<u8> {
    let mut frame = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    for _ in 0..vlan_tags {
        frame.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    }
    frame.extend_from_slice(&[0x08, 0x00]);
    let mut dg = [0u8; 44];
    build_datagram(&v4_ep(), &IpFields::default(), &[0u8; 16], &mut dg).unwrap();
    frame.extend_from_slice(&dg);
    frame.extend_from_slice(&[0xee; 6]); // Ethernet padding to 64 bytes minimum
    frame
}

#[test]
fn ethernet_with_and_without_vlan() {
    for tags in 0..=2 {
        let frame = sample_frame(tags);
        let d = Datagram::parse_ethernet(&frame).unwrap();
        assert_eq!(d.payload.len(), 16, "{tags} tags");
        assert_eq!(d.ip_header.as_ptr(), frame[14 + 4 * tags..].as_ptr());
    }
}

#[test]
fn typed_parse_errors() {
    let frame = sample_frame(0);
    assert!(matches!(
        Datagram::parse_ethernet(&frame[..13]),
        Err(WireError::Truncated {
            header: HeaderKind::Ethernet,
            offset: 0,
            needed: 14,
            ..
        })
    ));
    let mut arp = frame.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert!(matches!(
        Datagram::parse_ethernet(&arp),
        Err(WireError::InvalidField {
            header: HeaderKind::Ethernet,
            value: 0x0806,
            ..
        })
    ));
    let ip = &frame[14..14 + 44];
    assert!(matches!(
        Datagram::parse_ip(&ip[..30]),
        Err(WireError::Truncated {
            header: HeaderKind::Ipv4,
            needed: 44,
            available: 30,
            ..
        })
    ));
    let mut tcp = ip.to_vec();
    tcp[9] = 6;
    assert_eq!(
        Datagram::parse_ip(&tcp),
        Err(WireError::NotUdp { protocol: 6 })
    );
    let mut opts = ip.to_vec();
    opts[0] = 0x46;
    assert_eq!(
        Datagram::parse_ip(&opts),
        Err(WireError::IpOptions { ihl: 6 })
    );
    let mut frag = ip.to_vec();
    frag[6] = 0x20; // MF
    assert!(matches!(
        Datagram::parse_ip(&frag),
        Err(WireError::InvalidField { .. })
    ));
    let mut v7 = ip.to_vec();
    v7[0] = 0x75;
    assert_eq!(
        Datagram::parse_ip(&v7),
        Err(WireError::UnsupportedIp { version: 7 })
    );
    let mut udp_len = ip.to_vec();
    udp_len[25] += 1;
    assert!(matches!(
        Datagram::parse_ip(&udp_len),
        Err(WireError::BadLength {
            header: HeaderKind::Udp,
            value: 25,
            expected: 24,
            ..
        })
    ));
    let mut port = ip.to_vec();
    port[23] = 0xb8;
    let d = Datagram::parse_ip(&port).unwrap();
    assert_eq!(d.roce(), Err(WireError::NotRoce { dst_port: 0x12b8 }));
    assert!(matches!(
        Datagram::parse_ip(&[]),
        Err(WireError::Truncated { .. })
    ));
    let mut wrong_family = frame.clone();
    wrong_family[12..14].copy_from_slice(&[0x86, 0xdd]);
    assert!(matches!(
        Datagram::parse_ethernet(&wrong_family),
        Err(WireError::InvalidField {
            header: HeaderKind::Ipv6,
            field: "version",
            ..
        })
    ));
}

/// Cross-check with an independent implementation (the `etherparse` crate): it reads
/// the headers uroce builds with the intended field values and a valid checksum, and
/// uroce parses frames that it builds (VLAN-tagged, IPv4 and IPv6).
#[test]
fn interoperates_with_etherparse() {
    let fields = IpFields {
        hop_limit: 17,
        traffic_class: 0xb9,
        identification: 0xbeef,
        dont_fragment: false,
        flow_label: 0xa_bcde,
    };
    let mut out = [0u8; 48];
    roce_headers_with(&v4_ep(), &fields, 100, &mut out).unwrap();
    let h = etherparse::Ipv4HeaderSlice::from_slice(&out[..20]).unwrap();
    assert_eq!(h.header_checksum(), h.to_header().calc_header_checksum());
    assert_eq!(h.ttl(), 17);
    assert_eq!((h.dcp().value() << 2) | h.ecn().value(), 0xb9);
    assert_eq!(h.identification(), 0xbeef);
    assert!(!h.dont_fragment() && !h.more_fragments());
    assert_eq!(usize::from(h.total_len()), 20 + 8 + 100);
    assert_eq!(h.protocol(), etherparse::IpNumber::UDP);
    assert_eq!(h.source(), [192, 168, 1, 1]);
    let u = etherparse::UdpHeaderSlice::from_slice(&out[20..28]).unwrap();
    assert_eq!((u.source_port(), u.destination_port()), (0xc001, 4791));
    assert_eq!((u.length(), u.checksum()), (108, 0));

    let ep6 = Endpoints::roce(
        "2001:db8::1".parse().unwrap(),
        "2001:db8::2".parse().unwrap(),
        7,
    );
    roce_headers_with(&ep6, &fields, 100, &mut out).unwrap();
    let h6 = etherparse::Ipv6HeaderSlice::from_slice(&out[..40]).unwrap();
    assert_eq!(h6.traffic_class(), 0xb9);
    assert_eq!(h6.flow_label().value(), 0xa_bcde);
    assert_eq!(h6.hop_limit(), 17);
    assert_eq!(h6.payload_length(), 108);
    assert_eq!(h6.next_header(), etherparse::IpNumber::UDP);
    assert_eq!(
        h6.destination_addr(),
        "2001:db8::2".parse::<Ipv6Addr>().unwrap()
    );

    let payload = [0x11u8; 24];
    let builder = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .single_vlan(etherparse::VlanId::try_new(42).unwrap())
        .ipv6([0xfe; 16], [0xfd; 16], 9)
        .udp(0xc123, 4791);
    let mut frame = Vec::new();
    builder.write(&mut frame, &payload).unwrap();
    let d = Datagram::parse_ethernet(&frame).unwrap();
    assert_eq!(d.src, IpAddr::V6(Ipv6Addr::from([0xfe; 16])));
    assert_eq!((d.src_port, d.dst_port), (0xc123, 4791));
    assert_eq!(d.roce(), Ok(&payload[..]));

    let builder = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .udp(5, 4791);
    let mut frame = Vec::new();
    builder.write(&mut frame, &payload).unwrap();
    let d = Datagram::parse_ethernet(&frame).unwrap();
    assert_eq!(d.ip_header.len(), 20);
    assert_eq!(d.payload, &payload[..]);
}

#[test]
fn no_panic_on_any_prefix_or_byte_flip() {
    let frame = sample_frame(1);
    for cut in 0..=frame.len() {
        let _ = Datagram::parse_ethernet(&frame[..cut]);
        let _ = Datagram::parse_ip(&frame[18..cut.max(18)]);
    }
    for i in 0..frame.len() {
        for v in [0x00, 0x45, 0x60, 0x81, 0xff] {
            let mut f = frame.clone();
            f[i] = v;
            let _ = Datagram::parse_ethernet(&f);
        }
    }
}
