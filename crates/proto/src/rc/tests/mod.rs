//! Engine unit tests: two QPs joined by an in-memory "wire" (emit → `PacketRepr::parse`
//! → `handle_packet`), each over its own test memory, driven in virtual time.
//!
//! Every packet an engine emits is parsed back and checked against the PMTU segmentation
//! rules (`check_pmtu`) before delivery, so a malformed packet fails any test that sends it.
//! Expected data are computed from the test's own inputs, never read back from the engine.

mod atomic_write;
mod basic;
mod errors;
mod flush;
mod local_ops;
mod misc;
mod recovery;

use std::collections::VecDeque;

use uroce_wire::aeth::Syndrome;
use uroce_wire::{bth, PacketRepr, Pmtu, Psn};

use super::{CqKind, Env, QpEvent, RcConfig, RcQp, SharedRecvQueue};
pub(crate) use crate::engine::Engine;
use crate::memory::{Memory, Sge};
pub use crate::testing::{Access, PatternMemory, TestMemory, TestSrq};
use crate::time::Instant;
use crate::wr::{RecvWr, SendFlags, SendOpcode, SendWr, WorkCompletion};

/// Region access rights of the test memory, short for the tests.
pub const LOCAL_WRITE: Access = Access::LOCAL_WRITE;
pub const REMOTE_WRITE: Access = Access::REMOTE_WRITE;
pub const REMOTE_READ: Access = Access::REMOTE_READ;
pub const REMOTE_ATOMIC: Access = Access::REMOTE_ATOMIC;
pub const ALL: Access = Access::ALL;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// One emitted packet, as logged.
#[derive(Clone, Debug)]
pub struct Sent {
    pub from: Side,
    pub opcode: u8,
    pub psn: Psn,
    pub ack_req: bool,
    pub se: bool,
    pub len: usize,
    pub dropped: bool,
    pub text: String,
}

