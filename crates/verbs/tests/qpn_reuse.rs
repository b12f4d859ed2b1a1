//! Check 5: a destroyed QP's number is not handed out again until the 24-bit space wraps.
mod common;

use common::*;
use uroce_verbs::{Context, Cq, Pd, Qp, QpInitAttr, QpType};

const FIRST_QPN: u32 = 16; // INTEROP-NOTES §8: QPN allocation starts at 16
const LAST_QPN: u32 = 0x00ff_ffff;

fn new_qp(pd: &Pd, cq: &Cq) -> Qp {
    pd.create_qp(&QpInitAttr::new(QpType::Ud, cq, cq, caps(1)))
        .expect("qp")
}

fn setup() -> (Context, Pd, Cq) {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    (ctx, pd, cq)
}

#[test]
fn destroy_then_create_never_returns_the_freed_number() {
    let (_ctx, pd, cq) = setup();
    let first = new_qp(&pd, &cq);
    assert_eq!(first.qp_num(), FIRST_QPN);
    let mut prev = first.qp_num();
    first.destroy().expect("destroy");
    for _ in 0..2000 {
        let qp = new_qp(&pd, &cq);
        let n = qp.qp_num();
        assert_ne!(n, prev, "the number just freed");
        assert!(
            n > prev,
            "numbers strictly advance before the wrap: {n:#x} after {prev:#x}"
        );
        prev = n;
        qp.destroy().expect("destroy");
    }
    // The GSI QP takes the reserved number 1 and does not disturb the sequence.
    let gsi = pd
        .create_qp(&QpInitAttr::new(QpType::Gsi, &cq, &cq, caps(1)))
        .expect("gsi");
    assert_eq!(gsi.qp_num(), 1);
    assert_eq!(new_qp(&pd, &cq).qp_num(), prev + 1);
}

#[test]
fn wrap_skips_numbers_in_use_and_never_the_just_freed_one() {
    let (ctx, pd, cq) = setup();
    let a = new_qp(&pd, &cq);
    let b = new_qp(&pd, &cq);
    assert_eq!((a.qp_num(), b.qp_num()), (FIRST_QPN, FIRST_QPN + 1));
    ctx.set_qpn_cursor(LAST_QPN - 1);
    let c = new_qp(&pd, &cq);
    let d = new_qp(&pd, &cq);
    assert_eq!((c.qp_num(), d.qp_num()), (LAST_QPN - 1, LAST_QPN));
    // Wrap: 16 and 17 are in use, so 18.
    let e = new_qp(&pd, &cq);
    assert_eq!(e.qp_num(), FIRST_QPN + 2);
    // Free the top number; the cursor is past it, so it is not reused.
    let freed = d.qp_num();
    d.destroy().expect("destroy");
    let f = new_qp(&pd, &cq);
    assert_eq!(f.qp_num(), FIRST_QPN + 3);
    assert_ne!(f.qp_num(), freed);
    // Only after going around the whole space does it come back: move the cursor there.
    ctx.set_qpn_cursor(LAST_QPN - 1);
    let g = new_qp(&pd, &cq);
    assert_eq!(
        g.qp_num(),
        LAST_QPN,
        "LAST_QPN-1 is in use (c), LAST_QPN is free again"
    );
    drop((a, b, c, e, f, g));
}

#[test]
fn a_late_lookup_of_an_old_qpn_finds_nothing() {
    let (ctx, pd, cq) = setup();
    let old = new_qp(&pd, &cq);
    let old_qpn = old.qp_num();
    old.destroy().expect("destroy");
    let new = new_qp(&pd, &cq);
    assert_ne!(new.qp_num(), old_qpn);
    assert!(
        ctx.qp_for_packet(old_qpn).is_none(),
        "a late packet for the old QP is dropped"
    );
    assert_eq!(ctx.counters().unknown_qpn_drops, 1);
    let found = ctx.qp_for_packet(new.qp_num()).expect("new QP");
    assert!(found.same_qp(&new));
}

#[test]
fn a_device_allots_only_from_its_configured_range() {
    // A member of a host-wide device: the numbers of slot 3 (0x030000..=0x03ffff).
    let mut cfg = uroce_verbs::DeviceConfig::new("uroce0", "127.0.0.1".parse().expect("ip"));
    cfg.qpn_range = 0x03_0000..=0x03_ffff;
    let ctx = Context::open(&uroce_verbs::Device::new(cfg).expect("device")).expect("context");
    assert_eq!(ctx.device().qpn_range(), 0x03_0000..=0x03_ffff);
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    let a = new_qp(&pd, &cq);
    assert_eq!(a.qp_num(), 0x03_0000);
    ctx.set_qpn_cursor(0x03_ffff);
    let b = new_qp(&pd, &cq);
    assert_eq!(b.qp_num(), 0x03_ffff);
    // The wrap stays in the range; the GSI QP keeps number 1.
    assert_eq!(new_qp(&pd, &cq).qp_num(), 0x03_0001);
    let gsi = pd
        .create_qp(&QpInitAttr::new(QpType::Gsi, &cq, &cq, caps(1)))
        .expect("gsi");
    assert_eq!(gsi.qp_num(), 1);
}
