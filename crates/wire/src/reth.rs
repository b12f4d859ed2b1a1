//! RETH: the 16-byte RDMA Extended Transport Header of RDMA WRITE (first/only), RDMA
//! READ requests and ATOMIC WRITE (IBA Vol 1 §9.3.3).
//!
//! ```text
//! bytes 0-7    Virtual address (64)
//! bytes 8-11   R_Key (32)
//! bytes 12-15  DMA length (32)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};

/// Length of the RETH in bytes.
pub const LEN: usize = 16;

mod offset {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const DMA_LEN: usize = 12;
}

/// A read/write view of a RETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole RETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: Reth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::Reth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Virtual address.
    pub fn va(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), offset::VA)
    }

    /// R_Key.
    pub fn rkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::RKEY)
    }

    /// DMA length.
    pub fn dma_len(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::DMA_LEN)
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

    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, value: u32) {
        field::set_u32(self.buffer.as_mut(), offset::DMA_LEN, value);
    }
}

/// A parsed RETH. Every bit pattern is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA transfer in bytes.
    pub dma_len: u32,
}

impl Repr {
    /// Parses a RETH view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            va: header.va(),
            rkey: header.rkey(),
            dma_len: header.dma_len(),
        })
    }

    /// Writes all 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_va(self.va);
        header.set_rkey(self.rkey);
        header.set_dma_len(self.dma_len);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/reth.rs"]
mod tests;
