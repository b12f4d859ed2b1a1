//! AtomicETH: the 28-byte Atomic Extended Transport Header of COMPARE_SWAP and
//! FETCH_ADD requests (IBA Vol 1 §9.3.4). Packed, no padding.
//!
//! ```text
//! bytes 0-7    Virtual address (64)
//! bytes 8-11   R_Key (32)
//! bytes 12-19  Swap (CMP_SWAP) or Add (FETCH_ADD) data (64)
//! bytes 20-27  Compare data (64; unused by FETCH_ADD)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};

/// Length of the AtomicETH in bytes.
pub const LEN: usize = 28;

mod offset {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const SWAP_ADD: usize = 12;
    pub const COMPARE: usize = 20;
}

/// A read/write view of an AtomicETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole AtomicETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: AtomicEth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::AtomicEth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), offset::VA)
    }

    /// R_Key.
    pub fn rkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::RKEY)
    }

    /// Swap (CMP_SWAP) or add (FETCH_ADD) operand.
    pub fn swap_add(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), offset::SWAP_ADD)
    }

    /// Compare operand (CMP_SWAP).
    pub fn compare(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), offset::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, value: u64) {
        field::set_u64(self.buffer.as_mut(), offset::VA, value);
    }

    /// Sets the R_Key.
    pub fn set_rkey(&mut self, value: u32) {
        field::set_u32(self.buffer.as_mut(), offset::RKEY, value);
    }

    /// Sets the swap/add operand.
    pub fn set_swap_add(&mut self, value: u64) {
        field::set_u64(self.buffer.as_mut(), offset::SWAP_ADD, value);
    }

    /// Sets the compare operand.
    pub fn set_compare(&mut self, value: u64) {
        field::set_u64(self.buffer.as_mut(), offset::COMPARE, value);
    }
}

/// A parsed AtomicETH. Every bit pattern is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address (8-byte aligned for a valid request; not checked here).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (CMP_SWAP) or add (FETCH_ADD) operand.
    pub swap_add: u64,
    /// Compare operand (CMP_SWAP; unused by FETCH_ADD).
    pub compare: u64,
}

impl Repr {
    /// Parses an AtomicETH view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            va: header.va(),
            rkey: header.rkey(),
            swap_add: header.swap_add(),
            compare: header.compare(),
        })
    }

    /// Writes all 28 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_va(self.va);
        header.set_rkey(self.rkey);
        header.set_swap_add(self.swap_add);
        header.set_compare(self.compare);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/atomic_eth.rs"]
mod tests;
