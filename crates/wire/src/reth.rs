//! RETH: the 16-byte RDMA Extended Transport Header of RDMA WRITE (first/only), RDMA
//! READ requests and ATOMIC WRITE (roce-spec.md §1.3).
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
mod tests {
    use super::*;

    // VA 0x0011223344556677, R_Key 0x8899aabb, DMA length 0x00001000 (4096), by hand.
    const BYTES: [u8; LEN] = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0x00, 0x00, 0x10,
        0x00,
    ];
    const REPR: Repr = Repr {
        va: 0x0011_2233_4455_6677,
        rkey: 0x8899_aabb,
        dma_len: 4096,
    };

    #[test]
    fn parse_bytes() {
        let h = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.va(), 0x0011_2233_4455_6677);
        assert_eq!(h.rkey(), 0x8899_aabb);
        assert_eq!(h.dma_len(), 0x1000);
        assert_eq!(Repr::parse(&h).unwrap(), REPR);
    }

    #[test]
    fn emit_bytes() {
        let mut buf = [0xeeu8; LEN];
        REPR.emit(&mut Header::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(REPR.buffer_len(), 16);
    }

    #[test]
    fn longer_buffer_parses_prefix() {
        let mut long = [0u8; LEN + 3];
        long[..LEN].copy_from_slice(&BYTES);
        let h = Header::new_checked(&long[..]).unwrap();
        assert_eq!(Repr::parse(&h).unwrap(), REPR);
        assert_eq!(h.into_inner().len(), LEN + 3);
    }

    #[test]
    fn every_short_length_is_truncated() {
        for len in 0..LEN {
            let err = WireError::Truncated {
                header: HeaderKind::Reth,
                offset: 0,
                needed: LEN,
                available: len,
            };
            assert_eq!(Header::new_checked(&BYTES[..len]).unwrap_err(), err);
            assert_eq!(Repr::parse(&Header::new_unchecked(&BYTES[..len])), Err(err));
        }
    }
}
