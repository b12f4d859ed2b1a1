//! Loss recovery: sequence NAKs, timeouts, duplicates, RNR, retry exhaustion.

use core::time::Duration;

use uroce_wire::aeth::rnr_timer_micros;
use uroce_wire::opcode::op;

use super::*;
use crate::qp_state::QpState;
use crate::time::local_ack_timeout;
use crate::wr::{SendOpcode, WcStatus};

fn data_pair(len: usize) -> (Pair, Vec<u8>) {
    let p = Pair::new();
    p.mem_a.add(1, 0x1000, len.max(1) * 2, ALL);
    p.mem_b.add(2, 0x1000, len.max(1) * 2, ALL);
    let d = bytes(len as u64, len);
    p.mem_a.put(1, 0x1000, &d);
    p.mem_b.put(2, 0x1000 + len as u64, &d);
    (p, d)
}

#[test]
fn lost_middle_packet_seq_nak_then_recovery() {
    let (mut p, data) = data_pair(1200); // 5 packets at PMTU 256
    p.b.post_recv(recv(1, vec![sge(0x1000, 1200, 2)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 1200, 1)]))
        .unwrap();
    p.drop_packets(Side::A, 1, |pkt| pkt.bth.psn.value() == 2);
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 1200), data);

    // B: PSN 3 arrives with ePSN 2 → one NAK carrying PSN 2; PSN 4 dropped silently.
    let naks: Vec<_> = p
        .sent(Side::B)
        .iter()
        .filter(|s| s.text.contains("NAK PSN sequence error"))
        .map(|s| s.psn.value())
        .collect();
    assert_eq!(naks, [2]);
    assert_eq!(p.b.counters().seq_naks_sent, 1);
    assert_eq!(p.b.counters().dropped_out_of_sequence, 1);
    assert_eq!(p.a.counters().seq_naks_received, 1);
    // A resumes at PSN 2 with MIDDLE opcodes (not FIRST), no timeout involved.
    let a: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(
        a,
        [
            (op::RC_SEND_FIRST, 0),
            (op::RC_SEND_MIDDLE, 1),
            (op::RC_SEND_MIDDLE, 2),
            (op::RC_SEND_MIDDLE, 3),
            (op::RC_SEND_LAST, 4),
            (op::RC_SEND_MIDDLE, 2),
            (op::RC_SEND_MIDDLE, 3),
            (op::RC_SEND_LAST, 4),
        ]
    );
    assert_eq!(p.a.counters().retransmitted_packets, 3);
    assert_eq!(p.a.counters().timeouts, 0);
    assert_eq!(p.now, Instant::ZERO, "no timer was needed");
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
    assert_eq!(p.completions(Side::B).len(), 1);
}

#[test]
fn lost_ack_timeout_duplicate_reack() {
    let (mut p, data) = data_pair(100);
    p.b.post_recv(recv(1, vec![sge(0x1000, 100, 2)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 100, 1)]))
        .unwrap();
    p.drop_packets(Side::B, 1, |pkt| pkt.bth.opcode == op::RC_ACKNOWLEDGE);
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 100), data);
    assert_eq!(p.a.counters().timeouts, 1);
    assert_eq!(p.b.counters().duplicates_received, 1);
    // The timeout is 4.096 µs × 2^10.
    assert_eq!(p.now, Instant::ZERO + Duration::from_nanos(4096 << 10));
    assert_eq!(p.now, Instant::ZERO + local_ack_timeout(10).unwrap());
    assert_eq!(p.completions(Side::A).len(), 1);
    assert_eq!(
        p.completions(Side::B).len(),
        1,
        "the duplicate is not delivered again"
    );
    assert_eq!(p.b.counters().acks_sent, 2);
    assert!(p.a.is_idle());
}

