//! The device: its name, node GUID, capabilities, its single Ethernet port and GID table.
//!
//! A uroce device is a software RoCEv2 device bound to one IP address. Everything about it
//! is derived from its [`DeviceConfig`]:
//!
//! * **GID table**: entry 0 is the RoCEv2 GID of the address — for IPv4 the IPv4-mapped
//!   IPv6 address `::ffff:a.b.c.d` (IBA Annex A17), for IPv6 the address itself. The table
//!   has room for [`PortAttr::gid_tbl_len`] entries; only entry 0 is populated.
//! * **Node GUID**: the modified EUI-64 of a locally administered pseudo-MAC built from the
//!   address — the Linux software RoCE driver derives its GUID from the netdev's MAC the same
//!   way, but a uroce device has no MAC, so the address stands in for it:
//!   IPv4 `a.b.c.d` → MAC `02:00:a:b:c:d`; IPv6 → `02` followed by the address' last five
//!   bytes. The EUI-64 inserts `ff:fe` in the middle and flips the universal/local bit:
//!   MAC `m0:m1:m2:m3:m4:m5` → GUID `(m0^2):m1:m2:ff:fe:m3:m4:m5`. For `10.0.0.1` that is
//!   `0000:0aff:fe00:0001`. The system image GUID equals the node GUID.
//! * **Port 1**: Ethernet link layer, state ACTIVE, max MTU 4096, active MTU = the largest
//!   IB MTU that fits the link MTU minus 80 header bytes (INTEROP-NOTES §4: 1500 → 1024,
//!   9000 → 4096).
//! * **Limits** ([`DeviceAttr`]): the Linux software RoCE driver's values (INTEROP-NOTES §8)
//!   where the spec lists one; the remaining ones are uroce's own and say so.
//!
//! The port can be taken down and up ([`Device::set_port_state`]); every open
//! [`crate::Context`] then receives `PORT_ERR` / `PORT_ACTIVE`. [`Device::raise_fatal`]
//! delivers `DEVICE_FATAL`.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::ops::RangeInclusive;
use std::sync::{Mutex as StdMutex, Weak as StdWeak};

use uroce_wire::pmtu::Pmtu;

use crate::error::DeviceError;
use crate::event::{EventQueue, EventType};
use crate::sync::{Arc, AtomicBool, Ordering};

/// Bytes of headers rxe reserves below the link MTU when it picks the port MTU (INTEROP-NOTES §4).
pub const ROCE_HEADER_RESERVE: u32 = 80;

/// The only port number of a uroce device (IB ports count from 1).
pub const PORT_NUM: u8 = 1;

