use super::*;

// Big-endian 0x8877665544332211, by hand.
const BYTES: [u8; LEN] = [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11];

#[test]
fn parse_bytes() {
    let h = Header::new_checked(&BYTES[..]).unwrap();
    assert_eq!(h.orig(), 0x8877_6655_4433_2211);
    assert_eq!(
        Repr::parse(&h).unwrap(),
        Repr {
            orig: 0x8877_6655_4433_2211
        }
    );
}

#[test]
fn emit_bytes() {
    let mut buf = [0u8; LEN];
    let r = Repr {
        orig: 0x8877_6655_4433_2211,
    };
    r.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, BYTES);
    assert_eq!(r.buffer_len(), 8);
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::AtomicAckEth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
    }
}
