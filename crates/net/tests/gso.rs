//! Trains of packets sent with UDP segmentation offload (GSO) and received with receive
//! coalescing (GRO), on loopback.
//!
//! Expectations are derived without the socket's own sealing code: every expected ICRC is
//! computed by `uroce_wire` over the IP and UDP headers the kernel emits, with the IPv4
//! Identification the kernel gives the k-th segment of a GSO message (k, measured; see
//! `docs/ICRC.md`), and the number of packets per GSO message follows from the
//! limits the API documents (64 packets, one 64 KiB datagram: 65 507 bytes of UDP payload
//! over IPv4). The last tests check the Identification rule itself against the kernel: a
//! live capture, decoded by scapy and by `uroce_wire`, of trains sent in a private network
//! namespace whose loopback device makes the kernel segment in software, and the same
//! over a veth pair between two namespaces the test creates (the path of a real NIC).

mod support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_net::socket::{verified_identification, GSO_MAX_SEGMENTS, TRAIN_ID_SPAN};
use uroce_net::{
    verify_icrc, Capture, FaultConfig, IcrcCheck, IcrcPolicy, RecvBatch, RecvStatus, RoceSocket,
    SocketConfig, SocketError,
};
use uroce_wire::icrc_ident::{identify, IdentSolver, Ipv4Ident};
use uroce_wire::ip::{roce_headers_with, Datagram, Endpoints, IpFields};
use uroce_wire::opcode::op;
use uroce_wire::pcap::PcapReader;
use uroce_wire::{bth, icrc, PacketRepr, Psn, ROCEV2_UDP_PORT};

use support::{LiveCapture, Rng, TempFile, PROBE};

const TEST: &str = "gso";
/// Payload of a full packet (RoCE PMTU 4096).
const PAYLOAD: usize = 4096;
/// A full RDMA WRITE MIDDLE packet: BTH, payload, ICRC.
const FULL: usize = 12 + PAYLOAD + 4;
/// The largest UDP payload of an IPv4 datagram: 65535 − 20 (IPv4) − 8 (UDP).
const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// The same for IPv6, whose payload length (65535) includes the UDP header.
const MAX_UDP_PAYLOAD_V6: usize = 65_527;

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A train: `n` RDMA WRITE MIDDLE packets with random payloads, PSNs `first_psn..`, the
/// last with `last_payload` bytes of payload instead of 4096. The ICRC bytes are zero.
fn train(rng: &mut Rng, n: usize, last_payload: usize, first_psn: u32) -> Vec<u8> {
    train_of(rng, n, PAYLOAD, last_payload, first_psn)
}

/// [`train`] with `payload` bytes of payload per packet instead of 4096.
fn train_of(
    rng: &mut Rng,
    n: usize,
    payload: usize,
    last_payload: usize,
    first_psn: u32,
) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let len = if i + 1 == n { last_payload } else { payload };
        let payload = rng.bytes(len);
        let repr = PacketRepr {
            bth: bth::Repr {
                opcode: op::RC_RDMA_WRITE_MIDDLE,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: 0x00_1234,
                ack_req: false,
                psn: Psn::new(first_psn + i as u32),
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
        let start = out.len();
        out.resize(start + repr.buffer_len(), 0);
        repr.emit(&mut out[start..]).unwrap();
    }
    out
}

/// `roce` sealed, by `uroce_wire` alone, for the datagram `src` → `dst` with IPv4
/// Identification `id` and DF (IPv6: `id` is ignored).
fn sealed_for(src: SocketAddr, dst: SocketAddr, roce: &[u8], id: u16) -> Vec<u8> {
    let ep = Endpoints {
        src: src.ip(),
        dst: dst.ip(),
        src_port: src.port(),
        dst_port: dst.port(),
    };
    let fields = IpFields {
        identification: id,
        ..IpFields::LINUX_UDP_SOCKET
    };
    let mut headers = [0u8; 48];
    let (ip_len, udp_len) = roce_headers_with(&ep, &fields, roce.len(), &mut headers).unwrap();
    let mut out = roce.to_vec();
    icrc::seal(
        &headers[..ip_len],
        &headers[ip_len..ip_len + udp_len],
        &mut out,
    )
    .unwrap();
    out
}

/// Packets per GSO message for full packets of `seg_len` bytes (documented limits).
fn per_message(seg_len: usize, ipv4: bool) -> usize {
    let max = if ipv4 {
        MAX_UDP_PAYLOAD_V4
    } else {
        MAX_UDP_PAYLOAD_V6
    };
    (max / seg_len).min(GSO_MAX_SEGMENTS)
}

/// The packets of `train` (packet length `seg_len`, last possibly shorter) as they must
/// arrive: sealed for Identification `k` (k-th packet of its GSO message) when `gso`,
/// for 0 otherwise.
fn expected(
    src: SocketAddr,
    dst: SocketAddr,
    train: &[u8],
    seg_len: usize,
    gso: bool,
) -> Vec<Vec<u8>> {
    let per = per_message(seg_len, src.is_ipv4());
    train
        .chunks(seg_len)
        .enumerate()
        .map(|(i, p)| {
            let id = if gso { (i % per) as u16 } else { 0 };
            sealed_for(src, dst, p, id)
        })
        .collect()
}

/// What a receiver saw.
struct Arrivals {
    packets: Vec<(Option<SocketAddr>, Vec<u8>, RecvStatus)>,
    /// Receives whose packets outnumbered their datagrams (the kernel coalesced).
    coalescing_receives: usize,
    datagrams: usize,
}

