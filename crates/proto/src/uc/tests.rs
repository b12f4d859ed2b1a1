//! UC engine tests: two `UcQp`s driven through the [`Engine`] interface, joined by an
//! in-memory wire (emit → `PacketRepr::parse` → `handle_packet`) that the tests can make
//! drop, duplicate and reorder packets on. Expected data are computed from the tests' own
//! inputs, never read back from the engine.

use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;
use uroce_wire::opcode::op;
use uroce_wire::{PacketRepr, Pmtu, Psn};

use super::{UcConfig, UcQp};
use crate::engine::{Arrival, Engine};
use crate::engine::{CqKind, Env, PostError, QpEvent, RemoteAccess, RtsAttrs, SharedRecvQueue};
use crate::qp_state::{QpState, QpType};
use crate::rc::tests::{bytes, flush_bytes, recv, sge, ALL, LOCAL_WRITE};
use crate::testing::{Access, TestMemory, TestSrq};
use crate::time::Instant;
use crate::wr::{
    SendFlags, SendOpcode, SendPayload, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
    WrError,
};

const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
const IP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const IP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Send buffers at A (lkey 1), receive buffers at B (lkey 2), WRITE target at B (rkey 3).
const SRC: u64 = 0x10_0000;
const DST: u64 = 0x20_0000;
const TGT: u64 = 0x30_0000;
const REGION: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    A,
    B,
}

/// A (sender) and B (receiver), their memories and B's optional SRQ.
struct Pair {
    a: UcQp,
    b: UcQp,
    mem_a: TestMemory,
    mem_b: TestMemory,
    srq_b: Option<TestSrq>,
    buf: Vec<u8>,
}

fn configs(pmtu: Pmtu) -> (UcConfig, UcConfig) {
    let mut a = UcConfig::new(QPN_A, QPN_B, IP_B);
    let mut b = UcConfig::new(QPN_B, QPN_A, IP_A);
    a.pmtu = pmtu;
    b.pmtu = pmtu;
    (a, b)
}

impl Pair {
    fn new(pmtu: Pmtu) -> Pair {
        let (a, b) = configs(pmtu);
        Pair::with(a, b)
    }

    fn with(a: UcConfig, b: UcConfig) -> Pair {
        let mem_a = TestMemory::new();
        mem_a.add(1, SRC, REGION, ALL);
        let mem_b = TestMemory::new();
        mem_b.add(2, DST, REGION, LOCAL_WRITE);
        mem_b.add(3, TGT, REGION, ALL);
        Pair {
            a: UcQp::new(a),
            b: UcQp::new(b),
            mem_a,
            mem_b,
            srq_b: None,
            buf: vec![0; 4096 + 64],
        }
    }

    /// Every packet A has ready, as bytes (checked to parse, ICRC area zero).
    fn transmit(&mut self, side: Side) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..10_000 {
            let (qp, mem) = match side {
                Side::A => (&mut self.a, &self.mem_a),
                Side::B => (&mut self.b, &self.mem_b),
            };
            let mut env = Env::new(mem);
            let Some(t) = Engine::poll_transmit(qp, Instant::ZERO, &mut env, &mut self.buf) else {
                return out;
            };
            let peer = match side {
                Side::A => IP_B,
                Side::B => IP_A,
            };
            assert_eq!(t.dst, peer, "every packet goes to the peer");
            let bytes = self.buf[..t.len].to_vec();
            let pkt = PacketRepr::parse(&bytes).expect("the engine emitted an unparsable packet");
            assert_eq!(pkt.buffer_len(), t.len);
            assert!(!pkt.bth.ack_req, "UC never sets AckReq");
            assert_eq!(&bytes[t.len - 4..], &[0, 0, 0, 0], "ICRC left zero");
            out.push(bytes);
        }
        panic!("transmit did not stop");
    }

    fn deliver(&mut self, to: Side, bytes: &[u8]) {
        let pkt = PacketRepr::parse(bytes).expect("parse");
        let (qp, mem, from) = match to {
            Side::A => (&mut self.a, &self.mem_a, IP_B),
            Side::B => (&mut self.b, &self.mem_b, IP_A),
        };
        let arrival = Arrival::new(from, IP_A);
        let mut env = match (to, self.srq_b.as_mut()) {
            (Side::B, Some(srq)) => Env::with_srq(mem, srq as &mut dyn SharedRecvQueue),
            _ => Env::new(mem),
        };
        Engine::handle_packet(qp, Instant::ZERO, &arrival, &pkt, &mut env);
    }

    /// A transmits everything; all of it is delivered to B in order.
    fn flow(&mut self) -> Vec<Vec<u8>> {
        let pkts = self.transmit(Side::A);
        for p in &pkts {
            self.deliver(Side::B, p);
        }
        pkts
    }

    fn completions(&mut self, side: Side) -> Vec<(CqKind, WorkCompletion)> {
        let qp = match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        };
        std::iter::from_fn(|| Engine::poll_completion(qp)).collect()
    }

    /// Posts a SEND of `data` (copied into A's send buffer at `off`).
    fn send(&mut self, wr_id: u64, opcode: SendOpcode, off: u64, data: &[u8]) {
        self.mem_a.put(1, SRC + off, data);
        let mut w = SendWr::new(wr_id, opcode, vec![sge(SRC + off, data.len() as u32, 1)]);
        w.flags = SendFlags::SIGNALED;
        w.imm_data = 0x1234_5678 ^ wr_id as u32;
        Engine::post_send(&mut self.a, w).expect("post_send");
    }

    /// Posts an RDMA WRITE of `data` to B's target region at `tgt_off`.
    fn write(
        &mut self,
        wr_id: u64,
        opcode: SendOpcode,
        off: u64,
        data: &[u8],
        tgt_off: u64,
        rkey: u32,
    ) {
        self.mem_a.put(1, SRC + off, data);
        let mut w = SendWr::new(wr_id, opcode, vec![sge(SRC + off, data.len() as u32, 1)]);
        w.flags = SendFlags::SIGNALED;
        w.imm_data = 0xabcd_0000 | wr_id as u32;
        w.remote_addr = TGT + tgt_off;
        w.rkey = rkey;
        Engine::post_send(&mut self.a, w).expect("post_send");
    }

    /// Posts a receive WR at B of `len` bytes at `off` in B's receive region.
    fn post_recv(&mut self, wr_id: u64, off: u64, len: u32) {
        Engine::post_recv(&mut self.b, recv(wr_id, vec![sge(DST + off, len, 2)]))
            .expect("post_recv");
    }
}

