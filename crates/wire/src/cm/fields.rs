//! Panic-free access to the packed fields of CM messages.
//!
//! IBA Vol 1 ch. 12 numbers bits from the most significant bit of a byte: a field "at byte
//! 43, bits 5..6" is `b[2:1]` of byte 43 in the usual LSB-0 notation. [`bits`] and
//! [`set_bits`] take the IBA form (offset from the MSB, width) so the tables in the views
//! read like the specification's.

pub(crate) use crate::error::field::{
    get, put, set_u16, set_u24, set_u32, set_u64, set_u8, u16_at, u24_at, u32_at, u64_at, u8_at,
};

/// `width` bits of byte `at` starting `from_msb` bits below its most significant bit.
#[inline]
pub(crate) fn bits(buf: &[u8], at: usize, from_msb: u32, width: u32) -> u8 {
    let shift = 8 - from_msb - width;
    (u8_at(buf, at) >> shift) & mask(width)
}

/// Writes the low `width` bits of `value` into byte `at`, `from_msb` bits below its MSB,
/// leaving the other bits of the byte alone.
#[inline]
pub(crate) fn set_bits(buf: &mut [u8], at: usize, from_msb: u32, width: u32, value: u8) {
    let shift = 8 - from_msb - width;
    let m = mask(width) << shift;
    let old = u8_at(buf, at);
    set_u8(buf, at, (old & !m) | ((value << shift) & m));
}

/// One bit (`from_msb` below the MSB of byte `at`) as a bool.
#[inline]
pub(crate) fn flag(buf: &[u8], at: usize, from_msb: u32) -> bool {
    bits(buf, at, from_msb, 1) != 0
}

/// Sets one bit.
#[inline]
pub(crate) fn set_flag(buf: &mut [u8], at: usize, from_msb: u32, value: bool) {
    set_bits(buf, at, from_msb, 1, u8::from(value));
}

/// The 20-bit flow label in the top bits of the 32-bit word at `at`.
#[inline]
pub(crate) fn flow_label(buf: &[u8], at: usize) -> u32 {
    u32_at(buf, at) >> 12
}

/// Writes a 20-bit flow label into the top bits of the word at `at`, keeping the low 12.
#[inline]
pub(crate) fn set_flow_label(buf: &mut [u8], at: usize, value: u32) {
    let old = u32_at(buf, at) & 0xfff;
    set_u32(buf, at, ((value & 0xf_ffff) << 12) | old);
}

#[inline]
const fn mask(width: u32) -> u8 {
    if width >= 8 {
        0xff
    } else {
        (1u8 << width) - 1
    }
}
