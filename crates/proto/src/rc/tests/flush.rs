//! An incoming FLUSH (IBA 1.5, opcode 0x1C), which uroce does not execute: in sequence it
//! is an invalid request (NAK Invalid Request with its PSN, `QP_REQ_ERR`, QP → ERR); out
//! of sequence or duplicate it follows the ordinary PSN rules; only RC has it.

use uroce_wire::aeth::{NakCode, Syndrome};
use uroce_wire::opcode::op;
use uroce_wire::{feth, PacketRepr};

use super::*;
use crate::qp_state::{QpState, QpType};
use crate::wr::{SendOpcode, WcStatus};

/// Hands the hand-built FLUSH with `psn` to B, parsed as the I/O layer parses it.
fn feed_flush(p: &mut Pair, psn: u32) {
    let bytes = flush_bytes(QPN_B, psn);
    let pkt = PacketRepr::parse(&bytes).expect("a FLUSH parses");
    assert_eq!(pkt.bth.opcode, op::RC_FLUSH);
    assert_eq!(
        pkt.feth,
        Some(feth::Repr {
            selectivity_level: feth::SELECTIVITY_RANGE,
            placement_type: feth::PLACEMENT_GLOBAL_VISIBILITY,
        })
    );
    let now = p.now;
    p.with_env(Side::B, |qp, env| qp.receive(now, &pkt, env));
}

/// Everything B transmits now: (opcode, PSN, AETH syndrome, MSN).
fn drain_b(p: &mut Pair) -> Vec<(u8, u32, Option<Syndrome>, Option<u32>)> {
    p.drain(Side::B)
        .iter()
        .map(|x| (x.opcode, x.psn.value(), x.syndrome, x.msn))
        .collect()
}

/// One SEND from A to B, completed on both sides: B's ePSN and MSN are 1 afterwards.
fn one_send(p: &mut Pair) {
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.run();
    let a = p.completions(Side::A);
    let b = p.completions(Side::B);
    assert_eq!((a.len(), a[0].1.status), (1, WcStatus::Success));
    assert_eq!((b.len(), b[0].1.status), (1, WcStatus::Success));
    assert_eq!(p.b.resp.epsn.value(), 1);
}

#[test]
fn flush_in_sequence_is_nakked_invalid_request() {
    let mut p = Pair::new();
    one_send(&mut p);
    p.b.post_recv(recv(2, vec![])).unwrap();
    let before = p.b.counters().clone();

    feed_flush(&mut p, 1);
    // NAK Invalid Request with the FLUSH's PSN and the MSN of the last completed message.
    assert_eq!(
        drain_b(&mut p),
        [(
            op::RC_ACKNOWLEDGE,
            1,
            Some(Syndrome::Nak(NakCode::InvalidRequest)),
            Some(1)
        )]
    );
    assert_eq!(p.b.state(), QpState::Err);
    assert_eq!(p.events(Side::B), [QpEvent::QpReqErr]);
    // Not consumed by the FLUSH: the posted receive is flushed with the QP.
    let wb: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.0, c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wb, [(CqKind::Recv, 2, WcStatus::WrFlushErr)]);
    let c = p.b.counters();
    assert_eq!(c.error_naks_sent, before.error_naks_sent + 1);
    assert_eq!(c.packets_received, before.packets_received + 1);
    assert_eq!(
        c.dropped_packets, before.dropped_packets,
        "answered, not dropped"
    );
}

#[test]
fn flush_ahead_gets_a_sequence_nak_and_a_duplicate_is_dropped() {
    let mut p = Pair::new();
    one_send(&mut p);
    let before = p.b.counters().clone();

    // PSN 4 while 1 is expected: the ordinary PSN sequence error NAK with the ePSN; the
    // next out-of-sequence packet is dropped silently.
    feed_flush(&mut p, 4);
    assert_eq!(
        drain_b(&mut p),
        [(
            op::RC_ACKNOWLEDGE,
            1,
            Some(Syndrome::Nak(NakCode::PsnSequenceError)),
            Some(1)
        )]
    );
    feed_flush(&mut p, 5);
    assert_eq!(drain_b(&mut p), []);
    // PSN 0 (already done): a duplicate with no responder resource, dropped.
    feed_flush(&mut p, 0);
    assert_eq!(drain_b(&mut p), []);
    let c = p.b.counters();
    assert_eq!(c.seq_naks_sent, before.seq_naks_sent + 1);
    assert_eq!(
        c.dropped_out_of_sequence,
        before.dropped_out_of_sequence + 1
    );
    assert_eq!(c.duplicates_received, before.duplicates_received + 1);
    assert_eq!(
        c.dropped_unmatched_duplicates,
        before.dropped_unmatched_duplicates + 1
    );
    assert_eq!(c.error_naks_sent, before.error_naks_sent);
    // None of this hurt the connection: the next SEND goes through.
    assert_eq!(p.b.state(), QpState::Rts);
    assert!(p.events(Side::B).is_empty());
    p.b.post_recv(recv(2, vec![])).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
    assert_eq!(p.completions(Side::B)[0].1.status, WcStatus::Success);
}

#[test]
fn flush_inside_a_send_message_fails_it_at_both_ends() {
    // A three-packet SEND whose LAST is lost; a FLUSH takes its PSN. The FLUSH does not
    // continue the SEND: NAK Invalid Request, and since that PSN is A's SEND, A's WQE
    // completes with REM_INV_REQ_ERR (what a peer's FLUSH WQE gets in the simple case).
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 600, ALL);
    p.mem_b.add(1, 0x1000, 600, ALL);
    p.b.post_recv(recv(1, vec![sge(0x1000, 600, 1)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 600, 1)]))
        .unwrap();
    p.drop_packets(Side::A, 1, |pkt| pkt.bth.opcode == op::RC_SEND_LAST);
    p.round();
    assert_eq!(p.b.resp.epsn.value(), 2, "FIRST and MIDDLE arrived");
    feed_flush(&mut p, 2);
    p.run();
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wa, [(1, WcStatus::RemInvReqErr)]);
    let wb: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wb, [(1, WcStatus::RemInvReqErr)]);
    assert_eq!(p.events(Side::B), [QpEvent::QpReqErr]);
    assert_eq!((p.a.state(), p.b.state()), (QpState::Err, QpState::Err));
}

#[test]
fn an_xrc_target_has_no_flush() {
    // The XRC opcode space has no FLUSH, and an RC opcode is not an XRC one: dropped as
    // a bad opcode, no answer, no state change.
    let (a, mut b) = configs();
    b.qp_type = QpType::XrcRecv;
    let mut p = Pair::with_configs(a, b);
    feed_flush(&mut p, 0);
    assert_eq!(drain_b(&mut p), []);
    let c = p.b.counters();
    assert_eq!((c.dropped_packets, c.dropped_bad_opcode), (1, 1));
    assert_eq!(p.b.state(), QpState::Rts);
}
