//! Randomized soak of the UC engine on the simulated network.
//!
//! For every seed, QP A sends QP B a random mix of SEND, SEND_WITH_IMM, RDMA WRITE and
//! WRITE_WITH_IMM (0 B to 16 KiB, skewed towards small, one or two SGEs or inline data)
//! over a link with the loss level of the test (0 %, 1 %, 10 %; at 1 % and 10 % with as
//! much duplication, reordering and bit corruption). Path MTU and first PSN (often just
//! before the 24-bit wrap) vary per seed. UC never retransmits, so messages are lost; what
//! must hold is that a message is lost *whole*.
//!
//! What is checked, from a model of what was sent (not from the engine):
//! * every signalled send WR completes exactly once, in posting order, SUCCESS, with its
//!   opcode and length (UC completes when the last packet leaves, lost or not);
//! * receive WQEs are consumed strictly in posting order (wr_id 0, 1, 2, …): a discarded
//!   message never uses one up, so the WQE it would have used takes the next message;
//! * every receive completion is a message that was sent, matched in sending order (no
//!   message twice, none out of order), with its opcode, immediate and length, and its
//!   receive buffer (SEND) or target slot (WRITE_WITH_IMM) holds exactly its bytes;
//! * every byte of every RDMA WRITE slot is either the sentinel or the byte of the one
//!   WRITE aimed at that slot: nothing foreign, nothing shifted;
//! * with a perfect link, every message arrives and nothing is dropped; with duplication
//!   only (no loss, no reordering), too.
//!
//! Environment: `UROCE_UC_SOAK_SEEDS=<n>` seeds per level (default [`DEFAULT_SEEDS`]),
//! `UROCE_UC_SOAK_SEED=<n>` runs only seed `n` (replay), `UROCE_UC_SOAK_OPS=<n>` messages
//! per seed (default [`DEFAULT_OPS`]). A failure prints its seed and the trace tail.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use uroce_proto::engine::Engine;
use uroce_proto::qp_state::QpState;
use uroce_proto::rc::CqKind;
use uroce_proto::uc::{UcConfig, UcQp};
use uroce_proto::wr::{
    RecvWr, SendFlags, SendOpcode, SendPayload, SendWr, WcFlags, WcOpcode, WcStatus,
};
use uroce_sim::{Access, LinkConfig, SimNet};
use uroce_wire::{Pmtu, Psn};

const DEFAULT_SEEDS: u64 = 24;
const DEFAULT_OPS: usize = 80;
/// Largest message; every message, receive buffer and WRITE slot has this much room.
const MAX_LEN: usize = 16 * 1024;
const SENTINEL: u8 = 0xA5;
const QPN_A: u32 = 0x51;
const QPN_B: u32 = 0x62;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
}

#[derive(Debug)]
struct Msg {
    kind: Kind,
    data: Vec<u8>,
    imm: u32,
    signaled: bool,
}

