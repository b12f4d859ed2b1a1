//! A QP moved to RESET takes its queued completions off its CQs (flush completions from
//! an earlier ERR included); another QP's completions on the same CQ stay, in order.
mod common;

use common::*;
use uroce_verbs::{AttrMask, QpAttr, QpInitAttr, QpState, QpType, RecvWr};

#[test]
fn reset_removes_only_that_qps_completions() {
    let (ctx, lo) = loopback_context();
    let cq = cq(&ctx, 32);
    let pd = ctx.alloc_pd().expect("pd");
    let make = || {
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(16)))
            .expect("qp");
        let sender = sender_to(&ctx, &lo, &pd, &qp, QpState::Rtr);
        for id in 0..4 {
            qp.post_recv(RecvWr::new(id, vec![])).expect("post");
        }
        (qp, sender)
    };
    let ((a, to_a), (b, to_b)) = (make(), make());
    // One message each way completes one receive: A, B, A.
    to_a.send_empty(&ctx);
    to_b.send_empty(&ctx);
    to_a.send_empty(&ctx);
    // A goes to ERR: its two remaining receives are flushed onto the CQ.
    to_err(&a);
    assert_eq!(cq.len(), 3 + 2);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    a.modify(&reset, AttrMask::STATE).expect("to RESET");
    let left: Vec<(u32, u64)> = cq.poll(32).iter().map(|wc| (wc.qp_num, wc.wr_id)).collect();
    assert_eq!(left, vec![(b.qp_num(), 0)], "only B's completion remains");
}
