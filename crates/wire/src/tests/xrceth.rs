use super::*;

// Reserved 0x5a (ignored), SRQ number 0x123456, by hand.
const BYTES: [u8; LEN] = [0x5a, 0x12, 0x34, 0x56];

#[test]
fn parse_bytes() {
    let h = Header::new_checked(&BYTES[..]).unwrap();
    assert_eq!(h.reserved(), 0x5a);
    assert_eq!(h.srqn(), 0x12_3456);
    assert_eq!(Repr::parse(&h).unwrap(), Repr { srqn: 0x12_3456 });
}

#[test]
fn emit_bytes() {
    let mut buf = [0xffu8; LEN];
    let r = Repr { srqn: 0x12_3456 };
    r.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, [0x00, 0x12, 0x34, 0x56]);
    assert_eq!(r.buffer_len(), 4);
}

#[test]
fn validate_rejects_wide_srqn() {
    assert_eq!(
        Repr { srqn: 0xff00_0000 }.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::XrcEth,
            field: "srqn",
            value: 0xff00_0000
        })
    );
    assert!(Repr { srqn: 0xff_ffff }.validate().is_ok());
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::XrcEth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
    }
}