/// Deterministic bytes, independent of the engine.
fn bytes(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn random_len(rng: &mut ChaCha8Rng) -> usize {
    match rng.random_range(0..10) {
        0 => 0,
        1..=5 => rng.random_range(1..=300),
        6..=8 => rng.random_range(1..=4096),
        _ => rng.random_range(1..=MAX_LEN),
    }
}

struct Outcome {
    sent: usize,
    delivered: usize,
    packets: u64,
    messages_dropped: u64,
}

fn run_case(level: f64, dup_only: bool, seed: u64, n_ops: usize) -> Result<Outcome, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0055_4353_4f41_4b00);
    let pmtu = [Pmtu::Mtu256, Pmtu::Mtu512, Pmtu::Mtu1024, Pmtu::Mtu4096][rng.random_range(0..4)];
    let psn0 = if rng.random_bool(0.5) {
        0x00ff_ffff - rng.random_range(0..64u32)
    } else {
        rng.random_range(0..0x0100_0000u32)
    };
    let mut net: SimNet<UcQp> = SimNet::new(seed);
    let n0 = net.add_node().map_err(|e| e.to_string())?;
    let n1 = net.add_node().map_err(|e| e.to_string())?;
    let mut ca = UcConfig::new(QPN_A, QPN_B, net.addr(n1).map_err(|e| e.to_string())?);
    let mut cb = UcConfig::new(QPN_B, QPN_A, net.addr(n0).map_err(|e| e.to_string())?);
    ca.pmtu = pmtu;
    cb.pmtu = pmtu;
    ca.sq_psn = Psn::new(psn0);
    cb.rq_psn = Psn::new(psn0);
    ca.max_send_wr = 4 * n_ops as u32;
    cb.max_recv_wr = 4 * n_ops as u32;
    let a = net
        .add_qp(n0, n1, UcQp::new(ca))
        .map_err(|e| e.to_string())?;
    let b = net
        .add_qp(n1, n0, UcQp::new(cb))
        .map_err(|e| e.to_string())?;
    let link = if dup_only {
        LinkConfig {
            dup: 0.05,
            ..LinkConfig::with_delay(Duration::from_micros(5))
        }
    } else {
        LinkConfig {
            loss: level,
            dup: level,
            reorder: level,
            corrupt: level,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(20),
        }
    };
    net.set_links(n0, n1, link).map_err(|e| e.to_string())?;

    let n = n_ops;
    let mem_a = net.memory(n0).map_err(|e| e.to_string())?;
    let src = mem_a.register(n * MAX_LEN, Access::LOCAL_WRITE);
    let mem_b = net.memory(n1).map_err(|e| e.to_string())?;
    let rbuf = mem_b.register(n * MAX_LEN, Access::LOCAL_WRITE);
    let tgt = mem_b.register(n * MAX_LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    mem_b.fill(&rbuf, SENTINEL).map_err(|e| e.to_string())?;
    mem_b.fill(&tgt, SENTINEL).map_err(|e| e.to_string())?;

    // The messages, posted in a few batches with the network running in between.
    let mut msgs: Vec<Msg> = Vec::with_capacity(n);
    let mut posted_recvs = 0u64;
    while msgs.len() < n {
        let batch = rng.random_range(1..=16).min(n - msgs.len());
        for _ in 0..batch {
            let i = msgs.len();
            let kind =
                [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm][rng.random_range(0..4)];
            let len = random_len(&mut rng);
            let data = bytes(&mut rng, len);
            let off = (i * MAX_LEN) as u64;
            let mem_a = net.memory(n0).map_err(|e| e.to_string())?;
            mem_a.write(&src, off, &data).map_err(|e| e.to_string())?;
            let opcode = match kind {
                Kind::Send => SendOpcode::Send,
                Kind::SendImm => SendOpcode::SendWithImm,
                Kind::Write => SendOpcode::RdmaWrite,
                Kind::WriteImm => SendOpcode::RdmaWriteWithImm,
            };
            let sges = if len > 1 && rng.random_bool(0.3) {
                let cut = rng.random_range(1..len);
                vec![
                    src.sge(off, cut as u32),
                    src.sge(off + cut as u64, (len - cut) as u32),
                ]
            } else {
                vec![src.sge(off, len as u32)]
            };
            let mut wr = SendWr::new(i as u64, opcode, sges);
            if len <= 256 && rng.random_bool(0.3) {
                wr.payload = SendPayload::Inline(data[..].into());
                wr.flags |= SendFlags::INLINE;
            }
            let signaled = rng.random_bool(0.7);
            if signaled {
                wr.flags |= SendFlags::SIGNALED;
            }
            let imm = rng.random::<u32>();
            wr.imm_data = imm;
            wr.remote_addr = tgt.va(off);
            wr.rkey = tgt.rkey;
            Engine::post_send(net.qp_mut(a).map_err(|e| e.to_string())?, wr)
                .map_err(|e| format!("post_send {i}: {e}"))?;
            if matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm) {
                // One receive WQE per WQE-consuming message, each with its own buffer.
                let r = posted_recvs;
                let wr = RecvWr::new(r, vec![rbuf.sge(r * MAX_LEN as u64, MAX_LEN as u32)]);
                Engine::post_recv(net.qp_mut(b).map_err(|e| e.to_string())?, wr)
                    .map_err(|e| format!("post_recv {r}: {e}"))?;
                posted_recvs += 1;
            }
            msgs.push(Msg {
                kind,
                data,
                imm,
                signaled,
            });
        }
        let d = Duration::from_micros(rng.random_range(0..50));
        net.advance(d, 1_000_000).map_err(|e| e.to_string())?;
    }
    net.run_until_quiet(10_000_000, Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    let trace_tail = || net.trace().tail(40);

    // Sender: every signalled WR once, in order, SUCCESS.
    let sc: Vec<_> = net.completions(a).map_err(|e| e.to_string())?.to_vec();
    let expected: Vec<u64> = (0..n as u64)
        .filter(|&i| msgs[i as usize].signaled)
        .collect();
    let got: Vec<u64> = sc.iter().map(|(_, wc)| wc.wr_id).collect();
    if got != expected {
        return Err(format!("send completions {got:?}, expected {expected:?}"));
    }
    for (k, wc) in &sc {
        let m = &msgs[wc.wr_id as usize];
        let op = match m.kind {
            Kind::Send | Kind::SendImm => WcOpcode::Send,
            Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
        };
        if *k != CqKind::Send
            || wc.status != WcStatus::Success
            || wc.opcode != op
            || wc.byte_len as usize != m.data.len()
        {
            return Err(format!("bad send completion {wc:?} for {:?}", m.kind));
        }
    }

    // Receiver: WQEs in posting order, each a sent message, in sending order, intact.
    let rc: Vec<_> = net.completions(b).map_err(|e| e.to_string())?.to_vec();
    let mem_b = net.memory(n1).map_err(|e| e.to_string())?;
    let mut next_msg = 0usize;
    for (r, (k, wc)) in rc.iter().enumerate() {
        if *k != CqKind::Recv || wc.status != WcStatus::Success || wc.wr_id != r as u64 {
            return Err(format!(
                "receive completion {r}: {wc:?}, expected wr_id {r} SUCCESS\n{}",
                trace_tail()
            ));
        }
        let buf = mem_b
            .read(&rbuf, r as u64 * MAX_LEN as u64, wc.byte_len as usize)
            .map_err(|e| e.to_string())?;
        // The first later message this completion can be.
        let found = (next_msg..n).find(|&j| {
            let m = &msgs[j];
            match m.kind {
                Kind::Send | Kind::SendImm => {
                    wc.opcode == WcOpcode::Recv
                        && wc.byte_len as usize == m.data.len()
                        && wc.wc_flags.contains(WcFlags::WITH_IMM) == (m.kind == Kind::SendImm)
                        && (m.kind == Kind::Send || wc.imm_data == m.imm)
                        && buf == m.data
                }
                Kind::WriteImm => {
                    wc.opcode == WcOpcode::RecvRdmaWithImm
                        && wc.wc_flags.contains(WcFlags::WITH_IMM)
                        && wc.imm_data == m.imm
                        && wc.byte_len as usize == m.data.len()
                }
                Kind::Write => false,
            }
        });
        let Some(j) = found else {
            return Err(format!(
                "receive completion {r} ({wc:?}) matches no message sent after #{next_msg}\n{}",
                trace_tail()
            ));
        };
        if msgs[j].kind == Kind::WriteImm {
            let slot = mem_b
                .read(&tgt, (j * MAX_LEN) as u64, msgs[j].data.len())
                .map_err(|e| e.to_string())?;
            if slot != msgs[j].data {
                return Err(format!(
                    "WRITE_WITH_IMM #{j} completed but its data differs"
                ));
            }
        }
        next_msg = j + 1;
    }
    let delivered_recv = rc.len();

    // WRITE slots: each byte the sentinel or the right byte of that slot's WRITE.
    let tgt_all = mem_b.contents(&tgt).map_err(|e| e.to_string())?;
    for (j, m) in msgs.iter().enumerate() {
        let slot = &tgt_all[j * MAX_LEN..(j + 1) * MAX_LEN];
        let is_write = matches!(m.kind, Kind::Write | Kind::WriteImm);
        for (o, &byte) in slot.iter().enumerate() {
            let ok = byte == SENTINEL || (is_write && o < m.data.len() && byte == m.data[o]);
            if !ok {
                return Err(format!(
                    "WRITE slot #{j} byte {o} is {byte:#x}: foreign data"
                ));
            }
        }
    }

    let qb = net.qp(b).map_err(|e| e.to_string())?;
    let cb = Engine::counters(qb);
    if Engine::state(qb) != QpState::Rts
        || Engine::state(net.qp(a).map_err(|e| e.to_string())?) != QpState::Rts
    {
        return Err("a QP left RTS".into());
    }
    let recv_msgs = msgs.iter().filter(|m| m.kind != Kind::Write).count();
    if level == 0.0 {
        // Nothing may be lost on a perfect link (or one that only duplicates).
        if delivered_recv != recv_msgs || cb.messages_dropped != 0 {
            return Err(format!(
                "perfect link: {delivered_recv} of {recv_msgs} messages received, counters {cb:?}"
            ));
        }
        for (j, m) in msgs.iter().enumerate() {
            if m.kind == Kind::Write {
                let slot = &tgt_all[j * MAX_LEN..j * MAX_LEN + m.data.len()];
                if slot != m.data.as_slice() {
                    return Err(format!("perfect link: WRITE #{j} not placed"));
                }
            }
        }
        if !dup_only && cb.dropped_packets != 0 {
            return Err(format!("perfect link: drops {cb:?}"));
        }
    }
    let s = net.stats();
    Ok(Outcome {
        sent: n,
        delivered: delivered_recv,
        packets: s.transmitted,
        messages_dropped: cb.messages_dropped,
    })
}

