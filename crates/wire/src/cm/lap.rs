//! LAP, load alternate path, and its reply APR (IBA Vol 1 §12.8.1-§12.8.2).

use super::*;

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
