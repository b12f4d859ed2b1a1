//! IBA 1.5 ATOMIC WRITE (opcode 0x1D): one request with a RETH (DMA length 8) and the 8
//! bytes, stored at the target as one 64-bit store, answered by a zero-length RDMA READ
//! RESPONSE ONLY; remembered as a responder resource, so that a duplicate is answered
//! again without a second store.

use uroce_wire::aeth::{NakCode, Syndrome};
use uroce_wire::opcode::op;
use uroce_wire::{aeth, bth, reth, PacketRepr};

use super::*;
use crate::qp_state::{QpState, QpType};
use crate::rc::{PostError, RemoteAccess};
use crate::wr::{SendPayload, WcOpcode, WcStatus, WrError};

/// The 8 bytes A writes (distinct, so a byte-order slip shows).
const VALUE: [u8; 8] = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];

/// An ATOMIC WRITE of `value` (inline) to B's `va` under rkey 2.
fn aw(wr_id: u64, va: u64, value: [u8; 8]) -> SendWr {
    let mut w = rdma(wr_id, SendOpcode::AtomicWrite, vec![], va, 2);
    w.payload = SendPayload::Inline(value[..].into());
    w
}

/// A's region 1 and B's region 2 (`b_access`), both 4 KiB at 0x1000.
fn pair(b_access: Access) -> Pair {
    let p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 4096, b_access);
    p
}

/// Hands `pkt` to `side` and returns what that side transmits next (opcode, PSN,
/// syndrome, payload length).
fn feed(p: &mut Pair, side: Side, pkt: &PacketRepr<'_>) -> Vec<(u8, u32, Option<Syndrome>, usize)> {
    let now = p.now;
    p.with_env(side, |qp, env| qp.receive(now, pkt, env));
    p.drain(side)
        .iter()
        .map(|x| (x.opcode, x.psn.value(), x.syndrome, x.payload_len))
        .collect()
}

#[test]
fn stores_the_eight_bytes_and_completes_on_an_empty_read_response() {
    let mut p = pair(REMOTE_WRITE);
    // From an SGE (as ibv_post_send carries it) and inline, between a WRITE and a SEND.
    p.mem_a.put(1, 0x1100, &VALUE);
    p.b.post_recv(recv(9, vec![])).unwrap();
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 300, 1)],
        0x1800,
        2,
    ))
    .unwrap();
    p.a.post_send(rdma(
        2,
        SendOpcode::AtomicWrite,
        vec![sge(0x1100, 8, 1)],
        0x1008,
        2,
    ))
    .unwrap();
    let mut reversed = VALUE;
    reversed.reverse();
    p.a.post_send(aw(3, 0x1010, reversed)).unwrap();
    p.a.post_send(wr(4, SendOpcode::Send, vec![])).unwrap();
    p.run();

    assert_eq!(
        p.mem_b.get(2, 0x1008, 8),
        VALUE,
        "bytes in wire (= memory) order"
    );
    assert_eq!(p.mem_b.get(2, 0x1010, 8), reversed);
    assert_eq!(p.mem_b.get(2, 0x1000, 8), [0; 8], "nothing else written");
    assert_eq!(p.mem_b.get(2, 0x1018, 8), [0; 8]);
    assert_eq!(p.mem_b.stats().atomic_writes, 2);
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.opcode, c.1.byte_len))
        .collect();
    assert_eq!(
        wa,
        [
            (1, WcStatus::Success, WcOpcode::RdmaWrite, 300),
            (2, WcStatus::Success, WcOpcode::AtomicWrite, 8),
            (3, WcStatus::Success, WcOpcode::AtomicWrite, 8),
            (4, WcStatus::Success, WcOpcode::Send, 0),
        ]
    );
    assert_eq!(WcOpcode::AtomicWrite as u32, 9, "IBV_WC_ATOMIC_WRITE");
    // A: WRITE FIRST/LAST (PSN 0, 1), the two ATOMIC WRITEs (2, 3) with 8 payload bytes
    // each, the SEND (4).
    let a: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.psn.value(), s.len))
        .collect();
    assert_eq!(
        a,
        [
            (op::RC_RDMA_WRITE_FIRST, 0, 256),
            (op::RC_RDMA_WRITE_LAST, 1, 44),
            (op::RC_ATOMIC_WRITE, 2, 8),
            (op::RC_ATOMIC_WRITE, 3, 8),
            (op::RC_SEND_ONLY, 4, 0),
        ]
    );
    let aw_pkt = &p.sent(Side::A)[2];
    assert!(aw_pkt.ack_req);
    assert!(
        aw_pkt.text.contains("va=0x1008") && aw_pkt.text.contains("len=8"),
        "{}",
        aw_pkt.text
    );
    // B answers each ATOMIC WRITE with a zero-length READ RESPONSE ONLY at its PSN.
    let b: Vec<_> = p
        .sent(Side::B)
        .iter()
        .filter(|s| s.opcode == op::RC_RDMA_READ_RESPONSE_ONLY)
        .map(|s| (s.psn.value(), s.len))
        .collect();
    assert_eq!(b, [(2, 0), (3, 0)]);
    assert!(p.a.is_idle() && p.b.is_idle());
}