/// Receives until `want` packets arrived or 10 s passed.
fn receive(rx: &mut RoceSocket, batch: &mut RecvBatch, want: usize) -> Arrivals {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut a = Arrivals {
        packets: Vec::new(),
        coalescing_receives: 0,
        datagrams: 0,
    };
    while a.packets.len() < want && Instant::now() < deadline {
        let n = rx.recv_batch(batch).expect("recv_batch");
        if n == 0 {
            let _ = rx.wait_readable(Some(Duration::from_millis(50)));
            continue;
        }
        assert_eq!(n, batch.len());
        assert!(batch.datagrams() <= n && batch.datagrams() <= batch.capacity());
        a.datagrams += batch.datagrams();
        if n > batch.datagrams() {
            a.coalescing_receives += 1;
        }
        a.packets
            .extend(batch.all().map(|d| (d.src, d.bytes.to_vec(), d.status)));
    }
    a
}

/// Sends the whole train, waiting while the socket buffer is full (10 s at most).
fn send_train_all(tx: &mut RoceSocket, dst: SocketAddr, buf: &mut [u8], seg_len: usize) -> usize {
    let count = buf.len().div_ceil(seg_len);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut done = 0;
    let mut calls = 0;
    while done < count {
        assert!(Instant::now() < deadline, "sending took longer than 10 s");
        done += tx
            .send_train(dst, &mut buf[done * seg_len..], seg_len)
            .expect("send_train");
        calls += 1;
        if done < count {
            tx.wait_writable(Some(Duration::from_millis(100))).unwrap();
        }
    }
    calls
}

/// A receiver on `v4(2)` and a sender on `v4(1)` whose kernel does UDP GSO
/// and GRO; `None` (the test skipped, with the reason) where it does neither.
fn gso_gro_pair() -> Option<(RoceSocket, RoceSocket)> {
    let rx = RoceSocket::bind_port(v4(2), 0).unwrap();
    let tx = RoceSocket::bind_port(v4(1), 0).unwrap();
    if !tx.gso_active() || !rx.gro_supported() {
        support::skip(TEST, "the kernel supports no UDP_SEGMENT / UDP_GRO");
        return None;
    }
    Some((rx, tx))
}

/// Checks that `got` is exactly `want`, in order, every packet accepted with a good ICRC.
fn check_arrivals(got: &Arrivals, want: &[Vec<u8>], src: SocketAddr, what: &str) {
    assert_eq!(got.packets.len(), want.len(), "{what}: packets arrived");
    for (i, ((from, bytes, status), w)) in got.packets.iter().zip(want).enumerate() {
        assert_eq!(*from, Some(src), "{what}: packet {i} source");
        assert_eq!(
            *status,
            RecvStatus::Accepted(IcrcCheck::Ok),
            "{what}: packet {i} status"
        );
        assert_eq!(bytes.len(), w.len(), "{what}: packet {i} length");
        assert!(bytes == w, "{what}: packet {i} bytes (ICRC included)");
    }
}

/// 40 full packets in one call go out as GSO messages and arrive as 40 packets, in
/// order, each sealed for its segment's Identification and accepted under Strict; the
/// receiver got some of them coalesced and split them.
#[test]
fn a_train_of_forty_full_packets_arrives_packet_by_packet() {
    let mut rx = RoceSocket::bind_port(v4(2), 0).unwrap();
    let mut tx = RoceSocket::bind_port(v4(1), 0).unwrap();
    assert_eq!(rx.icrc_policy(), IcrcPolicy::AnyIdentification);
    rx.set_icrc_policy(IcrcPolicy::Strict);
    if !tx.gso_supported() || !rx.gro_supported() {
        support::skip(TEST, "the kernel supports no UDP_SEGMENT / UDP_GRO");
        return;
    }
    assert!(tx.gso_active());
    let (src, dst) = (tx.local_addr(), rx.local_addr());
    let mut rng = Rng::new(0x6773_6f01);
    let mut buf = train(&mut rng, 40, PAYLOAD, 100);
    assert_eq!(buf.len(), 40 * FULL);
    let want = expected(src, dst, &buf, FULL, true);

    // The first receive into 64 KiB slots switches coalescing on (nothing waits yet).
    let mut batch = RecvBatch::default();
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), 0);
    assert!(rx.gro_active(), "default batches let the kernel coalesce");

    let before = tx.counters();
    let sent = tx.send_train(dst, &mut buf, FULL).unwrap();
    assert_eq!(sent, 40, "one call takes the whole train");
    let c = tx.counters().since(&before);
    assert_eq!(c.tx_packets, 40, "counters count packets");
    assert_eq!(c.tx_bytes, (40 * FULL) as u64);
    assert_eq!(c.send_errors + c.eagain, 0);
    // The train was sealed in place, exactly as it must arrive.
    assert!(buf.chunks(FULL).zip(&want).all(|(a, b)| a == b.as_slice()));

    let got = receive(&mut rx, &mut batch, 40);
    check_arrivals(&got, &want, src, "GSO train");
    // Messages of 15 + 15 + 10 packets, each handed over whole on loopback.
    assert!(got.coalescing_receives > 0);
    assert_eq!(got.datagrams, 3, "coalesced datagrams");
    let r = rx.counters();
    assert_eq!((r.rx_packets, r.rx_bytes), (40, (40 * FULL) as u64));
    assert_eq!(
        r.bad_icrc + r.truncated + r.parse_errors + r.unverified_icrc,
        0
    );
    // The Identification each packet verifies with is its place in its message.
    let per = per_message(FULL, true);
    assert_eq!(per, 15);
    for (i, (_, bytes, _)) in got.packets.iter().enumerate() {
        assert_eq!(
            verified_identification(src, dst, bytes),
            Some((i % per) as u16)
        );
    }
}

