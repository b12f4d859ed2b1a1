//! Two network devices bound to IPv6 addresses, an RC QP on each, SEND, RDMA WRITE,
//! RDMA READ and FETCH AND ADD between them, with every byte checked.
//!
//! `::1` is the only IPv6 loopback address and each device binds UDP 4791 on its own
//! address, so the test re-runs itself in a private network namespace (`unshare --net`),
//! where it may add addresses to the loopback device: `fd00::1` … `fd00::6` (`/128`,
//! without duplicate address detection, so they are usable at once). It is skipped, with a
//! note, when no namespace can be created or IPv6 is unavailable there
//! (`UROCE_REQUIRE_TOOLS=1` makes that a failure).
//!
//! Three rounds, each on a fresh pair of devices:
//! 1. GSO on, path MTU 4096, the loopback device as configured by default: send trains
//!    cross it whole and reach the receiver coalesced (the receive-split path over IPv6);
//! 2. GSO on, path MTU 1024, with `gso_max_segs 1` on the loopback device, so the kernel
//!    cuts every train into packets before the capture point;
//! 3. GSO off, path MTU 1024 (one datagram per packet from the start).
//!
//! Rounds 2 and 3 run under a live capture (when the capture tool and scapy are
//! available): every captured packet must be IPv6 between the round's addresses, and its
//! ICRC must be the one scapy's RoCE module computes over the IPv6 and UDP headers as
//! captured — an oracle independent of uroce's sealing code. The number of captured
//! packets must equal what the devices counted as sent and as received.

#[path = "support/pair.rs"]
mod pair;
mod support;

use std::net::{IpAddr, Ipv6Addr};
use std::process::Command;
use std::time::Duration;

use uroce_net::NetDevice;
use uroce_verbs::{
    AtomicInfo, Gid, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, WcOpcode, WcStatus,
};
use uroce_wire::pcap::PcapReader;
use uroce_wire::{Pmtu, ROCEV2_UDP_PORT};

use pair::{connect, first_difference, pattern, wait, ConnectOpts, Side, SideConfig};
use support::{LiveCapture, TempFile};

const TEST: &str = "ipv6_pair";
/// Environment variable that lets the child test run (inside the private namespace).
const NETNS_CHILD: &str = "UROCE_IPV6_NETNS_CHILD";
/// Name of the child test.
const CHILD_TEST: &str = "rc_over_ipv6_in_a_private_namespace";
/// What the child prints (then the reason) when the namespace cannot be set up for IPv6
/// (the parent turns it into a skip).
const UNAVAILABLE: &str = "IPV6 NAMESPACE UNAVAILABLE:";
/// How long one operation may take.
const OP_LIMIT: Duration = Duration::from_secs(20);

/// Message sizes: several packets at either path MTU, none a multiple of it.
const SEND_LEN: usize = 100 * 1024 + 123;
const WRITE_LEN: usize = 200 * 1024 + 5;
const READ_LEN: usize = 150 * 1024 + 77;
/// Where WRITEs land in the responder's region, and where READs land in the requester's.
const WRITE_OFF: usize = 4096;
const READ_DST_OFF: usize = 512 * 1024;
/// Offsets of the atomic target (responder) and of the fetched value (requester).
const ATOMIC_OFF: usize = 1000 * 1024;
const FETCH_OFF: usize = 1000 * 1024 + 64;

/// Runs [`rc_over_ipv6_in_a_private_namespace`] in a new network namespace.
#[test]
fn every_rc_operation_over_ipv6() {
    let Some(out) = support::run_in_new_netns(TEST, CHILD_TEST, NETNS_CHILD) else {
        return;
    };
    // The harness prints the child's output on its `test … ...` line: search anywhere.
    if let Some(at) = out.stdout.find(UNAVAILABLE) {
        let why = out.stdout[at..].lines().next().unwrap_or(UNAVAILABLE);
        support::skip(TEST, why);
        return;
    }
    assert!(
        out.status.success() && out.stdout.contains("1 passed"),
        "child test failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

/// Runs `ip args…` in the namespace; `Err` says why it failed.
fn ip(args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    let out = support::run(cmd, Duration::from_secs(20))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`ip {}`: {}", args.join(" "), out.stderr.trim()))
    }
}

/// `fd00::n`.
fn addr(n: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n)
}

