//! Happy paths: each operation, segmentation, SG lists, completion fields and order.

use uroce_wire::opcode::op;
use uroce_wire::{Pmtu, Psn};

use super::*;
use crate::wr::{SendFlags, SendOpcode, SendPayload, WcFlags, WcOpcode, WcStatus};

#[test]
fn multi_packet_send_with_sg_lists_on_both_sides() {
    let mut p = Pair::new();
    // A: the message is 300 bytes of region 1, 200 of region 2, 100 of region 1 again.
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_a.add(2, 0x9000, 512, ALL);
    let src1 = bytes(1, 4096);
    let src2 = bytes(2, 512);
    p.mem_a.put(1, 0x1000, &src1);
    p.mem_a.put(2, 0x9000, &src2);
    let mut msg = Vec::new();
    msg.extend_from_slice(&src1[10..310]);
    msg.extend_from_slice(&src2[..200]);
    msg.extend_from_slice(&src1[1000..1100]);
    // B: scattered into 100 bytes at 0x2000 and the rest at 0x3000.
    p.mem_b.add(7, 0x2000, 0x2000, ALL);
    p.b.post_recv(recv(55, vec![sge(0x2000, 100, 7), sge(0x3000, 1000, 7)]))
        .unwrap();
    p.a.post_send(wr(
        9,
        SendOpcode::Send,
        vec![
            sge(0x100a, 300, 1),
            sge(0x9000, 200, 2),
            sge(0x1000 + 1000, 100, 1),
        ],
    ))
    .unwrap();
    p.run();

    assert_eq!(p.mem_b.get(7, 0x2000, 100), msg[..100]);
    assert_eq!(p.mem_b.get(7, 0x3000, 500), msg[100..]);
    assert_eq!(
        p.mem_b.get(7, 0x3000 + 500, 8),
        [0; 8],
        "nothing written past the message"
    );

    // 600 bytes at PMTU 256: FIRST 256, MIDDLE 256, LAST 88; AckReq only on the last.
    let reqs: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.len, s.ack_req, s.psn.value()))
        .collect();
    assert_eq!(
        reqs,
        [
            (op::RC_SEND_FIRST, 256, false, 0),
            (op::RC_SEND_MIDDLE, 256, false, 1),
            (op::RC_SEND_LAST, 88, true, 2)
        ]
    );
    assert_eq!(p.b.counters().acks_sent, 1, "one coalesced ACK");

    let wb = p.completions(Side::B);
    assert_eq!(wb.len(), 1);
    let (kind, wc) = wb[0];
    assert_eq!(kind, CqKind::Recv);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (55, WcStatus::Success, WcOpcode::Recv, 600)
    );
    assert_eq!(
        (wc.qp_num, wc.src_qp, wc.wc_flags),
        (QPN_B, QPN_A, WcFlags::empty())
    );
    let wa = p.completions(Side::A);
    assert_eq!(wa.len(), 1);
    assert_eq!(wa[0].0, CqKind::Send);
    assert_eq!(
        (
            wa[0].1.wr_id,
            wa[0].1.status,
            wa[0].1.opcode,
            wa[0].1.byte_len
        ),
        (9, WcStatus::Success, WcOpcode::Send, 600)
    );
    assert_eq!(wa[0].1.qp_num, QPN_A);
    assert!(p.a.is_idle() && p.b.is_idle());
}

