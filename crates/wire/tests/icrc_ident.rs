//! The any-Identification ICRC check (`uroce_wire::icrc_ident`) on real packets: real
//! Linux Soft-RoCE datagrams (`tests/data/rxe_datagrams.txt`, non-zero Identifications
//! with DF) and packets of every opcode built by the wire layer's emitters.
//!
//! * Every rxe datagram is accepted with its Identification and DF recovered exactly from
//!   a receiver's header (Identification 0, DF), and so is the same packet re-sealed with
//!   DF clear.
//! * False accepts, measured: corrupted copies of the packets ((a) every single-bit flip,
//!   (b) random bursts of 2..=32 bits, (c) random corruptions of 2..=16 bytes) are checked
//!   three ways: *exact* (the true header, plain CRC-32), *strict* (DF and an
//!   Identification below 128) and *any-id* (any Identification, DF set or clear). The
//!   number accepted must stay within a Chernoff bound (failure probability 10⁻⁹ per
//!   assertion) of the analytic rate: 2⁻³² exact, 2⁻²⁵ strict, 2⁻¹⁵ any-id
//!   (`docs/ICRC.md`); exact must accept no single-bit or burst error at all (CRC-32
//!   detects every burst of up to 32 bits). The rates are printed (`--nocapture`).

use uroce_testkit as support;

use std::net::{IpAddr, Ipv4Addr};

use support::Rng;
use uroce_wire::icrc;
use uroce_wire::icrc_ident::{identify, IdentSolver, Ipv4Ident};
use uroce_wire::ip::{build_datagram, Endpoints, IpFields};
use uroce_wire::opcode::OPCODE_TABLE;

const RXE_DATAGRAMS: &str = include_str!("data/rxe_datagrams.txt");
/// Byte of the BTH the ICRC masks (FECN, BECN, reserved): corrupting it is not an error.
const MASKED_BTH_BYTE: usize = 4;

/// One packet as a receiver sees it, and the header it really travelled in.
struct Packet {
    what: String,
    /// The IPv4 header a uroce receiver rebuilds: Identification 0, DF.
    receiver_ip: [u8; 20],
    /// The header on the wire.
    true_ip: [u8; 20],
    udp: [u8; 8],
    /// BTH..ICRC.
    roce: Vec<u8>,
    /// The Identification and DF of `true_ip`.
    ident: Ipv4Ident,
}

fn ident_of(ip: &[u8]) -> Ipv4Ident {
    Ipv4Ident {
        identification: u16::from_be_bytes([ip[4], ip[5]]),
        dont_fragment: ip[6] & 0x40 != 0,
    }
}

fn receiver_header(true_ip: &[u8; 20]) -> [u8; 20] {
    let mut ip = *true_ip;
    ip[4] = 0;
    ip[5] = 0;
    ip[6] |= 0x40;
    ip
}

fn packet_from_datagram(what: String, d: &[u8]) -> Packet {
    let true_ip: [u8; 20] = d[..20].try_into().unwrap();
    Packet {
        what,
        receiver_ip: receiver_header(&true_ip),
        true_ip,
        udp: d[20..28].try_into().unwrap(),
        roce: d[28..].to_vec(),
        ident: ident_of(&true_ip),
    }
}

/// The committed rxe datagrams.
fn rxe_packets() -> Vec<Packet> {
    let mut out = Vec::new();
    let mut what = String::new();
    for line in RXE_DATAGRAMS.lines() {
        if let Some(comment) = line.strip_prefix('#') {
            what = comment.trim().to_owned();
            continue;
        }
        let bytes: Vec<u8> = (0..line.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
            .collect();
        out.push(packet_from_datagram(format!("rxe {what}"), &bytes));
    }
    out
}

/// One packet of every opcode the emitters build, up to 256 bytes of payload, sealed for
/// a random Identification, DF set or clear.
fn emitted_packets(rng: &mut Rng) -> Vec<Packet> {
    let ep = Endpoints {
        src: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        dst: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3)),
        src_port: 0xc121,
        dst_port: 4791,
    };
    let mut out = Vec::new();
    for (i, info) in OPCODE_TABLE.iter().enumerate() {
        let sample = support::random_sample(rng, info, 256);
        let fields = IpFields {
            identification: rng.u32() as u16,
            dont_fragment: i % 3 != 0,
            ..IpFields::LINUX_UDP_SOCKET
        };
        let mut d = vec![0u8; 28 + sample.roce.len()];
        build_datagram(&ep, &fields, &sample.roce, &mut d).unwrap();
        out.push(packet_from_datagram(
            format!("emitted opcode {:#04x}", info.opcode),
            &d,
        ));
    }
    out
}