#[test]
fn duplicate_atomic_is_executed_once() {
    let mut p = Pair::new();
    p.mem_b.add(4, 0x8000, 64, ALL);
    p.mem_b.put_u64(4, 0x8000, 100);
    p.mem_a.add(1, 0x1000, 64, ALL);
    let mut fa = rdma(
        1,
        SendOpcode::AtomicFetchAndAdd,
        vec![sge(0x1000, 8, 1)],
        0x8000,
        4,
    );
    fa.compare_add = 5;
    p.a.post_send(fa).unwrap();
    p.drop_packets(Side::B, 1, |pkt| {
        pkt.bth.opcode == op::RC_ATOMIC_ACKNOWLEDGE
    });
    p.run();
    assert_eq!(p.mem_b.get_u64(4, 0x8000), 105, "added once, not twice");
    assert_eq!(
        p.mem_a.get_u64(1, 0x1000),
        100,
        "the stored original value was resent"
    );
    assert_eq!(p.a.counters().timeouts, 1);
    assert_eq!(p.b.counters().duplicates_received, 1);
    assert_eq!(p.b.counters().atomic_acks_sent, 2);
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}

#[test]
fn duplicate_read_is_answered_from_responder_resources() {
    let (mut p, data) = data_pair(600);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 600, 1)],
        0x1000 + 600,
        2,
    ))
    .unwrap();
    // All three responses of the first answer are lost.
    p.drop_packets(Side::B, 3, |pkt| pkt.bth.opcode != op::RC_ACKNOWLEDGE);
    p.run();
    assert_eq!(p.mem_a.get(1, 0x1000, 600), data);
    assert_eq!(p.a.counters().timeouts, 1);
    assert_eq!(p.b.counters().duplicates_received, 1);
    assert_eq!(p.b.counters().read_responses_sent, 6);
    let reqs: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(
        reqs,
        [(op::RC_RDMA_READ_REQUEST, 0), (op::RC_RDMA_READ_REQUEST, 0)]
    );
}

#[test]
fn lost_read_response_reissues_the_rest() {
    let (mut p, data) = data_pair(1024); // 4 responses
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 1024, 1)],
        0x1000 + 1024,
        2,
    ))
    .unwrap();
    p.drop_packets(Side::B, 1, |pkt| pkt.bth.psn.value() == 1);
    p.run();
    assert_eq!(p.mem_a.get(1, 0x1000, 1024), data);
    let reqs: Vec<_> = p.sent(Side::A).iter().map(|s| s.text.clone()).collect();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    // The re-issued READ: PSN of the first missing response, VA and length adjusted.
    let expected_va = 0x1000 + 1024 + 256;
    assert!(
        reqs[1].contains("psn=1 ")
            && reqs[1].contains(&format!("va={expected_va:#x}"))
            && reqs[1].contains("dlen=768"),
        "{}",
        reqs[1]
    );
    assert_eq!(
        p.a.counters().timeouts,
        0,
        "the gap itself triggered the retry"
    );
    // The duplicate READ restarts the stream with FIRST at PSN 1.
    let b: Vec<_> = p
        .sent(Side::B)
        .iter()
        .filter(|s| !s.dropped)
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(
        b,
        [
            (op::RC_RDMA_READ_RESPONSE_FIRST, 0),
            (op::RC_RDMA_READ_RESPONSE_MIDDLE, 2),
            (op::RC_RDMA_READ_RESPONSE_LAST, 3),
            (op::RC_RDMA_READ_RESPONSE_FIRST, 1),
            (op::RC_RDMA_READ_RESPONSE_MIDDLE, 2),
            (op::RC_RDMA_READ_RESPONSE_LAST, 3),
        ]
    );
    assert_eq!(p.completions(Side::A)[0].1.byte_len, 1024);
}

#[test]
fn ack_beyond_unanswered_read_is_an_implicit_nak_and_order_holds() {
    let (mut p, data) = data_pair(512);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 512, 1)],
        0x1000 + 512,
        2,
    ))
    .unwrap();
    p.a.post_send(rdma(
        2,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000 + 700, 10, 1)],
        0x1000,
        2,
    ))
    .unwrap();
    // The READ's LAST response is lost; the WRITE's ACK (PSN 2) arrives.
    p.drop_packets(Side::B, 1, |pkt| {
        pkt.bth.opcode == op::RC_RDMA_READ_RESPONSE_LAST
    });
    p.run();
    assert_eq!(p.mem_a.get(1, 0x1000, 512), data);
    assert!(p.a.counters().implicit_naks >= 1);
    assert_eq!(p.a.counters().timeouts, 0);
    let ids: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        ids,
        [(1, WcStatus::Success), (2, WcStatus::Success)],
        "READ first although the WRITE was acknowledged earlier"
    );
}