fn opcodes(pkts: &[Vec<u8>]) -> Vec<(u8, u32)> {
    pkts.iter()
        .map(|b| {
            let p = PacketRepr::parse(b).expect("parse");
            (p.bth.opcode, p.bth.psn.value())
        })
        .collect()
}

fn recv_wc(c: &(CqKind, WorkCompletion)) -> &WorkCompletion {
    assert_eq!(c.0, CqKind::Recv);
    &c.1
}

/// The BTHs (first 12 bytes of the UDP payload) of frames 1–4 of the Linux rxe capture of
/// `ibv_uc_pingpong -g 1` (kernel 6.1, MTU 1500 → PMTU 1024): one 4096-byte SEND to QP
/// 0x11, PSN 0x4a49b0, as SEND_FIRST, SEND_MIDDLE, SEND_MIDDLE, SEND_LAST. Each packet is
/// 1048 UDP bytes: 8 UDP + 12 BTH + 1024 payload + 4 ICRC.
const RXE_UC_SEND_BTHS: [[u8; 12]; 4] = [
    [
        0x20, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x4a, 0x49, 0xb0,
    ],
    [
        0x21, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x4a, 0x49, 0xb1,
    ],
    [
        0x21, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x4a, 0x49, 0xb2,
    ],
    [
        0x22, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x4a, 0x49, 0xb3,
    ],
];

#[test]
fn send_packets_match_the_rxe_capture() {
    let mut a = UcConfig::new(0x12, 0x11, IP_B);
    a.sq_psn = Psn::new(0x4a_49b0);
    let mut b = UcConfig::new(0x11, 0x12, IP_A);
    b.rq_psn = Psn::new(0x4a_49b0);
    let mut p = Pair::with(a, b);
    let data = bytes(1, 4096);
    p.post_recv(7, 0, 4096);
    p.send(1, SendOpcode::Send, 0, &data);
    let pkts = p.flow();
    assert_eq!(pkts.len(), 4);
    for (pkt, bth) in pkts.iter().zip(RXE_UC_SEND_BTHS) {
        assert_eq!(&pkt[..12], &bth, "BTH as rxe sends it");
        assert_eq!(pkt.len() + 8, 1048, "UDP length as in the capture");
    }
    let wcs = p.completions(Side::B);
    assert_eq!(wcs.len(), 1);
    let wc = recv_wc(&wcs[0]);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 4096)
    );
    assert_eq!(wc.src_qp, 0x12);
    assert_eq!(p.mem_b.get(2, DST, 4096), data);
}

#[test]
fn three_packet_send_and_its_completions() {
    let mut p = Pair::new(Pmtu::Mtu1024);
    let data = bytes(2, 3000);
    p.post_recv(70, 0, 4096);
    p.send(1, SendOpcode::SendWithImm, 0, &data);
    let pkts = p.transmit(Side::A);
    assert_eq!(
        opcodes(&pkts),
        vec![
            (op::UC_SEND_FIRST, 0),
            (op::UC_SEND_MIDDLE, 1),
            (op::UC_SEND_LAST_WITH_IMM, 2)
        ]
    );
    let lens: Vec<usize> = pkts
        .iter()
        .map(|b| PacketRepr::parse(b).unwrap().payload.len())
        .collect();
    assert_eq!(lens, vec![1024, 1024, 952]);
    // The send completes once its last packet is out: no ACK on UC.
    let wcs = p.completions(Side::A);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].0, CqKind::Send);
    assert_eq!(
        (
            wcs[0].1.wr_id,
            wcs[0].1.status,
            wcs[0].1.opcode,
            wcs[0].1.byte_len
        ),
        (1, WcStatus::Success, WcOpcode::Send, 3000)
    );
    assert!(Engine::is_idle(&p.a));
    assert_eq!(Engine::poll_timeout(&p.a), None, "UC has no timers");
    for b in &pkts {
        p.deliver(Side::B, b);
    }
    let wcs = p.completions(Side::B);
    let wc = recv_wc(&wcs[0]);
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.imm_data),
        (70, 3000, 0x1234_5678 ^ 1)
    );
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(p.mem_b.get(2, DST, 3000), data);
    // The next message continues the PSNs.
    p.post_recv(71, 0, 16);
    p.send(2, SendOpcode::Send, 0, &[9; 16]);
    assert_eq!(opcodes(&p.flow()), vec![(op::UC_SEND_ONLY, 3)]);
}

