//! CM: the bodies of Communication Management messages (IBA Vol 1 §12.6).
//!
//! A CM message fills the 232 bytes of class data after the 24-byte MAD common header
//! ([`crate::mad`]); offsets here are relative to the start of the CM message (MAD offset
//! − 24). Each message has a view (`Req<T>`, `Rep<T>`, …: typed accessors over a buffer,
//! `new_checked` validates the length once and then no accessor panics) and a repr
//! (`ReqRepr`, …: `parse`, `validate`, `emit`, `parse(emit(x)) == x`). Private data is a
//! fixed-size array: the CM carries no length for it, every message fills its 232 bytes.
//!
//! [`CmMad`] ties a MAD common header and any one message together for a whole 256-byte
//! MAD. [`rdma_cm`] holds what the RDMA CM puts on top: the IP-based service IDs and the
//! 36-byte address header at the start of REQ / SIDR_REQ private data.
//!
//! Bit positions follow the specification's tables, which number bits from the most
//! significant bit of a byte (the layout of IBA Vol 1 Tables 106-120):
//!
//! ```text
//! REQ      0 LocalCommID · 8 ServiceID · 16 LocalCAGUID · 28 LocalQ_Key
//!          32 LocalQPN(24) ResponderResources(8) · 36 LocalEECN(24) InitiatorDepth(8)
//!          40 RemoteEECN(24) · 43 RemoteCMRespTimeout(5) TransportService(2) E2EFC(1)
//!          44 StartingPSN(24) · 47 LocalCMRespTimeout(5) RetryCount(3) · 48 P_Key
//!          50 PathMTU(4) RDCExists(1) RNRRetry(3) · 51 MaxCMRetries(4) SRQ(1) ExtTransport(3)
//!          52 primary path (44 bytes) · 96 alternate path (44 bytes; 139 bit 5 SAP)
//!          140 private data (92)
//! path     +0 LocalLID · +2 RemoteLID · +4 LocalGID · +20 RemoteGID
//!          +36 FlowLabel(20) rsv(6) PacketRate(6) · +40 TrafficClass · +41 HopLimit
//!          +42 SL(4) SubnetLocal(1) · +43 LocalACKTimeout(5)
//! MRA      0 LocalCommID · 4 RemoteCommID · 8 MessageMRAed(2) · 9 ServiceTimeout(5) · 10 PD(222)
//! REJ      0 LocalCommID · 4 RemoteCommID · 8 MessageRejected(2) · 9 RejectInfoLength(7)
//!          10 Reason(16) · 12 ARI(72) · 84 PD(148)
//! REP      0 LocalCommID · 4 RemoteCommID · 8 LocalQ_Key · 12 LocalQPN(24) · 16 LocalEECN(24)
//!          20 StartingPSN(24) · 24 ResponderResources · 25 InitiatorDepth
//!          26 TargetACKDelay(5) FailoverAccepted(2) E2EFC(1) · 27 RNRRetry(3) SRQ(1)
//!          28 LocalCAGUID · 36 PD(196)
//! RTU/DREP 0 LocalCommID · 4 RemoteCommID · 8 PD(224)
//! DREQ     0 LocalCommID · 4 RemoteCommID · 8 RemoteQPN/EECN(24) · 12 PD(220)
//! LAP      0 LocalCommID · 4 RemoteCommID · 12 RemoteQPN/EECN(24) · 15 RemoteCMRespTimeout(5)
//!          20 AltLocalLID · 22 AltRemoteLID · 24 AltLocalGID · 40 AltRemoteGID
//!          56 AltFlowLabel(20) · 59 AltTrafficClass · 60 AltHopLimit · 61 AltPacketRate(6)
//!          62 AltSL(4) AltSubnetLocal(1) · 63 AltLocalACKTimeout(5) · 64 PD(168)
//! APR      0 LocalCommID · 4 RemoteCommID · 8 AdditionalInfoLength · 9 APStatus
//!          12 AdditionalInfo(72) · 84 PD(148)
//! SIDR_REQ 0 RequestID · 4 P_Key · 8 ServiceID · 16 PD(216)
//! SIDR_REP 0 RequestID · 4 Status · 5 AdditionalInfoLength · 8 QPN(24) · 12 ServiceID
//!          20 Q_Key · 24 AdditionalInfo(72) · 96 PD(136)
//! ```

pub mod class_port_info;
mod fields;
pub mod rdma_cm;

pub use class_port_info::{ClassPortInfoRepr, PortInfoTarget, CLASS_PORT_INFO_LEN};

use crate::error::{check_len, HeaderKind, WireError};
use crate::mad::{self, cm_attr};
use fields::*;

/// Length of every CM message body (the MAD class data): 232 bytes.
pub const LEN: usize = mad::DATA_LEN;

/// Private data lengths per message (IBA Vol 1 Tables 106-120).
pub mod private_data_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// LAP.
    pub const LAP: usize = 168;
    /// APR.
    pub const APR: usize = 148;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}
use private_data_len as pd;

/// Length of the REJ ARI, the APR and SIDR_REP additional information (72 bytes).
pub const INFO_LEN: usize = 72;

/// REJ reason codes (IBA Vol 1 Table 109).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No EE context available.
    pub const NO_EEC: u16 = 2;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the REQ's sender gave up waiting).
    pub const TIMEOUT: u16 = 4;
    /// The REQ asked for something not supported.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// No listener on the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: u16 = 11;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    /// Consumer defined (the application rejected).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: u16 = 29;
    /// Duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// Values of the 2-bit "message MRAed" / "message rejected" fields.
