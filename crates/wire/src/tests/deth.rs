use super::*;

// The GSI Q_Key 0x80010000 and SrcQP 1 of a CM MAD (IBA Vol 1 ch. 13, GSI), by hand.
const GSI: [u8; LEN] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
// Q_Key 0x11223344, reserved 0xff (ignored), SrcQP 0xabcdef.
const RESV_SET: [u8; LEN] = [0x11, 0x22, 0x33, 0x44, 0xff, 0xab, 0xcd, 0xef];

#[test]
fn parse_bytes() {
    let h = Header::new_checked(&GSI[..]).unwrap();
    assert_eq!(
        Repr::parse(&h).unwrap(),
        Repr {
            qkey: 0x8001_0000,
            src_qp: 1
        }
    );
    let h = Header::new_checked(&RESV_SET[..]).unwrap();
    assert_eq!(h.reserved(), 0xff);
    assert_eq!(
        Repr::parse(&h).unwrap(),
        Repr {
            qkey: 0x1122_3344,
            src_qp: 0xab_cdef
        }
    );
}

#[test]
fn emit_bytes() {
    let mut buf = [0x77u8; LEN];
    let r = Repr {
        qkey: 0x1122_3344,
        src_qp: 0xab_cdef,
    };
    r.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, [0x11, 0x22, 0x33, 0x44, 0x00, 0xab, 0xcd, 0xef]);
    assert_eq!(r.buffer_len(), 8);
}

#[test]
fn validate_rejects_wide_src_qp() {
    let r = Repr {
        qkey: 0,
        src_qp: 0x0100_0000,
    };
    assert_eq!(
        r.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Deth,
            field: "src_qp",
            value: 0x0100_0000
        })
    );
    assert!(Repr {
        qkey: 0,
        src_qp: 0xff_ffff
    }
    .validate()
    .is_ok());
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::Deth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&GSI[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&GSI[..len])), Err(err));
    }
}
