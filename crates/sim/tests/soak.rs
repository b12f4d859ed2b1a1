//! Randomized soak of the RC engine on the simulated network.
//!
//! For every seed, two connected QPs exchange a random mix of every RC operation in both
//! directions (SEND, SEND_WITH_IMM, SEND_WITH_INV, RDMA WRITE, WRITE_WITH_IMM, RDMA READ,
//! FETCH_ADD, CMP_SWAP, ATOMIC WRITE; 0 B to 4 MiB, skewed towards small; up to 4 SGEs or
//! inline data)
//! over links with the loss level of the test (0 %, 1 %, 10 %; at 1 % and 10 % with as
//! much duplication, reordering and bit corruption). Path MTU, first PSNs (often just
//! before the 24-bit wrap), timers, send window, READ/atomic depth, receive-WR supply
//! (late receives cause RNR NAKs) vary per seed.
//!
//! What is checked, from an independent model of the memories (not from the engine):
//! * every signalled WR completes exactly once, in posting order, SUCCESS, with the right
//!   opcode and length; unsignalled WRs never produce a completion;
//! * every receive completes exactly once, in order, with the right opcode, length,
//!   immediate and invalidated R_Key;
//! * every byte of every region at the end: RDMA targets equal the model (writes applied
//!   in order; READ before a later overlapping WRITE is fenced, as IBA requires), READ
//!   results and received SENDs land exactly in their SGEs (the bytes around them keep a
//!   sentinel), source buffers are untouched;
//! * FETCH_ADD: every counter ends at its initial value plus the sum of all adds, and the
//!   original values returned are exactly the running sums (so distinct): each add ran
//!   exactly once; CMP_SWAP results follow the same sequential model;
//! * ATOMIC WRITE: its 8 bytes are in the target model like a WRITE's (an 8-byte aligned
//!   word), so a duplicate executed again after a later WRITE to that word would show.
//!
//! Environment: `UROCE_SOAK_SEEDS=<n>` seeds per loss level (default [`DEFAULT_SEEDS`]),
//! `UROCE_SOAK_SEED=<n>` runs only seed `n` (replay), `UROCE_SOAK_OPS=<n>` operations per
//! direction (default [`DEFAULT_OPS`]). A failure prints its seed and the trace tail.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, Instant as WallClock};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use uroce_proto::engine::Engine;
use uroce_proto::qp_state::QpState;
use uroce_proto::rc::{CqKind, RcConfig};
use uroce_proto::time::Instant;
use uroce_proto::wr::{
    RecvWr, SendFlags, SendOpcode, SendPayload, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use uroce_sim::rc::Pair;
use uroce_sim::{Access, LinkConfig, QpId, RegionHandle, SimNet};
use uroce_wire::{Pmtu, Psn};

/// Seeds per loss level in CI.
const DEFAULT_SEEDS: u64 = 24;
/// Operations per direction per seed in CI.
const DEFAULT_OPS: usize = 60;

const SRC_LEN: usize = (4 << 20) + 4096;
const TARGET_LEN: usize = (4 << 20) + 65536;
/// FETCH_ADD counters are words 0..4 of the atomic region, CMP_SWAP words 4..8.
const ATOMIC_WORDS: usize = 8;
const SENTINEL: u8 = 0xA5;
const MAX_STEPS: u64 = 200_000_000;
const MAX_VIRTUAL: Duration = Duration::from_secs(3600);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
    AtomicWrite,
}

impl Kind {
    fn opcode(self) -> SendOpcode {
        match self {
            Kind::Send => SendOpcode::Send,
            Kind::SendImm => SendOpcode::SendWithImm,
            Kind::SendInv => SendOpcode::SendWithInv,
            Kind::Write => SendOpcode::RdmaWrite,
            Kind::WriteImm => SendOpcode::RdmaWriteWithImm,
            Kind::Read => SendOpcode::RdmaRead,
            Kind::FetchAdd => SendOpcode::AtomicFetchAndAdd,
            Kind::CmpSwap => SendOpcode::AtomicCmpAndSwp,
            Kind::AtomicWrite => SendOpcode::AtomicWrite,
        }
    }
    fn is_send(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::SendInv)
    }
    /// Places its bytes in the peer's target region (ATOMIC WRITE: one aligned word).
    fn is_write(self) -> bool {
        matches!(self, Kind::Write | Kind::WriteImm | Kind::AtomicWrite)
    }
    fn consumes_recv(self) -> bool {
        self.is_send() || self == Kind::WriteImm
    }
}

/// One planned send WR, with offsets into the regions (turned into addresses once the
/// regions exist).
#[derive(Debug, Clone)]
struct Op {
    kind: Kind,
    len: u32,
    /// SEND/WRITE: pieces of the sender's source region; empty with `inline`.
    src: Vec<(u64, u32)>,
    inline: Option<Vec<u8>>,
    /// WRITE/READ: offset in the peer's target region; atomics: word index.
    remote: u64,
    /// READ: pieces of the sender's read buffer.
    dst: Vec<(u64, u32)>,
    /// Atomics: offset of the 8-byte result in the sender's result buffer.
    res: u64,
    add_or_compare: u64,
    swap: u64,
    imm: u32,
    /// SEND_WITH_INV: index of the peer's region to invalidate.
    inv: usize,
    fence: bool,
    signaled: bool,
    /// SEND/WRITE: the message bytes; READ: the bytes it must return.
    data: Vec<u8>,
    /// Atomics: the original value it must return.
    orig: u64,
}

/// One planned receive WR at the peer.
#[derive(Debug, Clone)]
struct Recv {
    pieces: Vec<(u64, u32)>,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    inv: Option<usize>,
    /// SEND: the bytes to land in `pieces`.
    data: Vec<u8>,
}