/// Brings `lo` up and adds `fd00::1` … `fd00::6` to it.
fn set_up_namespace() -> Result<(), String> {
    ip(&["link", "set", "lo", "up"])?;
    for n in 1..=6 {
        let a = format!("{}/128", addr(n));
        ip(&["-6", "addr", "add", &a, "dev", "lo", "nodad"])?;
    }
    Ok(())
}

/// A device on `fd00::n`, checked to carry that address as its GID 0.
fn open_side(n: u16, name: &str, gso: bool) -> Side {
    let a = addr(n);
    let mut cfg = SideConfig::new(&a.to_string(), name);
    cfg.gso = gso;
    let side = Side::open(&cfg);
    assert_eq!(side.ip(), IpAddr::V6(a), "{name}: bound address");
    // RoCEv2: the GID of an IPv6 address is the address itself, all 16 bytes.
    let want = Gid(a.octets());
    assert_eq!(side.dev.gid(), want, "{name}: NetDevice::gid");
    assert_eq!(
        side.dev.device().gid(1, 0).expect("GID table entry 0"),
        want,
        "{name}: GID table entry 0"
    );
    assert_eq!(
        side.dev.context().query_gid(1, 0).expect("query_gid"),
        want,
        "{name}: query_gid(1, 0)"
    );
    assert_eq!(want, Gid::from_ip(IpAddr::V6(a)), "{name}: Gid::from_ip");
    side
}

/// Packets of a `len`-byte message at path MTU `mtu` (at least one).
fn packets(len: usize, mtu: Pmtu) -> u64 {
    len.div_ceil(mtu.bytes() as usize).max(1) as u64
}

/// Reads `len` bytes at `off` of `side`'s region.
fn read_back(side: &Side, off: usize, len: usize) -> Vec<u8> {
    let mut got = vec![0; len];
    side.mr.block().copy_out(off, &mut got).expect("copy out");
    got
}

/// Panics with the first differing offset if `got` is not `want`.
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = first_difference(got, want) {
        panic!(
            "{what}: bytes differ from offset {i} on (got {} bytes, want {})",
            got.len(),
            want.len()
        );
    }
}