/// The default P_Key (full membership, default partition), the only entry of the P_Key
/// table.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// A 128-bit global identifier; on RoCEv2 an IPv6 address (IPv4 addresses mapped).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an unused table entry).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The RoCEv2 GID of an IP address: IPv4 → `::ffff:a.b.c.d`, IPv6 → itself.
    pub fn from_ip(addr: IpAddr) -> Gid {
        match addr {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for: an IPv4-mapped GID gives the IPv4 address,
    /// anything else the IPv6 address.
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// Whether this is the all-zero GID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The 64-bit subnet prefix (first 8 bytes, big-endian).
    pub fn subnet_prefix(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(b)
    }

    /// The 64-bit interface identifier (last 8 bytes, big-endian).
    pub fn interface_id(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(b)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl fmt::Display for Gid {
    /// Formats like the verbs tools: eight groups of four hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// How to build a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name, e.g. `uroce0`: 1 to 63 characters, ASCII letters, digits, `_` or `-`.
    pub name: String,
    /// The IP address the device sends from and receives on.
    pub addr: IpAddr,
    /// Link MTU in bytes (the IP MTU of the interface); the port's active MTU derives from it.
    pub link_mtu: u32,
    /// The QP numbers a context of the device allots (default
    /// [`crate::context::FIRST_QPN`]`..=`[`crate::context::MAX_QPN`]). A member of a
    /// host-wide device allots only the numbers of its slot (`uroce_socket::steer`'s QPN
    /// layout); the GSI QP keeps number 1, outside any range.
    pub qpn_range: RangeInclusive<u32>,
    /// The first QPN a context tries (default: the range's first; one outside the range
    /// is ignored). A member of a host-wide device that takes over a slot whose last
    /// member left cleanly carries on where that one's numbering stopped, so a number
    /// comes back only after the whole range.
    pub qpn_start: Option<u32>,
    /// The SRQ numbers a context of the device allots (default
    /// [`crate::context::FIRST_SRQN`]`..=`[`crate::context::MAX_QPN`]). A member of a
    /// host-wide device allots only its slot's, as for QPNs: an XRC request is steered to
    /// the process of the XRC SRQ its XRCETH names (`uroce_socket::steer`).
    pub srqn_range: RangeInclusive<u32>,
}

impl DeviceConfig {
    /// A configuration with the given name and address and an Ethernet MTU of 1500.
    pub fn new(name: impl Into<String>, addr: IpAddr) -> DeviceConfig {
        DeviceConfig {
            name: name.into(),
            addr,
            link_mtu: 1500,
            qpn_range: crate::context::FIRST_QPN..=crate::context::MAX_QPN,
            qpn_start: None,
            srqn_range: crate::context::FIRST_SRQN..=crate::context::MAX_QPN,
        }
    }
}

/// Atomic operation support (`enum ibv_atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AtomicCap {
    /// No atomics (`IBV_ATOMIC_NONE` = 0).
    None = 0,
    /// Atomic within the HCA (`IBV_ATOMIC_HCA` = 1): what rxe reports (INTEROP-NOTES §8).
    Hca = 1,
    /// Atomic with respect to all (`IBV_ATOMIC_GLOB` = 2).
    Glob = 2,
}

/// Device capabilities (the `ibv_device_attr` fields uroce fills in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Node GUID (see the module docs for its derivation).
    pub node_guid: u64,
    /// System image GUID (= node GUID).
    pub sys_image_guid: u64,
    /// Largest message in bytes (INTEROP-NOTES §8: 0x800000).
    pub max_msg_sz: u64,
    /// Maximum number of QPs (INTEROP-NOTES §8: 0x10000).
    pub max_qp: u32,
    /// Maximum work requests per send or receive queue (INTEROP-NOTES §8: 0x4000).
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per WR (INTEROP-NOTES §8: 32).
    pub max_sge: u32,
    /// Maximum SGEs for RDMA READ (INTEROP-NOTES §8: 32).
    pub max_sge_rd: u32,
    /// Maximum inline data per send WR (INTEROP-NOTES §8: 400 as in older rxe).
    pub max_inline_data: u32,
    /// Maximum number of CQs (INTEROP-NOTES §8: 16384).
    pub max_cq: u32,
    /// Maximum entries per CQ: 2^22 − 1, as a ConnectX NIC reports (the kernel's rxe has
    /// 2^15 − 1; libfabric's `ofi_rxm` asks for 262144 entries and does not retry
    /// smaller). A CQ's entries are stored as completions arrive, so a large capacity
    /// costs nothing until it is used.
    pub max_cqe: u32,
    /// Maximum number of memory regions (uroce: 2^20, the key index space of [`crate::mr`]).
    pub max_mr: u32,
    /// Maximum number of protection domains (uroce's own limit).
    pub max_pd: u32,
    /// Maximum outstanding RDMA READ/atomic as responder (INTEROP-NOTES §8: 128).
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA READ/atomic as initiator (INTEROP-NOTES §8: 128).
    pub max_qp_init_rd_atom: u32,
    /// Maximum number of SRQs (INTEROP-NOTES §8: 960).
    pub max_srq: u32,
    /// Maximum WRs per SRQ (INTEROP-NOTES §8: 0x4000).
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ WR (INTEROP-NOTES §8: 27).
    pub max_srq_sge: u32,
    /// Maximum number of address handles (uroce's own limit).
    pub max_ah: u32,
    /// Maximum number of XRC domains (uroce's own limit).
    pub max_xrcd: u32,
    /// P_Key table length (INTEROP-NOTES §8: 64; only entry 0 = 0xffff is populated).
    pub max_pkeys: u16,
    /// Local CA ACK delay (INTEROP-NOTES §8: 15).
    pub local_ca_ack_delay: u8,
    /// Atomic support (INTEROP-NOTES §8: HCA).
    pub atomic_cap: AtomicCap,
    /// Number of physical ports (1).
    pub phys_port_cnt: u8,
}

/// Port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum PortState {
    /// `IBV_PORT_DOWN` = 1.
    Down = 1,
    /// `IBV_PORT_ACTIVE` = 4.
    Active = 4,
}

/// Link layer of a port (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_INFINIBAND` = 1.
    InfiniBand = 1,
    /// `IBV_LINK_LAYER_ETHERNET` = 2: every uroce port.
    Ethernet = 2,
}

