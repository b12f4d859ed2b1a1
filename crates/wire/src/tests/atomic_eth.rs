use super::*;

// By hand: VA 0x1000, R_Key 0xdeadbeef, swap 0x0102030405060708,
// compare 0xf0e0d0c0b0a09080, packed back to back.
const BYTES: [u8; LEN] = [
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // va
    0xde, 0xad, 0xbe, 0xef, // rkey
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // swap/add
    0xf0, 0xe0, 0xd0, 0xc0, 0xb0, 0xa0, 0x90, 0x80, // compare
];
const REPR: Repr = Repr {
    va: 0x1000,
    rkey: 0xdead_beef,
    swap_add: 0x0102_0304_0506_0708,
    compare: 0xf0e0_d0c0_b0a0_9080,
};

#[test]
fn parse_bytes() {
    let h = Header::new_checked(&BYTES[..]).unwrap();
    assert_eq!(h.va(), 0x1000);
    assert_eq!(h.rkey(), 0xdead_beef);
    assert_eq!(h.swap_add(), 0x0102_0304_0506_0708);
    assert_eq!(h.compare(), 0xf0e0_d0c0_b0a0_9080);
    assert_eq!(Repr::parse(&h).unwrap(), REPR);
}

#[test]
fn emit_bytes() {
    let mut buf = [0u8; LEN];
    REPR.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, BYTES);
    assert_eq!(REPR.buffer_len(), 28);
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::AtomicEth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
    }
}
