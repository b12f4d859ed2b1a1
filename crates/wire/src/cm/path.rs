//! Path records as the REQ (primary, alternate) and LAP (alternate) carry them (IBA Vol 1 §12.6.5).

use super::*;

/// Where the fields of a path record are (REQ primary, REQ alternate, LAP alternate).
#[derive(Clone, Copy)]
pub(super) struct PathLayout {
    local_lid: usize,
    local_gid: usize,
    flow_label: usize,
    packet_rate: usize,
    traffic_class: usize,
    hop_limit: usize,
    sl: usize,
    ack_timeout: usize,
}

pub(super) const REQ_PRIMARY: PathLayout = PathLayout {
    local_lid: 52,
    local_gid: 56,
    flow_label: 88,
    packet_rate: 91,
    traffic_class: 92,
    hop_limit: 93,
    sl: 94,
    ack_timeout: 95,
};
pub(super) const REQ_ALTERNATE: PathLayout = PathLayout {
    local_lid: 96,
    local_gid: 100,
    flow_label: 132,
    packet_rate: 135,
    traffic_class: 136,
    hop_limit: 137,
    sl: 138,
    ack_timeout: 139,
};
pub(super) const LAP_ALTERNATE: PathLayout = PathLayout {
    local_lid: 20,
    local_gid: 24,
    flow_label: 56,
    packet_rate: 61,
    traffic_class: 59,
    hop_limit: 60,
    sl: 62,
    ack_timeout: 63,
};

/// A path record as the REQ (primary, alternate) and LAP (alternate) carry it. On RoCE the
/// GIDs are the IP addresses (IPv4 as `::ffff:a.b.c.d`), and flow label, traffic class and
/// hop limit are those of the IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    /// Local port LID (0xFFFF, permissive, on RoCE routed paths).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBA rate enumeration).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits: 4.096 µs × 2^t).
    pub local_ack_timeout: u8,
}

impl PathRepr {
    pub(super) fn read(buf: &[u8], l: PathLayout) -> PathRepr {
        PathRepr {
            local_lid: u16_at(buf, l.local_lid),
            remote_lid: u16_at(buf, l.local_lid + 2),
            local_gid: get(buf, l.local_gid),
            remote_gid: get(buf, l.local_gid + 16),
            flow_label: flow_label(buf, l.flow_label),
            packet_rate: bits(buf, l.packet_rate, 2, 6),
            traffic_class: u8_at(buf, l.traffic_class),
            hop_limit: u8_at(buf, l.hop_limit),
            sl: bits(buf, l.sl, 0, 4),
            subnet_local: flag(buf, l.sl, 4),
            local_ack_timeout: bits(buf, l.ack_timeout, 0, 5),
        }
    }

    pub(super) fn write(&self, buf: &mut [u8], l: PathLayout) {
        set_u16(buf, l.local_lid, self.local_lid);
        set_u16(buf, l.local_lid + 2, self.remote_lid);
        put(buf, l.local_gid, self.local_gid);
        put(buf, l.local_gid + 16, self.remote_gid);
        set_flow_label(buf, l.flow_label, self.flow_label);
        set_bits(buf, l.packet_rate, 2, 6, self.packet_rate);
        set_u8(buf, l.traffic_class, self.traffic_class);
        set_u8(buf, l.hop_limit, self.hop_limit);
        set_bits(buf, l.sl, 0, 4, self.sl);
        set_flag(buf, l.sl, 4, self.subnet_local);
        set_bits(buf, l.ack_timeout, 0, 5, self.local_ack_timeout);
    }

    /// `InvalidField` for a flow label over 20 bits, a packet rate over 6, an SL over 4
    /// or an ACK timeout over 5 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("flow_label", self.flow_label.into(), 20)?;
        check_bits("packet_rate", self.packet_rate.into(), 6)?;
        check_bits("sl", self.sl.into(), 4)?;
        check_bits("local_ack_timeout", self.local_ack_timeout.into(), 5)
    }
}
