//! BTH: the 12-byte Base Transport Header that starts every RoCEv2 packet
//! (roce-spec.md §1.2).
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
mod tests {
    use super::*;

    /// The BTH of the IPv4 test vector of roce-spec.md §2.2 (RC SEND_ONLY, PadCnt 3,
    /// P_Key 0xFFFF, DestQP 0x11, AckReq, PSN 0x64), followed by "hello" and 3 pad bytes.
    const VECTOR: [u8; 20] = [
        0x04, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x64, b'h', b'e', b'l',
        b'l', b'o', 0x00, 0x00, 0x00,
    ];

    /// Every flag set, by hand: SE|M|PadCnt=2 = 0xE0; FECN|BECN = 0xC0; A = 0x80.
    const ALL_SET: [u8; 12] = [
        0x0b, 0xe0, 0x7f, 0xff, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0xfe, 0xdc, 0xba,
    ];

    fn all_set_repr() -> Repr {
        Repr {
            opcode: 0x0b,
            solicited: true,
            mig_req: true,
            pad_cnt: 2,
            pkey: 0x7fff,
            fecn: true,
            becn: true,
            dest_qp: 0xab_cdef,
            ack_req: true,
            psn: Psn::new(0xfe_dcba),
        }
    }

    #[test]
    fn parse_spec_vector() {
        let h = Header::new_checked(&VECTOR[..]).unwrap();
        let r = Repr::parse(&h).unwrap();
        assert_eq!(
            r,
            Repr {
                opcode: 0x04,
                solicited: false,
                mig_req: false,
                pad_cnt: 3,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: 0x11,
                ack_req: true,
                psn: Psn::new(0x64),
            }
        );
        assert_eq!(h.payload(), b"hello\0\0\0");
    }

    #[test]
    fn deconstruct_all_flags() {
        let h = Header::new_checked(&ALL_SET[..]).unwrap();
        assert_eq!(h.opcode(), 0x0b);
        assert!(h.solicited() && h.mig_req() && h.fecn() && h.becn() && h.ack_req());
        assert_eq!(h.pad_cnt(), 2);
        assert_eq!(h.tver(), 0);
        assert_eq!(h.pkey(), 0x7fff);
        assert_eq!(h.dest_qp(), 0xab_cdef);
        assert_eq!(h.psn(), Psn::new(0xfe_dcba));
        assert_eq!(Repr::parse(&h).unwrap(), all_set_repr());
    }

    #[test]
    fn emit_all_flags() {
        let mut buf = [0x55u8; LEN];
        all_set_repr().emit(&mut Header::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ALL_SET);
    }

    #[test]
    fn emit_spec_vector_bth() {
        let mut buf = [0xaau8; LEN];
        let r = Repr {
            opcode: 0x04,
            solicited: false,
            mig_req: false,
            pad_cnt: 3,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: Psn::new(0x64),
        };
        r.emit(&mut Header::new_unchecked(&mut buf[..]));
        assert_eq!(buf[..], VECTOR[..LEN]);
    }

    #[test]
    fn construct_with_setters() {
        let mut buf = [0u8; LEN];
        let mut h = Header::new_unchecked(&mut buf[..]);
        h.set_opcode(0x0b);
        h.set_solicited(true);
        h.set_mig_req(true);
        h.set_pad_cnt(2);
        h.set_pkey(0x7fff);
        h.set_fecn(true);
        h.set_becn(true);
        h.set_dest_qp(0xab_cdef);
        h.set_ack_req(true);
        h.set_psn(Psn::new(0xfe_dcba));
        assert_eq!(buf, ALL_SET);
    }

    #[test]
    fn nonzero_tver_is_rejected() {
        let mut bytes = VECTOR;
        bytes[1] = 0x31; // PadCnt 3, TVer 1
        let h = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(Repr::parse(&h), Err(WireError::BadTver(1)));
        bytes[1] = 0x0f;
        let h = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(Repr::parse(&h), Err(WireError::BadTver(15)));
    }

    #[test]
    fn reserved_bits_are_ignored_on_parse_and_cleared_on_emit() {
        let mut bytes = ALL_SET;
        bytes[4] = 0xff; // FECN, BECN and all of Resv6
        bytes[8] = 0xff; // A and all of Resv7
        let h = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(h.resv6(), 0x3f);
        assert_eq!(h.resv7(), 0x7f);
        let r = Repr::parse(&h).unwrap();
        assert_eq!(r, all_set_repr());
        let mut out = [0u8; LEN];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, ALL_SET);
    }

    #[test]
    fn emit_masks_out_of_range_fields_and_validate_rejects_them() {
        let mut r = all_set_repr();
        r.dest_qp = 0x0100_0001;
        r.pad_cnt = 7;
        assert_eq!(
            r.validate(),
            Err(WireError::InvalidField {
                header: HeaderKind::Bth,
                field: "pad_cnt",
                value: 7
            })
        );
        r.pad_cnt = 3;
        assert_eq!(
            r.validate(),
            Err(WireError::InvalidField {
                header: HeaderKind::Bth,
                field: "dest_qp",
                value: 0x0100_0001
            })
        );
        let mut out = [0u8; LEN];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out[1], 0xf0); // SE | M | PadCnt 3, TVer 0
        assert_eq!(out[5..8], [0x00, 0x00, 0x01]);
        assert!(all_set_repr().validate().is_ok());
    }

    #[test]
    fn every_short_length_is_truncated() {
        for len in 0..LEN {
            let err = Header::new_checked(&VECTOR[..len]).unwrap_err();
            assert_eq!(
                err,
                WireError::Truncated {
                    header: HeaderKind::Bth,
                    offset: 0,
                    needed: LEN,
                    available: len
                }
            );
            let unchecked = Header::new_unchecked(&VECTOR[..len]);
            assert_eq!(Repr::parse(&unchecked), Err(err));
        }
    }

    #[test]
    fn unchecked_short_view_does_not_panic() {
        let mut short = [0u8; 5];
        let mut h = Header::new_unchecked(&mut short[..]);
        h.set_psn(Psn::new(5));
        h.set_dest_qp(0x12_3456);
        all_set_repr().emit(&mut h);
        assert_eq!(h.psn(), Psn::ZERO);
        assert!(h.payload().is_empty());
        assert_eq!(h.payload_mut().len(), 0);
    }
}
