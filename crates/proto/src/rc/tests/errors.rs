//! Error paths: NAK statuses, responder error classes, local protection errors, flush.

use uroce_wire::aeth::{NakCode, Syndrome};
use uroce_wire::opcode::op;
use uroce_wire::{atomic_eth, reth, PacketRepr, Psn};

use super::*;
use crate::qp_state::QpState;
use crate::rc::{PostError, RemoteAccess};
use crate::wr::{SendOpcode, SendPayload, WcOpcode, WcStatus, WrError};

/// Hands `pkt` to B and returns what B transmits in answer.
fn feed_b(p: &mut Pair, pkt: &PacketRepr<'_>) -> Vec<(u8, Psn, Option<Syndrome>)> {
    let now = p.now;
    p.with_env(Side::B, |qp, env| qp.receive(now, pkt, env));
    feed_b_poll(p)
}

#[test]
fn bad_rkey_remote_access_error_and_flush() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 4096, ALL);
    p.b.post_recv(recv(1, vec![sge(0x1000, 100, 2)])).unwrap();
    p.b.post_recv(recv(2, vec![sge(0x1000, 100, 2)])).unwrap();
    p.a.post_send(wr(10, SendOpcode::Send, vec![sge(0x1000, 10, 1)]))
        .unwrap();
    p.a.post_send(rdma(
        11,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 10, 1)],
        0x1000,
        99,
    ))
    .unwrap();
    p.a.post_send(wr(12, SendOpcode::Send, vec![sge(0x1000, 10, 1)]))
        .unwrap();
    p.run();
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        wa,
        [
            (10, WcStatus::Success),
            (11, WcStatus::RemAccessErr),
            (12, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.state(), QpState::Err);
    assert_eq!(p.b.state(), QpState::Err);
    assert_eq!(p.events(Side::B), [QpEvent::QpAccessErr]);
    let wb: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wb, [(1, WcStatus::Success), (2, WcStatus::WrFlushErr)]);
    assert!(p
        .sent(Side::B)
        .iter()
        .any(|s| s.text.contains("NAK remote access error") && s.psn.value() == 1));
    // Posting in ERR: accepted and flushed at once.
    p.a.post_send(wr(13, SendOpcode::Send, vec![])).unwrap();
    p.b.post_recv(recv(3, vec![])).unwrap();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::WrFlushErr);
    assert_eq!(p.completions(Side::B)[0].1.status, WcStatus::WrFlushErr);
    assert!(p.a.is_idle() && p.b.is_idle());
}

#[test]
fn out_of_bounds_read_is_remote_access_error() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 100, REMOTE_READ);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 200, 1)],
        0x1000,
        2,
    ))
    .unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemAccessErr);
    assert_eq!(p.events(Side::B), [QpEvent::QpAccessErr]);
}

#[test]
fn receive_buffer_too_small() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 4096, ALL);
    p.b.post_recv(recv(1, vec![sge(0x1000, 100, 2)])).unwrap();
    p.b.post_recv(recv(2, vec![sge(0x2000, 100, 2)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 300, 1)]))
        .unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![sge(0x1000, 3, 1)]))
        .unwrap();
    p.run();
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wa, [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]);
    let wb: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wb, [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.events(Side::B), [QpEvent::QpReqErr]);
    assert_eq!((p.a.state(), p.b.state()), (QpState::Err, QpState::Err));
}

#[test]
fn missing_access_rights_and_resources_are_invalid_requests() {
    // No REMOTE_WRITE on the QP.
    let (ca, mut cb) = configs();
    cb.access = RemoteAccess::READ | RemoteAccess::ATOMIC;
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 64, ALL);
    p.mem_b.add(2, 0x1000, 64, ALL);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 8, 1)],
        0x1000,
        2,
    ))
    .unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemInvReqErr);
    assert_eq!(p.events(Side::B), [QpEvent::QpReqErr]);
    assert_eq!(p.mem_b.get(2, 0x1000, 8), [0; 8], "nothing written");

    // max_dest_rd_atomic 0: READ and atomics are invalid requests.
    for opcode in [SendOpcode::RdmaRead, SendOpcode::AtomicFetchAndAdd] {
        let (ca, mut cb) = configs();
        cb.max_dest_rd_atomic = 0;
        let mut p = Pair::with_configs(ca, cb);
        p.mem_a.add(1, 0x1000, 64, ALL);
        p.mem_b.add(2, 0x1000, 64, ALL);
        p.a.post_send(rdma(1, opcode, vec![sge(0x1000, 8, 1)], 0x1000, 2))
            .unwrap();
        p.run();
        assert_eq!(
            p.completions(Side::A)[0].1.status,
            WcStatus::RemInvReqErr,
            "{opcode:?}"
        );
        assert_eq!(p.mem_b.get_u64(2, 0x1000), 0);
    }
}

