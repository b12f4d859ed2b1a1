use super::*;
use crate::aeth::{NakCode, Syndrome};
use crate::opcode::op;
use crate::psn::Psn;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// docs/INTEROP-NOTES.md §3, IPv4 vector: the UDP payload (IP datagram minus 20 + 8 bytes of
/// IPv4 and UDP header) followed by the ICRC.
fn ipv4_vector() -> Vec<u8> {
    let datagram = hex(concat!(
        "45000034000040004011b765c0a80101c0a80102c00112b7002000000430ffff",
        "000000118000006468656c6c6f000000",
        "4a73e3b9"
    ));
    datagram[28..].to_vec()
}

/// docs/INTEROP-NOTES.md §3, IPv6 vector: 40 + 8 bytes of IPv6 and UDP header stripped.
fn ipv6_vector() -> Vec<u8> {
    let datagram = hex(concat!(
        "61012345001c1140fe800000000000000000000000000001fe800000000000000000000000000002",
        "c00112b7001c00001100ffff00000022000000101f000007",
        "0fc36cd8"
    ));
    datagram[48..].to_vec()
}

fn bth(opcode: u8) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: 0x11,
        ack_req: false,
        psn: Psn::new(1),
    }
}

#[test]
fn parse_ipv4_spec_vector() {
    let roce = ipv4_vector();
    assert_eq!(roce.len(), 24);
    let p = PacketRepr::parse(&roce).unwrap();
    assert_eq!(p.bth.opcode, op::RC_SEND_ONLY);
    assert_eq!(p.bth.pad_cnt, 3);
    assert_eq!(p.bth.dest_qp, 0x11);
    assert_eq!(p.bth.psn, Psn::new(0x64));
    assert!(p.bth.ack_req);
    assert_eq!(p.payload, b"hello");
    assert_eq!(p.present_headers(), HeaderSet::empty());
    assert_eq!(p.buffer_len(), roce.len());
    // Wire bytes 4a 73 e3 b9, least significant first.
    assert_eq!(icrc_on_wire(&roce).unwrap(), 0xb9e3_734a);
    assert_eq!(
        p.to_string(),
        "RC SEND_ONLY dqp=0x000011 psn=100 A pad=3 len=5"
    );

    let mut out = vec![0xaa; 40];
    assert_eq!(p.emit(&mut out).unwrap(), 24);
    assert_eq!(out[..20], roce[..20]);
    assert_eq!(out[20..24], [0, 0, 0, 0], "ICRC left for the caller");
    assert_eq!(out[24..], [0xaa; 16], "nothing written past buffer_len");
}

#[test]
fn parse_ipv6_spec_vector() {
    let roce = ipv6_vector();
    let p = PacketRepr::parse(&roce).unwrap();
    assert_eq!(p.bth.opcode, op::RC_ACKNOWLEDGE);
    assert_eq!(p.bth.dest_qp, 0x22);
    assert_eq!(p.bth.psn, Psn::new(0x10));
    assert_eq!(
        p.aeth,
        Some(aeth::Repr {
            syndrome: Syndrome::Ack { credit: 0x1f },
            msn: 7
        })
    );
    assert!(p.payload.is_empty());
    assert_eq!(icrc_on_wire(&roce).unwrap(), 0xd86c_c30f);
    assert_eq!(
        p.to_string(),
        "RC ACKNOWLEDGE dqp=0x000022 psn=16 pad=0 len=0 ACK credit=31 msn=7"
    );
    let mut out = vec![0u8; p.buffer_len()];
    p.emit(&mut out).unwrap();
    assert_eq!(out[..roce.len() - 4], roce[..roce.len() - 4]);
}

#[test]
fn parse_ud_gsi_send_by_hand() {
    // UD SEND_ONLY to QP1, P_Key 0xFFFF, DETH Q_Key 0x80010000 SrcQP 1 (IBA ch. 13),
    // 4 payload bytes, ICRC bytes 11 22 33 44.
    let roce = hex("6400ffff00000001000000058001000000000001cafebabe11223344");
    let p = PacketRepr::parse(&roce).unwrap();
    assert_eq!(
        p.deth,
        Some(deth::Repr {
            qkey: 0x8001_0000,
            src_qp: 1
        })
    );
    assert_eq!(p.payload, [0xca, 0xfe, 0xba, 0xbe]);
    assert_eq!(icrc_on_wire(&roce).unwrap(), 0x4433_2211);
    assert_eq!(p.header_len(), 20);
}

