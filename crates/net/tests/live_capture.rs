//! Issue check: "The packets as the kernel really sent them are correct": a live capture on
//! the loopback interface while two network devices (127.0.5.1 and 127.0.5.2) run every
//! RC operation over two QP pairs, one at PMTU 1024 and one at PMTU 4096: SEND, SEND with
//! immediate, RDMA WRITE, WRITE with immediate, RDMA READ (each single- and
//! multi-packet), fetch-and-add and compare-and-swap, with their ACKs, READ responses and
//! atomic ACKs. Then:
//! * the capture holds exactly as many packets as both devices sent, and as both
//!   received;
//! * every captured packet is IPv4 with Identification 0 and DF between the two devices'
//!   port 4791, parses as a RoCEv2 packet, and fits its path MTU (FIRST and MIDDLE
//!   packets exactly the PMTU, as IBA segments);
//! * tshark decodes every packet as InfiniBand with nothing malformed and no warning, a
//!   good IPv4 header checksum and the header values uroce parses; per QP pair, tshark
//!   sees every RC opcode from SEND_FIRST (0x00) to FETCH_ADD (0x14);
//! * scapy (an independent ICRC implementation) computes, over the IP header as captured,
//!   the ICRC each packet carries, and dissects ID 0 / DF and a good header checksum;
//! * the device's own capture file (`NetConfig::capture`, on 127.0.5.1) opens cleanly in
//!   tshark (valid IPv4 and UDP checksums), holds as many packets as that device's
//!   tx + rx counters, and the same packets as the live capture (same RoCE bytes, same IP
//!   and UDP header fields that the ICRC covers); scapy verifies its ICRCs too.
//!
//! Needs tshark (with permission to capture on `lo`) and python3 with scapy; without them
//! the test is skipped with a note, or fails under `UROCE_REQUIRE_TOOLS=1`.

#[path = "support/pair.rs"]
mod pair;
mod support;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_verbs::{
    AtomicInfo, Qp, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, WcFlags, WcOpcode, WcStatus,
};
use uroce_wire::ip::Datagram;
use uroce_wire::pcap::PcapReader;
use uroce_wire::pmtu::Pmtu;
use uroce_wire::{icrc, PacketRepr};

use pair::{ConnectOpts, Side, SideConfig};
use support::{num, LiveCapture, TempFile, PI_WARN};

const TEST: &str = "live_capture";
const ADDR_A: &str = "127.0.5.1";
const ADDR_B: &str = "127.0.5.2";
const WAIT: Duration = Duration::from_secs(10);
/// Region layout (both sides): source / destination buffers and atomic words.
const BUF: usize = 0;
const READ_SRC: usize = 64 * 1024;
const ATOMIC: usize = 128 * 1024;
const RESULT: usize = 128 * 1024 + 64;
const MR_LEN: usize = 256 * 1024;