/// Port attributes (the `ibv_port_attr` fields uroce fills in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Current state.
    pub state: PortState,
    /// Largest MTU the port supports (4096).
    pub max_mtu: Pmtu,
    /// The MTU derived from the link MTU (INTEROP-NOTES §4).
    pub active_mtu: Pmtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Link layer: always Ethernet.
    pub link_layer: LinkLayer,
    /// Maximum message size (same as the device's).
    pub max_msg_sz: u64,
    /// Link width, encoded as IBA PortInfo's LinkWidthActive (14.2.5.6):
    /// [`PORT_ACTIVE_WIDTH`].
    pub active_width: u8,
    /// Link speed, encoded as IBA PortInfo's LinkSpeedActive (14.2.5.6):
    /// [`PORT_ACTIVE_SPEED`].
    pub active_speed: u8,
}

/// A uroce device (cheap to clone; every clone is the same device).
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    name: String,
    addr: IpAddr,
    link_mtu: u32,
    active_mtu: Pmtu,
    qpn_range: RangeInclusive<u32>,
    qpn_start: u32,
    srqn_range: RangeInclusive<u32>,
    attr: DeviceAttr,
    gid0: Gid,
    port_up: AtomicBool,
    /// The event queues of the open contexts, for port and device events. Plain `std`
    /// types: this list is not part of the model-checked protocol.
    contexts: StdMutex<Vec<StdWeak<EventQueue>>>,
}

