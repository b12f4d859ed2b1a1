//! Issue check: "With UROCE_FAULTS drop 5 %, dup and reorder on both sides, a verified
//! transfer of ≥ 64 MiB in mixed operations completes correctly."
//!
//! Two network devices on loopback (127.0.4.1 and 127.0.4.2), each injecting faults into
//! what it sends (`drop=0.05,dup=0.01,reorder=0.02`, a different seed per side, parsed
//! by the parser `UROCE_FAULTS` goes through; a `UROCE_FAULTS` in the environment
//! replaces that configuration), one RC QP pair at PMTU 4096 with a ~67 ms local ACK
//! timeout and 7 retries. Both sides are requesters at once: each runs a seeded random
//! mix of SEND, SEND with immediate, RDMA WRITE, WRITE with immediate, RDMA READ,
//! fetch-and-add and compare-and-swap of 1 B to 1 MiB, up to 16 outstanding, towards the
//! other, until at least 64 MiB of payload have moved in all. Checked:
//! * every byte of every transfer (a pattern keyed by the operation, so data of another
//!   operation or a stale copy cannot pass), and guard bytes just past every WRITE / READ
//!   target, which must stay untouched;
//! * every completion is successful, has the expected opcode, length and immediate, and
//!   arrives in posting order (send completions in send-WR order, receive completions in
//!   receive-WR order, matched to the SENDs / WRITEs with immediate in posting order);
//! * every atomic returns the value a sequential model of the target word predicts (RC
//!   executes atomics in posting order, and never twice), and the words end as modelled;
//! * the injector really dropped, duplicated and held back packets, the engines really
//!   retransmitted, and duplicates really reached the responders;
//! * both QPs are still in RTS at the end, no packet had a bad ICRC or went to an unknown
//!   QP.

#[path = "support/pair.rs"]
mod pair;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use uroce_net::{DeviceCounters, FaultConfig};
use uroce_verbs::{
    AtomicInfo, QpState, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, WcFlags, WcOpcode,
    WcStatus, WorkCompletion,
};
use uroce_wire::pmtu::Pmtu;

use pair::{ConnectOpts, Side, SideConfig};

const TEST: &str = "faults_transfer";
/// The faults of each side unless `UROCE_FAULTS` says otherwise.
const FAULTS_A: &str = "drop=0.05,dup=0.01,reorder=0.02,seed=7";
const FAULTS_B: &str = "drop=0.05,dup=0.01,reorder=0.02,seed=1009";
/// Seed of the operation mix.
const OPS_SEED: u64 = 0x6661_756c_7473_0064;
/// Payload to move, both directions together.
const TOTAL: u64 = 64 << 20;
/// Largest message.
const MAX_LEN: usize = 1 << 20;
/// Work requests outstanding per direction.
const OUTSTANDING: usize = 16;
/// Receive buffers each side keeps posted.
const RECV_SLOTS: usize = 16;
/// Bytes after a WRITE / READ target that must stay untouched.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xa5;
/// Distance between buffers in a region (room for the guard).
const STRIDE: usize = MAX_LEN + 4096;
/// Words the atomics of one direction work on (few, so that they collide).
const ATOMIC_WORDS: usize = 8;
/// Region layout of each side: buffers for its own requests, targets of the peer's
/// WRITEs / READs, receive buffers, atomic words.
const LOCAL_BASE: usize = 0;
const TARGET_BASE: usize = OUTSTANDING * STRIDE;
const RECV_BASE: usize = 2 * OUTSTANDING * STRIDE;
const ATOMIC_BASE: usize = RECV_BASE + RECV_SLOTS * STRIDE;
const MR_LEN: usize = ATOMIC_BASE + 4096;
/// Local ACK timeout code: 4.096 µs · 2^14 ≈ 67 ms, so the seven retries give up only
/// after ~0.5 s without forward progress. Shorter timeouts make the test depend on the
/// scheduler: in a debug build on a loaded 2-core machine a progress thread can wait tens
/// of milliseconds for a CPU while its peer's timer keeps firing; code 8 (~1 ms) ended in
/// RETRY_EXC_ERR within a second in most loaded runs, code 10 (~4 ms) in some, code 12
/// (~17 ms) in about one of ten.
const TIMEOUT: u8 = 14;
/// The whole test must finish within this, and make progress at least this often.
const LIMIT: Duration = Duration::from_secs(120);
const STALL: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Send,
        Kind::SendImm,
        Kind::Write,
        Kind::WriteImm,
        Kind::Read,
        Kind::FetchAdd,
        Kind::CmpSwap,
    ];

    /// Whether the operation consumes a receive WR at the responder.
    fn consumes_recv(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::WriteImm)
    }

    fn is_atomic(self) -> bool {
        matches!(self, Kind::FetchAdd | Kind::CmpSwap)
    }

    /// The requester's completion opcode (IBA: WRITE with immediate completes as WRITE).
    fn wc_opcode(self) -> WcOpcode {
        match self {
            Kind::Send | Kind::SendImm => WcOpcode::Send,
            Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
            Kind::Read => WcOpcode::RdmaRead,
            Kind::FetchAdd => WcOpcode::FetchAdd,
            Kind::CmpSwap => WcOpcode::CompSwap,
        }
    }
}