#[test]
fn parse_xrc_write_with_imm_by_hand() {
    // XRC RDMA_WRITE_ONLY_WITH_IMM (0xAB): XRCETH (SRQ 0x000042), RETH (VA 0x1000,
    // R_Key 0x77, DMA length 2), ImmDt 0x01020304, payload "hi" + 2 pad, ICRC.
    let roce = hex(concat!(
        "ab20ffff00000099000000070000004200000000000010000000007700000002",
        "01020304",
        "68690000",
        "00000000"
    ));
    let p = PacketRepr::parse(&roce).unwrap();
    assert_eq!(p.xrceth, Some(xrceth::Repr { srqn: 0x42 }));
    assert_eq!(
        p.reth,
        Some(reth::Repr {
            va: 0x1000,
            rkey: 0x77,
            dma_len: 2
        })
    );
    assert_eq!(p.immdt, Some(immdt::Repr { imm: 0x0102_0304 }));
    assert_eq!(p.payload, b"hi");
    assert_eq!(p.pad_len(), 2);
    let mut out = vec![0u8; p.buffer_len()];
    p.emit(&mut out).unwrap();
    assert_eq!(out, roce);
}

#[test]
fn parse_errors_name_what_and_where() {
    let v4 = ipv4_vector();
    assert_eq!(
        PacketRepr::parse(&v4[..11]),
        Err(WireError::Truncated {
            header: HeaderKind::Bth,
            offset: 0,
            needed: 12,
            available: 11
        })
    );
    let mut bad = v4.clone();
    bad[1] = 0x32;
    assert_eq!(PacketRepr::parse(&bad), Err(WireError::BadTver(2)));
    bad = v4.clone();
    bad[0] = 0x15;
    assert_eq!(PacketRepr::parse(&bad), Err(WireError::UnknownOpcode(0x15)));
    // RC FLUSH: the FETH fits in the 8 bytes after the BTH, its RETH does not.
    bad[0] = op::RC_FLUSH;
    assert_eq!(
        PacketRepr::parse(&bad),
        Err(WireError::Truncated {
            header: HeaderKind::Reth,
            offset: 16,
            needed: 16,
            available: bad.len() - 16
        })
    );
    assert_eq!(
        PacketRepr::parse(&bad[..14]),
        Err(WireError::Truncated {
            header: HeaderKind::Feth,
            offset: 12,
            needed: 4,
            available: 2
        })
    );
    // RC RDMA WRITE ONLY needs 16 bytes of RETH after the BTH; only 12 are there.
    bad = v4.clone();
    bad[0] = op::RC_RDMA_WRITE_ONLY;
    assert_eq!(
        PacketRepr::parse(&bad),
        Err(WireError::Truncated {
            header: HeaderKind::Reth,
            offset: 12,
            needed: 16,
            available: 12
        })
    );
    // BTH only: no room for the ICRC.
    assert_eq!(
        PacketRepr::parse(&v4[..14]),
        Err(WireError::Truncated {
            header: HeaderKind::Icrc,
            offset: 12,
            needed: 4,
            available: 2
        })
    );
    assert_eq!(
        PacketRepr::parse(&v4[..23]),
        Err(WireError::BadLength {
            header: HeaderKind::Payload,
            field: "BTH..ICRC length mod 4",
            value: 3,
            expected: 0
        })
    );
    // 4 bytes of payload+pad but PadCnt 3 on a 16-byte packet: fine; on the BTH+ICRC
    // only packet, PadCnt 3 points before the headers' end.
    let mut short = v4[..16].to_vec();
    assert_eq!(
        PacketRepr::parse(&short),
        Err(WireError::PadBeyondPayload { pad: 3, payload: 0 })
    );
    short[1] = 0x00;
    assert_eq!(PacketRepr::parse(&short).unwrap().payload, b"");
    // ACKNOWLEDGE with 4 stray bytes.
    let v6 = ipv6_vector();
    let mut ack = v6[..16].to_vec();
    ack.extend_from_slice(&[0, 0, 0, 0]);
    ack.extend_from_slice(&v6[16..]);
    assert_eq!(
        PacketRepr::parse(&ack),
        Err(WireError::PayloadNotAllowed {
            opcode: op::RC_ACKNOWLEDGE,
            len: 4
        })
    );
    // Reserved AETH syndrome class.
    let mut nak = v6.clone();
    nak[12] = 0x45;
    assert_eq!(
        PacketRepr::parse(&nak),
        Err(WireError::InvalidField {
            header: HeaderKind::Aeth,
            field: "syndrome",
            value: 0x45
        })
    );
}