/// SEND, RDMA WRITE, RDMA READ and FETCH AND ADD from `a` to `b` (connected at path
/// MTU `mtu`), every byte checked; `key` makes each round's data distinct.
fn every_op(a: &Side, b: &Side, mtu: Pmtu, key: u64, what: &str) {
    // SEND, segmented, into a posted receive.
    let data = pattern(key, SEND_LEN);
    a.mr.block().copy_in(0, &data).expect("fill");
    b.mr.block().fill(0, SEND_LEN + 64, 0).expect("clear");
    b.qp.post_recv(RecvWr::new(70, vec![b.sge(0, SEND_LEN + 64)]))
        .expect("post recv");
    a.qp.post_send(SendWr::send(1, vec![a.sge(0, SEND_LEN)]))
        .expect("post send");
    let wc = wait(&a.send_cq, 1, OP_LIMIT, what);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send),
        "{what}: SEND completion"
    );
    let wc = wait(&b.recv_cq, 1, OP_LIMIT, what);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (70, WcStatus::Success, WcOpcode::Recv),
        "{what}: receive completion"
    );
    assert_eq!(wc[0].byte_len as usize, SEND_LEN, "{what}: received length");
    same_bytes(&read_back(b, 0, SEND_LEN), &data, &format!("{what}: SEND"));
    assert_eq!(
        read_back(b, SEND_LEN, 64),
        vec![0; 64],
        "{what}: bytes past the SEND"
    );

    // RDMA WRITE into the responder at WRITE_OFF.
    let data = pattern(key + 1, WRITE_LEN);
    a.mr.block().copy_in(0, &data).expect("fill");
    let write = SendWr {
        wr_id: 2,
        opcode: SendOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED,
        sg_list: vec![a.sge(0, WRITE_LEN)].into(),
        rdma: RdmaInfo {
            remote_addr: b.va(WRITE_OFF),
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(write).expect("post write");
    let wc = wait(&a.send_cq, 1, OP_LIMIT, what);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite),
        "{what}: WRITE completion"
    );
    same_bytes(
        &read_back(b, WRITE_OFF, WRITE_LEN),
        &data,
        &format!("{what}: WRITE"),
    );

    // RDMA READ of fresh responder data into a cleared part of the requester's region.
    let data = pattern(key + 2, READ_LEN);
    b.mr.block().copy_in(WRITE_OFF, &data).expect("fill");
    a.mr.block().fill(READ_DST_OFF, READ_LEN, 0).expect("clear");
    let read = SendWr {
        wr_id: 3,
        opcode: SendOpcode::RdmaRead,
        flags: SendFlags::SIGNALED,
        sg_list: vec![a.sge(READ_DST_OFF, READ_LEN)].into(),
        rdma: RdmaInfo {
            remote_addr: b.va(WRITE_OFF),
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(read).expect("post read");
    let wc = wait(&a.send_cq, 1, OP_LIMIT, what);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (3, WcStatus::Success, WcOpcode::RdmaRead),
        "{what}: READ completion"
    );
    same_bytes(
        &read_back(a, READ_DST_OFF, READ_LEN),
        &data,
        &format!("{what}: READ"),
    );

    // FETCH AND ADD: the requester gets the old value, the responder holds the sum.
    let old = 0x0123_4567_89ab_cdef ^ key;
    let add = 0x1111_0000_2222_0003;
    b.mr.block().atomic_store(ATOMIC_OFF, old).expect("store");
    a.mr.block().atomic_store(FETCH_OFF, 0).expect("clear");
    let fa = SendWr {
        wr_id: 4,
        opcode: SendOpcode::AtomicFetchAndAdd,
        flags: SendFlags::SIGNALED,
        sg_list: vec![a.sge(FETCH_OFF, 8)].into(),
        atomic: AtomicInfo {
            remote_addr: b.va(ATOMIC_OFF),
            compare_add: add,
            swap: 0,
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(fa).expect("post fetch-add");
    let wc = wait(&a.send_cq, 1, OP_LIMIT, what);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (4, WcStatus::Success, WcOpcode::FetchAdd),
        "{what}: FETCH AND ADD completion"
    );
    assert_eq!(
        a.mr.block().atomic_load(FETCH_OFF).expect("load"),
        old,
        "{what}: fetched value"
    );
    assert_eq!(
        b.mr.block().atomic_load(ATOMIC_OFF).expect("load"),
        old.wrapping_add(add),
        "{what}: sum at the responder"
    );

    // Counters: traffic both ways, nothing dropped as damaged or malformed. The
    // requester sent at least one packet per MTU of each request (SEND and WRITE data,
    // one READ request, one atomic request), and the responder received them.
    let requests = packets(SEND_LEN, mtu) + packets(WRITE_LEN, mtu) + 1 + 1;
    for (side, name) in [(a, "requester"), (b, "responder")] {
        let c = side.dev.counters();
        let s = &c.socket;
        assert!(
            s.tx_packets > 0 && s.rx_packets > 0,
            "{what}: {name} counters {c:?}"
        );
        assert_eq!(s.bad_icrc, 0, "{what}: {name} bad ICRC: {c:?}");
        assert_eq!(s.unverified_icrc, 0, "{what}: {name} unverified: {c:?}");
        assert_eq!(s.parse_errors, 0, "{what}: {name} parse errors: {c:?}");
        assert_eq!(s.truncated, 0, "{what}: {name} truncated: {c:?}");
        assert_eq!(s.bad_source, 0, "{what}: {name} bad source: {c:?}");
        assert_eq!(c.unknown_qpn, 0, "{what}: {name} unknown QPN: {c:?}");
    }
    let qa = a
        .dev
        .qp_counters(a.qp.qp_num())
        .expect("requester QP counters");
    let qb = b
        .dev
        .qp_counters(b.qp.qp_num())
        .expect("responder QP counters");
    assert!(
        qa.transport.packets_sent >= requests,
        "{what}: requester sent {} packets, want at least {requests}",
        qa.transport.packets_sent
    );
    assert!(
        qb.transport.packets_received >= requests,
        "{what}: responder received {} packets, want at least {requests}",
        qb.transport.packets_received
    );
    // READ responses: one per MTU of the READ, all received by the requester.
    let responses = packets(READ_LEN, mtu);
    assert!(
        qb.transport.packets_sent >= responses && qa.transport.packets_received >= responses,
        "{what}: READ responses: responder sent {}, requester received {}, want {responses}",
        qb.transport.packets_sent,
        qa.transport.packets_received
    );
}

/// One round: a pair on `fd00::n` / `fd00::n+1`, connected at `mtu`, every operation.
/// Returns the two devices' (tx, rx) packet counts.
fn round(n: u16, gso: bool, mtu: Pmtu, what: &str) -> (u64, u64) {
    let a = open_side(n, &format!("{what}-a"), gso);
    let b = open_side(n + 1, &format!("{what}-b"), gso);
    let opts = ConnectOpts {
        mtu,
        // 4.096 µs · 2^14 ≈ 67 ms: no spurious retransmissions on a loaded machine.
        timeout: 14,
        ..ConnectOpts::default()
    };
    connect(&a, &b, &opts);
    every_op(&a, &b, mtu, u64::from(n) << 8, what);
    // The other direction too, so each device both requests and responds over IPv6.
    every_op(
        &b,
        &a,
        mtu,
        (u64::from(n) << 8) + 0x80,
        &format!("{what} (reverse)"),
    );
    let tally = |d: &NetDevice| {
        let c = d.counters().socket;
        (c.tx_packets, c.rx_packets)
    };
    let (ta, ra) = tally(&a.dev);
    let (tb, rb) = tally(&b.dev);
    eprintln!(
        "{TEST}: {what}: [{}]:{} <-> [{}]:{}: tx {ta}/{tb}, rx {ra}/{rb} packets",
        a.ip(),
        a.dev.local_addr().port(),
        b.ip(),
        b.dev.local_addr().port()
    );
    a.close();
    b.close();
    (ta + tb, ra + rb)
}

/// Checks a capture of rounds 2 and 3: every RoCEv2 packet is IPv6 between `fd00::3` …
/// `fd00::6` on port 4791, and its ICRC is the one scapy computes over its headers.
/// Returns the number of packets.
fn check_capture(file: &TempFile) -> u64 {
    let bytes = std::fs::read(file.path()).expect("read capture");
    let reader = PcapReader::new(&bytes[..]).expect("pcap header");
    let link = reader.link_type().expect("known link type");
    let allowed: Vec<IpAddr> = (3..=6).map(|n| IpAddr::V6(addr(n))).collect();
    let mut lines = String::new();
    let mut icrcs = Vec::new();
    // Packets whose flow label is not zero (the ICRC covers it as all ones).
    let mut labelled = 0;
    for (i, r) in reader.enumerate() {
        let (_, frame) = r.expect("pcap record");
        let d = link.datagram(&frame).expect("an IP/UDP datagram");
        assert!(
            d.ip_header.len() == 40 && d.ip_header[0] >> 4 == 6,
            "packet {i}: IPv6"
        );
        assert!(
            allowed.contains(&d.src) && allowed.contains(&d.dst) && d.src != d.dst,
            "packet {i}: {} -> {}",
            d.src,
            d.dst
        );
        assert_eq!(
            (d.src_port, d.dst_port),
            (ROCEV2_UDP_PORT, ROCEV2_UDP_PORT),
            "packet {i}: ports"
        );
        if d.ip_header[1] & 0x0f != 0 || d.ip_header[2] != 0 || d.ip_header[3] != 0 {
            labelled += 1;
        }
        let icrc_at = d.payload.len().checked_sub(4).expect("ICRC present");
        icrcs.push(d.payload[icrc_at..].to_vec());
        let datagram = [d.ip_header, d.udp_header, d.payload].concat();
        lines.push_str(&format!("{i} {}\n", support::hex(&datagram)));
    }
    assert!(!icrcs.is_empty(), "nothing captured");
    eprintln!(
        "{TEST}: {labelled} of {} captured packets carry a flow label",
        icrcs.len()
    );
    let input = TempFile::new(TEST, "txt");
    std::fs::write(input.path(), lines).expect("write scapy input");
    let mut cmd = Command::new(support::python());
    cmd.arg(support::script("scapy_icrc.py")).arg(input.path());
    let out = support::run(cmd, Duration::from_secs(180)).expect("run scapy");
    assert!(out.status.success(), "scapy: {}", out.stderr);
    let answers: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(answers.len(), icrcs.len(), "scapy answered every packet");
    for (i, (line, wire)) in answers.iter().zip(&icrcs).enumerate() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(parts.len(), 5, "scapy line {line:?}");
        assert_eq!(parts[0], i.to_string(), "scapy line order");
        assert_eq!(
            parts[1],
            support::hex(wire),
            "packet {i}: ICRC on the wire vs scapy's over the captured IPv6 header"
        );
        assert_eq!(&parts[2..], ["na", "na", "na"], "packet {i}: IPv6 columns");
    }
    icrcs.len() as u64
}

