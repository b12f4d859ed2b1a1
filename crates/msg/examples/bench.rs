//! Message rate and bandwidth of uroce-msg against raw verbs SEND on the same devices in
//! the same run, with the messaging layer's payload copies per message (instrumented).
//!
//! ```sh
//! cargo run --release -p uroce-msg --example bench            # 64 B, 4 KiB, 64 KiB
//! cargo run --release -p uroce-msg --example bench -- 64 1    # one size, seconds per run
//! ```
//!
//! Two devices in one process (127.0.12.1 → 127.0.12.2), one RC QP each way, a sender and
//! a receiver thread. *raw verbs SEND*: 64 receives posted, the sender keeps 64 SENDs of
//! one registered buffer outstanding, the receiver polls and reposts (the least work a
//! verbs program can do; it neither writes nor reads payload). *msg zero-copy*: the
//! sender takes a pool buffer, writes an 8-byte sequence number in place and sends it;
//! the receiver reads that number in place and drops the message (its buffer is
//! reposted). *msg copy*: `send_bytes` of a `Vec` and `Message::to_vec` on receipt.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use uroce_msg::{stats, Endpoint, MsgConfig, PendingEndpoint, SendPool};
use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, QpCap, QpInitAttr, QpType, RcConnect, RecvWr, SendWr, Sge, WcStatus,
};
use uroce_wire::pmtu::Pmtu;

const WINDOW: u32 = 64;
const RUNS: usize = 3;

fn device(addr: &str) -> NetDevice {
    let mut cfg = NetConfig::new(addr.parse::<IpAddr>().expect("addr"));
    cfg.faults = None;
    NetDevice::open(cfg).expect("device")
}

struct Result {
    msgs: u64,
    secs: f64,
}

impl Result {
    fn rate(&self) -> f64 {
        self.msgs as f64 / self.secs
    }
}

fn raw(size: usize, dur: Duration) -> Result {
    let (da, db) = (device("127.0.12.1"), device("127.0.12.2"));
    let cap = QpCap {
        max_send_wr: WINDOW,
        max_recv_wr: WINDOW,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mk = |d: &NetDevice| {
        let pd = d.context().alloc_pd().expect("pd");
        let cq: Cq = d.context().create_cq(1024, None, 0).expect("cq");
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
            .expect("qp");
        let mr = pd
            .reg_mr(
                MemBlock::new(size * WINDOW as usize).expect("block"),
                AccessFlags::LOCAL_WRITE,
            )
            .expect("mr");
        (pd, cq, qp, mr)
    };
    let (a, b) = (mk(&da), mk(&db));
    for (me, peer, dev) in [(&a, &b, &db), (&b, &a, &da)] {
        let c = RcConnect {
            path_mtu: Pmtu::Mtu4096,
            timeout: 12,
            ..RcConnect::new(dev.local_addr().ip(), peer.2.qp_num())
        };
        me.2.connect_rc(&c).expect("connect");
    }
    let sge = |mr: &uroce_verbs::Mr, i: u64| Sge {
        addr: mr.iova() + i * size as u64,
        length: size as u32,
        lkey: mr.lkey(),
    };
    for i in 0..u64::from(WINDOW) {
        b.2.post_recv(RecvWr::new(i, vec![sge(&b.3, i)]))
            .expect("recv");
    }
    let stop = AtomicBool::new(false);
    let received = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for wc in b.1.poll(32) {
                    assert_eq!(wc.status, WcStatus::Success);
                    received.fetch_add(1, Ordering::Relaxed);
                    b.2.post_recv(RecvWr::new(wc.wr_id, vec![sge(&b.3, wc.wr_id)]))
                        .expect("repost");
                }
            }
        });
        let mut outstanding = 0u32;
        let mut sent = 0u64;
        while start.elapsed() < dur {
            // The receiver reposts as it goes; never more outstanding than its window.
            while outstanding < WINDOW / 2
                && sent < received.load(Ordering::Relaxed) + u64::from(WINDOW)
            {
                a.2.post_send(SendWr::send(sent, vec![sge(&a.3, 0)]))
                    .expect("send");
                outstanding += 1;
                sent += 1;
            }
            for wc in a.1.poll(32) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                outstanding -= 1;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while received.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
            let _ = a.1.poll(32);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let secs = start.elapsed().as_secs_f64();
    Result {
        msgs: received.load(Ordering::Relaxed),
        secs,
    }
}