type Pred = Box<dyn Fn(&PacketRepr<'_>) -> bool>;

struct DropRule {
    from: Side,
    pred: Pred,
    remaining: usize,
    /// Deliver twice instead of dropping.
    duplicate: bool,
}

/// Two QPs, their memories and the wire between them.
pub struct Pair<M: Memory = TestMemory> {
    pub a: RcQp,
    pub b: RcQp,
    pub mem_a: M,
    pub mem_b: M,
    pub srq_a: Option<TestSrq>,
    pub srq_b: Option<TestSrq>,
    pub now: Instant,
    wire: VecDeque<(Side, Vec<u8>)>,
    held: VecDeque<(Side, Vec<u8>)>,
    /// Packets addressed to this side wait (are not delivered) until released.
    pub hold_to: Option<Side>,
    rules: Vec<DropRule>,
    pub log: Vec<Sent>,
    pub log_enabled: bool,
    /// Packets each side may emit per round.
    pub burst: usize,
    /// When non-zero, every `reorder_every`-th pair of packets delivered in a round swaps
    /// places.
    pub reorder_every: usize,
    buf: Vec<u8>,
}

pub const QPN_A: u32 = 0x11;
pub const QPN_B: u32 = 0x22;

/// A's and B's configs: PMTU 256, timeout 10 (≈ 4.2 ms), everything else default.
pub fn configs() -> (RcConfig, RcConfig) {
    let mut a = RcConfig::new(QPN_A, QPN_B);
    let mut b = RcConfig::new(QPN_B, QPN_A);
    for c in [&mut a, &mut b] {
        c.pmtu = Pmtu::Mtu256;
        c.timeout = 10;
    }
    (a, b)
}

impl Pair<TestMemory> {
    pub fn new() -> Pair<TestMemory> {
        let (a, b) = configs();
        Pair::with(a, b, TestMemory::new(), TestMemory::new())
    }

    pub fn with_configs(a: RcConfig, b: RcConfig) -> Pair<TestMemory> {
        Pair::with(a, b, TestMemory::new(), TestMemory::new())
    }
}

impl<M: Memory> Pair<M> {
    pub fn with(a: RcConfig, b: RcConfig, mem_a: M, mem_b: M) -> Pair<M> {
        Pair {
            a: RcQp::new(a),
            b: RcQp::new(b),
            mem_a,
            mem_b,
            srq_a: None,
            srq_b: None,
            now: Instant::ZERO,
            wire: VecDeque::new(),
            held: VecDeque::new(),
            hold_to: None,
            rules: Vec::new(),
            log: Vec::new(),
            log_enabled: true,
            burst: 64,
            reorder_every: 0,
            buf: vec![0; 4096 + 64],
        }
    }

    /// Drops up to `count` packets from `from` matching `pred`.
    pub fn drop_packets(
        &mut self,
        from: Side,
        count: usize,
        pred: impl Fn(&PacketRepr<'_>) -> bool + 'static,
    ) {
        self.rules.push(DropRule {
            from,
            pred: Box::new(pred),
            remaining: count,
            duplicate: false,
        });
    }

    /// Delivers up to `count` packets from `from` matching `pred` twice.
    pub fn dup_packets(
        &mut self,
        from: Side,
        count: usize,
        pred: impl Fn(&PacketRepr<'_>) -> bool + 'static,
    ) {
        self.rules.push(DropRule {
            from,
            pred: Box::new(pred),
            remaining: count,
            duplicate: true,
        });
    }

    pub fn qp(&mut self, side: Side) -> &mut RcQp {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Runs `f` with the QP of `side` and its environment.
    pub fn with_env<R>(&mut self, side: Side, f: impl FnOnce(&mut RcQp, &mut Env<'_>) -> R) -> R {
        let (qp, mem, srq) = match side {
            Side::A => (&mut self.a, &self.mem_a as &dyn Memory, self.srq_a.as_mut()),
            Side::B => (&mut self.b, &self.mem_b as &dyn Memory, self.srq_b.as_mut()),
        };
        let mut env = Env {
            mem,
            srq: srq.map(|s| s as &mut dyn SharedRecvQueue),
            xrc: None,
        };
        f(qp, &mut env)
    }

    fn emit(&mut self, from: Side, n: usize) {
        let bytes = self.buf[..n].to_vec();
        let pkt = PacketRepr::parse(&bytes).expect("the engine emitted an unparsable packet");
        assert_eq!(pkt.buffer_len(), n, "emitted length matches the packet");
        assert_eq!(
            &bytes[n - 4..],
            &[0, 0, 0, 0],
            "ICRC left zero for the I/O layer"
        );
        let mut dropped = false;
        let mut copies = 1;
        for r in &mut self.rules {
            if r.from == from && r.remaining > 0 && (r.pred)(&pkt) {
                r.remaining -= 1;
                if r.duplicate {
                    copies = 2;
                } else {
                    dropped = true;
                }
                break;
            }
        }
        if self.log_enabled {
            self.log.push(Sent {
                from,
                opcode: pkt.bth.opcode,
                psn: pkt.bth.psn,
                ack_req: pkt.bth.ack_req,
                se: pkt.bth.solicited,
                len: pkt.payload.len(),
                dropped,
                text: pkt.to_string(),
            });
        }
        if !dropped {
            let to = from.other();
            for _ in 0..copies {
                if self.hold_to == Some(to) {
                    self.held.push_back((to, bytes.clone()));
                } else {
                    self.wire.push_back((to, bytes.clone()));
                }
            }
        }
    }

    fn deliver(&mut self, to: Side, bytes: &[u8]) {
        let pkt = PacketRepr::parse(bytes).expect("parse");
        let pmtu = self.qp(to).config().pmtu;
        pkt.check_pmtu(pmtu)
            .expect("segmentation follows the PMTU rules");
        let now = self.now;
        self.with_env(to, |qp, env| qp.receive(now, &pkt, env));
    }

    /// Lets held packets go.
    pub fn release(&mut self) {
        self.hold_to = None;
        self.wire.extend(self.held.drain(..));
    }

    /// One round: both sides transmit (up to `burst` packets each), then everything on
    /// the wire is delivered. Returns whether anything moved.
    pub fn round(&mut self) -> bool {
        let mut any = false;
        let now = self.now;
        for side in [Side::A, Side::B] {
            for _ in 0..self.burst {
                let mut buf = std::mem::take(&mut self.buf);
                let n = self.with_env(side, |qp, env| qp.emit(now, env, &mut buf));
                self.buf = buf;
                match n {
                    Some(n) => {
                        any = true;
                        self.emit(side, n);
                    }
                    None => break,
                }
            }
        }
        let mut batch: Vec<_> = self.wire.drain(..).collect();
        if self.reorder_every > 0 {
            let mut i = 0;
            while i + 1 < batch.len() {
                batch.swap(i, i + 1);
                i += 2 * self.reorder_every;
            }
        }
        for (to, bytes) in batch {
            any = true;
            self.deliver(to, &bytes);
        }
        any
    }

    /// Advances virtual time to the earliest timer and fires the due ones; false if no
    /// timer runs.
    pub fn fire_timers(&mut self) -> bool {
        let next = match (self.a.poll_timeout(), self.b.poll_timeout()) {
            (Some(x), Some(y)) => x.min(y),
            (x, y) => match x.or(y) {
                Some(t) => t,
                None => return false,
            },
        };
        self.now = self.now.max(next);
        let now = self.now;
        for side in [Side::A, Side::B] {
            if self.qp(side).poll_timeout().is_some_and(|t| t <= now) {
                self.with_env(side, |qp, env| qp.handle_timeout(now, env));
            }
        }
        true
    }

    /// [`Pair::fire_timers`] for a process that was not scheduled: the earliest timer is
    /// handled `lateness` after its deadline (with every other timer then due).
    pub fn fire_timers_late(&mut self, lateness: std::time::Duration) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(next) = next else {
            return false;
        };
        self.now = self.now.max(next + lateness);
        let now = self.now;
        for side in [Side::A, Side::B] {
            if self.qp(side).poll_timeout().is_some_and(|t| t <= now) {
                self.with_env(side, |qp, env| qp.handle_timeout(now, env));
            }
        }
        true
    }

    /// Runs until nothing moves and no timer runs.
    pub fn run(&mut self) {
        self.run_until(|_| false);
    }

    /// Runs until `pred` holds (checked after every round and timer) or nothing is left.
    /// Returns whether `pred` held.
    pub fn run_until(&mut self, pred: impl Fn(&Self) -> bool) -> bool {
        for _ in 0..5_000_000 {
            if pred(self) {
                return true;
            }
            if self.round() {
                continue;
            }
            if !self.fire_timers() {
                return pred(self);
            }
        }
        panic!("simulation did not settle");
    }

    pub fn completions(&mut self, side: Side) -> Vec<(CqKind, WorkCompletion)> {
        std::iter::from_fn(|| self.qp(side).poll_completion()).collect()
    }

    pub fn events(&mut self, side: Side) -> Vec<QpEvent> {
        std::iter::from_fn(|| self.qp(side).poll_event()).collect()
    }

    /// Logged packets from `from` (not dropped ones excluded).
    pub fn sent(&self, from: Side) -> Vec<&Sent> {
        self.log.iter().filter(|s| s.from == from).collect()
    }
}

pub fn sge(addr: u64, length: u32, lkey: u32) -> Sge {
    Sge { addr, length, lkey }
}

pub fn wr(wr_id: u64, opcode: SendOpcode, sges: Vec<Sge>) -> SendWr {
    let mut w = SendWr::new(wr_id, opcode, sges);
    w.flags = SendFlags::SIGNALED;
    w
}

pub fn rdma(wr_id: u64, opcode: SendOpcode, sges: Vec<Sge>, remote_addr: u64, rkey: u32) -> SendWr {
    let mut w = wr(wr_id, opcode, sges);
    w.remote_addr = remote_addr;
    w.rkey = rkey;
    w
}

pub fn recv(wr_id: u64, sg_list: Vec<Sge>) -> RecvWr {
    RecvWr::new(wr_id, sg_list)
}

/// Deterministic bytes (an LCG), independent of the engine.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) as u8
        })
        .collect()
}

/// An RC FLUSH (opcode 0x1C, IBA 1.5) to `dest_qp` laid out byte by byte as a peer sends
/// it (roce-spec §1.3, §1.5): BTH with AckReq, FETH (selectivity level 0 = the range,
/// placement type 1 = global visibility), RETH (VA 0x1000, R_Key 1, 64 bytes), no
/// payload, 4 ICRC bytes (left zero: the I/O layer checks them, not the engine).
pub fn flush_bytes(dest_qp: u32, psn: u32) -> Vec<u8> {
    let mut b = vec![0x1C, 0x00, 0xff, 0xff];
    b.extend_from_slice(&dest_qp.to_be_bytes()); // reserved byte 4 (0) + DestQP
    b.extend_from_slice(&(0x8000_0000 | psn).to_be_bytes()); // AckReq + PSN
    b.extend_from_slice(&[0, 0, 0, 0x01]); // FETH
    b.extend_from_slice(&0x1000u64.to_be_bytes()); // RETH VA
    b.extend_from_slice(&1u32.to_be_bytes()); // R_Key
    b.extend_from_slice(&64u32.to_be_bytes()); // DMA length
    b.extend_from_slice(&[0; 4]); // ICRC
    b
}

/// A BTH to `dest_qp` with `opcode` and `psn` (P_Key 0xFFFF, AckReq set), for packets the
/// tests build by hand.
pub fn bth_to(dest_qp: u32, opcode: u8, psn: u32) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: true,
        psn: Psn::new(psn),
    }
}

/// [`bth_to`] B's QP.
pub fn bth_to_b(opcode: u8, psn: u32) -> bth::Repr {
    bth_to(QPN_B, opcode, psn)
}

/// One packet a side transmitted, as [`Pair::drain`] reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emitted {
    pub opcode: u8,
    pub psn: Psn,
    pub syndrome: Option<Syndrome>,
    pub msn: Option<u32>,
    pub payload_len: usize,
}

impl<M: Memory> Pair<M> {
    /// Everything `side` transmits now (bounded), parsed, without delivering it.
    pub fn drain(&mut self, side: Side) -> Vec<Emitted> {
        let now = self.now;
        let mut buf = vec![0u8; 4096 + 64];
        let mut out = Vec::new();
        for _ in 0..1024 {
            let Some(n) = self.with_env(side, |qp, env| qp.emit(now, env, &mut buf)) else {
                break;
            };
            let r = PacketRepr::parse(&buf[..n]).expect("engine output parses");
            out.push(Emitted {
                opcode: r.bth.opcode,
                psn: r.bth.psn,
                syndrome: r.aeth.map(|a| a.syndrome),
                msn: r.aeth.map(|a| a.msn),
                payload_len: r.payload.len(),
            });
        }
        out
    }
}
