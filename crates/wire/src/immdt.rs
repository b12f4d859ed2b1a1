//! ImmDt: the 4 bytes of immediate data of the `*_WITH_IMM` opcodes (IBA Vol 1 §9.3.7).
//!
//! The value is opaque to the transport and copied verbatim; [`Repr::imm`] holds it read
//! big-endian (network order), so `imm.to_be_bytes()` are the wire bytes.
//!
//! ```text
//! bytes 0-3   Immediate data (32)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};

/// Length of the ImmDt header in bytes.
pub const LEN: usize = 4;

mod offset {
    pub const IMM: usize = 0;
}

/// A read/write view of an ImmDt header at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole ImmDt.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: ImmDt, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::ImmDt, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Immediate data, read big-endian.
    pub fn imm(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::IMM)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the immediate data (written big-endian).
    pub fn set_imm(&mut self, value: u32) {
        field::set_u32(self.buffer.as_mut(), offset::IMM, value);
    }
}

/// Parsed immediate data. Every bit pattern is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The immediate value, big-endian on the wire.
    pub imm: u32,
}

impl Repr {
    /// Parses an ImmDt view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr { imm: header.imm() })
    }

    /// Writes all 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_imm(self.imm);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/immdt.rs"]
mod tests;