#[test]
fn misaligned_atomic() {
    // Refused at post time…
    let mut p = Pair::new();
    let w = rdma(
        1,
        SendOpcode::AtomicFetchAndAdd,
        vec![sge(0x1000, 8, 1)],
        0x1004,
        2,
    );
    assert!(matches!(p.a.post_send(w), Err(PostError::InvalidWr(_))));
    let w = rdma(
        1,
        SendOpcode::AtomicFetchAndAdd,
        vec![sge(0x1000, 4, 1)],
        0x1000,
        2,
    );
    assert!(matches!(p.a.post_send(w), Err(PostError::InvalidWr(_))));
    // …and NAKed Invalid Request by the responder when it arrives anyway.
    p.mem_b.add(2, 0x1000, 64, ALL);
    let pkt = PacketRepr {
        atomic_eth: Some(atomic_eth::Repr {
            va: 0x1004,
            rkey: 2,
            swap_add: 1,
            compare: 0,
        }),
        ..PacketRepr::new(bth_to_b(op::RC_FETCH_ADD, 0), &[])
    };
    let out = feed_b(&mut p, &pkt);
    assert_eq!(
        out,
        [(
            op::RC_ACKNOWLEDGE,
            Psn::new(0),
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
    assert_eq!(p.b.state(), QpState::Err);
}

#[test]
fn opcode_sequence_errors_are_invalid_requests() {
    // A MIDDLE with no message in progress.
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    let payload = [0u8; 256];
    let out = feed_b(
        &mut p,
        &PacketRepr::new(bth_to_b(op::RC_SEND_MIDDLE, 0), &payload),
    );
    assert_eq!(
        out,
        [(
            op::RC_ACKNOWLEDGE,
            Psn::new(0),
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
    assert_eq!(p.events(Side::B), [QpEvent::QpReqErr]);
    assert_eq!(p.completions(Side::B)[0].1.status, WcStatus::WrFlushErr);

    // A WRITE_FIRST inside a SEND: the SEND's receive WQE completes in error.
    let mut p = Pair::new();
    p.mem_b.add(2, 0x1000, 4096, ALL);
    p.b.post_recv(recv(1, vec![sge(0x1000, 4096, 2)])).unwrap();
    p.b.post_recv(recv(2, vec![sge(0x1000, 4096, 2)])).unwrap();
    let mut b0 = bth_to_b(op::RC_SEND_FIRST, 0);
    b0.ack_req = false;
    assert!(feed_b(&mut p, &PacketRepr::new(b0, &payload)).is_empty());
    let w = PacketRepr {
        reth: Some(reth::Repr {
            va: 0x1000,
            rkey: 2,
            dma_len: 512,
        }),
        ..PacketRepr::new(bth_to_b(op::RC_RDMA_WRITE_FIRST, 1), &payload)
    };
    let out = feed_b(&mut p, &w);
    assert_eq!(
        out,
        [(
            op::RC_ACKNOWLEDGE,
            Psn::new(1),
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
    let wb: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wb, [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]);
}

#[test]
fn length_errors_are_invalid_requests() {
    // A WRITE_ONLY carrying fewer bytes than its RETH length.
    let mut p = Pair::new();
    p.mem_b.add(2, 0x1000, 4096, ALL);
    let w = PacketRepr {
        reth: Some(reth::Repr {
            va: 0x1000,
            rkey: 2,
            dma_len: 100,
        }),
        ..PacketRepr::new(bth_to_b(op::RC_RDMA_WRITE_ONLY, 0), &[1u8; 60])
    };
    let out = feed_b(&mut p, &w);
    assert_eq!(
        out,
        [(
            op::RC_ACKNOWLEDGE,
            Psn::new(0),
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
    assert_eq!(p.mem_b.get(2, 0x1000, 60), [0; 60]);

    // A SEND_FIRST shorter than the PMTU.
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    let out = feed_b(
        &mut p,
        &PacketRepr::new(bth_to_b(op::RC_SEND_FIRST, 0), &[0u8; 100]),
    );
    assert_eq!(
        out,
        [(
            op::RC_ACKNOWLEDGE,
            Psn::new(0),
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
    assert_eq!(p.completions(Side::B)[0].1.status, WcStatus::RemInvReqErr);
}

#[test]
fn send_with_invalidate() {
    let mut p = Pair::new();
    p.mem_b.add(0x77, 0x5000, 64, ALL);
    p.b.post_recv(recv(1, vec![])).unwrap();
    let mut w = wr(1, SendOpcode::SendWithInv, vec![]);
    w.invalidate_rkey = 0x77;
    p.a.post_send(w).unwrap();
    p.run();
    let wc = p.completions(Side::B)[0].1;
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
    assert_eq!(wc.wc_flags, crate::wr::WcFlags::WITH_INV);
    assert_eq!(wc.invalidated_rkey, 0x77);
    assert!(!p.mem_b.is_key_valid(0x77));
    assert_eq!(p.sent(Side::A)[0].opcode, op::RC_SEND_ONLY_WITH_INVALIDATE);

    // Invalidating a key that does not exist fails at both ends.
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    let mut w = wr(1, SendOpcode::SendWithInv, vec![]);
    w.invalidate_rkey = 0x99;
    p.a.post_send(w).unwrap();
    p.run();
    assert_eq!(p.completions(Side::B)[0].1.status, WcStatus::RemInvReqErr);
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemInvReqErr);
}

#[test]
fn local_protection_errors() {
    // The requester cannot gather from its own SGE.
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![sge(0x1000, 10, 42)]))
        .unwrap();
    p.a.post_send(wr(3, SendOpcode::Send, vec![])).unwrap();
    p.run();
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    // WR 1 was in flight when the QP went to ERR: flushed, in posting order.
    assert_eq!(
        wa,
        [
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );

    // The completer cannot write READ data into a region without LOCAL_WRITE.
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 64, REMOTE_READ);
    p.mem_b.add(2, 0x1000, 64, ALL);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 64, 1)],
        0x1000,
        2,
    ))
    .unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::LocProtErr);

    // The responder cannot scatter into its receive WQE: LOC_PROT_ERR there, NAK Remote
    // Operational Error → REM_OP_ERR at the requester.
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 64, ALL);
    p.b.post_recv(recv(1, vec![sge(0x1000, 64, 5)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 10, 1)]))
        .unwrap();
    p.run();
    assert_eq!(p.completions(Side::B)[0].1.status, WcStatus::LocProtErr);
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemOpErr);
}

#[test]
fn set_state_err_flushes_in_posting_order() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    for i in 0..3 {
        p.a.post_send(wr(i, SendOpcode::Send, vec![sge(0x1000, 1000, 1)]))
            .unwrap();
        p.a.post_recv(recv(10 + i, vec![])).unwrap();
    }
    // Let the first packets go out so that WR 0 is in flight.
    p.hold_to = Some(Side::B);
    p.round();
    p.a.set_state(QpState::Err);
    let c: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.0, c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        c,
        [
            (CqKind::Send, 0, WcStatus::WrFlushErr),
            (CqKind::Send, 1, WcStatus::WrFlushErr),
            (CqKind::Send, 2, WcStatus::WrFlushErr),
            (CqKind::Recv, 10, WcStatus::WrFlushErr),
            (CqKind::Recv, 11, WcStatus::WrFlushErr),
            (CqKind::Recv, 12, WcStatus::WrFlushErr),
        ]
    );
    assert!(p.a.poll_timeout().is_none());
    let mut buf = vec![0u8; 4160];
    assert!(p
        .with_env(Side::A, |qp, env| qp.emit(Instant::ZERO, env, &mut buf))
        .is_none());
    // ERR → RESET discards without completions; the QP can run again.
    p.a.post_send(wr(9, SendOpcode::Send, vec![])).unwrap();
    p.a.set_state(QpState::Reset);
    assert_eq!(
        p.completions(Side::A).len(),
        1,
        "only the post-in-ERR flush"
    );
    assert!(matches!(
        p.a.post_send(wr(9, SendOpcode::Send, vec![])),
        Err(PostError::BadState(QpState::Reset))
    ));
}

#[test]
fn post_time_validation() {
    let mut p = Pair::new();
    let mut w = rdma(1, SendOpcode::RdmaRead, vec![], 0, 0);
    w.payload = SendPayload::Inline(vec![1, 2, 3].into());
    assert!(matches!(p.a.post_send(w), Err(PostError::InvalidWr(_))));
    assert!(matches!(
        p.a.post_send(wr(1, SendOpcode::BindMw, vec![])),
        Err(PostError::InvalidWr(WrError::MissingBind))
    ));
    let big = vec![sge(0, u32::MAX, 1), sge(0, 2, 1)];
    assert!(matches!(
        p.a.post_send(wr(1, SendOpcode::Send, big)),
        Err(PostError::InvalidWr(_))
    ));
    // A READ of 2^30 + 1 bytes at PMTU 256 needs more than 2^22 PSNs.
    let w = rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0, (1 << 30) + 1, 1)],
        0,
        0,
    );
    assert!(matches!(p.a.post_send(w), Err(PostError::InvalidWr(_))));
    let w = rdma(1, SendOpcode::RdmaRead, vec![sge(0, 1 << 30, 1)], 0, 0);
    assert!(p.a.post_send(w).is_ok());

    let (mut ca, cb) = configs();
    ca.max_send_wr = 2;
    ca.max_recv_wr = 1;
    let mut p = Pair::with_configs(ca, cb);
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    assert_eq!(
        p.a.post_send(wr(3, SendOpcode::Send, vec![])),
        Err(PostError::QueueFull)
    );
    p.a.post_recv(recv(1, vec![])).unwrap();
    assert_eq!(p.a.post_recv(recv(2, vec![])), Err(PostError::QueueFull));
}

