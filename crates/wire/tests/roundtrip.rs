//! Property tests: for random valid packets of every opcode in the table,
//! `emit` → `parse` gives the same repr (PadCnt normalised), `parse` → `emit` is
//! byte-identical, and the emitted layout matches the spec's header sizes and offsets.

mod common;

use common::{all_rows, arb_packet, arb_packet_for, spec_header_len, OwnedPacket};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use uroce_wire::opcode::{self, op, HeaderSet, Operation, Position, OPCODE_TABLE};
use uroce_wire::packet::segment;
use uroce_wire::{bth, feth, reth, PacketRepr, Pmtu, Psn, Transport};

fn check_roundtrip(pkt: &OwnedPacket) -> Result<(), TestCaseError> {
    let repr = pkt.repr();
    let bytes = pkt.bytes();

    // Layout, from the spec rather than from the crate: header sizes (IBA §9.3), PadCnt
    // (IBA §9.2), BTH offsets (IBA §9.2).
    let hdr = spec_header_len(pkt.info.headers);
    let len = pkt.payload.len();
    let pad = (4 - len % 4) % 4;
    prop_assert_eq!(bytes.len(), hdr + len + pad + 4);
    prop_assert_eq!(bytes.len() % 4, 0);
    prop_assert_eq!(bytes[0], pkt.bth.opcode);
    prop_assert_eq!((bytes[1] >> 4) & 0x3, pad as u8, "PadCnt");
    prop_assert_eq!(bytes[1] & 0x0f, 0, "TVer");
    prop_assert_eq!(u16::from_be_bytes([bytes[2], bytes[3]]), pkt.bth.pkey);
    prop_assert_eq!(bytes[4] & 0x3f, 0, "Resv6");
    prop_assert_eq!(
        u32::from_be_bytes([0, bytes[5], bytes[6], bytes[7]]),
        pkt.bth.dest_qp
    );
    prop_assert_eq!(bytes[8] & 0x7f, 0, "Resv7");
    prop_assert_eq!(
        u32::from_be_bytes([0, bytes[9], bytes[10], bytes[11]]),
        pkt.bth.psn.value()
    );
    if let Some(f) = pkt.feth {
        // FETH right after the BTH (RC FLUSH: BTH, FETH, RETH): 26 reserved bits (zero on
        // emit), selectivity level in bits 5:4, placement type in bits 3:0.
        prop_assert!(pkt.info.headers.contains(HeaderSet::FETH));
        prop_assert_eq!(
            &bytes[12..16],
            &[0, 0, 0, f.selectivity_level << 4 | f.placement_type][..]
        );
    }
    prop_assert_eq!(&bytes[hdr..hdr + len], &pkt.payload[..]);
    prop_assert!(
        bytes[hdr + len..].iter().all(|b| *b == 0),
        "pad and ICRC zero"
    );

    // emit → parse.
    let parsed = PacketRepr::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut expected = repr;
    expected.bth.pad_cnt = pad as u8;
    prop_assert_eq!(parsed, expected);
    prop_assert_eq!(parsed.info(), Some(pkt.info));
    prop_assert_eq!(parsed.buffer_len(), bytes.len());
    prop_assert_eq!(parsed.header_len(), hdr);

    // parse → emit is byte-identical.
    let mut again = vec![0xa5u8; parsed.buffer_len()];
    let n = parsed
        .emit(&mut again)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(n, bytes.len());
    prop_assert_eq!(&again, &bytes);

    let line = parsed.to_string();
    let expect_prefix = format!("{} {} ", pkt.info.transport, pkt.info.name);
    prop_assert!(line.starts_with(&expect_prefix), "{}", line);
    Ok(())
}

/// Every opcode gets its own run, so none can be missed by chance.
#[test]
fn every_opcode_roundtrips() {
    let rows = all_rows();
    assert_eq!(rows.len(), OPCODE_TABLE.len());
    assert!(rows.iter().any(|r| r.opcode == op::RC_FLUSH));
    for row in rows {
        let mut runner = TestRunner::new(Config {
            cases: 40,
            failure_persistence: None,
            ..Config::default()
        });
        if let Err(e) = runner.run(&arb_packet_for(row), |pkt| check_roundtrip(&pkt)) {
            panic!("{row} ({:#04x}): {e}", row.opcode);
        }
    }
}