/// One posted operation.
#[derive(Debug, Clone, Copy)]
struct Op {
    wr_id: u64,
    kind: Kind,
    len: usize,
    /// Key of the data pattern.
    key: u64,
    /// Index of the requester's buffer (and of the responder's target, for WRITE/READ).
    slot: usize,
    imm: u32,
    /// The value an atomic must return.
    orig: u64,
}

/// Counts per operation kind.
#[derive(Debug, Default, Clone, Copy)]
struct KindStats {
    ops: u64,
    bytes: u64,
}

/// One direction: requester `req` (index into the sides), responder `1 - req`.
struct Flow {
    name: &'static str,
    req: usize,
    rng: StdRng,
    next_wr: u64,
    /// Posted and not completed, in posting order.
    outstanding: VecDeque<Op>,
    free_slots: Vec<usize>,
    /// Receives posted at the responder that no posted operation has claimed yet.
    credits: usize,
    /// Operations that consume a receive, in posting order.
    recv_expect: VecDeque<Op>,
    /// The responder's receive WRs, in posting order: (wr_id, buffer index).
    recv_posted: VecDeque<(u64, usize)>,
    next_recv: u64,
    /// The atomic words as they must be after every posted atomic.
    model: [u64; ATOMIC_WORDS],
    posted_bytes: u64,
    moved: u64,
    stats: [KindStats; 7],
    completions: u64,
}

/// Offset of atomic word `word` of the flow whose requester is side `requester`; the
/// words live in the responder's region, each flow with its own.
fn atomic_off(requester: usize, word: usize) -> usize {
    ATOMIC_BASE + (requester * ATOMIC_WORDS + word) * 8
}

/// Panics unless every byte of `bytes` is still the guard byte.
fn check_guard(bytes: &[u8], what: &str) {
    if let Some(i) = bytes.iter().position(|&b| b != GUARD_BYTE) {
        panic!("{what}: guard byte {i} past the end was overwritten");
    }
}

impl Flow {
    fn new(name: &'static str, req: usize, sides: &[Side; 2]) -> Flow {
        let mut rng = StdRng::seed_from_u64(OPS_SEED ^ (req as u64 + 1));
        let mut model = [0u64; ATOMIC_WORDS];
        let resp = &sides[1 - req];
        for (w, m) in model.iter_mut().enumerate() {
            *m = rng.random();
            resp.mr
                .block()
                .atomic_store(atomic_off(req, w), *m)
                .expect("initial atomic value");
        }
        let mut f = Flow {
            name,
            req,
            rng,
            next_wr: 1,
            outstanding: VecDeque::new(),
            free_slots: (0..OUTSTANDING).rev().collect(),
            credits: 0,
            recv_expect: VecDeque::new(),
            recv_posted: VecDeque::new(),
            next_recv: 1,
            model,
            posted_bytes: 0,
            moved: 0,
            stats: [KindStats::default(); 7],
            completions: 0,
        };
        for slot in 0..RECV_SLOTS {
            f.post_recv(resp, slot);
        }
        f
    }