impl Device {
    /// Creates a device from `config` after validating its name and link MTU.
    pub fn new(config: DeviceConfig) -> Result<Device, DeviceError> {
        let DeviceConfig {
            name,
            addr,
            link_mtu,
            qpn_range,
            qpn_start,
            srqn_range,
        } = config;
        let name_ok = !name.is_empty()
            && name.len() < 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(DeviceError::InvalidName { name });
        }
        if addr.is_unspecified() {
            return Err(DeviceError::UnspecifiedAddress { addr });
        }
        // QP0 and QP1 are never allotted, nor numbers beyond 24 bits.
        if *qpn_range.start() < 2
            || *qpn_range.end() > crate::context::MAX_QPN
            || qpn_range.is_empty()
        {
            return Err(DeviceError::InvalidQpnRange {
                first: *qpn_range.start(),
                last: *qpn_range.end(),
            });
        }
        // SRQ number 0 means "none".
        if *srqn_range.start() < crate::context::FIRST_SRQN
            || *srqn_range.end() > crate::context::MAX_QPN
            || srqn_range.is_empty()
        {
            return Err(DeviceError::InvalidSrqnRange {
                first: *srqn_range.start(),
                last: *srqn_range.end(),
            });
        }
        let active_mtu = Pmtu::largest_fitting(link_mtu, ROCE_HEADER_RESERVE).ok_or(
            DeviceError::LinkMtuTooSmall {
                link_mtu,
                min: Pmtu::Mtu256.bytes() + ROCE_HEADER_RESERVE,
            },
        )?;
        let guid = node_guid_for(addr);
        let attr = DeviceAttr {
            node_guid: guid,
            sys_image_guid: guid,
            max_msg_sz: 0x80_0000,
            max_qp: 0x1_0000,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_sge_rd: 32,
            max_inline_data: 400,
            max_cq: 16384,
            max_cqe: (1 << 22) - 1,
            max_mr: (1 << 20) - crate::mw::MAX_MW,
            max_pd: 0x1_0000,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_srq: 960,
            max_srq_wr: 0x4000,
            max_srq_sge: 27,
            max_ah: 0x1_0000,
            max_xrcd: 1024,
            max_pkeys: 64,
            local_ca_ack_delay: 15,
            atomic_cap: AtomicCap::Hca,
            phys_port_cnt: 1,
        };
        Ok(Device {
            inner: Arc::new(DeviceInner {
                name,
                addr,
                link_mtu,
                active_mtu,
                qpn_start: qpn_start
                    .filter(|n| qpn_range.contains(n))
                    .unwrap_or(*qpn_range.start()),
                qpn_range,
                srqn_range,
                attr,
                gid0: Gid::from_ip(addr),
                port_up: AtomicBool::new(true),
                contexts: StdMutex::new(Vec::new()),
            }),
        })
    }

    /// The QP numbers its contexts allot (see [`DeviceConfig::qpn_range`]).
    pub fn qpn_range(&self) -> RangeInclusive<u32> {
        self.inner.qpn_range.clone()
    }

    /// The first QPN its contexts try (see [`DeviceConfig::qpn_start`]).
    pub fn qpn_start(&self) -> u32 {
        self.inner.qpn_start
    }

    /// The SRQ numbers its contexts allot (see [`DeviceConfig::srqn_range`]).
    pub fn srqn_range(&self) -> RangeInclusive<u32> {
        self.inner.srqn_range.clone()
    }

    /// The device name (`uroce0`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The IP address the device is bound to.
    pub fn addr(&self) -> IpAddr {
        self.inner.addr
    }

    /// The link MTU the device was configured with.
    pub fn link_mtu(&self) -> u32 {
        self.inner.link_mtu
    }

    /// The node GUID.
    pub fn node_guid(&self) -> u64 {
        self.inner.attr.node_guid
    }

    /// Device capabilities (`ibv_query_device`).
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// Attributes of port `port` (`ibv_query_port`); only port 1 exists.
    pub fn port_attr(&self, port: u8) -> Result<PortAttr, DeviceError> {
        if port != PORT_NUM {
            return Err(DeviceError::InvalidPort { port });
        }
        Ok(PortAttr {
            state: if self.inner.port_up.load(Ordering::Acquire) {
                PortState::Active
            } else {
                PortState::Down
            },
            max_mtu: Pmtu::Mtu4096,
            active_mtu: self.inner.active_mtu,
            gid_tbl_len: GID_TABLE_LEN,
            pkey_tbl_len: self.inner.attr.max_pkeys,
            link_layer: LinkLayer::Ethernet,
            max_msg_sz: self.inner.attr.max_msg_sz,
            active_width: PORT_ACTIVE_WIDTH,
            active_speed: PORT_ACTIVE_SPEED,
        })
    }

    /// The port's active MTU.
    pub fn active_mtu(&self) -> Pmtu {
        self.inner.active_mtu
    }

    /// GID table entry `index` of `port` (`ibv_query_gid`): entry 0 is the device's RoCEv2
    /// GID; other in-range entries are unused (all zero); out-of-range indices are errors.
    pub fn gid(&self, port: u8, index: u32) -> Result<Gid, DeviceError> {
        if port != PORT_NUM {
            return Err(DeviceError::InvalidPort { port });
        }
        match index {
            0 => Ok(self.inner.gid0),
            i if i < GID_TABLE_LEN => Ok(Gid::ZERO),
            _ => Err(DeviceError::InvalidGidIndex {
                index,
                len: GID_TABLE_LEN,
            }),
        }
    }

    /// The populated GID at `index`, if any (the source GID an address vector may use).
    pub(crate) fn valid_gid(&self, index: u32) -> Option<Gid> {
        (index == 0).then_some(self.inner.gid0)
    }

    /// P_Key table entry `index` (`ibv_query_pkey`): entry 0 is 0xffff, other in-range
    /// entries are 0.
    pub fn pkey(&self, port: u8, index: u16) -> Result<u16, DeviceError> {
        if port != PORT_NUM {
            return Err(DeviceError::InvalidPort { port });
        }
        match index {
            0 => Ok(DEFAULT_PKEY),
            i if i < self.inner.attr.max_pkeys => Ok(0),
            _ => Err(DeviceError::InvalidPkeyIndex {
                index,
                len: self.inner.attr.max_pkeys,
            }),
        }
    }

    /// Sets the port state and raises `PORT_ACTIVE` (up) or `PORT_ERR` (down) on every open
    /// context, if the state changed (docs/INTEROP-NOTES.md §7: rxe on netdev up/down).
    pub fn set_port_state(&self, up: bool) {
        let was = self.inner.port_up.swap(up, Ordering::AcqRel);
        if was != up {
            let event = if up {
                EventType::PortActive
            } else {
                EventType::PortErr
            };
            self.broadcast(event);
        }
    }

    /// Raises `DEVICE_FATAL` on every open context.
    pub fn raise_fatal(&self) {
        self.broadcast(EventType::DeviceFatal);
    }

    /// Whether two handles name the same device.
    pub fn same_device(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn broadcast(&self, event: EventType) {
        let queues: Vec<std::sync::Arc<EventQueue>> = {
            let mut list = self
                .inner
                .contexts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(StdWeak::upgrade).collect()
        };
        for q in queues {
            q.raise_unattached(event);
        }
    }

    /// Registers an open context's event queue for port/device events.
    pub(crate) fn register(&self, queue: &std::sync::Arc<EventQueue>) {
        let mut list = self
            .inner
            .contexts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        list.retain(|w| w.strong_count() > 0);
        list.push(std::sync::Arc::downgrade(queue));
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.inner.name)
            .field("addr", &self.inner.addr)
            .field(
                "node_guid",
                &format_args!("{:#018x}", self.inner.attr.node_guid),
            )
            .finish()
    }
}

