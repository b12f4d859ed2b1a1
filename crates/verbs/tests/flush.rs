//! Check 3: moving to ERR flushes every outstanding WR with WR_FLUSH_ERR, in order.
mod common;

use std::time::Duration;

use common::*;
use uroce_verbs::{
    AccessFlags, AttrMask, EventType, MemBlock, QpAttr, QpInitAttr, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, SrqInitAttr, WcOpcode, WcStatus, WorkCompletion,
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
        let (ctx, lo) = loopback_context();
        let pd = ctx.alloc_pd().expect("pd");
        let scq = cq(&ctx, 128);
        let rcq = cq(&ctx, 128);
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &scq, &rcq, caps(64)))
            .expect("qp");
        // The peer (rc_to's destination) is not on this device: what is transmitted stays
        // in flight, unacknowledged.
        rc_to(&qp, QpState::Rts);
        let send_ids: Vec<u64> = (0..n).map(|i| 1000 + i).collect();
        let recv_ids: Vec<u64> = (0..n).map(|i| 5000 + 3 * i).collect();
        let post = |i: usize, id: u64| {
            // Mix signaled and unsignaled: flush errors are reported for both (IBA §11.6.2).
            let mut wr = SendWr::send(id, vec![]);
            if i % 3 == 0 {
                wr.flags = SendFlags::empty();
            }
            qp.post_send(wr).expect("post send");
        };
        // A few sends start (are transmitted) so that in-flight WRs are part of the flush
        // too; the rest are still queued.
        let started = send_ids.len().min(3);
        for (i, id) in send_ids.iter().enumerate().take(started) {
            post(i, *id);
        }
        assert_eq!(lo.transmit(&ctx), started);
        for (i, id) in send_ids.iter().enumerate().skip(started) {
            post(i, *id);
        }
        for id in &recv_ids {
            qp.post_recv(RecvWr::new(*id, vec![])).expect("post recv");
        }
        to_err(&qp);
        let sent = scq.poll(1000);
        let recvd = rcq.poll(1000);
        check_flushed(&sent, &send_ids, qp.qp_num(), WcOpcode::Send);
        check_flushed(&recvd, &recv_ids, qp.qp_num(), WcOpcode::Recv);
        assert!(qp.engine_is_idle(), "nothing left queued or in flight");

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

/// The engine's own error path: the first WR (an RDMA WRITE to a peer that never answers)
/// exhausts its retries and completes with RETRY_EXC_ERR, keeping its opcode; the QP is in
/// ERR and the WR behind it is flushed.
#[test]
fn flush_keeps_opcodes_and_uses_engine_error_path() {
    let (ctx, lo) = loopback_context();
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
    lo.progress(&ctx);
    // Bounded: retry_cnt 7 with a 67 ms timeout runs out well within 64 s.
    for _ in 0..64 {
        if qp.state() == QpState::Err {
            break;
        }
        lo.advance(&ctx, Duration::from_secs(1));
    }
    assert_eq!(qp.state(), QpState::Err);
    let wcs = cq.poll(10);
    assert_eq!(wcs.len(), 2);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode, wcs[0].status),
        (1, WcOpcode::RdmaWrite, WcStatus::RetryExcErr)
    );
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(wcs[1].opcode, WcOpcode::Send);
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
    // Receives of 2048 bytes into a registered block; messages of two 1024-byte packets.
    let block = pd
        .reg_mr(
            MemBlock::new(8192).expect("block"),
            AccessFlags::LOCAL_WRITE,
        )
        .expect("mr");
    let sge = Sge {
        addr: block.iova(),
        length: 2048,
        lkey: block.lkey(),
    };
    for id in 0..10 {
        srq.post_recv(RecvWr::new(id, vec![sge])).expect("post srq");
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
    let (lo, sender) = {
        let lo = Loopback::install(&ctx);
        let s = sender_to(&ctx, &lo, &pd, &qp, QpState::Rts);
        (lo, s)
    };
    let two_packets = |id: u64| SendWr {
        flags: SendFlags::empty(),
        ..SendWr::send(id, vec![sge])
    };
    let _ = drain_events(&ctx);
    // The responder completes one message (WQE 0) and is in the middle of the next
    // (WQE 1: its first packet arrived, the second did not).
    sender.send(&ctx, two_packets(100));
    sender.qp.post_send(two_packets(101)).expect("post");
    assert_eq!(lo.transmit(&ctx), 2);
    assert!(lo.deliver_one(&ctx));
    to_err(&qp);
    // The taken WQE is flushed on the QP's CQ after the completed one; the SRQ keeps the
    // other eight.
    let wcs = cq.poll(64);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
    assert_eq!(srq.len(), 8);
    let ev = ctx.try_get_async_event().expect("LAST_WQE_REACHED");
    assert_eq!(ev.event_type(), EventType::QpLastWqeReached);
    assert!(ev.qp().expect("qp").same_qp(&qp));
    drop(ev);
    assert!(ctx.try_get_async_event().is_none(), "raised once");
    // A second QP on the same SRQ still gets the remaining WQEs, in order.
    let qp2 = pd.create_qp(&init).expect("qp2");
    let sender2 = sender_to(&ctx, &lo, &pd, &qp2, QpState::Rts);
    sender2.send_empty(&ctx);
    let wcs = cq.poll(4);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (2, qp2.qp_num()));
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