#[test]
fn exact_payload_lengths() {
    // CNP: BTH (BECN) + 16 reserved bytes + ICRC.
    let mut cnp = hex("8100ffff4000001100000000");
    cnp.extend_from_slice(&[0; 20]);
    let p = PacketRepr::parse(&cnp).unwrap();
    assert!(p.bth.becn);
    assert_eq!(p.payload.len(), 16);
    let cnp_short = [&cnp[..12], &[0; 12][..]].concat();
    assert_eq!(
        PacketRepr::parse(&cnp_short),
        Err(WireError::BadLength {
            header: HeaderKind::Payload,
            field: "payload length",
            value: 8,
            expected: 16
        })
    );
    let reth = reth::Repr {
        va: 8,
        rkey: 1,
        dma_len: 8,
    };
    let aw = PacketRepr {
        reth: Some(reth),
        ..PacketRepr::new(bth(op::RC_ATOMIC_WRITE), &[1, 2, 3, 4, 5, 6, 7, 8])
    };
    let mut buf = [0u8; 64];
    let n = aw.emit(&mut buf).unwrap();
    assert_eq!(n, 12 + 16 + 8 + 4);
    assert_eq!(PacketRepr::parse(&buf[..n]).unwrap(), aw);
    let aw4 = PacketRepr {
        payload: &[1, 2, 3, 4],
        ..aw
    };
    assert_eq!(
        aw4.emit(&mut buf),
        Err(WireError::BadLength {
            header: HeaderKind::Payload,
            field: "payload length",
            value: 4,
            expected: 8
        })
    );
}

#[test]
fn emit_errors() {
    let mut buf = [0x5au8; 64];
    // UD SEND_ONLY without its DETH.
    let p = PacketRepr::new(bth(op::UD_SEND_ONLY), b"x");
    assert_eq!(
        p.emit(&mut buf),
        Err(WireError::HeaderMismatch {
            opcode: op::UD_SEND_ONLY,
            header: HeaderKind::Deth,
            present: false
        })
    );
    // RC SEND_ONLY with a DETH.
    let p = PacketRepr {
        deth: Some(deth::Repr { qkey: 1, src_qp: 2 }),
        ..PacketRepr::new(bth(op::RC_SEND_ONLY), b"x")
    };
    assert_eq!(
        p.emit(&mut buf),
        Err(WireError::HeaderMismatch {
            opcode: op::RC_SEND_ONLY,
            header: HeaderKind::Deth,
            present: true
        })
    );
    let p = PacketRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::Nak(NakCode::InvalidRequest),
            msn: 1,
        }),
        ..PacketRepr::new(bth(op::RC_ACKNOWLEDGE), b"x")
    };
    assert_eq!(
        p.emit(&mut buf),
        Err(WireError::PayloadNotAllowed {
            opcode: op::RC_ACKNOWLEDGE,
            len: 1
        })
    );
    let p = PacketRepr::new(bth(0x1e), b"");
    assert_eq!(p.emit(&mut buf), Err(WireError::UnknownOpcode(0x1e)));
    let mut wide = bth(op::RC_SEND_ONLY);
    wide.dest_qp = 0x0100_0000;
    assert_eq!(
        PacketRepr::new(wide, b"").emit(&mut buf),
        Err(WireError::InvalidField {
            header: HeaderKind::Bth,
            field: "dest_qp",
            value: 0x0100_0000
        })
    );
    let p = PacketRepr::new(bth(op::RC_SEND_ONLY), &[1u8; 49]);
    assert_eq!(
        p.emit(&mut buf),
        Err(WireError::BufferTooSmall {
            needed: 12 + 49 + 3 + 4,
            available: 64
        })
    );
    assert_eq!(buf, [0x5a; 64], "untouched on error");
    let huge = vec![0u8; MAX_ROCE_LEN];
    assert_eq!(
        PacketRepr::new(bth(op::RC_SEND_ONLY), &huge).emit(&mut buf),
        Err(WireError::PayloadTooLarge {
            len: MAX_ROCE_LEN,
            max: MAX_ROCE_LEN - 16
        })
    );
}

