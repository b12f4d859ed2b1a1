use super::*;

// VA 0x0011223344556677, R_Key 0x8899aabb, DMA length 0x00001000 (4096), by hand.
const BYTES: [u8; LEN] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0x00, 0x00, 0x10, 0x00,
];
const REPR: Repr = Repr {
    va: 0x0011_2233_4455_6677,
    rkey: 0x8899_aabb,
    dma_len: 4096,
};

#[test]
fn parse_bytes() {
    let h = Header::new_checked(&BYTES[..]).unwrap();
    assert_eq!(h.va(), 0x0011_2233_4455_6677);
    assert_eq!(h.rkey(), 0x8899_aabb);
    assert_eq!(h.dma_len(), 0x1000);
    assert_eq!(Repr::parse(&h).unwrap(), REPR);
}

#[test]
fn emit_bytes() {
    let mut buf = [0xeeu8; LEN];
    REPR.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, BYTES);
    assert_eq!(REPR.buffer_len(), 16);
}

#[test]
fn longer_buffer_parses_prefix() {
    let mut long = [0u8; LEN + 3];
    long[..LEN].copy_from_slice(&BYTES);
    let h = Header::new_checked(&long[..]).unwrap();
    assert_eq!(Repr::parse(&h).unwrap(), REPR);
    assert_eq!(h.into_inner().len(), LEN + 3);
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::Reth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
    }
}
