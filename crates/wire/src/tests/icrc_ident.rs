use super::*;
use crate::ip::{roce_headers_with, Endpoints, IpFields};
use std::net::{IpAddr, Ipv4Addr};

/// A small deterministic generator (xorshift64*), so that failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn endpoints() -> Endpoints {
    Endpoints {
        src: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        dst: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3)),
        src_port: 0xc121,
        dst_port: 4791,
    }
}

/// The IP + UDP headers for `roce_len` bytes with the given Identification and DF.
fn headers(roce_len: usize, ident: Ipv4Ident) -> ([u8; 20], [u8; 8]) {
    let fields = IpFields {
        identification: ident.identification,
        dont_fragment: ident.dont_fragment,
        ..IpFields::LINUX_UDP_SOCKET
    };
    let mut out = [0u8; 28];
    roce_headers_with(&endpoints(), &fields, roce_len, &mut out).unwrap();
    let mut ip = [0u8; 20];
    let mut udp = [0u8; 8];
    ip.copy_from_slice(&out[..20]);
    udp.copy_from_slice(&out[20..]);
    (ip, udp)
}

/// The ICRC of `body` (BTH..pad) under the header with `ident`, by the plain CRC.
fn crc_for(body: &[u8], ident: Ipv4Ident) -> u32 {
    let (ip, udp) = headers(body.len() + ICRC_LEN, ident);
    icrc::compute(&ip, &udp, body).unwrap()
}

fn body(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

#[test]
fn columns_match_the_crc_for_every_bit() {
    let mut rng = Rng(7);
    for body_len in [12, 13, 16, 40, 1036, 4108] {
        let b = body(&mut rng, body_len);
        let basis = IdentBasis::new(body_len + ICRC_LEN);
        let base = crc_for(&b, Ipv4Ident::UROCE);
        for bit in 0..16 {
            let ident = Ipv4Ident {
                identification: 1 << bit,
                dont_fragment: true,
            };
            assert_eq!(
                crc_for(&b, ident) ^ base,
                basis.effect(ident),
                "len {body_len} bit {bit}"
            );
        }
        let no_df = Ipv4Ident {
            identification: 0,
            dont_fragment: false,
        };
        assert_eq!(
            crc_for(&b, no_df) ^ base,
            basis.effect(no_df),
            "DF, len {body_len}"
        );
    }
}

#[test]
fn rank_is_17_for_every_length() {
    for roce_len in (16..9000).step_by(1) {
        assert_eq!(IdentBasis::new(roce_len).rank(), 17, "roce_len {roce_len}");
    }
}

#[test]
fn solves_random_identifications_exactly() {
    let mut rng = Rng(99);
    let mut solver = IdentSolver::new();
    for i in 0..2000 {
        let body_len = 12 + (rng.next() % 1100) as usize;
        let b = body(&mut rng, body_len);
        let ident = Ipv4Ident {
            identification: rng.next() as u16,
            dont_fragment: i % 2 == 0,
        };
        let received = crc_for(&b, ident);
        let syndrome = crc_for(&b, Ipv4Ident::UROCE) ^ received;
        assert_eq!(solver.solve(body_len + ICRC_LEN, syndrome), Some(ident));
        // And through the header-level entry point, from an arbitrary reference header.
        let reference = Ipv4Ident {
            identification: rng.next() as u16,
            dont_fragment: rng.next() % 2 == 0,
        };
        let (ip, udp) = headers(body_len + ICRC_LEN, reference);
        let mut packet = b.clone();
        packet.extend_from_slice(&received.to_le_bytes());
        assert_eq!(identify(&mut solver, &ip, &udp, &packet), Ok(Some(ident)));
    }
}

#[test]
fn zero_syndrome_is_the_uroce_header() {
    let basis = IdentBasis::new(100);
    assert_eq!(basis.solve(0), Some(Ipv4Ident::UROCE));
}

#[test]
fn cosets_hold_two_to_the_17_of_2_to_the_32_syndromes() {
    // 2^20 random syndromes: about 2^20 · 2^-15 = 32 should solve.
    let basis = IdentBasis::new(1040);
    let mut rng = Rng(5);
    let solved = (0..1u32 << 20)
        .filter(|_| basis.solve(rng.next() as u32).is_some())
        .count();
    assert!((5..=80).contains(&solved), "{solved} of 2^20 solved");
}

#[test]
fn ipv6_and_short_packets_are_refused() {
    let mut solver = IdentSolver::new();
    let ip6 = [0x60u8; 40];
    assert!(matches!(
        identify(&mut solver, &ip6, &[0; 8], &[0; 20]),
        Err(WireError::UnsupportedIp { version: 6 })
    ));
    let (ip, udp) = headers(16, Ipv4Ident::UROCE);
    assert!(identify(&mut solver, &ip, &udp, &[0; 15]).is_err());
}

#[test]
fn the_cache_keeps_lengths_apart() {
    let mut solver = IdentSolver::new();
    for len in 16..40 {
        assert_eq!(solver.basis(len).roce_len(), len);
    }
    for len in (16..40).rev() {
        assert_eq!(solver.basis(len), &IdentBasis::new(len));
    }
}