/// Everything one direction (sender → peer) needs.
struct Plan {
    ops: Vec<Op>,
    recvs: Vec<Recv>,
    read_len: u64,
    recv_len: u64,
    res_len: u64,
    inv_count: usize,
    /// The peer's target region and atomic words at the end.
    final_target: Vec<u8>,
    final_words: [u64; ATOMIC_WORDS],
    init_words: [u64; ATOMIC_WORDS],
    payload_bytes: u64,
    depth: usize,
    recv_ahead: usize,
}

/// Message length: most small, some large, up to 4 MiB.
fn sample_len(rng: &mut ChaCha8Rng) -> u32 {
    let r: f64 = rng.random();
    if r < 0.05 {
        0
    } else if r < 0.45 {
        rng.random_range(1..=64)
    } else if r < 0.75 {
        rng.random_range(65..=2048)
    } else if r < 0.93 {
        rng.random_range(2049..=65536)
    } else if r < 0.99 {
        rng.random_range(65537..=(1 << 20))
    } else {
        rng.random_range((1 << 20) + 1..=(4 << 20))
    }
}

/// Splits `len` into 1..=4 piece lengths (some possibly zero).
fn split(rng: &mut ChaCha8Rng, len: u32) -> Vec<u32> {
    let n = rng.random_range(1..=4usize);
    let mut cuts: Vec<u32> = (0..n - 1).map(|_| rng.random_range(0..=len)).collect();
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(n);
    let mut prev = 0;
    for c in cuts {
        out.push(c - prev);
        prev = c;
    }
    out.push(len - prev);
    out
}

/// Allocates pieces of `lens` from a bump pointer, with random gaps (0..=16 bytes).
fn bump(rng: &mut ChaCha8Rng, next: &mut u64, lens: &[u32]) -> Vec<(u64, u32)> {
    lens.iter()
        .map(|&l| {
            *next += rng.random_range(0..=16u64);
            let at = *next;
            *next += u64::from(l);
            (at, l)
        })
        .collect()
}

fn plan(rng: &mut ChaCha8Rng, n_ops: usize, src: &[u8], target: &[u8], read_cap: u32) -> Plan {
    let mut model = target.to_vec();
    let mut words = [0u64; ATOMIC_WORDS];
    for w in &mut words {
        *w = rng.random_range(0..1u64 << 40);
    }
    let init_words = words;
    let (mut read_next, mut recv_next, mut res_next) = (0u64, 0u64, 0u64);
    let mut inv_count = 0;
    let mut unfenced_reads: Vec<(u64, u64)> = Vec::new();
    let mut ops = Vec::with_capacity(n_ops);
    let mut recvs = Vec::new();
    let mut payload_bytes = 0u64;
    for _ in 0..n_ops {
        let r: f64 = rng.random();
        let kind = match r {
            r if r < 0.18 => Kind::Send,
            r if r < 0.26 => Kind::SendImm,
            r if r < 0.30 => Kind::SendInv,
            r if r < 0.48 => Kind::Write,
            r if r < 0.56 => Kind::WriteImm,
            r if r < 0.76 => Kind::Read,
            r if r < 0.90 => Kind::FetchAdd,
            r if r < 0.95 => Kind::CmpSwap,
            _ => Kind::AtomicWrite,
        };
        let mut op = Op {
            kind,
            len: 0,
            src: Vec::new(),
            inline: None,
            remote: 0,
            dst: Vec::new(),
            res: 0,
            add_or_compare: 0,
            swap: 0,
            imm: rng.random(),
            inv: 0,
            fence: false,
            signaled: rng.random_bool(0.9),
            data: Vec::new(),
            orig: 0,
        };
        match kind {
            Kind::FetchAdd | Kind::CmpSwap => {
                op.len = 8;
                res_next = res_next.div_ceil(8) * 8 + 8 * rng.random_range(0..=2u64);
                op.res = res_next;
                res_next += 8;
                let word = if kind == Kind::FetchAdd {
                    rng.random_range(0..4usize)
                } else {
                    rng.random_range(4..ATOMIC_WORDS)
                };
                op.remote = word as u64;
                op.orig = words[word];
                if kind == Kind::FetchAdd {
                    op.add_or_compare = rng.random_range(1..=1000);
                    words[word] = words[word].wrapping_add(op.add_or_compare);
                } else {
                    op.add_or_compare = if rng.random_bool(0.5) {
                        words[word]
                    } else {
                        words[word] ^ 1
                    };
                    op.swap = rng.random_range(0..1u64 << 40);
                    if words[word] == op.add_or_compare {
                        words[word] = op.swap;
                    }
                }
                payload_bytes += 8;
            }
            Kind::AtomicWrite => {
                op.len = 8;
                if rng.random_bool(0.5) {
                    let mut bytes = vec![0u8; 8];
                    rng.fill_bytes(&mut bytes);
                    op.data = bytes.clone();
                    op.inline = Some(bytes);
                } else {
                    for piece in split(rng, 8) {
                        let off = rng.random_range(0..=(SRC_LEN as u64 - u64::from(piece)));
                        op.src.push((off, piece));
                        op.data
                            .extend_from_slice(&src[off as usize..off as usize + piece as usize]);
                    }
                }
                let off = 8 * rng.random_range(0..(TARGET_LEN as u64 / 8));
                op.remote = off;
                let end = off + 8;
                // Like a WRITE: not ordered with an earlier overlapping READ unless fenced.
                if unfenced_reads.iter().any(|&(o, l)| o < end && off < o + l) {
                    op.fence = true;
                    unfenced_reads.clear();
                }
                model[off as usize..end as usize].copy_from_slice(&op.data);
                payload_bytes += 8;
            }
            _ => {
                let mut len = sample_len(rng);
                if kind == Kind::Read {
                    len = len.min(read_cap);
                }
                op.len = len;
                payload_bytes += u64::from(len);
                if kind == Kind::Read {
                    let off = rng.random_range(0..=(TARGET_LEN as u64 - u64::from(len)));
                    op.remote = off;
                    op.data = model[off as usize..off as usize + len as usize].to_vec();
                    let pieces = split(rng, len);
                    op.dst = bump(rng, &mut read_next, &pieces);
                    unfenced_reads.push((off, u64::from(len)));
                } else {
                    if len <= 256 && rng.random_bool(0.2) {
                        let mut bytes = vec![0u8; len as usize];
                        rng.fill_bytes(&mut bytes);
                        op.data = bytes.clone();
                        op.inline = Some(bytes);
                    } else {
                        for piece in split(rng, len) {
                            let off = rng.random_range(0..=(SRC_LEN as u64 - u64::from(piece)));
                            op.src.push((off, piece));
                            op.data.extend_from_slice(
                                &src[off as usize..off as usize + piece as usize],
                            );
                        }
                    }
                    if kind.is_write() {
                        let off = rng.random_range(0..=(TARGET_LEN as u64 - u64::from(len)));
                        op.remote = off;
                        let end = off + u64::from(len);
                        // IBA: a WRITE after a READ is not ordered with it unless fenced.
                        if len > 0 && unfenced_reads.iter().any(|&(o, l)| o < end && off < o + l) {
                            op.fence = true;
                            unfenced_reads.clear();
                        }
                        model[off as usize..end as usize].copy_from_slice(&op.data);
                    }
                    if kind == Kind::SendInv {
                        op.inv = inv_count;
                        inv_count += 1;
                    }
                }
            }
        }
        if kind.consumes_recv() {
            let slack = rng.random_range(0..=64u32);
            let cap = if kind == Kind::WriteImm {
                rng.random_range(0..=16)
            } else {
                op.len + slack
            };
            let pieces = split(rng, cap);
            recvs.push(Recv {
                pieces: bump(rng, &mut recv_next, &pieces),
                opcode: if kind == Kind::WriteImm {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                },
                byte_len: op.len,
                imm: matches!(kind, Kind::SendImm | Kind::WriteImm).then_some(op.imm),
                inv: (kind == Kind::SendInv).then_some(op.inv),
                data: if kind.is_send() {
                    op.data.clone()
                } else {
                    Vec::new()
                },
            });
        }
        ops.push(op);
    }
    Plan {
        ops,
        recvs,
        read_len: read_next + 64,
        recv_len: recv_next + 64,
        res_len: res_next + 64,
        inv_count,
        final_target: model,
        final_words: words,
        init_words,
        payload_bytes,
        depth: rng.random_range(1..=64),
        recv_ahead: rng.random_range(1..=8),
    }
}

