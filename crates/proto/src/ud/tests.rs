//! UD engine tests: engines joined by an in-memory wire (poll_transmit → `PacketRepr::parse`
//! → routed by `Transmit::dst` and DestQP → handle_packet), each node over its own test
//! memory. Expected bytes are written out by hand or taken from packets the Linux kernel's
//! rxe driver sent (embedded below), never read back from the engine.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use uroce_wire::{bth, PacketRepr, Pmtu, Psn};

use super::{UdConfig, UdQp, GRH_LEN, GSI_QKEY};
use crate::engine::{Arrival, Engine, Transmit};
use crate::engine::{CqKind, Env, PostError, QpEvent, RtsAttrs};
use crate::memory::Sge;
use crate::qp_state::{QpState, QpType};
use crate::rc::tests::LOCAL_WRITE;
use crate::testing::{TestMemory, TestSrq};
use crate::time::Instant;
use crate::wr::{
    RecvWr, SendFlags, SendOpcode, SendPayload, SendWr, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion, WrError,
};

/// Send buffers (readable) and receive buffers (writable) of every test memory.
const SEND_KEY: u32 = 1;
const SEND_BASE: u64 = 0x10_0000;
const RECV_KEY: u32 = 2;
const RECV_BASE: u64 = 0x20_0000;
const REGION: usize = 1 << 20;
const BUF: usize = 4096 + 64;

const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn mem() -> TestMemory {
    let m = TestMemory::new();
    m.add(SEND_KEY, SEND_BASE, REGION, LOCAL_WRITE);
    m.add(RECV_KEY, RECV_BASE, REGION, LOCAL_WRITE);
    m
}

fn rts_attrs(psn: u32) -> RtsAttrs {
    RtsAttrs {
        sq_psn: Psn::new(psn),
        timeout: 0,
        retry_cnt: 0,
        rnr_retry: 0,
        max_rd_atomic: 0,
    }
}

/// A UD QP in RTS.
fn ud_qp(qpn: u32, qkey: u32, local: IpAddr) -> UdQp {
    let mut qp = UdQp::new_rtr(UdConfig::new(qpn, qkey, local));
    qp.enter_rts(rts_attrs(0));
    qp
}

/// A send of `data` (written into the send region at `off`) to `dest`.
fn send_wr(m: &TestMemory, wr_id: u64, off: u64, data: &[u8], dest: UdDest) -> SendWr {
    m.put(SEND_KEY, SEND_BASE + off, data);
    let mut wr = SendWr::new(
        wr_id,
        SendOpcode::Send,
        vec![Sge {
            addr: SEND_BASE + off,
            length: data.len() as u32,
            lkey: SEND_KEY,
        }],
    );
    wr.flags = SendFlags::SIGNALED;
    wr.ud = Some(dest);
    wr
}

/// A receive of `len` bytes at `off` of the receive region.
fn recv_wr(wr_id: u64, off: u64, len: u32) -> RecvWr {
    RecvWr::new(
        wr_id,
        vec![Sge {
            addr: RECV_BASE + off,
            length: len,
            lkey: RECV_KEY,
        }],
    )
}

/// Every packet `qp` has ready, checked to parse and to leave the ICRC zero.
fn transmit_all(qp: &mut UdQp, m: &TestMemory) -> Vec<(Transmit, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; BUF];
    for _ in 0..10_000 {
        let Some(t) = qp.poll_transmit(Instant::ZERO, &mut Env::new(m), &mut buf) else {
            return out;
        };
        let bytes = buf[..t.len].to_vec();
        let pkt = PacketRepr::parse(&bytes).expect("the engine emitted an unparsable packet");
        assert_eq!(pkt.buffer_len(), t.len);
        assert_eq!(&bytes[t.len - 4..], &[0, 0, 0, 0], "ICRC left zero");
        out.push((t, bytes));
    }
    panic!("poll_transmit never returned None");
}

fn deliver(qp: &mut UdQp, m: &TestMemory, from: Arrival, bytes: &[u8]) {
    let pkt = PacketRepr::parse(bytes).expect("parse");
    qp.handle_packet(Instant::ZERO, &from, &pkt, &mut Env::new(m));
}

fn completions(qp: &mut UdQp) -> Vec<(CqKind, WorkCompletion)> {
    std::iter::from_fn(|| qp.poll_completion())
        .take(100_000)
        .collect()
}

/// The RFC 791 header checksum, computed here independently of the wire crate.
fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum: u32 = 0;
    for w in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------
// Packets of the Linux kernel's rxe driver (Debian 12, kernel 6.1), captured on the wire.

/// `udaddy`: UD SEND_ONLY_WITH_IMMEDIATE from QP 0x11 to QP 0x11, PSN 0, Q_Key
/// 0x01234567, ImmDt 0x00000011, 100 zero payload bytes; BTH..ICRC (a kernel rxe packet).
const RXE_UDADDY_SEND_IMM: &str = concat!(
    "6500ffff0000001100000000",
    "0123456700000011",
    "00000011",
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000",
    "b811fa7e",
);
/// The IPv4 header rxe sent that packet in (198.18.0.3 → 198.18.0.2, ID 0x38bf, DF, TTL 64).
const RXE_UDADDY_IPV4: &str = "4500009c38bf400040117568c6120003c6120002";

/// `ibv_ud_pingpong`: UD SEND_ONLY, QP 0x11 → 0x11, PSN 0x89c4ac, Q_Key 0x11111111: its
/// BTH and DETH; 1024 payload bytes of 0x7b and the ICRC 0x159eb104 follow on the wire
/// (a kernel rxe packet).
const RXE_PINGPONG_HEADERS: &str = "6400ffff000000110089c4ac1111111100000011";
const RXE_PINGPONG_ICRC: &str = "159eb104";
/// Its IPv4 header (198.18.0.3 → 198.18.0.2, ID 0xf2b9, DF, TTL 64).
const RXE_PINGPONG_IPV4: &str = "45000434f2b940004011b7d5c6120003c6120002";

fn rxe_pingpong_packet() -> Vec<u8> {
    let mut p = hex(RXE_PINGPONG_HEADERS);
    p.extend(std::iter::repeat_n(0x7b, 1024));
    p.extend(hex(RXE_PINGPONG_ICRC));
    p
}

const RXE_SRC: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3));
const RXE_DST: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));

// ---------------------------------------------------------------------------------------
// Sending.