#[test]
fn write_with_immediate_and_plain_write() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 2048, ALL);
    let data = bytes(3, 2048);
    p.mem_a.put(1, 0x1000, &data);
    p.mem_b.add(5, 0x40000, 4096, ALL);
    p.mem_b.add(6, 0x100, 64, ALL);
    p.b.post_recv(recv(1, vec![sge(0x100, 64, 6)])).unwrap();

    // A plain WRITE consumes no receive WQE and completes nothing at B.
    p.a.post_send(rdma(
        10,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 100, 1)],
        0x40000,
        5,
    ))
    .unwrap();
    let mut w = rdma(
        11,
        SendOpcode::RdmaWriteWithImm,
        vec![sge(0x1000 + 100, 700, 1)],
        0x40000 + 1000,
        5,
    );
    w.imm_data = 0xdead_beef;
    w.flags |= SendFlags::SOLICITED;
    p.a.post_send(w).unwrap();
    p.run();

    assert_eq!(p.mem_b.get(5, 0x40000, 100), data[..100]);
    assert_eq!(p.mem_b.get(5, 0x40000 + 1000, 700), data[100..800]);
    assert_eq!(
        p.mem_b.get(6, 0x100, 64),
        [0; 64],
        "the receive buffer is not used"
    );
    let wb = p.completions(Side::B);
    assert_eq!(wb.len(), 1);
    let wc = wb[0].1;
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::RecvRdmaWithImm)
    );
    assert_eq!(wc.byte_len, 700, "byte_len is the RETH length");
    assert_eq!(wc.imm_data, 0xdead_beef);
    assert_eq!(wc.wc_flags, WcFlags::WITH_IMM);
    assert!(wc.solicited);

    let ops: Vec<_> = p.sent(Side::A).iter().map(|s| (s.opcode, s.se)).collect();
    assert_eq!(
        ops,
        [
            (op::RC_RDMA_WRITE_ONLY, false),
            (op::RC_RDMA_WRITE_FIRST, false),
            (op::RC_RDMA_WRITE_MIDDLE, false),
            (op::RC_RDMA_WRITE_LAST_WITH_IMM, true),
        ]
    );
    assert!(
        p.sent(Side::A)[1].text.contains("dlen=700"),
        "RETH on FIRST: {}",
        p.sent(Side::A)[1].text
    );
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.opcode, c.1.byte_len))
        .collect();
    assert_eq!(
        wa,
        [
            (10, WcOpcode::RdmaWrite, 100),
            (11, WcOpcode::RdmaWrite, 700)
        ]
    );
}

#[test]
fn multi_packet_read_into_sges() {
    let mut p = Pair::new();
    p.mem_b.add(3, 0x7000, 2048, REMOTE_READ);
    let data = bytes(4, 2048);
    p.mem_b.put(3, 0x7000, &data);
    p.mem_a.add(1, 0x1000, 8192, LOCAL_WRITE);
    // 1000 bytes into 300 @0x1000 and 700 @0x2000.
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 300, 1), sge(0x2000, 700, 1)],
        0x7000 + 24,
        3,
    ))
    .unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.run();

    assert_eq!(p.mem_a.get(1, 0x1000, 300), data[24..324]);
    assert_eq!(p.mem_a.get(1, 0x2000, 700), data[324..1024]);
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.opcode, c.1.byte_len))
        .collect();
    assert_eq!(
        wa,
        [
            (1, WcStatus::Success, WcOpcode::RdmaRead, 1000),
            (2, WcStatus::Success, WcOpcode::Send, 0)
        ]
    );
    // The READ request consumes ceil(1000/256) = 4 PSNs: the SEND after it uses PSN 4.
    let a: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(a, [(op::RC_RDMA_READ_REQUEST, 0), (op::RC_SEND_ONLY, 4)]);
    let b: Vec<_> = p
        .sent(Side::B)
        .iter()
        .map(|s| (s.opcode, s.psn.value(), s.len))
        .collect();
    assert_eq!(
        b,
        [
            (op::RC_RDMA_READ_RESPONSE_FIRST, 0, 256),
            (op::RC_RDMA_READ_RESPONSE_MIDDLE, 1, 256),
            (op::RC_RDMA_READ_RESPONSE_MIDDLE, 2, 256),
            (op::RC_RDMA_READ_RESPONSE_LAST, 3, 232),
            (op::RC_ACKNOWLEDGE, 4, 0),
        ]
    );
    // AETH on FIRST/LAST only; the READ counted in the MSN when received (MSN 1).
    let t: Vec<_> = p
        .sent(Side::B)
        .iter()
        .map(|s| s.text.contains("ACK credit=31 msn=1"))
        .collect();
    assert_eq!(t, [true, false, false, true, false]);
}