/// One node's regions.
struct Regions {
    src: RegionHandle,
    src_bytes: Vec<u8>,
    target: RegionHandle,
    atomic: RegionHandle,
    read: RegionHandle,
    recv: RegionHandle,
    res: RegionHandle,
    inv: Vec<RegionHandle>,
}

/// Per-direction progress.
struct Dir {
    from: QpId,
    to: QpId,
    plan: Plan,
    posted: usize,
    /// Index of the next signalled op whose completion is expected.
    next_send_wc: usize,
    /// Ops known complete (all before the last signalled completion).
    done: usize,
    /// The op that failed with RETRY_EXC_ERR; every later op must then be flushed.
    failed: Option<usize>,
    /// The next op whose WR_FLUSH_ERR completion is expected after a failure.
    next_flush: usize,
    recvs_posted: usize,
    recvs_done: usize,
    /// Receives that completed successfully (the rest were flushed).
    recvs_ok: usize,
    /// Virtual times at which one more receive WR gets posted.
    recv_due: VecDeque<Instant>,
}

impl Dir {
    fn new(from: QpId, to: QpId, plan: Plan) -> Dir {
        let mut recv_due = VecDeque::new();
        for _ in 0..plan.recv_ahead {
            recv_due.push_back(Instant::ZERO);
        }
        Dir {
            from,
            to,
            plan,
            posted: 0,
            next_send_wc: 0,
            done: 0,
            failed: None,
            next_flush: 0,
            recvs_posted: 0,
            recvs_done: 0,
            recvs_ok: 0,
            recv_due,
        }
    }

    /// Every op and receive is accounted for.
    fn finished(&self) -> bool {
        let sends = match self.failed {
            Some(_) => self.next_flush == self.plan.ops.len(),
            None => {
                self.posted == self.plan.ops.len()
                    && self.plan.ops[self.next_send_wc..]
                        .iter()
                        .all(|o| !o.signaled)
            }
        };
        sends && self.recvs_done == self.plan.recvs.len()
    }

    /// Ops certainly executed by the peer: all before the failed one (or all).
    fn executed(&self) -> usize {
        self.failed.unwrap_or(self.plan.ops.len())
    }
}

struct Outcome {
    ops: usize,
    bytes: u64,
    packets: u64,
    virtual_nanos: u64,
    retransmitted: u64,
    rnr_naks: u64,
    seq_naks: u64,
    timeouts: u64,
    icrc_drops: u64,
    /// Directions that ended in RETRY_EXC_ERR.
    exhausted: usize,
}

fn sge_list(h: &RegionHandle, pieces: &[(u64, u32)]) -> uroce_proto::wr::SgList {
    pieces.iter().map(|&(o, l)| h.sge(o, l)).collect()
}

