use super::*;

const BYTES: [u8; LEN] = [0x00, 0x01, 0x23, 0x45];

#[test]
fn parse_bytes() {
    let h = Header::new_checked(&BYTES[..]).unwrap();
    assert_eq!(h.rkey(), 0x0001_2345);
    assert_eq!(Repr::parse(&h).unwrap(), Repr { rkey: 0x0001_2345 });
}

#[test]
fn emit_bytes() {
    let mut buf = [0xffu8; LEN];
    let r = Repr { rkey: 0x0001_2345 };
    r.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, BYTES);
    assert_eq!(r.buffer_len(), 4);
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::Ieth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
    }
}