/// A train whose last packet is shorter (and not a multiple of the segment size), over
/// several calls' worth of messages; and a train of one packet.
#[test]
fn a_train_with_a_short_last_packet() {
    let mut rx = RoceSocket::bind_port(v4(2), 0).unwrap();
    let mut tx = RoceSocket::bind_port(v4(1), 0).unwrap();
    let (src, dst) = (tx.local_addr(), rx.local_addr());
    let gso = tx.gso_active();
    let mut rng = Rng::new(0x6773_6f02);
    // 23 packets: 22 full, one with 984 payload bytes (1000 in all); 15 + 8 per message.
    let mut buf = train(&mut rng, 23, 984, 7);
    assert_eq!(buf.len(), 22 * FULL + 1000);
    let want = expected(src, dst, &buf, FULL, gso);
    send_train_all(&mut tx, dst, &mut buf, FULL);
    let mut batch = RecvBatch::default();
    let got = receive(&mut rx, &mut batch, 23);
    check_arrivals(&got, &want, src, "short last packet");
    assert_eq!(got.packets[22].1.len(), 1000);

    // One packet (seg_len 0 means "all of buf"): an ordinary datagram, ID 0.
    let mut one = train(&mut rng, 1, 64, 1);
    let want = vec![sealed_for(src, dst, &one, 0)];
    assert_eq!(tx.send_train(dst, &mut one, 0).unwrap(), 1);
    let got = receive(&mut rx, &mut batch, 1);
    check_arrivals(&got, &want, src, "one packet");
    assert_eq!(tx.counters().tx_packets, 24);
}

/// A coalesced datagram of short packets, then, into the same batch (as the device reuses
/// its batch), an ordinary datagram longer than those packets: it arrives whole, not cut
/// at the earlier datagram's segment size (no control message of an earlier receive is
/// taken for a later one).
#[test]
fn a_datagram_after_a_coalesced_one_is_not_cut_at_the_old_segment_size() {
    let Some((mut rx, mut tx)) = gso_gro_pair() else {
        return;
    };
    let (src, dst) = (tx.local_addr(), rx.local_addr());
    let mut rng = Rng::new(0x6773_6f0a);
    let mut batch = RecvBatch::default();
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), 0);
    assert!(rx.gro_active());
    // 10 packets of 12 + 100 + 4 bytes: one GSO message, one coalesced datagram.
    let seg = 12 + 100 + 4;
    let mut buf = train_of(&mut rng, 10, 100, 100, 1);
    let want = expected(src, dst, &buf, seg, true);
    send_train_all(&mut tx, dst, &mut buf, seg);
    let got = receive(&mut rx, &mut batch, 10);
    check_arrivals(&got, &want, src, "coalesced short packets");
    assert!(got.coalescing_receives > 0, "the kernel coalesced them");
    // One packet of 12 + 2000 + 4 bytes, 17 times the earlier segment size.
    let mut one = train_of(&mut rng, 1, 2000, 2000, 20);
    let want = vec![sealed_for(src, dst, &one, 0)];
    assert_eq!(tx.send_train(dst, &mut one, 0).unwrap(), 1);
    let got = receive(&mut rx, &mut batch, 1);
    check_arrivals(&got, &want, src, "one long datagram");
    assert_eq!(got.datagrams, 1);
    assert_eq!(rx.counters().rx_packets, 11);
}

/// With GSO switched off (by configuration or by method) the same train goes out packet
/// by packet, each sealed for Identification 0, and arrives the same way; a receiver
/// with small slots does not coalesce.
#[test]
fn the_fallback_path_sends_the_same_train_packet_by_packet() {
    let mut rx = RoceSocket::bind_port(v4(2), 0).unwrap();
    let config = SocketConfig {
        gso: false,
        ..SocketConfig::default()
    };
    let mut by_config = RoceSocket::bind_with(SocketAddr::new(v4(1), 0), config).unwrap();
    let mut by_method = RoceSocket::bind_port(v4(1), 0).unwrap();
    by_method.set_gso(false);
    let dst = rx.local_addr();
    let mut rng = Rng::new(0x6773_6f03);
    let original = train(&mut rng, 30, 512, 9);
    let seg = FULL;
    for (tx, what) in [(&mut by_config, "config"), (&mut by_method, "set_gso")] {
        assert!(!tx.gso_active(), "{what}");
        let src = tx.local_addr();
        let mut buf = original.clone();
        let want = expected(src, dst, &buf, seg, false);
        send_train_all(tx, dst, &mut buf, seg);
        assert_eq!(tx.counters().tx_packets, 30, "{what}");
        let mut batch = RecvBatch::new(64, 8192).unwrap();
        let got = receive(&mut rx, &mut batch, 30);
        assert!(!rx.gro_active(), "8 KiB slots switch GRO off");
        check_arrivals(&got, &want, src, what);
        assert_eq!(got.datagrams, 30, "{what}: one datagram per packet");
    }
}