#[test]
fn send_only_with_imm_bytes_match_hand_written_and_rxe() {
    let m = mem();
    let mut qp = ud_qp(0x11, 0x5555, RXE_SRC);
    let mut wr = send_wr(
        &m,
        7,
        0,
        &[0u8; 100],
        UdDest::new(RXE_DST, 0x11, 0x0123_4567),
    );
    wr.opcode = SendOpcode::SendWithImm;
    wr.imm_data = 0x0000_0011;
    qp.post_send(wr).unwrap();
    let out = transmit_all(&mut qp, &m);
    assert_eq!(out.len(), 1);
    let (t, bytes) = &out[0];
    assert_eq!(t.dst, RXE_DST);
    // By hand: BTH opcode 0x65, SE 0, M 0, pad 0, TVer 0, P_Key 0xffff, DestQP 0x11,
    // AckReq 0, PSN 0; DETH Q_Key 0x01234567, SrcQP 0x11; ImmDt 0x00000011.
    let mut expected = vec![
        0x65, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, // BTH
        0x01, 0x23, 0x45, 0x67, 0x00, 0x00, 0x00, 0x11, // DETH
        0x00, 0x00, 0x00, 0x11, // ImmDt
    ];
    expected.extend([0u8; 100]);
    expected.extend([0u8; 4]); // ICRC, sealed by the I/O layer
    assert_eq!(bytes, &expected);
    // The kernel's packet is the same up to the ICRC.
    let rxe = hex(RXE_UDADDY_SEND_IMM);
    assert_eq!(bytes.len(), rxe.len());
    assert_eq!(bytes[..bytes.len() - 4], rxe[..rxe.len() - 4]);
    let c = completions(&mut qp);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].0, CqKind::Send);
    assert_eq!(c[0].1.status, WcStatus::Success);
    assert_eq!(c[0].1.opcode, WcOpcode::Send);
    assert_eq!((c[0].1.wr_id, c[0].1.byte_len), (7, 100));
}

#[test]
fn send_only_matches_rxe_pingpong_layout() {
    let m = mem();
    let mut qp = ud_qp(0x11, 0x1111_1111, RXE_SRC);
    qp.enter_rts(rts_attrs(0)); // already RTS: PSN unchanged
    let mut qp2 = UdQp::new_rtr(UdConfig::new(0x11, 0x1111_1111, RXE_SRC));
    qp2.enter_rts(rts_attrs(0x0089_c4ac));
    let data = vec![0x7bu8; 1024];
    qp2.post_send(send_wr(
        &m,
        1,
        0,
        &data,
        UdDest::new(RXE_DST, 0x11, 0x1111_1111),
    ))
    .unwrap();
    let out = transmit_all(&mut qp2, &m);
    let rxe = rxe_pingpong_packet();
    assert_eq!(out[0].1.len(), rxe.len());
    assert_eq!(out[0].1[..rxe.len() - 4], rxe[..rxe.len() - 4]);
    // The PSN advances by one per packet.
    qp2.post_send(send_wr(
        &m,
        2,
        0,
        &data,
        UdDest::new(RXE_DST, 0x11, 0x1111_1111),
    ))
    .unwrap();
    let out = transmit_all(&mut qp2, &m);
    let pkt = PacketRepr::parse(&out[0].1).unwrap();
    assert_eq!(pkt.bth.psn, Psn::new(0x0089_c4ad));
    drop(qp);
}

#[test]
fn high_order_qkey_bit_sends_the_qps_own_qkey() {
    let m = mem();
    let mut a = ud_qp(0x11, 0x0000_abcd, A_IP);
    let mut b = ud_qp(0x22, 0x0000_abcd, B_IP);
    b.post_recv(recv_wr(1, 0, 2048)).unwrap();
    // High bit set: the QP's own Q_Key (0xabcd) goes on the wire, whatever the rest says.
    a.post_send(send_wr(
        &m,
        1,
        0,
        b"hi",
        UdDest::new(B_IP, 0x22, 0x8000_1234),
    ))
    .unwrap();
    // High bit clear: the WR's Q_Key verbatim.
    a.post_send(send_wr(
        &m,
        2,
        0,
        b"hi",
        UdDest::new(B_IP, 0x22, 0x7fff_1234),
    ))
    .unwrap();
    let out = transmit_all(&mut a, &m);
    let q: Vec<u32> = out
        .iter()
        .map(|(_, p)| PacketRepr::parse(p).unwrap().deth.unwrap().qkey)
        .collect();
    assert_eq!(q, [0x0000_abcd, 0x7fff_1234]);
    for (_, p) in &out {
        deliver(&mut b, &m, Arrival::new(A_IP, B_IP), p);
    }
    let c = completions(&mut b);
    assert_eq!(c.len(), 1, "only the first matches B's Q_Key");
    assert_eq!(b.counters().dropped_bad_qkey, 1);
}

#[test]
fn oversize_and_invalid_sends_are_refused_at_post_time() {
    let m = mem();
    let mut cfg = UdConfig::new(0x11, 1, A_IP);
    cfg.pmtu = Pmtu::Mtu256;
    let mut a = UdQp::new_rtr(cfg);
    // Not before RTS.
    let wr = send_wr(&m, 1, 0, &[1; 10], UdDest::new(B_IP, 0x22, 1));
    assert_eq!(
        a.post_send(wr.clone()),
        Err(PostError::BadState(QpState::Rtr))
    );
    a.enter_rts(rts_attrs(0));
    let dest = UdDest::new(B_IP, 0x22, 1);
    assert_eq!(
        a.post_send(send_wr(&m, 1, 0, &[1; 257], dest)),
        Err(PostError::InvalidWr(WrError::LargerThanMtu {
            len: 257,
            mtu: 256
        }))
    );
    let mut inline = send_wr(&m, 1, 0, &[], dest);
    inline.payload = SendPayload::Inline(vec![3; 300].into());
    assert_eq!(
        a.post_send(inline),
        Err(PostError::InvalidWr(WrError::LargerThanMtu {
            len: 300,
            mtu: 256
        }))
    );
    let mut nodest = send_wr(&m, 1, 0, &[1], dest);
    nodest.ud = None;
    assert_eq!(
        a.post_send(nodest),
        Err(PostError::InvalidWr(WrError::MissingDestination))
    );
    for op in [
        SendOpcode::RdmaWrite,
        SendOpcode::RdmaRead,
        SendOpcode::AtomicFetchAndAdd,
        SendOpcode::SendWithInv,
    ] {
        let mut w = send_wr(&m, 1, 0, &[1; 8], dest);
        w.opcode = op;
        assert_eq!(
            a.post_send(w),
            Err(PostError::InvalidWr(WrError::OpcodeNotSupported {
                opcode: op,
                qp_type: QpType::Ud,
            }))
        );
    }
    assert!(
        transmit_all(&mut a, &m).is_empty(),
        "nothing refused is sent"
    );
    // Exactly the PMTU is fine, inline too.
    a.post_send(send_wr(&m, 2, 0, &[1; 256], dest)).unwrap();
    let mut inline = send_wr(&m, 3, 0, &[], dest);
    inline.payload = SendPayload::Inline(vec![9; 5].into());
    a.post_send(inline).unwrap();
    let out = transmit_all(&mut a, &m);
    assert_eq!(out.len(), 2);
    assert_eq!(PacketRepr::parse(&out[1].1).unwrap().payload, &[9; 5]);
}

