//! SRQ posting, the one-shot limit event and re-arming, XRC SRQs.
mod common;

use common::*;
use uroce_verbs::{
    EventType, ModifySrqError, PostError, QpInitAttr, QpState, QpType, RecvWr, SendWr, Sge,
    SrqAttr, SrqAttrMask, SrqInitAttr, WcStatus,
};

fn limit_events(ctx: &uroce_verbs::Context) -> usize {
    std::iter::from_fn(|| ctx.try_get_async_event())
        .inspect(|e| assert_eq!(e.event_type(), EventType::SrqLimitReached))
        .count()
}

#[test]
fn limit_event_fires_once_and_rearms() {
    let (ctx, lo) = loopback_context();
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
    // RTS: the first message raises no COMM_EST (only SRQ events are expected below).
    let sender = sender_to(&ctx, &lo, &pd, &qp, QpState::Rts);

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
        sender.send_empty(&ctx);
    }
    assert_eq!(limit_events(&ctx), 0);
    // 5 → 4: below 5, fires.
    sender.send_empty(&ctx);
    let ev = ctx.try_get_async_event().expect("SRQ_LIMIT_REACHED");
    assert_eq!(ev.event_type(), EventType::SrqLimitReached);
    assert_eq!(ev.srq().expect("srq").srq_num(), srq.srq_num());
    drop(ev);
    assert_eq!(srq.query().srq_limit, 0, "one-shot: limit reset");
    sender.send_empty(&ctx);
    assert_eq!(limit_events(&ctx), 0, "not raised again");
    // Re-arm above the current count (3): fires on the next take.
    arm(4).expect("re-arm");
    sender.send_empty(&ctx);
    assert_eq!(limit_events(&ctx), 1);
    // Completions of SRQ WQEs go to the QP's receive CQ with the WQE's wr_id, in order.
    let wcs = cq.poll(16);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(),
        (0..8).map(|id| (id, qp.qp_num())).collect::<Vec<_>>()
    );
}

#[test]
fn limit_armed_at_creation() {
    let (ctx, lo) = loopback_context();
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
    let cq = cq(&ctx, 8);
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8));
    init.srq = Some(&srq);
    let qp = pd.create_qp(&init).expect("qp");
    let sender = sender_to(&ctx, &lo, &pd, &qp, QpState::Rts);
    sender.send_empty(&ctx);
    assert_eq!(cq.poll(4)[0].wr_id, 1);
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
    let lo = Loopback::install(&ctx);
    let scq = common::cq(&ctx, 8);
    // An XRC initiator QP sending to target QP `tgt`, connected both ways.
    let initiator = |tgt: &uroce_verbs::QpRef| {
        let ini = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::XrcSend,
                send_cq: Some(&scq),
                recv_cq: None,
                srq: None,
                cap: caps(4),
                sq_sig_all: false,
            })
            .expect("XRC_SEND");
        rc_connect(tgt, ini.qp_num(), QpState::Rtr);
        rc_connect(&ini, tgt.qp_num(), QpState::Rts);
        ini
    };
    let to_srq = |srqn: u32| SendWr {
        xrc_remote_srqn: srqn,
        ..SendWr::send(7, vec![])
    };
    let tgt = xrcd.create_qp().expect("target");
    let ini = initiator(&tgt);
    ini.post_send(to_srq(srq.srq_num())).expect("post");
    lo.progress(&ctx);
    let wcs = cq.poll(4);
    assert_eq!(wcs.len(), 1, "completion on the XRC SRQ's CQ");
    assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (42, tgt.qp_num()));
    assert_eq!(scq.poll(4)[0].status, WcStatus::Success);
    // An SRQ of another domain: an invalid request (Annex A14), nothing is taken from it.
    foreign.post_recv(RecvWr::new(43, vec![])).expect("post");
    ini.post_send(to_srq(foreign.srq_num())).expect("post");
    lo.progress(&ctx);
    assert_eq!(
        tgt.engine_counters().expect("engine").bad_xrc_srqn,
        1,
        "other domain"
    );
    assert_eq!(tgt.state(), QpState::Err);
    assert_eq!(scq.poll(4)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(foreign.len(), 1, "the foreign SRQ keeps its WQE");
    // An unknown SRQ number, on a second target.
    let tgt2 = xrcd.create_qp().expect("target");
    let ini2 = initiator(&tgt2);
    ini2.post_send(to_srq(0x00ff_fff0)).expect("post");
    lo.progress(&ctx);
    assert_eq!(
        tgt2.engine_counters().expect("engine").bad_xrc_srqn,
        1,
        "unknown SRQ"
    );
    assert_eq!(scq.poll(4)[0].status, WcStatus::RemInvReqErr);
    // Only the one good message completed on the XRC SRQ's CQ (foreign's CQ is the same:
    // its WQE was never taken).
    assert!(cq
        .poll(4)
        .iter()
        .all(|w| w.status == WcStatus::WrFlushErr || w.wr_id != 43));
    drop((ini, ini2, tgt2));
    let num = srq.srq_num();
    tgt.destroy().expect("tgt");
    srq.destroy().expect("srq");
    assert!(ctx.srq_for_packet(num).is_none());
    assert!(ctx.counters().unknown_srqn_drops >= 1);
}
