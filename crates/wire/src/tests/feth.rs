use super::*;

// Selectivity level 1 (whole region), placement type 3 (global visibility + persistence),
// reserved bits not zero.
const BYTES: [u8; LEN] = [0xa5, 0x5a, 0x0f, 0xd3];

#[test]
fn parse_bytes_ignores_reserved() {
    let h = Header::new_checked(&BYTES[..]).unwrap();
    assert_eq!(h.selectivity_level(), 1);
    assert_eq!(h.placement_type(), 3);
    assert_eq!(h.reserved(), 0xa55a_0fd3 >> 6);
    assert_eq!(
        Repr::parse(&h).unwrap(),
        Repr {
            selectivity_level: SELECTIVITY_REGION,
            placement_type: PLACEMENT_GLOBAL_VISIBILITY | PLACEMENT_PERSISTENCE,
        }
    );
}

#[test]
fn emit_zeroes_reserved() {
    let mut buf = [0xffu8; LEN];
    let r = Repr {
        selectivity_level: 1,
        placement_type: 3,
    };
    r.validate().unwrap();
    r.emit(&mut Header::new_unchecked(&mut buf[..]));
    assert_eq!(buf, [0x00, 0x00, 0x00, 0x13]);
    assert_eq!(r.buffer_len(), 4);
    assert_eq!(Repr::parse(&Header::new_unchecked(&buf[..])), Ok(r));
}

#[test]
fn every_field_value_round_trips() {
    for selectivity_level in 0..=3 {
        for placement_type in 0..=15 {
            let r = Repr {
                selectivity_level,
                placement_type,
            };
            let mut buf = [0u8; LEN];
            r.emit(&mut Header::new_unchecked(&mut buf[..]));
            assert_eq!(buf[..3], [0, 0, 0]);
            assert_eq!(buf[3], selectivity_level << 4 | placement_type);
            assert_eq!(Repr::parse(&Header::new_unchecked(&buf[..])), Ok(r));
        }
    }
}

#[test]
fn setters_touch_only_their_bits() {
    let mut buf = [0u8; LEN];
    let mut h = Header::new_unchecked(&mut buf[..]);
    h.set_reserved(0x03ff_ffff);
    h.set_placement_type(0xff);
    h.set_selectivity_level(0xff);
    assert_eq!(buf, [0xff; LEN]);
    let mut h = Header::new_unchecked(&mut buf[..]);
    h.set_selectivity_level(0);
    assert_eq!(buf, [0xff, 0xff, 0xff, 0xcf]);
    let mut h = Header::new_unchecked(&mut buf[..]);
    h.set_placement_type(0);
    h.set_reserved(0);
    assert_eq!(buf, [0, 0, 0, 0]);
}

#[test]
fn validate_rejects_values_too_wide() {
    let bad_sel = Repr {
        selectivity_level: 4,
        placement_type: 0,
    };
    assert_eq!(
        bad_sel.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Feth,
            field: "selectivity_level",
            value: 4,
        })
    );
    let bad_plt = Repr {
        selectivity_level: 0,
        placement_type: 0x10,
    };
    assert_eq!(
        bad_plt.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Feth,
            field: "placement_type",
            value: 0x10,
        })
    );
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::Feth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
        assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
    }
}