/// RC opcodes (IBA Vol 1 §9.2, BTH OpCode field): SEND_FIRST .. FETCH_ADD, with the names of
/// the IBA specification.
const RC_OPCODES: [(u8, &str); 21] = [
    (0x00, "SEND_FIRST"),
    (0x01, "SEND_MIDDLE"),
    (0x02, "SEND_LAST"),
    (0x03, "SEND_LAST_WITH_IMMEDIATE"),
    (0x04, "SEND_ONLY"),
    (0x05, "SEND_ONLY_WITH_IMMEDIATE"),
    (0x06, "RDMA_WRITE_FIRST"),
    (0x07, "RDMA_WRITE_MIDDLE"),
    (0x08, "RDMA_WRITE_LAST"),
    (0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE"),
    (0x0a, "RDMA_WRITE_ONLY"),
    (0x0b, "RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
    (0x0c, "RDMA_READ_REQUEST"),
    (0x0d, "RDMA_READ_RESPONSE_FIRST"),
    (0x0e, "RDMA_READ_RESPONSE_MIDDLE"),
    (0x0f, "RDMA_READ_RESPONSE_LAST"),
    (0x10, "RDMA_READ_RESPONSE_ONLY"),
    (0x11, "ACKNOWLEDGE"),
    (0x12, "ATOMIC_ACKNOWLEDGE"),
    (0x13, "COMPARE_SWAP"),
    (0x14, "FETCH_ADD"),
];
/// FIRST and MIDDLE packets, which carry exactly one PMTU of payload.
const FULL_PMTU_OPCODES: [u8; 6] = [0x00, 0x01, 0x06, 0x07, 0x0d, 0x0e];

/// One QP pair of the run and its path MTU.
struct Conn<'q> {
    qa: &'q Qp,
    qb: &'q Qp,
    mtu: usize,
}

/// Runs every RC operation from `a` to `b` over `c`, each checked, one at a time.
fn every_operation(a: &Side, b: &Side, c: &Conn<'_>, tag: u64) {
    let m = c.mtu;
    let what = |op: &str, len: usize| format!("PMTU {m}: {op} of {len} B");
    // Sends (with and without immediate), single- and multi-packet.
    for (len, imm) in [
        (1, None),
        (3 * m + 5, None),
        (10, Some(0x1234_5678)),
        (2 * m + 1, Some(7)),
    ] {
        let key = tag << 32 | len as u64;
        let data = pair::pattern(key, len);
        a.mr.block().copy_in(BUF, &data).expect("fill");
        c.qb.post_recv(RecvWr::new(key, vec![b.sge(BUF, MR_LEN / 4)]))
            .expect("post_recv");
        let mut wr = SendWr::send(key, vec![a.sge(BUF, len)]);
        if let Some(imm) = imm {
            wr.opcode = SendOpcode::SendWithImm;
            wr.imm_data = imm;
        }
        c.qa.post_send(wr).expect("post_send");
        let w = what(if imm.is_some() { "SEND+imm" } else { "SEND" }, len);
        let wa = pair::wait(&a.send_cq, 1, WAIT, &w);
        assert_eq!(
            (wa[0].wr_id, wa[0].status, wa[0].opcode),
            (key, WcStatus::Success, WcOpcode::Send),
            "{w}"
        );
        let wb = pair::wait(&b.recv_cq, 1, WAIT, &w);
        assert_eq!(
            (
                wb[0].wr_id,
                wb[0].status,
                wb[0].opcode,
                wb[0].byte_len as usize
            ),
            (key, WcStatus::Success, WcOpcode::Recv, len),
            "{w}"
        );
        assert_eq!(
            wb[0].wc_flags.contains(WcFlags::WITH_IMM),
            imm.is_some(),
            "{w}"
        );
        if let Some(imm) = imm {
            assert_eq!(wb[0].imm_data, imm, "{w}");
        }
        let mut got = vec![0; len];
        b.mr.block().copy_out(BUF, &mut got).expect("read");
        assert!(got == data, "{w}: data differs");
    }
    // Writes (with and without immediate), single- and multi-packet.
    for (len, imm) in [
        (7, None),
        (3 * m + 2, None),
        (9, Some(0xfeed_0001)),
        (2 * m + 3, Some(3)),
    ] {
        let key = tag << 32 | 0x8000_0000 | len as u64;
        let data = pair::pattern(key, len);
        a.mr.block().copy_in(BUF, &data).expect("fill");
        if imm.is_some() {
            c.qb.post_recv(RecvWr::new(key, Vec::new()))
                .expect("post_recv");
        }
        let wr = SendWr {
            wr_id: key,
            opcode: if imm.is_some() {
                SendOpcode::RdmaWriteWithImm
            } else {
                SendOpcode::RdmaWrite
            },
            flags: SendFlags::SIGNALED,
            sg_list: vec![a.sge(BUF, len)].into(),
            imm_data: imm.unwrap_or(0),
            rdma: RdmaInfo {
                remote_addr: b.va(BUF),
                rkey: b.mr.rkey(),
            },
            ..SendWr::default()
        };
        c.qa.post_send(wr).expect("post_send");
        let w = what(if imm.is_some() { "WRITE+imm" } else { "WRITE" }, len);
        let wa = pair::wait(&a.send_cq, 1, WAIT, &w);
        assert_eq!(
            (wa[0].wr_id, wa[0].status, wa[0].opcode),
            (key, WcStatus::Success, WcOpcode::RdmaWrite),
            "{w}"
        );
        if let Some(imm) = imm {
            let wb = pair::wait(&b.recv_cq, 1, WAIT, &w);
            assert_eq!(
                (wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].imm_data),
                (key, WcStatus::Success, WcOpcode::RecvRdmaWithImm, imm),
                "{w}"
            );
            assert_eq!(wb[0].byte_len as usize, len, "{w}");
        }
        let mut got = vec![0; len];
        b.mr.block().copy_out(BUF, &mut got).expect("read");
        assert!(got == data, "{w}: data differs");
    }
    // Reads, single- and multi-packet response.
    for len in [13, 3 * m + 1] {
        let key = tag << 32 | 0x4000_0000 | len as u64;
        let data = pair::pattern(key, len);
        b.mr.block().copy_in(READ_SRC, &data).expect("fill");
        let wr = SendWr {
            wr_id: key,
            opcode: SendOpcode::RdmaRead,
            flags: SendFlags::SIGNALED,
            sg_list: vec![a.sge(BUF, len)].into(),
            rdma: RdmaInfo {
                remote_addr: b.va(READ_SRC),
                rkey: b.mr.rkey(),
            },
            ..SendWr::default()
        };
        c.qa.post_send(wr).expect("post_send");
        let w = what("READ", len);
        let wa = pair::wait(&a.send_cq, 1, WAIT, &w);
        assert_eq!(
            (wa[0].wr_id, wa[0].status, wa[0].opcode),
            (key, WcStatus::Success, WcOpcode::RdmaRead),
            "{w}"
        );
        let mut got = vec![0; len];
        a.mr.block().copy_out(BUF, &mut got).expect("read");
        assert!(got == data, "{w}: data differs");
    }
    // Atomics: fetch-and-add 5 to 100, then compare 105 and swap in 9.
    b.mr.block().atomic_store(ATOMIC, 100).expect("store");
    for (opcode, wc_opcode, compare_add, swap, orig) in [
        (SendOpcode::AtomicFetchAndAdd, WcOpcode::FetchAdd, 5, 0, 100),
        (SendOpcode::AtomicCmpAndSwp, WcOpcode::CompSwap, 105, 9, 105),
    ] {
        let key = tag << 32 | 0x2000_0000 | opcode as u64;
        let wr = SendWr {
            wr_id: key,
            opcode,
            flags: SendFlags::SIGNALED,
            sg_list: vec![a.sge(RESULT, 8)].into(),
            atomic: AtomicInfo {
                remote_addr: b.va(ATOMIC),
                compare_add,
                swap,
                rkey: b.mr.rkey(),
            },
            ..SendWr::default()
        };
        c.qa.post_send(wr).expect("post_send");
        let w = what(&format!("{opcode:?}"), 8);
        let wa = pair::wait(&a.send_cq, 1, WAIT, &w);
        assert_eq!(
            (wa[0].wr_id, wa[0].status, wa[0].opcode),
            (key, WcStatus::Success, wc_opcode),
            "{w}"
        );
        assert_eq!(a.mr.block().atomic_load(RESULT).expect("load"), orig, "{w}");
    }
    assert_eq!(b.mr.block().atomic_load(ATOMIC).expect("load"), 9);
}

