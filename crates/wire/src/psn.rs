//! 24-bit packet sequence numbers.
//!
//! PSNs live in a 24-bit space and wrap. Ordering is defined only relative to a reference
//! point: `a` is *after* `b` when `a - b` (mod 2^24) lies in the half space `1 ..= 2^23 - 1`
//! ahead of `b` (IBA Vol 1 §9.7). There is deliberately no `PartialOrd`: every comparison
//! names its direction with [`Psn::is_after`] / [`Psn::is_before`] or measures a signed
//! [`Psn::diff`].

use core::fmt;

/// Mask of the 24 significant bits of a PSN (also of QPNs and MSNs).
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number with wrapping arithmetic.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The PSN zero.
    pub const ZERO: Psn = Psn(0);
    /// The largest PSN, 2^24 - 1.
    pub const MAX: Psn = Psn(PSN_MASK);

    /// Makes a PSN from the low 24 bits of `value` (higher bits are discarded, as the
    /// verbs layer does for `sq_psn` / `rq_psn`).
    #[inline]
    pub const fn new(value: u32) -> Psn {
        Psn(value & PSN_MASK)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & PSN_MASK)
    }

    /// `self - n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & PSN_MASK)
    }

    /// Signed distance `self - other` in the range `-2^23 ..= 2^23 - 1`: positive when
    /// `self` is after `other`.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to sign-extend it.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// True when `self` comes strictly after `other` in sequence space.
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// True when `self` comes strictly before `other` in sequence space.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True when `self` is `other` or after it.
    #[inline]
    pub const fn is_at_or_after(self, other: Psn) -> bool {
        self.diff(other) >= 0
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl core::ops::Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        self.wrapping_add(n)
    }
}

impl core::ops::AddAssign<u32> for Psn {
    fn add_assign(&mut self, n: u32) {
        *self = self.wrapping_add(n);
    }
}

impl core::ops::Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, n: u32) -> Psn {
        self.wrapping_sub(n)
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
#[path = "tests/psn.rs"]
mod tests;