fn soak(name: &str, level: f64, dup_only: bool) {
    let seeds: Vec<u64> = match env_u64("UROCE_UC_SOAK_SEED") {
        Some(s) => vec![s],
        None => (0..env_u64("UROCE_UC_SOAK_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
    };
    let n_ops = env_u64("UROCE_UC_SOAK_OPS").map_or(DEFAULT_OPS, |n| n as usize);
    let mut failures = Vec::new();
    let (mut sent, mut delivered, mut packets, mut dropped) = (0, 0, 0, 0);
    for &seed in &seeds {
        match run_case(level, dup_only, seed, n_ops) {
            Ok(o) => {
                sent += o.sent;
                delivered += o.delivered;
                packets += o.packets;
                dropped += o.messages_dropped;
            }
            Err(e) => {
                eprintln!(
                    "{name} FAILED for seed {seed}: replay with UROCE_UC_SOAK_SEED={seed} cargo test -p uroce-sim --test uc_soak {name}\n{e}\n"
                );
                failures.push(seed);
            }
        }
    }
    println!(
        "{name}: {} seeds, {sent} messages, {delivered} receive completions, {dropped} messages discarded part-way, {packets} packets",
        seeds.len()
    );
    assert!(
        failures.is_empty(),
        "{name}: failing seeds {failures:?} (see stderr)"
    );
}

#[test]
fn uc_soak_loss_0() {
    soak("uc_soak_loss_0", 0.0, false);
}

#[test]
fn uc_soak_dup_only() {
    soak("uc_soak_dup_only", 0.0, true);
}

#[test]
fn uc_soak_loss_1() {
    soak("uc_soak_loss_1", 0.01, false);
}

#[test]
fn uc_soak_loss_10() {
    soak("uc_soak_loss_10", 0.10, false);
}
