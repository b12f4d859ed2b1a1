//! One QP of each transport driven by a fuzz input (see the crate documentation).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

use uroce_proto::engine::{Arrival, Engine};
use uroce_proto::qp_state::{QpState, QpType};
use uroce_proto::rc::{CqKind, Env, RcConfig, RcQp, RtsAttrs};
use uroce_proto::time::Instant;
use uroce_proto::uc::{UcConfig, UcQp};
use uroce_proto::ud::{UdConfig, UdQp};
use uroce_proto::wr::{RecvWr, SendFlags, SendOpcode, SendWr, UdDest};
use uroce_sim::{Access, RegionHandle, SimXrc, TestMemory};
use uroce_wire::{PacketRepr, Pmtu, Psn};

use crate::input::Input;

const QPN: u32 = 0x12;
const PEER_QPN: u32 = 0x34;
const SQ_PSN: u32 = 0x00ff_ff00;
const RQ_PSN: u32 = 7;
const QKEY: u32 = 0x1111_2222;
const SRQN: u32 = 5;
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 99));
/// The engines write packets into a buffer of this size (what the interface asks for).
const BUF: usize = 4096 + 64;

/// The QP under test, its memory and XRC domain, and what the invariants need.
struct World {
    qp: Box<dyn Engine>,
    mem: TestMemory,
    rw: RegionHandle,
    ro: RegionHandle,
    ro_before: Vec<u8>,
    xrc: SimXrc,
    posted_send: HashSet<u64>,
    posted_recv: HashSet<u64>,
    completed: HashSet<(bool, u64)>,
    next_wr: u64,
    now: Instant,
    transmitted: usize,
}

impl World {
    fn new(qp: Box<dyn Engine>) -> World {
        let mem = TestMemory::new();
        let rw = mem.register(1 << 16, Access::ALL);
        let ro = mem.register(4096, Access::REMOTE_READ);
        // Distinct bytes, so that any write shows.
        let ro_before: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let _ = mem.write(&ro, 0, &ro_before);
        let mut xrc = SimXrc::default();
        xrc.target_domain = 1;
        xrc.add_srq(SRQN, 1);
        xrc.add_srq(SRQN + 1, 2);
        World {
            qp,
            mem,
            rw,
            ro,
            ro_before,
            xrc,
            posted_send: HashSet::new(),
            posted_recv: HashSet::new(),
            completed: HashSet::new(),
            next_wr: 0,
            now: Instant::ZERO,
            transmitted: 0,
        }
    }

    fn xrc_recv(&self) -> bool {
        self.qp.qp_type() == QpType::XrcRecv
    }

    /// Runs `f` on the QP with its environment.
    fn with<R>(&mut self, f: impl FnOnce(&mut dyn Engine, &mut Env<'_>, Instant) -> R) -> R {
        let xrc = self.xrc_recv();
        let mut env = Env::new(&self.mem);
        if xrc {
            env.xrc = Some(&mut self.xrc);
        }
        f(self.qp.as_mut(), &mut env, self.now)
    }

    /// Checks what the QP produced since the last call.
    fn drain(&mut self) {
        while let Some((kind, wc)) = self.qp.poll_completion() {
            let send = kind == CqKind::Send;
            let posted = if send {
                &self.posted_send
            } else {
                &self.posted_recv
            };
            assert!(
                posted.contains(&wc.wr_id),
                "completion of a WR never posted: {wc:?}"
            );
            assert!(
                self.completed.insert((send, wc.wr_id)),
                "WR completed twice: {wc:?}"
            );
        }
        while self.qp.poll_event().is_some() {}
        let c = self.qp.counters();
        assert!(c.dropped_packets <= c.packets_received, "{c:?}");
    }

    fn transmit(&mut self, n: u8) {
        let mut buf = vec![0u8; BUF];
        for _ in 0..n {
            let Some(t) = self.with(|qp, env, now| qp.poll_transmit(now, env, &mut buf)) else {
                break;
            };
            assert!(t.len <= BUF, "{t:?}");
            let p = PacketRepr::parse(&buf[..t.len]).expect("the engine emits packets that parse");
            assert_eq!(t.dst, PEER, "{p}");
            self.transmitted += 1;
        }
    }
}

fn rts(cfg_timeout: u8) -> RtsAttrs {
    RtsAttrs {
        sq_psn: Psn::new(SQ_PSN),
        timeout: cfg_timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
    }
}

fn rc_like(input: &mut Input<'_>, qp_type: QpType) -> Box<dyn Engine> {
    let mut cfg = RcConfig::new(QPN, PEER_QPN);
    cfg.qp_type = qp_type;
    cfg.pmtu = Pmtu::from_enum(1 + input.u8() % 5).unwrap_or(Pmtu::Mtu1024);
    cfg.sq_psn = Psn::new(SQ_PSN);
    cfg.rq_psn = Psn::new(RQ_PSN);
    cfg.timeout = input.u8() % 20;
    cfg.retry_cnt = input.u8() % 8;
    cfg.rnr_retry = input.u8() % 8;
    cfg.max_rd_atomic = input.u8() % 4;
    cfg.max_dest_rd_atomic = input.u8() % 4;
    cfg.peer = PEER;
    cfg.local = Some(LOCAL);
    Box::new(RcQp::new(cfg))
}

/// How far an input got: what the smoke test checks of the seeds (that they reach past
/// the first checks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached {
    /// Work completions taken.
    pub completions: usize,
    /// Packets the engine wrote.
    pub transmitted: usize,
    /// Packets it accepted (received and not dropped).
    pub accepted: u64,
}