#[test]
fn misaligned_va_is_an_invalid_request() {
    let mut p = pair(ALL);
    p.mem_b.put(2, 0x1000, &[0xEE; 16]);
    // Not refused at post time (as rxe): the responder NAKs it.
    p.a.post_send(aw(1, 0x1004, VALUE)).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 16), [0xEE; 16], "memory untouched");
    assert_eq!(p.mem_b.stats().atomic_writes, 0);
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(wa, [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.events(Side::B), [QpEvent::QpReqErr]);
    assert_eq!(p.b.state(), QpState::Err);
}

#[test]
fn without_remote_write_access_nothing_is_stored() {
    // The region lacks REMOTE_WRITE: NAK Remote Access Error, memory untouched.
    let mut p = pair(LOCAL_WRITE | REMOTE_READ | REMOTE_ATOMIC);
    p.mem_b.put_u64(2, 0x1008, 42);
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    p.run();
    assert_eq!(p.mem_b.get_u64(2, 0x1008), 42, "memory untouched");
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemAccessErr);
    assert_eq!(p.events(Side::B), [QpEvent::QpAccessErr]);
    let naks: Vec<_> = p
        .sent(Side::B)
        .iter()
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(naks, [(op::RC_ACKNOWLEDGE, 0)]);
    assert!(p.sent(Side::B)[0].text.contains("remote access"));

    // Outside the region (the last word straddles its end): the same.
    let mut p = pair(ALL);
    p.a.post_send(aw(1, 0x1000 + 4096, VALUE)).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemAccessErr);

    // The QP lacks REMOTE_WRITE (only READ and ATOMIC): an invalid request.
    let (ca, mut cb) = configs();
    cb.access = RemoteAccess::READ | RemoteAccess::ATOMIC;
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 64, ALL);
    p.mem_b.add(2, 0x1000, 64, ALL);
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemInvReqErr);
    assert_eq!(p.mem_b.get_u64(2, 0x1008), 0, "memory untouched");

    // No responder resources: an invalid request too (as for READ and atomics).
    let (ca, mut cb) = configs();
    cb.max_dest_rd_atomic = 0;
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 64, ALL);
    p.mem_b.add(2, 0x1000, 64, ALL);
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::RemInvReqErr);
    assert_eq!(p.mem_b.get_u64(2, 0x1008), 0);
}

#[test]
fn duplicate_after_a_lost_response_is_answered_without_storing_again() {
    let mut p = pair(ALL);
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    // B's answer is lost; A times out and sends the request again.
    p.drop_packets(Side::B, 1, |pkt| {
        pkt.bth.opcode == op::RC_RDMA_READ_RESPONSE_ONLY
    });
    assert!(p.run_until(|p| p.b.counters().read_responses_sent == 1));
    assert_eq!(p.mem_b.get(2, 0x1008, 8), VALUE, "stored once");
    // The target's application changes the word before the duplicate arrives: a second
    // store would overwrite this.
    p.mem_b.put_u64(2, 0x1008, 0x0123_4567_89ab_cdef);
    p.run();
    assert_eq!(
        p.mem_b.get_u64(2, 0x1008),
        0x0123_4567_89ab_cdef,
        "the duplicate was not executed"
    );
    assert_eq!(p.mem_b.stats().atomic_writes, 1);
    assert_eq!(p.a.counters().timeouts, 1);
    assert_eq!(p.b.counters().duplicates_received, 1);
    assert_eq!(p.b.counters().read_responses_sent, 2, "answered again");
    let reqs: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(reqs, [(op::RC_ATOMIC_WRITE, 0), (op::RC_ATOMIC_WRITE, 0)]);
    let c = p.completions(Side::A);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].1.status, c[0].1.opcode),
        (WcStatus::Success, WcOpcode::AtomicWrite)
    );
}

