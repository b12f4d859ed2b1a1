//! MRA, message receipt acknowledgement (IBA Vol 1 §12.6.6).

use super::*;

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