#[test]
fn lost_read_request_is_resent_after_timeout() {
    let (mut p, data) = data_pair(300);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 300, 1)],
        0x1000 + 300,
        2,
    ))
    .unwrap();
    p.drop_packets(Side::A, 1, |_| true);
    p.run();
    assert_eq!(p.mem_a.get(1, 0x1000, 300), data);
    assert_eq!(p.a.counters().timeouts, 1);
    assert_eq!(p.b.counters().duplicates_received, 0);
}

#[test]
fn timeout_resumes_a_partially_acknowledged_write_mid_message() {
    // 100 packets: AckReq on PSN 63 and 99. ACK 63 arrives, the packets after it are
    // lost once: the retry starts at PSN 64 with a MIDDLE opcode.
    let (mut p, data) = data_pair(100 * 256);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 100 * 256, 1)],
        0x1000,
        2,
    ))
    .unwrap();
    p.drop_packets(Side::A, 36, |pkt| pkt.bth.psn.value() >= 64);
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 100 * 256), data);
    assert_eq!(p.a.counters().timeouts, 1);
    let resent: Vec<_> = p
        .sent(Side::A)
        .iter()
        .skip(100)
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(resent.first(), Some(&(op::RC_RDMA_WRITE_MIDDLE, 64)));
    assert_eq!(resent.last(), Some(&(op::RC_RDMA_WRITE_LAST, 99)));
    assert_eq!(resent.len(), 36);
}

#[test]
fn rnr_nak_then_success() {
    let (mut p, data) = data_pair(100);
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 100, 1)]))
        .unwrap();
    assert!(p.run_until(|p| p.a.counters().rnr_naks_received == 1));
    let t0 = p.now;
    assert!(p.a.poll_timeout().is_some());
    p.b.post_recv(recv(7, vec![sge(0x1000, 100, 2)])).unwrap();
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 100), data);
    // min_rnr_timer 12 → 0.64 ms (IBA Vol 1 §9.7, RNR timer encoding).
    assert_eq!(
        p.now.saturating_duration_since(t0),
        Duration::from_micros(640)
    );
    assert_eq!(rnr_timer_micros(12), 640);
    let rnr: Vec<_> = p
        .sent(Side::B)
        .iter()
        .filter(|s| s.text.contains("RNR-NAK timer=12"))
        .map(|s| s.psn.value())
        .collect();
    assert_eq!(rnr, [0]);
    assert_eq!(p.b.counters().rnr_naks_sent, 1);
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
    assert_eq!(p.completions(Side::B)[0].1.wr_id, 7);
}

#[test]
fn rnr_retry_exhausted() {
    let (mut ca, cb) = configs();
    ca.rnr_retry = 2;
    let mut p = Pair::with_configs(ca, cb);
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    p.run();
    assert_eq!(
        p.a.counters().rnr_naks_received,
        3,
        "the first RNR NAK and two retries"
    );
    let st: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        st,
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.state(), QpState::Err);
    assert_eq!(
        p.b.state(),
        QpState::Rts,
        "RNR is not an error at the responder"
    );
    assert!(p.completions(Side::B).is_empty());
}

#[test]
fn rnr_retry_seven_is_infinite() {
    let mut p = Pair::new(); // rnr_retry 7
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    assert!(p.run_until(|p| p.a.counters().rnr_naks_received == 20));
    assert_eq!(p.a.state(), QpState::Rts);
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}