fn build_wr(i: usize, op: &Op, mine: &Regions, peer: &Regions) -> SendWr {
    let mut wr = SendWr::new(i as u64, op.kind.opcode(), Vec::new());
    wr.payload = match (&op.inline, op.kind) {
        (Some(bytes), _) => SendPayload::Inline(bytes[..].into()),
        (None, Kind::Read) => SendPayload::Sges(sge_list(&mine.read, &op.dst)),
        (None, Kind::FetchAdd | Kind::CmpSwap) => {
            SendPayload::Sges(vec![mine.res.sge(op.res, 8)].into())
        }
        (None, _) => SendPayload::Sges(sge_list(&mine.src, &op.src)),
    };
    if op.inline.is_some() {
        wr.flags |= SendFlags::INLINE;
    }
    if op.signaled {
        wr.flags |= SendFlags::SIGNALED;
    }
    if op.fence {
        wr.flags |= SendFlags::FENCE;
    }
    wr.imm_data = op.imm;
    match op.kind {
        Kind::Write | Kind::WriteImm | Kind::Read | Kind::AtomicWrite => {
            wr.remote_addr = peer.target.va(op.remote);
            wr.rkey = peer.target.rkey;
        }
        Kind::FetchAdd | Kind::CmpSwap => {
            wr.remote_addr = peer.atomic.va(op.remote * 8);
            wr.rkey = peer.atomic.rkey;
            wr.compare_add = op.add_or_compare;
            wr.swap = op.swap;
        }
        Kind::SendInv => wr.invalidate_rkey = peer.inv[op.inv].rkey,
        _ => {}
    }
    wr
}

fn register_node(
    pair: &Pair,
    qp: QpId,
    outgoing: &Plan,
    incoming: &Plan,
    src_bytes: Vec<u8>,
    target_init: &[u8],
) -> Regions {
    let mem = pair.mem(qp);
    let src = mem.register(SRC_LEN, Access::NONE);
    mem.write(&src, 0, &src_bytes).unwrap();
    let target = mem.register(TARGET_LEN, Access::REMOTE_READ | Access::REMOTE_WRITE);
    mem.write(&target, 0, target_init).unwrap();
    let atomic = mem.register(ATOMIC_WORDS * 8, Access::REMOTE_ATOMIC);
    for (i, w) in incoming.init_words.iter().enumerate() {
        mem.write_u64(&atomic, i as u64 * 8, *w).unwrap();
    }
    let read = mem.register(outgoing.read_len as usize, Access::LOCAL_WRITE);
    let recv = mem.register(incoming.recv_len as usize, Access::LOCAL_WRITE);
    let res = mem.register(outgoing.res_len as usize, Access::LOCAL_WRITE);
    for h in [&read, &recv, &res] {
        mem.fill(h, SENTINEL).unwrap();
    }
    let inv = (0..incoming.inv_count)
        .map(|_| mem.register(64, Access::REMOTE_READ))
        .collect();
    Regions {
        src,
        src_bytes,
        target,
        atomic,
        read,
        recv,
        res,
        inv,
    }
}

/// What a failure report says.
fn fail(net: &SimNet<uroce_proto::rc::RcQp>, what: String) -> String {
    format!(
        "{what}\nstats: {:?}\nlast packets:\n{}",
        net.stats(),
        net.trace().tail(80)
    )
}

/// Checks a send completion of direction `d`. With `allow_exhaustion`, the IBA outcome of
/// eight consecutive failed retries is accepted: the oldest incomplete op fails with
/// RETRY_EXC_ERR and every later one (signalled or not) is flushed, exactly once, in
/// order.
fn check_send_wc(d: &mut Dir, wc: &WorkCompletion, allow_exhaustion: bool) -> Result<(), String> {
    let ops = &d.plan.ops;
    if d.failed.is_some() {
        let want = (d.next_flush as u64, WcStatus::WrFlushErr, d.from.qpn);
        let got = (wc.wr_id, wc.status, wc.qp_num);
        if got != want {
            return Err(format!(
                "{}: after RETRY_EXC_ERR got {got:?}, expected flush {want:?}",
                d.from
            ));
        }
        d.next_flush += 1;
        return Ok(());
    }
    if wc.status == WcStatus::RetryExcErr && allow_exhaustion {
        let i = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
        if i < d.next_send_wc || i >= d.posted || ops[d.next_send_wc..i].iter().any(|o| o.signaled)
        {
            return Err(format!(
                "{}: RETRY_EXC_ERR for op {i} out of order (next {})",
                d.from, d.next_send_wc
            ));
        }
        d.failed = Some(i);
        d.next_flush = i + 1;
        d.done = d.posted;
        return Ok(());
    }
    let i = (d.next_send_wc..ops.len())
        .find(|&i| ops[i].signaled)
        .ok_or_else(|| format!("{}: unexpected send completion {wc:?}", d.from))?;
    let op = &ops[i];
    let byte_len = match op.kind {
        Kind::FetchAdd | Kind::CmpSwap => 8,
        _ => op.len,
    };
    let got = (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.qp_num);
    let want = (
        i as u64,
        WcStatus::Success,
        op.kind.opcode().wc_opcode(),
        byte_len,
        d.from.qpn,
    );
    if got != want {
        return Err(format!(
            "{}: send completion {got:?}, expected {want:?} (op {i}: {:?} len {})",
            d.from, op.kind, op.len
        ));
    }
    if i >= d.posted {
        return Err(format!(
            "{}: completion for op {i}, which is not posted yet",
            d.from
        ));
    }
    d.next_send_wc = i + 1;
    d.done = i + 1;
    Ok(())
}