fn all_packets() -> Vec<Packet> {
    let mut packets = rxe_packets();
    packets.extend(emitted_packets(&mut Rng::new(0x1c4c_1d01)));
    packets
}

#[test]
fn rxe_datagrams_are_accepted_with_their_identification() {
    let mut solver = IdentSolver::new();
    let packets = rxe_packets();
    assert!(packets.len() >= 10, "{} fixtures", packets.len());
    for p in &packets {
        // The fixture is what rxe sent: its ICRC is valid for its own header, not for
        // the receiver's, and its Identification is not 0.
        icrc::verify(&p.true_ip, &p.udp, &p.roce).unwrap();
        assert!(icrc::verify(&p.receiver_ip, &p.udp, &p.roce).is_err());
        assert!(
            p.ident.identification != 0 && p.ident.dont_fragment,
            "{}",
            p.what
        );
        assert_eq!(
            identify(&mut solver, &p.receiver_ip, &p.udp, &p.roce),
            Ok(Some(p.ident)),
            "{}",
            p.what
        );
    }
}

#[test]
fn rxe_datagrams_resealed_without_df_are_accepted_with_df_clear() {
    let mut solver = IdentSolver::new();
    for p in rxe_packets() {
        let mut ip = p.true_ip;
        ip[6] &= !0x40;
        let mut roce = p.roce.clone();
        icrc::seal(&ip, &p.udp, &mut roce).unwrap();
        let want = Ipv4Ident {
            dont_fragment: false,
            ..p.ident
        };
        assert_eq!(
            identify(&mut solver, &p.receiver_ip, &p.udp, &roce),
            Ok(Some(want)),
            "{}",
            p.what
        );
    }
}

#[test]
fn emitted_packets_are_accepted_with_their_identification() {
    let mut solver = IdentSolver::new();
    let packets = emitted_packets(&mut Rng::new(0x1c4c_1d02));
    assert!(packets.iter().any(|p| !p.ident.dont_fragment));
    for p in &packets {
        assert_eq!(
            identify(&mut solver, &p.receiver_ip, &p.udp, &p.roce),
            Ok(Some(p.ident)),
            "{}",
            p.what
        );
    }
}

/// Accepted counts of corrupted packets under the three checks.
#[derive(Default, Debug)]
struct Tally {
    trials: u64,
    exact: u64,
    strict: u64,
    any_id: u64,
}

impl Tally {
    /// Checks one corrupted copy of `p` (at least one covered bit differs).
    fn check(&mut self, solver: &mut IdentSolver, p: &Packet, corrupted: &[u8]) {
        self.trials += 1;
        if icrc::verify(&p.true_ip, &p.udp, corrupted).is_ok() {
            self.exact += 1;
        }
        if let Ok(Some(found)) = identify(solver, &p.receiver_ip, &p.udp, corrupted) {
            self.any_id += 1;
            if found.dont_fragment && found.identification < 128 {
                self.strict += 1;
            }
        }
    }

    fn report(&self, what: &str) {
        let rate = |n: u64| n as f64 / self.trials as f64;
        println!(
            "{what}: {} trials; accepted: exact {} ({:.2e}), strict {} ({:.2e}), any-id {} \
             ({:.2e} = 2^{:.1}; bound 2^-15 = {:.2e})",
            self.trials,
            self.exact,
            rate(self.exact),
            self.strict,
            rate(self.strict),
            self.any_id,
            rate(self.any_id),
            rate(self.any_id).log2(),
            2f64.powi(-15),
        );
    }