#[test]
fn lost_request_is_sent_again_after_the_timeout() {
    let mut p = pair(ALL);
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    p.drop_packets(Side::A, 1, |pkt| pkt.bth.opcode == op::RC_ATOMIC_WRITE);
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1008, 8), VALUE);
    assert_eq!(p.mem_b.stats().atomic_writes, 1);
    assert_eq!(p.a.counters().timeouts, 1);
    assert_eq!(p.a.counters().retransmitted_packets, 1);
    assert_eq!(p.b.counters().duplicates_received, 0);
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}

#[test]
fn ack_beyond_an_unanswered_atomic_write_is_an_implicit_nak() {
    let mut p = pair(ALL);
    p.b.post_recv(recv(7, vec![])).unwrap();
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    // The empty READ response is lost; the ACK of the SEND (PSN 1) arrives: A goes back
    // to PSN 0 at once (no timeout), B answers the duplicate from its resource and
    // re-acknowledges the SEND, which is delivered once.
    p.drop_packets(Side::B, 1, |pkt| {
        pkt.bth.opcode == op::RC_RDMA_READ_RESPONSE_ONLY
    });
    p.run();
    assert_eq!(p.a.counters().implicit_naks, 1);
    assert_eq!(p.a.counters().timeouts, 0);
    assert_eq!(p.mem_b.stats().atomic_writes, 1);
    let ids: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(ids, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.completions(Side::B).len(), 1, "the SEND arrived once");
}

#[test]
fn counts_against_max_rd_atomic_and_fence_waits_for_it() {
    let (mut ca, cb) = configs();
    ca.max_rd_atomic = 1;
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 4096, ALL);
    p.b.post_recv(recv(7, vec![])).unwrap();
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    p.a.post_send(aw(2, 0x1010, VALUE)).unwrap();
    let mut fenced = wr(3, SendOpcode::Send, vec![]);
    fenced.flags |= SendFlags::FENCE;
    p.a.post_send(fenced).unwrap();
    assert!(p.round());
    assert_eq!(
        p.sent(Side::A).len(),
        1,
        "one outstanding with max_rd_atomic 1"
    );
    p.run();
    let order: Vec<_> = p
        .log
        .iter()
        .map(|s| (s.from, s.opcode, s.psn.value()))
        .collect();
    assert_eq!(
        order,
        [
            (Side::A, op::RC_ATOMIC_WRITE, 0),
            (Side::B, op::RC_RDMA_READ_RESPONSE_ONLY, 0),
            (Side::A, op::RC_ATOMIC_WRITE, 1),
            (Side::B, op::RC_RDMA_READ_RESPONSE_ONLY, 1),
            (Side::A, op::RC_SEND_ONLY, 2),
            (Side::B, op::RC_ACKNOWLEDGE, 2),
        ]
    );
    assert_eq!(p.completions(Side::A).len(), 3);
}

