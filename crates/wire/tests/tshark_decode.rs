//! Decode check with an independent dissector (tshark, the Wireshark CLI).
//!
//! Writes a pcap with [`PcapWriter`] holding one packet per opcode of the opcode table
//! over IPv4 and again over IPv6, each with its own random header values, then asks
//! tshark to decode it and checks, per packet:
//! * nothing is malformed (`_ws.malformed`) and there is no expert info of severity
//!   warning or worse (except tshark's note on the zero UDP checksum of IPv6 datagrams,
//!   which RoCEv2 senders use); the IPv4 header checksum validates (`ip.check_checksum`);
//! * the BTH fields (opcode, SE, MigReq, PadCnt, P_Key, DestQP, AckReq, PSN), and the
//!   RETH, AETH, DETH, AtomicETH, AtomicAckETH, ImmDt and IETH fields tshark shows are
//!   the values uroce emitted, and tshark shows exactly the headers the opcode has;
//! * the ICRC tshark shows is the one uroce sealed (tshark prints the 4 wire bytes as a
//!   big-endian number, so it reads byte-swapped; it does not verify it).
//!
//! What tshark 4.0 cannot decode is compared only as far as it goes (the BTH, and that
//! nothing is malformed): it names the XRC opcodes 0xA0-0xB7 but decodes nothing after
//! their BTH (not the XRCETH, and not even the AETH etc. of XRC responses, which carry no
//! XRCETH), and it calls FLUSH (0x1C), ATOMIC_WRITE (0x1D) and the RoCEv2 CNP (0x81)
//! unknown opcodes; for all of these it shows no ICRC either.

use uroce_testkit as support;

use std::net::IpAddr;
use std::time::Duration;

use uroce_wire::ip::Endpoints;
use uroce_wire::opcode::OPCODE_TABLE;
use uroce_wire::pcap::PcapWriter;

use support::{num, Rng, Sample, TempFile, PI_WARN};

const TEST: &str = "tshark_decode";
const SEED: u64 = 0x7368_6172_6b00_0001;

struct Written {
    sample: Sample,
    icrc: u32,
    ipv6: bool,
}

#[test]
fn tshark_decodes_every_opcode_as_emitted() {
    if !support::have_tshark(TEST) {
        return;
    }
    let mut rng = Rng::new(SEED);
    let file = TempFile::new(TEST, "pcap");
    let mut writer = PcapWriter::new(std::fs::File::create(file.path()).unwrap()).unwrap();
    let mut written = Vec::new();
    let endpoints = [
        Endpoints::roce(
            IpAddr::from([198, 51, 100, 7]),
            IpAddr::from([203, 0, 113, 9]),
            0xc0de,
        ),
        Endpoints::roce(
            "2001:db8::7".parse().unwrap(),
            "2001:db8:1::9".parse().unwrap(),
            0xd00d,
        ),
    ];
    for (family, ep) in endpoints.iter().enumerate() {
        for info in OPCODE_TABLE {
            let sample = support::random_sample(&mut rng, info, 64);
            let ts = Duration::from_millis(1_700_000_000_000 + written.len() as u64);
            let icrc = writer.write_roce(ts, ep, &sample.roce).unwrap();
            written.push(Written {
                sample,
                icrc,
                ipv6: family == 1,
            });
        }
    }
    writer.into_inner().unwrap();

    let rows = support::tshark_decode(file.path());
    assert_eq!(
        rows.len(),
        written.len(),
        "tshark saw a different number of packets"
    );

    for (i, (row, w)) in rows.iter().zip(&written).enumerate() {
        let what = format!(
            "packet {} (opcode {:#04x}, {})",
            i + 1,
            w.sample.repr.bth.opcode,
            if w.ipv6 { "IPv6" } else { "IPv4" }
        );
        assert_eq!(row.number("frame.number"), Some(i as u64 + 1));
        assert_eq!(row.number("udp.dstport"), Some(4791), "{what}");
        assert!(row.all("_ws.malformed").is_empty(), "{what}: malformed");
        let severities = row.all("_ws.expert.severity");
        let messages = row.all("_ws.expert.message");
        assert_eq!(severities.len(), messages.len(), "{what}: expert columns");
        for (severity, message) in severities.iter().zip(messages) {
            // RoCEv2 senders (rxe included) put UDP checksum 0 in IPv6 datagrams too;
            // tshark flags that generically (RFC 8200 wants a checksum outside tunnels).
            // It is the only expert note allowed, and only on IPv6.
            let zero_udp_checksum_v6 = w.ipv6 && message == "Illegal checksum value (0)";
            assert!(
                num(severity) < PI_WARN || zero_udp_checksum_v6,
                "{what}: expert info {severity} {message:?}"
            );
        }
        if w.ipv6 {
            assert!(row.all("ip.checksum.status").is_empty(), "{what}");
        } else {
            // 1 = "Good" once checksum validation is on.
            assert_eq!(
                row.number("ip.checksum.status"),
                Some(1),
                "{what}: IPv4 checksum"
            );
        }
        let repr = uroce_wire::PacketRepr {
            payload: &w.sample.payload,
            ..w.sample.repr
        };
        let pad = (w.sample.payload.len().wrapping_neg() % 4) as u8;
        support::check_decoded(row, &repr, pad, w.icrc, &what);
    }
    eprintln!(
        "{TEST}: tshark decoded {} packets ({} opcodes × IPv4/IPv6) as emitted",
        written.len(),
        OPCODE_TABLE.len()
    );
}