/// A GSO train received without coalescing (GRO off by method, or slots too small):
/// the kernel cuts it up, every packet still verifies (its Identification is found from
/// the ICRC alone); and with GRO on again, coalesced datagrams are split.
#[test]
fn gro_on_and_off_at_the_receiver() {
    let Some((mut rx, mut tx)) = gso_gro_pair() else {
        return;
    };
    let (src, dst) = (tx.local_addr(), rx.local_addr());
    let mut rng = Rng::new(0x6773_6f04);
    let mut batch = RecvBatch::default();

    rx.set_gro(false);
    // Nothing queued yet: a receive applies the setting.
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), 0);
    assert!(!rx.gro_active());
    let mut buf = train(&mut rng, 31, 200, 1);
    let want = expected(src, dst, &buf, FULL, true);
    send_train_all(&mut tx, dst, &mut buf, FULL);
    let got = receive(&mut rx, &mut batch, 31);
    check_arrivals(&got, &want, src, "GRO off");
    assert_eq!(got.datagrams, 31);
    assert_eq!(got.coalescing_receives, 0);

    rx.set_gro(true);
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), 0);
    assert!(rx.gro_active());
    let mut buf = train(&mut rng, 31, 200, 40);
    let want = expected(src, dst, &buf, FULL, true);
    send_train_all(&mut tx, dst, &mut buf, FULL);
    let got = receive(&mut rx, &mut batch, 31);
    check_arrivals(&got, &want, src, "GRO on");
    // 31 packets in messages of 15 + 15 + 1: three datagrams.
    assert_eq!(got.datagrams, 3);
    assert_eq!(rx.counters().rx_packets, 62);
}

/// Coalesced datagrams that were queued while GRO was on, then read into slots too small
/// for them: the complete packets at the front of each are kept (and verify), the rest
/// of each is one truncated packet.
#[test]
fn a_coalesced_datagram_cut_short_keeps_its_complete_packets() {
    let Some((mut rx, mut tx)) = gso_gro_pair() else {
        return;
    };
    let (src, dst) = (tx.local_addr(), rx.local_addr());
    let mut big = RecvBatch::default();
    assert_eq!(rx.recv_batch(&mut big).unwrap(), 0);
    assert!(rx.gro_active());
    let mut rng = Rng::new(0x6773_6f0a);
    let mut buf = train(&mut rng, 40, PAYLOAD, 0);
    let want = expected(src, dst, &buf, FULL, true);
    send_train_all(&mut tx, dst, &mut buf, FULL);
    // Room for one full packet and a bit per slot.
    let mut small = RecvBatch::new(8, 2 * FULL - 100).unwrap();
    let got = receive(&mut rx, &mut small, 6);
    assert!(!rx.gro_active());
    assert_eq!(got.datagrams, 3, "messages of 15, 15 and 10 packets");
    assert_eq!(got.packets.len(), 6);
    for (m, pair) in got.packets.chunks(2).enumerate() {
        // The first packet of message m is packet 15 m of the train (Identification 0).
        assert_eq!(
            pair[0].2,
            RecvStatus::Accepted(IcrcCheck::Ok),
            "message {m}"
        );
        assert!(pair[0].1 == want[15 * m], "message {m}: first packet");
        assert_eq!(pair[1].2, RecvStatus::Truncated, "message {m}: the rest");
        assert_eq!(pair[1].1.len(), FULL - 100);
        assert!(want[15 * m + 1].starts_with(&pair[1].1));
    }
    let c = rx.counters();
    assert_eq!((c.rx_packets, c.truncated, c.bad_icrc), (6, 3, 0));
}

/// IPv6 trains: no Identification; every packet sealed as a single datagram would be.
#[test]
fn an_ipv6_train() {
    let Ok(mut rx) = RoceSocket::bind_port(IpAddr::V6(Ipv6Addr::LOCALHOST), 0) else {
        eprintln!("{TEST}: IPv6 loopback unavailable, IPv6 train skipped");
        return;
    };
    let mut tx = RoceSocket::bind_port(IpAddr::V6(Ipv6Addr::LOCALHOST), 0).unwrap();
    let (src, dst) = (tx.local_addr(), rx.local_addr());
    let mut rng = Rng::new(0x6773_6f05);
    let mut buf = train(&mut rng, 20, 4000, 3);
    let want: Vec<Vec<u8>> = buf
        .chunks(FULL)
        .map(|p| sealed_for(src, dst, p, 0))
        .collect();
    let mut batch = RecvBatch::default();
    assert_eq!(rx.recv_batch(&mut batch).unwrap(), 0);
    send_train_all(&mut tx, dst, &mut buf, FULL);
    let got = receive(&mut rx, &mut batch, 20);
    check_arrivals(&got, &want, src, "IPv6 train");
    if tx.gso_active() && rx.gro_active() {
        // Messages of 15 + 5 (65 527 / 4112 = 15 per message).
        assert_eq!(per_message(FULL, false), 15);
        assert_eq!(got.datagrams, 2, "coalesced");
    }
}

