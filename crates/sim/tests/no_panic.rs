//! No packet makes the RC engine panic.
//!
//! Property tests drive one `RcQp` directly with random sequences of: well-formed packets
//! with random fields (every opcode of the table, PSNs around and far from the expected
//! ones, valid and invalid keys, addresses and lengths, random AETH syndromes), byte
//! strings (a real BTH in front of random bytes, or nothing but random bytes) through
//! `PacketRepr::parse`, time passing with `handle_timeout`, `poll_transmit`, work
//! requests, and state changes (ERR with its flush, RESET and back, SQD). Besides not
//! panicking the engine must keep a few promises whatever the input: every packet it
//! emits parses, is addressed to the peer QP and fits the buffer; no WR completes twice;
//! completions name WRs that were posted.

use std::collections::HashSet;

use proptest::prelude::*;
use uroce_proto::engine::{Arrival, Engine, Transmit};
use uroce_proto::qp_state::QpState;
use uroce_proto::rc::{CqKind, Env, RcConfig, RcQp};
use uroce_proto::time::Instant;
use uroce_proto::wr::{RecvWr, SendFlags, SendOpcode, SendWr};
use uroce_sim::net::TRANSMIT_BUF_LEN;
use uroce_sim::{Access, RegionHandle, TestMemory};
use uroce_wire::opcode::{HeaderSet, OPCODE_TABLE};
use uroce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, xrceth, PacketRepr, Pmtu, Psn,
};

const QPN: u32 = 0x33;
const PEER: u32 = 0x44;
const SQ_PSN: u32 = 0x00FF_FFF0; // near the wrap
const RQ_PSN: u32 = 100;

/// Random header fields; the opcode decides which of them are used.
#[derive(Debug, Clone)]
struct PacketSpec {
    opcode: u8,
    psn_near: u8,
    psn_delta: i32,
    dest_qp: Option<u32>,
    pkey: u16,
    flags: u8,
    payload_len: usize,
    region: usize,
    va_offset: i64,
    use_valid_rkey: bool,
    rkey: u32,
    dma_len: u32,
    syndrome: u8,
    msn: u32,
    swap_add: u64,
    compare: u64,
    imm: u32,
}

#[derive(Debug, Clone)]
enum Action {
    Packet(PacketSpec),
    /// A real BTH (opcode, PSN) in front of random bytes.
    BthAndBytes(u8, u8, Vec<u8>),
    Bytes(Vec<u8>),
    Advance(u64),
    Transmit(u8),
    PostSend(u8, u32, usize, i64, bool),
    PostRecv(u32),
    SetState(QpState),
}

fn opcode() -> impl Strategy<Value = u8> {
    let rc: Vec<u8> = OPCODE_TABLE
        .iter()
        .map(|i| i.opcode)
        .filter(|o| *o < 0x20)
        .collect();
    let known: Vec<u8> = OPCODE_TABLE.iter().map(|i| i.opcode).collect();
    prop_oneof![
        12 => proptest::sample::select(rc),
        3 => proptest::sample::select(known),
        1 => any::<u8>(),
    ]
}

fn packet_spec() -> impl Strategy<Value = PacketSpec> {
    (
        (
            opcode(),
            0u8..3,
            prop_oneof![6 => Just(0i32), 2 => -3i32..=3, 1 => -4i32..200],
            prop_oneof![19 => Just(None), 1 => any::<u32>().prop_map(Some)],
        ),
        (
            prop_oneof![19 => Just(0xFFFFu16), 1 => any::<u16>()],
            any::<u8>(),
            prop_oneof![4 => 0usize..64, 2 => 0usize..5000],
        ),
        (
            0usize..3,
            prop_oneof![4 => (0i64..8).prop_map(|w| w * 8), 2 => 0i64..64, 1 => -8192i64..8192],
            proptest::bool::weighted(0.85),
            any::<u32>(),
        ),
        (
            prop_oneof![4 => 0u32..64, 2 => 0u32..4096, 1 => any::<u32>()],
            any::<u8>(),
            any::<u32>(),
        ),
        (any::<u64>(), any::<u64>(), any::<u32>()),
    )
        .prop_map(
            |(
                (opcode, psn_near, psn_delta, dest_qp),
                (pkey, flags, payload_len),
                (region, va_offset, use_valid_rkey, rkey),
                (dma_len, syndrome, msn),
                (swap_add, compare, imm),
            )| PacketSpec {
                opcode,
                psn_near,
                psn_delta,
                dest_qp,
                pkey,
                flags,
                payload_len,
                region,
                va_offset,
                use_valid_rkey,
                rkey,
                dma_len,
                syndrome,
                msn,
                swap_add,
                compare,
                imm,
            },
        )
}

