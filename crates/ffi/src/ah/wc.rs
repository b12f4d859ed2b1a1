//! Address handles that answer a received datagram: `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc` (IBA Vol 1 §11.2.8.2, "Create Address Handle from Work
//! Completion"), with the answers rdma-core 44 gives on a RoCEv2 device.
//!
//! A UD receive starts with a 40-byte GRH area (`IBV_WC_GRH` in the completion). On RoCEv2
//! it holds the IP header of the datagram (docs/ARCHITECTURE.md, "UD"): for IPv6 the
//! 40-byte IPv6 header; for IPv4 20 undefined bytes (uroce writes zeros) followed by the
//! 20-byte IPv4 header. Which one it is: the IPv6 version nibble of byte 0; when that says
//! 6 but bytes 20..40 are an IPv4 header with IHL 5 and a correct header checksum, IPv4
//! (an IPv4 header is believed only with its checksum).
//!
//! The reply's address vector, field by field:
//! * always: `dlid` = `wc.slid`, `sl` = `wc.sl`, `src_path_bits` = `wc.dlid_path_bits`,
//!   `port_num` = the port given, `grh.flow_label` = the low 20 bits of the GRH area's first
//!   big-endian word (0 for IPv4), everything else 0;
//! * with `IBV_WC_GRH`: `is_global` = 1, `grh.dgid` = the datagram's source address (IPv4:
//!   IPv4-mapped), `grh.sgid_index` = the index of the GID table entry equal to the
//!   datagram's destination address (of type RoCEv2; IPv6 next header 0x1B asks for a
//!   RoCEv1 entry), `hop_limit` = TTL / hop limit, `traffic_class` = TOS / traffic class.
//!
//! Failures (-1 from `ibv_init_ah_from_wc`, NULL from `ibv_create_ah_from_wc`, `errno`
//! set): `EPROTONOSUPPORT` when the GRH area is neither IPv4 nor IPv6 or an IPv6 next header
//! is neither UDP nor 0x1B; `EINVAL` for a multicast destination, a destination that is no
//! GID of the port (the search runs past the end of the table), a bad context, port or PD.
//! As in rdma-core, `*ah_attr` holds what was filled before the failure.

use std::ffi::c_int;

use crate::abi::*;
use crate::ah::create_ah;
use crate::device::{self, Registry};
use crate::entry::*;
use crate::error::FfiError;
use crate::objects::objects;

/// Size of the GRH area at the start of a UD receive buffer.
pub const GRH_LEN: usize = 40;

/// Where the IPv4 header starts in the GRH area of an IPv4 datagram.
const IPV4_OFFSET: usize = 20;

/// IPv6 next header / IPv4 protocol: UDP (RoCEv2).
const NEXT_HDR_UDP: u8 = 17;
/// IPv6 next header of a RoCEv1 GRH (IBA: the BTH follows).
const NEXT_HDR_IB: u8 = 0x1b;

/// `ibv_gid_type` of a GID table entry, as far as the reply needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// `IBV_GID_TYPE_ROCE_V2` (uroce's populated entries).
    RoceV2,
    /// `IBV_GID_TYPE_IB` / RoCEv1 (uroce's empty entries report this type).
    IbRoceV1,
}

/// What the GRH area of a datagram says about the reply, before the GID table is
/// consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrhReply {
    /// The datagram's source address as a GID: the reply's destination.
    pub dgid: [u8; 16],
    /// The datagram's destination address as a GID: the local GID the reply leaves from.
    pub local_gid: [u8; 16],
    /// The type the local GID table entry must have.
    pub local_kind: GidKind,
    /// TTL / hop limit.
    pub hop_limit: u8,
    /// TOS / traffic class.
    pub traffic_class: u8,
}

/// Why a GRH area gives no reply (the errno rdma-core reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GrhError {
    /// Neither an IPv4 nor an IPv6 header, or an IPv6 next header that is neither UDP nor
    /// IB (`EPROTONOSUPPORT`).
    #[error("the GRH area holds no RoCE IPv4 or IPv6 header")]
    NotRoce,
    /// The datagram went to a multicast address (`EINVAL`): no GID to answer from.
    #[error("the datagram's destination is a multicast address")]
    Multicast,
}