/// Fault injection and capture see individual packets: with either on, the train goes
/// packet by packet, sealed for ID 0; the capture holds one record per packet whose ICRC
/// verifies over its own headers; the injector's decisions are counted per packet.
#[test]
fn faults_and_capture_take_the_packet_path() {
    let mut rx = RoceSocket::bind_port(v4(2), 0).unwrap();
    let mut tx = RoceSocket::bind_port(v4(1), 0).unwrap();
    let (src, dst) = (tx.local_addr(), rx.local_addr());
    let mut rng = Rng::new(0x6773_6f06);
    let file = TempFile::new(TEST, "pcap");
    tx.set_capture(Some(Capture::create(file.path()).unwrap()));
    assert!(!tx.gso_active(), "a capture forces the packet path");
    let mut buf = train(&mut rng, 17, 4, 5);
    let want = expected(src, dst, &buf, FULL, false);
    send_train_all(&mut tx, dst, &mut buf, FULL);
    let mut batch = RecvBatch::default();
    check_arrivals(
        &receive(&mut rx, &mut batch, 17),
        &want,
        src,
        "captured train",
    );
    let mut capture = tx.set_capture(None).unwrap();
    capture.flush().unwrap();
    assert_eq!(capture.packets(), 17);
    let bytes = std::fs::read(file.path()).unwrap();
    let reader = PcapReader::new(&bytes[..]).unwrap();
    let link = reader.link_type().unwrap();
    let mut records = 0;
    for (i, r) in reader.enumerate() {
        let (_, frame) = r.unwrap();
        let d = link.datagram(&frame).unwrap();
        assert_eq!(d.payload, &want[i][..]);
        d.verify_icrc().unwrap();
        records += 1;
    }
    assert_eq!(records, 17);

    // Faults: every packet through the injector (drop one in two, seeded), none as GSO.
    tx.set_faults(Some(FaultConfig::parse("drop=0.5,seed=11").unwrap()))
        .unwrap();
    assert!(!tx.gso_active());
    let before = tx.counters();
    let mut buf = train(&mut rng, 40, PAYLOAD, 50);
    let want = expected(src, dst, &buf, FULL, false);
    assert_eq!(tx.send_train(dst, &mut buf, FULL).unwrap(), 40);
    assert_eq!(tx.flush_held().unwrap(), 0);
    let c = tx.counters().since(&before);
    assert_eq!(c.tx_packets + c.injected_drops, 40);
    assert!(c.injected_drops > 5 && c.injected_drops < 35, "{c:?}");
    let got = receive(&mut rx, &mut batch, c.tx_packets as usize);
    assert_eq!(got.packets.len() as u64, c.tx_packets);
    // What arrived is a subsequence of the train, each sealed for ID 0.
    let mut next = 0;
    for (_, bytes, status) in &got.packets {
        assert_eq!(*status, RecvStatus::Accepted(IcrcCheck::Ok));
        let at = want[next..]
            .iter()
            .position(|w| w == bytes)
            .expect("in the train");
        next += at + 1;
    }
    tx.set_faults(None).unwrap();
    assert!(tx.gso_active() || !tx.gso_supported());
}

/// Bad trains are refused before anything is sent.
#[test]
fn malformed_trains_are_refused_whole() {
    let mut tx = RoceSocket::bind_port(v4(1), 0).unwrap();
    let dst = SocketAddr::new(v4(2), 9);
    let mut rng = Rng::new(0x6773_6f07);
    // A last packet shorter than BTH + ICRC.
    let mut buf = train(&mut rng, 3, PAYLOAD, 0);
    buf.truncate(2 * FULL + 12);
    let err = tx.send_train(dst, &mut buf, FULL).unwrap_err();
    assert!(matches!(err, SocketError::Seal { .. }), "{err}");
    // A packet longer than a datagram can carry.
    let mut big = vec![0u8; 70_000];
    let err = tx.send_train(dst, &mut big, 66_000).unwrap_err();
    assert!(matches!(err, SocketError::Seal { .. }), "{err}");
    // Another address family.
    let mut buf = train(&mut rng, 2, PAYLOAD, 0);
    let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 9);
    let err = tx.send_train(v6, &mut buf, FULL).unwrap_err();
    assert!(matches!(err, SocketError::AddressFamily { .. }), "{err}");
    assert_eq!(tx.send_train(dst, &mut [], FULL).unwrap(), 0);
    let c = tx.counters();
    assert_eq!(c.tx_packets + c.send_errors, 0, "nothing was sent");
}

/// The ICRC check accepts exactly the Identifications below TRAIN_ID_SPAN, finds which
/// one, and still rejects corrupted packets: packets of many lengths sealed by
/// `uroce_wire` for many Identifications.
#[test]
fn identification_recovery_against_independent_seals() {
    let src = SocketAddr::new(v4(1), 49152);
    let dst = SocketAddr::new(v4(2), ROCEV2_UDP_PORT);
    let mut rng = Rng::new(0x6773_6f08);
    let ids = [
        0u16, 1, 2, 3, 7, 14, 15, 63, 64, 100, 126, 127, 128, 129, 255, 256, 0x1234, 0xffff,
    ];
    for payload in [0usize, 4, 100, 1020, 4096, 9000, 65_000] {
        let roce = train(&mut rng, 1, payload, 77);
        for &id in &ids {
            let sealed = sealed_for(src, dst, &roce, id);
            let what = format!("payload {payload}, ID {id}");
            let inside = id < TRAIN_ID_SPAN;
            let want = if inside {
                IcrcCheck::Ok
            } else {
                IcrcCheck::Mismatch
            };
            assert_eq!(verify_icrc(src, dst, &sealed), want, "{what}");
            assert_eq!(
                verified_identification(src, dst, &sealed),
                inside.then_some(id),
                "{what}"
            );
            // Any single flipped bit outside the masked BTH byte 4 is caught.
            for _ in 0..4 {
                let mut bad = sealed.clone();
                let mut at = rng.below(bad.len() as u64) as usize;
                if at == 4 {
                    at = 5;
                }
                bad[at] ^= 1 << rng.below(8);
                assert_eq!(
                    verify_icrc(src, dst, &bad),
                    IcrcCheck::Mismatch,
                    "{what}, byte {at}"
                );
            }
        }
    }
    // IPv6 has no Identification: ordinary seals verify, and nothing is reported.
    let s6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 49152);
    let d6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), ROCEV2_UDP_PORT);
    let sealed = sealed_for(s6, d6, &train(&mut rng, 1, 64, 1), 0);
    assert_eq!(verify_icrc(s6, d6, &sealed), IcrcCheck::Ok);
    assert_eq!(verified_identification(s6, d6, &sealed), None);
}