/// The IP datagrams (IP header..ICRC) of a pcap file.
fn read_capture(file: &std::path::Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(file).expect("read capture");
    let reader = PcapReader::new(&bytes[..]).expect("capture header");
    let link = reader.link_type().expect("known link type");
    reader
        .map(|r| {
            let (_, frame) = r.expect("capture record");
            let d = link.datagram(&frame).expect("IP/UDP datagram");
            [d.ip_header, d.udp_header, d.payload].concat()
        })
        .collect()
}

/// The IPv4 header with the fields the ICRC masks (TOS, TTL, checksum; IBA Vol 1
/// Annex A17) set to all-ones.
fn covered(ip_header: &[u8]) -> Vec<u8> {
    let mut h = ip_header.to_vec();
    for i in [1, 8, 10, 11] {
        h[i] = 0xff;
    }
    h
}

/// Runs the scapy ICRC oracle over `datagrams` and checks every answer: ICRC equal to the
/// packet's, IPv4 header checksum good, ID 0, DF set.
fn scapy_check(datagrams: &[Vec<u8>], what: &str) {
    let input = TempFile::new(&format!("{TEST}-scapy"), "txt");
    let mut lines = String::new();
    for (i, dg) in datagrams.iter().enumerate() {
        writeln!(lines, "{i} {}", support::hex(dg)).expect("format");
    }
    std::fs::write(input.path(), lines).expect("write scapy input");
    let mut cmd = Command::new(support::python());
    cmd.arg(support::script("scapy_icrc.py")).arg(input.path());
    let out = support::run(cmd, Duration::from_secs(300)).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "scapy script failed: {}", out.stderr);
    let answers: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        answers.len(),
        datagrams.len(),
        "{what}: one scapy answer per packet"
    );
    for (i, (line, dg)) in answers.iter().zip(datagrams).enumerate() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let icrc = support::hex(&dg[dg.len() - 4..]);
        assert_eq!(
            parts,
            [i.to_string().as_str(), icrc.as_str(), "ok", "0", "1"],
            "{what} packet {i}: scapy's ICRC / checksum / ID / DF"
        );
    }
}