#[test]
fn retry_exhausted_and_seven_is_finite() {
    for retry_cnt in [0u8, 3, 7] {
        let (mut ca, cb) = configs();
        ca.retry_cnt = retry_cnt;
        let mut p = Pair::with_configs(ca, cb);
        p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
        p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
        p.drop_packets(Side::A, usize::MAX, |_| true);
        p.run();
        let tries = u64::from(retry_cnt) + 1;
        assert_eq!(p.a.counters().timeouts, tries, "retry_cnt {retry_cnt}");
        // Each try sends both SENDs.
        assert_eq!(p.sent(Side::A).len() as u64, 2 * tries);
        assert_eq!(
            p.now,
            Instant::ZERO + local_ack_timeout(10).unwrap() * tries as u32
        );
        let st: Vec<_> = p
            .completions(Side::A)
            .iter()
            .map(|c| (c.1.wr_id, c.1.status))
            .collect();
        assert_eq!(st, [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
        assert_eq!(p.a.state(), QpState::Err);
    }
}

#[test]
fn late_timeouts_are_excused_but_a_gone_peer_still_fails_within_twice_the_retries() {
    // Every packet of A is lost (the peer is gone) and A's process is never scheduled on
    // time: each timeout fires a whole period late. The first retry_cnt are excused, then
    // retry_cnt retries: 2 × retry_cnt + 1 timeouts in all, then RETRY_EXC_ERR.
    for retry_cnt in [0u8, 3, 7] {
        let (mut ca, cb) = configs();
        ca.retry_cnt = retry_cnt;
        let mut p = Pair::with_configs(ca, cb);
        p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
        p.drop_packets(Side::A, usize::MAX, |_| true);
        let period = local_ack_timeout(10).unwrap();
        for _ in 0..1000 {
            if p.round() {
                continue;
            }
            if !p.fire_timers_late(period) {
                break;
            }
        }
        let c = p.a.counters();
        let n = u64::from(retry_cnt);
        assert_eq!(
            (c.timeouts, c.timeouts_excused, c.retries),
            (2 * n + 1, n, n)
        );
        assert_eq!(c.retry_exceeded, 1);
        assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RetryExcErr);
    }
}

#[test]
fn a_starved_requester_keeps_a_connection_whose_peer_answers_late() {
    // retry_cnt 2: B receives nothing for four timeouts of A, each of which fired late
    // (both processes starved), then everything arrives. Counting every timeout would
    // have failed the SEND at the third; excused, it completes.
    let (mut ca, cb) = configs();
    ca.retry_cnt = 2;
    let mut p = Pair::with_configs(ca, cb);
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.hold_to = Some(Side::B);
    let period = local_ack_timeout(10).unwrap();
    let mut timeouts = 0;
    while timeouts < 4 {
        if p.round() {
            continue;
        }
        assert!(p.fire_timers_late(period));
        timeouts += 1;
    }
    assert_eq!(
        p.a.state(),
        QpState::Rts,
        "still connected after 4 late timeouts"
    );
    p.release();
    p.run();
    let c = p.a.counters();
    assert_eq!((c.timeouts, c.timeouts_excused, c.retries), (4, 2, 2));
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
    assert_eq!(p.completions(Side::B)[0].1.status, WcStatus::Success);
}

#[test]
fn a_peer_that_vanishes_after_answering_gets_exactly_retry_cnt_retries() {
    // B answers A's first SEND (the ACK is the last thing A hears from it), then vanishes:
    // the ACK that made progress says nothing about the timeouts after it, so with timers
    // on time A sends the second SEND 1 + retry_cnt times and fails, as when the peer was
    // never there (the interop suite's write_peer_vanishes against the kernel's rxe).
    for retry_cnt in [0u8, 3, 7] {
        let (mut ca, cb) = configs();
        ca.retry_cnt = retry_cnt;
        let mut p = Pair::with_configs(ca, cb);
        p.b.post_recv(recv(1, vec![])).unwrap();
        p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
        p.run();
        assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
        let before = p.sent(Side::A).len();
        p.drop_packets(Side::A, usize::MAX, |_| true);
        p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
        p.run();
        let c = p.a.counters();
        let n = u64::from(retry_cnt);
        assert_eq!(
            (c.timeouts, c.timeouts_excused, c.retries, c.retry_exceeded),
            (n + 1, 0, n, 1),
            "retry_cnt {retry_cnt}: {c:?}"
        );
        assert_eq!(p.sent(Side::A).len() - before, usize::from(retry_cnt) + 1);
        assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RetryExcErr);
    }
}