#[test]
fn both_atomics() {
    let mut p = Pair::new();
    p.mem_b.add(4, 0x8000, 64, REMOTE_ATOMIC);
    p.mem_b.put_u64(4, 0x8008, 100);
    p.mem_a.add(1, 0x1000, 64, LOCAL_WRITE);
    let mut fa = rdma(
        1,
        SendOpcode::AtomicFetchAndAdd,
        vec![sge(0x1000, 8, 1)],
        0x8008,
        4,
    );
    fa.compare_add = 5;
    let mut cs1 = rdma(
        2,
        SendOpcode::AtomicCmpAndSwp,
        vec![sge(0x1008, 8, 1)],
        0x8008,
        4,
    );
    cs1.compare_add = 105;
    cs1.swap = 7;
    let mut cs2 = rdma(
        3,
        SendOpcode::AtomicCmpAndSwp,
        vec![sge(0x1010, 8, 1)],
        0x8008,
        4,
    );
    cs2.compare_add = 1;
    cs2.swap = 9;
    for w in [fa, cs1, cs2] {
        p.a.post_send(w).unwrap();
    }
    p.run();
    assert_eq!(
        p.mem_a.get_u64(1, 0x1000),
        100,
        "fetch-add returns the original"
    );
    assert_eq!(
        p.mem_a.get_u64(1, 0x1008),
        105,
        "compare-swap (match) returns the original"
    );
    assert_eq!(
        p.mem_a.get_u64(1, 0x1010),
        7,
        "compare-swap (no match) returns the original"
    );
    assert_eq!(
        p.mem_b.get_u64(4, 0x8008),
        7,
        "100 + 5, swapped to 7, not swapped to 9"
    );
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.opcode, c.1.byte_len))
        .collect();
    assert_eq!(
        wa,
        [
            (1, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (2, WcStatus::Success, WcOpcode::CompSwap, 8),
            (3, WcStatus::Success, WcOpcode::CompSwap, 8),
        ]
    );
    let ops: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(
        ops,
        [
            (op::RC_FETCH_ADD, 0),
            (op::RC_COMPARE_SWAP, 1),
            (op::RC_COMPARE_SWAP, 2)
        ]
    );
    assert!(
        p.sent(Side::A)[1].text.contains("swap_add=0x7 cmp=0x69"),
        "{}",
        p.sent(Side::A)[1].text
    );
    assert!(p
        .sent(Side::B)
        .iter()
        .all(|s| s.opcode == op::RC_ATOMIC_ACKNOWLEDGE));
}

#[test]
fn zero_byte_messages() {
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.b.post_recv(recv(2, vec![])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.a.post_send(rdma(2, SendOpcode::RdmaWrite, vec![], 0, 0))
        .unwrap();
    p.a.post_send(rdma(3, SendOpcode::RdmaRead, vec![], 0, 0))
        .unwrap();
    let mut wi = rdma(4, SendOpcode::RdmaWriteWithImm, vec![], 0, 0);
    wi.imm_data = 42;
    p.a.post_send(wi).unwrap();
    p.run();
    let a: Vec<_> = p
        .sent(Side::A)
        .iter()
        .map(|s| (s.opcode, s.len, s.psn.value()))
        .collect();
    assert_eq!(
        a,
        [
            (op::RC_SEND_ONLY, 0, 0),
            (op::RC_RDMA_WRITE_ONLY, 0, 1),
            (op::RC_RDMA_READ_REQUEST, 0, 2),
            (op::RC_RDMA_WRITE_ONLY_WITH_IMM, 0, 3),
        ]
    );
    assert!(p
        .sent(Side::B)
        .iter()
        .any(|s| s.opcode == op::RC_RDMA_READ_RESPONSE_ONLY && s.len == 0));
    let wa: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.byte_len))
        .collect();
    assert_eq!(
        wa,
        [
            (1, WcStatus::Success, 0),
            (2, WcStatus::Success, 0),
            (3, WcStatus::Success, 0),
            (4, WcStatus::Success, 0)
        ]
    );
    let wb: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.1.wr_id, c.1.opcode, c.1.byte_len, c.1.imm_data))
        .collect();
    assert_eq!(
        wb,
        [
            (1, WcOpcode::Recv, 0, 0),
            (2, WcOpcode::RecvRdmaWithImm, 0, 42)
        ]
    );
}

