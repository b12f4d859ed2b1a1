use super::*;

#[test]
fn truncated_message_names_header_and_offset() {
    let e = WireError::Truncated {
        header: HeaderKind::Reth,
        offset: 12,
        needed: 16,
        available: 3,
    };
    assert_eq!(e.to_string(), "truncated RETH at byte 12: need 16, have 3");
}

#[test]
fn header_mismatch_message_says_which_way() {
    let extra = WireError::HeaderMismatch {
        opcode: 0x04,
        header: HeaderKind::Deth,
        present: true,
    };
    let missing = WireError::HeaderMismatch {
        opcode: 0x64,
        header: HeaderKind::Deth,
        present: false,
    };
    assert_eq!(
        extra.to_string(),
        "opcode 0x04: DETH present but not allowed"
    );
    assert_eq!(
        missing.to_string(),
        "opcode 0x64: DETH required but missing"
    );
}

#[test]
fn field_helpers_do_not_panic_on_short_buffers() {
    let short = [0xAAu8, 0xBB];
    assert_eq!(field::u32_at(&short, 0), 0);
    assert_eq!(field::u16_at(&short, 0), 0xAABB);
    assert_eq!(field::u8_at(&short, 5), 0);
    assert_eq!(field::u64_at(&short, usize::MAX), 0);
    let mut buf = [0u8; 3];
    field::set_u32(&mut buf, 0, 0x1122_3344);
    assert_eq!(buf, [0, 0, 0]);
    field::set_u24(&mut buf, 0, 0xFF12_3456);
    assert_eq!(buf, [0x12, 0x34, 0x56]);
    assert_eq!(field::u24_at(&buf, 0), 0x12_3456);
}
