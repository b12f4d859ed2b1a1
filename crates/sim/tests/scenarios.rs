//! Packet-level scenarios of the RC engine on the simulated network, with explicit time.
//!
//! Every expectation comes from IBA §9.7 and docs/INTEROP-NOTES.md §5, not from the
//! engine: which packets go out (opcode, PSN, AETH), when (local ACK timeout
//! 4.096 µs × 2^timeout, RNR timer table), what completes with which status, and what
//! memory holds afterwards. Links have a one-way delay `D` so that round trips are visible.
//! On failure each test prints the packet trace.

use std::time::Duration;

use uroce_proto::engine::Engine;
use uroce_proto::qp_state::QpState;
use uroce_proto::rc::{CqKind, QpEvent, RcConfig, RemoteAccess};
use uroce_proto::time::{local_ack_timeout, Instant};
use uroce_proto::wr::{RecvWr, SendFlags, SendOpcode, SendWr, WcFlags, WcOpcode, WcStatus};
use uroce_sim::net::Filter;
use uroce_sim::rc::Pair;
use uroce_sim::{Access, LinkConfig, QpId, RegionHandle, Verdict};
use uroce_wire::aeth::{rnr_timer_micros, NakCode, Syndrome};
use uroce_wire::opcode::op;
use uroce_wire::PacketRepr;

/// One-way link delay.
const D: u64 = 10_000;
/// A's first PSN and B's first PSN.
const PA: u32 = Pair::PSN_A;
const PB: u32 = Pair::PSN_B;

/// The default local ACK timeout (code 14) in nanoseconds.
fn t_ack() -> u64 {
    local_ack_timeout(14).map_or(0, |d| d.as_nanos() as u64)
}

/// A pair with `D` delay both ways, after `tweak` changed the configurations.
fn pair_with(tweak: impl FnOnce(&mut RcConfig, &mut RcConfig)) -> Pair {
    let (mut a, mut b) = Pair::configs();
    tweak(&mut a, &mut b);
    let mut p = Pair::with_configs(1, a, b);
    p.set_links(LinkConfig::with_delay(Duration::from_nanos(D)))
        .unwrap();
    p
}

fn pair() -> Pair {
    pair_with(|_, _| {})
}

/// Filter that applies `verdict` to the packets whose index on the link is in `which`.
fn on(which: &'static [u64], verdict: Verdict) -> Option<Filter> {
    Some(Box::new(move |_p: &PacketRepr<'_>, nth| {
        if which.contains(&nth) {
            verdict
        } else {
            Verdict::Deliver
        }
    }))
}

/// (time ns, opcode, PSN) of everything sent from `src` to `dst`.
fn sent(p: &Pair, src: QpId, dst: QpId) -> Vec<(u64, u8, u32)> {
    p.net
        .trace()
        .transmitted(src.node, dst.node)
        .iter()
        .map(|(t, s)| (t.as_nanos(), s.opcode, s.psn.value()))
        .collect()
}

/// The AETH syndromes of everything sent from `src` to `dst` (None: no AETH).
fn syndromes(p: &Pair, src: QpId, dst: QpId) -> Vec<Option<Syndrome>> {
    p.net
        .trace()
        .transmitted(src.node, dst.node)
        .iter()
        .map(|(_, s)| s.syndrome())
        .collect()
}

#[track_caller]
fn expect_sent(p: &Pair, src: QpId, dst: QpId, expected: &[(u64, u8, u32)]) {
    let got = sent(p, src, dst);
    assert_eq!(
        got,
        expected,
        "packets {src} -> {dst}\ntrace:\n{}",
        p.net.trace()
    );
}

const ACK: Option<Syndrome> = Some(Syndrome::ACK_NO_CREDIT);
const SEQ_NAK: Option<Syndrome> = Some(Syndrome::Nak(NakCode::PsnSequenceError));

/// Deterministic test bytes.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

struct SendSetup {
    src: RegionHandle,
    dst: RegionHandle,
    data: Vec<u8>,
}

/// A `len`-byte message in A's memory and a receive buffer of `len` bytes posted on B.
fn setup_send(p: &mut Pair, len: usize) -> SendSetup {
    let (a, b) = (p.a, p.b);
    let src = p.register(a, len.max(1), Access::LOCAL_WRITE);
    let dst = p.register(b, len.max(1), Access::LOCAL_WRITE);
    let data = pattern(len, 3);
    p.mem(a).write(&src, 0, &data).unwrap();
    p.post_recv(b, RecvWr::new(500, vec![dst.sge(0, len as u32)]))
        .unwrap();
    SendSetup { src, dst, data }
}

fn send_wr(wr_id: u64, s: &SendSetup, len: u32) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOpcode::Send, vec![s.src.sge(0, len)]);
    wr.flags = SendFlags::SIGNALED;
    wr
}