/// Checks a receive completion of direction `d` (at `d.to`). Once the receiving QP is in
/// ERR (allowed with `allow_exhaustion`), the rest are flushed in order.
fn check_recv_wc(
    d: &mut Dir,
    wc: &WorkCompletion,
    regions: &Regions,
    allow_exhaustion: bool,
) -> Result<(), String> {
    let j = d.recvs_done;
    let r = d
        .plan
        .recvs
        .get(j)
        .ok_or_else(|| format!("{}: unexpected receive completion {wc:?}", d.to))?;
    let wr_id = (1u64 << 40) | j as u64;
    if wc.status == WcStatus::WrFlushErr && allow_exhaustion {
        if (wc.wr_id, wc.qp_num) != (wr_id, d.to.qpn) {
            return Err(format!(
                "{}: flushed receive {:#x}, expected {wr_id:#x}",
                d.to, wc.wr_id
            ));
        }
        d.recvs_done += 1;
        return Ok(());
    }
    if d.recvs_ok != d.recvs_done {
        return Err(format!(
            "{}: receive {j} completed after a flushed one: {wc:?}",
            d.to
        ));
    }
    let mut flags = WcFlags::empty();
    if r.imm.is_some() {
        flags |= WcFlags::WITH_IMM;
    }
    if r.inv.is_some() {
        flags |= WcFlags::WITH_INV;
    }
    let got = (
        wc.wr_id,
        wc.status,
        wc.opcode,
        wc.byte_len,
        wc.qp_num,
        wc.wc_flags & (WcFlags::WITH_IMM | WcFlags::WITH_INV),
    );
    let want = (
        wr_id,
        WcStatus::Success,
        r.opcode,
        r.byte_len,
        d.to.qpn,
        flags,
    );
    if got != want {
        return Err(format!(
            "{}: receive completion {got:?}, expected {want:?} (recv {j})",
            d.to
        ));
    }
    if let Some(imm) = r.imm {
        if wc.imm_data != imm {
            return Err(format!(
                "{}: recv {j} imm {:#x}, expected {imm:#x}",
                d.to, wc.imm_data
            ));
        }
    }
    if let Some(inv) = r.inv {
        if wc.invalidated_rkey != regions.inv[inv].rkey {
            return Err(format!(
                "{}: recv {j} invalidated {:#x}",
                d.to, wc.invalidated_rkey
            ));
        }
    }
    d.recvs_done += 1;
    d.recvs_ok += 1;
    Ok(())
}

/// Compares a region with its expected contents where `care` is true; reports the first
/// difference.
fn compare(what: &str, got: &[u8], want: &[u8], care: &[bool]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: length {} != {}", got.len(), want.len()));
    }
    let bad = |i: usize| care.get(i).copied().unwrap_or(true) && got[i] != want[i];
    match (0..got.len()).find(|&i| bad(i)) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: byte {i} is {:#04x}, expected {:#04x} ({} bytes differ)",
            got[i],
            want[i],
            (0..got.len()).filter(|&i| bad(i)).count()
        )),
    }
}

/// Marks `[off, off + len)` as "don't care".
fn ignore(care: &mut [bool], off: u64, len: u64) {
    care[off as usize..(off + len) as usize].fill(false);
}