#[test]
fn read_response_fails_when_the_region_vanishes() {
    for vanish in [false, true] {
        let mut p = Pair::new();
        p.mem_a.add(1, 0x1000, 4096, ALL);
        p.mem_b.add(2, 0x1000, 4096, ALL);
        p.a.post_send(rdma(
            1,
            SendOpcode::RdmaRead,
            vec![sge(0x1000, 600, 1)],
            0x1000,
            2,
        ))
        .unwrap();
        let mut buf = vec![0u8; 4160];
        let n = p
            .with_env(Side::A, |qp, env| qp.emit(Instant::ZERO, env, &mut buf))
            .unwrap();
        let bytes = buf[..n].to_vec();
        let req = PacketRepr::parse(&bytes).unwrap();
        let now = p.now;
        p.with_env(Side::B, |qp, env| qp.receive(now, &req, env));
        // B accepted the READ; its region may be invalidated before the responses are built.
        if vanish {
            p.mem_b.invalidate_remote(2).unwrap();
        }
        let out = feed_b_poll(&mut p);
        if vanish {
            let nak = Some(Syndrome::Nak(NakCode::RemoteAccessError));
            assert_eq!(out, [(op::RC_ACKNOWLEDGE, Psn::new(0), nak)]);
            assert_eq!(p.b.state(), QpState::Err);
            assert_eq!(p.events(Side::B), [QpEvent::QpAccessErr]);
        } else {
            let ops: Vec<_> = out.iter().map(|o| o.0).collect();
            let want = [
                op::RC_RDMA_READ_RESPONSE_FIRST,
                op::RC_RDMA_READ_RESPONSE_MIDDLE,
                op::RC_RDMA_READ_RESPONSE_LAST,
            ];
            assert_eq!(ops, want);
            assert_eq!(p.b.state(), QpState::Rts);
        }
    }
}

/// What B transmits now.
fn feed_b_poll(p: &mut Pair) -> Vec<(u8, Psn, Option<Syndrome>)> {
    p.drain(Side::B)
        .iter()
        .map(|x| (x.opcode, x.psn, x.syndrome))
        .collect()
}

#[test]
fn small_transmit_buffer_holds_the_packet_back() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 4096, ALL);
    p.b.post_recv(recv(1, vec![sge(0x1000, 200, 2)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 200, 1)]))
        .unwrap();
    let mut small = vec![0u8; 100];
    assert!(p
        .with_env(Side::A, |qp, env| qp.emit(Instant::ZERO, env, &mut small))
        .is_none());
    assert_eq!(p.a.counters().packets_sent, 0);
    assert!(p.a.poll_timeout().is_none(), "nothing was sent, no timer");
    p.run();
    assert_eq!(p.sent(Side::A).len(), 1);
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}