proptest! {
    #![proptest_config(Config { cases: 1000, ..Config::default() })]

    #[test]
    fn mixed_opcodes_roundtrip(pkt in arb_packet()) {
        check_roundtrip(&pkt)?;
    }

    /// Segments tile the message, have the IBA §9.7 sizes and positions, and each passes
    /// `check_pmtu` with the opcode `opcode_for` picks.
    #[test]
    fn segments_tile_the_message(len in prop_oneof![0u64..3000, 0u64..200_000], mtu_idx in 0usize..5) {
        let pmtu = Pmtu::ALL[mtu_idx];
        let mtu = u64::from(pmtu.bytes());
        let segs: Vec<_> = segment(len, pmtu).collect();
        let count = if len == 0 { 1 } else { len.div_ceil(mtu) };
        prop_assert_eq!(segs.len() as u64, count);
        let mut next = 0u64;
        for (i, s) in segs.iter().enumerate() {
            prop_assert_eq!(s.offset, next);
            next += u64::from(s.len);
            let first = i == 0;
            let last = i + 1 == segs.len();
            let want = match (first, last) {
                (true, true) => Position::Only,
                (true, false) => Position::First,
                (false, true) => Position::Last,
                (false, false) => Position::Middle,
            };
            prop_assert_eq!(s.position, want);
            match s.position {
                Position::First | Position::Middle => prop_assert_eq!(u64::from(s.len), mtu),
                Position::Last => prop_assert!(s.len >= 1 && u64::from(s.len) <= mtu),
                Position::Only => prop_assert!(u64::from(s.len) <= mtu),
            }
        }
        prop_assert_eq!(next, len);
        // The first few packets of the message pass the PMTU check.
        let data = vec![0u8; mtu as usize];
        for s in segs.iter().take(3).chain(segs.last()) {
            let opcode = opcode::opcode_for(Transport::Uc, Operation::RdmaWrite, s.position, true, false)
                .expect("UC WRITE has every position");
            let mut p = PacketRepr::new(bth_for(opcode), &data[..s.len as usize]);
            if s.position.starts() {
                p.reth = Some(reth::Repr { va: 0, rkey: 0, dma_len: len as u32 });
            }
            prop_assert_eq!(p.check_pmtu(pmtu), Ok(()));
        }
    }
}

fn bth_for(opcode: u8) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: 1,
        ack_req: false,
        psn: Psn::ZERO,
    }
}

#[test]
fn flush_parses_from_bytes_laid_out_by_hand() {
    // RC FLUSH: BTH, FETH (4), RETH (16), ICRC (4); no payload.
    let mut bytes = vec![0u8; 36];
    bytes[0] = op::RC_FLUSH;
    bytes[2] = 0xff;
    bytes[3] = 0xff;
    bytes[7] = 1; // DestQP 1
                  // FETH: reserved bits set (ignored), selectivity level 1, placement type 1.
    bytes[12..16].copy_from_slice(&[0xff, 0xff, 0xff, 0xc0 | 0x10 | 0x01]);
    // RETH: VA 0x1000, R_Key 0x42, DMA length 4096.
    bytes[16..24].copy_from_slice(&0x1000u64.to_be_bytes());
    bytes[24..28].copy_from_slice(&0x42u32.to_be_bytes());
    bytes[28..32].copy_from_slice(&4096u32.to_be_bytes());
    let p = PacketRepr::parse(&bytes).expect("a FLUSH parses");
    let want = PacketRepr {
        feth: Some(feth::Repr {
            selectivity_level: feth::SELECTIVITY_REGION,
            placement_type: feth::PLACEMENT_GLOBAL_VISIBILITY,
        }),
        reth: Some(reth::Repr {
            va: 0x1000,
            rkey: 0x42,
            dma_len: 4096,
        }),
        ..PacketRepr::new(bth_for(op::RC_FLUSH), &[])
    };
    assert_eq!(p, want);
    assert_eq!(
        p.to_string(),
        "RC FLUSH dqp=0x000001 psn=0 pad=0 len=0 sel=1 plt=0x1 va=0x1000 rkey=0x00000042 dlen=4096"
    );
    // Emitted again, the reserved bits are zero and nothing else changes.
    let mut out = [0xa5u8; 36];
    assert_eq!(p.emit(&mut out), Ok(36));
    bytes[12..15].fill(0);
    bytes[15] = 0x11;
    assert_eq!(out[..], bytes[..]);
    // Without its FETH, or with a field too wide for its bits, a FLUSH does not emit.
    let no_feth = PacketRepr { feth: None, ..want };
    assert!(no_feth.emit(&mut out).is_err());
    let wide = PacketRepr {
        feth: Some(feth::Repr {
            selectivity_level: 4,
            placement_type: 0,
        }),
        ..want
    };
    assert!(wide.emit(&mut out).is_err());
}
