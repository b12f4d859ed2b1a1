//! ICRC cross-check against an independent implementation (scapy's RoCE module).
//!
//! Generates random RoCEv2 datagrams covering every opcode of the opcode table, half over
//! IPv4 and half over IPv6, with random addresses, ports, IPv4 Identification / TTL / TOS /
//! DF, IPv6 traffic class / flow label / hop limit, random header values and payload
//! sizes. uroce builds the IP and UDP headers and computes each ICRC; the script
//! `scapy_icrc.py` (in uroce-testkit's `scripts/`) dissects the same bytes with scapy and computes the ICRC
//! its own way; every value must agree. scapy also recomputes each IPv4 header checksum,
//! which must match the one uroce wrote.

use uroce_testkit as support;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_wire::ip::{self, Endpoints, IpFields};
use uroce_wire::opcode::OPCODE_TABLE;
use uroce_wire::{icrc, ROCEV2_UDP_PORT};

use support::{Rng, TempFile};

const TEST: &str = "icrc_scapy";
/// Fixed seed: a failure reproduces exactly.
const SEED: u64 = 0x0052_6f43_4500_1c8c;
const MIN_PACKETS: usize = 1000;
const MAX_PAYLOAD: usize = 1100;

struct Case {
    opcode: u8,
    ipv6: bool,
    icrc: u32,
    datagram: Vec<u8>,
}

fn random_endpoints(rng: &mut Rng, ipv6: bool) -> Endpoints {
    let (src, dst) = if ipv6 {
        let a = Ipv6Addr::from(u128::from(rng.u64()) << 64 | u128::from(rng.u64()));
        let b = Ipv6Addr::from(u128::from(rng.u64()) << 64 | u128::from(rng.u64()));
        (IpAddr::V6(a), IpAddr::V6(b))
    } else {
        (
            IpAddr::V4(Ipv4Addr::from(rng.u32())),
            IpAddr::V4(Ipv4Addr::from(rng.u32())),
        )
    };
    Endpoints {
        src,
        dst,
        src_port: rng.u32() as u16,
        dst_port: ROCEV2_UDP_PORT,
    }
}

fn random_fields(rng: &mut Rng) -> IpFields {
    IpFields {
        hop_limit: rng.u8(),
        traffic_class: rng.u8(),
        identification: rng.u32() as u16,
        dont_fragment: rng.bool(),
        flow_label: rng.u32() & 0xf_ffff,
    }
}

/// Builds the cases: `OPCODE_TABLE.len()` packets per round, rounds alternating IPv4 and
/// IPv6, an even number of rounds reaching at least `MIN_PACKETS`.
fn cases() -> Vec<Case> {
    let per_round = OPCODE_TABLE.len();
    let rounds = MIN_PACKETS.div_ceil(2 * per_round) * 2;
    let mut rng = Rng::new(SEED);
    let mut cases = Vec::with_capacity(rounds * per_round);
    for round in 0..rounds {
        let ipv6 = round % 2 == 1;
        for info in OPCODE_TABLE {
            let sample = support::random_sample(&mut rng, info, MAX_PAYLOAD);
            let ep = random_endpoints(&mut rng, ipv6);
            let fields = random_fields(&mut rng);
            let mut buf = vec![0u8; 48 + sample.roce.len()];
            let (len, sealed) = ip::build_datagram(&ep, &fields, &sample.roce, &mut buf)
                .unwrap_or_else(|e| panic!("build {:#04x}: {e}", info.opcode));
            buf.truncate(len);

            // The same value straight from icrc::compute over the headers uroce built.
            let ip_len = if ipv6 { 40 } else { 20 };
            let (ip_header, rest) = buf.split_at(ip_len);
            let (udp_header, roce) = rest.split_at(8);
            let computed = icrc::compute(ip_header, udp_header, &roce[..roce.len() - 4]).unwrap();
            assert_eq!(computed, sealed);

            cases.push(Case {
                opcode: info.opcode,
                ipv6,
                icrc: computed,
                datagram: buf,
            });
        }
    }
    cases
}

#[test]
fn icrc_agrees_with_scapy_on_random_packets_of_every_opcode() {
    if !support::have_scapy(TEST) {
        return;
    }
    let start = Instant::now();
    let cases = cases();
    assert!(cases.len() >= MIN_PACKETS);
    assert_eq!(cases.iter().filter(|c| c.ipv6).count() * 2, cases.len());
    for info in OPCODE_TABLE {
        assert!(cases.iter().any(|c| c.opcode == info.opcode && c.ipv6));
        assert!(cases.iter().any(|c| c.opcode == info.opcode && !c.ipv6));
    }

    let input = TempFile::new(TEST, "hex");
    let mut text = String::new();
    for (i, c) in cases.iter().enumerate() {
        writeln!(text, "{i} {}", support::hex(&c.datagram)).unwrap();
    }
    std::fs::write(input.path(), text).unwrap();

    let script = support::script("scapy_icrc.py");
    let mut cmd = Command::new(support::python());
    cmd.arg(&script).arg(input.path());
    let out = support::run(cmd, Duration::from_secs(300)).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "scapy script failed ({}): {}",
        out.status,
        out.stderr
    );

    let mut seen = vec![false; cases.len()];
    let mut mismatches = Vec::new();
    let mut bad_checksums = Vec::new();
    for line in out.stdout.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.len(), 5, "unexpected scapy output line {line:?}");
        let i: usize = cols[0].parse().unwrap();
        assert!(!seen[i], "index {i} reported twice");
        seen[i] = true;
        let c = &cases[i];
        let ours = support::hex(&c.icrc.to_le_bytes());
        if cols[1] != ours {
            mismatches.push(format!(
                "#{i} opcode {:#04x} {} len {}: uroce {ours}, scapy {} — {}",
                c.opcode,
                if c.ipv6 { "IPv6" } else { "IPv4" },
                c.datagram.len(),
                cols[1],
                support::hex(&c.datagram)
            ));
        }
        let expected_csum = if c.ipv6 { "na" } else { "ok" };
        if cols[2] != expected_csum {
            bad_checksums.push(format!("#{i}: IPv4 header checksum {}", cols[2]));
        }
    }
    let missing = seen.iter().filter(|s| !**s).count();
    assert_eq!(missing, 0, "scapy reported no ICRC for {missing} packets");
    assert!(
        mismatches.is_empty(),
        "{} of {} ICRCs differ from scapy's:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(bad_checksums.is_empty(), "{}", bad_checksums.join("\n"));
    eprintln!(
        "{TEST}: {} packets ({} opcodes, IPv4 and IPv6) agree with scapy in {:?}",
        cases.len(),
        OPCODE_TABLE.len(),
        start.elapsed()
    );
}
