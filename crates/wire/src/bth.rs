//! BTH: the 12-byte Base Transport Header that starts every RoCEv2 packet
//! (IBA Vol 1 §9.2).
//!
//! ```text
//! byte 0      OpCode (bits 7:5 transport, 4:0 operation)
//! byte 1      SE(7) M(6) PadCnt(5:4) TVer(3:0)
//! bytes 2-3   P_Key
//! byte 4      FECN(7) BECN(6) Resv6(5:0)
//! bytes 5-7   DestQP (24)
//! byte 8      AckReq(7) Resv7(6:0)
//! bytes 9-11  PSN (24)
//! ```

use crate::error::{check_len, field, HeaderKind, WireError};
use crate::psn::{Psn, PSN_MASK};

/// Length of the BTH in bytes.
pub const LEN: usize = 12;

mod offset {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const ECN: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK: usize = 8;
    pub const PSN: usize = 9;
}

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const PAD_MASK: u8 = 0x30;
const PAD_SHIFT: u8 = 4;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const RESV6_MASK: u8 = 0x3f;
const ACK_REQ: u8 = 0x80;
const RESV7_MASK: u8 = 0x7f;

/// A read/write view of a BTH at the start of a buffer.
///
/// After [`Header::new_checked`] (or a successful [`Header::check_len`]) no accessor
/// panics. A view made with [`Header::new_unchecked`] over a short buffer does not panic
/// either: missing bytes read as zero and writes to them are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps `buffer` without checking its length (for emitting into a buffer of known size).
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wraps `buffer` after checking that it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: Bth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::Bth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn buf(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// OpCode (byte 0).
    pub fn opcode(&self) -> u8 {
        field::u8_at(self.buf(), offset::OPCODE)
    }

    /// SE: solicited event.
    pub fn solicited(&self) -> bool {
        field::u8_at(self.buf(), offset::FLAGS) & SE != 0
    }

    /// M: migration request.
    pub fn mig_req(&self) -> bool {
        field::u8_at(self.buf(), offset::FLAGS) & MIG != 0
    }

    /// PadCnt: number of pad bytes after the payload (0-3).
    pub fn pad_cnt(&self) -> u8 {
        (field::u8_at(self.buf(), offset::FLAGS) & PAD_MASK) >> PAD_SHIFT
    }

    /// TVer: transport header version (must be 0).
    pub fn tver(&self) -> u8 {
        field::u8_at(self.buf(), offset::FLAGS) & TVER_MASK
    }

    /// P_Key.
    pub fn pkey(&self) -> u16 {
        field::u16_at(self.buf(), offset::PKEY)
    }

    /// FECN: forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        field::u8_at(self.buf(), offset::ECN) & FECN != 0
    }

    /// BECN: backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        field::u8_at(self.buf(), offset::ECN) & BECN != 0
    }

    /// The six reserved bits of byte 4.
    pub fn resv6(&self) -> u8 {
        field::u8_at(self.buf(), offset::ECN) & RESV6_MASK
    }

    /// DestQP (24 bits).
    pub fn dest_qp(&self) -> u32 {
        field::u24_at(self.buf(), offset::DEST_QP)
    }

    /// A: acknowledge request.
    pub fn ack_req(&self) -> bool {
        field::u8_at(self.buf(), offset::ACK) & ACK_REQ != 0
    }

    /// The seven reserved bits of byte 8.
    pub fn resv7(&self) -> u8 {
        field::u8_at(self.buf(), offset::ACK) & RESV7_MASK
    }

    /// PSN (24 bits).
    pub fn psn(&self) -> Psn {
        Psn::new(field::u24_at(self.buf(), offset::PSN))
    }

    /// The bytes after the BTH (empty if there are none).
    pub fn payload(&self) -> &[u8] {
        self.buf().get(LEN..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn buf_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn update(&mut self, at: usize, mask: u8, bits: u8) {
        let old = field::u8_at(self.buf_mut(), at);
        field::set_u8(self.buf_mut(), at, (old & !mask) | (bits & mask));
    }

    /// Sets the OpCode.
    pub fn set_opcode(&mut self, value: u8) {
        field::set_u8(self.buf_mut(), offset::OPCODE, value);
    }

    /// Sets SE.
    pub fn set_solicited(&mut self, value: bool) {
        self.update(offset::FLAGS, SE, if value { SE } else { 0 });
    }

    /// Sets M.
    pub fn set_mig_req(&mut self, value: bool) {
        self.update(offset::FLAGS, MIG, if value { MIG } else { 0 });
    }

    /// Sets PadCnt from the low two bits of `value`.
    pub fn set_pad_cnt(&mut self, value: u8) {
        self.update(offset::FLAGS, PAD_MASK, value << PAD_SHIFT);
    }

    /// Sets TVer from the low four bits of `value`.
    pub fn set_tver(&mut self, value: u8) {
        self.update(offset::FLAGS, TVER_MASK, value);
    }

    /// Sets the P_Key.
    pub fn set_pkey(&mut self, value: u16) {
        field::set_u16(self.buf_mut(), offset::PKEY, value);
    }

    /// Sets FECN.
    pub fn set_fecn(&mut self, value: bool) {
        self.update(offset::ECN, FECN, if value { FECN } else { 0 });
    }

    /// Sets BECN.
    pub fn set_becn(&mut self, value: bool) {
        self.update(offset::ECN, BECN, if value { BECN } else { 0 });
    }

    /// Sets the reserved bits of byte 4 (low six bits of `value`).
    pub fn set_resv6(&mut self, value: u8) {
        self.update(offset::ECN, RESV6_MASK, value);
    }

    /// Sets DestQP from the low 24 bits of `value`.
    pub fn set_dest_qp(&mut self, value: u32) {
        field::set_u24(self.buf_mut(), offset::DEST_QP, value);
    }

    /// Sets A.
    pub fn set_ack_req(&mut self, value: bool) {
        self.update(offset::ACK, ACK_REQ, if value { ACK_REQ } else { 0 });
    }

    /// Sets the reserved bits of byte 8 (low seven bits of `value`).
    pub fn set_resv7(&mut self, value: u8) {
        self.update(offset::ACK, RESV7_MASK, value);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, value: Psn) {
        field::set_u24(self.buf_mut(), offset::PSN, value.value());
    }

    /// The bytes after the BTH, writable (empty if there are none).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.buf_mut().get_mut(LEN..).unwrap_or(&mut [])
    }
}