#[test]
fn a_timeout_after_hearing_from_the_peer_is_excused() {
    // A's requests are lost, but B's own SENDs reach A between A's (on-time) timeouts:
    // the peer runs, so those timeouts do not count; the budget is bounded all the same.
    let (mut ca, cb) = configs();
    ca.retry_cnt = 1;
    let mut p = Pair::with_configs(ca, cb);
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.drop_packets(Side::A, usize::MAX, |pkt| {
        pkt.bth.opcode == uroce_wire::opcode::op::RC_SEND_ONLY
    });
    for i in 0..4 {
        p.a.post_recv(recv(100 + i, vec![])).unwrap();
    }
    let mut timeouts = 0;
    for _ in 0..10_000 {
        if p.round() {
            continue;
        }
        if p.a.state() != QpState::Rts || !p.fire_timers() {
            break;
        }
        timeouts += 1;
        // The peer speaks after each of A's timeouts.
        if timeouts < 4 {
            p.b.post_send(wr(200 + timeouts, SendOpcode::Send, vec![]))
                .unwrap();
        }
    }
    let c = p.a.counters();
    assert_eq!(c.timeouts_excused, 1, "{c:?}");
    assert_eq!(
        (c.timeouts, c.retries, c.retry_exceeded),
        (3, 1, 1),
        "{c:?}"
    );
}

#[test]
fn forward_progress_reloads_the_retry_counter() {
    // retry_cnt 1 but every message loses its first transmission: each retry is followed
    // by progress, so the counter never runs out.
    let (mut ca, cb) = configs();
    ca.retry_cnt = 1;
    let mut p = Pair::with_configs(ca, cb);
    for i in 0..5 {
        p.b.post_recv(recv(i, vec![])).unwrap();
    }
    for i in 0..5 {
        p.a.post_send(wr(i, SendOpcode::Send, vec![])).unwrap();
        p.drop_packets(Side::A, 1, |_| true);
        p.run();
    }
    assert_eq!(p.a.counters().timeouts, 5);
    let st: Vec<_> = p.completions(Side::A).iter().map(|c| c.1.status).collect();
    assert_eq!(st, [WcStatus::Success; 5]);
}

#[test]
fn lossy_mix_converges_in_order() {
    // Every 7th request and every 5th response is lost once: data and order still hold.
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 20_000, ALL);
    p.mem_b.add(2, 0x1000, 20_000, ALL);
    let data = bytes(8, 8000);
    p.mem_a.put(1, 0x1000, &data);
    p.mem_b.put(2, 0x1000 + 8000, &data);
    for i in 0..6 {
        p.b.post_recv(recv(i, vec![sge(0x1000 + 1000 * i, 1000, 2)]))
            .unwrap();
    }
    let mut ids = Vec::new();
    for i in 0..6u64 {
        p.a.post_send(wr(
            10 * i,
            SendOpcode::Send,
            vec![sge(0x1000 + 1000 * i, 1000, 1)],
        ))
        .unwrap();
        p.a.post_send(rdma(
            10 * i + 1,
            SendOpcode::RdmaRead,
            vec![sge(0x1000 + 8000 + 1000 * i, 1000, 1)],
            0x1000 + 8000 + 1000 * i,
            2,
        ))
        .unwrap();
        let mut fa = rdma(
            10 * i + 2,
            SendOpcode::AtomicFetchAndAdd,
            vec![sge(0x1000 + 15000 + 8 * i, 8, 1)],
            0x1000 + 16000,
            2,
        );
        fa.compare_add = 1;
        p.a.post_send(fa).unwrap();
        ids.extend([10 * i, 10 * i + 1, 10 * i + 2]);
    }
    let n = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let m = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let n2 = n.clone();
    p.drop_packets(Side::A, 10, move |_| {
        n2.set(n2.get() + 1);
        n2.get() % 7 == 0
    });
    let m2 = m.clone();
    p.drop_packets(Side::B, 10, move |_| {
        m2.set(m2.get() + 1);
        m2.get() % 5 == 0
    });
    p.run();
    let got: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    let want: Vec<_> = ids.iter().map(|i| (*i, WcStatus::Success)).collect();
    assert_eq!(got, want);
    assert_eq!(p.mem_b.get(2, 0x1000, 6000), data[..6000]);
    assert_eq!(
        p.mem_a.get(1, 0x1000 + 8000, 6000),
        data[..6000],
        "READ data"
    );
    assert_eq!(
        p.mem_b.get_u64(2, 0x1000 + 16000),
        6,
        "six fetch-adds, each executed once"
    );
    let originals: Vec<_> = (0..6)
        .map(|i| p.mem_a.get_u64(1, 0x1000 + 15000 + 8 * i))
        .collect();
    assert_eq!(originals, [0, 1, 2, 3, 4, 5], "executed in PSN order");
}