#[test]
fn one_qp_sends_to_three_destinations() {
    let m = mem();
    let ips = [
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    let mut a = ud_qp(0x11, 0, A_IP);
    let mut peers: Vec<(UdQp, TestMemory)> = (0..3)
        .map(|i| {
            let mut q = ud_qp(0x100 + i, 0x4000 + i, ips[i as usize]);
            q.post_recv(recv_wr(i as u64, 0, 1024)).unwrap();
            (q, mem())
        })
        .collect();
    for i in 0..3u32 {
        let data = vec![0xa0 + i as u8; 10 + i as usize];
        let dest = UdDest::new(ips[i as usize], 0x100 + i, 0x4000 + i);
        a.post_send(send_wr(&m, u64::from(i), 64 * u64::from(i), &data, dest))
            .unwrap();
    }
    let out = transmit_all(&mut a, &m);
    assert_eq!(out.len(), 3);
    for (t, bytes) in &out {
        let pkt = PacketRepr::parse(bytes).unwrap();
        let i = ips
            .iter()
            .position(|ip| *ip == t.dst)
            .expect("a known destination");
        assert_eq!(pkt.bth.dest_qp, 0x100 + i as u32);
        let (q, pm) = &mut peers[i];
        // An IPv4 sender reaching an IPv6 address arrives as an IPv4-mapped source.
        let src = match t.dst {
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V4(_) => A_IP,
        };
        deliver(q, pm, Arrival::new(src, t.dst), bytes);
    }
    for (i, (q, pm)) in peers.iter_mut().enumerate() {
        let c = completions(q);
        assert_eq!(c.len(), 1, "peer {i} got exactly its datagram");
        let wc = c[0].1;
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.src_qp, 0x11);
        assert_eq!(wc.byte_len as usize, GRH_LEN + 10 + i);
        assert_eq!(
            pm.get(RECV_KEY, RECV_BASE + GRH_LEN as u64, 10 + i),
            vec![0xa0 + i as u8; 10 + i]
        );
    }
    let c = completions(&mut a);
    assert_eq!(
        c.iter().map(|c| c.1.wr_id).collect::<Vec<_>>(),
        [0, 1, 2],
        "sends complete in order once emitted"
    );
}

#[test]
fn unsignaled_sends_complete_silently_and_bad_sges_move_to_sqe() {
    let m = mem();
    let mut a = ud_qp(0x11, 7, A_IP);
    let mut b = ud_qp(0x22, 7, B_IP);
    let dest = UdDest::new(B_IP, 0x22, 7);
    let mut quiet = send_wr(&m, 1, 0, b"x", dest);
    quiet.flags = SendFlags::empty();
    a.post_send(quiet).unwrap();
    let mut bad = send_wr(&m, 2, 0, b"y", dest);
    bad.payload = SendPayload::Sges(
        vec![Sge {
            addr: 0xdead_0000,
            length: 4,
            lkey: 99,
        }]
        .into(),
    );
    a.post_send(bad).unwrap();
    a.post_send(send_wr(&m, 3, 0, b"z", dest)).unwrap();
    let out = transmit_all(&mut a, &m);
    assert_eq!(
        out.len(),
        1,
        "the first one went out, then the error stopped the queue"
    );
    assert_eq!(a.state(), QpState::Sqe);
    let c: Vec<_> = completions(&mut a)
        .into_iter()
        .map(|c| (c.1.wr_id, c.1.status))
        .collect();
    assert_eq!(
        c,
        [(2, WcStatus::LocProtErr), (3, WcStatus::WrFlushErr)],
        "unsignaled success is silent; the error and the flush are reported"
    );
    // SQE still receives.
    a.post_recv(recv_wr(9, 0, 100)).unwrap();
    b.post_send(send_wr(&m, 1, 0, b"back", UdDest::new(A_IP, 0x11, 7)))
        .unwrap();
    for (_, p) in transmit_all(&mut b, &m) {
        deliver(&mut a, &m, Arrival::new(B_IP, A_IP), &p);
    }
    let c = completions(&mut a);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1.wr_id, 9);
    // Posting in SQE flushes; RTS again sends.
    a.post_send(send_wr(&m, 4, 0, b"q", dest)).unwrap();
    assert_eq!(completions(&mut a)[0].1.status, WcStatus::WrFlushErr);
    a.enter_rts(rts_attrs(0));
    a.post_send(send_wr(&m, 5, 0, b"q", dest)).unwrap();
    assert_eq!(transmit_all(&mut a, &m).len(), 1);
}

// ---------------------------------------------------------------------------------------
// Receiving.

#[test]
fn qkey_mismatch_is_dropped_and_counted_and_keeps_the_wqe() {
    let m = mem();
    let mut a = ud_qp(0x11, 0, A_IP);
    let mut b = ud_qp(0x22, 0x1234, B_IP);
    b.post_recv(recv_wr(1, 0, 1024)).unwrap();
    a.post_send(send_wr(&m, 1, 0, b"wrong", UdDest::new(B_IP, 0x22, 0x1235)))
        .unwrap();
    a.post_send(send_wr(&m, 2, 0, b"right", UdDest::new(B_IP, 0x22, 0x1234)))
        .unwrap();
    let out = transmit_all(&mut a, &m);
    deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &out[0].1);
    assert!(completions(&mut b).is_empty(), "never a completion");
    let k = b.counters();
    assert_eq!((k.dropped_bad_qkey, k.dropped_packets), (1, 1));
    deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &out[1].1);
    let c = completions(&mut b);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1.wr_id, 1, "the WQE was still there");
    assert_eq!(m.get(RECV_KEY, RECV_BASE + 40, 5), b"right");
}