/// Checks every byte the direction `d` touched. After a RETRY_EXC_ERR only what is
/// certain is checked exactly: ops before the failed one executed, in order; of the later
/// ops some prefix may have executed at the peer (its responder runs in PSN order), so
/// the bytes they cover are not compared, atomic words must equal the model after some
/// prefix of their ops, and nothing may be written outside any planned buffer.
fn verify_memory(
    pair: &Pair,
    d: &Dir,
    mine: &Regions,
    peer: &Regions,
    target_init: &[u8],
) -> Result<(), String> {
    let (mem, peer_mem) = (pair.mem(d.from), pair.mem(d.to));
    let p = &d.plan;
    let lo = d.executed();
    let who = format!("{} -> {}", d.from, d.to);
    let all = vec![true; SRC_LEN];
    compare(
        &format!("{who}: source buffer"),
        &mem.contents(&mine.src).unwrap(),
        &mine.src_bytes,
        &all,
    )?;

    // RDMA target: the model after the executed ops; later WRITEs' bytes are unknown.
    let mut target = target_init.to_vec();
    let mut care = vec![true; TARGET_LEN];
    for (i, op) in p.ops.iter().enumerate() {
        if op.kind.is_write() {
            if i < lo {
                target[op.remote as usize..op.remote as usize + op.len as usize]
                    .copy_from_slice(&op.data);
            } else {
                ignore(&mut care, op.remote, u64::from(op.len));
            }
        }
    }
    if lo == p.ops.len() && target != p.final_target {
        return Err(format!("{who}: test model inconsistent"));
    }
    compare(
        &format!("{who}: RDMA target"),
        &peer_mem.contents(&peer.target).unwrap(),
        &target,
        &care,
    )?;

    let mut read = vec![SENTINEL; p.read_len as usize];
    let mut read_care = vec![true; p.read_len as usize];
    let mut res = vec![SENTINEL; p.res_len as usize];
    let mut res_care = vec![true; p.res_len as usize];
    for (i, op) in p.ops.iter().enumerate() {
        if op.kind == Kind::Read {
            let mut at = 0usize;
            for &(o, l) in &op.dst {
                if i < lo {
                    read[o as usize..o as usize + l as usize]
                        .copy_from_slice(&op.data[at..at + l as usize]);
                } else {
                    ignore(&mut read_care, o, u64::from(l));
                }
                at += l as usize;
            }
        }
        if matches!(op.kind, Kind::FetchAdd | Kind::CmpSwap) {
            if i < lo {
                res[op.res as usize..op.res as usize + 8].copy_from_slice(&op.orig.to_ne_bytes());
            } else {
                ignore(&mut res_care, op.res, 8);
            }
        }
    }
    compare(
        &format!("{who}: READ results"),
        &mem.contents(&mine.read).unwrap(),
        &read,
        &read_care,
    )?;
    compare(
        &format!("{who}: atomic results"),
        &mem.contents(&mine.res).unwrap(),
        &res,
        &res_care,
    )?;

    let mut recv = vec![SENTINEL; p.recv_len as usize];
    let mut recv_care = vec![true; p.recv_len as usize];
    for (j, r) in p.recvs.iter().enumerate() {
        let mut at = 0usize;
        for &(o, l) in &r.pieces {
            if j < d.recvs_ok {
                let n = (l as usize).min(r.data.len().saturating_sub(at));
                recv[o as usize..o as usize + n].copy_from_slice(&r.data[at..at + n]);
                at += n;
            } else {
                ignore(&mut recv_care, o, u64::from(l));
            }
        }
    }
    compare(
        &format!("{who}: receive buffers"),
        &peer_mem.contents(&peer.recv).unwrap(),
        &recv,
        &recv_care,
    )?;

    // Atomic words: the value after exactly some prefix (at least the executed ops) of the
    // ops on that word, applied once each. Without failure that prefix is all of them:
    // a FETCH_ADD counter is its initial value plus the sum of every add.
    for w in 0..ATOMIC_WORDS as u64 {
        let word_ops: Vec<(usize, &Op)> = p
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o.kind, Kind::FetchAdd | Kind::CmpSwap) && o.remote == w)
            .collect();
        let got = peer_mem.read_u64(&peer.atomic, w * 8).unwrap();
        let mut value = p.init_words[w as usize];
        let mut ok = false;
        let min_prefix = word_ops.iter().filter(|(i, _)| *i < lo).count();
        for (k, (_, op)) in word_ops.iter().enumerate() {
            if k >= min_prefix && value == got {
                ok = true;
            }
            value = match op.kind {
                Kind::FetchAdd => value.wrapping_add(op.add_or_compare),
                _ if value == op.add_or_compare => op.swap,
                _ => value,
            };
        }
        if value == got {
            ok = true;
        }
        if lo == p.ops.len() {
            ok = got == value && value == p.final_words[w as usize];
        }
        if !ok {
            return Err(format!(
                "{who}: atomic word {w} is {got:#x}: not the result of {min_prefix}..={} of its {} ops applied once each",
                word_ops.len(),
                word_ops.len()
            ));
        }
        // The original values returned for executed FETCH_ADDs are distinct.
        if w < 4 {
            let mut origs: Vec<u64> = word_ops
                .iter()
                .filter(|(i, _)| *i < lo)
                .map(|(_, o)| mem.read_u64(&mine.res, o.res).unwrap())
                .collect();
            let n = origs.len();
            origs.sort_unstable();
            origs.dedup();
            if origs.len() != n {
                return Err(format!(
                    "{who}: counter {w}: FETCH_ADD original values repeat"
                ));
            }
        }
    }
    for (j, r) in p.recvs.iter().enumerate().take(d.recvs_ok) {
        if let Some(i) = r.inv {
            if peer_mem.is_valid(&peer.inv[i]).unwrap() {
                return Err(format!(
                    "{who}: receive {j} reported invalidating region {i}, which is valid"
                ));
            }
        }
    }
    Ok(())
}

fn level_link(loss: f64) -> LinkConfig {
    LinkConfig {
        loss,
        dup: loss,
        reorder: loss,
        corrupt: loss,
        delay: Duration::from_micros(2),
        jitter: Duration::from_micros(20),
    }
}

fn configs(rng: &mut ChaCha8Rng) -> (RcConfig, RcConfig) {
    let (mut a, mut b) = Pair::configs();
    let pmtu = [
        Pmtu::Mtu256,
        Pmtu::Mtu512,
        Pmtu::Mtu1024,
        Pmtu::Mtu2048,
        Pmtu::Mtu4096,
    ][rng.random_range(0..5)];
    let psn = |rng: &mut ChaCha8Rng| {
        if rng.random_bool(0.5) {
            Psn::new(0x00FF_FFFF - rng.random_range(0..300))
        } else {
            Psn::new(rng.random_range(0..=0x00FF_FFFF))
        }
    };
    let (pa, pb) = (psn(rng), psn(rng));
    for (c, sq, rq) in [(&mut a, pa, pb), (&mut b, pb, pa)] {
        c.pmtu = pmtu;
        c.sq_psn = sq;
        c.rq_psn = rq;
        c.timeout = rng.random_range(8..=12);
        c.min_rnr_timer = rng.random_range(1..=6);
        c.max_rd_atomic = rng.random_range(1..=16);
        c.max_dest_rd_atomic = 16;
    }
    (a, b)
}