/// A mix of every operation, for the duplication and reordering tests: returns the
/// expected completion ids, in posting order.
fn post_mix(p: &mut Pair) -> Vec<u64> {
    p.mem_a.add(1, 0x1000, 40_000, ALL);
    p.mem_b.add(2, 0x1000, 40_000, ALL);
    p.mem_a.put(1, 0x1000, &bytes(1, 10_000));
    p.mem_b.put(2, 0x1000 + 20_000, &bytes(2, 10_000));
    let mut ids = Vec::new();
    for i in 0..4u64 {
        p.b.post_recv(recv(i, vec![sge(0x1000 + 2500 * i, 2500, 2)]))
            .unwrap();
        p.a.post_send(wr(
            10 * i,
            SendOpcode::Send,
            vec![sge(0x1000 + 2500 * i, 2500, 1)],
        ))
        .unwrap();
        let r = rdma(
            10 * i + 1,
            SendOpcode::RdmaRead,
            vec![sge(0x1000 + 20_000 + 2500 * i, 2500, 1)],
            0x1000 + 20_000 + 2500 * i,
            2,
        );
        p.a.post_send(r).unwrap();
        let mut fa = rdma(
            10 * i + 2,
            SendOpcode::AtomicFetchAndAdd,
            vec![sge(0x1000 + 39_000 + 8 * i, 8, 1)],
            0x1000 + 39_992,
            2,
        );
        fa.compare_add = 1;
        p.a.post_send(fa).unwrap();
        let w = rdma(
            10 * i + 3,
            SendOpcode::RdmaWrite,
            vec![sge(0x1000 + 2500 * i, 2500, 1)],
            0x1000 + 10_000 + 2500 * i,
            2,
        );
        p.a.post_send(w).unwrap();
        ids.extend([10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3]);
    }
    ids
}

fn check_mix(p: &mut Pair, ids: &[u64]) {
    let got: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    let want: Vec<_> = ids.iter().map(|i| (*i, WcStatus::Success)).collect();
    assert_eq!(got, want);
    let sent = bytes(1, 10_000);
    assert_eq!(p.mem_b.get(2, 0x1000, 10_000), sent, "SEND data");
    assert_eq!(p.mem_b.get(2, 0x1000 + 10_000, 10_000), sent, "WRITE data");
    assert_eq!(
        p.mem_a.get(1, 0x1000 + 20_000, 10_000),
        bytes(2, 10_000),
        "READ data"
    );
    assert_eq!(
        p.mem_b.get_u64(2, 0x1000 + 39_992),
        4,
        "each fetch-add executed once"
    );
    let originals: Vec<_> = (0..4)
        .map(|i| p.mem_a.get_u64(1, 0x1000 + 39_000 + 8 * i))
        .collect();
    assert_eq!(originals, [0, 1, 2, 3]);
    let rids: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.byte_len))
        .collect();
    assert_eq!(
        rids,
        (0..4)
            .map(|i| (i, WcStatus::Success, 2500))
            .collect::<Vec<_>>()
    );
    assert!(p.a.is_idle() && p.b.is_idle());
}

