//! XRCETH: the 4-byte XRC Extended Transport Header that names the XRC SRQ at the
//! target; present on every XRC request, never on XRC responses (IBA Vol 1 Annex A14).
//!
//! ```text
//! byte  0     reserved
//! bytes 1-3   XRC SRQ number (24)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};
use crate::psn::PSN_MASK;

/// Length of the XRCETH in bytes.
pub const LEN: usize = 4;

mod offset {
    pub const RESERVED: usize = 0;
    pub const SRQN: usize = 1;
}

/// A read/write view of an XRCETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole XRCETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: XrcEth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::XrcEth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The reserved byte.
    pub fn reserved(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), offset::RESERVED)
    }

    /// XRC SRQ number (24 bits).
    pub fn srqn(&self) -> u32 {
        field::u24_at(self.buffer.as_ref(), offset::SRQN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the reserved byte.
    pub fn set_reserved(&mut self, value: u8) {
        field::set_u8(self.buffer.as_mut(), offset::RESERVED, value);
    }

    /// Sets the XRC SRQ number from the low 24 bits of `value`.
    pub fn set_srqn(&mut self, value: u32) {
        field::set_u24(self.buffer.as_mut(), offset::SRQN, value);
    }
}

/// A parsed XRCETH. `parse` ignores the reserved byte; `emit` writes it as 0 and writes
/// the low 24 bits of `srqn` ([`Repr::validate`] rejects larger values instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// XRC SRQ number (24 bits).
    pub srqn: u32,
}

impl Repr {
    /// Parses an XRCETH view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            srqn: header.srqn(),
        })
    }

    /// `InvalidField` if `srqn` does not fit 24 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.srqn > PSN_MASK {
            return Err(WireError::InvalidField {
                header: HeaderKind::XrcEth,
                field: "srqn",
                value: u64::from(self.srqn),
            });
        }
        Ok(())
    }

    /// Writes all 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_reserved(0);
        header.set_srqn(self.srqn);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/xrceth.rs"]
mod tests;