/// Waits for one send completion on A and one receive completion on B, checks both are
/// successful and the data arrived.
#[track_caller]
fn finish_send(p: &mut Pair, s: &SendSetup) {
    let (a, b) = (p.a, p.b);
    let swc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    let rwc = p.wait_completions(b, CqKind::Recv, 1).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(swc.len(), 1, "{swc:?}");
    assert_eq!(
        (swc[0].wr_id, swc[0].status, swc[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(rwc.len(), 1, "{rwc:?}");
    assert_eq!(
        (rwc[0].wr_id, rwc[0].status, rwc[0].opcode),
        (500, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(rwc[0].byte_len as usize, s.data.len());
    assert_eq!(p.mem(b).read(&s.dst, 0, s.data.len()).unwrap(), s.data);
    // Nothing completes twice.
    assert!(p.take_completions(a, CqKind::Send).is_empty());
    assert!(p.take_completions(b, CqKind::Recv).is_empty());
}

// ---------------------------------------------------------------------------------------
// Loss of request packets
// ---------------------------------------------------------------------------------------

/// A 3-packet SEND whose FIRST packet is lost: B sees MIDDLE with PSN > ePSN and sends
/// one PSN-sequence-error NAK carrying ePSN (PA); LAST is dropped silently; A goes back
/// to PA on the NAK and resends the whole message (IBA §9.7).
#[test]
fn lost_first_packet() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let s = setup_send(&mut p, 3000);
    p.net.set_filter(0, 1, on(&[0], Verdict::Drop)).unwrap();
    p.post_send(a, send_wr(1, &s, 3000)).unwrap();
    finish_send(&mut p, &s);
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_SEND_FIRST, PA),
            (0, op::RC_SEND_MIDDLE, PA + 1),
            (0, op::RC_SEND_LAST, PA + 2),
            (2 * D, op::RC_SEND_FIRST, PA),
            (2 * D, op::RC_SEND_MIDDLE, PA + 1),
            (2 * D, op::RC_SEND_LAST, PA + 2),
        ],
    );
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_ACKNOWLEDGE, PA),
            (3 * D, op::RC_ACKNOWLEDGE, PA + 2),
        ],
    );
    assert_eq!(syndromes(&p, b, a), [SEQ_NAK, ACK]);
    assert_eq!(p.qp(b).unwrap().counters().seq_naks_sent, 1);
}

/// MIDDLE lost: B NAKs with ePSN = PA + 1 when LAST arrives; A treats PA as acknowledged
/// and resends only MIDDLE and LAST (go-back-N skips the acknowledged packet, IBA §9.7).
#[test]
fn lost_middle_packet() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let s = setup_send(&mut p, 3000);
    p.net.set_filter(0, 1, on(&[1], Verdict::Drop)).unwrap();
    p.post_send(a, send_wr(1, &s, 3000)).unwrap();
    finish_send(&mut p, &s);
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_SEND_FIRST, PA),
            (0, op::RC_SEND_MIDDLE, PA + 1),
            (0, op::RC_SEND_LAST, PA + 2),
            (2 * D, op::RC_SEND_MIDDLE, PA + 1),
            (2 * D, op::RC_SEND_LAST, PA + 2),
        ],
    );
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_ACKNOWLEDGE, PA + 1),
            (3 * D, op::RC_ACKNOWLEDGE, PA + 2),
        ],
    );
    assert_eq!(syndromes(&p, b, a), [SEQ_NAK, ACK]);
}

/// LAST (the only packet with AckReq) lost: nothing tells A, so it resends everything
/// from PA when the local ACK timeout (armed at t = 0) expires. B re-acknowledges the
/// duplicates FIRST and MIDDLE with PSN PA + 1 (the last PSN it processed) and ACKs LAST.
#[test]
fn lost_last_packet_waits_for_the_ack_timeout() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let s = setup_send(&mut p, 3000);
    p.net.set_filter(0, 1, on(&[2], Verdict::Drop)).unwrap();
    p.post_send(a, send_wr(1, &s, 3000)).unwrap();
    finish_send(&mut p, &s);
    let t = t_ack();
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_SEND_FIRST, PA),
            (0, op::RC_SEND_MIDDLE, PA + 1),
            (0, op::RC_SEND_LAST, PA + 2),
            (t, op::RC_SEND_FIRST, PA),
            (t, op::RC_SEND_MIDDLE, PA + 1),
            (t, op::RC_SEND_LAST, PA + 2),
        ],
    );
    // B answers nothing before the retransmission (no AckReq reached it), then: re-ACKs
    // of the duplicates (IBA allows coalescing them) and the ACK of LAST, last.
    let back = sent(&p, b, a);
    let (last, dups) = back.split_last().unwrap();
    assert_eq!(
        *last,
        (t + D, op::RC_ACKNOWLEDGE, PA + 2),
        "{}",
        p.net.trace()
    );
    assert!(dups.len() <= 2, "{}", p.net.trace());
    for d in dups {
        assert_eq!(*d, (t + D, op::RC_ACKNOWLEDGE, PA + 1), "{}", p.net.trace());
    }
    assert!(syndromes(&p, b, a).iter().all(|s| *s == ACK));
    assert_eq!(p.qp(a).unwrap().counters().timeouts, 1);
}

/// The ACK is lost: A's timer resends the SEND at exactly the local ACK timeout; B
/// recognises the duplicate, does not execute it again (the second receive WR stays
/// posted) and re-ACKs it.
#[test]
fn lost_ack() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let s = setup_send(&mut p, 100);
    let spare = p.register(b, 100, Access::LOCAL_WRITE);
    p.post_recv(b, RecvWr::new(501, vec![spare.sge(0, 100)]))
        .unwrap();
    p.net.set_filter(1, 0, on(&[0], Verdict::Drop)).unwrap();
    p.post_send(a, send_wr(1, &s, 100)).unwrap();
    finish_send(&mut p, &s);
    let t = t_ack();
    expect_sent(
        &p,
        a,
        b,
        &[(0, op::RC_SEND_ONLY, PA), (t, op::RC_SEND_ONLY, PA)],
    );
    expect_sent(
        &p,
        b,
        a,
        &[(D, op::RC_ACKNOWLEDGE, PA), (t + D, op::RC_ACKNOWLEDGE, PA)],
    );
    assert_eq!(p.mem(b).read(&spare, 0, 100).unwrap(), vec![0; 100]);
    assert_eq!(p.qp(b).unwrap().counters().duplicates_received, 1);

    // The next message lands in the spare receive WR, with the next PSN.
    p.post_send(a, send_wr(2, &s, 10)).unwrap();
    let rwc = p.wait_completions(b, CqKind::Recv, 1).unwrap();
    assert_eq!((rwc[0].wr_id, rwc[0].byte_len), (501, 10));
    assert_eq!(sent(&p, a, b).last().map(|x| x.2), Some(PA + 1));
}