#[test]
fn write_with_imm_packets_and_completion() {
    let mut p = Pair::new(Pmtu::Mtu256);
    let data = bytes(3, 600);
    p.post_recv(80, 0, 0);
    p.write(1, SendOpcode::RdmaWriteWithImm, 0, &data, 100, 3);
    let pkts = p.flow();
    assert_eq!(
        opcodes(&pkts),
        vec![
            (op::UC_RDMA_WRITE_FIRST, 0),
            (op::UC_RDMA_WRITE_MIDDLE, 1),
            (op::UC_RDMA_WRITE_LAST_WITH_IMM, 2)
        ]
    );
    let parsed: Vec<_> = pkts.iter().map(|b| PacketRepr::parse(b).unwrap()).collect();
    let reth = parsed[0].reth.expect("RETH on the first packet");
    assert_eq!((reth.va, reth.rkey, reth.dma_len), (TGT + 100, 3, 600));
    assert!(parsed[1].reth.is_none() && parsed[2].reth.is_none());
    assert!(parsed[0].immdt.is_none() && parsed[1].immdt.is_none());
    assert_eq!(parsed[2].immdt.map(|i| i.imm), Some(0xabcd_0001));
    assert_eq!(p.mem_b.get(3, TGT + 100, 600), data);
    let wcs = p.completions(Side::B);
    assert_eq!(wcs.len(), 1);
    let wc = recv_wc(&wcs[0]);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data),
        (80, WcOpcode::RecvRdmaWithImm, 600, 0xabcd_0001)
    );
    let sc = p.completions(Side::A);
    assert_eq!((sc[0].1.wr_id, sc[0].1.opcode), (1, WcOpcode::RdmaWrite));

    // One-packet forms: WRITE_ONLY (no receive WQE) and WRITE_ONLY_WITH_IMM.
    p.write(2, SendOpcode::RdmaWrite, 0, &data[..200], 1000, 3);
    p.post_recv(81, 0, 0);
    p.write(3, SendOpcode::RdmaWriteWithImm, 0, &data[..8], 2000, 3);
    assert_eq!(
        opcodes(&p.flow()),
        vec![
            (op::UC_RDMA_WRITE_ONLY, 3),
            (op::UC_RDMA_WRITE_ONLY_WITH_IMM, 4)
        ]
    );
    assert_eq!(p.mem_b.get(3, TGT + 1000, 200), &data[..200]);
    let wcs = p.completions(Side::B);
    assert_eq!(wcs.len(), 1);
    assert_eq!(recv_wc(&wcs[0]).wr_id, 81);
}

#[test]
fn unsupported_opcodes_are_refused() {
    let mut p = Pair::new(Pmtu::Mtu256);
    for opcode in [
        SendOpcode::RdmaRead,
        SendOpcode::AtomicCmpAndSwp,
        SendOpcode::AtomicFetchAndAdd,
        SendOpcode::SendWithInv,
        SendOpcode::Tso,
        SendOpcode::Flush,
        SendOpcode::AtomicWrite,
    ] {
        let w = SendWr::new(1, opcode, vec![sge(SRC, 8, 1)]);
        assert_eq!(
            Engine::post_send(&mut p.a, w),
            Err(PostError::InvalidWr(WrError::OpcodeNotSupported {
                opcode,
                qp_type: QpType::Uc
            })),
            "{opcode:?}"
        );
    }
    let w = SendWr::new(1, SendOpcode::BindMw, vec![]);
    assert_eq!(
        Engine::post_send(&mut p.a, w),
        Err(PostError::InvalidWr(WrError::MissingBind))
    );
    assert!(Engine::is_idle(&p.a));
    assert_eq!(Engine::qp_type(&p.a), QpType::Uc);
}