/// Inside a private network namespace: the three rounds of the module docs.
#[test]
#[ignore = "runs only inside a private network namespace, started by the test above"]
fn rc_over_ipv6_in_a_private_namespace() {
    if std::env::var(NETNS_CHILD).as_deref() != Ok("1") {
        return;
    }
    if let Err(e) = set_up_namespace() {
        println!("{UNAVAILABLE} {e}");
        return;
    }

    // 1. GSO trains taken whole by the loopback device, coalesced at the receiver.
    round(1, true, Pmtu::Mtu4096, "gso-whole");

    // 2 and 3 under a live capture, the kernel cutting every train into packets.
    let cut = ip(&["link", "set", "dev", "lo", "gso_max_segs", "1"]);
    if let Err(e) = &cut {
        support::skip(
            TEST,
            &format!("the loopback device cannot be made to cut trains ({e}): no wire check"),
        );
    }
    let live = if cut.is_ok() && support::have_tshark(TEST) && support::have_scapy(TEST) {
        let filter = format!("udp port {ROCEV2_UDP_PORT}");
        Some(LiveCapture::start(&filter).expect("start live capture"))
    } else {
        None
    };
    let (tx2, rx2) = round(3, true, Pmtu::Mtu1024, "gso-cut");
    let (tx3, rx3) = round(5, false, Pmtu::Mtu1024, "no-gso");
    let (tx, rx) = (tx2 + tx3, rx2 + rx3);
    assert_eq!(
        tx, rx,
        "packets sent and received by the devices of rounds 2 and 3"
    );
    if let Some(live) = live {
        let file = live.stop().expect("stop live capture");
        let captured = check_capture(&file);
        assert_eq!(
            captured, tx,
            "captured packets vs packets the devices counted as sent"
        );
        eprintln!("{TEST}: {captured} captured IPv6 packets, every ICRC confirmed by scapy");
    }
}