    fn post_recv(&mut self, resp: &Side, slot: usize) {
        let id = self.next_recv;
        self.next_recv += 1;
        resp.qp
            .post_recv(RecvWr::new(
                id,
                vec![resp.sge(RECV_BASE + slot * STRIDE, MAX_LEN)],
            ))
            .unwrap_or_else(|e| panic!("{}: post_recv: {e}", self.name));
        self.recv_posted.push_back((id, slot));
        self.credits += 1;
    }

    fn done_posting(&self) -> bool {
        self.posted_bytes >= TOTAL / 2
    }

    fn finished(&self) -> bool {
        self.done_posting() && self.outstanding.is_empty() && self.recv_expect.is_empty()
    }

    fn pick_len(&mut self) -> usize {
        const EDGES: [usize; 8] = [1, 2, 3, 4095, 4096, 4097, MAX_LEN - 1, MAX_LEN];
        if self.rng.random_range(0..8) == 0 {
            return EDGES[self.rng.random_range(0..EDGES.len())];
        }
        // Log-uniform between 1 B and 1 MiB.
        let e = self.rng.random_range(0..=20u32);
        let lo = 1usize << e;
        self.rng.random_range(lo..(2 * lo).min(MAX_LEN + 1))
    }

    fn pick_kind(&mut self) -> Kind {
        // SEND 20 %, SEND+imm 10 %, WRITE 20 %, WRITE+imm 10 %, READ 24 %, atomics 8 % each.
        let k = match self.rng.random_range(0..100) {
            0..20 => Kind::Send,
            20..30 => Kind::SendImm,
            30..50 => Kind::Write,
            50..60 => Kind::WriteImm,
            60..84 => Kind::Read,
            84..92 => Kind::FetchAdd,
            _ => Kind::CmpSwap,
        };
        if k.consumes_recv() && self.credits == 0 {
            Kind::Write
        } else {
            k
        }
    }