/// BIND_MW and LOCAL_INV in the UC send queue: executed at the head of the queue (no
/// packet), completed at once; a WRITE through the bound window lands, a WRITE after
/// LOCAL_INV is dropped (class D) and leaves the memory untouched; a refused LOCAL_INV
/// completes with LOC_QP_OP_ERR and moves the QP to SQE.
#[test]
fn memory_window_bind_write_and_local_inv() {
    let mut p = Pair::new(Pmtu::Mtu256);
    p.mem_b.add(0x300, 0, 0, Access::NONE);
    crate::memory::Memory::invalidate_local(&p.mem_b, 0x300).expect("an unbound window");
    let mut bind = SendWr::new(7, SendOpcode::BindMw, vec![]);
    bind.flags = SendFlags::SIGNALED;
    bind.bind = Some(crate::memory::MwBind {
        mw_rkey: 0x300,
        new_rkey: 0x301,
        mr_lkey: 3,
        addr: 0x9000,
        length: 64,
        access: crate::rc::tests::REMOTE_WRITE.bits(),
        type1: false,
    });
    Engine::post_send(&mut p.b, bind).expect("post BIND_MW");
    assert!(p.transmit(Side::B).is_empty(), "a bind sends no packet");
    let wc = p.completions(Side::B);
    assert_eq!(
        wc.iter()
            .map(|c| (c.1.wr_id, c.1.status, c.1.opcode))
            .collect::<Vec<_>>(),
        vec![(7, WcStatus::Success, WcOpcode::BindMw)]
    );
    let data = bytes(9, 32);
    let write = |p: &mut Pair, wr_id: u64| {
        p.mem_a.put(1, SRC, &data);
        let mut w = SendWr::new(wr_id, SendOpcode::RdmaWrite, vec![sge(SRC, 32, 1)]);
        w.remote_addr = 0x9000 + 8;
        w.rkey = 0x301;
        Engine::post_send(&mut p.a, w).expect("post WRITE");
        p.flow();
    };
    write(&mut p, 1);
    assert_eq!(p.mem_b.get(0x301, 0x9008, 32), data, "through the window");
    let mut inv = SendWr::new(8, SendOpcode::LocalInv, vec![]);
    inv.flags = SendFlags::SIGNALED;
    inv.invalidate_rkey = 0x301;
    Engine::post_send(&mut p.b, inv).expect("post LOCAL_INV");
    assert!(p.transmit(Side::B).is_empty());
    let wc = p.completions(Side::B);
    assert_eq!(
        (wc[0].1.wr_id, wc[0].1.status, wc[0].1.opcode),
        (8, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert!(!p.mem_b.is_key_valid(0x301));
    let dropped = Engine::counters(&p.b).dropped_remote_access;
    p.mem_a.put(1, SRC, &[0x5a; 32]);
    write(&mut p, 2);
    assert_eq!(
        Engine::counters(&p.b).dropped_remote_access,
        dropped + 1,
        "a WRITE after LOCAL_INV is dropped"
    );
    assert_eq!(p.mem_b.get(0x301, 0x9008, 32), data, "memory untouched");
    // A refused LOCAL_INV: LOC_QP_OP_ERR, SQE, the WR behind it flushed.
    let mut bad = SendWr::new(9, SendOpcode::LocalInv, vec![]);
    bad.invalidate_rkey = 0x999;
    Engine::post_send(&mut p.b, bad).expect("post");
    Engine::post_send(&mut p.b, SendWr::new(10, SendOpcode::Send, vec![])).expect("post");
    assert!(p.transmit(Side::B).is_empty());
    let got: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        got,
        vec![(9, WcStatus::LocQpOpErr), (10, WcStatus::WrFlushErr)]
    );
    assert_eq!(Engine::state(&p.b), QpState::Sqe);
}

/// Loss of a MIDDLE packet: that message is dropped whole, the next one arrives intact in
/// the receive WQE the lost message would have used.
#[test]
fn lost_middle_drops_the_message_and_the_next_reuses_its_wqe() {
    let mut p = Pair::new(Pmtu::Mtu256);
    let m1 = bytes(10, 700);
    let m2 = bytes(11, 600);
    p.post_recv(100, 0, 1024);
    p.post_recv(101, 1024, 1024);
    p.send(1, SendOpcode::Send, 0, &m1);
    p.send(2, SendOpcode::Send, 1024, &m2);
    let pkts = p.transmit(Side::A);
    assert_eq!(
        opcodes(&pkts),
        vec![
            (op::UC_SEND_FIRST, 0),
            (op::UC_SEND_MIDDLE, 1),
            (op::UC_SEND_LAST, 2),
            (op::UC_SEND_FIRST, 3),
            (op::UC_SEND_MIDDLE, 4),
            (op::UC_SEND_LAST, 5),
        ]
    );
    for (i, b) in pkts.iter().enumerate() {
        if i != 1 {
            p.deliver(Side::B, b);
        }
    }
    let wcs = p.completions(Side::B);
    assert_eq!(wcs.len(), 1, "only the second message completes");
    let wc = recv_wc(&wcs[0]);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (100, WcStatus::Success, 600)
    );
    assert_eq!(p.mem_b.get(2, DST, 600), m2);
    let c = Engine::counters(&p.b);
    assert_eq!(c.messages_dropped, 1);
    assert_eq!(c.dropped_uc_sequence, 1, "the LAST of the broken message");
    assert_eq!(c.dropped_packets, 1);
    // Both sends completed successfully at the requester: UC does not know.
    let sc = p.completions(Side::A);
    assert_eq!(
        sc.iter()
            .map(|c| (c.1.wr_id, c.1.status))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // WQE 101 is still posted and takes the next message.
    p.send(3, SendOpcode::Send, 0, &m1[..10]);
    p.flow();
    let wcs = p.completions(Side::B);
    assert_eq!(
        (recv_wc(&wcs[0]).wr_id, recv_wc(&wcs[0]).byte_len),
        (101, 10)
    );
    assert_eq!(Engine::state(&p.b), QpState::Rts);
}

#[test]
fn lost_first_or_last_drops_only_that_message() {
    for lost in [0usize, 2] {
        let mut p = Pair::new(Pmtu::Mtu256);
        let m1 = bytes(20, 700);
        let m2 = bytes(21, 100);
        p.post_recv(100, 0, 1024);
        p.post_recv(101, 1024, 1024);
        p.send(1, SendOpcode::Send, 0, &m1);
        p.send(2, SendOpcode::SendWithImm, 1024, &m2);
        let pkts = p.transmit(Side::A);
        assert_eq!(pkts.len(), 4);
        for (i, b) in pkts.iter().enumerate() {
            if i != lost {
                p.deliver(Side::B, b);
            }
        }
        let wcs = p.completions(Side::B);
        assert_eq!(wcs.len(), 1, "lost packet {lost}");
        let wc = recv_wc(&wcs[0]);
        assert_eq!((wc.wr_id, wc.byte_len), (100, 100));
        assert_eq!(p.mem_b.get(2, DST, 100), m2);
        assert_eq!(Engine::counters(&p.b).messages_dropped, 1);
    }
}

#[test]
fn duplicated_packets_deliver_each_message_once() {
    let mut p = Pair::new(Pmtu::Mtu256);
    let m1 = bytes(30, 700);
    let m2 = bytes(31, 50);
    p.post_recv(100, 0, 1024);
    p.post_recv(101, 1024, 1024);
    p.post_recv(102, 2048, 1024);
    p.send(1, SendOpcode::Send, 0, &m1);
    p.send(2, SendOpcode::Send, 1024, &m2);
    let pkts = p.transmit(Side::A);
    for b in &pkts {
        p.deliver(Side::B, b);
        p.deliver(Side::B, b);
    }
    // A late copy of every packet, after everything.
    for b in &pkts {
        p.deliver(Side::B, b);
    }
    let wcs = p.completions(Side::B);
    let got: Vec<_> = wcs
        .iter()
        .map(|c| (recv_wc(c).wr_id, recv_wc(c).byte_len))
        .collect();
    assert_eq!(got, vec![(100, 700), (101, 50)]);
    assert_eq!(p.mem_b.get(2, DST, 700), m1);
    assert_eq!(p.mem_b.get(2, DST + 1024, 50), m2);
    let c = Engine::counters(&p.b);
    assert_eq!(c.dropped_duplicates, 8);
    assert_eq!(c.messages_dropped, 0);
}

#[test]
fn reordered_packets_drop_the_message_never_corrupt_it() {
    let mut p = Pair::new(Pmtu::Mtu256);
    let m1 = bytes(40, 700);
    let m2 = bytes(41, 300);
    p.post_recv(100, 0, 1024);
    p.post_recv(101, 1024, 1024);
    p.send(1, SendOpcode::Send, 0, &m1);
    p.send(2, SendOpcode::Send, 1024, &m2);
    let pkts = p.transmit(Side::A);
    // FIRST, LAST, MIDDLE of m1, then m2 with its two packets swapped.
    for i in [0, 2, 1, 4, 3] {
        p.deliver(Side::B, &pkts[i]);
    }
    assert!(
        p.completions(Side::B).is_empty(),
        "neither message is complete in order"
    );
    // A message sent later lands in the first receive WQE, intact.
    p.send(3, SendOpcode::Send, 0, &m2);
    p.flow();
    let wcs = p.completions(Side::B);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (recv_wc(&wcs[0]).wr_id, recv_wc(&wcs[0]).byte_len),
        (100, 300)
    );
    assert_eq!(p.mem_b.get(2, DST, 300), m2);
    // A stale ONLY from the past is not delivered.
    p.post_recv(102, 2048, 64);
    p.send(4, SendOpcode::Send, 0, &[1; 8]);
    let late = p.transmit(Side::A);
    p.send(5, SendOpcode::Send, 0, &[2; 8]);
    p.flow();
    p.deliver(Side::B, &late[0]);
    let got: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| recv_wc(c).wr_id)
        .collect();
    assert_eq!(got, vec![101]);
    assert_eq!(p.mem_b.get(2, DST + 1024, 8), vec![2; 8]);
}