#[test]
fn every_rc_operation_as_the_kernel_sent_it_decodes_and_verifies() {
    if !support::have_tshark(TEST) || !support::have_scapy(TEST) {
        return;
    }
    let own = TempFile::new(&format!("{TEST}-own"), "pcap");
    let mut cfg_a = SideConfig::new(ADDR_A, "lc-a");
    cfg_a.capture = Some(own.path().to_path_buf());
    cfg_a.mr_len = MR_LEN;
    let mut cfg_b = SideConfig::new(ADDR_B, "lc-b");
    cfg_b.mr_len = MR_LEN;
    // On `lo` a GSO message is captured before segmentation, as one datagram of many
    // packets (the receiving kernel splits it): no capture tool decodes that as RoCE. So
    // this run sends packet by packet; tests/gso.rs checks GSO segments as they appear
    // once segmented (in a network namespace whose `lo` segments every message).
    cfg_a.gso = false;
    cfg_b.gso = false;
    let a = Side::open(&cfg_a);
    let b = Side::open(&cfg_b);
    let (qa2, qb2) = (a.add_qp(), b.add_qp());
    let conns = [
        Conn {
            qa: &a.qp,
            qb: &b.qp,
            mtu: 1024,
        },
        Conn {
            qa: &qa2,
            qb: &qb2,
            mtu: 4096,
        },
    ];
    for (c, pmtu) in conns.iter().zip([Pmtu::Mtu1024, Pmtu::Mtu4096]) {
        // Nothing is lost on loopback; a long local ACK timeout (67 ms) keeps a loaded
        // machine from adding spurious retransmissions.
        let opts = ConnectOpts {
            mtu: pmtu,
            timeout: 14,
            ..ConnectOpts::default()
        };
        pair::connect_qps(&a, c.qa, &b, c.qb, &opts);
    }

    let filter = format!(
        "udp src port 4791 and udp dst port 4791 and \
         (src host {ADDR_A} or src host {ADDR_B}) and (dst host {ADDR_A} or dst host {ADDR_B})"
    );
    let live = match LiveCapture::start(&filter) {
        Ok(c) => c,
        Err(e) => {
            support::skip(TEST, &format!("cannot capture on lo: {e}"));
            return;
        }
    };
    let start = Instant::now();
    for (i, c) in conns.iter().enumerate() {
        every_operation(&a, &b, c, i as u64 + 1);
    }
    // Everything is acknowledged: nothing more may be sent.
    std::thread::sleep(Duration::from_millis(200));
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    let file = live.stop().unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let run_time = start.elapsed();
    assert_eq!(a.dev.counters(), ca, "A sent or received after the run");
    assert_eq!(b.dev.counters(), cb, "B sent or received after the run");
    let qpn = |q: &Qp| q.qp_num();
    let conn_qpns: Vec<[u32; 2]> = conns.iter().map(|c| [qpn(c.qa), qpn(c.qb)]).collect();
    drop((qa2, qb2));
    a.close(); // flushes the device's own capture
    drop(b);

    // 1. Counts: every packet either device sent is in the capture, once.
    let kernel = read_capture(file.path());
    let (tx, rx) = (
        ca.socket.tx_packets + cb.socket.tx_packets,
        ca.socket.rx_packets + cb.socket.rx_packets,
    );
    eprintln!(
        "{TEST}: {} packets captured in {run_time:?}; A tx {} rx {}, B tx {} rx {}; \
         retransmitted {}",
        kernel.len(),
        ca.socket.tx_packets,
        ca.socket.rx_packets,
        cb.socket.tx_packets,
        cb.socket.rx_packets,
        ca.transport.retransmitted_packets + cb.transport.retransmitted_packets
    );
    assert_eq!(
        kernel.len() as u64,
        tx,
        "captured packets vs. both devices' tx_packets"
    );
    assert_eq!(
        kernel.len() as u64,
        rx,
        "captured packets vs. both devices' rx_packets"
    );
    assert_eq!(ca.socket.bad_icrc + cb.socket.bad_icrc, 0);

    // 2. uroce's reading of the kernel's packets: headers, ICRC, segmentation.
    let (ip_a, ip_b): (IpAddr, IpAddr) = (ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap());
    let mut reprs = Vec::new();
    for (i, dg) in kernel.iter().enumerate() {
        let what = format!("captured packet {i}");
        let d = Datagram::parse_ip(dg).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(d.ip_header.len(), 20, "{what}: IPv4 without options");
        assert!(
            (d.src, d.dst) == (ip_a, ip_b) || (d.src, d.dst) == (ip_b, ip_a),
            "{what}: {} -> {}",
            d.src,
            d.dst
        );
        assert_eq!((d.src_port, d.dst_port), (4791, 4791), "{what}");
        assert_eq!(&d.ip_header[4..8], &[0, 0, 0x40, 0], "{what}: ID 0, DF");
        icrc::verify(d.ip_header, d.udp_header, d.payload)
            .unwrap_or_else(|e| panic!("{what}: ICRC over the captured header: {e}"));
        let repr = PacketRepr::parse(d.payload).unwrap_or_else(|e| panic!("{what}: {e}"));
        let conn = conn_qpns
            .iter()
            .position(|q| q.contains(&repr.bth.dest_qp))
            .unwrap_or_else(|| panic!("{what}: to unknown QP {}", repr.bth.dest_qp));
        let mtu = [1024, 4096][conn];
        let op = repr.bth.opcode;
        assert!(repr.payload.len() <= mtu, "{what}: payload over PMTU {mtu}");
        if FULL_PMTU_OPCODES.contains(&op) {
            assert_eq!(
                repr.payload.len(),
                mtu,
                "{what}: opcode {op:#04x} at PMTU {mtu}"
            );
        }
        reprs.push((conn, repr));
    }

    // 3. tshark's decode of the kernel's packets.
    let rows = support::tshark_decode(file.path());
    assert_eq!(rows.len(), kernel.len(), "tshark rows");
    let mut seen: [BTreeSet<u8>; 2] = [BTreeSet::new(), BTreeSet::new()];
    for (i, (row, (conn, repr))) in rows.iter().zip(&reprs).enumerate() {
        let what = format!("captured packet {i} (opcode {:#04x})", repr.bth.opcode);
        assert_eq!(row.number("udp.dstport"), Some(4791), "{what}");
        assert!(row.all("_ws.malformed").is_empty(), "{what}: malformed");
        for (sev, msg) in row
            .all("_ws.expert.severity")
            .iter()
            .zip(row.all("_ws.expert.message"))
        {
            assert!(num(sev) < PI_WARN, "{what}: expert info {sev} {msg:?}");
        }
        assert_eq!(
            row.number("ip.checksum.status"),
            Some(1),
            "{what}: IPv4 checksum"
        );
        let opcode = row
            .number("infiniband.bth.opcode")
            .unwrap_or_else(|| panic!("{what}: tshark found no BTH"));
        seen[*conn].insert(u8::try_from(opcode).expect("opcode"));
        let roce = Datagram::parse_ip(&kernel[i])
            .expect("parsed above")
            .payload;
        let crc = u32::from_le_bytes(roce[roce.len() - 4..].try_into().expect("4 bytes"));
        let pad = (repr.payload.len().wrapping_neg() % 4) as u8;
        support::check_decoded(row, repr, pad, crc, &what);
    }
    for (conn, seen) in seen.iter().enumerate() {
        let missing: Vec<&str> = RC_OPCODES
            .iter()
            .filter(|(op, _)| !seen.contains(op))
            .map(|(_, name)| *name)
            .collect();
        assert!(
            missing.is_empty(),
            "PMTU {}: tshark saw no {missing:?}",
            [1024, 4096][conn]
        );
    }

    // 4. scapy's ICRC over the headers as captured.
    scapy_check(&kernel, "live capture");

    // 5. The device's own capture.
    let ours = read_capture(own.path());
    assert_eq!(
        ours.len() as u64,
        ca.socket.tx_packets + ca.socket.rx_packets,
        "own capture vs. A's tx + rx"
    );
    let rows = support::tshark_fields(
        own.path(),
        &[
            "_ws.malformed",
            "_ws.expert.severity",
            "ip.checksum.status",
            "udp.checksum.status",
            "infiniband.bth.opcode",
        ],
        &[
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
        ],
    );
    assert_eq!(rows.len(), ours.len(), "tshark rows of the own capture");
    for (i, (row, dg)) in rows.iter().zip(&ours).enumerate() {
        let what = format!("own capture packet {i}");
        assert!(row.all("_ws.malformed").is_empty(), "{what}: malformed");
        for sev in row.all("_ws.expert.severity") {
            assert!(num(sev) < PI_WARN, "{what}: expert info {sev}");
        }
        assert_eq!(
            row.number("ip.checksum.status"),
            Some(1),
            "{what}: IPv4 checksum"
        );
        assert_eq!(
            row.number("udp.checksum.status"),
            Some(1),
            "{what}: UDP checksum"
        );
        let d = Datagram::parse_ip(dg).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            row.number("infiniband.bth.opcode"),
            d.payload.first().map(|&b| u64::from(b)),
            "{what}"
        );
    }
    // The same packets as the kernel's (A takes part in every one), in the fields the
    // ICRC covers and in every RoCE byte.
    let key = |dg: &Vec<u8>| {
        let d = Datagram::parse_ip(dg).expect("parsed above");
        (
            covered(d.ip_header),
            d.udp_header[..6].to_vec(),
            d.payload.to_vec(),
        )
    };
    let mut k: Vec<_> = kernel.iter().map(key).collect();
    let mut o: Vec<_> = ours.iter().map(key).collect();
    k.sort();
    o.sort();
    assert!(
        k == o,
        "the own capture holds other packets than the kernel sent"
    );
    scapy_check(&ours, "own capture");
    eprintln!(
        "{TEST}: {} + {} packets checked in {:?}",
        kernel.len(),
        ours.len(),
        start.elapsed()
    );
}
