//! MAD: the 24-byte common header of a management datagram (IBA Vol 1 §13.4).
//!
//! On RoCEv2 a CM message is one 256-byte MAD carried as the payload of a UD SEND_ONLY to
//! QP1 with Q_Key 0x80010000 (IBA ch. 13). This module covers the common header; the CM
//! message layouts after it belong to the CM code.
//!
//! ```text
//! byte  0      BaseVersion
//! byte  1      MgmtClass
//! byte  2      ClassVersion
//! byte  3      R (bit 7, response) · Method (6:0)
//! bytes 4-5    Status
//! bytes 6-7    ClassSpecific
//! bytes 8-15   TransactionID
//! bytes 16-17  AttributeID
//! bytes 18-19  reserved
//! bytes 20-23  AttributeModifier
//! bytes 24-255 class data (the CM message)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};

/// Length of the common MAD header in bytes.
pub const LEN: usize = 24;
/// Length of a whole MAD in bytes.
pub const MAD_LEN: usize = 256;
/// Bytes of class data after the common header (`MAD_LEN - LEN`).
pub const DATA_LEN: usize = MAD_LEN - LEN;

/// BaseVersion of every MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of Communication Management.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// ClassVersion of CM MADs.
pub const CM_CLASS_VERSION: u8 = 2;
/// Method "Send", used by every CM message.
pub const METHOD_SEND: u8 = 0x03;
/// Method Get (IBA 13.4.5): read an attribute; the answer is GetResp, the same method
/// with the response bit set.
pub const METHOD_GET: u8 = 0x01;
/// The general services QP number (GSI, QP1).
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of the GSI QP.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// CM attribute IDs (IBA Vol 1 ch. 12).
pub mod cm_attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a request.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001A;

    /// The name of a CM attribute ID ("REQ", …), `None` if unknown.
    pub const fn name(id: u16) -> Option<&'static str> {
        match id {
            CLASS_PORT_INFO => Some("ClassPortInfo"),
            REQ => Some("REQ"),
            MRA => Some("MRA"),
            REJ => Some("REJ"),
            REP => Some("REP"),
            RTU => Some("RTU"),
            DREQ => Some("DREQ"),
            DREP => Some("DREP"),
            SIDR_REQ => Some("SIDR_REQ"),
            SIDR_REP => Some("SIDR_REP"),
            LAP => Some("LAP"),
            APR => Some("APR"),
            _ => None,
        }
    }
}

mod offset {
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const CLASS_SPECIFIC: usize = 6;
    pub const TID: usize = 8;
    pub const ATTR_ID: usize = 16;
    pub const RESERVED: usize = 18;
    pub const ATTR_MOD: usize = 20;
}

const RESPONSE: u8 = 0x80;
const METHOD_MASK: u8 = 0x7f;