#[test]
fn write_with_bad_rkey_or_bounds_is_dropped_silently() {
    let mut p = Pair::new(Pmtu::Mtu256);
    let data = bytes(50, 600);
    p.post_recv(100, 0, 64);
    // Bad R_Key, then out of bounds (WRITE_WITH_IMM: its receive WQE is not consumed).
    p.write(1, SendOpcode::RdmaWrite, 0, &data, 0, 99);
    p.write(
        2,
        SendOpcode::RdmaWriteWithImm,
        0,
        &data,
        REGION as u64 - 100,
        3,
    );
    p.flow();
    assert!(p.completions(Side::B).is_empty());
    assert_eq!(Engine::state(&p.b), QpState::Rts, "UC: no state change");
    assert_eq!(p.mem_b.get(3, TGT + REGION as u64 - 100, 100), vec![0; 100]);
    let c = Engine::counters(&p.b);
    assert_eq!(c.dropped_remote_access, 2, "the FIRST packets");
    assert_eq!(c.dropped_uc_sequence, 4, "the rest of both messages");
    assert_eq!(c.messages_dropped, 2);
    // The sender does not know either.
    assert!(p
        .completions(Side::A)
        .iter()
        .all(|c| c.1.status == WcStatus::Success));
    // A good WRITE_WITH_IMM then uses receive WQE 100.
    p.write(3, SendOpcode::RdmaWriteWithImm, 0, &data, 0, 3);
    p.flow();
    assert_eq!(p.mem_b.get(3, TGT, 600), data);
    let wcs = p.completions(Side::B);
    assert_eq!(
        (recv_wc(&wcs[0]).wr_id, recv_wc(&wcs[0]).byte_len),
        (100, 600)
    );
}

#[test]
fn write_without_qp_write_access_is_dropped() {
    let (a, mut b) = configs(Pmtu::Mtu256);
    b.access = RemoteAccess::empty();
    let mut p = Pair::with(a, b);
    p.write(1, SendOpcode::RdmaWrite, 0, &[7; 300], 0, 3);
    p.flow();
    assert_eq!(p.mem_b.get(3, TGT, 300), vec![0; 300]);
    assert_eq!(Engine::counters(&p.b).dropped_remote_access, 1);
    assert_eq!(Engine::state(&p.b), QpState::Rts);
}

