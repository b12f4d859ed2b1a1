//! What the RDMA CM puts on top of the IB CM for IP-addressed connections (IBA Vol 1
//! Annex A11, "RDMA IP CM Service"): the IP-based service ID and the 36-byte address
//! header at the start of REQ and SIDR_REQ private data.
//!
//! Service ID: the Annex's prefix `0x0000000001` in the top 40 bits, the IP protocol
//! (0x06 TCP, 0x11 UDP, 0x3F IB) in bits 23:16 and the destination port in bits 15:0. The
//! Linux RDMA CM computes it as `(port_space << 16) | port` with port spaces TCP 0x0106,
//! UDP 0x0111, IB 0x013F (the prefix's 0x01 is the high byte of the port space) and IPoIB
//! 0x0002, which therefore lies outside the Annex's prefix. TCP port 7174 is
//! `0x0000_0000_0106_1c06`.
//!
//! Address header (36 bytes):
//!
//! ```text
//! byte  0      version: major (7:4) · minor (3:0); 0.0
//! byte  1      IP version (7:4): 4 or 6 · reserved (3:0)
//! bytes 2-3    source port of the active side
//! bytes 4-19   source IP   (IPv4: in bytes 16-19, bytes 4-15 zero)
//! bytes 20-35  destination IP (IPv4: in bytes 32-35, bytes 20-31 zero)
//! ```

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::fields::{get, put, u16_at, u8_at};
use crate::error::{check_len, HeaderKind, WireError};

/// Length of the address header.
pub const HEADER_LEN: usize = 36;

/// Mask of the part of an IP-based service ID above the port (the port space and prefix).
pub const SERVICE_ID_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;

/// An RDMA CM port space: the upper half of an IP-based service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// Reliable connected, TCP-like (0x0106).
    Tcp,
    /// Unreliable datagram, UDP-like (0x0111).
    Udp,
    /// Any QP type (0x013F).
    Ib,
    /// IPoIB (0x0002).
    IpoIb,
}

impl PortSpace {
    /// The 16-bit port space value.
    pub const fn value(self) -> u16 {
        match self {
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013F,
            PortSpace::IpoIb => 0x0002,
        }
    }

    /// The port space of a 16-bit value, if it is one.
    pub const fn from_value(value: u16) -> Option<PortSpace> {
        match value {
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            0x0002 => Some(PortSpace::IpoIb),
            _ => None,
        }
    }

    /// The service ID of `port` in this port space.
    pub const fn service_id(self, port: u16) -> u64 {
        ((self.value() as u64) << 16) | port as u64
    }
}

/// The port space and port of an IP-based service ID, `None` if it is not one.
pub const fn parse_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    match PortSpace::from_value((service_id >> 16) as u16) {
        Some(ps) => Some((ps, service_id as u16)),
        None => None,
    }
}

/// The RDMA CM address header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// Version byte (major 7:4, minor 3:0; 0 today).
    pub version: u8,
    /// Source port of the active side.
    pub src_port: u16,
    /// Source IP (the active side's).
    pub src_ip: IpAddr,
    /// Destination IP (the passive side's). Same family as `src_ip`.
    pub dst_ip: IpAddr,
}

impl CmaHeader {
    /// Parses the header at the start of `private_data`. `Truncated` if shorter than
    /// [`HEADER_LEN`]; `InvalidField` for an IP version other than 4 or 6.
    pub fn parse(private_data: &[u8]) -> Result<CmaHeader, WireError> {
        check_len(HeaderKind::CmaHeader, private_data, 0, HEADER_LEN)?;
        let ip_version = u8_at(private_data, 1) >> 4;
        let addr = |at: usize| -> Result<IpAddr, WireError> {
            let b: [u8; 16] = get(private_data, at);
            match ip_version {
                4 => {
                    let [.., a, b2, c, d] = b;
                    Ok(IpAddr::V4(Ipv4Addr::new(a, b2, c, d)))
                }
                6 => Ok(IpAddr::V6(Ipv6Addr::from(b))),
                v => Err(WireError::InvalidField {
                    header: HeaderKind::CmaHeader,
                    field: "ip_version",
                    value: v.into(),
                }),
            }
        };
        Ok(CmaHeader {
            version: u8_at(private_data, 0),
            src_port: u16_at(private_data, 2),
            src_ip: addr(4)?,
            dst_ip: addr(20)?,
        })
    }

    /// `InvalidField` if the two addresses are of different families.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.src_ip.is_ipv4() != self.dst_ip.is_ipv4() {
            return Err(WireError::InvalidField {
                header: HeaderKind::CmaHeader,
                field: "ip_version",
                value: 0,
            });
        }
        Ok(())
    }

    /// Writes the 36 bytes at the start of `out` (`BufferTooSmall` if shorter). The IP
    /// version follows `src_ip`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        if out.len() < HEADER_LEN {
            return Err(WireError::BufferTooSmall {
                needed: HEADER_LEN,
                available: out.len(),
            });
        }
        let (ipv, src, dst) = match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), d) => (4u8, v4_field(s), v4_field(to_v4(d))),
            (IpAddr::V6(s), d) => (6u8, s.octets(), to_v6(d).octets()),
        };
        if let Some(b) = out.get_mut(..HEADER_LEN) {
            b.fill(0);
        }
        put(out, 0, [self.version, ipv << 4]);
        put(out, 2, self.src_port.to_be_bytes());
        put(out, 4, src);
        put(out, 20, dst);
        Ok(())
    }
}

fn v4_field(a: Ipv4Addr) -> [u8; 16] {
    let mut f = [0u8; 16];
    let [a0, a1, a2, a3] = a.octets();
    f[12] = a0;
    f[13] = a1;
    f[14] = a2;
    f[15] = a3;
    f
}

fn to_v4(a: IpAddr) -> Ipv4Addr {
    match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => a.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
    }
}

fn to_v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The GID of an IP address as RoCE uses it: IPv4 as `::ffff:a.b.c.d`, IPv6 as is.
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    to_v6(addr).octets()
}

/// The IP address of a RoCE GID: an IPv4-mapped GID gives the IPv4 address.
pub fn addr_of_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}
