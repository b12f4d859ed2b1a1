//! The 40-byte GRH area at the start of every UD / GSI receive buffer, read back.
//!
//! On RoCEv2 the area holds the IP header of the received datagram, as the Linux software
//! RoCE driver writes it and `docs/ARCHITECTURE.md` (proto, `ud`) describes:
//!
//! ```text
//! IPv6:  bytes 0-39   the IPv6 header (version 6, traffic class, flow label, payload
//!                     length, next header 17, hop limit, source, destination)
//! IPv4:  bytes 0-19   undefined (uroce writes zeros)
//!        bytes 20-39  the IPv4 header (0x45, TOS, total length, …, TTL, protocol 17,
//!                     header checksum, source, destination)
//! ```
//!
//! Which of the two: the version nibble of byte 0; when it says 6 but bytes 20..40 are an
//! IPv4 header with IHL 5 and a correct header checksum, IPv4 (the undefined first half of
//! an IPv4 area may hold anything, so an IPv4 header is believed only with its checksum).
//! This is how a receiver answers a datagram (IBA Vol 1 §11.2.8.2, "Create Address Handle
//! from Work Completion": the reply goes to the GRH's source).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::ip::ipv4_checksum;

/// Length of the GRH area.
pub const GRH_AREA_LEN: usize = 40;
/// Offset of the IPv4 header in the GRH area of an IPv4 datagram.
pub const IPV4_OFFSET: usize = 20;

/// IPv6 next header / IPv4 protocol of RoCEv2: UDP.
const NEXT_HDR_UDP: u8 = 17;

/// What the GRH area of a received datagram says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrhArea {
    /// The datagram's source address: where a reply goes.
    pub src: IpAddr,
    /// The datagram's destination address: the local address that received it.
    pub dst: IpAddr,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
}

/// Why a GRH area cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GrhAreaError {
    /// The area holds neither an IPv4 nor an IPv6 header.
    #[error("the GRH area holds neither an IPv4 nor an IPv6 header")]
    NotIp,
    /// An IPv6 header whose next header is not UDP (not a RoCEv2 datagram).
    #[error("the GRH area's IPv6 next header {0} is not UDP")]
    NotUdp(u8),
}

fn ipv4_header(area: &[u8; GRH_AREA_LEN]) -> [u8; 20] {
    let mut h = [0u8; 20];
    h.copy_from_slice(&area[IPV4_OFFSET..]);
    h
}

/// Whether bytes 20..40 are an IPv4 header with IHL 5 and a correct checksum.
fn is_checked_ipv4(h: &[u8; 20]) -> bool {
    h[0] == 0x45 && u16::from_be_bytes([h[10], h[11]]) == ipv4_checksum(h)
}

impl GrhArea {
    /// Reads the area (see the module doc). Never panics.
    ///
    /// # Errors
    /// [`GrhAreaError::NotIp`] when no IP version can be recognised,
    /// [`GrhAreaError::NotUdp`] for an IPv6 header of another protocol.
    pub fn parse(area: &[u8; GRH_AREA_LEN]) -> Result<GrhArea, GrhAreaError> {
        let v4 = ipv4_header(area);
        let version6 = area[0] >> 4 == 6;
        let ipv4 = if version6 {
            is_checked_ipv4(&v4)
        } else {
            v4[0] >> 4 == 4
        };
        if ipv4 {
            return Ok(GrhArea {
                src: IpAddr::V4(Ipv4Addr::new(v4[12], v4[13], v4[14], v4[15])),
                dst: IpAddr::V4(Ipv4Addr::new(v4[16], v4[17], v4[18], v4[19])),
                hop_limit: v4[8],
                traffic_class: v4[1],
                flow_label: 0,
            });
        }
        if !version6 {
            return Err(GrhAreaError::NotIp);
        }
        if area[6] != NEXT_HDR_UDP {
            return Err(GrhAreaError::NotUdp(area[6]));
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&area[8..24]);
        dst.copy_from_slice(&area[24..40]);
        let word = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
        Ok(GrhArea {
            src: IpAddr::V6(Ipv6Addr::from(src)),
            dst: IpAddr::V6(Ipv6Addr::from(dst)),
            hop_limit: area[7],
            traffic_class: ((word >> 20) & 0xff) as u8,
            flow_label: word & 0x000f_ffff,
        })
    }

    /// Reads the area from the first 40 bytes of `buf` (a receive buffer).
    ///
    /// # Errors
    /// [`GrhAreaError::NotIp`] when `buf` is shorter than 40 bytes, else as
    /// [`GrhArea::parse`].
    pub fn parse_prefix(buf: &[u8]) -> Result<GrhArea, GrhAreaError> {
        let area: &[u8; GRH_AREA_LEN] = buf
            .get(..GRH_AREA_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(GrhAreaError::NotIp)?;
        GrhArea::parse(area)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_area(src: [u8; 4], dst: [u8; 4], ttl: u8, tos: u8) -> [u8; 40] {
        let mut a = [0u8; 40];
        let h = &mut a[20..];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&300u16.to_be_bytes());
        h[6] = 0x40;
        h[8] = ttl;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let c = ipv4_checksum(h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        a
    }

    #[test]
    fn ipv4_area() {
        let a = v4_area([127, 0, 9, 1], [127, 0, 9, 2], 64, 0x12);
        let g = GrhArea::parse(&a).expect("ipv4");
        assert_eq!(g.src, "127.0.9.1".parse::<IpAddr>().expect("ip"));
        assert_eq!(g.dst, "127.0.9.2".parse::<IpAddr>().expect("ip"));
        assert_eq!((g.hop_limit, g.traffic_class, g.flow_label), (64, 0x12, 0));
    }

    #[test]
    fn ipv4_area_whose_first_half_looks_like_ipv6() {
        let mut a = v4_area([10, 0, 0, 1], [10, 0, 0, 2], 5, 0);
        a[0] = 0x60;
        assert_eq!(
            GrhArea::parse(&a).expect("ipv4").src,
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
        );
        // With a wrong checksum the IPv4 header is not believed: IPv6 (next header 0).
        a[30] ^= 1;
        assert_eq!(GrhArea::parse(&a), Err(GrhAreaError::NotUdp(0)));
    }

    #[test]
    fn ipv6_area() {
        let mut a = [0u8; 40];
        let word: u32 = (6 << 28) | (0xab << 20) | 0x12345;
        a[0..4].copy_from_slice(&word.to_be_bytes());
        a[6] = 17;
        a[7] = 9;
        a[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        a[24..40].copy_from_slice(&Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2).octets());
        let g = GrhArea::parse(&a).expect("ipv6");
        assert_eq!(g.src, IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(
            (g.hop_limit, g.traffic_class, g.flow_label),
            (9, 0xab, 0x12345)
        );
        a[6] = 6;
        assert_eq!(GrhArea::parse(&a), Err(GrhAreaError::NotUdp(6)));
    }

    #[test]
    fn garbage_is_refused_without_panic() {
        assert_eq!(GrhArea::parse(&[0u8; 40]), Err(GrhAreaError::NotIp));
        assert_eq!(GrhArea::parse_prefix(&[0x45; 12]), Err(GrhAreaError::NotIp));
        for seed in 0u32..2000 {
            let mut a = [0u8; 40];
            for (i, b) in a.iter_mut().enumerate() {
                *b = (seed.wrapping_mul(2_654_435_761).rotate_left(i as u32 % 32) >> 3) as u8;
            }
            let _ = GrhArea::parse(&a);
        }
    }
}