#[test]
fn send_without_receive_wqe_or_too_long_is_dropped() {
    let mut p = Pair::new(Pmtu::Mtu256);
    p.send(1, SendOpcode::Send, 0, &bytes(60, 500));
    p.flow();
    let c = Engine::counters(&p.b);
    assert_eq!(
        (
            c.dropped_no_recv_wqe,
            c.dropped_uc_sequence,
            c.messages_dropped
        ),
        (1, 1, 1)
    );
    // Too long for the WQE: dropped, the WQE stays and takes the next message.
    p.post_recv(100, 0, 300);
    p.send(2, SendOpcode::Send, 0, &bytes(61, 500));
    p.flow();
    assert!(p.completions(Side::B).is_empty());
    assert_eq!(Engine::counters(&p.b).dropped_length, 1);
    let m = bytes(62, 280);
    p.send(3, SendOpcode::Send, 0, &m);
    p.flow();
    let wcs = p.completions(Side::B);
    assert_eq!(
        (recv_wc(&wcs[0]).wr_id, recv_wc(&wcs[0]).byte_len),
        (100, 280)
    );
    assert_eq!(p.mem_b.get(2, DST, 280), m);
}

#[test]
fn srq_wqe_of_a_dropped_message_is_kept_for_the_next() {
    let (a, mut b) = configs(Pmtu::Mtu256);
    b.use_srq = true;
    let mut p = Pair::with(a, b);
    assert_eq!(
        Engine::post_recv(&mut p.b, recv(1, vec![])),
        Err(PostError::InvalidWr(WrError::UsesSrq))
    );
    let mut srq = TestSrq::default();
    srq.post(recv(200, vec![sge(DST, 1024, 2)]));
    srq.post(recv(201, vec![sge(DST + 1024, 1024, 2)]));
    p.srq_b = Some(srq);
    p.send(1, SendOpcode::Send, 0, &bytes(70, 700));
    let m = bytes(71, 40);
    p.send(2, SendOpcode::Send, 0, &m);
    let pkts = p.transmit(Side::A);
    for i in [0, 2, 3] {
        p.deliver(Side::B, &pkts[i]);
    }
    let wcs = p.completions(Side::B);
    assert_eq!(
        (recv_wc(&wcs[0]).wr_id, recv_wc(&wcs[0]).byte_len),
        (200, 40)
    );
    assert_eq!(p.srq_b.as_ref().unwrap().len(), 1, "201 still in the SRQ");
}