// ---------------------------------------------------------------------------------------
// Duplication and reordering
// ---------------------------------------------------------------------------------------

/// A SEND delivered twice: executed once (one receive completion, the second receive WR
/// untouched), acknowledged twice, completed once.
#[test]
fn duplicated_send_is_executed_once() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let s = setup_send(&mut p, 64);
    let spare = p.register(b, 64, Access::LOCAL_WRITE);
    p.post_recv(b, RecvWr::new(501, vec![spare.sge(0, 64)]))
        .unwrap();
    p.net
        .set_filter(0, 1, on(&[0], Verdict::Duplicate))
        .unwrap();
    p.post_send(a, send_wr(1, &s, 64)).unwrap();
    finish_send(&mut p, &s);
    expect_sent(&p, a, b, &[(0, op::RC_SEND_ONLY, PA)]);
    expect_sent(
        &p,
        b,
        a,
        &[(D, op::RC_ACKNOWLEDGE, PA), (D, op::RC_ACKNOWLEDGE, PA)],
    );
    assert_eq!(p.net.trace().delivered(0, 1).len(), 2);
    assert_eq!(p.mem(b).read(&spare, 0, 64).unwrap(), vec![0; 64]);
}

/// An RDMA WRITE delivered twice is written once.
#[test]
fn duplicated_write_is_executed_once() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 200, Access::LOCAL_WRITE);
    let dst = p.register(b, 200, Access::REMOTE_WRITE);
    p.mem(a).write(&src, 0, &pattern(200, 9)).unwrap();
    p.net
        .set_filter(0, 1, on(&[0], Verdict::Duplicate))
        .unwrap();
    let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, 200)]);
    wr.flags = SendFlags::SIGNALED;
    wr.remote_addr = dst.va(0);
    wr.rkey = dst.rkey;
    p.post_send(a, wr).unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(p.mem(b).read(&dst, 0, 200).unwrap(), pattern(200, 9));
    assert_eq!(p.mem(b).stats().remote_writes, 1);
    expect_sent(
        &p,
        b,
        a,
        &[(D, op::RC_ACKNOWLEDGE, PA), (D, op::RC_ACKNOWLEDGE, PA)],
    );
}

/// FIRST is held back 50 µs so MIDDLE and LAST arrive first: B NAKs once (ePSN = PA) and
/// drops LAST; A resends from PA at 2D; the resent FIRST (3D) is processed, the late
/// original FIRST (50 µs + D) is a duplicate and only re-acknowledged.
#[test]
fn out_of_order_arrival() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let s = setup_send(&mut p, 3000);
    p.net
        .set_filter(0, 1, on(&[0], Verdict::Delay(Duration::from_micros(50))))
        .unwrap();
    p.post_send(a, send_wr(1, &s, 3000)).unwrap();
    finish_send(&mut p, &s);
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_SEND_FIRST, PA),
            (0, op::RC_SEND_MIDDLE, PA + 1),
            (0, op::RC_SEND_LAST, PA + 2),
            (2 * D, op::RC_SEND_FIRST, PA),
            (2 * D, op::RC_SEND_MIDDLE, PA + 1),
            (2 * D, op::RC_SEND_LAST, PA + 2),
        ],
    );
    let late = 50_000 + D;
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_ACKNOWLEDGE, PA),
            (3 * D, op::RC_ACKNOWLEDGE, PA + 2),
            (late, op::RC_ACKNOWLEDGE, PA + 2),
        ],
    );
    assert_eq!(syndromes(&p, b, a), [SEQ_NAK, ACK, ACK]);
    let c = p.qp(b).unwrap().counters();
    assert_eq!((c.seq_naks_sent, c.dropped_out_of_sequence), (1, 1));
}

// ---------------------------------------------------------------------------------------
// RNR
// ---------------------------------------------------------------------------------------

/// No receive WR at B: RNR NAK (syndrome 0x20 | min_rnr_timer, PSN of the SEND). A waits
/// the timer's delay (code 12 = 0.64 ms) after the NAK arrives and resends; by then B has
/// a receive WR and the SEND succeeds.
#[test]
fn rnr_then_success() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 100, Access::LOCAL_WRITE);
    let dst = p.register(b, 100, Access::LOCAL_WRITE);
    p.mem(a).write(&src, 0, &pattern(100, 1)).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::Send, vec![src.sge(0, 100)]);
    wr.flags = SendFlags::SIGNALED;
    p.post_send(a, wr).unwrap();
    p.run_until(|n| n.qp(b).is_ok_and(|q| q.counters().rnr_naks_sent == 1))
        .unwrap();
    p.post_recv(b, RecvWr::new(9, vec![dst.sge(0, 100)]))
        .unwrap();
    let swc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    let rwc = p.wait_completions(b, CqKind::Recv, 1).unwrap();
    assert_eq!(swc[0].status, WcStatus::Success);
    assert_eq!((rwc[0].wr_id, rwc[0].byte_len), (9, 100));
    assert_eq!(p.mem(b).read(&dst, 0, 100).unwrap(), pattern(100, 1));
    let rnr = rnr_timer_micros(12) * 1000;
    assert_eq!(rnr, 640_000);
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_SEND_ONLY, PA),
            (2 * D + rnr, op::RC_SEND_ONLY, PA),
        ],
    );
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_ACKNOWLEDGE, PA),
            (3 * D + rnr, op::RC_ACKNOWLEDGE, PA),
        ],
    );
    assert_eq!(
        syndromes(&p, b, a),
        [Some(Syndrome::RnrNak { timer: 12 }), ACK]
    );
}

