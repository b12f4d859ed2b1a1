//! Check 3: moving to ERR flushes every outstanding WR with WR_FLUSH_ERR, in order.
mod common;

use common::*;
use uroce_verbs::{
    AttrMask, EventType, QpAttr, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendWr,
    SrqInitAttr, WcOpcode, WcStatus, WorkCompletion,
};

fn check_flushed(wcs: &[WorkCompletion], ids: &[u64], qpn: u32, opcode: WcOpcode) {
    assert_eq!(wcs.len(), ids.len(), "exactly one completion per WR");
    for (wc, id) in wcs.iter().zip(ids) {
        assert_eq!(wc.wr_id, *id, "posting order");
        assert_eq!(wc.status, WcStatus::WrFlushErr);
        assert_eq!(wc.qp_num, qpn);
        assert_eq!(wc.opcode, opcode);
    }
}

#[test]
fn n_sends_and_recvs_flush_exactly_n_in_order() {
    for n in [0u64, 1, 7, 64] {
        let ctx = context();
        let pd = ctx.alloc_pd().expect("pd");
        let scq = cq(&ctx, 128);
        let rcq = cq(&ctx, 128);
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &scq, &rcq, caps(64)))
            .expect("qp");
        rc_to(&qp, QpState::Rts);
        let send_ids: Vec<u64> = (0..n).map(|i| 1000 + i).collect();
        let recv_ids: Vec<u64> = (0..n).map(|i| 5000 + 3 * i).collect();
        for (i, id) in send_ids.iter().enumerate() {
            // Mix signaled and unsignaled: flush errors are reported for both (IBA §11.6.2).
            let mut wr = SendWr::send(*id, vec![]);
            if i % 3 == 0 {
                wr.flags = SendFlags::empty();
            }
            qp.post_send(wr).expect("post send");
        }
        for id in &recv_ids {
            qp.post_recv(RecvWr::new(*id, vec![])).expect("post recv");
        }
        // Start a few sends so that in-flight WRs are part of the flush too.
        for _ in 0..n.min(3) {
            qp.next_send_wqe().expect("start");
        }
        to_err(&qp);
        let sent = scq.poll(1000);
        let recvd = rcq.poll(1000);
        check_flushed(&sent, &send_ids, qp.qp_num(), WcOpcode::Send);
        check_flushed(&recvd, &recv_ids, qp.qp_num(), WcOpcode::Recv);
        assert_eq!(qp.send_queue_len(), 0);
        assert_eq!(qp.recv_queue_len(), 0);

        // WRs posted in ERR are flushed immediately.
        qp.post_send(SendWr {
            flags: SendFlags::empty(),
            ..SendWr::send(77, vec![])
        })
        .expect("post in ERR");
        qp.post_recv(RecvWr::new(78, vec![])).expect("post in ERR");
        check_flushed(&scq.poll(10), &[77], qp.qp_num(), WcOpcode::Send);
        check_flushed(&rcq.poll(10), &[78], qp.qp_num(), WcOpcode::Recv);
        assert!(
            ctx.try_get_async_event().is_none(),
            "no SRQ: no LAST_WQE_REACHED"
        );
    }
}

#[test]
fn flush_keeps_opcodes_and_uses_engine_error_path() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8)))
        .expect("qp");
    rc_to(&qp, QpState::Rts);
    let write = SendWr {
        opcode: uroce_verbs::SendOpcode::RdmaWrite,
        ..SendWr::send(1, vec![])
    };
    qp.post_send(write).expect("write");
    qp.post_send(SendWr::send(2, vec![])).expect("send");
    qp.next_send_wqe().expect("start");
    // The engine completes the first WR in error and moves the QP to ERR.
    let wc = qp
        .complete_send(WcStatus::RetryExcErr)
        .expect("complete")
        .expect("error CQE");
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    qp.enter_error(Some(EventType::QpFatal))
        .expect("enter error");
    let wcs = cq.poll(10);
    assert_eq!(wcs.len(), 2);
    assert_eq!((wcs[0].wr_id, wcs[0].opcode), (1, WcOpcode::RdmaWrite));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(qp.state(), QpState::Err);
    let ev = ctx.try_get_async_event().expect("QP_FATAL");
    assert_eq!(ev.event_type(), EventType::QpFatal);
}

#[test]
fn srq_attached_qp_raises_last_wqe_reached_and_srq_keeps_wqes() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 64);
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 32,
            max_sge: 2,
            srq_limit: 0,
        })
        .expect("srq");
    for id in 0..10 {
        srq.post_recv(RecvWr::new(id, vec![])).expect("post srq");
    }
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8));
    init.srq = Some(&srq);
    let qp = pd.create_qp(&init).expect("qp");
    assert_eq!(qp.query().1.cap.max_recv_wr, 0, "no RQ of its own");
    assert_eq!(qp.query().1.srq_num, Some(srq.srq_num()));
    assert!(matches!(
        qp.post_recv(RecvWr::new(1, vec![])),
        Err(uroce_verbs::PostError::SrqAttached)
    ));
    rc_to(&qp, QpState::Rtr);
    // The responder took two WQEs and is in the middle of them.
    assert_eq!(qp.take_recv_wqe().expect("wqe").wr_id, 0);
    assert_eq!(
        qp.take_recv_wqe().expect("wqe").srq_num,
        Some(srq.srq_num())
    );
    to_err(&qp);
    // The taken WQEs are flushed on the QP's CQ; the SRQ keeps the other eight.
    let wcs = cq.poll(64);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![0, 1]);
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(srq.len(), 8);
    let ev = ctx.try_get_async_event().expect("LAST_WQE_REACHED");
    assert_eq!(ev.event_type(), EventType::QpLastWqeReached);
    assert!(ev.qp().expect("qp").same_qp(&qp));
    drop(ev);
    assert!(ctx.try_get_async_event().is_none(), "raised once");
    // A second QP on the same SRQ still gets the remaining WQEs.
    let qp2 = pd.create_qp(&init).expect("qp2");
    rc_to(&qp2, QpState::Rtr);
    assert_eq!(qp2.take_recv_wqe().expect("wqe").wr_id, 2);
}

#[test]
fn reset_discards_without_completions() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8)))
        .expect("qp");
    rc_to(&qp, QpState::Rts);
    qp.post_send(SendWr::send(1, vec![])).expect("post");
    qp.post_recv(RecvWr::new(2, vec![])).expect("post");
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    qp.modify(&reset, AttrMask::STATE).expect("RESET");
    assert!(cq.is_empty());
    rc_to(&qp, QpState::Rts);
    to_err(&qp);
    assert!(cq.is_empty(), "nothing left to flush after RESET");
}

#[test]
fn flush_into_a_small_cq_overruns_once() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8)))
        .expect("qp");
    rc_to(&qp, QpState::Init);
    for id in 0..6 {
        qp.post_recv(RecvWr::new(id, vec![])).expect("post");
    }
    to_err(&qp);
    assert!(cq.is_overrun());
    let ev = ctx.try_get_async_event().expect("CQ_ERR");
    assert_eq!(ev.event_type(), EventType::CqErr);
    assert!(ev.cq().expect("cq").same_cq(&cq));
    drop(ev);
    assert!(ctx.try_get_async_event().is_none(), "CQ_ERR raised once");
    let wcs = cq.poll(10);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
}
