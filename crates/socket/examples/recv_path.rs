//! The socket layer's receive path alone, over loopback: per packet, the time of
//! `recv_batch` + `RecvBatch::iter` (the packet parsed by the check and again by `iter`)
//! against `recv_batch_with` (parsed once, handed to a visitor), for 32-packet batches of
//! a 4 KiB RDMA WRITE MIDDLE and an 8-byte SEND ONLY. Alternates the two paths round by
//! round and prints the minimum, 10th percentile and median of each (ns per packet).
//!
//! `cargo run --release -p uroce-socket --example recv_path [ROUNDS]`

use std::hint::black_box;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce_socket::{OutPacket, RecvBatch, RoceSocket};
use uroce_wire::opcode::op;
use uroce_wire::{bth, PacketRepr, Psn};

const BATCH: usize = 32;
const BATCHES: usize = 2000;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let ip: IpAddr = "127.0.0.1".parse().expect("ip");
    let mut tx = RoceSocket::bind_port(ip, 0).expect("bind");
    let mut rx = RoceSocket::bind_port(ip, 0).expect("bind");
    let dst = rx.local_addr();
    // Slots below the GRO size: one datagram per packet, as without coalescing.
    let mut batch = RecvBatch::new(BATCH, 8192).expect("batch");
    for (name, opcode, len) in [
        (
            "RC_RDMA_WRITE_MIDDLE 4096 B",
            op::RC_RDMA_WRITE_MIDDLE,
            4096usize,
        ),
        ("RC_SEND_ONLY 8 B", op::RC_SEND_ONLY, 8),
    ] {
        let payload = vec![7u8; len];
        let bufs: Vec<Vec<u8>> = (0..BATCH as u32)
            .map(|i| {
                let b = bth::Repr {
                    opcode,
                    solicited: false,
                    mig_req: false,
                    pad_cnt: 0,
                    pkey: 0xFFFF,
                    fecn: false,
                    becn: false,
                    dest_qp: 0x12,
                    ack_req: false,
                    psn: Psn::new(i),
                };
                let p = PacketRepr::new(b, &payload[..]);
                let mut buf = vec![0u8; p.buffer_len()];
                p.emit(&mut buf).expect("emit");
                tx.seal(dst, &mut buf).expect("seal");
                buf
            })
            .collect();
        let out: Vec<OutPacket<'_>> = bufs.iter().map(|b| OutPacket { dst, roce: b }).collect();
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..rounds {
            for (path, t) in times.iter_mut().enumerate() {
                for _ in 0..BATCHES {
                    let mut sent = 0;
                    // Bounded: a full socket buffer is waited for at most 1000 times.
                    for _ in 0..1000 {
                        if sent == BATCH {
                            break;
                        }
                        sent += tx.send_batch(&out[sent..]).expect("send");
                    }
                    let (mut got, mut spent) = (0, Duration::ZERO);
                    for _ in 0..1000 {
                        if got >= BATCH {
                            break;
                        }
                        let _ = rx.wait_readable(Some(Duration::from_millis(10)));
                        let start = Instant::now();
                        let mut sum = 0u32;
                        let n = if path == 0 {
                            let n = rx.recv_batch(&mut batch).expect("recv");
                            for r in batch.iter() {
                                sum = sum.wrapping_add(r.packet.bth.psn.value());
                            }
                            n
                        } else {
                            rx.recv_batch_with(&mut batch, |r| {
                                sum = sum.wrapping_add(r.packet.bth.psn.value());
                            })
                            .expect("recv")
                        };
                        black_box(sum);
                        spent += start.elapsed();
                        got += n;
                    }
                    if got == BATCH {
                        t.push(spent.as_nanos() as f64 / BATCH as f64);
                    }
                }
            }
        }
        for (path, t) in times.iter_mut().enumerate() {
            t.sort_by(f64::total_cmp);
            let q = |f: f64| t.get(((t.len().max(1) - 1) as f64 * f) as usize).copied();
            let label = if path == 0 {
                "recv_batch + iter (parsed twice)"
            } else {
                "recv_batch_with (parsed once)   "
            };
            println!(
                "{name}: {label}: n={} min {:.0} p10 {:.0} median {:.0} ns/packet",
                t.len(),
                q(0.0).unwrap_or(f64::NAN),
                q(0.1).unwrap_or(f64::NAN),
                q(0.5).unwrap_or(f64::NAN),
            );
        }
    }
}
