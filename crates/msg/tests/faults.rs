//! Pools and credits under simulated loss (drop, duplication, reordering, corruption on
//! both devices) and a slow receiver that holds messages: every message arrives exactly
//! once, in order, intact; no RNR NAK is ever sent (the connection runs with
//! `rnr_retry = 0`, so one would fail it); at the end every buffer is back, none twice.

mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use common::{check, fill, pair, Side};
use uroce_msg::{Message, MsgConfig};
use uroce_net::FaultConfig;

const MESSAGES: u64 = 1500;
const T: Option<Duration> = Some(Duration::from_secs(20));

/// Message `n`'s length: mostly in-place single buffers, every 7th a fragmented one.
fn len_of(n: u64, buf: usize) -> usize {
    if n % 7 == 3 {
        buf * 2 + (n as usize * 37) % (buf * 2)
    } else {
        8 + (n as usize * 101) % (buf - 8)
    }
}

fn sender(s: &Side, buf_size: usize) {
    for n in 0..MESSAGES {
        let len = len_of(n, buf_size);
        if len > buf_size {
            let mut v = vec![0; len];
            fill(&mut v, n);
            s.ep.send_bytes(&v, T).expect("send_bytes");
        } else {
            let mut buf = s.pool.alloc(T).expect("pool buffer");
            {
                let mut b = buf.bytes_mut().expect("bytes");
                fill(&mut b[..len], n);
            }
            buf.set_len(len);
            s.ep.send(buf, T).expect("send");
        }
    }
}

/// Receives everything in order; holds up to `hold` messages and pauses now and then.
fn slow_receiver(s: &Side, buf_size: usize, hold: usize) {
    let mut held: VecDeque<Message> = VecDeque::new();
    for n in 0..MESSAGES {
        let mut m = s.ep.recv(T).expect("recv");
        let len = len_of(n, buf_size);
        assert_eq!(m.len(), len, "message {n}: length");
        let ok = if m.fragment_count() == 1 {
            m.with_bytes(|b| check(b, n)).expect("bytes") == Some(true)
        } else {
            check(&m.to_vec().expect("vec"), n)
        };
        assert!(ok, "message {n}: content (duplicate, reordered or corrupt)");
        held.push_back(m);
        if held.len() > hold {
            held.pop_front();
        }
        if n % 97 == 0 {
            std::thread::sleep(Duration::from_millis(3));
        }
    }
}

#[test]
fn exactly_once_in_order_under_loss_with_slow_receivers() {
    let faults = FaultConfig {
        drop: 0.03,
        dup: 0.01,
        reorder: 0.01,
        corrupt: 0.002,
        seed: 11,
    };
    let buf = 1024;
    let cfg = MsgConfig {
        recv_bufs: 16,
        recv_buf_size: buf,
        timeout: 10,
        ..MsgConfig::default()
    };
    let (a, b) = pair("127.0.8.1", "127.0.8.2", Some(faults), &cfg, 16);
    let start = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| sender(&a, buf));
        sc.spawn(|| sender(&b, buf));
        // Up to 3 held messages (12 buffers) leave 4 credits: a 4-fragment message fits.
        sc.spawn(|| slow_receiver(&b, buf, 1));
        sc.spawn(|| slow_receiver(&a, buf, 3));
    });
    assert!(start.elapsed() < Duration::from_secs(60));
    for s in [&a, &b] {
        assert!(s.ep.is_up(), "connection failed");
        let qpc = s.dev.qp_counters(s.ep.qp_num()).expect("qp counters");
        assert_eq!(qpc.transport.rnr_naks_received, 0, "{qpc:?}");
        assert_eq!(qpc.transport.rnr_naks_sent, 0, "{qpc:?}");
        assert_eq!(s.ep.rnr_failures(), 0);
        let dc = s.dev.counters();
        assert!(
            dc.socket.injected_drops > 0,
            "no fault was injected: {dc:?}"
        );
        assert!(qpc.transport.retransmitted_packets > 0, "{qpc:?}");
    }
    // Nothing in flight or held now: every receive is posted again, every send buffer
    // is home exactly once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (a.pool.stats().in_flight + b.pool.stats().in_flight > 0) && Instant::now() < deadline {
        let _ = a.ep.try_recv();
        let _ = b.ep.try_recv();
        std::thread::sleep(Duration::from_millis(2));
    }
    for s in [&a, &b] {
        let rs = s.ep.recv_stats();
        assert_eq!(
            (rs.posted, rs.held, rs.idle, rs.arrived),
            (16, 0, 0, 0),
            "{rs:?}"
        );
        assert!(s.pool.is_complete(), "{:?}", s.pool.stats());
    }
    let Side { ep, pool, .. } = a;
    ep.close();
    assert!(pool.is_complete());
    let Side { ep, pool, .. } = b;
    ep.close();
    assert!(pool.is_complete());
}