#[test]
fn completions_follow_posting_order_and_signalling() {
    let (mut ca, cb) = configs();
    ca.sq_sig_all = false;
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 4096, ALL);
    for i in 0..3 {
        p.b.post_recv(recv(100 + i, vec![sge(0x1000, 4096, 2)]))
            .unwrap();
    }
    let mut unsignaled = wr(1, SendOpcode::Send, vec![sge(0x1000, 10, 1)]);
    unsignaled.flags = SendFlags::empty();
    p.a.post_send(unsignaled).unwrap();
    p.a.post_send(rdma(
        2,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 600, 1)],
        0x1000,
        2,
    ))
    .unwrap();
    p.a.post_send(rdma(
        3,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 300, 1)],
        0x1800,
        2,
    ))
    .unwrap();
    let mut unsignaled = wr(4, SendOpcode::Send, vec![sge(0x1000, 10, 1)]);
    unsignaled.flags = SendFlags::empty();
    p.a.post_send(unsignaled).unwrap();
    p.a.post_send(wr(5, SendOpcode::Send, vec![sge(0x1000, 10, 1)]))
        .unwrap();
    p.run();
    let ids: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        ids,
        [
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (5, WcStatus::Success)
        ]
    );
    let rids: Vec<_> = p.completions(Side::B).iter().map(|c| c.1.wr_id).collect();
    assert_eq!(rids, [100, 101, 102]);

    // sq_sig_all signals everything.
    let (mut ca, cb) = configs();
    ca.sq_sig_all = true;
    let mut p = Pair::with_configs(ca, cb);
    p.b.post_recv(recv(1, vec![])).unwrap();
    let mut w = wr(1, SendOpcode::Send, vec![]);
    w.flags = SendFlags::empty();
    p.a.post_send(w).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A).len(), 1);
}

#[test]
fn inline_send_reads_no_local_memory() {
    let mut p = Pair::new();
    p.mem_b.add(2, 0x1000, 4096, ALL);
    p.b.post_recv(recv(1, vec![sge(0x1000, 4096, 2)])).unwrap();
    let payload = bytes(9, 700);
    let mut w = wr(1, SendOpcode::SendWithImm, vec![]);
    w.payload = SendPayload::Inline(payload.clone().into());
    w.flags |= SendFlags::INLINE | SendFlags::SOLICITED;
    w.imm_data = 0x0102_0304;
    // A has no memory regions at all: any gather would fail with LOC_PROT_ERR.
    p.a.post_send(w).unwrap();
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 700), payload);
    let wb = p.completions(Side::B)[0].1;
    assert_eq!(
        (wb.byte_len, wb.imm_data, wb.wc_flags, wb.solicited),
        (700, 0x0102_0304, WcFlags::WITH_IMM, true)
    );
    let se: Vec<_> = p.sent(Side::A).iter().map(|s| (s.opcode, s.se)).collect();
    assert_eq!(
        se,
        [
            (op::RC_SEND_FIRST, false),
            (op::RC_SEND_MIDDLE, false),
            (op::RC_SEND_LAST_WITH_IMM, true)
        ]
    );
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}

