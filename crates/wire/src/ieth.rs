//! IETH: the 4-byte Invalidate Extended Transport Header of the `SEND_*_WITH_INVALIDATE`
//! opcodes, naming the R_Key the responder invalidates (IBA Vol 1 §9.3.8).
//!
//! ```text
//! bytes 0-3   R_Key to invalidate (32)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};

/// Length of the IETH in bytes.
pub const LEN: usize = 4;

mod offset {
    pub const RKEY: usize = 0;
}

/// A read/write view of an IETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole IETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: Ieth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::Ieth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::RKEY)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, value: u32) {
        field::set_u32(self.buffer.as_mut(), offset::RKEY, value);
    }
}

/// A parsed IETH. Every bit pattern is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

impl Repr {
    /// Parses an IETH view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            rkey: header.rkey(),
        })
    }

    /// Writes all 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_rkey(self.rkey);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/ieth.rs"]
mod tests;