pub mod msg_kind {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message (LAP for an MRA).
    pub const OTHER: u8 = 2;
}

/// SIDR_REP status values (IBA Vol 1 Table 121).
pub mod sidr_status {
    /// The service ID was found; QPN and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// No service is listening on the service ID.
    pub const UNSUPPORTED: u8 = 1;
    /// The service rejected the request.
    pub const REJECT: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
    /// Redirect.
    pub const REDIRECT: u8 = 4;
    /// Unsupported class version.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// APR AP status values (IBA Vol 1 §12.8.2).
pub mod apr_status {
    /// Alternate path loaded.
    pub const SUCCESS: u8 = 0;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u8 = 1;
    /// Alternate paths are not supported.
    pub const UNSUPPORTED: u8 = 2;
    /// Rejected by the consumer.
    pub const REJECTED: u8 = 3;
}

fn invalid(field: &'static str, value: u64) -> WireError {
    WireError::InvalidField {
        header: HeaderKind::Cm,
        field,
        value,
    }
}

/// `InvalidField` if `value` does not fit `bits` bits.
fn check_bits(field: &'static str, value: u64, bits: u32) -> Result<(), WireError> {
    if bits < 64 && value >> bits != 0 {
        Err(invalid(field, value))
    } else {
        Ok(())
    }
}

/// Defines a view struct over a CM message with its constructor, length check and one
/// getter/setter pair per field: `getter / setter: Type => (read_fn, write_fn)(args..)`.
macro_rules! cm_view {
    (
        $(#[$doc:meta])*
        $name:ident {
            $( $(#[$fdoc:meta])* $get:ident / $set:ident : $ty:ty => ($rd:ident, $wr:ident)($($arg:expr),*) ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        ///
        /// After `new_checked` no accessor panics; over a short buffer made with
        /// `new_unchecked` missing bytes read as zero and writes to them are dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps `buffer` without checking its length.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps `buffer` after checking that it holds a whole message ([`LEN`] bytes).
            pub fn new_checked(buffer: T) -> Result<Self, WireError> {
                let v = Self::new_unchecked(buffer);
                v.check_len()?;
                Ok(v)
            }

            /// `Truncated { header: Cm, .. }` if the buffer is shorter than [`LEN`].
            pub fn check_len(&self) -> Result<(), WireError> {
                check_len(HeaderKind::Cm, self.buffer.as_ref(), 0, LEN)
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fdoc])*
                pub fn $get(&self) -> $ty {
                    $rd(self.buffer.as_ref(), $($arg),*)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// Zeroes the whole message (reserved bits included) before fields are set.
            pub fn clear(&mut self) {
                let buf = self.buffer.as_mut();
                let n = buf.len().min(LEN);
                if let Some(b) = buf.get_mut(..n) {
                    b.fill(0);
                }
            }

            $(
                #[doc = concat!("Sets `", stringify!($get), "` (excess high bits are dropped).")]
                pub fn $set(&mut self, value: $ty) {
                    $wr(self.buffer.as_mut(), $($arg,)* value)
                }
            )*
        }
    };
}

// ---------------------------------------------------------------------------------------
// Paths

/// Where the fields of a path record are (REQ primary, REQ alternate, LAP alternate).
#[derive(Clone, Copy)]
struct PathLayout {
    local_lid: usize,
    local_gid: usize,
    flow_label: usize,
    packet_rate: usize,
    traffic_class: usize,
    hop_limit: usize,
    sl: usize,
    ack_timeout: usize,
}

const REQ_PRIMARY: PathLayout = PathLayout {
    local_lid: 52,
    local_gid: 56,
    flow_label: 88,
    packet_rate: 91,
    traffic_class: 92,
    hop_limit: 93,
    sl: 94,
    ack_timeout: 95,
};
const REQ_ALTERNATE: PathLayout = PathLayout {
    local_lid: 96,
    local_gid: 100,
    flow_label: 132,
    packet_rate: 135,
    traffic_class: 136,
    hop_limit: 137,
    sl: 138,
    ack_timeout: 139,
};
const LAP_ALTERNATE: PathLayout = PathLayout {
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
    fn read(buf: &[u8], l: PathLayout) -> PathRepr {
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

    fn write(&self, buf: &mut [u8], l: PathLayout) {
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

// ---------------------------------------------------------------------------------------
// REQ

cm_view! {
    /// A view of a REQ (connection request, IBA Vol 1 §12.6.5, Table 106).
    Req {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Service ID.
        service_id / set_service_id: u64 => (u64_at, set_u64)(8),
        /// Local CA GUID.
        local_ca_guid / set_local_ca_guid: u64 => (u64_at, set_u64)(16),
        /// Local Q_Key (UD only).
        local_qkey / set_local_qkey: u32 => (u32_at, set_u32)(28),
        /// Local QPN (24 bits).
        local_qpn / set_local_qpn: u32 => (u24_at, set_u24)(32),
        /// Responder resources.
        responder_resources / set_responder_resources: u8 => (u8_at, set_u8)(35),
        /// Local EECN (24 bits).
        local_eecn / set_local_eecn: u32 => (u24_at, set_u24)(36),
        /// Initiator depth.
        initiator_depth / set_initiator_depth: u8 => (u8_at, set_u8)(39),
        /// Remote EECN (24 bits).
        remote_eecn / set_remote_eecn: u32 => (u24_at, set_u24)(40),
        /// Remote CM response timeout (5 bits).
        remote_cm_response_timeout / set_remote_cm_response_timeout: u8 => (bits, set_bits)(43, 0, 5),
        /// Transport service type (2 bits: 0 RC, 1 UC, 3 see extended).
        transport_service_type / set_transport_service_type: u8 => (bits, set_bits)(43, 5, 2),
        /// End-to-end flow control.
        e2e_flow_control / set_e2e_flow_control: bool => (flag, set_flag)(43, 7),
        /// Starting PSN (24 bits).
        starting_psn / set_starting_psn: u32 => (u24_at, set_u24)(44),
        /// Local CM response timeout (5 bits).
        local_cm_response_timeout / set_local_cm_response_timeout: u8 => (bits, set_bits)(47, 0, 5),
        /// Retry count (3 bits).
        retry_count / set_retry_count: u8 => (bits, set_bits)(47, 5, 3),
        /// Partition key.
        pkey / set_pkey: u16 => (u16_at, set_u16)(48),
        /// Path packet payload MTU (4 bits, IBA MTU enumeration).
        path_mtu / set_path_mtu: u8 => (bits, set_bits)(50, 0, 4),
        /// RDC exists.
        rdc_exists / set_rdc_exists: bool => (flag, set_flag)(50, 4),
        /// RNR retry count (3 bits).
        rnr_retry_count / set_rnr_retry_count: u8 => (bits, set_bits)(50, 5, 3),
        /// Max CM retries (4 bits).
        max_cm_retries / set_max_cm_retries: u8 => (bits, set_bits)(51, 0, 4),
        /// SRQ.
        srq / set_srq: bool => (flag, set_flag)(51, 4),
        /// Extended transport type (3 bits: 1 XRC).
        extended_transport_type / set_extended_transport_type: u8 => (bits, set_bits)(51, 5, 3),
        /// SAP supported (alternate path, byte 139 bit 5).
        sap_supported / set_sap_supported: bool => (flag, set_flag)(139, 5),
        /// Private data.
        private_data / set_private_data: [u8; pd::REQ] => (get, put)(140),
    }
}

impl<T: AsRef<[u8]>> Req<T> {
    /// The primary path.
    pub fn primary_path(&self) -> PathRepr {
        PathRepr::read(self.buffer.as_ref(), REQ_PRIMARY)
    }

    /// The alternate path.
    pub fn alternate_path(&self) -> PathRepr {
        PathRepr::read(self.buffer.as_ref(), REQ_ALTERNATE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Req<T> {
    /// Sets the primary path.
    pub fn set_primary_path(&mut self, path: &PathRepr) {
        path.write(self.buffer.as_mut(), REQ_PRIMARY);
    }

    /// Sets the alternate path (the SAP-supported bit in its last byte is left alone).
    pub fn set_alternate_path(&mut self, path: &PathRepr) {
        path.write(self.buffer.as_mut(), REQ_ALTERNATE);
    }
}

/// A parsed REQ. Reserved fields are ignored by `parse` and written as 0 by `emit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// Starting PSN (24 bits): the PSN of packets from the passive to the active side.
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: PathRepr,
    /// Alternate path (all zero when there is none).
    pub alternate_path: PathRepr,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: [u8; pd::REQ],
}

impl ReqRepr {
    /// Parses a REQ view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Req<&T>) -> Result<ReqRepr, WireError> {
        v.check_len()?;
        Ok(ReqRepr {
            local_comm_id: v.local_comm_id(),
            service_id: v.service_id(),
            local_ca_guid: v.local_ca_guid(),
            local_qkey: v.local_qkey(),
            local_qpn: v.local_qpn(),
            responder_resources: v.responder_resources(),
            local_eecn: v.local_eecn(),
            initiator_depth: v.initiator_depth(),
            remote_eecn: v.remote_eecn(),
            remote_cm_response_timeout: v.remote_cm_response_timeout(),
            transport_service_type: v.transport_service_type(),
            e2e_flow_control: v.e2e_flow_control(),
            starting_psn: v.starting_psn(),
            local_cm_response_timeout: v.local_cm_response_timeout(),
            retry_count: v.retry_count(),
            pkey: v.pkey(),
            path_mtu: v.path_mtu(),
            rdc_exists: v.rdc_exists(),
            rnr_retry_count: v.rnr_retry_count(),
            max_cm_retries: v.max_cm_retries(),
            srq: v.srq(),
            extended_transport_type: v.extended_transport_type(),
            primary_path: v.primary_path(),
            alternate_path: v.alternate_path(),
            sap_supported: v.sap_supported(),
            private_data: v.private_data(),
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("local_qpn", self.local_qpn.into(), 24)?;
        check_bits("local_eecn", self.local_eecn.into(), 24)?;
        check_bits("remote_eecn", self.remote_eecn.into(), 24)?;
        check_bits(
            "remote_cm_response_timeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        check_bits(
            "transport_service_type",
            self.transport_service_type.into(),
            2,
        )?;
        check_bits("starting_psn", self.starting_psn.into(), 24)?;
        check_bits(
            "local_cm_response_timeout",
            self.local_cm_response_timeout.into(),
            5,
        )?;
        check_bits("retry_count", self.retry_count.into(), 3)?;
        check_bits("path_mtu", self.path_mtu.into(), 4)?;
        check_bits("rnr_retry_count", self.rnr_retry_count.into(), 3)?;
        check_bits("max_cm_retries", self.max_cm_retries.into(), 4)?;
        check_bits(
            "extended_transport_type",
            self.extended_transport_type.into(),
            3,
        )?;
        self.primary_path.validate()?;
        self.alternate_path.validate()
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Req<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_service_id(self.service_id);
        v.set_local_ca_guid(self.local_ca_guid);
        v.set_local_qkey(self.local_qkey);
        v.set_local_qpn(self.local_qpn);
        v.set_responder_resources(self.responder_resources);
        v.set_local_eecn(self.local_eecn);
        v.set_initiator_depth(self.initiator_depth);
        v.set_remote_eecn(self.remote_eecn);
        v.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        v.set_transport_service_type(self.transport_service_type);
        v.set_e2e_flow_control(self.e2e_flow_control);
        v.set_starting_psn(self.starting_psn);
        v.set_local_cm_response_timeout(self.local_cm_response_timeout);
        v.set_retry_count(self.retry_count);
        v.set_pkey(self.pkey);
        v.set_path_mtu(self.path_mtu);
        v.set_rdc_exists(self.rdc_exists);
        v.set_rnr_retry_count(self.rnr_retry_count);
        v.set_max_cm_retries(self.max_cm_retries);
        v.set_srq(self.srq);
        v.set_extended_transport_type(self.extended_transport_type);
        v.set_primary_path(&self.primary_path);
        v.set_alternate_path(&self.alternate_path);
        v.set_sap_supported(self.sap_supported);
        v.set_private_data(self.private_data);
    }
}

// ---------------------------------------------------------------------------------------
// MRA

cm_view! {
    /// A view of an MRA (message receipt acknowledgement, IBA Vol 1 §12.6.6, Table 107).
    Mra {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Message MRAed (2 bits, see [`msg_kind`]).
        message_mraed / set_message_mraed: u8 => (bits, set_bits)(8, 0, 2),
        /// Service timeout (5 bits).
        service_timeout / set_service_timeout: u8 => (bits, set_bits)(9, 0, 5),
        /// Private data.
        private_data / set_private_data: [u8; pd::MRA] => (get, put)(10),
    }
}

/// A parsed MRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Message MRAed (2 bits).
    pub message_mraed: u8,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; pd::MRA],
}

impl MraRepr {
    /// Parses an MRA view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Mra<&T>) -> Result<MraRepr, WireError> {
        v.check_len()?;
        Ok(MraRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            message_mraed: v.message_mraed(),
            service_timeout: v.service_timeout(),
            private_data: v.private_data(),
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("message_mraed", self.message_mraed.into(), 2)?;
        check_bits("service_timeout", self.service_timeout.into(), 5)
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Mra<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_message_mraed(self.message_mraed);
        v.set_service_timeout(self.service_timeout);
        v.set_private_data(self.private_data);
    }
}

// ---------------------------------------------------------------------------------------
// REJ

cm_view! {
    /// A view of a REJ (reject, IBA Vol 1 §12.6.7, Table 108).
    Rej {
        /// Local communication ID (0 when rejecting a REQ before an ID exists).
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Message rejected (2 bits, see [`msg_kind`]).
        message_rejected / set_message_rejected: u8 => (bits, set_bits)(8, 0, 2),
        /// Reject info length (7 bits).
        reject_info_length / set_reject_info_length: u8 => (bits, set_bits)(9, 0, 7),
        /// Reason (see [`rej_reason`]).
        reason / set_reason: u16 => (u16_at, set_u16)(10),
        /// Additional reject information.
        ari / set_ari: [u8; INFO_LEN] => (get, put)(12),
        /// Private data.
        private_data / set_private_data: [u8; pd::REJ] => (get, put)(84),
    }
}

/// A parsed REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Message rejected (2 bits).
    pub message_rejected: u8,
    /// Reject info length (7 bits).
    pub reject_info_length: u8,
    /// Reason.
    pub reason: u16,
    /// Additional reject information.
    pub ari: [u8; INFO_LEN],
    /// Private data.
    pub private_data: [u8; pd::REJ],
}

impl RejRepr {
    /// Parses a REJ view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Rej<&T>) -> Result<RejRepr, WireError> {
        v.check_len()?;
        Ok(RejRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            message_rejected: v.message_rejected(),
            reject_info_length: v.reject_info_length(),
            reason: v.reason(),
            ari: v.ari(),
            private_data: v.private_data(),
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("message_rejected", self.message_rejected.into(), 2)?;
        check_bits("reject_info_length", self.reject_info_length.into(), 7)
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Rej<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_message_rejected(self.message_rejected);
        v.set_reject_info_length(self.reject_info_length);
        v.set_reason(self.reason);
        v.set_ari(self.ari);
        v.set_private_data(self.private_data);
    }
}

// ---------------------------------------------------------------------------------------
// REP

cm_view! {
    /// A view of a REP (reply to request, IBA Vol 1 §12.6.8, Table 110).
    Rep {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Local Q_Key.
        local_qkey / set_local_qkey: u32 => (u32_at, set_u32)(8),
        /// Local QPN (24 bits).
        local_qpn / set_local_qpn: u32 => (u24_at, set_u24)(12),
        /// Local EE context number (24 bits).
        local_eecn / set_local_eecn: u32 => (u24_at, set_u24)(16),
        /// Starting PSN (24 bits).
        starting_psn / set_starting_psn: u32 => (u24_at, set_u24)(20),
        /// Responder resources.
        responder_resources / set_responder_resources: u8 => (u8_at, set_u8)(24),
        /// Initiator depth.
        initiator_depth / set_initiator_depth: u8 => (u8_at, set_u8)(25),
        /// Target ACK delay (5 bits).
        target_ack_delay / set_target_ack_delay: u8 => (bits, set_bits)(26, 0, 5),
        /// Failover accepted (2 bits).
        failover_accepted / set_failover_accepted: u8 => (bits, set_bits)(26, 5, 2),
        /// End-to-end flow control.
        e2e_flow_control / set_e2e_flow_control: bool => (flag, set_flag)(26, 7),
        /// RNR retry count (3 bits).
        rnr_retry_count / set_rnr_retry_count: u8 => (bits, set_bits)(27, 0, 3),
        /// SRQ.
        srq / set_srq: bool => (flag, set_flag)(27, 3),
        /// Local CA GUID.
        local_ca_guid / set_local_ca_guid: u64 => (u64_at, set_u64)(28),
        /// Private data.
        private_data / set_private_data: [u8; pd::REP] => (get, put)(36),
    }
}

/// A parsed REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits): the PSN of packets from the active to the passive side.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; pd::REP],
}

impl RepRepr {
    /// Parses a REP view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Rep<&T>) -> Result<RepRepr, WireError> {
        v.check_len()?;
        Ok(RepRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            local_qkey: v.local_qkey(),
            local_qpn: v.local_qpn(),
            local_eecn: v.local_eecn(),
            starting_psn: v.starting_psn(),
            responder_resources: v.responder_resources(),
            initiator_depth: v.initiator_depth(),
            target_ack_delay: v.target_ack_delay(),
            failover_accepted: v.failover_accepted(),
            e2e_flow_control: v.e2e_flow_control(),
            rnr_retry_count: v.rnr_retry_count(),
            srq: v.srq(),
            local_ca_guid: v.local_ca_guid(),
            private_data: v.private_data(),
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("local_qpn", self.local_qpn.into(), 24)?;
        check_bits("local_eecn", self.local_eecn.into(), 24)?;
        check_bits("starting_psn", self.starting_psn.into(), 24)?;
        check_bits("target_ack_delay", self.target_ack_delay.into(), 5)?;
        check_bits("failover_accepted", self.failover_accepted.into(), 2)?;
        check_bits("rnr_retry_count", self.rnr_retry_count.into(), 3)
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Rep<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_local_qkey(self.local_qkey);
        v.set_local_qpn(self.local_qpn);
        v.set_local_eecn(self.local_eecn);
        v.set_starting_psn(self.starting_psn);
        v.set_responder_resources(self.responder_resources);
        v.set_initiator_depth(self.initiator_depth);
        v.set_target_ack_delay(self.target_ack_delay);
        v.set_failover_accepted(self.failover_accepted);
        v.set_e2e_flow_control(self.e2e_flow_control);
        v.set_rnr_retry_count(self.rnr_retry_count);
        v.set_srq(self.srq);
        v.set_local_ca_guid(self.local_ca_guid);
        v.set_private_data(self.private_data);
    }
}

// ---------------------------------------------------------------------------------------
// RTU, DREQ, DREP

cm_view! {
    /// A view of an RTU (ready to use, IBA Vol 1 §12.6.9, Table 111).
    Rtu {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Private data.
        private_data / set_private_data: [u8; pd::RTU] => (get, put)(8),
    }
}

cm_view! {
    /// A view of a DREQ (disconnect request, IBA Vol 1 §12.6.10, Table 112).
    Dreq {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Remote QPN/EECN (24 bits).
        remote_qpn / set_remote_qpn: u32 => (u24_at, set_u24)(8),
        /// Private data.
        private_data / set_private_data: [u8; pd::DREQ] => (get, put)(12),
    }
}

cm_view! {
    /// A view of a DREP (disconnect reply, IBA Vol 1 §12.6.11, Table 113).
    Drep {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Private data.
        private_data / set_private_data: [u8; pd::DREP] => (get, put)(8),
    }
}

/// A parsed RTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtuRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; pd::RTU],
}

impl RtuRepr {
    /// Parses an RTU view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Rtu<&T>) -> Result<RtuRepr, WireError> {
        v.check_len()?;
        Ok(RtuRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            private_data: v.private_data(),
        })
    }

    /// Every value fits: always `Ok`.
    pub fn validate(&self) -> Result<(), WireError> {
        Ok(())
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Rtu<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_private_data(self.private_data);
    }
}

/// A parsed DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits): the receiver's QPN.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; pd::DREQ],
}

impl DreqRepr {
    /// Parses a DREQ view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Dreq<&T>) -> Result<DreqRepr, WireError> {
        v.check_len()?;
        Ok(DreqRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            remote_qpn: v.remote_qpn(),
            private_data: v.private_data(),
        })
    }

