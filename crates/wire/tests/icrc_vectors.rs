//! The ICRC test vectors of docs/INTEROP-NOTES.md §3, end to end through the public API: build
//! each packet from its description (PacketRepr + ip headers), seal it, and compare every
//! byte of the IP datagram and the ICRC with the spec; then parse the spec bytes back.

use std::net::IpAddr;

use uroce_wire::aeth::{self, Syndrome};
use uroce_wire::ip::{self, Datagram, Endpoints, IpFields};
use uroce_wire::opcode::op;
use uroce_wire::{bth, icrc, packet, PacketRepr, Psn};

/// IPv4 RC SEND_ONLY "hello": the datagram without ICRC, then the ICRC wire bytes.
const V4_DATAGRAM: &str = concat!(
    "45000034000040004011b765c0a80101c0a80102c00112b7002000000430ffff",
    "000000118000006468656c6c6f000000"
);
const V4_ICRC: &str = "4a73e3b9";
/// IPv6 RC ACKNOWLEDGE (syndrome 0x1F, MSN 7).
const V6_DATAGRAM: &str = concat!(
    "61012345001c1140fe800000000000000000000000000001fe800000000000000000000000000002",
    "c00112b7001c00001100ffff00000022000000101f000007"
);
const V6_ICRC: &str = "0fc36cd8";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn bth(opcode: u8, dest_qp: u32, psn: u32, ack_req: bool) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req,
        psn: Psn::new(psn),
    }
}

/// Emits `repr`, frames it for `ep`/`fields`, seals it; returns the whole datagram.
fn build(repr: &PacketRepr<'_>, ep: &Endpoints, fields: &IpFields) -> Vec<u8> {
    let mut roce = vec![0u8; repr.buffer_len()];
    repr.emit(&mut roce).unwrap();
    let mut out = vec![0u8; 100];
    let (len, crc) = ip::build_datagram(ep, fields, &roce, &mut out).unwrap();
    out.truncate(len);
    assert_eq!(packet::icrc_on_wire(&out[len - roce.len()..]).unwrap(), crc);
    out
}

#[test]
fn ipv4_send_only_vector() {
    // 192.168.1.1 → 192.168.1.2, ID 0, DF, TTL 64, TOS 0, UDP 0xC001 → 4791, checksum 0.
    let ep = Endpoints::roce(
        IpAddr::from([192, 168, 1, 1]),
        IpAddr::from([192, 168, 1, 2]),
        0xc001,
    );
    let repr = PacketRepr::new(bth(op::RC_SEND_ONLY, 0x11, 0x64, true), b"hello");
    let built = build(&repr, &ep, &IpFields::LINUX_UDP_SOCKET);
    let mut expected = hex(V4_DATAGRAM);
    expected.extend(hex(V4_ICRC));
    assert_eq!(built, expected);
}

#[test]
fn ipv6_acknowledge_vector() {
    // fe80::1 → fe80::2, TC 0x10, flow label 0x12345, hop limit 64.
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
    let repr = PacketRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 7,
        }),
        ..PacketRepr::new(bth(op::RC_ACKNOWLEDGE, 0x22, 0x10, false), &[])
    };
    let built = build(&repr, &ep, &fields);
    let mut expected = hex(V6_DATAGRAM);
    expected.extend(hex(V6_ICRC));
    assert_eq!(built, expected);
}

#[test]
fn spec_bytes_parse_and_verify() {
    for (datagram, icrc_hex) in [(V4_DATAGRAM, V4_ICRC), (V6_DATAGRAM, V6_ICRC)] {
        let mut bytes = hex(datagram);
        bytes.extend(hex(icrc_hex));
        let d = Datagram::parse_ip(&bytes).unwrap();
        d.verify_icrc().unwrap();
        let roce = d.roce().unwrap();
        let body = &roce[..roce.len() - 4];
        let crc = icrc::compute(d.ip_header, d.udp_header, body).unwrap();
        assert_eq!(crc.to_le_bytes().to_vec(), hex(icrc_hex));
        PacketRepr::parse(roce).unwrap();

        // A wrong ICRC is reported with both values.
        let last = bytes.len() - 1;
        bytes[last] ^= 0x80;
        let d = Datagram::parse_ip(&bytes).unwrap();
        assert!(matches!(
            d.verify_icrc(),
            Err(uroce_wire::WireError::IcrcMismatch { computed, .. }) if computed == crc
        ));
    }
}
