//! Throughput probe for packet trains: one thread sends 1 MiB trains of RoCEv2 packets
//! (256 RDMA WRITE MIDDLE packets of 4096 payload bytes) from 127.0.0.1 to a socket on
//! 127.0.0.2 that another thread drains, for a few seconds per mode:
//!
//! * `gso+gro`: [`RoceSocket::send_train`] with segmentation offload, receiver coalescing;
//! * `gso`: the same, receiver without coalescing;
//! * `packets+gro` / `packets`: packet by packet (one datagram per packet, `sendmmsg` of
//!   64), receiver with / without coalescing.
//!
//! ```text
//! cargo run --release -p uroce-net --example train_bw [-- SECONDS_PER_MODE [MODE...]]
//! ```
//!
//! It prints, per mode, the payload rate at the receiver (GB/s = 1e9 bytes/s of RDMA
//! payload, from its first to its last packet), the packet rate, and how many packets were
//! lost (sent but not received: the receive buffer overflowed). Like an RC sender, the
//! sender keeps at most a window of packets (default 512, 2 MiB; `UROCE_BW_WINDOW`, 0 =
//! no limit) in flight, learning what arrived from a counter the receiver publishes. Every
//! received packet is ICRC-checked (Strict) and parsed by the receiving socket, as in real
//! use; the sender seals every packet. Loopback only; every loop is bounded by the time
//! limit.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uroce_net::{RecvBatch, RoceSocket};
use uroce_wire::opcode::op;
use uroce_wire::{bth, PacketRepr, Psn};

/// RDMA payload per packet.
const PAYLOAD: usize = 4096;
/// Packets per train (1 MiB of payload).
const TRAIN: usize = 256;

/// One mode of the probe.
#[derive(Debug, Clone, Copy)]
struct Mode {
    name: &'static str,
    gso: bool,
    gro: bool,
}

const MODES: [Mode; 4] = [
    Mode {
        name: "gso+gro",
        gso: true,
        gro: true,
    },
    Mode {
        name: "gso",
        gso: true,
        gro: false,
    },
    Mode {
        name: "packets+gro",
        gso: false,
        gro: true,
    },
    Mode {
        name: "packets",
        gso: false,
        gro: false,
    },
];

/// A 1 MiB train; returns it and the packet length.
fn build_train() -> (Vec<u8>, usize) {
    let payload: Vec<u8> = (0..PAYLOAD).map(|i| (i * 7 + 3) as u8).collect();
    let mut out = Vec::new();
    let mut len = 0;
    for i in 0..TRAIN {
        let repr = PacketRepr {
            bth: bth::Repr {
                opcode: op::RC_RDMA_WRITE_MIDDLE,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: 0x11,
                ack_req: false,
                psn: Psn::new(i as u32),
            },
            xrceth: None,
            deth: None,
            feth: None,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload: &payload,
        };
        len = repr.buffer_len();
        let start = out.len();
        out.resize(start + len, 0);
        if let Err(e) = repr.emit(&mut out[start..]) {
            panic!("cannot build the train: {e}");
        }
    }
    (out, len)
}

/// What one mode measured.
struct Result {
    sent: u64,
    received: u64,
    rx_time: Duration,
    tx_calls: u64,
}