/// rnr_retry = 2 and B never posts a receive: the SEND goes out 3 times (1 + 2 retries),
/// each answered by an RNR NAK; the third NAK completes it with RNR_RETRY_EXC_ERR, A goes
/// to ERR and the WR behind it is flushed. The second SEND (PA + 1) is pipelined behind
/// the first each time; B, whose ePSN stays at the RNR-NAKed PA, answers it with nothing:
/// one NAK per gap, and the RNR NAK already told A where to resume (a sequence NAK would
/// make A resend before the RNR delay).
#[test]
fn rnr_retry_exhaustion() {
    let mut p = pair_with(|a, _| a.rnr_retry = 2);
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 8, Access::LOCAL_WRITE);
    p.post_send(a, SendWr::new(1, SendOpcode::Send, vec![src.sge(0, 8)]))
        .unwrap();
    p.post_send(a, SendWr::new(2, SendOpcode::Send, vec![src.sge(0, 8)]))
        .unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 2).unwrap();
    p.run_until_quiet().unwrap();
    // Unsignalled, but errors are always reported (IBA §10.8).
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.qp(a).unwrap().state(), QpState::Err);
    let cycle = 2 * D + rnr_timer_micros(12) * 1000;
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_SEND_ONLY, PA),
            (0, op::RC_SEND_ONLY, PA + 1),
            (cycle, op::RC_SEND_ONLY, PA),
            (cycle, op::RC_SEND_ONLY, PA + 1),
            (2 * cycle, op::RC_SEND_ONLY, PA),
            (2 * cycle, op::RC_SEND_ONLY, PA + 1),
        ],
    );
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_ACKNOWLEDGE, PA),
            (cycle + D, op::RC_ACKNOWLEDGE, PA),
            (2 * cycle + D, op::RC_ACKNOWLEDGE, PA),
        ],
    );
    assert_eq!(
        syndromes(&p, b, a),
        [Some(Syndrome::RnrNak { timer: 12 }); 3]
    );
    // The failure happened when the third NAK arrived.
    assert_eq!(
        p.net.trace().delivered(1, 0).last().map(|x| x.0),
        Some(Instant::from_nanos(2 * cycle + 2 * D))
    );
    // B is unaffected by A's error.
    assert_eq!(p.qp(b).unwrap().state(), QpState::Rts);
}

// ---------------------------------------------------------------------------------------
// Retry exhaustion
// ---------------------------------------------------------------------------------------

/// Everything A sends is lost and retry_cnt = 3: the SEND goes out at 0, T, 2T, 3T
/// (T = local ACK timeout) and completes with RETRY_EXC_ERR at 4T; A goes to ERR.
#[test]
fn retry_exhaustion() {
    let mut p = pair_with(|a, _| a.retry_cnt = 3);
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 8, Access::LOCAL_WRITE);
    p.net
        .set_link(
            0,
            1,
            LinkConfig {
                loss: 1.0,
                ..LinkConfig::PERFECT
            },
        )
        .unwrap();
    p.post_send(a, SendWr::new(1, SendOpcode::Send, vec![src.sge(0, 8)]))
        .unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    let t = t_ack();
    assert_eq!(p.net.now(), Instant::from_nanos(4 * t));
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::RetryExcErr));
    assert_eq!(p.qp(a).unwrap().state(), QpState::Err);
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_SEND_ONLY, PA),
            (t, op::RC_SEND_ONLY, PA),
            (2 * t, op::RC_SEND_ONLY, PA),
            (3 * t, op::RC_SEND_ONLY, PA),
        ],
    );
    p.run_until_quiet().unwrap();
    assert_eq!(p.net.now(), Instant::from_nanos(4 * t));
}

/// retry_cnt = 7 is finite (IBA; rxe deviates): 1 + 7 transmissions, then RETRY_EXC_ERR
/// at 8T.
#[test]
fn retry_cnt_seven_is_not_infinite() {
    let mut p = pair_with(|a, _| a.retry_cnt = 7);
    let a = p.a;
    let src = p.register(a, 8, Access::LOCAL_WRITE);
    p.net
        .set_link(
            0,
            1,
            LinkConfig {
                loss: 1.0,
                ..LinkConfig::PERFECT
            },
        )
        .unwrap();
    p.post_send(a, SendWr::new(1, SendOpcode::Send, vec![src.sge(0, 8)]))
        .unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    assert_eq!(wc[0].status, WcStatus::RetryExcErr);
    assert_eq!(p.net.now(), Instant::from_nanos(8 * t_ack()));
    assert_eq!(p.net.stats().transmitted, 8);
}

// ---------------------------------------------------------------------------------------
// Remote access violations, length errors
// ---------------------------------------------------------------------------------------

/// Posts `wr` on A, waits for its completion, and returns (A's status, the NAK syndrome
/// B sent, B's state, B's events).
fn remote_error(
    p: &mut Pair,
    wr: SendWr,
) -> (WcStatus, Vec<Option<Syndrome>>, QpState, Vec<QpEvent>) {
    let (a, b) = (p.a, p.b);
    p.post_send(a, wr).unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(wc.len(), 1);
    assert_eq!(
        p.qp(a).unwrap().state(),
        QpState::Err,
        "the requester goes to ERR"
    );
    let events = p.net.take_events(b).unwrap();
    (
        wc[0].status,
        syndromes(p, b, a),
        p.qp(b).unwrap().state(),
        events,
    )
}