#[test]
fn no_receive_wqe_drops_and_counts() {
    let m = mem();
    let mut a = ud_qp(0x11, 0, A_IP);
    let mut b = ud_qp(0x22, 5, B_IP);
    for i in 0..3 {
        a.post_send(send_wr(&m, i, 0, &[i as u8; 3], UdDest::new(B_IP, 0x22, 5)))
            .unwrap();
    }
    let out = transmit_all(&mut a, &m);
    deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &out[0].1);
    deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &out[1].1);
    assert!(completions(&mut b).is_empty());
    assert_eq!(b.counters().dropped_no_receive, 2);
    assert!(
        transmit_all(&mut b, &m).is_empty(),
        "UD answers nothing (no RNR NAK)"
    );
    b.post_recv(recv_wr(1, 0, 64)).unwrap();
    deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &out[2].1);
    let c = completions(&mut b);
    assert_eq!(c.len(), 1);
    assert_eq!(m.get(RECV_KEY, RECV_BASE + 40, 3), [2, 2, 2]);
}

#[test]
fn grh_area_ipv4_is_the_ip_header_rxe_received() {
    // The kernel's pingpong packet delivered to our QP as it arrived at rxe: the GRH area
    // must be 20 zero bytes and then exactly the IPv4 header on the wire.
    let m = mem();
    let mut b = ud_qp(0x11, 0x1111_1111, RXE_DST);
    b.post_recv(recv_wr(5, 0, 2048)).unwrap();
    let from = Arrival {
        ipv4_id: 0xf2b9,
        ..Arrival::new(RXE_SRC, RXE_DST)
    };
    deliver(&mut b, &m, from, &rxe_pingpong_packet());
    let c = completions(&mut b);
    assert_eq!(c.len(), 1);
    let wc = c[0].1;
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 40 + 1024);
    assert_eq!(wc.src_qp, 0x11);
    assert_eq!(wc.qp_num, 0x11);
    assert_eq!(wc.wc_flags, WcFlags::GRH);
    // The packet type a RoCE HCA reports in `sl`: RoCEv2 over IPv4.
    assert_eq!((wc.slid, wc.sl, wc.pkey_index), (0, 0xA, 0));
    let grh = m.get(RECV_KEY, RECV_BASE, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20..], hex(RXE_PINGPONG_IPV4)[..]);
    assert!(ipv4_checksum_ok(&grh[20..]));
    assert_eq!(m.get(RECV_KEY, RECV_BASE + 40, 1024), vec![0x7b; 1024]);

    // The udaddy packet, with immediate data.
    let mut b = ud_qp(0x11, 0x0123_4567, RXE_DST);
    b.post_recv(recv_wr(6, 4096, 2048)).unwrap();
    let from = Arrival {
        ipv4_id: 0x38bf,
        ..Arrival::new(RXE_SRC, RXE_DST)
    };
    deliver(&mut b, &m, from, &hex(RXE_UDADDY_SEND_IMM));
    let wc = completions(&mut b)[0].1;
    assert_eq!(wc.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
    assert_eq!(wc.imm_data, 0x11);
    assert_eq!(wc.byte_len, 140);
    assert_eq!(
        m.get(RECV_KEY, RECV_BASE + 4096 + 20, 20),
        hex(RXE_UDADDY_IPV4)
    );
}

#[test]
fn grh_area_ipv4_fields_by_hand() {
    let m = mem();
    let mut a = ud_qp(0x11, 0, A_IP);
    let mut b = ud_qp(0x22, 9, B_IP);
    b.post_recv(recv_wr(1, 0, 256)).unwrap();
    a.post_send(send_wr(&m, 1, 0, &[0x55; 13], UdDest::new(B_IP, 0x22, 9)))
        .unwrap();
    let (_, p) = transmit_all(&mut a, &m).pop().unwrap();
    let from = Arrival {
        traffic_class: 0xb8,
        hop_limit: 17,
        flow_label: 0,
        ipv4_id: 0xbeef,
        ..Arrival::new(A_IP, B_IP)
    };
    deliver(&mut b, &m, from, &p);
    let g = m.get(RECV_KEY, RECV_BASE, 40);
    let ip = &g[20..];
    // 13 payload bytes → 3 pad; BTH 12 + DETH 8 + 16 + ICRC 4 = 40 → UDP 48 → IP 68.
    assert_eq!(p.len(), 40);
    assert_eq!(&g[..20], &[0; 20]);
    assert_eq!(ip[0], 0x45);
    assert_eq!(ip[1], 0xb8);
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 68);
    assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 0xbeef);
    assert_eq!(u16::from_be_bytes([ip[6], ip[7]]), 0x4000, "DF, offset 0");
    assert_eq!(ip[8], 17);
    assert_eq!(ip[9], 17, "UDP");
    assert!(ipv4_checksum_ok(ip));
    assert_eq!(&ip[12..16], &[127, 0, 0, 1]);
    assert_eq!(&ip[16..20], &[127, 0, 0, 2]);
    assert_eq!(m.get(RECV_KEY, RECV_BASE + 40, 13), [0x55; 13]);
    assert_eq!(completions(&mut b)[0].1.byte_len, 53);
}