    /// `InvalidField` if `remote_qpn` does not fit 24 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("remote_qpn", self.remote_qpn.into(), 24)
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Dreq<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_remote_qpn(self.remote_qpn);
        v.set_private_data(self.private_data);
    }
}

/// A parsed DREP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DrepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; pd::DREP],
}

impl DrepRepr {
    /// Parses a DREP view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Drep<&T>) -> Result<DrepRepr, WireError> {
        v.check_len()?;
        Ok(DrepRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            private_data: v.private_data(),
        })
    }

    /// Every value fits: always `Ok`.
    pub fn validate(&self) -> Result<(), WireError> {
        Ok(())
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Drep<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_private_data(self.private_data);
    }
}

// ---------------------------------------------------------------------------------------
// LAP, APR

cm_view! {
    /// A view of a LAP (load alternate path, IBA Vol 1 §12.8.1, Table 115).
    Lap {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Remote QPN/EECN (24 bits).
        remote_qpn / set_remote_qpn: u32 => (u24_at, set_u24)(12),
        /// Remote CM response timeout (5 bits).
        remote_cm_response_timeout / set_remote_cm_response_timeout: u8 => (bits, set_bits)(15, 0, 5),
        /// Private data.
        private_data / set_private_data: [u8; pd::LAP] => (get, put)(64),
    }
}

