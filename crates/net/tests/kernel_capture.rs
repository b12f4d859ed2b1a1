//! "The packets as the kernel really sent them are correct": a live capture on the
//! loopback interface while a uroce socket sends a packet of every RC opcode (over IPv4,
//! 127.0.0.1 → 127.0.0.2:4791, and IPv6, ::1 → ::1:4791), then, for every captured
//! packet:
//! * the IPv4 header the kernel emitted has Identification 0 and DF (docs/INTEROP-NOTES.md §1),
//!   and every field the ICRC covers equals the header uroce reconstructs;
//! * tshark decodes it with nothing malformed and no warning, a good IPv4 header
//!   checksum, and the header fields uroce emitted;
//! * scapy (an independent ICRC implementation) computes, over the IP header *as
//!   captured*, the ICRC the packet carries, and dissects ID 0 / DF itself;
//! * uroce's own `icrc::verify` over the captured headers is Ok, and so is
//!   `verify_icrc`'s reconstruction.
//!
//! The same packets are also written by uroce's own [`Capture`] at both ends; tshark must
//! find those files well-formed with valid IPv4 and UDP checksums, and their IP and UDP
//! headers must equal the kernel's in every field the ICRC covers.
//!
//! Needs tshark (with permission to capture on `lo`) and python3 with scapy; without them
//! the test is skipped with a note, or fails under `UROCE_REQUIRE_TOOLS=1`.

mod support;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_net::{verify_icrc, Capture, IcrcCheck, OutPacket, RecvBatch, RecvStatus, RoceSocket};
use uroce_wire::ip::{roce_headers, Datagram, Endpoints};
use uroce_wire::opcode::{Transport, OPCODE_TABLE};
use uroce_wire::pcap::PcapReader;
use uroce_wire::{icrc, ROCEV2_UDP_PORT};

use support::{num, LiveCapture, Rng, Sample, TempFile, PI_WARN};

const TEST: &str = "kernel_capture";
const SEED: u64 = 0x6b65_726e_656c_0001;

struct Sent {
    sample: Sample,
    src: SocketAddr,
    dst: SocketAddr,
}

struct Pair {
    tx: RoceSocket,
    rx: RoceSocket,
    tx_file: TempFile,
    rx_file: TempFile,
}

fn pair(rx_addr: IpAddr, tx_addr: IpAddr, tag: &str) -> Result<Pair, String> {
    let rx = RoceSocket::bind(rx_addr).map_err(|e| e.to_string())?;
    let tx = RoceSocket::bind_port(tx_addr, 0).map_err(|e| e.to_string())?;
    let mut p = Pair {
        tx,
        rx,
        tx_file: TempFile::new(&format!("{TEST}-{tag}-tx"), "pcap"),
        rx_file: TempFile::new(&format!("{TEST}-{tag}-rx"), "pcap"),
    };
    p.tx.set_capture(Some(
        Capture::create(p.tx_file.path()).map_err(|e| e.to_string())?,
    ));
    p.rx.set_capture(Some(
        Capture::create(p.rx_file.path()).map_err(|e| e.to_string())?,
    ));
    Ok(p)
}

/// The IP header with the fields the ICRC masks set to all-ones (IBA Vol 1 Annex A17).
fn covered(ip_header: &[u8]) -> Vec<u8> {
    let mut h = ip_header.to_vec();
    if h.len() == 20 {
        h[1] = 0xff; // TOS
        h[8] = 0xff; // TTL
        h[10] = 0xff; // checksum
        h[11] = 0xff;
    } else {
        h[0] |= 0x0f; // traffic class, flow label
        h[1] = 0xff;
        h[2] = 0xff;
        h[3] = 0xff;
        h[7] = 0xff; // hop limit
    }
    h
}

fn read_capture(file: &std::path::Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(file).expect("read capture");
    let reader = PcapReader::new(&bytes[..]).expect("capture header");
    let link = reader.link_type().expect("known link type");
    reader
        .map(|r| {
            let (_, frame) = r.expect("capture record");
            // Keep only the IP datagram.
            let d = link.datagram(&frame).expect("IP/UDP datagram");
            let mut dg = d.ip_header.to_vec();
            dg.extend_from_slice(d.udp_header);
            dg.extend_from_slice(d.payload);
            dg
        })
        .collect()
}