    /// Asserts every count is within the Chernoff bound of its analytic rate.
    fn assert_within_bounds(&self, what: &str) {
        for (name, count, log2_rate) in [
            ("exact", self.exact, -32),
            ("strict", self.strict, -25),
            ("any-id", self.any_id, -15),
        ] {
            let allowed = chernoff_limit(self.trials, 2f64.powi(log2_rate), 1e-9);
            assert!(
                count <= allowed,
                "{what}: {name} accepted {count} of {} corrupted packets; the analytic rate \
                 2^{log2_rate} allows at most {allowed}",
                self.trials
            );
        }
    }
}

/// The smallest k such that P(X ≥ k) ≤ `risk` for X a sum of `trials` independent
/// Bernoulli variables of mean at most `p`, by the Chernoff bound
/// P(X ≥ k) ≤ e^(−λ) (eλ/k)^k for k > λ = trials·p; returns k − 1, the largest count
/// that passes.
fn chernoff_limit(trials: u64, p: f64, risk: f64) -> u64 {
    let lambda = trials as f64 * p;
    let mut k = lambda.floor() as u64 + 1;
    // Bounded: the bound falls below any positive risk well before k = trials.
    while k < trials {
        let kf = k as f64;
        let log_bound = -lambda + kf * (std::f64::consts::E * lambda / kf).ln();
        if log_bound <= risk.ln() {
            return k - 1;
        }
        k += 1;
    }
    trials
}

/// The covered bit positions of a packet of `len` bytes (all but the masked BTH byte).
fn covered_bits(len: usize) -> impl Iterator<Item = usize> {
    (0..len * 8).filter(|bit| bit / 8 != MASKED_BTH_BYTE)
}

fn flip(buf: &mut [u8], bit: usize) {
    buf[bit / 8] ^= 1 << (bit % 8);
}

/// (a) Every single-bit flip of every packet. Whether a flip is accepted depends only on
/// its distance from the Identification field (a flip of the BTH..pad bytes: its offset
/// in the packet, whatever the length) or, for a flip of the ICRC itself, on the packet
/// length; so each distinct case is one trial, and a case seen in an earlier packet is
/// not counted again (counted, it would be the same outcome many times over).
#[test]
fn false_accepts_of_single_bit_flips() {
    let packets = all_packets();
    let mut solver = IdentSolver::new();
    let mut tally = Tally::default();
    let mut seen = std::collections::HashSet::new();
    let mut accepted_at = Vec::new();
    for p in &packets {
        let mut buf = p.roce.clone();
        let icrc_at = buf.len() - 4;
        for bit in covered_bits(buf.len()) {
            let case = if bit / 8 < icrc_at {
                (0, bit)
            } else {
                (buf.len(), bit - icrc_at * 8)
            };
            if !seen.insert(case) {
                continue;
            }
            flip(&mut buf, bit);
            let before = tally.any_id;
            tally.check(&mut solver, p, &buf);
            if tally.any_id > before {
                accepted_at.push(format!("{} byte {} bit {}", p.what, bit / 8, bit % 8));
            }
            flip(&mut buf, bit);
        }
    }
    tally.report("single-bit flips (distinct cases)");
    println!("  accepted any-id: {accepted_at:?}");
    assert!(tally.trials > 8_000, "{} trials", tally.trials);
    assert_eq!(tally.exact, 0, "CRC-32 detects every single-bit error");
    tally.assert_within_bounds("single-bit flips");
}

