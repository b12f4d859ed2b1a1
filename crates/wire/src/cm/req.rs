//! REQ, the connection request (IBA Vol 1 §12.6.5).

use super::*;

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