fn state() -> impl Strategy<Value = QpState> {
    proptest::sample::select(QpState::ALL.to_vec())
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        10 => packet_spec().prop_map(Action::Packet),
        2 => (opcode(), 0u8..3, proptest::collection::vec(any::<u8>(), 0..80))
            .prop_map(|(o, p, b)| Action::BthAndBytes(o, p, b)),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Action::Bytes),
        3 => prop_oneof![0u64..100_000, 0u64..2_000_000_000].prop_map(Action::Advance),
        4 => (1u8..40).prop_map(Action::Transmit),
        3 => (0u8..10, 0u32..9000, 0usize..3, -16i64..16, any::<bool>())
            .prop_map(|(o, l, r, off, s)| Action::PostSend(o, l, r, off, s)),
        2 => (0u32..9000).prop_map(Action::PostRecv),
        1 => state().prop_map(Action::SetState),
    ]
}

/// Like [`action`] without state changes (the QP stays in RTS unless the input itself
/// moves it to ERR).
fn rts_action() -> impl Strategy<Value = Action> {
    action().prop_filter("no state change", |a| !matches!(a, Action::SetState(_)))
}

struct Rig {
    qp: RcQp,
    mem: TestMemory,
    regions: Vec<RegionHandle>,
    now: Instant,
    buf: Vec<u8>,
    next_wr: u64,
    posted: HashSet<u64>,
    completed: HashSet<(bool, u64)>,
    /// The PSN the rig's next in-order request uses (a guess of the engine's ePSN).
    req_psn: u32,
    /// PSNs of requests the engine sent recently (responses aim at them).
    sent_psns: Vec<u32>,
}

impl Rig {
    fn new(pmtu: Pmtu, timeout: u8) -> Rig {
        let mut cfg = RcConfig::new(QPN, PEER);
        cfg.pmtu = pmtu;
        cfg.sq_psn = Psn::new(SQ_PSN);
        cfg.rq_psn = Psn::new(RQ_PSN);
        cfg.timeout = timeout;
        cfg.min_rnr_timer = 1;
        let mem = TestMemory::new();
        let regions = vec![
            mem.register(8192, Access::ALL),
            mem.register(64, Access::LOCAL_WRITE | Access::REMOTE_READ),
            mem.register(16, Access::REMOTE_ATOMIC | Access::LOCAL_WRITE),
        ];
        Rig {
            qp: RcQp::new(cfg),
            mem,
            regions,
            now: Instant::ZERO,
            buf: vec![0; TRANSMIT_BUF_LEN],
            next_wr: 0,
            posted: HashSet::new(),
            completed: HashSet::new(),
            req_psn: RQ_PSN,
            sent_psns: vec![SQ_PSN],
        }
    }

