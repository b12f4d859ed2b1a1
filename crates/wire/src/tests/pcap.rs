use super::*;
use core::net::{IpAddr, Ipv4Addr};

fn ep() -> Endpoints {
    Endpoints::roce(
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        0xc000,
    )
}

/// BTH (RC SEND_ONLY, PadCnt 0) + 4 payload bytes + ICRC slot.
fn roce() -> Vec<u8> {
    let mut r = vec![0x04, 0x00, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1];
    r.extend_from_slice(b"abcd");
    r.extend_from_slice(&[0; 4]);
    r
}

#[test]
fn file_header_layout() {
    let w = PcapWriter::new(Vec::new()).unwrap();
    let bytes = w.into_inner().unwrap();
    // libpcap file header: magic, v2.4, zone 0, sigfigs 0, snaplen, linktype 1.
    assert_eq!(
        bytes,
        [0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 1, 0, 0, 0]
    );
}

#[test]
fn write_read_roundtrip() {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let ts = Duration::new(1_700_000_000, 123_456_789);
    let crc = w.write_roce(ts, &ep(), &roce()).unwrap();
    w.write_frame(Duration::from_secs(5), &[1, 2, 3]).unwrap();
    let bytes = w.into_inner().unwrap();

    let r = PcapReader::new(&bytes[..]).unwrap();
    assert_eq!(r.link_type(), Some(LinkType::Ethernet));
    assert_eq!(r.snaplen(), SNAPLEN);
    let frames: Vec<_> = r.collect::<Result<_, _>>().unwrap();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].0, Duration::new(1_700_000_000, 123_456_000));
    assert_eq!(frames[1], (Duration::from_secs(5), vec![1, 2, 3]));
    let frame = &frames[0].1;
    assert_eq!(frame[0..6], [2, 0, 10, 0, 0, 2]);
    assert_eq!(frame[6..12], [2, 0, 10, 0, 0, 1]);
    let d = Datagram::parse_ethernet(frame).unwrap();
    assert_eq!(d.endpoints(), ep());
    assert_eq!(d.icrc_on_wire(), Ok(crc));
    d.verify_icrc().unwrap();
    assert_eq!(d.payload[..16], roce()[..16]);
}

