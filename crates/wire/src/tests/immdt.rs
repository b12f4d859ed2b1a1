use super::*;

const BYTES: [u8; LEN] = [0xca, 0xfe, 0x00, 0x01];

#[test]
fn parse_bytes_big_endian() {
    let h = Header::new_checked(&BYTES[..]).unwrap();
    assert_eq!(h.imm(), 0xcafe_0001);
    assert_eq!(Repr::parse(&h).unwrap(), Repr { imm: 0xcafe_0001 });
}

#[test]
fn emit_bytes() {
    let mut buf = [0u8; LEN];
    let r = Repr { imm: 0xcafe_0001 };
    r.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, BYTES);
    assert_eq!(r.buffer_len(), 4);
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::ImmDt,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
    }
}