impl GrhError {
    /// The errno value rdma-core reports.
    pub const fn errno(self) -> c_int {
        match self {
            GrhError::NotRoce => libc::EPROTONOSUPPORT,
            GrhError::Multicast => libc::EINVAL,
        }
    }
}

/// The IPv4-mapped IPv6 form of an IPv4 address (`::ffff:a.b.c.d`).
fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

/// The Internet checksum of a 20-byte IPv4 header with its checksum field taken as zero.
fn ipv4_header_checksum(h: &[u8; 20]) -> u16 {
    let mut sum: u32 = 0;
    for (i, pair) in h.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The IP version the GRH area holds (4 or 6), or `None`.
fn grh_version(grh: &[u8; GRH_LEN]) -> Option<u8> {
    let mut v4 = [0u8; 20];
    v4.copy_from_slice(&grh[IPV4_OFFSET..]);
    if grh[0] >> 4 != 6 {
        return (v4[0] >> 4 == 4).then_some(4);
    }
    // Version 6 in byte 0 may still be the undefined first half of an IPv4 GRH area:
    // believe an IPv4 header only with IHL 5 and a correct checksum.
    if v4[0] & 0x0f != 5 {
        return Some(6);
    }
    let stored = u16::from_be_bytes([v4[10], v4[11]]);
    Some(if stored == ipv4_header_checksum(&v4) {
        4
    } else {
        6
    })
}

/// The flow label of the GRH area's first word (what every reply carries).
pub fn grh_flow_label(grh: &[u8; GRH_LEN]) -> u32 {
    u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]) & 0x000f_ffff
}

/// Reads the reply's addresses out of a GRH area (see the module doc).
pub fn parse_grh(grh: &[u8; GRH_LEN]) -> Result<GrhReply, GrhError> {
    match grh_version(grh) {
        Some(4) => {
            let h = &grh[IPV4_OFFSET..];
            let src = [h[12], h[13], h[14], h[15]];
            let dst = [h[16], h[17], h[18], h[19]];
            // Class D: 224.0.0.0/4.
            if dst[0] & 0xf0 == 0xe0 {
                return Err(GrhError::Multicast);
            }
            Ok(GrhReply {
                dgid: v4_mapped(src),
                local_gid: v4_mapped(dst),
                local_kind: GidKind::RoceV2,
                hop_limit: h[8],
                traffic_class: h[1],
            })
        }
        Some(_) => {
            let mut src = [0u8; 16];
            let mut dst = [0u8; 16];
            src.copy_from_slice(&grh[8..24]);
            dst.copy_from_slice(&grh[24..40]);
            if dst[0] == 0xff {
                return Err(GrhError::Multicast);
            }
            let local_kind = match grh[6] {
                NEXT_HDR_UDP => GidKind::RoceV2,
                NEXT_HDR_IB => GidKind::IbRoceV1,
                _ => return Err(GrhError::NotRoce),
            };
            let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
            Ok(GrhReply {
                dgid: src,
                local_gid: dst,
                local_kind,
                hop_limit: grh[7],
                traffic_class: ((vtf >> 20) & 0xff) as u8,
            })
        }
        None => Err(GrhError::NotRoce),
    }
}

/// The index of the first GID table entry equal to `gid` and of type `kind` (uroce's
/// populated entries are RoCEv2, its empty ones read as zero GIDs of type RoCEv1).
fn find_gid_index(
    net: &uroce_net::NetDevice,
    port: u8,
    gid: &[u8; 16],
    kind: GidKind,
) -> Result<u8, FfiError> {
    let len = u32::try_from(device::port_attr(net, port)?.gid_tbl_len).unwrap_or(0);
    for i in 0..u64::from(len) {
        let (g, k) = match device::gid(net, port.into(), i)? {
            Some(g) => (g.0, GidKind::RoceV2),
            None => ([0u8; 16], GidKind::IbRoceV1),
        };
        if g == *gid && k == kind {
            return u8::try_from(i).map_err(|_| FfiError::BadGidIndex { index: i, len });
        }
    }
    Err(FfiError::Invalid(
        "the datagram's destination address is no GID of this port",
    ))
}