const ACCESS_NAK: Option<Syndrome> = Some(Syndrome::Nak(NakCode::RemoteAccessError));
const INVALID_NAK: Option<Syndrome> = Some(Syndrome::Nak(NakCode::InvalidRequest));

fn write_wr(src: &RegionHandle, len: u32, va: u64, rkey: u32) -> SendWr {
    let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, len)]);
    wr.remote_addr = va;
    wr.rkey = rkey;
    wr
}

#[test]
fn write_with_bad_rkey_is_a_remote_access_error() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 64, Access::LOCAL_WRITE);
    let dst = p.register(b, 64, Access::REMOTE_WRITE);
    let (status, naks, b_state, b_events) =
        remote_error(&mut p, write_wr(&src, 64, dst.va(0), dst.rkey ^ 0x100));
    assert_eq!(status, WcStatus::RemAccessErr);
    assert_eq!(naks, [ACCESS_NAK]);
    expect_sent(&p, b, a, &[(D, op::RC_ACKNOWLEDGE, PA)]);
    assert_eq!(b_state, QpState::Err);
    assert_eq!(b_events, [QpEvent::QpAccessErr]);
    assert_eq!(p.mem(b).read(&dst, 0, 64).unwrap(), vec![0; 64]);
}

#[test]
fn write_out_of_bounds_is_a_remote_access_error() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 64, Access::LOCAL_WRITE);
    let dst = p.register(b, 64, Access::REMOTE_WRITE);
    let (status, naks, b_state, _) = remote_error(&mut p, write_wr(&src, 64, dst.va(1), dst.rkey));
    assert_eq!(status, WcStatus::RemAccessErr);
    assert_eq!(naks, [ACCESS_NAK]);
    assert_eq!(b_state, QpState::Err);
    assert_eq!(p.mem(b).read(&dst, 0, 64).unwrap(), vec![0; 64]);
}

/// A multi-packet WRITE whose range ends past the region: the RETH covers the whole
/// message, so the FIRST packet is already refused and nothing is written.
#[test]
fn multi_packet_write_out_of_bounds_writes_nothing() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 4096, Access::LOCAL_WRITE);
    let dst = p.register(b, 4000, Access::REMOTE_WRITE);
    p.mem(a).write(&src, 0, &pattern(4096, 5)).unwrap();
    let (status, naks, _, _) = remote_error(&mut p, write_wr(&src, 4096, dst.va(0), dst.rkey));
    assert_eq!(status, WcStatus::RemAccessErr);
    assert_eq!(naks, [ACCESS_NAK]);
    expect_sent(&p, b, a, &[(D, op::RC_ACKNOWLEDGE, PA)]);
    assert_eq!(p.mem(b).read(&dst, 0, 4000).unwrap(), vec![0; 4000]);
}

#[test]
fn read_without_region_permission_is_a_remote_access_error() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let dst = p.register(a, 64, Access::LOCAL_WRITE);
    let src = p.register(b, 64, Access::REMOTE_WRITE);
    let mut wr = SendWr::new(1, SendOpcode::RdmaRead, vec![dst.sge(0, 64)]);
    wr.remote_addr = src.va(0);
    wr.rkey = src.rkey;
    let (status, naks, b_state, _) = remote_error(&mut p, wr);
    assert_eq!(status, WcStatus::RemAccessErr);
    assert_eq!(naks, [ACCESS_NAK]);
    assert_eq!(b_state, QpState::Err);
}

#[test]
fn atomic_without_region_permission_is_a_remote_access_error() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let res = p.register(a, 8, Access::LOCAL_WRITE);
    let ctr = p.register(b, 8, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let mut wr = SendWr::new(1, SendOpcode::AtomicFetchAndAdd, vec![res.sge(0, 8)]);
    wr.remote_addr = ctr.va(0);
    wr.rkey = ctr.rkey;
    wr.compare_add = 1;
    let (status, naks, _, _) = remote_error(&mut p, wr);
    assert_eq!(status, WcStatus::RemAccessErr);
    assert_eq!(naks, [ACCESS_NAK]);
    assert_eq!(p.mem(b).read_u64(&ctr, 0).unwrap(), 0);
    assert_eq!(p.mem(b).stats().atomics, 0);
}

/// The QP itself does not allow remote READ: NAK Invalid Request (IBA §9.7).
#[test]
fn read_without_qp_permission_is_an_invalid_request() {
    let mut p = pair_with(|_, b| b.access = RemoteAccess::WRITE | RemoteAccess::ATOMIC);
    let (a, b) = (p.a, p.b);
    let dst = p.register(a, 64, Access::LOCAL_WRITE);
    let src = p.register(b, 64, Access::REMOTE_READ);
    let mut wr = SendWr::new(1, SendOpcode::RdmaRead, vec![dst.sge(0, 64)]);
    wr.remote_addr = src.va(0);
    wr.rkey = src.rkey;
    let (status, naks, b_state, b_events) = remote_error(&mut p, wr);
    assert_eq!(status, WcStatus::RemInvReqErr);
    assert_eq!(naks, [INVALID_NAK]);
    assert_eq!(b_state, QpState::Err);
    assert_eq!(b_events, [QpEvent::QpReqErr]);
}

