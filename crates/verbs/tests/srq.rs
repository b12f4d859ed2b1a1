//! SRQ posting, the one-shot limit event and re-arming, XRC SRQs.
mod common;

use common::*;
use uroce_verbs::{
    EventType, ModifySrqError, PostError, QpInitAttr, QpState, QpType, RecvCompletion, RecvWr, Sge,
    SrqAttr, SrqAttrMask, SrqInitAttr, WcOpcode,
};

fn limit_events(ctx: &uroce_verbs::Context) -> usize {
    std::iter::from_fn(|| ctx.try_get_async_event())
        .inspect(|e| assert_eq!(e.event_type(), EventType::SrqLimitReached))
        .count()
}

#[test]
fn limit_event_fires_once_and_rearms() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 64);
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 16,
            max_sge: 2,
            srq_limit: 0,
        })
        .expect("srq");
    for id in 0..10 {
        srq.post_recv(RecvWr::new(id, vec![])).expect("post");
    }
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8));
    init.srq = Some(&srq);
    let qp = pd.create_qp(&init).expect("qp");
    rc_to(&qp, QpState::Rtr);

    let arm = |limit: u32| {
        srq.modify(
            &SrqAttr {
                srq_limit: limit,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
    };
    arm(5).expect("arm");
    assert_eq!(srq.query().srq_limit, 5);
    // 10 → 5 WQEs: not below the limit yet.
    for _ in 0..5 {
        qp.take_recv_wqe().expect("wqe");
    }
    assert_eq!(limit_events(&ctx), 0);
    // 5 → 4: below 5, fires.
    qp.take_recv_wqe().expect("wqe");
    let ev = ctx.try_get_async_event().expect("SRQ_LIMIT_REACHED");
    assert_eq!(ev.event_type(), EventType::SrqLimitReached);
    assert_eq!(ev.srq().expect("srq").srq_num(), srq.srq_num());
    drop(ev);
    assert_eq!(srq.query().srq_limit, 0, "one-shot: limit reset");
    qp.take_recv_wqe().expect("wqe");
    assert_eq!(limit_events(&ctx), 0, "not raised again");
    // Re-arm above the current count (3): fires on the next take.
    arm(4).expect("re-arm");
    qp.take_recv_wqe().expect("wqe");
    assert_eq!(limit_events(&ctx), 1);
    // Completions of SRQ WQEs go to the QP's receive CQ with the WQE's wr_id, in order.
    let wc = qp
        .complete_recv(&RecvCompletion {
            opcode: WcOpcode::Recv,
            ..RecvCompletion::default()
        })
        .expect("complete");
    assert_eq!(wc.wr_id, 0);
    assert_eq!(cq.poll(4)[0].wr_id, 0);
}

#[test]
fn limit_armed_at_creation() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 2,
        })
        .expect("srq");
    srq.post_recv(RecvWr::new(1, vec![])).expect("post");
    srq.post_recv(RecvWr::new(2, vec![])).expect("post");
    assert_eq!(srq.take_wqe().expect("wqe").wr_id, 1);
    assert_eq!(limit_events(&ctx), 1);
}

#[test]
fn srq_posting_and_modify_limits() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    assert!(
        pd.create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 28,
            srq_limit: 0
        })
        .is_err(),
        "max_srq_sge is 27 (INTEROP-NOTES §8)"
    );
    assert!(pd
        .create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 5
        })
        .is_err());
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .expect("srq");
    let sge = Sge {
        addr: 0,
        length: 1,
        lkey: 1,
    };
    assert!(matches!(
        srq.post_recv(RecvWr::new(1, vec![sge, sge])),
        Err(PostError::TooManySge { num: 2, max: 1 })
    ));
    for id in 0..4 {
        srq.post_recv(RecvWr::new(id, vec![sge])).expect("post");
    }
    assert!(matches!(
        srq.post_recv(RecvWr::new(9, vec![])),
        Err(PostError::QueueFull {
            queue: "SRQ",
            max: 4
        })
    ));
    let bad = SrqAttr {
        srq_limit: 5,
        ..SrqAttr::default()
    };
    assert_eq!(
        srq.modify(&bad, SrqAttrMask::LIMIT),
        Err(ModifySrqError::LimitTooLarge {
            limit: 5,
            max_wr: 4
        })
    );
    let shrink = SrqAttr {
        max_wr: 2,
        ..SrqAttr::default()
    };
    assert!(
        srq.modify(&shrink, SrqAttrMask::MAX_WR).is_err(),
        "4 WQEs queued"
    );
    let grow = SrqAttr {
        max_wr: 8,
        srq_limit: 6,
        ..SrqAttr::default()
    };
    srq.modify(&grow, SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT)
        .expect("grow and arm");
    assert_eq!(
        srq.query(),
        SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 6
        }
    );
}

#[test]
fn xrc_srq_numbers_and_target_qp_receives() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 8);
    let xrcd = ctx.alloc_xrcd().expect("xrcd");
    let other = ctx.alloc_xrcd().expect("xrcd");
    let attr = SrqInitAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = xrcd.create_srq(&pd, &cq, &attr).expect("xrc srq");
    let foreign = other.create_srq(&pd, &cq, &attr).expect("xrc srq");
    assert_ne!(srq.srq_num(), foreign.srq_num());
    assert!(ctx.srq_for_packet(srq.srq_num()).is_some());
    // An XRC SRQ cannot back an ordinary QP.
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4));
    init.srq = Some(&srq);
    assert!(pd.create_qp(&init).is_err());

    srq.post_recv(RecvWr::new(42, vec![])).expect("post");
    let tgt = xrcd.create_qp().expect("target");
    rc_to(&tgt, QpState::Rtr);
    assert!(
        tgt.take_xrc_recv_wqe(foreign.srq_num()).is_err(),
        "other domain"
    );
    assert!(tgt.take_xrc_recv_wqe(0x00ff_fff0).is_err(), "unknown SRQ");
    let wqe = tgt.take_xrc_recv_wqe(srq.srq_num()).expect("wqe");
    assert_eq!(wqe.wr_id, 42);
    tgt.complete_recv(&RecvCompletion::default())
        .expect("complete");
    let wcs = cq.poll(4);
    assert_eq!(wcs.len(), 1, "completion on the XRC SRQ's CQ");
    assert_eq!(wcs[0].qp_num, tgt.qp_num());
    let num = srq.srq_num();
    tgt.destroy().expect("tgt");
    srq.destroy().expect("srq");
    assert!(ctx.srq_for_packet(num).is_none());
    assert!(ctx.counters().unknown_srqn_drops >= 1);
}
