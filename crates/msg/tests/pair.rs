//! One endpoint pair over real loopback sockets: in-place send and receive, fragmentation,
//! back-pressure (try_send, blocking, async), failure and close.

mod common;

use std::time::Duration;

use common::{check, fill, pair};
use uroce_msg::{block_on, MsgConfig, MsgError, SendError};

const T: Option<Duration> = Some(Duration::from_secs(10));

#[test]
fn in_place_round_trip_and_fragments() {
    let cfg = MsgConfig {
        recv_bufs: 16,
        recv_buf_size: 1024,
        ..MsgConfig::default()
    };
    let (a, b) = pair("127.0.7.1", "127.0.7.2", None, &cfg, 16);
    // One buffer filled in place.
    let mut buf = a.pool.try_alloc().expect("buffer");
    {
        let mut bytes = buf.bytes_mut().expect("bytes");
        fill(&mut bytes[..700], 1);
    }
    buf.set_len(700);
    a.ep.send(buf, T).expect("send");
    let mut msg = b.ep.recv(T).expect("recv");
    assert_eq!((msg.len(), msg.fragment_count()), (700, 1));
    assert_eq!(msg.with_bytes(|s| check(s, 1)).expect("bytes"), Some(true));
    drop(msg);
    // A message of 10 fragments (10 000 bytes over 1 KiB buffers), both directions.
    let mut big = vec![0; 10_000];
    fill(&mut big, 2);
    a.ep.send_bytes(&big, T).expect("send big");
    b.ep.send_bytes(&big[..3000], T).expect("send back");
    let mut m = b.ep.recv(T).expect("recv big");
    assert_eq!((m.len(), m.fragment_count()), (10_000, 10));
    assert!(m.to_vec().expect("vec") == big);
    let mut m = a.ep.recv(T).expect("recv back");
    assert!(m.to_vec().expect("vec") == big[..3000]);
    // Too long for the window: refused, nothing sent.
    let max = a.ep.max_message();
    assert_eq!(max, 16 * 1024);
    assert_eq!(
        a.ep.send_bytes(&vec![0; max + 1], T),
        Err(MsgError::TooLong { len: max + 1, max })
    );
    drop(m);
    a.ep.close();
    b.ep.close();
    assert!(a.pool.is_complete(), "{:?}", a.pool.stats());
    assert!(b.pool.is_complete(), "{:?}", b.pool.stats());
}

#[test]
fn no_credit_is_would_block_then_blocking_and_async_sends_resume() {
    let cfg = MsgConfig {
        recv_bufs: 4,
        recv_buf_size: 256,
        ..MsgConfig::default()
    };
    let (a, b) = pair("127.0.7.3", "127.0.7.4", None, &cfg, 8);
    // Window 4: 4 messages go, the 5th would block.
    for n in 0..4u64 {
        let mut buf = a.pool.try_alloc().expect("buffer");
        buf.copy_from(&n.to_le_bytes()).expect("copy");
        a.ep.try_send(buf).expect("credit");
    }
    let mut buf = a.pool.try_alloc().expect("buffer");
    buf.copy_from(&4u64.to_le_bytes()).expect("copy");
    let buf = match a.ep.try_send(buf) {
        Err(SendError {
            error: MsgError::WouldBlock,
            buf: Some(buf),
        }) => buf,
        other => panic!("expected WouldBlock, got {other:?}"),
    };
    // The blocking form times out while the receiver holds everything…
    let buf = match a.ep.send(buf, Some(Duration::from_millis(100))) {
        Err(SendError {
            error: MsgError::Timeout,
            buf: Some(buf),
        }) => buf,
        other => panic!("expected Timeout, got {other:?}"),
    };
    // …and the async form resumes once the receiver lets go of its messages.
    let held: Vec<_> = (0..4).map(|_| b.ep.recv(T).expect("recv")).collect();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        b
    });
    block_on(a.ep.send_async(buf)).expect("async send");
    let b = reader.join().expect("reader");
    let mut m = block_on(b.ep.recv_async()).expect("async recv");
    assert_eq!(m.to_vec().expect("vec"), 4u64.to_le_bytes());
    drop(m);
    // A full pool: every buffer held, then one comes back.
    // (The last send's buffer comes back with its completion.)
    let held: Vec<_> = (0..8).map(|_| a.pool.alloc(T).expect("buffer")).collect();
    assert!(a.pool.try_alloc().is_none());
    assert!(matches!(
        a.pool.alloc(Some(Duration::from_millis(20))),
        Err(MsgError::Timeout)
    ));
    drop(held);
    assert_eq!(a.pool.stats().free, 8);
    a.ep.close();
    b.ep.close();
    assert!(a.pool.is_complete());
}