/// A 100-byte SEND into a 10-byte receive buffer: B completes its receive WR with
/// LOC_LEN_ERR (verbs: "a WR posted in a local receive queue isn't big enough for the
/// incoming message"), NAKs Invalid Request, and both QPs end in ERR; the WR behind the
/// SEND on A and the receive WR behind the short one on B are flushed.
#[test]
fn receive_buffer_too_small() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 100, Access::LOCAL_WRITE);
    let dst = p.register(b, 100, Access::LOCAL_WRITE);
    p.post_recv(b, RecvWr::new(70, vec![dst.sge(0, 10)]))
        .unwrap();
    p.post_recv(b, RecvWr::new(71, vec![dst.sge(10, 90)]))
        .unwrap();
    p.post_send(a, SendWr::new(1, SendOpcode::Send, vec![src.sge(0, 100)]))
        .unwrap();
    p.post_send(a, SendWr::new(2, SendOpcode::Send, vec![src.sge(0, 1)]))
        .unwrap();
    let swc = p.wait_completions(a, CqKind::Send, 2).unwrap();
    let rwc = p.wait_completions(b, CqKind::Recv, 2).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(
        swc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        rwc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(70, WcStatus::LocLenErr), (71, WcStatus::WrFlushErr)]
    );
    assert_eq!(syndromes(&p, b, a), [INVALID_NAK]);
    assert_eq!(p.qp(a).unwrap().state(), QpState::Err);
    assert_eq!(p.qp(b).unwrap().state(), QpState::Err);
}

// ---------------------------------------------------------------------------------------
// READ and atomics under loss
// ---------------------------------------------------------------------------------------

fn read_setup(p: &mut Pair, len: usize) -> (RegionHandle, RegionHandle, Vec<u8>) {
    let (a, b) = (p.a, p.b);
    let local = p.register(a, len, Access::LOCAL_WRITE);
    let remote = p.register(b, len, Access::REMOTE_READ);
    let data = pattern(len, 77);
    p.mem(b).write(&remote, 0, &data).unwrap();
    (local, remote, data)
}

fn read_wr(local: &RegionHandle, remote: &RegionHandle, len: u32) -> SendWr {
    let mut wr = SendWr::new(1, SendOpcode::RdmaRead, vec![local.sge(0, len)]);
    wr.flags = SendFlags::SIGNALED;
    wr.remote_addr = remote.va(0);
    wr.rkey = remote.rkey;
    wr
}

/// A 3000-byte READ (3 response packets, PSNs PA..PA+2) whose MIDDLE response is lost.
/// A keeps FIRST; LAST arrives with PSN PA + 2 while PA + 1 is expected. Responses of one
/// RC connection arrive in order, so the gap means loss: an implied NAK (IBA), and A
/// re-issues a READ for the remaining 1976 bytes with PSN PA + 1 and VA advanced by one
/// PMTU (IBA §9.7) at once (rxe instead drops LAST and waits for the ACK timeout). B
/// replays from its responder resource.
#[test]
fn read_response_lost() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let (local, remote, data) = read_setup(&mut p, 3000);
    p.net.set_filter(1, 0, on(&[1], Verdict::Drop)).unwrap();
    p.post_send(a, read_wr(&local, &remote, 3000)).unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(
        (wc[0].status, wc[0].opcode, wc[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 3000)
    );
    assert_eq!(p.mem(a).read(&local, 0, 3000).unwrap(), data);
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_RDMA_READ_REQUEST, PA),
            (2 * D, op::RC_RDMA_READ_REQUEST, PA + 1),
        ],
    );
    let reqs = p.net.trace().transmitted(0, 1);
    assert_eq!(reqs[0].1.dma_len, Some(3000));
    assert_eq!(reqs[1].1.dma_len, Some(1976));
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_RDMA_READ_RESPONSE_FIRST, PA),
            (D, op::RC_RDMA_READ_RESPONSE_MIDDLE, PA + 1),
            (D, op::RC_RDMA_READ_RESPONSE_LAST, PA + 2),
            (3 * D, op::RC_RDMA_READ_RESPONSE_FIRST, PA + 1),
            (3 * D, op::RC_RDMA_READ_RESPONSE_LAST, PA + 2),
        ],
    );
    assert_eq!(p.qp(a).unwrap().counters().timeouts, 0);
    // The next request uses the PSN after the READ's range.
    let src = p.register(a, 4, Access::LOCAL_WRITE);
    let dst = p.register(b, 4, Access::LOCAL_WRITE);
    p.post_recv(b, RecvWr::new(3, vec![dst.sge(0, 4)])).unwrap();
    p.post_send(a, SendWr::new(2, SendOpcode::Send, vec![src.sge(0, 4)]))
        .unwrap();
    p.wait_completions(b, CqKind::Recv, 1).unwrap();
    assert_eq!(
        sent(&p, a, b).last().map(|x| (x.1, x.2)),
        Some((op::RC_SEND_ONLY, PA + 3))
    );
}

/// The LAST READ response is lost: the re-issued READ asks for the last 952 bytes only
/// (one RESPONSE_ONLY with PSN PA + 2).
#[test]
fn read_last_response_lost() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let (local, remote, data) = read_setup(&mut p, 3000);
    p.net.set_filter(1, 0, on(&[2], Verdict::Drop)).unwrap();
    p.post_send(a, read_wr(&local, &remote, 3000)).unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(p.mem(a).read(&local, 0, 3000).unwrap(), data);
    let t = t_ack();
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_RDMA_READ_REQUEST, PA),
            (2 * D + t, op::RC_RDMA_READ_REQUEST, PA + 2),
        ],
    );
    assert_eq!(p.net.trace().transmitted(0, 1)[1].1.dma_len, Some(952));
    assert_eq!(
        sent(&p, b, a)[3..],
        [(3 * D + t, op::RC_RDMA_READ_RESPONSE_ONLY, PA + 2)]
    );
}