/// A read/write view of a MAD (common header plus whatever class data follows).
///
/// After [`Header::new_checked`] no accessor panics; over a short buffer made with
/// [`Header::new_unchecked`] missing bytes read as zero and writes to them are dropped.
/// `Truncated` offsets are relative to the view's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wraps `buffer` after checking that it holds a whole common header (24 bytes; the
    /// caller checks for a whole [`MAD_LEN`] MAD where it needs one).
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: Mad, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::Mad, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn buf(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// BaseVersion.
    pub fn base_version(&self) -> u8 {
        field::u8_at(self.buf(), offset::BASE_VERSION)
    }

    /// MgmtClass.
    pub fn mgmt_class(&self) -> u8 {
        field::u8_at(self.buf(), offset::MGMT_CLASS)
    }

    /// ClassVersion.
    pub fn class_version(&self) -> u8 {
        field::u8_at(self.buf(), offset::CLASS_VERSION)
    }

    /// R bit: the MAD is a response.
    pub fn response(&self) -> bool {
        field::u8_at(self.buf(), offset::METHOD) & RESPONSE != 0
    }

    /// Method (7 bits).
    pub fn method(&self) -> u8 {
        field::u8_at(self.buf(), offset::METHOD) & METHOD_MASK
    }

    /// Status.
    pub fn status(&self) -> u16 {
        field::u16_at(self.buf(), offset::STATUS)
    }

    /// ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        field::u16_at(self.buf(), offset::CLASS_SPECIFIC)
    }

    /// TransactionID.
    pub fn transaction_id(&self) -> u64 {
        field::u64_at(self.buf(), offset::TID)
    }

    /// AttributeID.
    pub fn attribute_id(&self) -> u16 {
        field::u16_at(self.buf(), offset::ATTR_ID)
    }

    /// The reserved 16 bits after the AttributeID.
    pub fn reserved(&self) -> u16 {
        field::u16_at(self.buf(), offset::RESERVED)
    }

    /// AttributeModifier.
    pub fn attribute_modifier(&self) -> u32 {
        field::u32_at(self.buf(), offset::ATTR_MOD)
    }

    /// The class data after the common header (empty if there is none).
    pub fn data(&self) -> &[u8] {
        self.buf().get(LEN..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn buf_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets BaseVersion.
    pub fn set_base_version(&mut self, value: u8) {
        field::set_u8(self.buf_mut(), offset::BASE_VERSION, value);
    }

    /// Sets MgmtClass.
    pub fn set_mgmt_class(&mut self, value: u8) {
        field::set_u8(self.buf_mut(), offset::MGMT_CLASS, value);
    }

    /// Sets ClassVersion.
    pub fn set_class_version(&mut self, value: u8) {
        field::set_u8(self.buf_mut(), offset::CLASS_VERSION, value);
    }

    /// Sets the R bit and the method (low 7 bits of `method`) together.
    pub fn set_response_method(&mut self, response: bool, method: u8) {
        let r = if response { RESPONSE } else { 0 };
        field::set_u8(self.buf_mut(), offset::METHOD, r | (method & METHOD_MASK));
    }

    /// Sets Status.
    pub fn set_status(&mut self, value: u16) {
        field::set_u16(self.buf_mut(), offset::STATUS, value);
    }

    /// Sets ClassSpecific.
    pub fn set_class_specific(&mut self, value: u16) {
        field::set_u16(self.buf_mut(), offset::CLASS_SPECIFIC, value);
    }

    /// Sets TransactionID.
    pub fn set_transaction_id(&mut self, value: u64) {
        field::set_u64(self.buf_mut(), offset::TID, value);
    }

    /// Sets AttributeID.
    pub fn set_attribute_id(&mut self, value: u16) {
        field::set_u16(self.buf_mut(), offset::ATTR_ID, value);
    }

    /// Sets the reserved 16 bits.
    pub fn set_reserved(&mut self, value: u16) {
        field::set_u16(self.buf_mut(), offset::RESERVED, value);
    }

    /// Sets AttributeModifier.
    pub fn set_attribute_modifier(&mut self, value: u32) {
        field::set_u32(self.buf_mut(), offset::ATTR_MOD, value);
    }

    /// The class data after the common header, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.buf_mut().get_mut(LEN..).unwrap_or(&mut [])
    }
}

/// A parsed common MAD header. `parse` ignores the reserved bytes 18-19; `emit` writes
/// them as 0 and writes the low 7 bits of `method` ([`Repr::validate`] rejects wider
/// values instead). Versions and class are not checked here: that is the MAD consumer's
/// decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// MgmtClass ([`MGMT_CLASS_CM`] for CM).
    pub mgmt_class: u8,
    /// ClassVersion ([`CM_CLASS_VERSION`] for CM).
    pub class_version: u8,
    /// R bit: the MAD is a response.
    pub response: bool,
    /// Method (7 bits; [`METHOD_SEND`] for CM).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub transaction_id: u64,
    /// AttributeID (see [`cm_attr`]).
    pub attribute_id: u16,
    /// AttributeModifier.
    pub attribute_modifier: u32,
}

impl Repr {
    /// Parses the common header of a MAD view (`Truncated` if shorter than 24 bytes).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            base_version: header.base_version(),
            mgmt_class: header.mgmt_class(),
            class_version: header.class_version(),
            response: header.response(),
            method: header.method(),
            status: header.status(),
            class_specific: header.class_specific(),
            transaction_id: header.transaction_id(),
            attribute_id: header.attribute_id(),
            attribute_modifier: header.attribute_modifier(),
        })
    }

    /// `InvalidField` if `method` does not fit 7 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.method > METHOD_MASK {
            return Err(WireError::InvalidField {
                header: HeaderKind::Mad,
                field: "method",
                value: u64::from(self.method),
            });
        }
        Ok(())
    }

    /// Writes the 24 header bytes (the class data is left alone).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_base_version(self.base_version);
        header.set_mgmt_class(self.mgmt_class);
        header.set_class_version(self.class_version);
        header.set_response_method(self.response, self.method);
        header.set_status(self.status);
        header.set_class_specific(self.class_specific);
        header.set_transaction_id(self.transaction_id);
        header.set_attribute_id(self.attribute_id);
        header.set_reserved(0);
        header.set_attribute_modifier(self.attribute_modifier);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/mad.rs"]
mod tests;