#[test]
fn grh_area_ipv6_fields_by_hand() {
    let m = mem();
    let src6: Ipv6Addr = "fd00::1".parse().unwrap();
    let dst6: Ipv6Addr = "fd00::2:3".parse().unwrap();
    let mut a = ud_qp(0x11, 0, IpAddr::V6(src6));
    let mut b = ud_qp(0x22, 9, IpAddr::V6(dst6));
    b.post_recv(recv_wr(1, 0, 256)).unwrap();
    let mut wr = send_wr(
        &m,
        1,
        0,
        &[0x66; 100],
        UdDest::new(IpAddr::V6(dst6), 0x22, 9),
    );
    wr.opcode = SendOpcode::SendWithImm;
    wr.imm_data = 0xcafe_f00d;
    wr.flags |= SendFlags::SOLICITED;
    a.post_send(wr).unwrap();
    let (t, p) = transmit_all(&mut a, &m).pop().unwrap();
    assert_eq!(t.dst, IpAddr::V6(dst6));
    let from = Arrival {
        traffic_class: 0x2c,
        hop_limit: 3,
        flow_label: 0xabcde,
        ipv4_id: 0x7777, // ignored for IPv6
        ..Arrival::new(IpAddr::V6(src6), IpAddr::V6(dst6))
    };
    deliver(&mut b, &m, from, &p);
    let g = m.get(RECV_KEY, RECV_BASE, 40);
    // version 6 | TC 0x2c | flow label 0xabcde
    let first = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
    assert_eq!(first, (6 << 28) | (0x2c << 20) | 0xabcde);
    // UDP length: 8 + BTH 12 + DETH 8 + ImmDt 4 + 100 + ICRC 4.
    assert_eq!(u16::from_be_bytes([g[4], g[5]]), 8 + 128);
    assert_eq!(g[6], 17, "next header UDP");
    assert_eq!(g[7], 3, "hop limit");
    assert_eq!(&g[8..24], &src6.octets());
    assert_eq!(&g[24..40], &dst6.octets());
    assert_eq!(m.get(RECV_KEY, RECV_BASE + 40, 100), vec![0x66; 100]);
    let wc = completions(&mut b)[0].1;
    assert_eq!(wc.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
    assert_eq!(wc.imm_data, 0xcafe_f00d);
    assert!(wc.solicited);
    assert_eq!(wc.byte_len, 140);
    // The packet type a RoCE HCA reports in `sl`: RoCEv2 over IPv6.
    assert_eq!(wc.sl, 0x9);
}

#[test]
fn receive_buffer_too_small_completes_loc_len_err_and_stays_usable() {
    let m = mem();
    let mut a = ud_qp(0x11, 0, A_IP);
    let mut b = ud_qp(0x22, 3, B_IP);
    b.post_recv(recv_wr(1, 0, 40 + 9)).unwrap();
    b.post_recv(recv_wr(2, 1024, 40 + 10)).unwrap();
    for i in 0..2 {
        a.post_send(send_wr(&m, i, 0, &[7; 10], UdDest::new(B_IP, 0x22, 3)))
            .unwrap();
    }
    for (_, p) in transmit_all(&mut a, &m) {
        deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &p);
    }
    let c: Vec<_> = completions(&mut b)
        .into_iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.byte_len))
        .collect();
    assert_eq!(c, [(1, WcStatus::LocLenErr, 0), (2, WcStatus::Success, 50)]);
    assert_eq!(b.state(), QpState::Rts);
    assert_eq!(b.counters().dropped_recv_too_small, 1);
    assert_eq!(
        m.get(RECV_KEY, RECV_BASE, 49),
        vec![0; 49],
        "nothing placed"
    );
}

#[test]
fn wrong_opcode_pkey_qpn_and_state_are_dropped() {
    let m = mem();
    let mut a = ud_qp(0x11, 0, A_IP);
    let mut b = ud_qp(0x22, 3, B_IP);
    b.post_recv(recv_wr(1, 0, 1024)).unwrap();
    a.post_send(send_wr(&m, 1, 0, b"abc", UdDest::new(B_IP, 0x22, 3)))
        .unwrap();
    let (_, good) = transmit_all(&mut a, &m).pop().unwrap();
    let from = Arrival::new(A_IP, B_IP);
    // Another DestQP.
    let mut p = good.clone();
    bth::Header::new_unchecked(&mut p[..]).set_dest_qp(0x23);
    deliver(&mut b, &m, from, &p);
    // A P_Key that does not match 0xffff.
    let mut p = good.clone();
    bth::Header::new_unchecked(&mut p[..]).set_pkey(0x0001);
    deliver(&mut b, &m, from, &p);
    // An RC SEND_ONLY (no DETH: its bytes read as payload).
    let mut p = good.clone();
    bth::Header::new_unchecked(&mut p[..]).set_opcode(0x04);
    deliver(&mut b, &m, from, &p);
    let k = b.counters();
    assert_eq!(k.dropped_wrong_state, 1);
    assert_eq!(k.dropped_bad_pkey, 1);
    assert_eq!(k.dropped_bad_opcode, 1);
    assert!(completions(&mut b).is_empty());
    // In RESET and INIT nothing is received.
    b.set_state(QpState::Reset);
    b.set_state(QpState::Init);
    b.post_recv(recv_wr(2, 0, 1024)).unwrap();
    deliver(&mut b, &m, from, &good);
    assert!(completions(&mut b).is_empty());
    assert_eq!(b.counters().dropped_wrong_state, 2);
    // RTR receives.
    b.set_state(QpState::Rtr);
    deliver(&mut b, &m, from, &good);
    assert_eq!(completions(&mut b)[0].1.wr_id, 2);
    assert_eq!(b.counters().packets_received, 5);
}

#[test]
fn srq_receives() {
    let m = mem();
    let mut a = ud_qp(0x11, 0, A_IP);
    let mut cfg = UdConfig::new(0x22, 3, B_IP);
    cfg.use_srq = true;
    let mut b = UdQp::new_rtr(cfg);
    assert_eq!(
        b.post_recv(recv_wr(1, 0, 64)),
        Err(PostError::InvalidWr(WrError::UsesSrq))
    );
    let mut srq = TestSrq::default();
    srq.post(recv_wr(77, 0, 64));
    a.post_send(send_wr(&m, 1, 0, b"srq", UdDest::new(B_IP, 0x22, 3)))
        .unwrap();
    a.post_send(send_wr(&m, 2, 0, b"srq", UdDest::new(B_IP, 0x22, 3)))
        .unwrap();
    for (_, p) in transmit_all(&mut a, &m) {
        let pkt = PacketRepr::parse(&p).unwrap();
        b.handle_packet(
            Instant::ZERO,
            &Arrival::new(A_IP, B_IP),
            &pkt,
            &mut Env::with_srq(&m, &mut srq),
        );
    }
    let c = completions(&mut b);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1.wr_id, 77);
    assert_eq!(b.counters().dropped_no_receive, 1);
    b.set_state(QpState::Err);
    assert_eq!(b.poll_event(), Some(QpEvent::LastWqeReached));
}

// ---------------------------------------------------------------------------------------
// States.

