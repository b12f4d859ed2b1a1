//! Completion timestamps: a CQ that asked for them stamps each completion when it is
//! pushed (inside the window of clock reads around the push), the stamps stay with their
//! completions through `poll`, `poll_into`, `poll_stamped` and the RESET purge, and a CQ
//! that did not ask returns none.
mod common;

use common::*;
use uroce_verbs::{AttrMask, Clocks, QpAttr, QpInitAttr, QpState, QpType, RecvWr, WorkCompletion};

fn now(c: rustix::time::ClockId) -> u64 {
    let t = rustix::time::clock_gettime(c);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[test]
fn stamps_follow_their_completions() {
    let (ctx, lo) = loopback_context();
    let cq = cq(&ctx, 64);
    assert!(cq.enable_timestamps(Clocks::MONOTONIC | Clocks::REALTIME));
    let pd = ctx.alloc_pd().expect("pd");
    let make = || {
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(32)))
            .expect("qp");
        let sender = sender_to(&ctx, &lo, &pd, &qp, QpState::Rtr);
        for id in 0..16 {
            qp.post_recv(RecvWr::new(id, vec![])).expect("post");
        }
        (qp, sender)
    };
    let ((a, to_a), (b, to_b)) = (make(), make());
    // Windows of A's and B's completions, in push order: a0 b0 a1 b1 a2 b2.
    let mut windows = Vec::new();
    for _ in 0..3 {
        for (qp, sender) in [(&a, &to_a), (&b, &to_b)] {
            let m0 = now(rustix::time::ClockId::Monotonic);
            let r0 = now(rustix::time::ClockId::Realtime);
            sender.send_empty(&ctx);
            let m1 = now(rustix::time::ClockId::Monotonic);
            let r1 = now(rustix::time::ClockId::Realtime);
            windows.push((qp.qp_num(), (m0, m1), (r0, r1)));
        }
    }
    // a0 through the plain poll (its stamp is dropped with it).
    let mut one = [WorkCompletion::default()];
    assert_eq!(cq.poll_into(&mut one), 1);
    assert_eq!(one[0].qp_num, a.qp_num());
    // A to RESET: a1 and a2 leave; b0, b1, b2 stay with their own stamps.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    a.modify(&reset, AttrMask::STATE).expect("to RESET");
    let bw: Vec<_> = windows.iter().filter(|w| w.0 == b.qp_num()).collect();
    let mut last = 0;
    for (i, w) in bw.iter().enumerate() {
        let (wc, stamp) = cq.poll_stamped().expect("completion");
        let stamp = stamp.expect("stamped");
        assert_eq!((wc.qp_num, wc.wr_id), (b.qp_num(), i as u64));
        assert!(
            (w.1 .0..=w.1 .1).contains(&stamp.monotonic_ns),
            "monotonic {} outside {:?}",
            stamp.monotonic_ns,
            w.1
        );
        assert!(
            (w.2 .0..=w.2 .1).contains(&stamp.realtime_ns),
            "realtime {} outside {:?}",
            stamp.realtime_ns,
            w.2
        );
        assert!(stamp.monotonic_ns >= last);
        last = stamp.monotonic_ns;
    }
    assert!(cq.poll_stamped().is_none());
}

#[test]
fn unstamped_cq_returns_no_stamp_and_late_enable_is_refused() {
    let (ctx, lo) = loopback_context();
    let cq = cq(&ctx, 8);
    let pd = ctx.alloc_pd().expect("pd");
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8)))
        .expect("qp");
    let sender = sender_to(&ctx, &lo, &pd, &qp, QpState::Rtr);
    for id in 0..2 {
        qp.post_recv(RecvWr::new(id, vec![])).expect("post");
    }
    sender.send_empty(&ctx);
    assert!(
        !cq.enable_timestamps(Clocks::MONOTONIC),
        "a CQ holding unstamped completions cannot start stamping"
    );
    let (wc, stamp) = cq.poll_stamped().expect("completion");
    assert_eq!(wc.wr_id, 0);
    assert_eq!(stamp, None);
    assert!(cq.enable_timestamps(Clocks::REALTIME), "empty again");
    sender.send_empty(&ctx);
    let (_, stamp) = cq.poll_stamped().expect("completion");
    let stamp = stamp.expect("stamped now");
    assert_eq!(stamp.monotonic_ns, 0, "only the clock asked for");
    assert!(stamp.realtime_ns > 0);
}