impl<T: AsRef<[u8]>> Lap<T> {
    /// The alternate path to load.
    pub fn alternate_path(&self) -> PathRepr {
        PathRepr::read(self.buffer.as_ref(), LAP_ALTERNATE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Lap<T> {
    /// Sets the alternate path.
    pub fn set_alternate_path(&mut self, path: &PathRepr) {
        path.write(self.buffer.as_mut(), LAP_ALTERNATE);
    }
}

/// A parsed LAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LapRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits).
    pub remote_qpn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// The alternate path.
    pub alternate_path: PathRepr,
    /// Private data.
    pub private_data: [u8; pd::LAP],
}

impl LapRepr {
    /// Parses a LAP view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Lap<&T>) -> Result<LapRepr, WireError> {
        v.check_len()?;
        Ok(LapRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            remote_qpn: v.remote_qpn(),
            remote_cm_response_timeout: v.remote_cm_response_timeout(),
            alternate_path: v.alternate_path(),
            private_data: v.private_data(),
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("remote_qpn", self.remote_qpn.into(), 24)?;
        check_bits(
            "remote_cm_response_timeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        self.alternate_path.validate()
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Lap<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_remote_qpn(self.remote_qpn);
        v.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        v.set_alternate_path(&self.alternate_path);
        v.set_private_data(self.private_data);
    }
}

cm_view! {
    /// A view of an APR (alternate path response, IBA Vol 1 §12.8.2, Table 116).
    Apr {
        /// Local communication ID.
        local_comm_id / set_local_comm_id: u32 => (u32_at, set_u32)(0),
        /// Remote communication ID.
        remote_comm_id / set_remote_comm_id: u32 => (u32_at, set_u32)(4),
        /// Additional information length.
        additional_info_length / set_additional_info_length: u8 => (u8_at, set_u8)(8),
        /// AP status (see [`apr_status`]).
        status / set_status: u8 => (u8_at, set_u8)(9),
        /// Additional information.
        additional_info / set_additional_info: [u8; INFO_LEN] => (get, put)(12),
        /// Private data.
        private_data / set_private_data: [u8; pd::APR] => (get, put)(84),
    }
}

/// A parsed APR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AprRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Additional information length.
    pub additional_info_length: u8,
    /// AP status.
    pub status: u8,
    /// Additional information.
    pub additional_info: [u8; INFO_LEN],
    /// Private data.
    pub private_data: [u8; pd::APR],
}

impl AprRepr {
    /// Parses an APR view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &Apr<&T>) -> Result<AprRepr, WireError> {
        v.check_len()?;
        Ok(AprRepr {
            local_comm_id: v.local_comm_id(),
            remote_comm_id: v.remote_comm_id(),
            additional_info_length: v.additional_info_length(),
            status: v.status(),
            additional_info: v.additional_info(),
            private_data: v.private_data(),
        })
    }

    /// Every value fits: always `Ok`.
    pub fn validate(&self) -> Result<(), WireError> {
        Ok(())
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut Apr<&mut T>) {
        v.clear();
        v.set_local_comm_id(self.local_comm_id);
        v.set_remote_comm_id(self.remote_comm_id);
        v.set_additional_info_length(self.additional_info_length);
        v.set_status(self.status);
        v.set_additional_info(self.additional_info);
        v.set_private_data(self.private_data);
    }
}

// ---------------------------------------------------------------------------------------
// SIDR

cm_view! {
    /// A view of a SIDR_REQ (service ID resolution request, IBA Vol 1 §12.11.1, Table 119).
    SidrReq {
        /// Request ID.
        request_id / set_request_id: u32 => (u32_at, set_u32)(0),
        /// Partition key.
        pkey / set_pkey: u16 => (u16_at, set_u16)(4),
        /// Service ID.
        service_id / set_service_id: u64 => (u64_at, set_u64)(8),
        /// Private data.
        private_data / set_private_data: [u8; pd::SIDR_REQ] => (get, put)(16),
    }
}

cm_view! {
    /// A view of a SIDR_REP (service ID resolution response, IBA Vol 1 §12.11.2, Table 120).
    SidrRep {
        /// Request ID (the SIDR_REQ's).
        request_id / set_request_id: u32 => (u32_at, set_u32)(0),
        /// Status (see [`sidr_status`]).
        status / set_status: u8 => (u8_at, set_u8)(4),
        /// Additional information length.
        additional_info_length / set_additional_info_length: u8 => (u8_at, set_u8)(5),
        /// QPN (24 bits).
        qpn / set_qpn: u32 => (u24_at, set_u24)(8),
        /// Service ID.
        service_id / set_service_id: u64 => (u64_at, set_u64)(12),
        /// Q_Key.
        qkey / set_qkey: u32 => (u32_at, set_u32)(20),
        /// Additional information.
        additional_info / set_additional_info: [u8; INFO_LEN] => (get, put)(24),
        /// Private data.
        private_data / set_private_data: [u8; pd::SIDR_REP] => (get, put)(96),
    }
}

/// A parsed SIDR_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; pd::SIDR_REQ],
}