/// A READ request lost entirely: resent whole at T.
#[test]
fn read_request_lost() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let (local, remote, data) = read_setup(&mut p, 100);
    p.net.set_filter(0, 1, on(&[0], Verdict::Drop)).unwrap();
    p.post_send(a, read_wr(&local, &remote, 100)).unwrap();
    p.wait_completions(a, CqKind::Send, 1).unwrap();
    assert_eq!(p.mem(a).read(&local, 0, 100).unwrap(), data);
    let t = t_ack();
    expect_sent(
        &p,
        a,
        b,
        &[
            (0, op::RC_RDMA_READ_REQUEST, PA),
            (t, op::RC_RDMA_READ_REQUEST, PA),
        ],
    );
    expect_sent(&p, b, a, &[(t + D, op::RC_RDMA_READ_RESPONSE_ONLY, PA)]);
}

fn fetch_add_wr(res: &RegionHandle, ctr: &RegionHandle, add: u64) -> SendWr {
    let mut wr = SendWr::new(1, SendOpcode::AtomicFetchAndAdd, vec![res.sge(0, 8)]);
    wr.flags = SendFlags::SIGNALED;
    wr.remote_addr = ctr.va(0);
    wr.rkey = ctr.rkey;
    wr.compare_add = add;
    wr
}

/// A FETCH_ADD delivered twice: executed once (counter 100 → 105, one atomic executed);
/// B answers the duplicate from its responder resource with the same original value.
#[test]
fn duplicated_atomic_is_executed_once() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let res = p.register(a, 8, Access::LOCAL_WRITE);
    let ctr = p.register(b, 8, Access::REMOTE_ATOMIC);
    p.mem(b).write_u64(&ctr, 0, 100).unwrap();
    p.net
        .set_filter(0, 1, on(&[0], Verdict::Duplicate))
        .unwrap();
    p.post_send(a, fetch_add_wr(&res, &ctr, 5)).unwrap();
    let wc = p.wait_completions(a, CqKind::Send, 1).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(
        (wc[0].status, wc[0].opcode, wc[0].byte_len),
        (WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    assert_eq!(p.mem(b).read_u64(&ctr, 0).unwrap(), 105);
    assert_eq!(p.mem(b).stats().atomics, 1);
    assert_eq!(p.mem(a).read_u64(&res, 0).unwrap(), 100);
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_ATOMIC_ACKNOWLEDGE, PA),
            (D, op::RC_ATOMIC_ACKNOWLEDGE, PA),
        ],
    );
    let origs: Vec<_> = p
        .net
        .trace()
        .transmitted(1, 0)
        .iter()
        .map(|(_, s)| s.atomic_orig)
        .collect();
    assert_eq!(origs, [Some(100), Some(100)]);
}

/// The ATOMIC_ACKNOWLEDGE is lost: A resends the FETCH_ADD at T; B replays the stored
/// result without executing again.
#[test]
fn atomic_ack_lost_is_not_executed_twice() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let res = p.register(a, 8, Access::LOCAL_WRITE);
    let ctr = p.register(b, 8, Access::REMOTE_ATOMIC);
    p.mem(b).write_u64(&ctr, 0, 7).unwrap();
    p.net.set_filter(1, 0, on(&[0], Verdict::Drop)).unwrap();
    p.post_send(a, fetch_add_wr(&res, &ctr, 1000)).unwrap();
    p.wait_completions(a, CqKind::Send, 1).unwrap();
    let t = t_ack();
    expect_sent(
        &p,
        a,
        b,
        &[(0, op::RC_FETCH_ADD, PA), (t, op::RC_FETCH_ADD, PA)],
    );
    expect_sent(
        &p,
        b,
        a,
        &[
            (D, op::RC_ATOMIC_ACKNOWLEDGE, PA),
            (t + D, op::RC_ATOMIC_ACKNOWLEDGE, PA),
        ],
    );
    assert_eq!(p.mem(b).read_u64(&ctr, 0).unwrap(), 1007);
    assert_eq!(p.mem(b).stats().atomics, 1);
    assert_eq!(p.mem(a).read_u64(&res, 0).unwrap(), 7);
}

/// A duplicated COMPARE_SWAP that succeeded the first time must not be re-evaluated (the
/// second evaluation would fail the compare and return the new value).
#[test]
fn duplicated_compare_swap_returns_the_first_result() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let res = p.register(a, 8, Access::LOCAL_WRITE);
    let word = p.register(b, 8, Access::REMOTE_ATOMIC);
    p.mem(b).write_u64(&word, 0, 1).unwrap();
    p.net
        .set_filter(0, 1, on(&[0], Verdict::Duplicate))
        .unwrap();
    let mut wr = SendWr::new(1, SendOpcode::AtomicCmpAndSwp, vec![res.sge(0, 8)]);
    wr.flags = SendFlags::SIGNALED;
    wr.remote_addr = word.va(0);
    wr.rkey = word.rkey;
    wr.compare_add = 1;
    wr.swap = 2;
    p.post_send(a, wr).unwrap();
    p.wait_completions(a, CqKind::Send, 1).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(p.mem(b).read_u64(&word, 0).unwrap(), 2);
    assert_eq!(p.mem(a).read_u64(&res, 0).unwrap(), 1);
    let origs: Vec<_> = p
        .net
        .trace()
        .transmitted(1, 0)
        .iter()
        .map(|(_, s)| s.atomic_orig)
        .collect();
    assert_eq!(origs, [Some(1), Some(1)]);
}