#[test]
fn packets_as_the_kernel_sent_them_decode_and_verify() {
    if !support::have_tshark(TEST) || !support::have_scapy(TEST) {
        return;
    }
    let v4 = match pair(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
        "v4",
    ) {
        Ok(p) => p,
        Err(e) => {
            support::skip(TEST, &format!("cannot bind 127.0.0.2:4791: {e}"));
            return;
        }
    };
    let v6 = match pair(
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        "v6",
    ) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("{TEST}: IPv6 part skipped: cannot bind [::1]:4791 ({e})");
            None
        }
    };
    let mut pairs: Vec<Pair> = std::iter::once(v4).chain(v6).collect();

    // Every RC opcode, twice, with different random header values and payloads.
    let mut rng = Rng::new(SEED);
    let rc_ops: Vec<_> = OPCODE_TABLE
        .iter()
        .filter(|i| i.transport == Transport::Rc)
        .collect();
    let mut sent: Vec<Sent> = Vec::new();
    let mut per_pair = Vec::new();
    for p in &pairs {
        let (src, dst) = (p.tx.local_addr(), p.rx.local_addr());
        assert_eq!(dst.port(), ROCEV2_UDP_PORT);
        let first = sent.len();
        for round in 0..2 {
            for info in &rc_ops {
                let mut sample = support::random_sample(&mut rng, info, 64 + 200 * round);
                p.tx.seal(dst, &mut sample.roce).unwrap();
                sent.push(Sent { sample, src, dst });
            }
        }
        per_pair.push(first..sent.len());
    }

    // Only this test's flows, so that other RoCE traffic on lo cannot disturb the count.
    let sources: Vec<String> = pairs
        .iter()
        .map(|p| format!("udp src port {}", p.tx.local_addr().port()))
        .collect();
    let filter = format!(
        "udp dst port {ROCEV2_UDP_PORT} and ({})",
        sources.join(" or ")
    );
    let live = match LiveCapture::start(&filter) {
        Ok(c) => c,
        Err(e) => {
            support::skip(TEST, &format!("cannot capture on lo: {e}"));
            return;
        }
    };
    let start = Instant::now();
    let mut batch = RecvBatch::default();
    for (p, range) in pairs.iter_mut().zip(&per_pair) {
        let out: Vec<_> = sent[range.clone()]
            .iter()
            .map(|s| OutPacket {
                dst: s.dst,
                roce: &s.sample.roce,
            })
            .collect();
        support::send_all(&mut p.tx, &out);
        let got = support::recv_until(&mut p.rx, &mut batch, out.len(), Duration::from_secs(10));
        assert_eq!(got.len(), out.len(), "every packet arrives");
        for (g, s) in got.iter().zip(&sent[range.clone()]) {
            assert_eq!(g.bytes, s.sample.roce);
            // Every opcode, FLUSH included, parses and arrives with a good ICRC.
            assert_eq!(g.status, RecvStatus::Accepted(IcrcCheck::Ok));
        }
    }
    let file = live.stop().unwrap_or_else(|e| panic!("{TEST}: {e}"));
    eprintln!(
        "{TEST}: sent {} packets under capture in {:?}",
        sent.len(),
        start.elapsed()
    );
    for p in &mut pairs {
        for s in [&mut p.tx, &mut p.rx] {
            let mut c = s.set_capture(None).expect("capture set");
            c.flush().unwrap();
        }
    }

    // 1. The kernel's headers.
    let kernel = read_capture(file.path());
    assert_eq!(
        kernel.len(),
        sent.len(),
        "the capture holds exactly the packets sent"
    );
    let mut ttls = std::collections::BTreeSet::new();
    let mut flow_labels = 0;
    for (i, (dg, s)) in kernel.iter().zip(&sent).enumerate() {
        let what = format!("packet {i} (opcode {:#04x})", s.sample.roce[0]);
        let d = Datagram::parse_ip(dg).unwrap();
        assert_eq!(d.payload, &s.sample.roce[..], "{what}: payload");
        assert_eq!(
            d.endpoints(),
            Endpoints {
                src: s.src.ip(),
                dst: s.dst.ip(),
                src_port: s.src.port(),
                dst_port: s.dst.port(),
            },
            "{what}"
        );
        if d.ip_header.len() == 20 {
            let id = u16::from_be_bytes([d.ip_header[4], d.ip_header[5]]);
            let flags = u16::from_be_bytes([d.ip_header[6], d.ip_header[7]]);
            assert_eq!(id, 0, "{what}: IPv4 Identification");
            assert_eq!(flags, 0x4000, "{what}: DF set, no fragment offset");
            ttls.insert(d.ip_header[8]);
        } else {
            let label =
                u32::from_be_bytes([0, d.ip_header[1], d.ip_header[2], d.ip_header[3]]) & 0xf_ffff;
            flow_labels += usize::from(label != 0);
        }
        icrc::verify(d.ip_header, d.udp_header, d.payload)
            .unwrap_or_else(|e| panic!("{what}: ICRC over the captured header: {e}"));
        assert_eq!(
            verify_icrc(s.src, s.dst, d.payload),
            IcrcCheck::Ok,
            "{what}"
        );
        let mut rebuilt = [0u8; 48];
        let (ip_len, _) = roce_headers(&d.endpoints(), d.payload.len(), &mut rebuilt).unwrap();
        assert_eq!(
            covered(d.ip_header),
            covered(&rebuilt[..ip_len]),
            "{what}: the fields the ICRC covers"
        );
        assert_eq!(
            d.udp_header[..6],
            rebuilt[ip_len..ip_len + 6],
            "{what}: UDP"
        );
    }
    eprintln!(
        "{TEST}: kernel headers: IPv4 ID 0 + DF on all {} IPv4 packets, TTL {:?}; \
         {flow_labels} IPv6 packets with a non-zero flow label (masked by the ICRC)",
        per_pair[0].len(),
        ttls
    );

    // 2. tshark decodes every captured packet as emitted.
    let rows = support::tshark_decode(file.path());
    assert_eq!(rows.len(), sent.len());
    for (i, (row, s)) in rows.iter().zip(&sent).enumerate() {
        let what = format!("packet {i} (opcode {:#04x})", s.sample.roce[0]);
        assert_eq!(row.number("udp.dstport"), Some(4791), "{what}");
        assert!(row.all("_ws.malformed").is_empty(), "{what}: malformed");
        for (sev, msg) in row
            .all("_ws.expert.severity")
            .iter()
            .zip(row.all("_ws.expert.message"))
        {
            assert!(num(sev) < PI_WARN, "{what}: expert info {sev} {msg:?}");
        }
        if s.src.is_ipv4() {
            assert_eq!(row.number("ip.checksum.status"), Some(1), "{what}");
        }
        let repr = uroce_wire::PacketRepr {
            payload: &s.sample.payload,
            ..s.sample.repr
        };
        let pad = (s.sample.payload.len().wrapping_neg() % 4) as u8;
        let n = s.sample.roce.len();
        let crc = u32::from_le_bytes(s.sample.roce[n - 4..].try_into().unwrap());
        support::check_decoded(row, &repr, pad, crc, &what);
    }

    // 3. scapy's ICRC over the header as captured, and its reading of ID / DF.
    let input = TempFile::new(TEST, "txt");
    let mut lines = String::new();
    for (i, dg) in kernel.iter().enumerate() {
        writeln!(lines, "{i} {}", support::hex(dg)).unwrap();
    }
    std::fs::write(input.path(), lines).unwrap();
    let script = support::script("scapy_icrc.py");
    let mut cmd = Command::new(support::python());
    cmd.arg(&script).arg(input.path());
    let out = support::run(cmd, Duration::from_secs(300)).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "scapy script failed: {}", out.stderr);
    let answers: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(answers.len(), kernel.len());
    for (i, (line, dg)) in answers.iter().zip(&kernel).enumerate() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(parts.len(), 5, "scapy line {line:?}");
        assert_eq!(parts[0], i.to_string());
        let wire_icrc = support::hex(&dg[dg.len() - 4..]);
        assert_eq!(parts[1], wire_icrc, "packet {i}: scapy's ICRC");
        if dg[0] >> 4 == 4 {
            assert_eq!((parts[3], parts[4]), ("0", "1"), "packet {i}: scapy ID/DF");
        } else {
            assert_eq!((parts[3], parts[4]), ("na", "na"));
        }
    }

    // 4. uroce's own captures: well-formed for tshark, valid IPv4 and UDP checksums, and
    //    the headers the kernel sent in every field the ICRC covers.
    for (p, range) in pairs.iter().zip(&per_pair) {
        for own in [&p.tx_file, &p.rx_file] {
            let ours = read_capture(own.path());
            assert_eq!(ours.len(), range.len());
            for (i, (o, k)) in ours.iter().zip(&kernel[range.clone()]).enumerate() {
                let (o, k) = (
                    Datagram::parse_ip(o).unwrap(),
                    Datagram::parse_ip(k).unwrap(),
                );
                assert_eq!(
                    covered(o.ip_header),
                    covered(k.ip_header),
                    "own capture {i}"
                );
                assert_eq!(o.udp_header[..6], k.udp_header[..6], "own capture {i}");
                assert_eq!(o.payload, k.payload);
                o.verify_icrc().unwrap();
            }
            let rows = support::tshark_fields(
                own.path(),
                &[
                    "_ws.malformed",
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
            assert_eq!(rows.len(), range.len());
            for (row, s) in rows.iter().zip(&sent[range.clone()]) {
                assert!(row.all("_ws.malformed").is_empty());
                if s.src.is_ipv4() {
                    assert_eq!(row.number("ip.checksum.status"), Some(1));
                }
                assert_eq!(row.number("udp.checksum.status"), Some(1), "UDP checksum");
                assert_eq!(
                    row.number("infiniband.bth.opcode"),
                    Some(u64::from(s.sample.roce[0]))
                );
            }
        }
    }
    eprintln!(
        "{TEST}: {} packets checked (tshark, scapy, uroce) in {:?}",
        sent.len(),
        start.elapsed()
    );
}