#[test]
fn every_pmtu_send_write_read() {
    for pmtu in Pmtu::ALL {
        let (mut ca, mut cb) = configs();
        ca.pmtu = pmtu;
        cb.pmtu = pmtu;
        let mut p = Pair::with_configs(ca, cb);
        let len = 10_000usize;
        let data = bytes(pmtu as u64, len);
        p.mem_a.add(1, 0x10000, 3 * len, ALL);
        p.mem_a.put(1, 0x10000, &data);
        p.mem_b.add(2, 0x20000, 3 * len, ALL);
        p.mem_b.put(2, 0x20000 + 2 * len as u64, &data);
        p.b.post_recv(recv(1, vec![sge(0x20000, len as u32, 2)]))
            .unwrap();
        p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x10000, len as u32, 1)]))
            .unwrap();
        p.a.post_send(rdma(
            2,
            SendOpcode::RdmaWrite,
            vec![sge(0x10000, len as u32, 1)],
            0x20000 + len as u64,
            2,
        ))
        .unwrap();
        p.a.post_send(rdma(
            3,
            SendOpcode::RdmaRead,
            vec![sge(0x10000 + len as u64, len as u32, 1)],
            0x20000 + 2 * len as u64,
            2,
        ))
        .unwrap();
        p.run();
        assert_eq!(p.mem_b.get(2, 0x20000, len), data, "SEND at {pmtu:?}");
        assert_eq!(
            p.mem_b.get(2, 0x20000 + len as u64, len),
            data,
            "WRITE at {pmtu:?}"
        );
        assert_eq!(
            p.mem_a.get(1, 0x10000 + len as u64, len),
            data,
            "READ at {pmtu:?}"
        );
        let npkts = len.div_ceil(pmtu.bytes() as usize);
        let sends = p
            .sent(Side::A)
            .iter()
            .filter(|s| s.opcode <= op::RC_SEND_ONLY_WITH_IMM)
            .count();
        assert_eq!(sends, npkts, "{pmtu:?}");
        assert_eq!(p.completions(Side::A).len(), 3);
    }
}

#[test]
fn psn_wraps_around() {
    let (mut ca, mut cb) = configs();
    ca.sq_psn = Psn::new(0xff_fffe);
    cb.rq_psn = Psn::new(0xff_fffe);
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 8192, ALL);
    p.mem_b.add(2, 0x1000, 8192, ALL);
    let data = bytes(5, 2000);
    p.mem_a.put(1, 0x1000, &data);
    p.mem_b.put(2, 0x1800, &data);
    p.b.post_recv(recv(1, vec![sge(0x1000, 2000, 2)])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 1000, 1)]))
        .unwrap();
    p.a.post_send(rdma(
        2,
        SendOpcode::RdmaRead,
        vec![sge(0x1000 + 4096, 700, 1)],
        0x1800,
        2,
    ))
    .unwrap();
    p.a.post_send(wr(3, SendOpcode::Send, vec![])).unwrap();
    p.b.post_recv(recv(2, vec![])).unwrap();
    p.run();
    assert_eq!(p.mem_b.get(2, 0x1000, 1000), data[..1000]);
    assert_eq!(p.mem_a.get(1, 0x1000 + 4096, 700), data[..700]);
    let psns: Vec<_> = p.sent(Side::A).iter().map(|s| s.psn.value()).collect();
    // SEND 4 packets 0xfffffe..=1, READ at 2 (3 PSNs), SEND at 5.
    assert_eq!(psns, [0xff_fffe, 0xff_ffff, 0, 1, 2, 5]);
    assert_eq!(p.completions(Side::A).len(), 3);
}

#[test]
fn ackreq_every_64_packets_and_window_of_512() {
    let (mut ca, cb) = configs();
    ca.timeout = 0; // no retransmission while ACKs are held
    let mut p = Pair::with_configs(ca, cb);
    let len = 600 * 256;
    p.mem_a.add(1, 0, len, ALL);
    p.mem_b.add(2, 0, len, ALL);
    let data = bytes(6, len);
    p.mem_a.put(1, 0, &data);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![sge(0, len as u32, 1)],
        0,
        2,
    ))
    .unwrap();
    p.hold_to = Some(Side::A);
    p.run();
    // Window: 512 unacknowledged PSNs, then the requester waits.
    assert_eq!(p.sent(Side::A).len(), 512);
    p.release();
    p.run();
    assert_eq!(p.mem_b.get(2, 0, len), data);
    let a = p.sent(Side::A);
    assert_eq!(a.len(), 600);
    let acked: Vec<_> = a
        .iter()
        .filter(|s| s.ack_req)
        .map(|s| s.psn.value())
        .collect();
    // Every 64th packet and the last.
    let expected: Vec<u32> = (1..=9).map(|k| 64 * k - 1).chain([599]).collect();
    assert_eq!(acked, expected);
    assert_eq!(p.completions(Side::A).len(), 1);
}