#[test]
fn every_packet_duplicated() {
    let mut p = Pair::new();
    let ids = post_mix(&mut p);
    p.dup_packets(Side::A, usize::MAX, |_| true);
    p.dup_packets(Side::B, usize::MAX, |_| true);
    p.run();
    check_mix(&mut p, &ids);
    assert!(p.b.counters().duplicates_received > 50);
    assert!(p.a.counters().duplicates_received > 50);
}

#[test]
fn reordered_packets_converge() {
    let mut p = Pair::new();
    let ids = post_mix(&mut p);
    p.reorder_every = 3;
    p.run();
    check_mix(&mut p, &ids);
    assert!(
        p.b.counters().seq_naks_sent > 0,
        "the reordering was noticed"
    );
}

#[test]
fn duplicated_sequence_nak_retries_once() {
    let (mut p, data) = data_pair(1200);
    p.b.post_recv(recv(1, vec![sge(0x1000, 1200, 2)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 1200, 1)]))
        .unwrap();
    p.drop_packets(Side::A, 1, |pkt| pkt.bth.psn.value() == 2);
    p.dup_packets(Side::B, 1, |pkt| {
        pkt.aeth.is_some_and(|a| !a.syndrome.is_ack())
    });
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 1200), data);
    assert_eq!(p.a.counters().seq_naks_received, 2);
    assert_eq!(p.a.counters().retries, 1);
    assert_eq!(p.a.counters().retransmitted_packets, 3);
}

#[test]
fn duplicated_rnr_nak_counts_once() {
    let (mut ca, cb) = configs();
    ca.rnr_retry = 1;
    let mut p = Pair::with_configs(ca, cb);
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.dup_packets(Side::B, 1, |pkt| {
        pkt.aeth.is_some_and(|a| !a.syndrome.is_ack())
    });
    assert!(p.run_until(|p| p.a.counters().rnr_naks_received == 2));
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}

#[test]
fn rnr_on_write_last_with_immediate_resumes_at_the_last_packet() {
    let (mut p, data) = data_pair(700); // FIRST, MIDDLE, LAST_WITH_IMM
    let mut w = rdma(
        1,
        SendOpcode::RdmaWriteWithImm,
        vec![sge(0x1000, 700, 1)],
        0x1000,
        2,
    );
    w.imm_data = 0x55;
    p.a.post_send(w).unwrap();
    assert!(p.run_until(|p| p.a.counters().rnr_naks_received == 1));
    // The first two packets were written; the RNR NAK names the LAST packet's PSN.
    assert_eq!(p.mem_b.get(2, 0x1000, 512), data[..512]);
    let rnr: Vec<_> = p
        .sent(Side::B)
        .iter()
        .filter(|s| s.text.contains("RNR-NAK"))
        .map(|s| s.psn.value())
        .collect();
    assert_eq!(rnr, [2]);
    p.b.post_recv(recv(9, vec![])).unwrap();
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 700), data);
    let a: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(
        a,
        [
            (op::RC_RDMA_WRITE_FIRST, 0),
            (op::RC_RDMA_WRITE_MIDDLE, 1),
            (op::RC_RDMA_WRITE_LAST_WITH_IMM, 2),
            (op::RC_RDMA_WRITE_LAST_WITH_IMM, 2),
        ]
    );
    let wc = p.completions(Side::B)[0].1;
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm_data), (9, 700, 0x55));
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}

#[test]
fn rnr_on_multi_packet_send_drops_the_rest_silently() {
    let (mut p, data) = data_pair(1000); // 4 packets
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 1000, 1)]))
        .unwrap();
    assert!(p.run_until(|p| p.a.counters().rnr_naks_received == 1));
    assert_eq!(
        p.b.counters().dropped_out_of_sequence,
        3,
        "no sequence NAK after the RNR NAK"
    );
    assert_eq!(p.b.counters().seq_naks_sent, 0);
    p.b.post_recv(recv(1, vec![sge(0x1000, 1000, 2)])).unwrap();
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 1000), data);
    assert_eq!(
        p.sent(Side::A).len(),
        8,
        "the whole message again, from SEND_FIRST"
    );
}
