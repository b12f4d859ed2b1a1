//! RTU, ready to use, and the disconnect pair DREQ / DREP (IBA Vol 1 §12.6.9-§12.6.11).

use super::*;

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
