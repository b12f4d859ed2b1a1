//! SIDR_REQ / SIDR_REP, service ID resolution for UD (IBA Vol 1 §12.11).

use super::*;

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