#[test]
fn peer_gone_fails_the_connection_and_every_buffer_comes_back() {
    let cfg = MsgConfig {
        recv_bufs: 32,
        recv_buf_size: 512,
        timeout: 8,
        retry_cnt: 2,
        ..MsgConfig::default()
    };
    let (a, b) = pair("127.0.7.5", "127.0.7.6", None, &cfg, 32);
    // The peer's device disappears (its process died): nothing acknowledges anymore.
    let common::Side { ep, dev, .. } = b;
    std::mem::forget(ep);
    dev.close().expect("close");
    let mut failed = None;
    for n in 0..200u64 {
        let Ok(mut buf) = a.pool.alloc(T) else { break };
        buf.copy_from(&n.to_le_bytes()).expect("copy");
        match a.ep.send(buf, T) {
            Ok(()) => {}
            Err(e) => {
                failed = Some(e.error);
                break;
            }
        }
    }
    assert!(
        matches!(failed, Some(MsgError::Failed(_))),
        "expected a failed connection, got {failed:?}"
    );
    assert!(!a.ep.is_up());
    // Flushed sends came back to the pool, flushed receives are idle.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.pool.stats().in_flight > 0 && std::time::Instant::now() < deadline {
        let _ = a.ep.try_recv();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(a.pool.stats().in_flight, 0, "{:?}", a.pool.stats());
    let rs = a.ep.recv_stats();
    assert_eq!((rs.posted, rs.idle), (0, 32), "{rs:?}");
    a.ep.close();
    assert!(a.pool.is_complete(), "{:?}", a.pool.stats());
}

#[test]
fn close_with_sends_in_flight_and_messages_held() {
    let cfg = MsgConfig {
        recv_bufs: 16,
        recv_buf_size: 4096,
        ..MsgConfig::default()
    };
    let (a, b) = pair("127.0.7.7", "127.0.7.8", None, &cfg, 16);
    for n in 0..12u64 {
        let mut buf = a.pool.alloc(T).expect("buffer");
        {
            let mut bytes = buf.bytes_mut().expect("bytes");
            fill(&mut bytes[..4000], n);
        }
        buf.set_len(4000);
        a.ep.send(buf, T).expect("send");
    }
    let mut first = b.ep.recv(T).expect("recv");
    let mut second = b.ep.recv(T).expect("recv");
    // Close the sender at once: whatever is still in flight is flushed back to its pool.
    a.ep.close();
    assert!(a.pool.is_complete(), "{:?}", a.pool.stats());
    // Close the receiver while the application holds two messages: their memory stays
    // valid and readable, and dropping them afterwards reposts nothing.
    b.ep.close();
    assert_eq!(
        first.with_bytes(|s| check(s, 0)).expect("bytes"),
        Some(true)
    );
    assert_eq!(
        second.with_bytes(|s| check(s, 1)).expect("bytes"),
        Some(true)
    );
    drop(first);
    drop(second);
    assert!(b.pool.is_complete());
}

/// A receiver that holds some messages while it waits for a fragmented one: the few
/// buffers it reposted (below every threshold) are still advertised, so the sender gets
/// the credits the message needs.
#[test]
fn small_unadvertised_reposts_reach_a_sender_that_needs_them() {
    let cfg = MsgConfig {
        recv_bufs: 16,
        recv_buf_size: 1024,
        ..MsgConfig::default()
    };
    let (a, b) = pair("127.0.7.9", "127.0.7.10", None, &cfg, 16);
    for n in 0..8u64 {
        let mut buf = a.pool.alloc(T).expect("buffer");
        buf.copy_from(&n.to_le_bytes()).expect("copy");
        a.ep.send(buf, T).expect("send");
    }
    let mut got: Vec<_> = (0..8).map(|_| b.ep.recv(T).expect("recv")).collect();
    // Give back 3 of 8: the sender holds 8 credits and needs 10 for the next message.
    got.truncate(5);
    let big = vec![7u8; 10 * 1024];
    std::thread::scope(|s| {
        s.spawn(|| a.ep.send_bytes(&big, T).expect("fragmented send"));
        let mut m = b.ep.recv(T).expect("the fragmented message");
        assert_eq!(m.fragment_count(), 10);
        assert!(m.to_vec().expect("vec") == big);
    });
    drop(got);
}