#[test]
fn emit_ignores_given_pad_cnt() {
    let mut b = bth(op::RC_SEND_ONLY);
    b.pad_cnt = 3;
    let mut buf = [0u8; 32];
    let n = PacketRepr::new(b, b"abcd").emit(&mut buf).unwrap();
    assert_eq!(n, 20);
    assert_eq!(buf[1] & 0x30, 0, "PadCnt 0 for a 4-byte payload");
    b.pad_cnt = 0;
    let n = PacketRepr::new(b, b"a").emit(&mut buf).unwrap();
    assert_eq!(n, 20);
    assert_eq!(buf[1] & 0x30, 0x30, "PadCnt 3 for a 1-byte payload");
    assert_eq!(buf[13..20], [0; 7], "pad and ICRC zero");
}

#[test]
fn icrc_on_wire_needs_four_bytes() {
    assert_eq!(icrc_on_wire(&[1, 2, 3, 4]).unwrap(), 0x0403_0201);
    assert_eq!(
        icrc_on_wire(&[1, 2, 3]),
        Err(WireError::Truncated {
            header: HeaderKind::Icrc,
            offset: 0,
            needed: 4,
            available: 3
        })
    );
}

fn segs(len: u64, pmtu: Pmtu) -> Vec<(u64, u32, Position)> {
    segment(len, pmtu)
        .map(|s| (s.offset, s.len, s.position))
        .collect()
}

#[test]
fn segmentation_by_hand() {
    use Position::*;
    let m = Pmtu::Mtu256;
    assert_eq!(segs(0, m), [(0, 0, Only)]);
    assert_eq!(segs(1, m), [(0, 1, Only)]);
    assert_eq!(segs(256, m), [(0, 256, Only)]);
    assert_eq!(segs(257, m), [(0, 256, First), (256, 1, Last)]);
    assert_eq!(
        segs(1000, m),
        [
            (0, 256, First),
            (256, 256, Middle),
            (512, 256, Middle),
            (768, 232, Last)
        ]
    );
    assert_eq!(
        segs(8192, Pmtu::Mtu4096),
        [(0, 4096, First), (4096, 4096, Last)]
    );
    let it = segment(1 << 20, Pmtu::Mtu1024);
    assert_eq!(it.size_hint(), (1024, Some(1024)));
    assert_eq!(it.map(|s| u64::from(s.len)).sum::<u64>(), 1 << 20);
}

#[test]
fn pmtu_rules() {
    let m = Pmtu::Mtu256;
    let full = [0u8; 256];
    let check = |opcode: u8, len: usize| {
        let mut p = PacketRepr::new(bth(opcode), &full[..len]);
        if opcode == op::RC_RDMA_READ_RESPONSE_FIRST {
            p.aeth = Some(aeth::Repr {
                syndrome: Syndrome::ACK_NO_CREDIT,
                msn: 0,
            });
        }
        p.check_pmtu(m)
    };
    assert!(check(op::RC_SEND_FIRST, 256).is_ok());
    assert!(check(op::RC_SEND_MIDDLE, 256).is_ok());
    assert!(check(op::RC_RDMA_READ_RESPONSE_FIRST, 256).is_ok());
    assert_eq!(
        check(op::RC_SEND_FIRST, 255),
        Err(WireError::BadLength {
            header: HeaderKind::Payload,
            field: "payload length of a first/middle packet",
            value: 255,
            expected: 256
        })
    );
    assert!(check(op::RC_SEND_LAST, 1).is_ok());
    assert_eq!(
        check(op::RC_SEND_LAST, 0),
        Err(WireError::BadLength {
            header: HeaderKind::Payload,
            field: "payload length of a last packet",
            value: 0,
            expected: 1
        })
    );
    assert!(check(op::RC_SEND_ONLY, 0).is_ok());
    assert!(check(op::RC_SEND_ONLY, 256).is_ok());
    let big = [0u8; 257];
    assert_eq!(
        PacketRepr::new(bth(op::RC_SEND_ONLY), &big).check_pmtu(m),
        Err(WireError::PayloadTooLarge { len: 257, max: 256 })
    );
    assert!(check(op::RC_ACKNOWLEDGE, 0).is_ok());
    // Every segment of a message passes.
    for len in [0u64, 1, 255, 256, 257, 511, 512, 513, 2000] {
        let data = vec![0u8; len as usize];
        for s in segment(len, m) {
            let op = opcode::opcode_for(
                opcode::Transport::Rc,
                opcode::Operation::Send,
                s.position,
                false,
                false,
            )
            .unwrap();
            let start = s.offset as usize;
            let p = PacketRepr::new(bth(op), &data[start..start + s.len as usize]);
            assert_eq!(p.check_pmtu(m), Ok(()), "len {len} segment {s:?}");
        }
    }
}