#[test]
fn fence_waits_for_earlier_reads() {
    for fence in [false, true] {
        let mut p = Pair::new();
        p.mem_a.add(1, 0x1000, 4096, ALL);
        p.mem_b.add(2, 0x1000, 4096, ALL);
        p.b.post_recv(recv(1, vec![])).unwrap();
        p.a.post_send(rdma(
            1,
            SendOpcode::RdmaRead,
            vec![sge(0x1000, 512, 1)],
            0x1000,
            2,
        ))
        .unwrap();
        let mut s = wr(2, SendOpcode::Send, vec![]);
        if fence {
            s.flags |= SendFlags::FENCE;
        }
        p.a.post_send(s).unwrap();
        p.run();
        let order: Vec<_> = p.log.iter().map(|s| (s.from, s.opcode)).collect();
        let send_at = order
            .iter()
            .position(|x| *x == (Side::A, op::RC_SEND_ONLY))
            .unwrap();
        let last_resp = order
            .iter()
            .position(|x| *x == (Side::B, op::RC_RDMA_READ_RESPONSE_LAST))
            .unwrap();
        if fence {
            assert!(
                send_at > last_resp,
                "fenced SEND after the READ completed: {order:?}"
            );
        } else {
            assert_eq!(
                send_at, 1,
                "unfenced SEND right after the READ request: {order:?}"
            );
        }
        let ids: Vec<_> = p.completions(Side::A).iter().map(|c| c.1.wr_id).collect();
        assert_eq!(ids, [1, 2]);
    }
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let (mut ca, cb) = configs();
    ca.max_rd_atomic = 2;
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x1000, 4096, ALL);
    for i in 0..4 {
        p.a.post_send(rdma(
            i,
            SendOpcode::RdmaRead,
            vec![sge(0x1000 + i * 100, 100, 1)],
            0x1000,
            2,
        ))
        .unwrap();
    }
    assert!(p.round());
    let first_round = p.sent(Side::A).len();
    assert_eq!(first_round, 2, "only max_rd_atomic READs start");
    p.run();
    assert_eq!(p.completions(Side::A).len(), 4);
    assert_eq!(p.sent(Side::A).len(), 4);
}

#[test]
fn one_gibibyte_write_and_read() {
    let (mut ca, mut cb) = configs();
    ca.pmtu = Pmtu::Mtu4096;
    cb.pmtu = Pmtu::Mtu4096;
    let mut p = Pair::with(ca, cb, PatternMemory::default(), PatternMemory::default());
    p.log_enabled = false;
    p.burst = 256;
    let gib: u32 = 1 << 30;
    // Same addresses on both sides (the pattern is a function of the address); the READ
    // lands in two SGEs that continue each other.
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![sge(0x4000_0000, gib, 1)],
        0x4000_0000,
        1,
    ))
    .unwrap();
    let half = gib / 2;
    let sges = vec![
        sge(0x1_0000_0000, half, 1),
        sge(0x1_0000_0000 + u64::from(half), half, 1),
    ];
    p.a.post_send(rdma(2, SendOpcode::RdmaRead, sges, 0x1_0000_0000, 1))
        .unwrap();
    p.run();
    assert_eq!(p.mem_b.bytes_written(), u64::from(gib));
    assert_eq!(p.mem_b.bad_bytes(), 0);
    assert_eq!(p.mem_a.bytes_written(), u64::from(gib));
    assert_eq!(p.mem_a.bad_bytes(), 0);
    let ids: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.byte_len))
        .collect();
    assert_eq!(
        ids,
        [(1, WcStatus::Success, gib), (2, WcStatus::Success, gib)]
    );
    assert_eq!(p.a.counters().packets_sent, 262_144 + 1);
    assert_eq!(p.b.counters().read_responses_sent, 262_144);
}