impl SidrReqRepr {
    /// Parses a SIDR_REQ view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &SidrReq<&T>) -> Result<SidrReqRepr, WireError> {
        v.check_len()?;
        Ok(SidrReqRepr {
            request_id: v.request_id(),
            pkey: v.pkey(),
            service_id: v.service_id(),
            private_data: v.private_data(),
        })
    }

    /// Every value fits: always `Ok`.
    pub fn validate(&self) -> Result<(), WireError> {
        Ok(())
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut SidrReq<&mut T>) {
        v.clear();
        v.set_request_id(self.request_id);
        v.set_pkey(self.pkey);
        v.set_service_id(self.service_id);
        v.set_private_data(self.private_data);
    }
}

/// A parsed SIDR_REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: u8,
    /// Additional information length.
    pub additional_info_length: u8,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional information.
    pub additional_info: [u8; INFO_LEN],
    /// Private data.
    pub private_data: [u8; pd::SIDR_REP],
}

impl SidrRepRepr {
    /// Parses a SIDR_REP view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(v: &SidrRep<&T>) -> Result<SidrRepRepr, WireError> {
        v.check_len()?;
        Ok(SidrRepRepr {
            request_id: v.request_id(),
            status: v.status(),
            additional_info_length: v.additional_info_length(),
            qpn: v.qpn(),
            service_id: v.service_id(),
            qkey: v.qkey(),
            additional_info: v.additional_info(),
            private_data: v.private_data(),
        })
    }

    /// `InvalidField` if `qpn` does not fit 24 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        check_bits("qpn", self.qpn.into(), 24)
    }

    /// Writes all [`LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, v: &mut SidrRep<&mut T>) {
        v.clear();
        v.set_request_id(self.request_id);
        v.set_status(self.status);
        v.set_additional_info_length(self.additional_info_length);
        v.set_qpn(self.qpn);
        v.set_service_id(self.service_id);
        v.set_qkey(self.qkey);
        v.set_additional_info(self.additional_info);
        v.set_private_data(self.private_data);
    }
}