/// A validated BTH.
///
/// `parse` rejects TVer ≠ 0 and ignores the reserved bits; `emit` writes TVer and the
/// reserved bits as 0. `emit` cannot fail: it writes the low 2 bits of `pad_cnt` and the
/// low 24 bits of `dest_qp`. Use [`Repr::validate`] (as [`crate::PacketRepr::emit`] does)
/// to reject out-of-range values instead of masking them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode.
    pub opcode: u8,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration request.
    pub mig_req: bool,
    /// PadCnt (0-3).
    pub pad_cnt: u8,
    /// P_Key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// DestQP (24 bits).
    pub dest_qp: u32,
    /// A: acknowledge request.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// Parses a BTH view: `Truncated` if short, `BadTver` if TVer ≠ 0.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        let tver = header.tver();
        if tver != 0 {
            return Err(WireError::BadTver(tver));
        }
        Ok(Repr {
            opcode: header.opcode(),
            solicited: header.solicited(),
            mig_req: header.mig_req(),
            pad_cnt: header.pad_cnt(),
            pkey: header.pkey(),
            fecn: header.fecn(),
            becn: header.becn(),
            dest_qp: header.dest_qp(),
            ack_req: header.ack_req(),
            psn: header.psn(),
        })
    }

    /// `InvalidField` if `pad_cnt` > 3 or `dest_qp` does not fit 24 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.pad_cnt > 3 {
            return Err(WireError::InvalidField {
                header: HeaderKind::Bth,
                field: "pad_cnt",
                value: u64::from(self.pad_cnt),
            });
        }
        if self.dest_qp > PSN_MASK {
            return Err(WireError::InvalidField {
                header: HeaderKind::Bth,
                field: "dest_qp",
                value: u64::from(self.dest_qp),
            });
        }
        Ok(())
    }

    /// Writes all 12 bytes (reserved bits and TVer as 0; see the type doc for masking).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        let flags = (if self.solicited { SE } else { 0 })
            | (if self.mig_req { MIG } else { 0 })
            | ((self.pad_cnt << PAD_SHIFT) & PAD_MASK);
        let ecn = (if self.fecn { FECN } else { 0 }) | (if self.becn { BECN } else { 0 });
        let buf = header.buf_mut();
        field::set_u8(buf, offset::OPCODE, self.opcode);
        field::set_u8(buf, offset::FLAGS, flags);
        field::set_u16(buf, offset::PKEY, self.pkey);
        field::set_u8(buf, offset::ECN, ecn);
        field::set_u24(buf, offset::DEST_QP, self.dest_qp);
        field::set_u8(buf, offset::ACK, if self.ack_req { ACK_REQ } else { 0 });
        field::set_u24(buf, offset::PSN, self.psn.value());
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
#[path = "tests/bth.rs"]
mod tests;