#[test]
fn reads_big_endian_nanosecond_files() {
    let mut f = Vec::new();
    f.extend_from_slice(&MAGIC_NANOS.to_be_bytes());
    f.extend_from_slice(&[0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    f.extend_from_slice(&LINKTYPE_RAW.to_be_bytes());
    f.extend_from_slice(&7u32.to_be_bytes());
    f.extend_from_slice(&999_999_999u32.to_be_bytes());
    f.extend_from_slice(&2u32.to_be_bytes());
    f.extend_from_slice(&1500u32.to_be_bytes()); // truncated capture: orig > snaplen OK
    f.extend_from_slice(&[0x45, 0]);
    let r = PcapReader::new(&f[..]).unwrap();
    assert_eq!(r.link_type(), Some(LinkType::RawIp));
    let frames: Vec<_> = r.collect::<Result<_, _>>().unwrap();
    assert_eq!(frames, vec![(Duration::new(7, 999_999_999), vec![0x45, 0])]);
}

#[test]
fn truncation_and_garbage_are_typed_errors() {
    assert!(matches!(
        PcapReader::new(&[0xd4, 0xc3][..]),
        Err(WireError::Truncated {
            header: HeaderKind::Pcap,
            needed: 24,
            available: 2,
            ..
        })
    ));
    assert!(matches!(
        PcapReader::new(&[0u8; 24][..]),
        Err(WireError::Pcap(_))
    ));

    let mut w = PcapWriter::new(Vec::new()).unwrap();
    w.write_frame(Duration::ZERO, &[9; 40]).unwrap();
    let bytes = w.into_inner().unwrap();
    let mut r = PcapReader::new(&bytes[..bytes.len() - 1]).unwrap();
    assert_eq!(
        r.next(),
        Some(Err(WireError::Truncated {
            header: HeaderKind::Pcap,
            offset: 40,
            needed: 40,
            available: 39
        }))
    );
    assert_eq!(r.next(), None, "iteration stops after an error");

    let mut r = PcapReader::new(&bytes[..30]).unwrap();
    assert!(matches!(
        r.next(),
        Some(Err(WireError::Truncated {
            offset: 24,
            needed: 16,
            available: 6,
            ..
        }))
    ));
}

#[test]
fn cooked_and_raw_link_types() {
    let mut dg = vec![0u8; 28 + 20];
    let (len, _) = ip::build_datagram(&ep(), &IpFields::default(), &roce(), &mut dg).unwrap();
    assert_eq!(len, dg.len());

    let mut sll = vec![0, 0, 0x03, 0x04, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
    sll.extend_from_slice(&dg);
    let d = LinkType::LinuxSll.datagram(&sll).unwrap();
    assert_eq!(d.endpoints(), ep());

    let mut sll2 = vec![
        0x08, 0x00, 0, 0, 0, 0, 0, 1, 0x03, 0x04, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    sll2.extend_from_slice(&dg);
    assert_eq!(
        LinkType::LinuxSll2.datagram(&sll2).unwrap().endpoints(),
        ep()
    );

    assert_eq!(LinkType::RawIp.datagram(&dg).unwrap().endpoints(), ep());

    sll[14] = 0x86;
    sll[15] = 0xdd;
    assert!(matches!(
        LinkType::LinuxSll.datagram(&sll),
        Err(WireError::InvalidField {
            header: HeaderKind::Ipv6,
            ..
        })
    ));
    assert!(matches!(
        LinkType::LinuxSll.datagram(&sll[..10]),
        Err(WireError::Truncated { needed: 16, .. })
    ));
}

/// A pcapng block: type, total length, body padded to 4, total length.
fn ng_block(big_endian: bool, block_type: u32, body: &[u8]) -> Vec<u8> {
    let w = |v: u32| {
        if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let padded = body.len().div_ceil(4) * 4;
    let total = (12 + padded) as u32;
    let mut b = Vec::new();
    b.extend_from_slice(&w(block_type));
    b.extend_from_slice(&w(total));
    b.extend_from_slice(body);
    b.resize(8 + padded, 0);
    b.extend_from_slice(&w(total));
    b
}

#[test]
fn reads_pcapng_sections_interfaces_and_packet_blocks() {
    // Section 1, little-endian: Ethernet interface with nanosecond timestamps
    // (if_tsresol = 9), an enhanced packet, a name-resolution block to skip, a simple
    // packet. Section 2, big-endian: raw-IP interface with the default microseconds.
    let mut f = Vec::new();
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    f.extend(ng_block(false, PCAPNG_SHB, &shb));
    let mut idb = vec![1, 0, 0, 0, 0, 0, 1, 0]; // linktype 1, snaplen 65536
    idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]); // if_tsresol 9, end
    f.extend(ng_block(false, PCAPNG_IDB, &idb));
    let ts: u64 = 1_700_000_000_123_456_789;
    let mut epb = 0u32.to_le_bytes().to_vec();
    epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
    epb.extend_from_slice(&(ts as u32).to_le_bytes());
    epb.extend_from_slice(&3u32.to_le_bytes());
    epb.extend_from_slice(&60u32.to_le_bytes());
    epb.extend_from_slice(&[0xaa, 0xbb, 0xcc]);
    f.extend(ng_block(false, PCAPNG_EPB, &epb));
    f.extend(ng_block(false, 4, &[0, 0, 0, 0]));
    let mut spb = 2u32.to_le_bytes().to_vec();
    spb.extend_from_slice(&[0x11, 0x22]);
    f.extend(ng_block(false, PCAPNG_SPB, &spb));

    let mut shb2 = 0x1a2b_3c4du32.to_be_bytes().to_vec();
    shb2.extend_from_slice(&[0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    f.extend(ng_block(true, PCAPNG_SHB, &shb2));
    f.extend(ng_block(true, PCAPNG_IDB, &[0, 101, 0, 0, 0, 0, 0x10, 0]));
    let us: u64 = 5_000_001;
    let mut epb2 = 0u32.to_be_bytes().to_vec();
    epb2.extend_from_slice(&((us >> 32) as u32).to_be_bytes());
    epb2.extend_from_slice(&(us as u32).to_be_bytes());
    epb2.extend_from_slice(&1u32.to_be_bytes());
    epb2.extend_from_slice(&1u32.to_be_bytes());
    epb2.push(0x45);
    f.extend(ng_block(true, PCAPNG_EPB, &epb2));

    let mut r = PcapReader::new(&f[..]).unwrap();
    assert_eq!(r.link_type(), Some(LinkType::Ethernet));
    assert_eq!(r.snaplen(), 65536);
    let first = r.next().unwrap().unwrap();
    assert_eq!(
        first,
        (
            Duration::new(1_700_000_000, 123_456_789),
            vec![0xaa, 0xbb, 0xcc]
        )
    );
    assert_eq!(
        r.next().unwrap().unwrap(),
        (Duration::ZERO, vec![0x11, 0x22])
    );
    assert_eq!(
        r.next().unwrap().unwrap(),
        (Duration::new(5, 1_000), vec![0x45])
    );
    assert_eq!(r.link_type(), Some(LinkType::RawIp));
    assert_eq!(r.next(), None);

    // Cut anywhere: never a panic, and a cut inside a block is an error.
    for cut in 0..f.len() {
        if let Ok(r) = PcapReader::new(&f[..cut]) {
            let _ = r.count();
        }
    }
    let mut r = PcapReader::new(&f[..f.len() - 3]).unwrap();
    assert!(r.by_ref().take(2).all(|x| x.is_ok()));
    assert!(matches!(r.next(), Some(Err(WireError::Truncated { .. }))));
}

#[test]
fn pcapng_timestamp_resolutions() {
    assert_eq!(
        timestamp(1_500, Resolution::Decimal(3)),
        Ok(Duration::new(1, 500_000_000))
    );
    assert_eq!(
        timestamp(3, Resolution::Binary(1)),
        Ok(Duration::new(1, 500_000_000))
    );
    assert_eq!(
        timestamp(7, Resolution::Decimal(0)),
        Ok(Duration::from_secs(7))
    );
    assert!(timestamp(1, Resolution::Decimal(20)).is_err());
}

/// Cross-check with an independent pcap implementation: the `pcap-file` crate reads
/// what [`PcapWriter`] writes, and [`PcapReader`] reads what `pcap-file` writes.
#[test]
fn interoperates_with_the_pcap_file_crate() {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let ts = Duration::new(1_600_000_000, 654_321_000);
    w.write_roce(ts, &ep(), &roce()).unwrap();
    let ours = w.into_inner().unwrap();
    let mut theirs = pcap_file::pcap::PcapReader::new(&ours[..]).unwrap();
    assert_eq!(theirs.header().datalink, pcap_file::DataLink::ETHERNET);
    let p = theirs.next_packet().unwrap().unwrap();
    assert_eq!(p.timestamp, ts);
    assert_eq!(p.orig_len as usize, p.data.len());
    let frame = p.data.into_owned();
    assert!(theirs.next_packet().is_none());
    let mut own = PcapReader::new(&ours[..]).unwrap();
    assert_eq!(own.next(), Some(Ok((ts, frame.clone()))));

    // pcapng written by pcap-file (nanosecond timestamps, declared by if_tsresol).
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::{
        InterfaceDescriptionBlock, InterfaceDescriptionOption,
    };
    let mut ng = pcap_file::pcapng::PcapNgWriter::new(Vec::new()).unwrap();
    ng.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: pcap_file::DataLink::ETHERNET,
        snaplen: 0,
        options: vec![InterfaceDescriptionOption::IfTsResol(9)],
    })
    .unwrap();
    let ts_ng = Duration::new(1_600_000_001, 987_654_321);
    ng.write_pcapng_block(EnhancedPacketBlock {
        interface_id: 0,
        timestamp: ts_ng,
        original_len: frame.len() as u32,
        data: std::borrow::Cow::Borrowed(&frame[..]),
        options: vec![],
    })
    .unwrap();
    let bytes = ng.into_inner();
    let r = PcapReader::new(&bytes[..]).unwrap();
    assert_eq!(r.link_type(), Some(LinkType::Ethernet));
    let frames: Vec<_> = r.collect::<Result<_, _>>().unwrap();
    assert_eq!(frames, vec![(ts_ng, frame.clone())]);
    Datagram::parse_ethernet(&frames[0].1)
        .unwrap()
        .verify_icrc()
        .unwrap();
}

#[test]
fn mac_addresses_are_local_unicast() {
    let v6: IpAddr = "fe80::1:2:3:4:5".parse().unwrap();
    let mac = mac_for(v6);
    assert_eq!(mac, [0x02, 0x03, 0, 0x04, 0, 0x05]);
    assert_eq!(mac[0] & 0x03, 0x02);
}