// ---------------------------------------------------------------------------------------
// Whole MADs

/// Any CM message body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// REQ.
    Req(ReqRepr),
    /// MRA.
    Mra(MraRepr),
    /// REJ.
    Rej(RejRepr),
    /// REP.
    Rep(RepRepr),
    /// RTU.
    Rtu(RtuRepr),
    /// DREQ.
    Dreq(DreqRepr),
    /// DREP.
    Drep(DrepRepr),
    /// LAP.
    Lap(LapRepr),
    /// APR.
    Apr(AprRepr),
    /// SIDR_REQ.
    SidrReq(SidrReqRepr),
    /// SIDR_REP.
    SidrRep(SidrRepRepr),
    /// ClassPortInfo (IBA 13.4.8.1), read with Get and answered with GetResp.
    ClassPortInfo(ClassPortInfoRepr),
    /// An attribute this module has no layout for (vendor attributes): kept as raw class
    /// data so that it re-emits unchanged.
    Other {
        /// The MAD AttributeID.
        attribute_id: u16,
        /// The 232 bytes of class data.
        data: [u8; LEN],
    },
}

impl CmMessage {
    /// The MAD AttributeID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => cm_attr::REQ,
            CmMessage::Mra(_) => cm_attr::MRA,
            CmMessage::Rej(_) => cm_attr::REJ,
            CmMessage::Rep(_) => cm_attr::REP,
            CmMessage::Rtu(_) => cm_attr::RTU,
            CmMessage::Dreq(_) => cm_attr::DREQ,
            CmMessage::Drep(_) => cm_attr::DREP,
            CmMessage::Lap(_) => cm_attr::LAP,
            CmMessage::Apr(_) => cm_attr::APR,
            CmMessage::SidrReq(_) => cm_attr::SIDR_REQ,
            CmMessage::SidrRep(_) => cm_attr::SIDR_REP,
            CmMessage::ClassPortInfo(_) => cm_attr::CLASS_PORT_INFO,
            CmMessage::Other { attribute_id, .. } => *attribute_id,
        }
    }

    /// Parses the 232-byte class data `data` of a MAD with AttributeID `attribute_id`.
    pub fn parse(attribute_id: u16, data: &[u8]) -> Result<CmMessage, WireError> {
        check_len(HeaderKind::Cm, data, mad::LEN, LEN)?;
        Ok(match attribute_id {
            cm_attr::REQ => CmMessage::Req(ReqRepr::parse(&Req::new_unchecked(data))?),
            cm_attr::MRA => CmMessage::Mra(MraRepr::parse(&Mra::new_unchecked(data))?),
            cm_attr::REJ => CmMessage::Rej(RejRepr::parse(&Rej::new_unchecked(data))?),
            cm_attr::REP => CmMessage::Rep(RepRepr::parse(&Rep::new_unchecked(data))?),
            cm_attr::RTU => CmMessage::Rtu(RtuRepr::parse(&Rtu::new_unchecked(data))?),
            cm_attr::DREQ => CmMessage::Dreq(DreqRepr::parse(&Dreq::new_unchecked(data))?),
            cm_attr::DREP => CmMessage::Drep(DrepRepr::parse(&Drep::new_unchecked(data))?),
            cm_attr::LAP => CmMessage::Lap(LapRepr::parse(&Lap::new_unchecked(data))?),
            cm_attr::APR => CmMessage::Apr(AprRepr::parse(&Apr::new_unchecked(data))?),
            cm_attr::SIDR_REQ => {
                CmMessage::SidrReq(SidrReqRepr::parse(&SidrReq::new_unchecked(data))?)
            }
            cm_attr::SIDR_REP => {
                CmMessage::SidrRep(SidrRepRepr::parse(&SidrRep::new_unchecked(data))?)
            }
            cm_attr::CLASS_PORT_INFO => CmMessage::ClassPortInfo(ClassPortInfoRepr::parse(data)?),
            _ => CmMessage::Other {
                attribute_id,
                data: get(data, 0),
            },
        })
    }

    /// `InvalidField` for a value wider than its field.
    pub fn validate(&self) -> Result<(), WireError> {
        match self {
            CmMessage::Req(r) => r.validate(),
            CmMessage::Mra(r) => r.validate(),
            CmMessage::Rej(r) => r.validate(),
            CmMessage::Rep(r) => r.validate(),
            CmMessage::Rtu(r) => r.validate(),
            CmMessage::Dreq(r) => r.validate(),
            CmMessage::Drep(r) => r.validate(),
            CmMessage::Lap(r) => r.validate(),
            CmMessage::Apr(r) => r.validate(),
            CmMessage::SidrReq(r) => r.validate(),
            CmMessage::SidrRep(r) => r.validate(),
            CmMessage::ClassPortInfo(r) => r.validate(),
            CmMessage::Other { .. } => Ok(()),
        }
    }

    /// Writes the 232 bytes of class data into `data` (`BufferTooSmall` if shorter).
    pub fn emit(&self, data: &mut [u8]) -> Result<(), WireError> {
        if data.len() < LEN {
            return Err(WireError::BufferTooSmall {
                needed: LEN,
                available: data.len(),
            });
        }
        match self {
            CmMessage::Req(r) => r.emit(&mut Req::new_unchecked(data)),
            CmMessage::Mra(r) => r.emit(&mut Mra::new_unchecked(data)),
            CmMessage::Rej(r) => r.emit(&mut Rej::new_unchecked(data)),
            CmMessage::Rep(r) => r.emit(&mut Rep::new_unchecked(data)),
            CmMessage::Rtu(r) => r.emit(&mut Rtu::new_unchecked(data)),
            CmMessage::Dreq(r) => r.emit(&mut Dreq::new_unchecked(data)),
            CmMessage::Drep(r) => r.emit(&mut Drep::new_unchecked(data)),
            CmMessage::Lap(r) => r.emit(&mut Lap::new_unchecked(data)),
            CmMessage::Apr(r) => r.emit(&mut Apr::new_unchecked(data)),
            CmMessage::SidrReq(r) => r.emit(&mut SidrReq::new_unchecked(data)),
            CmMessage::SidrRep(r) => r.emit(&mut SidrRep::new_unchecked(data)),
            CmMessage::ClassPortInfo(r) => r.emit(data.get_mut(..LEN).unwrap_or_default()),
            CmMessage::Other { data: raw, .. } => put(data, 0, *raw),
        }
        Ok(())
    }
}

