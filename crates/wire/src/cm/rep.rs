//! REP, the connection reply (IBA Vol 1 §12.6.8).

use super::*;

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