#[test]
fn err_flushes_both_queues_in_order_and_reset_discards() {
    let mut p = Pair::new(Pmtu::Mtu256);
    for i in 0..3 {
        p.send(i, SendOpcode::Send, 0, &[1; 8]);
        p.post_recv(100 + i, 0, 8);
    }
    // Half of a message is in progress at B: its WQE is flushed first.
    let (a, b) = configs(Pmtu::Mtu256);
    let mut q = Pair::with(a, b);
    q.post_recv(100, 0, 1024);
    q.post_recv(101, 1024, 1024);
    q.send(9, SendOpcode::Send, 0, &bytes(80, 600));
    let pkts = q.transmit(Side::A);
    q.deliver(Side::B, &pkts[0]);
    Engine::set_state(&mut q.b, QpState::Err);
    let got: Vec<_> = q
        .completions(Side::B)
        .iter()
        .map(|c| (recv_wc(c).wr_id, recv_wc(c).status))
        .collect();
    assert_eq!(
        got,
        vec![(100, WcStatus::WrFlushErr), (101, WcStatus::WrFlushErr)]
    );
    q.deliver(Side::B, &pkts[1]);
    assert_eq!(Engine::counters(&q.b).dropped_wrong_state, 1);

    Engine::set_state(&mut p.a, QpState::Err);
    Engine::set_state(&mut p.b, QpState::Err);
    let sends: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.0, c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        sends,
        (0..3)
            .map(|i| (CqKind::Send, i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    let recvs: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.0, c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        recvs,
        (0..3)
            .map(|i| (CqKind::Recv, 100 + i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    assert!(p.transmit(Side::A).is_empty());
    // Posted in ERR: flushed at once.
    p.send(7, SendOpcode::Send, 0, &[1; 8]);
    let c = p.completions(Side::A);
    assert_eq!((c[0].1.wr_id, c[0].1.status), (7, WcStatus::WrFlushErr));
    // set_state(RTS) from ERR is ignored; RESET discards without completions.
    Engine::set_state(&mut p.a, QpState::Rts);
    assert_eq!(Engine::state(&p.a), QpState::Err);
    Engine::set_state(&mut p.b, QpState::Reset);
    assert_eq!(Engine::state(&p.b), QpState::Reset);
    assert!(Engine::post_recv(&mut p.b, recv(1, vec![])).is_err());

    let mut r = Pair::new(Pmtu::Mtu256);
    r.send(1, SendOpcode::Send, 0, &[1; 8]);
    r.post_recv(100, 0, 8);
    Engine::set_state(&mut r.a, QpState::Reset);
    Engine::set_state(&mut r.b, QpState::Reset);
    assert!(r.completions(Side::A).is_empty() && r.completions(Side::B).is_empty());
    assert!(Engine::is_idle(&r.a));
}

#[test]
fn rtr_receives_but_does_not_send_and_raises_comm_est() {
    let (mut a, b) = configs(Pmtu::Mtu256);
    a.rq_psn = Psn::new(0xff_fffe);
    let mut p = Pair::with(a, b);
    p.b = UcQp::new_rtr(p.b.config().clone());
    assert_eq!(Engine::state(&p.b), QpState::Rtr);
    assert!(matches!(
        Engine::post_send(&mut p.b, SendWr::new(1, SendOpcode::Send, vec![])),
        Err(PostError::BadState(QpState::Rtr))
    ));
    p.post_recv(100, 0, 64);
    p.send(1, SendOpcode::Send, 0, &[5; 20]);
    p.flow();
    assert_eq!(recv_wc(&p.completions(Side::B)[0]).wr_id, 100);
    assert_eq!(Engine::poll_event(&mut p.b), Some(QpEvent::CommEst));
    Engine::enter_rts(
        &mut p.b,
        RtsAttrs {
            sq_psn: Psn::new(0xff_fffe),
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        },
    );
    assert_eq!(Engine::state(&p.b), QpState::Rts);
    // B's PSNs start at the RTS attribute and wrap.
    p.b.cfg.dest_qpn = QPN_A;
    Engine::post_recv(&mut p.a, recv(5, vec![sge(SRC + 4096, 1024, 1)])).unwrap();
    p.mem_b.put(2, DST, &[3; 600]);
    let mut w = SendWr::new(1, SendOpcode::Send, vec![sge(DST, 600, 2)]);
    w.flags = SendFlags::SIGNALED;
    Engine::post_send(&mut p.b, w).unwrap();
    let pkts = p.transmit(Side::B);
    assert_eq!(
        opcodes(&pkts),
        vec![
            (op::UC_SEND_FIRST, 0xff_fffe),
            (op::UC_SEND_MIDDLE, 0xff_ffff),
            (op::UC_SEND_LAST, 0)
        ]
    );
    for b in &pkts {
        p.deliver(Side::A, b);
    }
    let wcs = p.completions(Side::A);
    assert_eq!(
        wcs.iter()
            .filter(|c| c.0 == CqKind::Recv)
            .map(|c| c.1.byte_len)
            .collect::<Vec<_>>(),
        vec![600]
    );
    assert_eq!(p.mem_a.get(1, SRC + 4096, 600), vec![3; 600]);
}

#[test]
fn bad_local_sge_moves_to_sqe_and_rts_resumes() {
    let mut p = Pair::new(Pmtu::Mtu256);
    let mut bad = SendWr::new(1, SendOpcode::Send, vec![sge(0xdead_0000, 100, 77)]);
    bad.flags = SendFlags::empty();
    Engine::post_send(&mut p.a, bad).unwrap();
    p.send(2, SendOpcode::Send, 0, &[1; 8]);
    assert!(p.transmit(Side::A).is_empty());
    assert_eq!(Engine::state(&p.a), QpState::Sqe);
    let c: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        c,
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    // The receive side still works in SQE.
    Engine::post_recv(&mut p.a, recv(5, vec![sge(SRC, 64, 1)])).unwrap();
    p.mem_b.put(2, DST, &[4; 10]);
    let mut w = SendWr::new(9, SendOpcode::Send, vec![sge(DST, 10, 2)]);
    w.flags = SendFlags::SIGNALED;
    Engine::post_send(&mut p.b, w).unwrap();
    for b in p.transmit(Side::B) {
        p.deliver(Side::A, &b);
    }
    assert_eq!(recv_wc(&p.completions(Side::A)[0]).wr_id, 5);
    Engine::set_state(&mut p.a, QpState::Rts);
    p.post_recv(100, 0, 64);
    p.send(3, SendOpcode::Send, 0, &[6; 8]);
    let pkts = p.flow();
    assert_eq!(pkts.len(), 1);
    let got: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (c.0, c.1.wr_id))
        .collect();
    assert_eq!(got, vec![(CqKind::Send, 9), (CqKind::Recv, 100)]);
}

#[test]
fn sqd_finishes_the_started_message_then_drains() {
    let mut p = Pair::new(Pmtu::Mtu256);
    p.send(1, SendOpcode::Send, 0, &bytes(90, 600));
    p.send(2, SendOpcode::Send, 0, &[1; 8]);
    let mut env = Env::new(&p.mem_a);
    assert!(Engine::poll_transmit(&mut p.a, Instant::ZERO, &mut env, &mut p.buf).is_some());
    Engine::set_state(&mut p.a, QpState::Sqd);
    assert_eq!(Engine::poll_event(&mut p.a), None);
    let rest = p.transmit(Side::A);
    assert_eq!(rest.len(), 2, "the rest of WR 1, not WR 2");
    assert_eq!(Engine::poll_event(&mut p.a), Some(QpEvent::SqDrained));
    Engine::set_state(&mut p.a, QpState::Rts);
    assert_eq!(p.transmit(Side::A).len(), 1);
}

#[test]
fn inline_payload_and_zero_length_messages() {
    let mut p = Pair::new(Pmtu::Mtu256);
    p.post_recv(100, 0, 64);
    p.post_recv(101, 64, 64);
    let mut w = SendWr::new(1, SendOpcode::Send, vec![]);
    w.payload = SendPayload::Inline(vec![8; 33].into());
    Engine::post_send(&mut p.a, w).unwrap();
    Engine::post_send(&mut p.a, SendWr::new(2, SendOpcode::Send, vec![])).unwrap();
    let mut z = SendWr::new(3, SendOpcode::RdmaWrite, vec![]);
    z.rkey = 12345;
    Engine::post_send(&mut p.a, z).unwrap();
    assert_eq!(
        opcodes(&p.flow()),
        vec![
            (op::UC_SEND_ONLY, 0),
            (op::UC_SEND_ONLY, 1),
            (op::UC_RDMA_WRITE_ONLY, 2)
        ]
    );
    let got: Vec<_> = p
        .completions(Side::B)
        .iter()
        .map(|c| (recv_wc(c).wr_id, recv_wc(c).byte_len))
        .collect();
    assert_eq!(got, vec![(100, 33), (101, 0)]);
    assert_eq!(p.mem_b.get(2, DST, 33), vec![8; 33]);
    assert_eq!(
        Engine::counters(&p.b).dropped_packets,
        0,
        "zero-length WRITE needs no valid R_Key"
    );
}

#[test]
fn foreign_packets_are_dropped_and_counted() {
    let mut p = Pair::new(Pmtu::Mtu256);
    p.post_recv(100, 0, 64);
    p.send(1, SendOpcode::Send, 0, &[1; 8]);
    let pkt = p.transmit(Side::A).remove(0);
    // Another DestQP, a wrong P_Key, an RC opcode.
    for (offset, value) in [(7usize, 0x33u8), (3, 0x01), (0, op::RC_SEND_ONLY)] {
        let mut b = pkt.clone();
        b[offset] = value;
        if offset == 3 {
            b[2] = 0x00;
        }
        p.deliver(Side::B, &b);
    }
    let c = Engine::counters(&p.b);
    assert_eq!(
        (
            c.packets_received,
            c.dropped_packets,
            c.dropped_wrong_state,
            c.dropped_bad_pkey,
            c.dropped_bad_opcode
        ),
        (3, 3, 1, 1, 1)
    );
    p.deliver(Side::B, &pkt);
    assert_eq!(p.completions(Side::B).len(), 1);
}

#[test]
fn an_rc_flush_is_not_a_uc_opcode() {
    // FLUSH exists only on RC (0x1C; UC has no 0x3C): dropped as a bad opcode, nothing
    // sent, the QP unharmed.
    let mut p = Pair::new(Pmtu::Mtu256);
    p.deliver(Side::B, &flush_bytes(QPN_B, 0));
    let c = Engine::counters(&p.b);
    assert_eq!(
        (c.packets_received, c.dropped_packets, c.dropped_bad_opcode),
        (1, 1, 1)
    );
    assert!(p.transmit(Side::B).is_empty());
    p.post_recv(100, 0, 64);
    p.send(1, SendOpcode::Send, 0, &[1; 8]);
    let pkt = p.transmit(Side::A).remove(0);
    p.deliver(Side::B, &pkt);
    assert_eq!(p.completions(Side::B).len(), 1);
}

fn uc_packet(
    opcode: u8,
    psn: u32,
    payload: &[u8],
    reth: Option<(u64, u32, u32)>,
    imm: bool,
) -> Option<Vec<u8>> {
    let bth = uroce_wire::bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: QPN_B,
        ack_req: false,
        psn: Psn::new(psn & 0xff_ffff),
    };
    let mut hdr = PacketRepr::new(bth, payload);
    let info = uroce_wire::opcode::info(opcode)?;
    if info.headers.contains(uroce_wire::opcode::HeaderSet::RETH) {
        let (va, rkey, dma_len) = reth.unwrap_or((TGT, 3, payload.len() as u32));
        hdr.reth = Some(uroce_wire::reth::Repr { va, rkey, dma_len });
    }
    if info.headers.contains(uroce_wire::opcode::HeaderSet::IMMDT) || imm {
        hdr.immdt = Some(uroce_wire::immdt::Repr { imm: 7 });
    }
    let mut buf = vec![0u8; 4096 + 128];
    let n = hdr.emit(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Arbitrary sequences of UC packets (any UC opcode, PSNs around the expected one,
    /// random RETHs and lengths) and arbitrary bytes never panic, never complete a receive
    /// with more bytes than its WQE holds, and every packet is either placed or counted
    /// as dropped by one cause.
    #[test]
    fn arbitrary_packets_never_panic(
        ops in proptest::collection::vec(
            (0x20u8..=0x2b, 0u32..8, 0usize..600, any::<u64>(), any::<u32>(), 0u32..2000, any::<bool>()),
            1..60,
        ),
        junk in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..10),
        srq in any::<bool>(),
    ) {
        let (a, mut b) = configs(Pmtu::Mtu256);
        b.use_srq = srq;
        let mut p = Pair::with(a, b);
        let mut srq_q = TestSrq::default();
        for i in 0..8 {
            if srq {
                srq_q.post(recv(i, vec![sge(DST + 512 * i, 512, 2)]));
            } else {
                p.post_recv(i, 512 * i, 512);
            }
        }
        if srq {
            p.srq_b = Some(srq_q);
        }
        let mut delivered = 0u64;
        for (opcode, psn, len, va, rkey, dma_len, real_reth) in ops {
            let payload = vec![0x5a; len];
            let reth = if real_reth { Some((TGT + (va % 4096), 3, dma_len)) } else { Some((va, rkey, dma_len)) };
            if let Some(b) = uc_packet(opcode, psn, &payload, reth, false) {
                p.deliver(Side::B, &b);
                delivered += 1;
            }
        }
        for j in &junk {
            if let Ok(pkt) = PacketRepr::parse(j) {
                let mut env = Env::new(&p.mem_b);
                Engine::handle_packet(&mut p.b, Instant::ZERO, &Arrival::new(IP_A, IP_B), &pkt, &mut env);
                delivered += 1;
            }
        }
        let c = Engine::counters(&p.b);
        prop_assert_eq!(c.packets_received, delivered);
        let causes = c.dropped_wrong_state + c.dropped_bad_opcode + c.dropped_uc_sequence
            + c.dropped_duplicates + c.dropped_no_recv_wqe + c.dropped_remote_access + c.dropped_length;
        prop_assert_eq!(c.dropped_packets, causes);
        for (_, wc) in p.completions(Side::B) {
            prop_assert!(wc.byte_len <= 512 || wc.opcode == WcOpcode::RecvRdmaWithImm);
        }
        prop_assert_eq!(Engine::state(&p.b), QpState::Rts);
    }
}