#[test]
fn err_flushes_both_queues_in_order_and_reset_discards() {
    let m = mem();
    let mut a = ud_qp(0x11, 0, A_IP);
    let dest = UdDest::new(B_IP, 0x22, 0);
    a.set_state(QpState::Sqd);
    assert_eq!(a.poll_event(), Some(QpEvent::SqDrained));
    for i in 0..3 {
        let mut wr = send_wr(&m, 10 + i, 0, b"s", dest);
        wr.flags = SendFlags::empty(); // flushes are reported anyway
        a.post_send(wr).unwrap();
    }
    assert!(transmit_all(&mut a, &m).is_empty(), "SQD starts nothing");
    for i in 0..2 {
        a.post_recv(recv_wr(20 + i, 0, 64)).unwrap();
    }
    a.set_state(QpState::Err);
    assert!(a.is_idle());
    a.post_send(send_wr(&m, 13, 0, b"s", dest)).unwrap();
    a.post_recv(recv_wr(22, 0, 64)).unwrap();
    let c: Vec<_> = completions(&mut a)
        .into_iter()
        .map(|c| (c.0, c.1.wr_id, c.1.status))
        .collect();
    use CqKind::{Recv, Send};
    use WcStatus::WrFlushErr as F;
    assert_eq!(
        c,
        [
            (Send, 10, F),
            (Send, 11, F),
            (Send, 12, F),
            (Recv, 20, F),
            (Recv, 21, F),
            (Send, 13, F),
            (Recv, 22, F)
        ]
    );
    // ERR stays ERR until RESET.
    a.enter_rts(rts_attrs(0));
    a.set_state(QpState::Rts);
    assert_eq!(a.state(), QpState::Err);
    a.set_state(QpState::Reset);
    assert_eq!(
        a.post_recv(recv_wr(1, 0, 8)),
        Err(PostError::BadState(QpState::Reset))
    );
    a.set_state(QpState::Init);
    a.post_send(send_wr(&m, 1, 0, b"s", dest)).unwrap_err();
    a.post_recv(recv_wr(30, 0, 64)).unwrap();
    a.set_state(QpState::Rtr);
    a.enter_rts(rts_attrs(42));
    a.post_send(send_wr(&m, 31, 0, b"s", dest)).unwrap();
    let out = transmit_all(&mut a, &m);
    assert_eq!(PacketRepr::parse(&out[0].1).unwrap().bth.psn, Psn::new(42));
    assert!(a.poll_timeout().is_none());
    // RESET in between discarded nothing it should have reported.
    let ids: Vec<u64> = completions(&mut a).iter().map(|c| c.1.wr_id).collect();
    assert_eq!(ids, [31]);
}

#[test]
fn queue_limits() {
    let m = mem();
    let mut cfg = UdConfig::new(0x11, 0, A_IP);
    cfg.max_send_wr = 2;
    cfg.max_recv_wr = 1;
    let mut a = UdQp::new_rtr(cfg);
    a.enter_rts(rts_attrs(0));
    let dest = UdDest::new(B_IP, 0x22, 0);
    a.post_send(send_wr(&m, 1, 0, b"s", dest)).unwrap();
    a.post_send(send_wr(&m, 2, 0, b"s", dest)).unwrap();
    assert_eq!(
        a.post_send(send_wr(&m, 3, 0, b"s", dest)),
        Err(PostError::QueueFull)
    );
    transmit_all(&mut a, &m);
    // Completions not yet polled still hold their slots.
    assert_eq!(
        a.post_send(send_wr(&m, 3, 0, b"s", dest)),
        Err(PostError::QueueFull)
    );
    assert_eq!(completions(&mut a).len(), 2);
    a.post_send(send_wr(&m, 3, 0, b"s", dest)).unwrap();
    a.post_recv(recv_wr(1, 0, 64)).unwrap();
    assert_eq!(a.post_recv(recv_wr(2, 0, 64)), Err(PostError::QueueFull));
}

// ---------------------------------------------------------------------------------------
// GSI.

#[test]
fn gsi_sends_and_accepts_only_the_gsi_qkey() {
    let m = mem();
    let mut cfg = UdConfig::gsi(A_IP);
    cfg.qkey = 0x1234; // ignored: QP1's Q_Key is fixed
    let mut a = UdQp::new_rtr(cfg);
    a.enter_rts(rts_attrs(0));
    assert_eq!(a.qp_type(), QpType::Gsi);
    assert_eq!(a.qpn(), 1);
    let mut b = UdQp::new_rtr(UdConfig::gsi(B_IP));
    b.enter_rts(rts_attrs(0));
    b.post_recv(recv_wr(1, 0, 512)).unwrap();
    b.post_recv(recv_wr(2, 512, 512)).unwrap();
    a.post_send(send_wr(
        &m,
        1,
        0,
        &[1; 256],
        UdDest::new(B_IP, 1, 0x0000_1111),
    ))
    .unwrap();
    let (_, p) = transmit_all(&mut a, &m).pop().unwrap();
    let pkt = PacketRepr::parse(&p).unwrap();
    assert_eq!(pkt.deth.unwrap().qkey, GSI_QKEY);
    assert_eq!(pkt.deth.unwrap().src_qp, 1);
    assert!(pkt.bth.ack_req, "QP1 sets AckReq, as rxe does");
    deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &p);
    // A UD QP's datagram with another Q_Key to QP1 is dropped.
    let mut u = ud_qp(0x11, 0, A_IP);
    u.post_send(send_wr(
        &m,
        1,
        0,
        &[2; 8],
        UdDest::new(B_IP, 1, 0x0000_1111),
    ))
    .unwrap();
    let (_, p) = transmit_all(&mut u, &m).pop().unwrap();
    assert!(!PacketRepr::parse(&p).unwrap().bth.ack_req, "UD QPs do not");
    deliver(&mut b, &m, Arrival::new(A_IP, B_IP), &p);
    let c = completions(&mut b);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1.src_qp, 1);
    assert_eq!(b.counters().dropped_bad_qkey, 1);
    // The kernel's QP1 packet from the udaddy capture (a kernel rxe packet): its BTH and
    // DETH (QP1 → QP1, AckReq, PSN 0, Q_Key 0x80010000, SrcQP 1).
    let rxe_qp1 = hex("6400ffff00000001800000008001000000000001");
    let mut g = UdQp::new_rtr(UdConfig::gsi(RXE_SRC));
    g.enter_rts(rts_attrs(0));
    g.post_send(send_wr(&m, 1, 0, &[0; 4], UdDest::new(RXE_DST, 1, 0)))
        .unwrap();
    let (_, p) = transmit_all(&mut g, &m).pop().unwrap();
    assert_eq!(p[..20], rxe_qp1[..]);
}

// ---------------------------------------------------------------------------------------
// A lossy wire: datagrams are lost, duplicated and reordered; every one delivered is
// intact and exactly what was sent, losses are whole datagrams.