    /// Posts operations until 16 are outstanding or the flow's share is posted.
    fn post(&mut self, sides: &[Side; 2]) {
        let (req, resp) = (&sides[self.req], &sides[1 - self.req]);
        while self.outstanding.len() < OUTSTANDING && !self.done_posting() {
            let Some(slot) = self.free_slots.pop() else {
                break;
            };
            let kind = self.pick_kind();
            let wr_id = self.next_wr;
            self.next_wr += 1;
            // A key of its own for every operation of every flow.
            let key = (wr_id << 8 | self.req as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ OPS_SEED;
            let local = LOCAL_BASE + slot * STRIDE;
            let target = TARGET_BASE + slot * STRIDE;
            let mut op = Op {
                wr_id,
                kind,
                len: if kind.is_atomic() { 8 } else { self.pick_len() },
                key,
                slot,
                imm: key as u32 ^ 0x5a5a_0000,
                orig: 0,
            };
            let len = op.len;
            let mut wr = SendWr {
                wr_id,
                flags: SendFlags::SIGNALED,
                sg_list: vec![req.sge(local, len)].into(),
                ..SendWr::default()
            };
            let rdma = RdmaInfo {
                remote_addr: resp.va(target),
                rkey: resp.mr.rkey(),
            };
            match kind {
                Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm => {
                    req.mr
                        .block()
                        .copy_in(local, &pair::pattern(key, len))
                        .expect("fill source");
                    wr.opcode = match kind {
                        Kind::Send => SendOpcode::Send,
                        Kind::SendImm => SendOpcode::SendWithImm,
                        Kind::Write => SendOpcode::RdmaWrite,
                        _ => SendOpcode::RdmaWriteWithImm,
                    };
                    if matches!(kind, Kind::SendImm | Kind::WriteImm) {
                        wr.imm_data = op.imm;
                    }
                    if matches!(kind, Kind::Write | Kind::WriteImm) {
                        resp.mr
                            .block()
                            .fill(target + len, GUARD, GUARD_BYTE)
                            .expect("guard");
                        wr.rdma = rdma;
                    }
                }
                Kind::Read => {
                    // The responder's data, written there by "its application".
                    resp.mr
                        .block()
                        .copy_in(target, &pair::pattern(key, len))
                        .expect("fill READ source");
                    req.mr
                        .block()
                        .fill(local + len, GUARD, GUARD_BYTE)
                        .expect("guard");
                    wr.opcode = SendOpcode::RdmaRead;
                    wr.rdma = rdma;
                }
                Kind::FetchAdd | Kind::CmpSwap => {
                    let word = self.rng.random_range(0..ATOMIC_WORDS);
                    let current = self.model[word];
                    let (compare_add, swap) = if kind == Kind::FetchAdd {
                        let add = self.rng.random::<u64>();
                        self.model[word] = current.wrapping_add(add);
                        wr.opcode = SendOpcode::AtomicFetchAndAdd;
                        (add, 0)
                    } else {
                        // Half of the compares match.
                        let compare = if self.rng.random_bool(0.5) {
                            current
                        } else {
                            self.rng.random()
                        };
                        let swap = self.rng.random();
                        if compare == current {
                            self.model[word] = swap;
                        }
                        wr.opcode = SendOpcode::AtomicCmpAndSwp;
                        (compare, swap)
                    };
                    op.orig = current;
                    req.mr
                        .block()
                        .fill(local, 8 + GUARD, GUARD_BYTE)
                        .expect("guard");
                    wr.atomic = AtomicInfo {
                        remote_addr: resp.va(atomic_off(self.req, word)),
                        compare_add,
                        swap,
                        rkey: resp.mr.rkey(),
                    };
                }
            }
            if kind.consumes_recv() {
                self.credits -= 1;
                self.recv_expect.push_back(op);
            }
            req.qp
                .post_send(wr)
                .unwrap_or_else(|e| panic!("{}: post_send {kind:?}: {e}", self.name));
            self.posted_bytes += len as u64;
            self.outstanding.push_back(op);
        }
    }

    /// Polls both CQs of the flow and checks what completed; returns the number of
    /// completions.
    fn poll(&mut self, sides: &[Side; 2]) -> usize {
        let (req, resp) = (&sides[self.req], &sides[1 - self.req]);
        let sends = req.send_cq.poll(32);
        for wc in &sends {
            self.requester_completion(req, resp, wc);
        }
        let recvs = resp.recv_cq.poll(32);
        for wc in &recvs {
            self.receive_completion(req, resp, wc);
        }
        self.completions += (sends.len() + recvs.len()) as u64;
        sends.len() + recvs.len()
    }

    fn requester_completion(&mut self, req: &Side, resp: &Side, wc: &WorkCompletion) {
        let name = self.name;
        let op = self
            .outstanding
            .pop_front()
            .unwrap_or_else(|| panic!("{name}: completion with nothing outstanding: {wc:?}"));
        let what = format!("{name}: {:?} wr {} of {} B", op.kind, op.wr_id, op.len);
        if wc.status != WcStatus::Success {
            dump(&[req, resp]);
        }
        assert_eq!(
            wc.wr_id, op.wr_id,
            "{what}: completions out of posting order"
        );
        assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
        assert_eq!(wc.opcode, op.kind.wc_opcode(), "{what}: {wc:?}");
        assert_eq!(wc.qp_num, req.qp.qp_num(), "{what}");
        let local = LOCAL_BASE + op.slot * STRIDE;
        let target = TARGET_BASE + op.slot * STRIDE;
        match op.kind {
            Kind::Write | Kind::WriteImm => {
                check_data(resp, target, &op, &what);
            }
            Kind::Read => {
                check_data(req, local, &op, &what);
            }
            Kind::FetchAdd | Kind::CmpSwap => {
                let got = req.mr.block().atomic_load(local).expect("load");
                assert_eq!(got, op.orig, "{what}: returned original value");
                let mut guard = [0u8; GUARD];
                req.mr
                    .block()
                    .copy_out(local + 8, &mut guard)
                    .expect("guard");
                check_guard(&guard, &what);
            }
            Kind::Send | Kind::SendImm => {} // checked at the receiver
        }
        self.moved += op.len as u64;
        let s = &mut self.stats[Kind::ALL.iter().position(|k| *k == op.kind).unwrap_or(0)];
        s.ops += 1;
        s.bytes += op.len as u64;
        self.free_slots.push(op.slot);
    }

    fn receive_completion(&mut self, req: &Side, resp: &Side, wc: &WorkCompletion) {
        let name = self.name;
        let (id, slot) = self
            .recv_posted
            .pop_front()
            .unwrap_or_else(|| panic!("{name}: receive completion with none posted: {wc:?}"));
        let op = self
            .recv_expect
            .pop_front()
            .unwrap_or_else(|| panic!("{name}: receive completion nobody sent: {wc:?}"));
        let what = format!(
            "{name}: receive {id} for {:?} wr {} of {} B",
            op.kind, op.wr_id, op.len
        );
        if wc.status != WcStatus::Success {
            dump(&[req, resp]);
        }
        assert_eq!(wc.wr_id, id, "{what}: receive completions out of order");
        assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
        assert_eq!(wc.qp_num, resp.qp.qp_num(), "{what}");
        assert_eq!(wc.byte_len as usize, op.len, "{what}: byte_len");
        let want_opcode = if op.kind == Kind::WriteImm {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        };
        assert_eq!(wc.opcode, want_opcode, "{what}: {wc:?}");
        let with_imm = op.kind != Kind::Send;
        assert_eq!(
            wc.wc_flags.contains(WcFlags::WITH_IMM),
            with_imm,
            "{what}: {wc:?}"
        );
        if with_imm {
            assert_eq!(wc.imm_data, op.imm, "{what}: immediate data");
        }
        if op.kind != Kind::WriteImm {
            let buf = RECV_BASE + slot * STRIDE;
            let mut got = vec![0; op.len];
            resp.mr.block().copy_out(buf, &mut got).expect("read");
            if let Some(i) = pair::first_difference(&got, &pair::pattern(op.key, op.len)) {
                panic!("{what}: received data differs from byte {i} on");
            }
        }
        self.post_recv(resp, slot);
    }
}

/// Checks `op.len` bytes of pattern at `off` of `side`'s region, and the guard after them.
fn check_data(side: &Side, off: usize, op: &Op, what: &str) {
    let mut got = vec![0; op.len + GUARD];
    side.mr.block().copy_out(off, &mut got).expect("read");
    if let Some(i) = pair::first_difference(&got[..op.len], &pair::pattern(op.key, op.len)) {
        panic!("{what}: data differs from byte {i} on");
    }
    check_guard(&got[op.len..], what);
}

/// The two sides' fault configurations and where they came from.
fn fault_configs() -> ([FaultConfig; 2], &'static str) {
    match FaultConfig::from_env() {
        Ok(Some(c)) => {
            let mut b = c;
            b.seed = c.seed.wrapping_add(1);
            ([c, b], "UROCE_FAULTS")
        }
        Ok(None) => (
            [
                FaultConfig::parse(FAULTS_A).expect("FAULTS_A parses"),
                FaultConfig::parse(FAULTS_B).expect("FAULTS_B parses"),
            ],
            "default",
        ),
        Err(e) => panic!("{TEST}: UROCE_FAULTS: {e}"),
    }
}

/// Prints what helps to understand a failure: counters and QP states of `sides`.
fn dump(sides: &[&Side]) {
    for s in sides {
        let name = s.dev.device().name().to_owned();
        eprintln!(
            "{TEST}: {name}: QP {} in {:?}",
            s.qp.qp_num(),
            s.qp.query().0.qp_state
        );
        print_counters(&name, &s.dev.counters());
        for wc in s
            .send_cq
            .poll(64)
            .iter()
            .filter(|wc| wc.status != WcStatus::Success)
            .take(3)
        {
            eprintln!("{TEST}: {name}: send completion {wc:?}");
        }
    }
}

fn print_counters(name: &str, c: &DeviceCounters) {
    let line: Vec<String> = c
        .fields()
        .into_iter()
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    eprintln!("{TEST}: {name}: {}", line.join(" "));
}

#[test]
fn verified_64_mib_mixed_transfer_under_drop_dup_reorder() {
    let (faults, source) = fault_configs();
    eprintln!(
        "{TEST}: faults ({source}): A {}, B {}",
        faults[0], faults[1]
    );
    let addrs = ["127.0.4.1", "127.0.4.2"];
    let sides: [Side; 2] = [0, 1].map(|i| {
        let mut cfg = SideConfig::new(addrs[i], ["ft-a", "ft-b"][i]);
        cfg.faults = Some(faults[i]);
        cfg.mr_len = MR_LEN;
        cfg.queue_depth = 64;
        Side::open(&cfg)
    });
    let opts = ConnectOpts {
        mtu: Pmtu::Mtu4096,
        timeout: TIMEOUT,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOpts::default()
    };
    pair::connect(&sides[0], &sides[1], &opts);

    let mut flows = [Flow::new("A->B", 0, &sides), Flow::new("B->A", 1, &sides)];
    let start = Instant::now();
    let mut last_progress = start;
    // Bounded by LIMIT (asserted every round).
    loop {
        for f in &mut flows {
            f.post(&sides);
        }
        let mut n = 0;
        for f in &mut flows {
            n += f.poll(&sides);
        }
        if flows.iter().all(Flow::finished) {
            break;
        }
        let now = Instant::now();
        if n > 0 {
            last_progress = now;
        }
        if now - last_progress > STALL || now - start > LIMIT {
            for (s, name) in sides.iter().zip(["A", "B"]) {
                print_counters(name, &s.dev.counters());
            }
            panic!(
                "{TEST}: no completion for {:?} (or over {LIMIT:?} in all): moved {} + {} B, \
                 outstanding {:?} / {:?}",
                now - last_progress,
                flows[0].moved,
                flows[1].moved,
                flows[0].outstanding.front(),
                flows[1].outstanding.front()
            );
        }
    }
    let elapsed = start.elapsed();

    // The atomic words end as the model says.
    for f in &flows {
        let resp = &sides[1 - f.req];
        for (w, want) in f.model.iter().enumerate() {
            let got = resp
                .mr
                .block()
                .atomic_load(atomic_off(f.req, w))
                .expect("load");
            assert_eq!(got, *want, "{}: atomic word {w} at the end", f.name);
        }
    }
    for s in &sides {
        assert_eq!(s.qp.query().0.qp_state, QpState::Rts, "QP left RTS");
    }

    let moved: u64 = flows.iter().map(|f| f.moved).sum();
    assert!(moved >= TOTAL, "moved only {moved} B");
    let mib = moved as f64 / f64::from(1 << 20);
    eprintln!(
        "{TEST}: moved {mib:.1} MiB in {elapsed:.2?} ({:.1} MiB/s), {} completions",
        mib / elapsed.as_secs_f64(),
        flows.iter().map(|f| f.completions).sum::<u64>()
    );
    for f in &flows {
        let per: Vec<String> = Kind::ALL
            .iter()
            .zip(&f.stats)
            .map(|(k, s)| format!("{k:?} {}x/{} B", s.ops, s.bytes))
            .collect();
        eprintln!("{TEST}: {}: {}", f.name, per.join(", "));
    }

    let counters = [sides[0].dev.counters(), sides[1].dev.counters()];
    for (c, name) in counters.iter().zip(["A", "B"]) {
        print_counters(name, c);
    }
    for ((c, f), name) in counters.iter().zip(&faults).zip(["A", "B"]) {
        let s = &c.socket;
        if f.drop > 0.0 {
            assert!(s.injected_drops > 0, "{name}: no packet was dropped");
            // Both sides are requesters, so both must have recovered from losses.
            assert!(
                c.transport.retransmitted_packets > 0,
                "{name}: no retransmission"
            );
        }
        if f.dup > 0.0 {
            assert!(s.injected_dups > 0, "{name}: no packet was duplicated");
        }
        if f.reorder > 0.0 {
            assert!(s.injected_reorders > 0, "{name}: no packet was held back");
        }
        // What this side receives was corrupted (or not) by the other side.
        let peer = if name == "A" { &faults[1] } else { &faults[0] };
        if peer.corrupt == 0.0 {
            assert_eq!(s.bad_icrc, 0, "{name}: bad ICRC without corruption");
        } else {
            assert!(s.bad_icrc > 0, "{name}: corrupted packets were not caught");
        }
        assert_eq!(s.parse_errors, 0, "{name}: parse errors");
        assert_eq!(c.unknown_qpn, 0, "{name}: packets for unknown QPs");
        assert_eq!(c.no_engine, 0, "{name}: packets for QPs without engine");
    }
    if faults.iter().any(|f| f.dup > 0.0) {
        let dups: u64 = counters
            .iter()
            .map(|c| c.transport.duplicates_received)
            .sum();
        assert!(dups > 0, "no responder saw a duplicate request");
    }
}