// ---------------------------------------------------------------------------------------
// The kernel's own headers, captured.

/// Name of the environment variable that makes the child test run (inside a private
/// network namespace).
const NETNS_CHILD: &str = "UROCE_GSO_NETNS_CHILD";
/// Name of the child test.
const CHILD_TEST: &str = "kernel_segments_in_a_private_namespace";

/// Runs [`kernel_segments_in_a_private_namespace`] in a new network namespace (whose
/// loopback device this test may reconfigure without disturbing anything else).
#[test]
fn kernel_segments_carry_the_identification_they_were_sealed_for() {
    if !support::have_tshark(TEST) || !support::have_scapy(TEST) {
        return;
    }
    let Some(out) = support::run_in_new_netns(TEST, CHILD_TEST, NETNS_CHILD) else {
        return;
    };
    assert!(
        out.status.success() && out.stdout.contains("1 passed"),
        "child test failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

fn ip_link(args: &[&str]) {
    let mut cmd = Command::new("ip");
    cmd.arg("link").args(args);
    let out = support::run(cmd, Duration::from_secs(20)).unwrap();
    assert!(out.status.success(), "ip link {args:?}: {}", out.stderr);
}

/// Inside a private network namespace: two trains, the first with the loopback device
/// taking GSO messages whole (as it does by default), the second with `gso_max_segs 1`,
/// which makes the kernel segment in software before the capture point. The capture
/// must show: messages as single datagrams with ID 0 and DF in the first case; in the
/// second, one datagram per packet with Identification k for the k-th packet of its
/// message and DF, whose ICRC — computed by scapy and by `uroce_wire` over the header
/// as captured — is the one on the wire. Every packet must also arrive at the receiver
/// accepted under Strict.
#[test]
#[ignore = "runs only inside a private network namespace, started by the test above"]
fn kernel_segments_in_a_private_namespace() {
    if std::env::var(NETNS_CHILD).as_deref() != Ok("1") {
        return;
    }
    ip_link(&["set", "lo", "up"]);
    let mut rx = RoceSocket::bind(v4(2)).unwrap();
    let mut whole = RoceSocket::bind_port(v4(1), 0).unwrap();
    let mut cut = RoceSocket::bind_port(v4(1), 0).unwrap();
    assert!(whole.gso_active() && cut.gso_active(), "GSO supported");
    let dst = rx.local_addr();
    let filter = format!("udp dst port {ROCEV2_UDP_PORT}");
    // Probes go to an address nobody listens on.
    let prober = std::net::UdpSocket::bind((v4(1), 0)).unwrap();
    let live = LiveCapture::start_on_probed("lo", &filter, None, &|| {
        let _ = prober.send_to(PROBE, (v4(200), ROCEV2_UDP_PORT));
    })
    .unwrap();
    let mut rng = Rng::new(0x6773_6f09);
    let mut batch = RecvBatch::default();
    // 2 messages of 15 and one of 4 (3 full packets and a short one).
    let n = 34;
    let mut sent = Vec::new();
    for (i, tx) in [&mut whole, &mut cut].into_iter().enumerate() {
        if i == 1 {
            ip_link(&["set", "dev", "lo", "gso_max_segs", "1"]);
        }
        let mut buf = train(&mut rng, n, 2000, 1000 * i as u32);
        send_train_all(tx, dst, &mut buf, FULL);
        let got = receive(&mut rx, &mut batch, n);
        let want = expected(tx.local_addr(), dst, &buf, FULL, true);
        check_arrivals(&got, &want, tx.local_addr(), "namespace train");
        sent.push(want);
    }
    let file = live.stop().unwrap();
    let bytes = std::fs::read(file.path()).unwrap();
    let reader = PcapReader::new(&bytes[..]).unwrap();
    let link = reader.link_type().unwrap();
    let captured: Vec<Vec<u8>> = reader
        .map(|r| {
            let (_, frame) = r.unwrap();
            let d = link.datagram(&frame).unwrap();
            [d.ip_header, d.udp_header, d.payload].concat()
        })
        .filter(|dg| Datagram::parse_ip(dg).map_or(true, |d| d.payload != PROBE))
        .collect();
    let per = per_message(FULL, true);
    let messages = n.div_ceil(per);
    assert_eq!(
        captured.len(),
        messages + n,
        "3 messages whole, then 34 datagrams"
    );

    // 1. Taken whole: one datagram per message, ID 0, DF, the packets end to end.
    let whole_train: Vec<u8> = sent[0].concat();
    let mut offset = 0;
    for (m, dg) in captured[..messages].iter().enumerate() {
        let d = Datagram::parse_ip(dg).unwrap();
        assert_eq!(
            &d.ip_header[4..8],
            &[0, 0, 0x40, 0],
            "message {m}: ID 0, DF"
        );
        assert_eq!(d.payload, &whole_train[offset..offset + d.payload.len()]);
        offset += d.payload.len();
    }
    assert_eq!(offset, whole_train.len());

    // 2. Cut by the kernel: one datagram per packet, ID = place in the message, DF, and
    //    an ICRC that is right for the header as captured.
    let cut_dgs = &captured[messages..];
    let mut lines = String::new();
    for (i, (dg, want)) in cut_dgs.iter().zip(&sent[1]).enumerate() {
        let d = Datagram::parse_ip(dg).unwrap();
        let id = u16::from_be_bytes([d.ip_header[4], d.ip_header[5]]);
        assert_eq!(id as usize, i % per, "packet {i}: Identification");
        assert_eq!(d.ip_header[6] & 0x40, 0x40, "packet {i}: DF");
        assert_eq!(d.payload, &want[..], "packet {i}: bytes");
        d.verify_icrc()
            .unwrap_or_else(|e| panic!("packet {i}: ICRC over the captured header: {e}"));
        lines.push_str(&format!("{i} {}\n", support::hex(dg)));
    }
    let input = TempFile::new(TEST, "txt");
    std::fs::write(input.path(), lines).unwrap();
    let mut cmd = Command::new(support::python());
    cmd.arg(support::script("scapy_icrc.py")).arg(input.path());
    let out = support::run(cmd, Duration::from_secs(120)).unwrap();
    assert!(out.status.success(), "scapy: {}", out.stderr);
    let answers: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(answers.len(), n);
    for (i, (line, dg)) in answers.iter().zip(cut_dgs).enumerate() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(parts.len(), 5, "scapy line {line:?}");
        assert_eq!(parts[0], i.to_string());
        assert_eq!(
            parts[1],
            support::hex(&dg[dg.len() - 4..]),
            "packet {i}: scapy's ICRC"
        );
        assert_eq!(parts[2], "ok", "packet {i}: IPv4 header checksum");
        assert_eq!(parts[3], (i % per).to_string(), "packet {i}: scapy's ID");
        assert_eq!(parts[4], "1", "packet {i}: scapy's DF");
    }
    eprintln!(
        "{TEST}: captured {messages} whole GSO messages (ID 0, DF) and {n} kernel-cut \
         segments with IDs 0..{per} (DF); all ICRCs verified by scapy and uroce_wire"
    );
}

// ---------------------------------------------------------------------------------------
// The same over a veth pair between two network namespaces: the path of a real NIC.

/// Name of the environment variable that makes the veth child test run.
const VETH_CHILD: &str = "UROCE_GSO_VETH_CHILD";
/// Name of the veth child test.
const VETH_CHILD_TEST: &str = "veth_segments_in_private_namespaces";

/// Runs [`veth_segments_in_private_namespaces`] in a new network namespace, which
/// creates a second one and a veth pair between them.
#[test]
fn veth_segments_carry_the_identification_they_were_sealed_for() {
    if !support::have_tshark(TEST) {
        return;
    }
    let Some(out) = support::run_in_new_netns(TEST, VETH_CHILD_TEST, VETH_CHILD) else {
        return;
    };
    assert!(
        out.status.success() && out.stdout.contains("1 passed"),
        "child test failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

/// A second network namespace, held by a `sleep` process made by `unshare --net`;
/// killed (and so the namespace and the veth end in it removed) when dropped.
struct PeerNamespace(std::process::Child);

impl PeerNamespace {
    fn new() -> PeerNamespace {
        let child = Command::new("unshare")
            .args(["--net", "--", "sleep", "300"])
            .spawn()
            .expect("unshare --net sleep");
        // Wait (at most 5 s) until the sleeper is in its own namespace.
        let own = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let theirs = std::fs::read_link(format!("/proc/{}/ns/net", child.id()));
            if theirs.is_ok_and(|t| t != own) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the peer namespace did not appear"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        PeerNamespace(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Runs `ip ARGS` inside it.
    fn ip(&self, args: &[&str]) {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/proc/{}/ns/net", self.pid()))
            .args(["--", "ip"])
            .args(args);
        let out = support::run(cmd, Duration::from_secs(20)).unwrap();
        assert!(
            out.status.success(),
            "ip {args:?} in the peer: {}",
            out.stderr
        );
    }
}

impl Drop for PeerNamespace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ip(args: &[&str]) {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    let out = support::run(cmd, Duration::from_secs(20)).unwrap();
    assert!(out.status.success(), "ip {args:?}: {}", out.stderr);
}

/// Inside a private network namespace (A): a second namespace (B), a veth pair `ua0`
/// (A, 198.18.0.1/24) – `ub0` (B, 198.18.0.2/24), MTU 1500, and a capture on `ub0` in
/// B. Trains of RoCE-PMTU-1024 packets go from A to B as GSO messages, twice: with the
/// veth taking GSO messages whole (its default), and with `gso_max_segs 1` on `ua0`,
/// which makes A's kernel segment before the device, as for a NIC without segmentation
/// offload. On the wire, every datagram carrying one packet must have DF, the
/// Identification k of its place in its message, and an ICRC that is right for the IPv4
/// header as captured (checked by `uroce_wire` over that header, and found again by
/// the any-id receive check from a receiver's header); a datagram carrying a whole
/// message must have ID 0 and DF and hold the packets sealed for 0, 1, 2, ….
#[test]
#[ignore = "runs only inside a private network namespace, started by the test above"]
fn veth_segments_in_private_namespaces() {
    if std::env::var(VETH_CHILD).as_deref() != Ok("1") {
        return;
    }
    ip(&["link", "set", "lo", "up"]);
    let peer = PeerNamespace::new();
    let pid = peer.pid().to_string();
    ip(&["link", "add", "ua0", "type", "veth", "peer", "name", "ub0"]);
    ip(&["link", "set", "ub0", "netns", &pid]);
    ip(&["addr", "add", "198.18.0.1/24", "dev", "ua0"]);
    ip(&["link", "set", "ua0", "up"]);
    peer.ip(&["link", "set", "lo", "up"]);
    peer.ip(&["addr", "add", "198.18.0.2/24", "dev", "ub0"]);
    peer.ip(&["link", "set", "ub0", "up"]);

    let a = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    let dst = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)), ROCEV2_UDP_PORT);
    // Resolve the neighbour first (not port 4791: not captured), so that no packet of a
    // train waits for ARP.
    let warm = std::net::UdpSocket::bind((a, 0)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        warm.send_to(b"warm-up", (dst.ip(), 9)).unwrap();
        let neigh = Command::new("ip")
            .args(["neigh", "show", "198.18.0.2", "dev", "ua0"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&neigh.stdout).into_owned();
        if text.contains("REACHABLE") || text.contains("STALE") || text.contains("DELAY") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no ARP answer over the veth: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    const SEG: usize = 12 + 1024 + 4;
    let n: usize = 100;
    let per = per_message(SEG, true);
    let messages = n.div_ceil(per);
    let filter = format!("udp dst port {ROCEV2_UDP_PORT}");
    let prober = std::net::UdpSocket::bind((a, 0)).unwrap();
    let live = LiveCapture::start_on_probed("ub0", &filter, Some(peer.pid()), &|| {
        let _ = prober.send_to(PROBE, dst);
    })
    .unwrap();
    let mut rng = Rng::new(0x6773_6f0a);
    let mut sent = Vec::new();
    for round in 0..2 {
        if round == 1 {
            ip(&["link", "set", "dev", "ua0", "gso_max_segs", "1"]);
        }
        let mut tx = RoceSocket::bind_port(a, 0).unwrap();
        assert!(tx.gso_active(), "GSO supported");
        let mut buf = train_of(&mut rng, n, 1024, 600, 5000 * round as u32);
        send_train_all(&mut tx, dst, &mut buf, SEG);
        sent.push(expected(tx.local_addr(), dst, &buf, SEG, true));
        // Let the last message leave before the device changes.
        std::thread::sleep(Duration::from_millis(200));
    }
    let file = live.stop().unwrap();
    let bytes = std::fs::read(file.path()).unwrap();
    let reader = PcapReader::new(&bytes[..]).unwrap();
    let link = reader.link_type().unwrap();
    let captured: Vec<Vec<u8>> = reader
        .map(|r| {
            let (_, frame) = r.unwrap();
            let d = link.datagram(&frame).unwrap();
            [d.ip_header, d.udp_header, d.payload].concat()
        })
        .filter(|dg| Datagram::parse_ip(dg).map_or(true, |d| d.payload != PROBE))
        .collect();
    eprintln!(
        "{TEST}: veth captured {} datagrams for {} packets in {} messages per round",
        captured.len(),
        n,
        messages
    );

    // Sort the datagrams into the packets they carry: a whole message (ID 0, its packets
    // end to end) or one packet.
    let all_sent: Vec<Vec<u8>> = sent.concat();
    let mut next = 0;
    let mut solver = IdentSolver::new();
    let (mut whole, mut single) = (0, 0);
    for (i, dg) in captured.iter().enumerate() {
        let d = Datagram::parse_ip(dg).unwrap();
        let id = u16::from_be_bytes([d.ip_header[4], d.ip_header[5]]);
        assert_eq!(d.ip_header[6] & 0xe0, 0x40, "datagram {i}: DF, not MF");
        if d.payload.len() > SEG {
            // A GSO message taken whole by the device: ID 0, the packets sealed for
            // 0, 1, 2, … in their place.
            assert_eq!(id, 0, "datagram {i}: a whole message has ID 0");
            let count = d.payload.len().div_ceil(SEG);
            let want: Vec<u8> = all_sent[next..next + count].concat();
            assert!(
                d.payload == &want[..],
                "datagram {i}: the message's packets"
            );
            whole += 1;
            next += count;
            continue;
        }
        assert!(
            d.payload == &all_sent[next][..],
            "datagram {i}: packet {next}"
        );
        assert_eq!(
            id as usize,
            (next % n) % per,
            "datagram {i}: Identification = place in its message"
        );
        d.verify_icrc()
            .unwrap_or_else(|e| panic!("datagram {i}: ICRC over the captured header: {e}"));
        // A receiver, which sees no header, finds the same Identification.
        let mut receiver_ip = [0u8; 20];
        receiver_ip.copy_from_slice(d.ip_header);
        receiver_ip[4..6].copy_from_slice(&[0, 0]);
        assert_eq!(
            identify(&mut solver, &receiver_ip, d.udp_header, d.payload),
            Ok(Some(Ipv4Ident {
                identification: id,
                dont_fragment: true
            })),
            "datagram {i}"
        );
        single += 1;
        next += 1;
    }
    assert_eq!(next, 2 * n, "every packet was captured once");
    assert!(
        single >= n,
        "the second round was segmented before the device"
    );
    eprintln!(
        "{TEST}: veth: {whole} whole messages (ID 0, DF), {single} single-packet datagrams \
         with ID = place in message (DF), every ICRC right for the header on the wire"
    );
}