fn msg_pair(size: usize) -> (Endpoint, Endpoint, Vec<NetDevice>) {
    let (da, db) = (device("127.0.12.3"), device("127.0.12.4"));
    let cfg = MsgConfig {
        recv_bufs: WINDOW,
        recv_buf_size: size.max(8),
        ..MsgConfig::default()
    };
    let mk = |d: &NetDevice| {
        let pd = d.context().alloc_pd().expect("pd");
        let pool = SendPool::new(&pd, WINDOW as usize, size.max(8)).expect("pool");
        PendingEndpoint::new(d.context(), &pd, &pool, &cfg).expect("endpoint")
    };
    let (pa, pb) = (mk(&da), mk(&db));
    let (ia, ib) = (pa.info(), pb.info());
    let a = pa.connect(db.local_addr().ip(), ib, &cfg).expect("connect");
    let b = pb.connect(da.local_addr().ip(), ia, &cfg).expect("connect");
    (a, b, vec![da, db])
}

fn msg(size: usize, dur: Duration, zero_copy: bool) -> (Result, f64) {
    let (a, b, _devs) = msg_pair(size);
    let copies_before = stats::payload_copies();
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let t = Some(Duration::from_secs(5));
    let (sent, received) = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) || n < u64::MAX {
                let mut m = match b.try_recv() {
                    Ok(m) => m,
                    Err(uroce_msg::MsgError::WouldBlock) => {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        continue;
                    }
                    Err(e) => panic!("recv: {e}"),
                };
                let seq = if zero_copy {
                    m.with_bytes(|b| u64::from_le_bytes(b[..8].try_into().expect("8")))
                        .expect("bytes")
                        .expect("one fragment")
                } else {
                    let v = m.to_vec().expect("vec");
                    u64::from_le_bytes(v[..8].try_into().expect("8"))
                };
                assert_eq!(seq, n, "out of order");
                n += 1;
            }
            n
        });
        let mut sent = 0u64;
        let mut data = vec![0u8; size.max(8)];
        while start.elapsed() < dur {
            if zero_copy {
                // Busy polling: completions hand buffers back to the pool.
                let mut buf = loop {
                    if let Some(b) = a.pool().try_alloc() {
                        break b;
                    }
                    a.poll_completions();
                };
                buf.bytes_mut().expect("bytes")[..8].copy_from_slice(&sent.to_le_bytes());
                buf.set_len(size.max(8));
                a.send(buf, t).expect("send");
            } else {
                data[..8].copy_from_slice(&sent.to_le_bytes());
                a.send_bytes(&data, t).expect("send_bytes");
            }
            sent += 1;
        }
        // Let the receiver drain, then stop it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while a.pool().stats().in_flight > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        (sent, rx.join().expect("receiver"))
    });
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(sent, received, "lost messages");
    let copies = (stats::payload_copies() - copies_before) as f64 / received.max(1) as f64;
    (
        Result {
            msgs: received,
            secs,
        },
        copies,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = match args.first() {
        Some(s) => vec![s.parse().expect("size")],
        None => vec![64, 4096, 65536],
    };
    let secs: f64 = args.get(1).map_or(1.0, |s| s.parse().expect("seconds"));
    let dur = Duration::from_secs_f64(secs);
    println!(
        "Median of {RUNS} runs of {secs} s each; load average at start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!();
    println!("| size | path | M msg/s (median) | GB/s (median) | runs (M msg/s) | payload copies/msg (msg layer) |");
    println!("|---:|---|---:|---:|---|---:|");
    for size in sizes {
        let mut rows: Vec<(&str, Vec<f64>, String)> = Vec::new();
        let mut raw_r = Vec::new();
        let mut zc_r = Vec::new();
        let mut cp_r = Vec::new();
        let (mut zc_c, mut cp_c) = (0.0, 0.0);
        // Interleaved, so that a change in machine load hits every path alike.
        for _ in 0..RUNS {
            raw_r.push(raw(size, dur).rate());
            let (r, c) = msg(size, dur, true);
            zc_r.push(r.rate());
            zc_c = c;
            let (r, c) = msg(size, dur, false);
            cp_r.push(r.rate());
            cp_c = c;
        }
        rows.push(("raw verbs SEND", raw_r, "–".into()));
        rows.push(("msg zero-copy", zc_r, format!("{zc_c:.2}")));
        rows.push(("msg copy (send_bytes/to_vec)", cp_r, format!("{cp_c:.2}")));
        for (name, mut rates, copies) in rows {
            rates.sort_by(f64::total_cmp);
            let med = rates[rates.len() / 2];
            let runs: Vec<String> = rates.iter().map(|r| format!("{:.3}", r / 1e6)).collect();
            println!(
                "| {size} B | {name} | {:.3} | {:.3} | {} | {copies} |",
                med / 1e6,
                med * size as f64 / 1e9,
                runs.join(", ")
            );
        }
    }
}
