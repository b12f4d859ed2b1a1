//! REJ, reject (IBA Vol 1 §12.6.7).

use super::*;

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