/// xorshift64*: a deterministic generator for the lossy wire.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The payload of datagram `seq` from sender `s`: a header naming it, then bytes derived
/// from it, so that any damage or mix-up shows.
fn datagram(s: u8, seq: u32, len: usize) -> Vec<u8> {
    let mut d = vec![s, 0, 0, 0];
    d[1..4].copy_from_slice(&seq.to_be_bytes()[1..]);
    d.extend((0..len.saturating_sub(4)).map(|i| (i as u32 ^ seq).wrapping_mul(31) as u8 ^ s));
    d.truncate(len.max(4));
    d
}

#[test]
fn lossy_wire_soak_delivers_whole_datagrams_or_nothing() {
    for seed in [1u64, 0x5eed, 0xdead_beef] {
        let mut rng = Rng(seed);
        let ms = [mem(), mem()];
        let mr = mem();
        let ips = [A_IP, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3))];
        let mut senders = [ud_qp(0x11, 0, ips[0]), ud_qp(0x12, 0, ips[1])];
        let mut rcv = ud_qp(0x22, 0x77, B_IP);
        const SLOT: u64 = 4096 + 64;
        const SLOTS: u64 = 64;
        let mut next_wr = 0u64;
        let mut sent: Vec<(u8, u32, Vec<u8>)> = Vec::new();
        let mut wire: Vec<(Arrival, Vec<u8>)> = Vec::new();
        let mut delivered = std::collections::HashMap::new();
        let mut on_wire = 0u64;
        let mut lost = 0u64;
        let mut dup = 0u64;
        for round in 0..300u32 {
            // Keep receive WQEs posted (sometimes too few: drops counted, never partial).
            while rcv.config().max_recv_wr > 0 && rng.below(4) != 0 && next_wr < u64::MAX {
                let slot = next_wr % SLOTS;
                if rcv
                    .post_recv(recv_wr(next_wr, slot * SLOT, SLOT as u32))
                    .is_err()
                {
                    break;
                }
                next_wr += 1;
                if next_wr % 8 == 0 {
                    break;
                }
            }
            for (s, q) in senders.iter_mut().enumerate() {
                for _ in 0..rng.below(4) {
                    let seq = sent.len() as u32;
                    let len = 4 + rng.below(1021) as usize;
                    let data = datagram(s as u8, seq, len);
                    let wr = send_wr(
                        &ms[s],
                        u64::from(seq),
                        0,
                        &data,
                        UdDest::new(B_IP, 0x22, 0x77),
                    );
                    q.post_send(wr).unwrap();
                    for (t, p) in transmit_all(q, &ms[s]) {
                        assert_eq!(t.dst, B_IP);
                        on_wire += 1;
                        let from = Arrival::new(ips[s], B_IP);
                        match rng.below(10) {
                            0 => lost += 1,
                            1 => {
                                dup += 1;
                                wire.push((from, p.clone()));
                                wire.push((from, p));
                            }
                            _ => wire.push((from, p)),
                        }
                    }
                    sent.push((s as u8, seq, data));
                }
                completions(q);
            }
            // Reorder: deliver a random permutation of what is on the wire, some later.
            let mut keep = Vec::new();
            while !wire.is_empty() {
                let i = rng.below(wire.len() as u64) as usize;
                let (from, p) = wire.swap_remove(i);
                if rng.below(5) == 0 && round < 299 {
                    keep.push((from, p));
                } else {
                    deliver(&mut rcv, &mr, from, &p);
                }
            }
            wire = keep;
            for (kind, wc) in completions(&mut rcv) {
                assert_eq!(kind, CqKind::Recv);
                assert_eq!(wc.status, WcStatus::Success);
                let slot = wc.wr_id % SLOTS;
                let len = wc.byte_len as usize - GRH_LEN;
                let got = mr.get(RECV_KEY, RECV_BASE + slot * SLOT + GRH_LEN as u64, len);
                let seq = u32::from_be_bytes([0, got[1], got[2], got[3]]);
                let (s, _, data) = &sent[seq as usize];
                assert_eq!(&got, data, "datagram {seq} intact and whole");
                assert_eq!(got[0], *s);
                assert_eq!(wc.src_qp, 0x11 + u32::from(*s));
                let grh = mr.get(RECV_KEY, RECV_BASE + slot * SLOT + 20, 20);
                assert_eq!(&grh[12..16], &[127, 0, 0, 1 + 2 * *s], "source in the GRH");
                *delivered.entry(seq).or_insert(0u32) += 1;
            }
        }
        let k = rcv.counters();
        let arrived = on_wire - lost + dup;
        assert_eq!(k.packets_received, arrived);
        let deliveries: u64 = delivered.values().map(|n| u64::from(*n)).sum();
        assert_eq!(
            deliveries + k.dropped_no_receive,
            arrived,
            "every arrival is delivered whole or dropped and counted"
        );
        assert_eq!(k.dropped_packets, k.dropped_no_receive);
        assert!(
            delivered.values().all(|n| *n <= 2),
            "a duplicate at most twice"
        );
        assert!(deliveries > sent.len() as u64 / 2, "the soak moved data");
        assert!(lost > 0 && dup > 0, "the wire did lose and duplicate");
    }
}

// ---------------------------------------------------------------------------------------
// No input panics the engine.

fn arb_arrival() -> impl Strategy<Value = Arrival> {
    let ip = prop_oneof![
        any::<[u8; 4]>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        any::<[u8; 16]>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
    ];
    (
        ip.clone(),
        ip,
        any::<u8>(),
        any::<u8>(),
        any::<u32>(),
        any::<u16>(),
    )
        .prop_map(
            |(src, dst, traffic_class, hop_limit, flow_label, ipv4_id)| Arrival {
                src,
                dst,
                traffic_class,
                hop_limit,
                flow_label,
                ipv4_id,
            },
        )
}