/// (a') Every single-bit flip of the BTH..pad of one 8972-byte UDP payload (the largest
/// a 9000-byte Ethernet MTU carries): by the argument above, the offsets found are the
/// ones at which a single-bit error passes the any-id check in a packet of any length.
#[test]
fn single_bit_flips_that_pass_in_any_packet() {
    let ep = Endpoints {
        src: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        dst: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3)),
        src_port: 0xc121,
        dst_port: 4791,
    };
    let mut rng = Rng::new(0x1c4c_1d05);
    let info = uroce_wire::opcode::info(0x07).unwrap(); // RC RDMA WRITE MIDDLE
    let mut roce = support::random_sample(&mut rng, info, 0).roce;
    roce.truncate(roce.len() - 4);
    roce.extend(rng.bytes(8972 - 4 - roce.len()));
    roce.extend([0; 4]);
    let fields = IpFields {
        identification: 0x5a5a,
        ..IpFields::LINUX_UDP_SOCKET
    };
    let mut d = vec![0u8; 28 + roce.len()];
    build_datagram(&ep, &fields, &roce, &mut d).unwrap();
    let p = packet_from_datagram("jumbo".into(), &d);
    let mut solver = IdentSolver::new();
    let mut tally = Tally::default();
    let mut accepted_at = Vec::new();
    let mut buf = p.roce.clone();
    for bit in covered_bits(buf.len() - 4) {
        flip(&mut buf, bit);
        let before = tally.any_id;
        tally.check(&mut solver, &p, &buf);
        if tally.any_id > before {
            accepted_at.push((bit / 8, 1u8 << (bit % 8)));
        }
        flip(&mut buf, bit);
    }
    tally.report("single-bit flips of an 8972-byte packet");
    println!("  accepted any-id at (byte, bit mask): {accepted_at:x?}");
    assert_eq!(tally.exact, 0, "CRC-32 detects every single-bit error");
    tally.assert_within_bounds("single-bit flips, 8972 bytes");
}

/// (b) Random bursts of 2..=32 bits (first and last bit flipped, the ones between at
/// random) at random positions.
#[test]
fn false_accepts_of_bursts_up_to_32_bits() {
    let packets = all_packets();
    let mut rng = Rng::new(0x1c4c_1d03);
    let mut solver = IdentSolver::new();
    let mut tally = Tally::default();
    const TRIALS: u64 = 1 << 19;
    for t in 0..TRIALS {
        let p = &packets[(t % packets.len() as u64) as usize];
        let mut buf = p.roce.clone();
        let bits = buf.len() * 8;
        let len = 2 + rng.below(31) as usize;
        let start = rng.below((bits - len + 1) as u64) as usize;
        flip(&mut buf, start);
        flip(&mut buf, start + len - 1);
        for bit in start + 1..start + len - 1 {
            if rng.bool() {
                flip(&mut buf, bit);
            }
        }
        buf[MASKED_BTH_BYTE] = p.roce[MASKED_BTH_BYTE];
        if buf == p.roce {
            continue;
        }
        tally.check(&mut solver, p, &buf);
    }
    tally.report("bursts of 2..=32 bits");
    assert!(tally.trials > TRIALS * 9 / 10);
    assert_eq!(
        tally.exact, 0,
        "CRC-32 detects every burst of up to 32 bits"
    );
    tally.assert_within_bounds("bursts");
}

/// (c) Random corruptions: 2..=16 bytes at random positions XORed with random non-zero
/// values.
#[test]
fn false_accepts_of_random_multi_byte_corruptions() {
    let packets = all_packets();
    let mut rng = Rng::new(0x1c4c_1d04);
    let mut solver = IdentSolver::new();
    let mut tally = Tally::default();
    const TRIALS: u64 = 1 << 20;
    for t in 0..TRIALS {
        let p = &packets[(t % packets.len() as u64) as usize];
        let mut buf = p.roce.clone();
        let bytes = 2 + rng.below(15);
        for _ in 0..bytes {
            let at = rng.below(buf.len() as u64) as usize;
            buf[at] ^= 1 + rng.below(255) as u8;
        }
        buf[MASKED_BTH_BYTE] = p.roce[MASKED_BTH_BYTE];
        if buf == p.roce {
            continue;
        }
        tally.check(&mut solver, p, &buf);
    }
    tally.report("random 2..=16-byte corruptions");
    assert!(tally.trials > TRIALS * 9 / 10);
    tally.assert_within_bounds("random corruptions");
}
