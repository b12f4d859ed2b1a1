use super::*;

#[test]
fn masks_to_24_bits() {
    assert_eq!(Psn::new(0x0123_4567).value(), 0x23_4567);
    assert_eq!(Psn::new(u32::MAX), Psn::MAX);
}

#[test]
fn wraps_forward_and_backward() {
    assert_eq!(Psn::MAX + 1, Psn::ZERO);
    assert_eq!(Psn::MAX + 5, Psn::new(4));
    assert_eq!(Psn::ZERO - 1, Psn::MAX);
    assert_eq!(Psn::new(3) - 10, Psn::new(0xff_fff9));
}

#[test]
fn ordering_across_the_wrap() {
    let near_end = Psn::new(0xff_fff0);
    let after_wrap = Psn::new(0x10);
    assert!(after_wrap.is_after(near_end));
    assert!(near_end.is_before(after_wrap));
    assert_eq!(after_wrap.diff(near_end), 0x20);
    assert_eq!(near_end.diff(after_wrap), -0x20);
    assert!(!near_end.is_after(near_end));
    assert!(near_end.is_at_or_after(near_end));
}

#[test]
fn half_space_boundary() {
    let a = Psn::ZERO;
    // 2^23 - 1 ahead is still "after"; 2^23 ahead reads as the far past.
    assert!(Psn::new((1 << 23) - 1).is_after(a));
    assert!(Psn::new(1 << 23).is_before(a));
    assert_eq!(Psn::new(1 << 23).diff(a), -(1 << 23));
}
