//! Helpers shared by uroce-net's tests: everything of uroce-testkit (tools, temporary
//! files, tshark decode, random packets, loopback capture), plus bounded send/receive
//! loops over uroce-net's sockets, which are specific to this crate.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::{Duration, Instant};

pub use uroce_testkit::*;

/// Sends every packet of `packets` from `sock` (sealed already), waiting for the socket
/// to become writable when it is full; panics if that takes more than 10 s.
pub fn send_all(sock: &mut uroce_net::RoceSocket, packets: &[uroce_net::OutPacket<'_>]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut done = 0;
    while done < packets.len() {
        assert!(Instant::now() < deadline, "sending took longer than 10 s");
        let n = sock.send_batch(&packets[done..]).expect("send_batch");
        done += n;
        if done < packets.len() {
            sock.wait_writable(Some(Duration::from_millis(100)))
                .expect("poll");
        }
    }
}

/// One datagram a test received, with what the socket made of it.
#[derive(Debug, Clone)]
pub struct Got {
    /// Source address.
    pub src: Option<std::net::SocketAddr>,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// What the socket decided.
    pub status: uroce_net::RecvStatus,
}

/// Receives on `sock` into `batch` until `want` datagrams (accepted or not) arrived or
/// `limit` passed; returns them in arrival order.
pub fn recv_until(
    sock: &mut uroce_net::RoceSocket,
    batch: &mut uroce_net::RecvBatch,
    want: usize,
    limit: Duration,
) -> Vec<Got> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        let n = sock.recv_batch(batch).expect("recv_batch");
        if n == 0 {
            let _ = sock.wait_readable(Some(Duration::from_millis(50)));
            continue;
        }
        got.extend(received(batch));
    }
    got
}

/// Reads everything still waiting on `sock` (for up to `quiet` without a new datagram).
pub fn drain(
    sock: &mut uroce_net::RoceSocket,
    batch: &mut uroce_net::RecvBatch,
    quiet: Duration,
) -> Vec<Got> {
    let mut got = Vec::new();
    // At most 10 000 rounds: a test never sends that many batches.
    for _ in 0..10_000 {
        let n = sock.recv_batch(batch).expect("recv_batch");
        if n == 0 {
            if !sock.wait_readable(Some(quiet)).expect("poll") {
                break;
            }
            continue;
        }
        got.extend(received(batch));
    }
    got
}

/// The datagrams of the last `recv_batch` into `batch`, copied out.
fn received(batch: &uroce_net::RecvBatch) -> impl Iterator<Item = Got> + '_ {
    batch.all().map(|d| Got {
        src: d.src,
        bytes: d.bytes.to_vec(),
        status: d.status,
    })
}
