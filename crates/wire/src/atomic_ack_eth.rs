//! AtomicAckETH: the 8-byte Atomic ACK Extended Transport Header of ATOMIC_ACKNOWLEDGE,
//! carrying the remote value before the atomic operation (IBA Vol 1 §9.3.6).
//!
//! ```text
//! bytes 0-7   Original remote data (64)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};

/// Length of the AtomicAckETH in bytes.
pub const LEN: usize = 8;

mod offset {
    pub const ORIG: usize = 0;
}

/// A read/write view of an AtomicAckETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole AtomicAckETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: AtomicAckEth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::AtomicAckEth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Original remote data.
    pub fn orig(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), offset::ORIG)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the original remote data.
    pub fn set_orig(&mut self, value: u64) {
        field::set_u64(self.buffer.as_mut(), offset::ORIG, value);
    }
}

/// A parsed AtomicAckETH. Every bit pattern is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The remote 8-byte value before the atomic operation.
    pub orig: u64,
}

impl Repr {
    /// Parses an AtomicAckETH view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            orig: header.orig(),
        })
    }

    /// Writes all 8 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_orig(self.orig);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/atomic_ack_eth.rs"]
mod tests;
