//! DETH: the 8-byte Datagram Extended Transport Header of UD packets (IBA Vol 1 §9.3.2).
//!
//! ```text
//! bytes 0-3   Q_Key (32)
//! byte  4     reserved
//! bytes 5-7   SrcQP (24)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};
use crate::psn::PSN_MASK;

/// Length of the DETH in bytes.
pub const LEN: usize = 8;

mod offset {
    pub const QKEY: usize = 0;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: usize = 5;
}

/// A read/write view of a DETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole DETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: Deth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::Deth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Q_Key.
    pub fn qkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::QKEY)
    }

    /// The reserved byte.
    pub fn reserved(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), offset::RESERVED)
    }

    /// SrcQP (24 bits).
    pub fn src_qp(&self) -> u32 {
        field::u24_at(self.buffer.as_ref(), offset::SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, value: u32) {
        field::set_u32(self.buffer.as_mut(), offset::QKEY, value);
    }

    /// Sets the reserved byte.
    pub fn set_reserved(&mut self, value: u8) {
        field::set_u8(self.buffer.as_mut(), offset::RESERVED, value);
    }

    /// Sets SrcQP from the low 24 bits of `value`.
    pub fn set_src_qp(&mut self, value: u32) {
        field::set_u24(self.buffer.as_mut(), offset::SRC_QP, value);
    }
}

/// A parsed DETH. `parse` ignores the reserved byte; `emit` writes it as 0 and writes the
/// low 24 bits of `src_qp` ([`Repr::validate`] rejects larger values instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qp: u32,
}

impl Repr {
    /// Parses a DETH view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            qkey: header.qkey(),
            src_qp: header.src_qp(),
        })
    }

    /// `InvalidField` if `src_qp` does not fit 24 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.src_qp > PSN_MASK {
            return Err(WireError::InvalidField {
                header: HeaderKind::Deth,
                field: "src_qp",
                value: u64::from(self.src_qp),
            });
        }
        Ok(())
    }

    /// Writes all 8 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_qkey(self.qkey);
        header.set_reserved(0);
        header.set_src_qp(self.src_qp);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/deth.rs"]
mod tests;