// ---------------------------------------------------------------------------------------
// Immediate data, invalidation, ACK coalescing
// ---------------------------------------------------------------------------------------

/// WRITE_WITH_IMM consumes a receive WR: RECV_RDMA_WITH_IMM, byte_len = the RETH length,
/// the immediate; SEND_WITH_INV invalidates the named region and reports it.
#[test]
fn immediate_and_invalidate_completions() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 300, Access::LOCAL_WRITE);
    p.mem(a).write(&src, 0, &pattern(300, 4)).unwrap();
    let target = p.register(b, 300, Access::REMOTE_WRITE);
    let victim = p.register(b, 16, Access::REMOTE_READ);
    let rbuf = p.register(b, 64, Access::LOCAL_WRITE);
    for id in [40, 41] {
        p.post_recv(b, RecvWr::new(id, vec![rbuf.sge(0, 64)]))
            .unwrap();
    }
    let mut w = SendWr::new(1, SendOpcode::RdmaWriteWithImm, vec![src.sge(0, 300)]);
    w.remote_addr = target.va(0);
    w.rkey = target.rkey;
    w.imm_data = 0xDEAD_BEEF;
    p.post_send(a, w).unwrap();
    let mut s = SendWr::new(2, SendOpcode::SendWithInv, vec![src.sge(0, 20)]);
    s.invalidate_rkey = victim.rkey;
    p.post_send(a, s).unwrap();
    let rwc = p.wait_completions(b, CqKind::Recv, 2).unwrap();
    assert_eq!(rwc[0].wr_id, 40);
    assert_eq!(
        (rwc[0].status, rwc[0].opcode, rwc[0].byte_len),
        (WcStatus::Success, WcOpcode::RecvRdmaWithImm, 300)
    );
    assert!(rwc[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(rwc[0].imm_data, 0xDEAD_BEEF);
    assert_eq!(rwc[1].wr_id, 41);
    assert_eq!(
        (rwc[1].status, rwc[1].opcode, rwc[1].byte_len),
        (WcStatus::Success, WcOpcode::Recv, 20)
    );
    assert!(rwc[1].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(rwc[1].invalidated_rkey, victim.rkey);
    assert!(!p.mem(b).is_valid(&victim).unwrap());
    assert_eq!(p.mem(b).read(&target, 0, 300).unwrap(), pattern(300, 4));
    assert_eq!(p.mem(b).read(&rbuf, 0, 20).unwrap(), pattern(20, 4));
    let ops: Vec<u8> = sent(&p, a, b).iter().map(|x| x.1).collect();
    assert_eq!(
        ops,
        [
            op::RC_RDMA_WRITE_ONLY_WITH_IMM,
            op::RC_SEND_ONLY_WITH_INVALIDATE
        ]
    );
}

/// Unsignalled WRs complete silently; AckReq only on the last packet of each message; one
/// ACK may complete several WRs, and completions keep posting order.
#[test]
fn ack_req_only_on_message_ends_and_signalled_completions_in_order() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let src = p.register(a, 2048, Access::LOCAL_WRITE);
    let dst = p.register(b, 4 * 2048, Access::REMOTE_WRITE);
    for i in 0..4u64 {
        let mut wr = SendWr::new(i, SendOpcode::RdmaWrite, vec![src.sge(0, 2048)]);
        wr.remote_addr = dst.va(i * 2048);
        wr.rkey = dst.rkey;
        if i % 2 == 1 {
            wr.flags = SendFlags::SIGNALED;
        }
        p.post_send(a, wr).unwrap();
    }
    let wc = p.wait_completions(a, CqKind::Send, 2).unwrap();
    p.run_until_quiet().unwrap();
    assert_eq!(wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 3]);
    let reqs = p.net.trace().transmitted(0, 1);
    let acks: Vec<(u8, u32, bool)> = reqs
        .iter()
        .map(|(_, s)| (s.opcode, s.psn.value(), s.ack_req))
        .collect();
    let mut expected = Vec::new();
    for i in 0..4 {
        expected.push((op::RC_RDMA_WRITE_FIRST, PA + 2 * i, false));
        expected.push((op::RC_RDMA_WRITE_LAST, PA + 2 * i + 1, true));
    }
    assert_eq!(acks, expected);
    assert!(p.take_completions(a, CqKind::Send).is_empty());
    assert!(p.take_completions(b, CqKind::Recv).is_empty());
}

/// B's own requests to A use B's PSN space (PB), independent of A's.
#[test]
fn both_directions_use_their_own_psns() {
    let mut p = pair();
    let (a, b) = (p.a, p.b);
    let sa = p.register(a, 8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let sb = p.register(b, 8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut wa = write_wr(&sa, 8, sb.va(0), sb.rkey);
    wa.flags = SendFlags::SIGNALED;
    let mut wb = write_wr(&sb, 8, sa.va(0), sa.rkey);
    wb.flags = SendFlags::SIGNALED;
    p.post_send(a, wa).unwrap();
    p.post_send(b, wb).unwrap();
    p.wait_completions(a, CqKind::Send, 1).unwrap();
    p.wait_completions(b, CqKind::Send, 1).unwrap();
    expect_sent(
        &p,
        a,
        b,
        &[(0, op::RC_RDMA_WRITE_ONLY, PA), (D, op::RC_ACKNOWLEDGE, PB)],
    );
    expect_sent(
        &p,
        b,
        a,
        &[(0, op::RC_RDMA_WRITE_ONLY, PB), (D, op::RC_ACKNOWLEDGE, PA)],
    );
}