/// One seed at one loss level.
fn run_case(level: f64, seed: u64, n_ops: usize) -> Result<Outcome, String> {
    let mut rng =
        ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ level.to_bits());
    let (ca, cb) = configs(&mut rng);
    let mut pair = Pair::with_configs(rng.random(), ca.clone(), cb);
    pair.net.set_trace_limit(4000);
    pair.set_links(level_link(level))
        .map_err(|e| e.to_string())?;
    let (a, b) = (pair.a, pair.b);

    // Contents first (the plans need them), then the plans, then the regions.
    let mut src_a = vec![0u8; SRC_LEN];
    let mut src_b = vec![0u8; SRC_LEN];
    let mut tgt_a = vec![0u8; TARGET_LEN];
    let mut tgt_b = vec![0u8; TARGET_LEN];
    for buf in [&mut src_a, &mut src_b, &mut tgt_a, &mut tgt_b] {
        rng.fill_bytes(buf);
    }
    // READ responses are not windowed: after a loss the requester asks again for the whole
    // rest, so at 10 % loss a READ costs O(packets²). Keep READs to 256 packets there
    // (64 KiB at PMTU 256, 1 MiB at PMTU 4096); elsewhere they go up to 4 MiB.
    let read_cap = if level >= 0.05 {
        256 * ca.pmtu.bytes()
    } else {
        u32::MAX
    };
    let plan_ab = plan(&mut rng, n_ops, &src_a, &tgt_b, read_cap);
    let plan_ba = plan(&mut rng, n_ops, &src_b, &tgt_a, read_cap);
    let ra = register_node(&pair, a, &plan_ab, &plan_ba, src_a, &tgt_a);
    let rb = register_node(&pair, b, &plan_ba, &plan_ab, src_b, &tgt_b);
    let payload: u64 = plan_ab.payload_bytes + plan_ba.payload_bytes;
    let mut dirs = [Dir::new(a, b, plan_ab), Dir::new(b, a, plan_ba)];
    // At 10 % loss (plus as much corruption) eight consecutive failed retries happen:
    // RETRY_EXC_ERR is then the correct outcome (IBA's retry_cnt 7 is finite).
    let allow_exhaustion = level >= 0.05;

    let mut steps = 0u64;
    loop {
        let now = pair.net.now();
        // Post what is due: receives (late ones cause RNR NAKs), then sends up to the
        // window.
        for d in &mut dirs {
            let (mine, peer) = if d.from == a { (&ra, &rb) } else { (&rb, &ra) };
            if d.recvs_posted == d.plan.recvs.len() {
                d.recv_due.clear();
            }
            while d.recv_due.front().is_some_and(|t| *t <= now)
                && d.recvs_posted < d.plan.recvs.len()
            {
                d.recv_due.pop_front();
                let j = d.recvs_posted;
                let wr = RecvWr::new(
                    (1 << 40) | j as u64,
                    sge_list(&peer.recv, &d.plan.recvs[j].pieces),
                );
                pair.post_recv(d.to, wr)
                    .map_err(|e| fail(&pair.net, format!("post_recv: {e}")))?;
                d.recvs_posted += 1;
            }
            if d.failed.is_some() || pair.qp(d.from).is_ok_and(|q| q.is_idle()) {
                d.done = d.posted;
            }
            while d.posted < d.plan.ops.len() && d.posted - d.done < d.plan.depth {
                let wr = build_wr(d.posted, &d.plan.ops[d.posted], mine, peer);
                pair.post_send(d.from, wr).map_err(|e| {
                    fail(
                        &pair.net,
                        format!("{}: post_send op {}: {e}", d.from, d.posted),
                    )
                })?;
                d.posted += 1;
            }
        }
        let done = dirs.iter().all(Dir::finished);
        if done && pair.net.is_quiet() {
            break;
        }
        steps += 1;
        if steps > MAX_STEPS || now.as_nanos() > MAX_VIRTUAL.as_nanos() as u64 {
            return Err(fail(
                &pair.net,
                format!("no progress: {steps} steps, virtual {} ns", now.as_nanos()),
            ));
        }
        let stepped = pair
            .net
            .step()
            .map_err(|e| fail(&pair.net, format!("simulation error: {e}")))?;
        // Check completions as they come (also those a final flush produced).
        let mut progressed = false;
        for k in 0..2 {
            let from = dirs[k].from;
            for (kind, wc) in pair.net.take_completions(from).map_err(|e| e.to_string())? {
                progressed = true;
                // Send completions of `from` belong to direction k; its receive
                // completions to the other direction.
                let (d, regions) = match kind {
                    CqKind::Send => (&mut dirs[k], if from == a { &ra } else { &rb }),
                    // RC QPs have no XRC SRQs.
                    CqKind::Recv | CqKind::XrcSrq(_) => {
                        (&mut dirs[1 - k], if from == a { &ra } else { &rb })
                    }
                };
                let r = match kind {
                    CqKind::Send => check_send_wc(d, &wc, allow_exhaustion),
                    CqKind::Recv | CqKind::XrcSrq(_) => {
                        let r = check_recv_wc(d, &wc, regions, allow_exhaustion);
                        if r.is_ok() {
                            let delay = rng.random_range(0..=200_000u64);
                            d.recv_due
                                .push_back(pair.net.now() + Duration::from_nanos(delay));
                        }
                        r
                    }
                };
                r.map_err(|e| fail(&pair.net, e))?;
            }
        }
        if !stepped && !progressed {
            // Nothing in flight, no timer, no new completion: only a receive WR due later
            // can help, or, when a sender failed, the application noticing it: it moves
            // the receiving QP to ERR, which flushes the receives nothing will consume.
            let due = dirs
                .iter()
                .filter_map(|d| d.recv_due.front().copied())
                .min();
            let orphaned = dirs.iter().find_map(|d| {
                let live = pair.qp(d.to).is_ok_and(|q| q.state() != QpState::Err);
                (d.failed.is_some() && live && d.recvs_done < d.plan.recvs.len()).then_some(d.to)
            });
            if due.is_none() {
                if let Some(qp) = orphaned {
                    pair.qp_mut(qp)
                        .map_err(|e| e.to_string())?
                        .set_state(QpState::Err);
                    continue;
                }
            }
            match due {
                Some(t) => {
                    pair.net
                        .advance(
                            Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())),
                            1,
                        )
                        .map_err(|e| fail(&pair.net, e.to_string()))?;
                }
                None => {
                    let mut what = String::from("stalled: nothing in flight, no timer, work left");
                    for d in &dirs {
                        let _ = write!(
                            what,
                            "\n  {} -> {}: posted {}/{}, next signalled completion at op {}, failed {:?}, receives posted {} done {} of {}",
                            d.from, d.to, d.posted, d.plan.ops.len(), d.next_send_wc, d.failed,
                            d.recvs_posted, d.recvs_done, d.plan.recvs.len()
                        );
                    }
                    for qp in [a, b] {
                        if let Ok(q) = pair.qp(qp) {
                            let _ = write!(
                                what,
                                "\n  {qp}: {:?} idle {} timer {:?}\n    {:?}",
                                q.state(),
                                q.is_idle(),
                                q.poll_timeout(),
                                q.counters()
                            );
                        }
                    }
                    return Err(fail(&pair.net, what));
                }
            }
        }
    }

    for d in &dirs {
        let (mine, peer) = if d.from == a { (&ra, &rb) } else { (&rb, &ra) };
        let target_init = if d.to == a { &tgt_a } else { &tgt_b };
        verify_memory(&pair, d, mine, peer, target_init).map_err(|e| fail(&pair.net, e))?;
    }
    let s = pair.net.stats();
    let (qa, qb) = (
        pair.qp(a).unwrap().counters().clone(),
        pair.qp(b).unwrap().counters().clone(),
    );
    // On a perfect link only RNR NAKs (late receive WRs) cause resends: no timeout, no
    // sequence NAK.
    if level == 0.0 && qa.timeouts + qb.timeouts + qa.seq_naks_sent + qb.seq_naks_sent > 0 {
        return Err(fail(
            &pair.net,
            format!("timeouts or sequence NAKs on a perfect link: {qa:?} {qb:?}"),
        ));
    }
    Ok(Outcome {
        ops: 2 * n_ops,
        bytes: payload,
        packets: s.transmitted,
        virtual_nanos: s.now_nanos,
        retransmitted: qa.retransmitted_packets + qb.retransmitted_packets,
        rnr_naks: qa.rnr_naks_sent + qb.rnr_naks_sent,
        seq_naks: qa.seq_naks_sent + qb.seq_naks_sent,
        timeouts: qa.timeouts + qb.timeouts,
        icrc_drops: s.icrc,
        exhausted: dirs.iter().filter(|d| d.failed.is_some()).count(),
    })
}