    fn packet(&mut self, s: &PacketSpec) {
        let base = match s.psn_near {
            0 => self.req_psn,
            1 => self.sent_psns[s.msn as usize % self.sent_psns.len()],
            _ => s.msn,
        };
        let psn = Psn::new(base.wrapping_add_signed(s.psn_delta));
        let is_request = uroce_wire::opcode::info(s.opcode).is_some_and(|i| i.is_request);
        if s.psn_near == 0 && s.psn_delta == 0 && is_request {
            self.req_psn = self.req_psn.wrapping_add(1) & 0xFF_FFFF;
        }
        let region = &self.regions[s.region % self.regions.len()];
        let va = region.addr.wrapping_add_signed(s.va_offset);
        let rkey = if s.use_valid_rkey {
            region.rkey
        } else {
            s.rkey
        };
        let payload = vec![0x5Au8; s.payload_len];
        let headers = uroce_wire::opcode::info(s.opcode).map_or(HeaderSet::empty(), |i| i.headers);
        let allows_payload = uroce_wire::opcode::info(s.opcode).is_some_and(|i| i.payload);
        let exact = uroce_wire::opcode::info(s.opcode).and_then(|i| i.exact_payload);
        let payload_len = match exact {
            Some(n) => n,
            None if allows_payload => s.payload_len,
            None => 0,
        };
        let syndrome =
            aeth::Syndrome::from_byte(s.syndrome & 0x7F).unwrap_or(aeth::Syndrome::ACK_NO_CREDIT);
        let repr = PacketRepr {
            xrceth: headers.contains(HeaderSet::XRCETH).then_some(xrceth::Repr {
                srqn: s.msn & 0xFF_FFFF,
            }),
            deth: headers.contains(HeaderSet::DETH).then_some(deth::Repr {
                qkey: s.rkey,
                src_qp: s.msn & 0xFF_FFFF,
            }),
            reth: headers.contains(HeaderSet::RETH).then_some(reth::Repr {
                va,
                rkey,
                dma_len: s.dma_len,
            }),
            aeth: headers.contains(HeaderSet::AETH).then_some(aeth::Repr {
                syndrome,
                msn: s.msn & 0xFF_FFFF,
            }),
            atomic_eth: headers
                .contains(HeaderSet::ATOMIC_ETH)
                .then_some(atomic_eth::Repr {
                    va,
                    rkey,
                    swap_add: s.swap_add,
                    compare: s.compare,
                }),
            atomic_ack_eth: headers
                .contains(HeaderSet::ATOMIC_ACK_ETH)
                .then_some(atomic_ack_eth::Repr { orig: s.swap_add }),
            immdt: headers
                .contains(HeaderSet::IMMDT)
                .then_some(immdt::Repr { imm: s.imm }),
            ieth: headers
                .contains(HeaderSet::IETH)
                .then_some(ieth::Repr { rkey }),
            ..PacketRepr::new(
                bth::Repr {
                    opcode: s.opcode,
                    solicited: s.flags & 1 != 0,
                    mig_req: s.flags & 2 != 0,
                    pad_cnt: 0,
                    pkey: s.pkey,
                    fecn: s.flags & 4 != 0,
                    becn: s.flags & 8 != 0,
                    dest_qp: s.dest_qp.unwrap_or(QPN) & 0xFF_FFFF,
                    ack_req: s.flags & 16 != 0,
                    psn,
                },
                &payload[..payload_len.min(payload.len())],
            )
        };
        let mut wire = vec![0u8; repr.buffer_len()];
        if let Ok(n) = repr.emit(&mut wire) {
            self.bytes(&wire[..n]);
        }
    }

    /// Parse, and if that succeeds, hand to the engine (the I/O layer's path).
    fn bytes(&mut self, b: &[u8]) {
        if let Ok(p) = PacketRepr::parse(b) {
            let mut env = Env::new(&self.mem);
            // From the QP's peer: the engine's own address check is not what this fuzzes.
            let peer = self.qp.config().peer;
            let from = Arrival::new(peer, peer);
            self.qp.handle_packet(self.now, &from, &p, &mut env);
        }
        self.drain();
    }