#[derive(Debug, Clone)]
enum Op {
    /// Bytes through `PacketRepr::parse`: a UD BTH+DETH prefix (with these fields) then
    /// random bytes, or random bytes alone.
    Packet {
        prefixed: bool,
        opcode: u8,
        qpn_ok: bool,
        qkey_ok: bool,
        pkey: u16,
        pad: u8,
        tail: Vec<u8>,
        from: Arrival,
    },
    Recv(u32),
    Send(u16, bool),
    State(u8),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            any::<bool>(),
            prop_oneof![Just(0x64u8), Just(0x65u8), any::<u8>()],
            any::<bool>(),
            any::<bool>(),
            prop_oneof![Just(0xffffu16), any::<u16>()],
            0u8..4,
            proptest::collection::vec(any::<u8>(), 0..1200),
            arb_arrival(),
        )
            .prop_map(|(prefixed, opcode, qpn_ok, qkey_ok, pkey, pad, tail, from)| {
                Op::Packet { prefixed, opcode, qpn_ok, qkey_ok, pkey, pad, tail, from }
            }),
        2 => (0u32..1200).prop_map(Op::Recv),
        2 => (0u16..1100, any::<bool>()).prop_map(|(n, imm)| Op::Send(n, imm)),
        1 => (0u8..7).prop_map(Op::State),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_packet_or_sequence_panics(gsi in any::<bool>(), ops in proptest::collection::vec(arb_op(), 1..40)) {
        let m = mem();
        let mut cfg = if gsi { UdConfig::gsi(B_IP) } else { UdConfig::new(0x22, 0x99, B_IP) };
        cfg.max_recv_wr = 8;
        cfg.max_send_wr = 8;
        let qpn = cfg.qpn;
        let qkey = if gsi { GSI_QKEY } else { 0x99 };
        let mut qp = UdQp::new_rtr(cfg);
        qp.enter_rts(rts_attrs(0xff_fffe));
        let mut posted = std::collections::HashSet::new();
        let mut done = std::collections::HashSet::new();
        let mut id = 0u64;
        let mut buf = vec![0u8; BUF];
        for op in ops {
            match op {
                Op::Packet { prefixed, opcode, qpn_ok, qkey_ok, pkey, pad, tail, from } => {
                    let mut p = Vec::new();
                    if prefixed {
                        p.extend([opcode, pad << 4, (pkey >> 8) as u8, pkey as u8]);
                        let dq = if qpn_ok { qpn } else { qpn ^ 1 };
                        p.extend(dq.to_be_bytes());
                        p.extend([0, 0, 0, 1]);
                        let k = if qkey_ok { qkey } else { qkey ^ 0x10 };
                        p.extend(k.to_be_bytes());
                        p.extend([0, 0, 0, 0x33]);
                    }
                    p.extend(tail);
                    if let Ok(pkt) = PacketRepr::parse(&p) {
                        qp.handle_packet(Instant::ZERO, &from, &pkt, &mut Env::new(&m));
                    }
                }
                Op::Recv(n) => {
                    id += 1;
                    if qp.post_recv(recv_wr(id, 0, n)).is_ok() {
                        posted.insert(id);
                    }
                }
                Op::Send(n, imm) => {
                    id += 1;
                    let mut wr = send_wr(&m, id, 0, &vec![1; usize::from(n)], UdDest::new(A_IP, 0x11, 0x8000_0000));
                    if imm { wr.opcode = SendOpcode::SendWithImm; }
                    if qp.post_send(wr).is_ok() {
                        posted.insert(id);
                    }
                }
                Op::State(s) => {
                    match s {
                        0 => qp.set_state(QpState::Err),
                        1 => qp.set_state(QpState::Reset),
                        2 => qp.set_state(QpState::Init),
                        3 => qp.set_state(QpState::Rtr),
                        4 => qp.enter_rts(rts_attrs(5)),
                        5 => qp.set_state(QpState::Sqd),
                        _ => qp.set_state(QpState::Sqe),
                    }
                }
            }
            for _ in 0..20 {
                let Some(t) = qp.poll_transmit(Instant::ZERO, &mut Env::new(&m), &mut buf) else { break };
                let pkt = PacketRepr::parse(&buf[..t.len]).expect("emitted packets parse");
                prop_assert_eq!(t.dst, A_IP);
                prop_assert_eq!(pkt.deth.map(|d| d.qkey), Some(qkey));
                prop_assert!(t.len <= 1024 + 64);
            }
            while let Some((_, wc)) = qp.poll_completion() {
                prop_assert!(posted.contains(&wc.wr_id), "completion for a posted WR");
                prop_assert!(done.insert(wc.wr_id), "no WR completes twice");
                if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
                    prop_assert!(wc.byte_len as usize >= GRH_LEN);
                }
            }
            while qp.poll_event().is_some() {}
            prop_assert!(qp.poll_timeout().is_none());
        }
    }
}

#[test]
fn multicast_datagram_reaches_each_qp_with_its_own_qkey_check() {
    use super::MULTICAST_QPN;
    let group = IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3));
    let m = mem();
    let mut a = ud_qp(0x11, 0x77, A_IP);
    // Two QPs with the group's Q_Key, one with another Q_Key, and the GSI QP.
    let mut r1 = ud_qp(0x21, 0x1234, B_IP);
    let mut r2 = ud_qp(0x22, 0x1234, B_IP);
    let mut wrong = ud_qp(0x23, 0x9999, B_IP);
    let mut gsi = UdQp::new_rtr(UdConfig::gsi(B_IP));
    gsi.enter_rts(rts_attrs(0));
    for (i, q) in [&mut r1, &mut r2, &mut wrong, &mut gsi]
        .into_iter()
        .enumerate()
    {
        q.post_recv(recv_wr(7, i as u64 * 1024, 1024)).unwrap();
    }
    a.post_send(send_wr(
        &m,
        1,
        0,
        b"to the group",
        UdDest::new(group, MULTICAST_QPN, 0x1234),
    ))
    .unwrap();
    let out = transmit_all(&mut a, &m);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.dst, group, "the IP destination is the group");
    let pkt = PacketRepr::parse(&out[0].1).unwrap();
    assert_eq!(pkt.bth.dest_qp, MULTICAST_QPN);
    let from = Arrival::new(A_IP, group);
    for q in [&mut r1, &mut r2, &mut wrong, &mut gsi] {
        deliver(q, &m, from, &out[0].1);
    }
    for (i, q) in [&mut r1, &mut r2].into_iter().enumerate() {
        let c = completions(q);
        assert_eq!(c.len(), 1, "receiver {i}");
        assert_eq!(c[0].1.status, WcStatus::Success);
        assert_eq!(c[0].1.src_qp, 0x11);
        assert_eq!(c[0].1.byte_len, 40 + 12);
        let off = RECV_BASE + i as u64 * 1024;
        assert_eq!(m.get(RECV_KEY, off + 40, 12), b"to the group");
        // The GRH area's destination (IPv4 header bytes 16..20 at offset 20) is the group.
        assert_eq!(m.get(RECV_KEY, off + 20 + 16, 4), [239, 1, 2, 3]);
    }
    assert!(completions(&mut wrong).is_empty());
    assert_eq!(wrong.counters().dropped_bad_qkey, 1);
    assert!(
        completions(&mut gsi).is_empty(),
        "QP1 never takes multicast"
    );
    assert_eq!(gsi.counters().dropped_wrong_state, 1);
}
