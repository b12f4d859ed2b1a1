use super::*;

/// The BTH of the IPv4 test vector of docs/INTEROP-NOTES.md §3 (RC SEND_ONLY, PadCnt 3,
/// P_Key 0xFFFF, DestQP 0x11, AckReq, PSN 0x64), followed by "hello" and 3 pad bytes.
const VECTOR: [u8; 20] = [
    0x04, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x64, b'h', b'e', b'l', b'l',
    b'o', 0x00, 0x00, 0x00,
];

/// Every flag set, by hand: SE|M|PadCnt=2 = 0xE0; FECN|BECN = 0xC0; A = 0x80.
const ALL_SET: [u8; 12] = [
    0x0b, 0xe0, 0x7f, 0xff, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0xfe, 0xdc, 0xba,
];

fn all_set_repr() -> Repr {
    Repr {
        opcode: 0x0b,
        solicited: true,
        mig_req: true,
        pad_cnt: 2,
        pkey: 0x7fff,
        fecn: true,
        becn: true,
        dest_qp: 0xab_cdef,
        ack_req: true,
        psn: Psn::new(0xfe_dcba),
    }
}

#[test]
fn parse_spec_vector() {
    let h = Header::new_checked(&VECTOR[..]).unwrap();
    let r = Repr::parse(&h).unwrap();
    assert_eq!(
        r,
        Repr {
            opcode: 0x04,
            solicited: false,
            mig_req: false,
            pad_cnt: 3,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: Psn::new(0x64),
        }
    );
    assert_eq!(h.payload(), b"hello\0\0\0");
}

#[test]
fn deconstruct_all_flags() {
    let h = Header::new_checked(&ALL_SET[..]).unwrap();
    assert_eq!(h.opcode(), 0x0b);
    assert!(h.solicited() && h.mig_req() && h.fecn() && h.becn() && h.ack_req());
    assert_eq!(h.pad_cnt(), 2);
    assert_eq!(h.tver(), 0);
    assert_eq!(h.pkey(), 0x7fff);
    assert_eq!(h.dest_qp(), 0xab_cdef);
    assert_eq!(h.psn(), Psn::new(0xfe_dcba));
    assert_eq!(Repr::parse(&h).unwrap(), all_set_repr());
}

#[test]
fn emit_all_flags() {
    let mut buf = [0x55u8; LEN];
    all_set_repr().emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, ALL_SET);
}

#[test]
fn emit_spec_vector_bth() {
    let mut buf = [0xaau8; LEN];
    let r = Repr {
        opcode: 0x04,
        solicited: false,
        mig_req: false,
        pad_cnt: 3,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: 0x11,
        ack_req: true,
        psn: Psn::new(0x64),
    };
    r.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf[..], VECTOR[..LEN]);
}

#[test]
fn construct_with_setters() {
    let mut buf = [0u8; LEN];
    let mut h = Header::new_unchecked(&mut buf[..]);
    h.set_opcode(0x0b);
    h.set_solicited(true);
    h.set_mig_req(true);
    h.set_pad_cnt(2);
    h.set_pkey(0x7fff);
    h.set_fecn(true);
    h.set_becn(true);
    h.set_dest_qp(0xab_cdef);
    h.set_ack_req(true);
    h.set_psn(Psn::new(0xfe_dcba));
    assert_eq!(buf, ALL_SET);
}

#[test]
fn nonzero_tver_is_rejected() {
    let mut bytes = VECTOR;
    bytes[1] = 0x31; // PadCnt 3, TVer 1
    let h = Header::new_checked(&bytes[..]).unwrap();
    assert_eq!(Repr::parse(&h), Err(WireError::BadTver(1)));
    bytes[1] = 0x0f;
    let h = Header::new_checked(&bytes[..]).unwrap();
    assert_eq!(Repr::parse(&h), Err(WireError::BadTver(15)));
}

#[test]
fn reserved_bits_are_ignored_on_parse_and_cleared_on_emit() {
    let mut bytes = ALL_SET;
    bytes[4] = 0xff; // FECN, BECN and all of Resv6
    bytes[8] = 0xff; // A and all of Resv7
    let h = Header::new_checked(&bytes[..]).unwrap();
    assert_eq!(h.resv6(), 0x3f);
    assert_eq!(h.resv7(), 0x7f);
    let r = Repr::parse(&h).unwrap();
    assert_eq!(r, all_set_repr());
    let mut out = [0u8; LEN];
    r.emit(&mut Header::new_unchecked(&mut out[..]));
    assert_eq!(out, ALL_SET);
}

#[test]
fn emit_masks_out_of_range_fields_and_validate_rejects_them() {
    let mut r = all_set_repr();
    r.dest_qp = 0x0100_0001;
    r.pad_cnt = 7;
    assert_eq!(
        r.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Bth,
            field: "pad_cnt",
            value: 7
        })
    );
    r.pad_cnt = 3;
    assert_eq!(
        r.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Bth,
            field: "dest_qp",
            value: 0x0100_0001
        })
    );
    let mut out = [0u8; LEN];
    r.emit(&mut Header::new_unchecked(&mut out[..]));
    assert_eq!(out[1], 0xf0); // SE | M | PadCnt 3, TVer 0
    assert_eq!(out[5..8], [0x00, 0x00, 0x01]);
    assert!(all_set_repr().validate().is_ok());
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = Header::new_checked(&VECTOR[..len]).unwrap_err();
        assert_eq!(
            err,
            WireError::Truncated {
                header: HeaderKind::Bth,
                offset: 0,
                needed: LEN,
                available: len
            }
        );
        let unchecked = Header::new_unchecked(&VECTOR[..len]);
        assert_eq!(Repr::parse(&unchecked), Err(err));
    }
}

#[test]
fn unchecked_short_view_does_not_panic() {
    let mut short = [0u8; 5];
    let mut h = Header::new_unchecked(&mut short[..]);
    h.set_psn(Psn::new(5));
    h.set_dest_qp(0x12_3456);
    all_set_repr().emit(&mut h);
    assert_eq!(h.psn(), Psn::ZERO);
    assert!(h.payload().is_empty());
    assert_eq!(h.payload_mut().len(), 0);
}