/// Fills `ah` as the module doc says; on failure `ah` holds what was filled before it.
fn init_ah(
    context: *mut ibv_context,
    port_num: u8,
    wc: &ibv_wc,
    grh: Option<&[u8; GRH_LEN]>,
    ah: &mut ibv_ah_attr,
) -> Result<(), FfiError> {
    // SAFETY: ibv_ah_attr is integers and a byte-array union: all-zero is valid.
    *ah = unsafe { crate::objects::zeroed() };
    ah.grh.flow_label = grh.map_or(0, grh_flow_label);
    ah.dlid = wc.slid;
    ah.sl = wc.sl;
    ah.src_path_bits = wc.dlid_path_bits;
    ah.port_num = port_num;
    if wc.wc_flags & IBV_WC_GRH == 0 {
        return Ok(());
    }
    ah.is_global = 1;
    let grh = grh.ok_or(FfiError::Invalid("IBV_WC_GRH set but grh is NULL"))?;
    let reply = parse_grh(grh).map_err(|e| FfiError::Refused {
        op: "ibv_init_ah_from_wc",
        errno: e.errno(),
        reason: e.to_string(),
    })?;
    let net = Registry::net(context)?;
    let index = find_gid_index(&net, port_num, &reply.local_gid, reply.local_kind)?;
    ah.grh.dgid = ibv_gid { raw: reply.dgid };
    ah.grh.sgid_index = index;
    ah.grh.hop_limit = reply.hop_limit;
    ah.grh.traffic_class = reply.traffic_class;
    Ok(())
}

/// Reads the 40-byte GRH area at `grh` (NULL: none).
///
/// # Safety
/// `grh` is NULL or valid for reading 40 bytes (any alignment).
unsafe fn read_grh(grh: *const u8) -> Option<[u8; GRH_LEN]> {
    // SAFETY: caller guarantee: 40 readable bytes (checked non-NULL); read unaligned.
    (!grh.is_null()).then(|| unsafe { grh.cast::<[u8; GRH_LEN]>().read_unaligned() })
}

symver!(
    "uroce_ibv_init_ah_from_wc",
    "ibv_init_ah_from_wc@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_create_ah_from_wc",
    "ibv_create_ah_from_wc@@IBVERBS_1.1"
);

/// `ibv_init_ah_from_wc(context, port_num, wc, grh, ah_attr)`: the address vector that
/// answers the datagram `wc` / `grh` reported (see the module doc); 0, or -1 + `errno`.
///
/// # Safety
/// `wc` is NULL or a readable `struct ibv_wc`; `grh` NULL or 40 readable bytes (the start
/// of the receive buffer); `ah_attr` NULL or a writable `struct ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *const ibv_wc,
    grh: *const u8,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded caller guarantees.
        let r = unsafe { init_ah_from_wc(context, port_num, wc, grh, ah_attr) };
        minus_one(r)
    })
}

/// [`uroce_ibv_init_ah_from_wc`] with a typed result.
///
/// # Safety
/// As [`uroce_ibv_init_ah_from_wc`].
unsafe fn init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *const ibv_wc,
    grh: *const u8,
    ah_attr: *mut ibv_ah_attr,
) -> Result<(), FfiError> {
    if wc.is_null() || ah_attr.is_null() {
        return Err(FfiError::Invalid("wc or ah_attr is NULL"));
    }
    // SAFETY: caller guarantees (checked non-NULL where required).
    let (w, g) = unsafe { (wc.read(), read_grh(grh)) };
    // SAFETY: ibv_ah_attr is integers and a byte-array union: all-zero is valid.
    let mut ah: ibv_ah_attr = unsafe { crate::objects::zeroed() };
    let r = init_ah(context, port_num, &w, g.as_ref(), &mut ah);
    // SAFETY: caller guarantee: writable ah_attr (checked non-NULL).
    unsafe { ah_attr.write(ah) };
    r
}