/// Drives the QP `qp` with the rest of `input` (see the crate documentation).
pub fn drive(qp: Box<dyn Engine>, mut input: Input<'_>) -> Reached {
    let mut w = World::new(qp);
    let ud = matches!(w.qp.qp_type(), QpType::Ud | QpType::Gsi);
    // Bounded: every command consumes at least one byte.
    while !input.is_empty() {
        match input.u8() % 9 {
            0..=2 => {
                let patch = input.u8();
                let len = usize::from(input.u16() % 4400);
                let mut pkt = input.bytes(len).to_vec();
                if pkt.len() >= 12 {
                    if patch & 1 != 0 {
                        let qpn = w.qp.qpn();
                        pkt[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
                    }
                    if patch & 2 != 0 {
                        let base = if patch & 4 != 0 { SQ_PSN } else { RQ_PSN };
                        let psn = base.wrapping_add(u32::from((patch >> 4) & 7)) & 0x00ff_ffff;
                        pkt[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
                    }
                    if patch & 8 != 0 && pkt.len() >= 16 {
                        // The DETH Q_Key (UD) or the XRCETH SRQ number (XRC).
                        let v = match w.qp.qp_type() {
                            QpType::Gsi => uroce_proto::ud::GSI_QKEY,
                            QpType::Ud => QKEY,
                            _ => SRQN,
                        };
                        pkt[12..16].copy_from_slice(&v.to_be_bytes());
                    }
                }
                let from = if patch & 0x80 != 0 && !ud {
                    STRANGER
                } else {
                    PEER
                };
                if let Ok(p) = PacketRepr::parse(&pkt) {
                    let arrival = Arrival::new(from, LOCAL);
                    w.with(|qp, env, now| qp.handle_packet(now, &arrival, &p, env));
                }
            }
            3 => {
                let d = u64::from(input.u32());
                w.now = Instant::from_nanos(w.now.as_nanos().saturating_add(d));
                if w.qp.poll_timeout().is_some_and(|t| t <= w.now) {
                    w.with(|qp, env, now| qp.handle_timeout(now, env));
                }
            }
            4 => {
                let n = input.u8();
                w.transmit(n);
            }
            5 => {
                let op =
                    SendOpcode::from_u32(u32::from(input.u8() % 12)).unwrap_or(SendOpcode::Send);
                let len = u32::from(input.u16());
                let off = u64::from(input.u16());
                let sge = if input.u8() & 1 == 0 {
                    w.rw.sge(off, len)
                } else {
                    w.ro.sge(off % 4096, len)
                };
                let mut wr = SendWr::new(w.next_wr, op, vec![sge]);
                wr.remote_addr = w.rw.va(u64::from(input.u16()));
                wr.rkey = if input.u8() & 1 == 0 {
                    w.rw.rkey
                } else {
                    w.ro.rkey
                };
                wr.flags = SendFlags::from_bits_truncate(u32::from(input.u8()));
                wr.remote_srqn = SRQN;
                if ud {
                    wr.ud = Some(UdDest::new(PEER, PEER_QPN, QKEY));
                }
                if w.qp.post_send(wr).is_ok() {
                    w.posted_send.insert(w.next_wr);
                }
                w.next_wr += 1;
            }
            6 => {
                let len = u32::from(input.u16());
                let wr = RecvWr::new(w.next_wr, vec![w.rw.sge(0, len)]);
                if w.xrc_recv() {
                    if w.xrc.post(SRQN, wr) {
                        w.posted_recv.insert(w.next_wr);
                    }
                } else if w.qp.post_recv(wr).is_ok() {
                    w.posted_recv.insert(w.next_wr);
                }
                w.next_wr += 1;
            }
            7 => {
                let t = input.u8() % 20;
                w.qp.enter_rts(rts(t));
            }
            _ => {
                let s = QpState::ALL[usize::from(input.u8()) % QpState::ALL.len()];
                w.qp.set_state(s);
            }
        }
        w.drain();
    }
    w.transmit(u8::MAX);
    w.drain();
    let ro_after = w.mem.contents(&w.ro).unwrap_or_default();
    assert!(
        ro_after == w.ro_before,
        "a region registered for remote READ only was written"
    );
    let c = w.qp.counters();
    Reached {
        completions: w.completed.len(),
        transmitted: w.transmitted,
        accepted: c.packets_received - c.dropped_packets,
    }
}

/// An RC QP in RTS.
pub fn rc_engine(data: &[u8]) {
    let mut input = Input(data);
    let qp = rc_like(&mut input, QpType::Rc);
    drive(qp, input);
}

/// [`rc_engine`] and the others, with what the input reached.
pub fn reached(target: &str, data: &[u8]) -> Option<Reached> {
    let mut input = Input(data);
    let qp = match target {
        "rc_engine" => rc_like(&mut input, QpType::Rc),
        "xrc_send_engine" => rc_like(&mut input, QpType::XrcSend),
        "xrc_recv_engine" => rc_like(&mut input, QpType::XrcRecv),
        "uc_engine" => uc_qp(&mut input),
        "ud_engine" => datagram_qp(&mut input, false),
        "gsi_engine" => datagram_qp(&mut input, true),
        _ => return None,
    };
    Some(drive(qp, input))
}

/// An XRC initiator (XRC_SEND) in RTS.
pub fn xrc_send_engine(data: &[u8]) {
    let mut input = Input(data);
    let qp = rc_like(&mut input, QpType::XrcSend);
    drive(qp, input);
}

/// An XRC target (XRC_RECV) in RTS, its domain holding SRQ 5 (and SRQ 6 of another
/// domain).
pub fn xrc_recv_engine(data: &[u8]) {
    let mut input = Input(data);
    let qp = rc_like(&mut input, QpType::XrcRecv);
    drive(qp, input);
}

/// A UC QP in RTS.
pub fn uc_engine(data: &[u8]) {
    let mut input = Input(data);
    let qp = uc_qp(&mut input);
    drive(qp, input);
}

fn uc_qp(input: &mut Input<'_>) -> Box<dyn Engine> {
    let mut cfg = UcConfig::new(QPN, PEER_QPN, PEER);
    cfg.local = Some(LOCAL);
    cfg.pmtu = Pmtu::from_enum(1 + input.u8() % 5).unwrap_or(Pmtu::Mtu1024);
    cfg.sq_psn = Psn::new(SQ_PSN);
    cfg.rq_psn = Psn::new(RQ_PSN);
    Box::new(UcQp::new(cfg))
}

fn datagram_qp(input: &mut Input<'_>, gsi: bool) -> Box<dyn Engine> {
    let mut cfg = if gsi {
        UdConfig::gsi(LOCAL)
    } else {
        UdConfig::new(QPN, QKEY, LOCAL)
    };
    cfg.pmtu = Pmtu::from_enum(1 + input.u8() % 5).unwrap_or(Pmtu::Mtu1024);
    let mut qp = UdQp::new_rtr(cfg);
    qp.enter_rts(rts(0));
    Box::new(qp)
}

/// A UD QP in RTS.
pub fn ud_engine(data: &[u8]) {
    let mut input = Input(data);
    let qp = datagram_qp(&mut input, false);
    drive(qp, input);
}

/// The GSI QP (QP1) in RTS.
pub fn gsi_engine(data: &[u8]) {
    let mut input = Input(data);
    let qp = datagram_qp(&mut input, true);
    drive(qp, input);
}
