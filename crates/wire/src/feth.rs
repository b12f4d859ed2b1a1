//! FETH: the 4-byte FLUSH Extended Transport Header of the RC FLUSH request (opcode 0x1C,
//! IBA Vol 1 Release 1.5, Annex A19; layout as in roce-spec §1.3, opcode row §1.5). On
//! the wire a FLUSH is BTH, FETH, RETH and no payload.
//!
//! ```text
//! bits 31:6   reserved (26)
//! bits  5:4   selectivity level (A19.4.1.2): 0 memory-region range (the RETH's VA and
//!               DMA length), 1 the whole memory region of the R_Key; 2-3 reserved
//! bits  3:0   placement type (A19.4.1.1), a bit mask: bit 0 global visibility,
//!               bit 1 persistence; bits 2-3 reserved
//! ```
//!
//! Reserved bits (bits 31:6) are ignored by [`Repr::parse`] and written as zero by
//! [`Repr::emit`], as for the reserved bits of the other headers of this crate. The
//! reserved *values* of the two fields are kept as received: judging them is the
//! responder's business, not the parser's.

use crate::error::{check_len, field, HeaderKind, WireError};

/// Length of the FETH in bytes.
pub const LEN: usize = 4;

/// Placement type bit: make the data globally visible (A19.4.1.1).
pub const PLACEMENT_GLOBAL_VISIBILITY: u8 = 1 << 0;
/// Placement type bit: make the data persistent (A19.4.1.1).
pub const PLACEMENT_PERSISTENCE: u8 = 1 << 1;
/// Selectivity level: the memory-region range named by the RETH (A19.4.1.2).
pub const SELECTIVITY_RANGE: u8 = 0;
/// Selectivity level: the whole memory region named by the RETH's R_Key (A19.4.1.2).
pub const SELECTIVITY_REGION: u8 = 1;

/// Largest placement type (4 bits).
const PLACEMENT_MAX: u8 = 0x0f;
/// Largest selectivity level (2 bits).
const SELECTIVITY_MAX: u8 = 0x03;
const SELECTIVITY_SHIFT: u32 = 4;
const RESERVED_SHIFT: u32 = 6;

mod offset {
    pub const WORD: usize = 0;
}

/// A read/write view of an FETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole FETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: Feth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::Feth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn word(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::WORD)
    }

    /// The 26 reserved bits (31:6), shifted down.
    pub fn reserved(&self) -> u32 {
        self.word() >> RESERVED_SHIFT
    }

    /// Selectivity level (bits 5:4).
    pub fn selectivity_level(&self) -> u8 {
        ((self.word() >> SELECTIVITY_SHIFT) as u8) & SELECTIVITY_MAX
    }

    /// Placement type (bits 3:0).
    pub fn placement_type(&self) -> u8 {
        (self.word() as u8) & PLACEMENT_MAX
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn set_word(&mut self, value: u32) {
        field::set_u32(self.buffer.as_mut(), offset::WORD, value);
    }

    /// Sets the reserved bits (31:6) from the low 26 bits of `value`.
    pub fn set_reserved(&mut self, value: u32) {
        let keep = self.word() & ((1 << RESERVED_SHIFT) - 1);
        self.set_word(keep | (value << RESERVED_SHIFT));
    }

    /// Sets the selectivity level (bits 5:4) from the low 2 bits of `value`.
    pub fn set_selectivity_level(&mut self, value: u8) {
        let mask = u32::from(SELECTIVITY_MAX) << SELECTIVITY_SHIFT;
        let bits = (u32::from(value) << SELECTIVITY_SHIFT) & mask;
        self.set_word((self.word() & !mask) | bits);
    }

    /// Sets the placement type (bits 3:0) from the low 4 bits of `value`.
    pub fn set_placement_type(&mut self, value: u8) {
        let mask = u32::from(PLACEMENT_MAX);
        self.set_word((self.word() & !mask) | (u32::from(value) & mask));
    }
}

/// A parsed FETH. `parse` ignores the reserved bits 31:6; `emit` writes them as zero and
/// writes the low bits of each field ([`Repr::validate`] rejects values that do not fit
/// instead). Every 6-bit combination of the two fields parses, reserved values included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Selectivity level (2 bits): [`SELECTIVITY_RANGE`], [`SELECTIVITY_REGION`]; 2 and 3
    /// are reserved.
    pub selectivity_level: u8,
    /// Placement type (4 bits), a mask of [`PLACEMENT_GLOBAL_VISIBILITY`] and
    /// [`PLACEMENT_PERSISTENCE`]; bits 2 and 3 are reserved.
    pub placement_type: u8,
}

impl Repr {
    /// Parses an FETH view (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            selectivity_level: header.selectivity_level(),
            placement_type: header.placement_type(),
        })
    }

    /// `InvalidField` if `selectivity_level` does not fit 2 bits or `placement_type` 4.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.selectivity_level > SELECTIVITY_MAX {
            return Err(WireError::InvalidField {
                header: HeaderKind::Feth,
                field: "selectivity_level",
                value: u64::from(self.selectivity_level),
            });
        }
        if self.placement_type > PLACEMENT_MAX {
            return Err(WireError::InvalidField {
                header: HeaderKind::Feth,
                field: "placement_type",
                value: u64::from(self.placement_type),
            });
        }
        Ok(())
    }

    /// Writes all 4 bytes, the reserved bits as zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_word(0);
        header.set_selectivity_level(self.selectivity_level);
        header.set_placement_type(self.placement_type);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/feth.rs"]
mod tests;