    fn drain(&mut self) {
        for _ in 0..10_000 {
            let Some((kind, wc)) = self.qp.poll_completion() else {
                break;
            };
            let send = kind == CqKind::Send;
            assert!(
                !send || self.posted.contains(&wc.wr_id),
                "completion for a WR never posted: {wc:?}"
            );
            assert!(
                self.completed.insert((send, wc.wr_id)),
                "WR completed twice: {kind:?} {wc:?}"
            );
        }
        for _ in 0..10_000 {
            if self.qp.poll_event().is_none() {
                break;
            }
        }
    }

    fn transmit(&mut self, n: u8) {
        for _ in 0..n {
            let mut env = Env::new(&self.mem);
            let Some(Transmit { len, .. }) =
                self.qp.poll_transmit(self.now, &mut env, &mut self.buf)
            else {
                break;
            };
            assert!(
                len <= self.buf.len(),
                "{len} bytes reported in a {}-byte buffer",
                self.buf.len()
            );
            let p = PacketRepr::parse(&self.buf[..len])
                .unwrap_or_else(|e| panic!("the engine emitted an unparseable packet: {e}"));
            assert_eq!(p.bth.dest_qp, PEER, "{p}");
            assert!(p.bth.opcode < 0x20, "not an RC opcode: {p}");
            if uroce_wire::opcode::info(p.bth.opcode).is_some_and(|i| i.is_request) {
                if self.sent_psns.len() >= 16 {
                    self.sent_psns.remove(0);
                }
                self.sent_psns.push(p.bth.psn.value());
            }
        }
        self.drain();
    }

    fn advance(&mut self, d: u64) {
        self.now = Instant::from_nanos(self.now.as_nanos().saturating_add(d));
        if self.qp.poll_timeout().is_some_and(|t| t <= self.now) {
            let mut env = Env::new(&self.mem);
            self.qp.handle_timeout(self.now, &mut env);
        }
        self.drain();
    }

    fn post_send(&mut self, op: u8, len: u32, region: usize, off: i64, signaled: bool) {
        let Some(opcode) = SendOpcode::from_u32(u32::from(op)) else {
            return;
        };
        let r = self.regions[region % self.regions.len()];
        let len = if opcode.is_atomic() { 8 } else { len };
        let mut wr = SendWr::new(self.next_wr, opcode, vec![r.sge(0, len)]);
        wr.remote_addr = r.addr.wrapping_add_signed(off);
        wr.rkey = r.rkey;
        wr.invalidate_rkey = r.rkey;
        if signaled {
            wr.flags = SendFlags::SIGNALED;
        }
        if self.qp.post_send(wr).is_ok() {
            self.posted.insert(self.next_wr);
        }
        self.next_wr += 1;
        self.drain();
    }

    fn post_recv(&mut self, len: u32) {
        let r = self.regions[0];
        let _ = self
            .qp
            .post_recv(RecvWr::new(self.next_wr, vec![r.sge(0, len)]));
        self.next_wr += 1;
        self.drain();
    }

    fn run(&mut self, actions: &[Action]) {
        for a in actions {
            match a {
                Action::Packet(s) => self.packet(s),
                Action::BthAndBytes(op, near, tail) => {
                    let psn = if *near == 0 { RQ_PSN } else { SQ_PSN };
                    let mut b = vec![
                        *op,
                        0,
                        0xFF,
                        0xFF,
                        0,
                        0,
                        0,
                        QPN as u8,
                        0x80,
                        (psn >> 16) as u8,
                        (psn >> 8) as u8,
                        psn as u8,
                    ];
                    b.extend_from_slice(tail);
                    // Whole words, as parse wants, most of the time.
                    if tail.len() % 5 != 0 {
                        b.truncate(b.len() / 4 * 4);
                    }
                    self.bytes(&b);
                }
                Action::Bytes(b) => self.bytes(b),
                Action::Advance(d) => self.advance(*d),
                Action::Transmit(n) => self.transmit(*n),
                Action::PostSend(o, l, r, off, s) => self.post_send(*o, *l, *r, *off, *s),
                Action::PostRecv(l) => self.post_recv(*l),
                Action::SetState(s) => {
                    self.qp.set_state(*s);
                    self.drain();
                }
            }
        }
        // Finally let it run out: transmit and fire timers for a while.
        for _ in 0..50 {
            self.transmit(200);
            let Some(t) = self.qp.poll_timeout() else {
                break;
            };
            self.advance(t.as_nanos().saturating_sub(self.now.as_nanos()));
        }
    }
}