/// Length of the GID table (INTEROP-NOTES §8: 1024).
pub const GID_TABLE_LEN: u32 = 1024;

/// The port's active link width, as IBA PortInfo's LinkWidthActive encodes it
/// (14.2.5.6: 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X): 8X.
///
/// A software device has no lanes, but programs derive what the port moves from width ×
/// speed (UCX's lane selection weighs transports by it). 8X at SDR (2.5 Gb/s a lane, 8b/10b)
/// is 20 Gb/s, about 2 GB/s of data: what uroce moves over loopback on the project's
/// machines (docs/BENCHMARKS.md: RDMA WRITE of 1 MiB, 1.2 – 2.4 GB/s), and SDR's latency,
/// which UCX assumes to be 5 µs, is uroce's too. 1X SDR (0.25 GB/s) made UCX prefer TCP.
pub const PORT_ACTIVE_WIDTH: u8 = 4;
/// The port's active link speed, as IBA PortInfo's LinkSpeedActive encodes it
/// (14.2.5.6: 1 = SDR, 2.5 Gb/s a lane): see [`PORT_ACTIVE_WIDTH`].
pub const PORT_ACTIVE_SPEED: u8 = 1;
/// The port's rate as the kernel writes it in sysfs `ports/<n>/rate`
/// ([`PORT_ACTIVE_WIDTH`] × [`PORT_ACTIVE_SPEED`]).
pub const PORT_RATE_TEXT: &str = "20 Gb/sec (8X SDR)";

/// The node GUID of a device bound to `addr` (see the module docs).
pub fn node_guid_for(addr: IpAddr) -> u64 {
    let mac: [u8; 6] = match addr {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            [0x02, 0x00, o[0], o[1], o[2], o[3]]
        }
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [0x02, o[11], o[12], o[13], o[14], o[15]]
        }
    };
    let eui = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_be_bytes(eui)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_round_trip_and_format() {
        let g = Gid::from_ip("192.168.1.2".parse().expect("ip"));
        assert_eq!(g.to_ip(), "192.168.1.2".parse::<IpAddr>().expect("ip"));
        assert_eq!(
            g.to_string(),
            "0000:0000:0000:0000:0000:ffff:c0a8:0102",
            "IPv4-mapped ::ffff:192.168.1.2"
        );
        let v6: IpAddr = "fe80::1".parse().expect("ip");
        assert_eq!(Gid::from_ip(v6).to_ip(), v6);
        assert_eq!(Gid::from_ip(v6).subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(Gid::from_ip(v6).interface_id(), 1);
    }

    #[test]
    fn rejects_bad_config() {
        let addr: IpAddr = "10.0.0.1".parse().expect("ip");
        assert!(matches!(
            Device::new(DeviceConfig::new("", addr)),
            Err(DeviceError::InvalidName { .. })
        ));
        assert!(matches!(
            Device::new(DeviceConfig::new("a b", addr)),
            Err(DeviceError::InvalidName { .. })
        ));
        let mut c = DeviceConfig::new("uroce0", addr);
        c.link_mtu = 300;
        assert!(matches!(
            Device::new(c),
            Err(DeviceError::LinkMtuTooSmall { .. })
        ));
        assert!(matches!(
            Device::new(DeviceConfig::new("uroce0", "0.0.0.0".parse().expect("ip"))),
            Err(DeviceError::UnspecifiedAddress { .. })
        ));
        for (first, last) in [(0, 100), (1, 100), (16, 0x100_0000), (100, 99)] {
            let range = first..=last;
            let mut c = DeviceConfig::new("uroce0", addr);
            c.qpn_range = range.clone();
            assert!(
                matches!(Device::new(c), Err(DeviceError::InvalidQpnRange { .. })),
                "{range:?}"
            );
        }
        for (first, last) in [(0, 100), (16, 0x100_0000), (100, 99)] {
            let range = first..=last;
            let mut c = DeviceConfig::new("uroce0", addr);
            c.srqn_range = range.clone();
            assert!(
                matches!(Device::new(c), Err(DeviceError::InvalidSrqnRange { .. })),
                "{range:?}"
            );
        }
    }
}