fn soak(name: &str, level: f64) {
    let seeds: Vec<u64> = match env_u64("UROCE_SOAK_SEED") {
        Some(s) => vec![s],
        None => (0..env_u64("UROCE_SOAK_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
    };
    let n_ops = env_u64("UROCE_SOAK_OPS").map_or(DEFAULT_OPS, |n| n as usize);
    let start = WallClock::now();
    let mut failures = Vec::new();
    let mut total = Outcome {
        ops: 0,
        bytes: 0,
        packets: 0,
        virtual_nanos: 0,
        retransmitted: 0,
        rnr_naks: 0,
        seq_naks: 0,
        timeouts: 0,
        icrc_drops: 0,
        exhausted: 0,
    };
    for &seed in &seeds {
        match run_case(level, seed, n_ops) {
            Ok(o) => {
                total.ops += o.ops;
                total.bytes += o.bytes;
                total.packets += o.packets;
                total.virtual_nanos += o.virtual_nanos;
                total.retransmitted += o.retransmitted;
                total.rnr_naks += o.rnr_naks;
                total.seq_naks += o.seq_naks;
                total.timeouts += o.timeouts;
                total.icrc_drops += o.icrc_drops;
                total.exhausted += o.exhausted;
            }
            Err(e) => {
                eprintln!(
                    "soak {name} FAILED for seed {seed}: replay with UROCE_SOAK_SEED={seed} cargo test -p uroce-sim --test soak {name}\n{e}\n"
                );
                failures.push(seed);
            }
        }
    }
    let mut line = String::new();
    let _ = write!(
        line,
        "soak {name}: {} seeds, {} ops, {:.1} MiB payload, {} packets ({} retransmitted, {} timeouts, {} seq NAKs, {} RNR NAKs, {} ICRC drops), {} directions ended in RETRY_EXC_ERR, {:.3} s virtual, {:.2} s wall",
        seeds.len(),
        total.ops,
        total.bytes as f64 / (1 << 20) as f64,
        total.packets,
        total.retransmitted,
        total.timeouts,
        total.seq_naks,
        total.rnr_naks,
        total.icrc_drops,
        total.exhausted,
        total.virtual_nanos as f64 / 1e9,
        start.elapsed().as_secs_f64()
    );
    println!("{line}");
    assert!(
        failures.is_empty(),
        "soak {name}: failing seeds {failures:?} (see stderr)"
    );
    // RETRY_EXC_ERR is tolerated at 10 % loss because eight failed retries in a row do
    // happen there (about 4.5 % of directions over 200 seeds). A bug that stalls
    // recovery would end (nearly) every direction that way: more than a quarter fails.
    let directions = 2 * seeds.len();
    assert!(
        seeds.len() < 10 || 4 * total.exhausted <= directions,
        "soak {name}: {} of {directions} directions ended in RETRY_EXC_ERR",
        total.exhausted
    );
}

#[test]
fn soak_loss_0() {
    soak("soak_loss_0", 0.0);
}

#[test]
fn soak_loss_1() {
    soak("soak_loss_1", 0.01);
}

#[test]
fn soak_loss_10() {
    soak("soak_loss_10", 0.10);
}