fn pmtu() -> impl Strategy<Value = Pmtu> {
    proptest::sample::select(Pmtu::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Random packets and commands on an RTS QP.
    #[test]
    fn arbitrary_input_never_panics(
        pmtu in pmtu(),
        timeout in 0u8..20,
        actions in proptest::collection::vec(prop_oneof![9 => rts_action(), 1 => action()], 1..100),
    ) {
        let mut rig = Rig::new(pmtu, timeout);
        rig.run(&actions);
    }

    /// The same after the QP was driven into ERR (and its queues flushed) or reset and
    /// brought back, with work outstanding.
    #[test]
    fn arbitrary_input_in_other_states_never_panics(
        first in state(),
        second in state(),
        actions in proptest::collection::vec(action(), 1..40),
    ) {
        let mut rig = Rig::new(Pmtu::Mtu1024, 10);
        rig.post_recv(4096);
        rig.post_send(2, 3000, 0, 0, true);
        rig.post_send(4, 100, 1, 0, false);
        rig.transmit(2);
        rig.qp.set_state(first);
        rig.drain();
        rig.qp.set_state(second);
        rig.drain();
        rig.run(&actions);
    }
}

/// A stream of in-window requests with every opcode, none of them sensible, reaches the
/// deep paths (not only the PSN check): run it through the same rig once, exhaustively.
#[test]
fn every_opcode_at_the_expected_psn() {
    let mut totals = uroce_proto::rc::RcCounters::default();
    let mut completions = 0;
    for info in OPCODE_TABLE {
        for len in [0usize, 1, 8, 1024, 1025, 4096] {
            let mut rig = Rig::new(Pmtu::Mtu1024, 10);
            rig.post_recv(8192);
            rig.post_send(2, 5000, 0, 0, true);
            rig.transmit(3);
            for near in 0u8..2 {
                let spec = PacketSpec {
                    opcode: info.opcode,
                    psn_near: near,
                    psn_delta: 0,
                    dest_qp: None,
                    pkey: 0xFFFF,
                    flags: 16,
                    payload_len: len,
                    region: 0,
                    va_offset: 0,
                    use_valid_rkey: true,
                    rkey: 0,
                    dma_len: len as u32,
                    syndrome: 0x1F,
                    msn: 0,
                    swap_add: 1,
                    compare: 0,
                    imm: 7,
                };
                rig.packet(&spec);
                rig.transmit(50);
            }
            rig.run(&[]);
            let c = rig.qp.counters();
            totals.packets_received += c.packets_received;
            totals.acks_sent += c.acks_sent;
            totals.read_responses_sent += c.read_responses_sent;
            totals.atomic_acks_sent += c.atomic_acks_sent;
            totals.error_naks_sent += c.error_naks_sent;
            totals.acks_received += c.acks_received;
            completions += rig.completed.len();
        }
    }
    // The generator reaches past the PSN and opcode checks: requests were executed and
    // answered, responses were accepted, errors were NAKed.
    assert!(totals.packets_received > 100, "{totals:?}");
    for (what, n) in [
        ("ACKs sent", totals.acks_sent),
        ("READ responses sent", totals.read_responses_sent),
        ("atomic ACKs sent", totals.atomic_acks_sent),
        ("error NAKs sent", totals.error_naks_sent),
        ("ACKs received", totals.acks_received),
    ] {
        assert!(n > 0, "no {what}: {totals:?}");
    }
    assert!(completions > 0);
}