/// `ibv_create_ah_from_wc(pd, wc, grh, port_num)`: an address handle in `pd` for the
/// reply to the datagram `wc` / `grh` reported ([`uroce_ibv_init_ah_from_wc`] then
/// `ibv_create_ah`); NULL + `errno` on failure.
///
/// # Safety
/// As [`uroce_ibv_init_ah_from_wc`]; `pd` is checked against the registry.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *const ibv_wc,
    grh: *const u8,
    port_num: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            // SAFETY: `pd` is a registered, live PD allocated by uroce (checked under the
            // lock, which is released before the calls below take it again).
            let context = objects().pd(pd).map(|_| unsafe { (*pd).context })?;
            // SAFETY: zeroed ibv_ah_attr is valid (integers and a byte-array union).
            let mut ah: ibv_ah_attr = unsafe { crate::objects::zeroed() };
            // SAFETY: forwarded caller guarantees; `ah` is a local.
            unsafe { init_ah_from_wc(context, port_num, wc, grh, &mut ah) }?;
            create_ah(pd, &ah)
        })())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GRH area for an IPv4 datagram from `src` to `dst` (20 zero bytes, then the
    /// header with a correct checksum).
    fn ipv4_grh(src: [u8; 4], dst: [u8; 4], tos: u8, ttl: u8) -> [u8; GRH_LEN] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        h[6] = 0x40; // DF
        h[8] = ttl;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let c = ipv4_header_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        let mut g = [0u8; GRH_LEN];
        g[20..].copy_from_slice(&h);
        g
    }

    fn ipv6_grh(src: [u8; 16], dst: [u8; 16], tc: u8, flow: u32, next: u8) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        let vtf = (6u32 << 28) | (u32::from(tc) << 20) | (flow & 0xf_ffff);
        g[0..4].copy_from_slice(&vtf.to_be_bytes());
        g[4..6].copy_from_slice(&100u16.to_be_bytes());
        g[6] = next;
        g[7] = 17; // hop limit
        g[8..24].copy_from_slice(&src);
        g[24..40].copy_from_slice(&dst);
        g
    }

    #[test]
    fn checksum_matches_a_known_header() {
        // A textbook IPv4 header whose checksum is 0xb861.
        let h: [u8; 20] = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_header_checksum(&h), 0xb861);
    }

    #[test]
    fn ipv4_reply_is_the_mapped_source() {
        let g = ipv4_grh([127, 0, 0, 1], [127, 0, 0, 2], 0x28, 63);
        let r = parse_grh(&g).expect("IPv4");
        assert_eq!(r.dgid, v4_mapped([127, 0, 0, 1]));
        assert_eq!(r.local_gid, v4_mapped([127, 0, 0, 2]));
        assert_eq!(r.local_kind, GidKind::RoceV2);
        assert_eq!((r.hop_limit, r.traffic_class), (63, 0x28));
        assert_eq!(grh_flow_label(&g), 0);
    }

    #[test]
    fn ipv6_reply_swaps_the_addresses() {
        let a: [u8; 16] = std::net::Ipv6Addr::LOCALHOST.octets();
        let mut b = a;
        b[0] = 0xfd;
        let g = ipv6_grh(a, b, 0xb8, 0x12345, NEXT_HDR_UDP);
        let r = parse_grh(&g).expect("IPv6");
        assert_eq!((r.dgid, r.local_gid), (a, b));
        assert_eq!((r.hop_limit, r.traffic_class), (17, 0xb8));
        assert_eq!(grh_flow_label(&g), 0x12345);
        let g = ipv6_grh(a, b, 0, 0, NEXT_HDR_IB);
        assert_eq!(parse_grh(&g).map(|r| r.local_kind), Ok(GidKind::IbRoceV1));
        let g = ipv6_grh(a, b, 0, 0, 6);
        assert_eq!(parse_grh(&g), Err(GrhError::NotRoce));
    }

    #[test]
    fn version_six_in_byte_zero_with_a_valid_ipv4_header_is_ipv4() {
        let mut g = ipv4_grh([10, 0, 0, 1], [10, 0, 0, 2], 0, 64);
        g[0] = 0x60;
        assert_eq!(grh_version(&g), Some(4));
        // The same with a broken checksum reads as IPv6.
        g[IPV4_OFFSET + 10] ^= 1;
        assert_eq!(grh_version(&g), Some(6));
    }

    #[test]
    fn multicast_and_garbage_are_refused() {
        let g = ipv4_grh([10, 0, 0, 1], [239, 1, 2, 3], 0, 64);
        assert_eq!(parse_grh(&g), Err(GrhError::Multicast));
        let mut m = [0u8; 16];
        m[0] = 0xff;
        let g = ipv6_grh([1; 16], m, 0, 0, NEXT_HDR_UDP);
        assert_eq!(parse_grh(&g), Err(GrhError::Multicast));
        assert_eq!(parse_grh(&[0u8; GRH_LEN]), Err(GrhError::NotRoce));
        assert_eq!(GrhError::NotRoce.errno(), libc::EPROTONOSUPPORT);
    }
}