/// The opcodes `side` sent, after the first `skip` packets.
fn opcodes_from(p: &Pair<TestMemory>, side: Side, skip: usize) -> Vec<u8> {
    p.sent(side).iter().skip(skip).map(|s| s.opcode).collect()
}

#[test]
fn a_lone_ack_follows_the_request_message_posted_with_it() {
    // A ping-pong: B answers A's RDMA WRITE with a 3-packet WRITE of its own while the ACK
    // of A's WRITE is still queued. The reply goes first, all of it, then the ACK: a peer
    // that stops calling in once its request completes has the reply by then.
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x8000, 4096, ALL);
    p.mem_a.put(1, 0x1000, &bytes(3, 600));
    p.mem_b.put(2, 0x8000, &bytes(4, 600));
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 8, 1)],
        0x8800,
        2,
    ))
    .unwrap();
    assert!(p.round(), "A's WRITE went to B");
    assert!(p.sent(Side::B).is_empty(), "B has sent nothing yet");
    p.b.post_send(rdma(
        2,
        SendOpcode::RdmaWrite,
        vec![sge(0x8000, 600, 2)],
        0x1800,
        1,
    ))
    .unwrap();
    p.round();
    assert_eq!(
        opcodes_from(&p, Side::B, 0),
        [
            op::RC_RDMA_WRITE_FIRST,
            op::RC_RDMA_WRITE_MIDDLE,
            op::RC_RDMA_WRITE_LAST,
            op::RC_ACKNOWLEDGE
        ]
    );
    p.run();
    assert_eq!(p.mem_b.get(2, 0x8800, 8), bytes(3, 8));
    assert_eq!(p.mem_a.get(1, 0x1800, 600), bytes(4, 600));
    let a: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|(_, c)| c.status)
        .collect();
    assert_eq!(a, [WcStatus::Success], "A's WRITE completed");
    let b: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|(_, c)| c.status)
        .collect();
    assert_eq!(b, [WcStatus::Success], "B's WRITE completed");
}

#[test]
fn an_ack_waits_for_one_message_only_and_read_responses_never_wait() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_b.add(2, 0x8000, 4096, ALL);
    p.a.post_send(rdma(
        1,
        SendOpcode::RdmaWrite,
        vec![sge(0x1000, 8, 1)],
        0x8800,
        2,
    ))
    .unwrap();
    p.round();
    // Two 2-packet messages: the ACK goes between them.
    for id in [2, 3] {
        p.b.post_send(rdma(
            id,
            SendOpcode::RdmaWrite,
            vec![sge(0x8000, 300, 2)],
            0x1800,
            1,
        ))
        .unwrap();
    }
    p.round();
    assert_eq!(
        opcodes_from(&p, Side::B, 0),
        [
            op::RC_RDMA_WRITE_FIRST,
            op::RC_RDMA_WRITE_LAST,
            op::RC_ACKNOWLEDGE,
            op::RC_RDMA_WRITE_FIRST,
            op::RC_RDMA_WRITE_LAST,
        ]
    );
    p.run();
    let sent_before = p.sent(Side::B).len();
    // A READ response is not a plain ACK: it goes before B's next request.
    p.a.post_send(rdma(
        4,
        SendOpcode::RdmaRead,
        vec![sge(0x1000, 8, 1)],
        0x8000,
        2,
    ))
    .unwrap();
    p.round();
    p.b.post_send(rdma(
        5,
        SendOpcode::RdmaWrite,
        vec![sge(0x8000, 8, 2)],
        0x1800,
        1,
    ))
    .unwrap();
    p.round();
    assert_eq!(
        opcodes_from(&p, Side::B, sent_before),
        [op::RC_RDMA_READ_RESPONSE_ONLY, op::RC_RDMA_WRITE_ONLY]
    );
    p.run();
    let b: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|(_, c)| c.status)
        .collect();
    assert_eq!(b, [WcStatus::Success; 3]);
}