fn run_mode(mode: Mode, secs: f64, window: u64) -> std::result::Result<Result, String> {
    let lo = |last| IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
    let mut rx = RoceSocket::bind_port(lo(2), 0).map_err(|e| e.to_string())?;
    let mut tx = RoceSocket::bind_port(lo(1), 0).map_err(|e| e.to_string())?;
    tx.set_gso(mode.gso);
    rx.set_gro(mode.gro);
    let dst: SocketAddr = rx.local_addr();
    let done = Arc::new(AtomicBool::new(false));
    let done_rx = Arc::clone(&done);
    let arrived = Arc::new(AtomicU64::new(0));
    let arrived_rx = Arc::clone(&arrived);

    let receiver = std::thread::spawn(move || {
        // UROCE_BW_SLOTS: receive slots (of 64 KiB) instead of the default batch.
        let mut batch = match std::env::var("UROCE_BW_SLOTS").map(|s| s.parse::<usize>()) {
            Ok(Ok(slots)) => match RecvBatch::new(slots, RecvBatch::GRO_SLOT_LEN) {
                Ok(b) => b,
                Err(e) => panic!("UROCE_BW_SLOTS: {e}"),
            },
            _ => RecvBatch::default(),
        };
        let mut received = 0u64;
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        let mut quiet_since: Option<Instant> = None;
        // Bounded: stops 200 ms after the sender finished and nothing more arrived, or
        // 60 s at most.
        let limit = Instant::now() + Duration::from_secs(60);
        while Instant::now() < limit {
            let n = match rx.recv_batch(&mut batch) {
                Ok(n) => n,
                Err(e) => panic!("recv_batch: {e}"),
            };
            if n > 0 {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                received += batch.iter().count() as u64;
                arrived_rx.store(received, Ordering::Release);
                quiet_since = None;
                continue;
            }
            if done_rx.load(Ordering::Acquire) {
                let q = *quiet_since.get_or_insert_with(Instant::now);
                if q.elapsed() > Duration::from_millis(200) {
                    break;
                }
            }
            let _ = rx.wait_readable(Some(Duration::from_millis(5)));
        }
        let rx_time = first.map(|f| last - f).unwrap_or_default();
        (received, rx_time, rx.counters())
    });

    let (mut train, seg) = build_train();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    let mut tx_calls = 0u64;
    while Instant::now() < end {
        let mut at = 0;
        // One train; bounded by the time limit as well.
        while at < TRAIN && Instant::now() < end + Duration::from_secs(5) {
            if window > 0 && sent + at as u64 > arrived.load(Ordering::Acquire) + window {
                // Window full: wait for the receiver (bounded by the time limit).
                std::thread::yield_now();
                continue;
            }
            let n = tx
                .send_train(dst, &mut train[at * seg..], seg)
                .map_err(|e| e.to_string())?;
            tx_calls += 1;
            at += n;
            if at < TRAIN {
                let _ = tx.wait_writable(Some(Duration::from_millis(5)));
            }
        }
        sent += at as u64;
    }
    done.store(true, Ordering::Release);
    let (received, rx_time, rx_counters) = receiver
        .join()
        .map_err(|_| "receiver thread panicked".to_string())?;
    if rx_counters.bad_icrc + rx_counters.parse_errors + rx_counters.truncated > 0 {
        return Err(format!("receiver dropped packets as bad: {rx_counters:?}"));
    }
    Ok(Result {
        sent,
        received,
        rx_time,
        tx_calls,
    })
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let secs: f64 = match args.next().map(|s| s.parse()) {
        None => 2.0,
        Some(Ok(s)) if (0.1..=60.0).contains(&s) => s,
        Some(_) => {
            eprintln!("usage: train_bw [SECONDS_PER_MODE (0.1..=60) [MODE...]]");
            return ExitCode::FAILURE;
        }
    };
    let wanted: Vec<String> = args.collect();
    let window = match std::env::var("UROCE_BW_WINDOW").map(|w| w.parse::<u64>()) {
        Err(_) => 512,
        Ok(Ok(w)) => w,
        Ok(Err(_)) => {
            eprintln!("UROCE_BW_WINDOW must be a number of packets");
            return ExitCode::FAILURE;
        }
    };
    for mode in MODES {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == mode.name) {
            continue;
        }
        match run_mode(mode, secs, window) {
            Ok(r) => {
                let t = r.rx_time.as_secs_f64().max(1e-9);
                let gbps = r.received as f64 * PAYLOAD as f64 / t / 1e9;
                println!(
                    "RESULT mode={} payload_gbps={:.2} mpps={:.3} sent={} received={} lost={} \
                     packets_per_call={:.1}",
                    mode.name,
                    gbps,
                    r.received as f64 / t / 1e6,
                    r.sent,
                    r.received,
                    r.sent.saturating_sub(r.received),
                    r.sent as f64 / r.tx_calls.max(1) as f64,
                );
            }
            Err(e) => {
                eprintln!("mode {}: {e}", mode.name);
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