#[test]
fn post_time_checks() {
    let mut p = pair(ALL);
    for len in [0usize, 7, 9, 16] {
        let mut w = aw(1, 0x1008, VALUE);
        w.payload = SendPayload::Inline(vec![1; len].into());
        assert_eq!(
            p.a.post_send(w),
            Err(PostError::InvalidWr(WrError::AtomicLength {
                len: len as u64
            })),
            "{len} inline bytes"
        );
    }
    // Eight bytes over two SGEs are fine.
    let w = rdma(
        1,
        SendOpcode::AtomicWrite,
        vec![sge(0x1000, 3, 1), sge(0x1100, 5, 1)],
        0x1008,
        2,
    );
    assert_eq!(p.a.post_send(w), Ok(()));
    let w = rdma(
        1,
        SendOpcode::AtomicWrite,
        vec![sge(0x1000, 12, 1)],
        0x1008,
        2,
    );
    assert!(matches!(
        p.a.post_send(w),
        Err(PostError::InvalidWr(WrError::AtomicLength { len: 12 }))
    ));

    let (mut ca, _) = configs();
    ca.max_rd_atomic = 0;
    let mut q = RcQp::new(ca);
    assert_eq!(
        q.post_send(aw(1, 0x1008, VALUE)),
        Err(PostError::InvalidWr(WrError::NoReadAtomicBudget))
    );
    // XRC has no ATOMIC WRITE opcode.
    let (mut ca, _) = configs();
    ca.qp_type = QpType::XrcSend;
    let mut q = RcQp::new(ca);
    assert!(matches!(
        q.post_send(aw(1, 0x1008, VALUE)),
        Err(PostError::InvalidWr(WrError::OpcodeNotSupported {
            opcode: SendOpcode::AtomicWrite,
            ..
        }))
    ));
}

#[test]
fn malformed_requests_and_responses() {
    // A DMA length other than 8 is an invalid request, nothing stored.
    let mut p = pair(ALL);
    let pkt = PacketRepr {
        reth: Some(reth::Repr {
            va: 0x1008,
            rkey: 2,
            dma_len: 16,
        }),
        ..PacketRepr::new(bth_to_b(op::RC_ATOMIC_WRITE, 0), &VALUE)
    };
    let out = feed(&mut p, Side::B, &pkt);
    let nak = Some(Syndrome::Nak(NakCode::InvalidRequest));
    assert_eq!(out, [(op::RC_ACKNOWLEDGE, 0, nak, 0)]);
    assert_eq!(p.mem_b.get_u64(2, 0x1008), 0);

    // A well-formed one is answered with an empty READ RESPONSE ONLY carrying an ACK.
    let mut p = pair(ALL);
    let pkt = PacketRepr {
        reth: Some(reth::Repr {
            va: 0x1008,
            rkey: 2,
            dma_len: 8,
        }),
        ..PacketRepr::new(bth_to_b(op::RC_ATOMIC_WRITE, 0), &VALUE)
    };
    let out = feed(&mut p, Side::B, &pkt);
    assert_eq!(
        out,
        [(
            op::RC_RDMA_READ_RESPONSE_ONLY,
            0,
            Some(Syndrome::ACK_NO_CREDIT),
            0
        )]
    );
    assert_eq!(p.mem_b.get(2, 0x1008, 8), VALUE);
    // The same PSN again (a duplicate) is answered the same way; a duplicate FETCH_ADD
    // with that PSN finds no atomic resource and is dropped.
    p.mem_b.put_u64(2, 0x1008, 5);
    let out = feed(&mut p, Side::B, &pkt);
    assert_eq!(out.len(), 1);
    assert_eq!(p.mem_b.get_u64(2, 0x1008), 5, "not stored again");
    let fa = PacketRepr {
        atomic_eth: Some(uroce_wire::atomic_eth::Repr {
            va: 0x1008,
            rkey: 2,
            swap_add: 1,
            compare: 0,
        }),
        ..PacketRepr::new(bth_to_b(op::RC_FETCH_ADD, 0), &[])
    };
    assert_eq!(feed(&mut p, Side::B, &fa), []);
    assert_eq!(p.b.counters().dropped_unmatched_duplicates, 1);

    // The completer: a READ response with payload answering an ATOMIC WRITE is a bad
    // response.
    let mut p = pair(ALL);
    p.a.post_send(aw(1, 0x1008, VALUE)).unwrap();
    let mut buf = vec![0u8; 4160];
    let now = p.now;
    assert!(p
        .with_env(Side::A, |qp, env| qp.emit(now, env, &mut buf))
        .is_some());
    let resp_bth = bth::Repr {
        dest_qp: QPN_A,
        ack_req: false,
        ..bth_to_b(op::RC_RDMA_READ_RESPONSE_ONLY, 0)
    };
    let bad = PacketRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 1,
        }),
        ..PacketRepr::new(resp_bth, &[0; 8])
    };
    feed(&mut p, Side::A, &bad);
    let c = p.completions(Side::A);
    assert_eq!(c[0].1.status, WcStatus::BadRespErr);
    assert_eq!(p.a.state(), QpState::Err);
}