/// A whole 256-byte CM MAD: the common header and the message it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The MAD common header (its `attribute_id` agrees with `message`).
    pub header: mad::Repr,
    /// The CM message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM MAD with the standard header (BaseVersion 1, class 0x07, ClassVersion 2,
    /// method Send, status 0) for `message` with transaction ID `tid`.
    pub fn new(transaction_id: u64, message: CmMessage) -> CmMad {
        CmMad {
            header: mad::Repr {
                base_version: mad::BASE_VERSION,
                mgmt_class: mad::MGMT_CLASS_CM,
                class_version: mad::CM_CLASS_VERSION,
                response: false,
                method: mad::METHOD_SEND,
                status: 0,
                class_specific: 0,
                transaction_id,
                attribute_id: message.attribute_id(),
                attribute_modifier: 0,
            },
            message,
        }
    }

    /// Parses a whole MAD. `BadLength` unless it is [`mad::MAD_LEN`] bytes;
    /// `InvalidField` if the management class is not CM (0x07).
    pub fn parse(bytes: &[u8]) -> Result<CmMad, WireError> {
        if bytes.len() != mad::MAD_LEN {
            return Err(WireError::BadLength {
                header: HeaderKind::Mad,
                field: "MAD length",
                value: bytes.len(),
                expected: mad::MAD_LEN,
            });
        }
        let h = mad::Header::new_checked(bytes)?;
        let header = mad::Repr::parse(&h)?;
        if header.mgmt_class != mad::MGMT_CLASS_CM {
            return Err(WireError::InvalidField {
                header: HeaderKind::Mad,
                field: "mgmt_class",
                value: header.mgmt_class.into(),
            });
        }
        let message = CmMessage::parse(header.attribute_id, h.data())?;
        Ok(CmMad { header, message })
    }

    /// `InvalidField` if the header or the message is invalid, or the header's
    /// AttributeID is not the message's.
    pub fn validate(&self) -> Result<(), WireError> {
        self.header.validate()?;
        if self.header.attribute_id != self.message.attribute_id() {
            return Err(WireError::InvalidField {
                header: HeaderKind::Mad,
                field: "attribute_id",
                value: self.header.attribute_id.into(),
            });
        }
        self.message.validate()
    }

    /// The 256 bytes of the MAD.
    pub fn to_bytes(&self) -> [u8; mad::MAD_LEN] {
        let mut out = [0u8; mad::MAD_LEN];
        self.emit(&mut out);
        out
    }

    /// Writes the MAD into `out`.
    pub fn emit(&self, out: &mut [u8; mad::MAD_LEN]) {
        self.header
            .emit(&mut mad::Header::new_unchecked(&mut out[..]));
        if let Some(data) = out.get_mut(mad::LEN..) {
            // Cannot fail: `data` is exactly LEN bytes.
            let _ = self.message.emit(data);
        }
    }
}

#[cfg(test)]
#[path = "../tests/cm.rs"]
mod tests;
