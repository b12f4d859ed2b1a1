//! Recovering the IPv4 Identification (and the DF flag) an ICRC was computed for.
//!
//! The ICRC covers the IPv4 Identification and flags (IBA Annex A17, RoCEv2: only TOS,
//! TTL, the header checksum, the UDP checksum and the BTH's FECN/BECN/reserved byte are
//! masked), but a receiver on a UDP socket never sees the IP header. A sender that picks
//! Identifications the receiver cannot predict (Linux Soft-RoCE uses the kernel's
//! per-destination counter) produces ICRCs that fail against a header rebuilt with
//! Identification 0. This module finds the header that makes them valid, if there is one,
//! without trying Identifications one by one.
//!
//! # The algebra
//! Over messages of one length the CRC is affine: `crc(m ⊕ e) = crc(m) ⊕ lin(e)`, where
//! `lin` is the response of the CRC register (no initial or final XOR) to `e` alone. The
//! Identification occupies 16 bits of the ICRC input (bytes 12 and 13: 8 stand-in bytes
//! for the LRH, then bytes 4 and 5 of the IPv4 header) and DF one more (byte 14, 0x40),
//! so for a packet whose ICRC input is `n` bytes long
//!
//! `ICRC(id, df) = ICRC(0, DF set) ⊕ M_n·id ⊕ (df clear ? d_n : 0)`
//!
//! with `M_n` a 32×16 matrix over GF(2) and `d_n` a vector that depend only on `n`, i.e.
//! on the packet length. The *syndrome* `s = ICRC(0, DF set) ⊕ ICRC received` therefore
//! lies in the column space of `M_n` when some Identification with DF set explains it,
//! and in the coset `d_n + span(M_n)` when one with DF clear does.
//!
//! The 17 columns are independent: a non-zero combination of them is an error pattern
//! confined to bytes 12..15 of the input, a burst of at most 24 bits, and CRC-32 detects
//! every burst of 32 bits or fewer (its generator has a non-zero constant term), so
//! `lin` of it is never 0. Hence the two cosets are disjoint and the solution is unique:
//! at most one Identification with DF set, or one with DF clear (not both), explains a
//! syndrome. [`IdentBasis`] brings the 17 columns into reduced echelon form once per
//! length (a few hundred word operations); [`IdentBasis::solve`] then reduces a syndrome
//! in 17 conditional XORs, and [`IdentSolver`] keeps the bases of the last lengths seen.
//!
//! # What it costs in error detection
//! Accepting any of 2 × 2¹⁶ headers instead of one turns the 2⁻³² chance that a random
//! corruption goes unnoticed into `2¹⁷ / 2³² = 2⁻¹⁵` (the syndrome of a uniformly random
//! wrong ICRC is uniform over 2³² values, 2¹⁷ of which are accepted). Errors CRC-32
//! always detects (a single bit, a burst of up to 32 bits) may now pass when their
//! syndrome happens to lie in one of the two cosets; see `docs/ICRC.md` for the argument
//! and the measured rates.
//!
//! Arithmetic is on polynomials over GF(2) modulo the CRC-32 polynomial, in the
//! bit-reflected form the CRC register uses: the coefficient of x⁰ is the top bit, that of
//! x³¹ bit 0, and multiplying by x is a right shift that folds the polynomial in.

use crate::error::{field, WireError};
use crate::icrc;
use crate::ICRC_LEN;

/// Length of the BTH.
const BTH_LEN: usize = 12;
/// The CRC-32 polynomial without its x³² term, bit-reflected.
const CRC_POLY: u32 = 0xEDB8_8320;
/// The polynomial 1 (x⁰) in the reflected form.
const POLY_ONE: u32 = 1 << 31;
/// ICRC input bytes in front of the BTH for IPv4: LRH stand-in (8), IPv4 (20), UDP (8).
const V4_PSEUDO_LEN: usize = 8 + 20 + 8;
/// Index in the ICRC input of the IPv4 flags byte (LRH stand-in, then byte 6 of the IPv4
/// header); the Identification is in the two bytes before it.
const FLAGS_AT: usize = 8 + 6;
/// The DF bit in the flags byte.
const DF_BIT: u8 = 0x40;
/// Columns of the system: 16 Identification bits and DF.
const COLUMNS: usize = 17;
/// The tag bit that stands for "DF clear".
const DF_TAG: u32 = 1 << 16;

/// The IPv4 Identification and DF flag of the header an ICRC matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Ident {
    /// The Identification field.
    pub identification: u16,
    /// Whether the Don't Fragment flag was set.
    pub dont_fragment: bool,
}

impl Ipv4Ident {
    /// Identification 0 with DF: what Linux gives every datagram of an unconnected UDP
    /// socket with `IP_PMTUDISC_DO` (uroce's convention).
    pub const UROCE: Ipv4Ident = Ipv4Ident {
        identification: 0,
        dont_fragment: true,
    };
}

/// `v · x mod P`.
const fn times_x(v: u32) -> u32 {
    if v & 1 == 0 {
        v >> 1
    } else {
        (v >> 1) ^ CRC_POLY
    }
}

/// `a · b mod P`: `b · x^i` summed over the terms `x^i` of `a`.
const fn mul_mod(a: u32, b: u32) -> u32 {
    let mut product = 0;
    let mut b_times_xi = b;
    let mut i = 0;
    while i < 32 {
        if a & (POLY_ONE >> i) != 0 {
            product ^= b_times_xi;
        }
        b_times_xi = times_x(b_times_xi);
        i += 1;
    }
    product
}

/// `x^(2^k) mod P` for k = 0..64.
const X_POW_POW2: [u32; 64] = {
    let mut table = [0u32; 64];
    table[0] = POLY_ONE >> 1; // x^1
    let mut k = 1;
    while k < 64 {
        table[k] = mul_mod(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `x^(8·bytes) mod P`: what `bytes` zero bytes do to the CRC register.
fn x_pow_8n(bytes: usize) -> u32 {
    let mut result = POLY_ONE;
    // Square-and-multiply over the bits of 8·bytes; X_POW_POW2[k + 3] = x^(8·2^k).
    for (k, power) in X_POW_POW2
        .iter()
        .skip(3)
        .enumerate()
        .take(usize::BITS as usize)
    {
        if (bytes >> k) & 1 == 1 {
            result = mul_mod(*power, result);
        }
    }
    result
}

/// The CRC register after feeding `byte` into a zero register (no initial XOR).
const fn feed_byte(byte: u8) -> u32 {
    let mut r = byte as u32;
    let mut i = 0;
    while i < 8 {
        r = times_x(r);
        i += 1;
    }
    r
}

/// Bytes of ICRC input of an IPv4 packet whose UDP payload (BTH..ICRC) is `roce_len`
/// bytes long.
const fn v4_input_len(roce_len: usize) -> usize {
    V4_PSEUDO_LEN + roce_len.saturating_sub(ICRC_LEN)
}

/// `lin(e)` for an error `e` that is `byte` at index `at` of an ICRC input of `input_len`
/// bytes (`at < input_len`).
fn byte_effect(input_len: usize, at: usize, byte: u8) -> u32 {
    mul_mod(x_pow_8n(input_len.saturating_sub(at + 1)), feed_byte(byte))
}

/// The solver for one packet length: the 17 columns (16 Identification bits, DF) in
/// reduced echelon form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentBasis {
    /// The UDP payload length (BTH..ICRC) it is for.
    roce_len: usize,
    /// What each Identification bit (0..16) and DF (16) does to the ICRC.
    columns: [u32; COLUMNS],
    /// Reduced rows: `(vector, pivot bit, tag)`: the vector is the XOR of the columns
    /// named by the tag (bits 0..16: Identification bits; bit 16: DF clear); its pivot
    /// bit is set in no other row.
    rows: [(u32, u32, u32); COLUMNS],
    /// Rows in use (17: the columns are independent, as the module docs show).
    rank: usize,
}

impl IdentBasis {
    /// The basis for IPv4 packets whose UDP payload (BTH..pad and ICRC) is `roce_len`
    /// bytes long (at least a BTH and an ICRC; shorter lengths give the basis of that
    /// minimum, and such packets have no ICRC to check anyway).
    pub fn new(roce_len: usize) -> IdentBasis {
        let roce_len = roce_len.max(BTH_LEN + ICRC_LEN);
        let input_len = v4_input_len(roce_len);
        let mut columns = [0u32; COLUMNS];
        // Identification: bits 8..16 in byte FLAGS_AT - 2, bits 0..8 in FLAGS_AT - 1.
        // Each is one bit in a known byte: the effect of that byte alone.
        let low_shift = x_pow_8n(input_len.saturating_sub(FLAGS_AT));
        let high_shift = x_pow_8n(input_len.saturating_sub(FLAGS_AT - 1));
        for (bit, column) in columns.iter_mut().take(16).enumerate() {
            let (shift, byte) = if bit < 8 {
                (low_shift, 1u8 << bit)
            } else {
                (high_shift, 1u8 << (bit - 8))
            };
            *column = mul_mod(shift, feed_byte(byte));
        }
        columns[16] = byte_effect(input_len, FLAGS_AT, DF_BIT);
        let mut basis = IdentBasis {
            roce_len,
            columns,
            rows: [(0, 0, 0); COLUMNS],
            rank: 0,
        };
        for (j, column) in columns.iter().enumerate() {
            basis.insert(*column, 1 << j);
        }
        basis
    }

    /// Adds one column (tagged) to the reduced rows, keeping them reduced.
    fn insert(&mut self, column: u32, tag: u32) {
        let mut v = column;
        let mut t = tag;
        for (row, pivot, row_tag) in self.rows.iter().take(self.rank) {
            if v & pivot != 0 {
                v ^= row;
                t ^= row_tag;
            }
        }
        if v == 0 {
            // Dependent (cannot happen for a CRC-32, see the module docs): skip it.
            return;
        }
        let pivot = v & v.wrapping_neg();
        for (row, _, row_tag) in self.rows.iter_mut().take(self.rank) {
            if *row & pivot != 0 {
                *row ^= v;
                *row_tag ^= t;
            }
        }
        if let Some(slot) = self.rows.get_mut(self.rank) {
            *slot = (v, pivot, t);
            self.rank += 1;
        }
    }

    /// The UDP payload length this basis is for.
    pub fn roce_len(&self) -> usize {
        self.roce_len
    }

    /// Independent columns found (17 for every length: see the module docs).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The ICRC difference `ICRC(ident) ⊕ ICRC(0, DF set)`: `M·id`, plus `d` when DF is
    /// clear.
    pub fn effect(&self, ident: Ipv4Ident) -> u32 {
        let mut sum = if ident.dont_fragment {
            0
        } else {
            self.columns[16]
        };
        for (bit, column) in self.columns.iter().take(16).enumerate() {
            if (ident.identification >> bit) & 1 == 1 {
                sum ^= column;
            }
        }
        sum
    }

    /// The Identification and DF flag that explain `syndrome` = ICRC computed for
    /// Identification 0 with DF ⊕ ICRC received, if any (there is at most one).
    /// `Some(Ipv4Ident::UROCE)` for syndrome 0.
    #[inline]
    pub fn solve(&self, syndrome: u32) -> Option<Ipv4Ident> {
        let mut s = syndrome;
        let mut tag = 0u32;
        // Branch-free (syndromes of corrupted packets are random): a row's pivot bit is
        // set in no other row, so whether it is set in `s` does not depend on the order.
        for (row, pivot, row_tag) in self.rows.iter().take(self.rank) {
            let take = 0u32.wrapping_sub(u32::from(s & pivot != 0));
            s ^= row & take;
            tag ^= row_tag & take;
        }
        if s != 0 {
            return None;
        }
        Some(Ipv4Ident {
            identification: (tag & 0xffff) as u16,
            dont_fragment: tag & DF_TAG == 0,
        })
    }

    /// [`IdentBasis::solve`] for a syndrome taken against a header with `reference`'s
    /// Identification and DF flag instead of Identification 0 with DF.
    pub fn solve_from(&self, reference: Ipv4Ident, syndrome: u32) -> Option<Ipv4Ident> {
        self.solve(syndrome ^ self.effect(reference))
    }
}

/// How many lengths an [`IdentSolver`] keeps the basis of.
const CACHE_SLOTS: usize = 8;

/// [`IdentBasis`] for any length, keeping the bases of the last 8
/// lengths seen (a basis costs a microsecond or two to build; traffic of one peer comes
/// in few lengths: full-MTU packets, acknowledgements, the last packet of a message).
#[derive(Debug, Clone, Default)]
pub struct IdentSolver {
    cache: [Option<IdentBasis>; CACHE_SLOTS],
    /// The slot to replace next.
    next: usize,
}

impl IdentSolver {
    /// An empty solver.
    pub fn new() -> IdentSolver {
        IdentSolver::default()
    }

    /// The basis for UDP payloads of `roce_len` bytes, from the cache or built.
    pub fn basis(&mut self, roce_len: usize) -> &IdentBasis {
        let roce_len = roce_len.max(BTH_LEN + ICRC_LEN);
        let at = match self
            .cache
            .iter()
            .position(|b| b.as_ref().is_some_and(|b| b.roce_len == roce_len))
        {
            Some(at) => at,
            None => {
                let at = self.next % CACHE_SLOTS;
                self.next = (at + 1) % CACHE_SLOTS;
                if let Some(slot) = self.cache.get_mut(at) {
                    *slot = Some(IdentBasis::new(roce_len));
                }
                at
            }
        };
        match self.cache.get(at) {
            Some(Some(basis)) => basis,
            // invariant: slot `at` was filled above or found filled.
            _ => &EMPTY_BASIS,
        }
    }

    /// [`IdentBasis::solve`] for an IPv4 packet whose UDP payload is `roce_len` bytes.
    pub fn solve(&mut self, roce_len: usize, syndrome: u32) -> Option<Ipv4Ident> {
        self.basis(roce_len).solve(syndrome)
    }
}

/// Finds the IPv4 Identification and DF flag for which the ICRC at the end of
/// `roce_with_icrc` (BTH..pad, then 4 ICRC bytes) is valid, given the rest of the IPv4
/// header (`ip_header`: its Identification and DF may be anything, they are what the
/// answer is relative to) and the UDP header. `Ok(None)` when no Identification with DF
/// set or clear makes it valid.
///
/// # Errors
/// As [`icrc::verify`]; [`WireError::UnsupportedIp`] for an IPv6 header (IPv6 has no
/// Identification: use [`icrc::verify`]).
pub fn identify(
    solver: &mut IdentSolver,
    ip_header: &[u8],
    udp_header: &[u8],
    roce_with_icrc: &[u8],
) -> Result<Option<Ipv4Ident>, WireError> {
    let version = ip_header.first().map_or(0, |b| b >> 4);
    if version == 6 {
        return Err(WireError::UnsupportedIp { version });
    }
    let computed = match icrc::verify(ip_header, udp_header, roce_with_icrc) {
        Ok(()) => return Ok(Some(header_ident(ip_header))),
        Err(WireError::IcrcMismatch { computed, on_wire }) => computed ^ on_wire,
        Err(e) => return Err(e),
    };
    let reference = header_ident(ip_header);
    Ok(solver
        .basis(roce_with_icrc.len())
        .solve_from(reference, computed))
}

/// The Identification and DF flag of a (length-checked) IPv4 header.
fn header_ident(ip_header: &[u8]) -> Ipv4Ident {
    let id: [u8; 2] = field::get(ip_header, 4);
    let flags: [u8; 1] = field::get(ip_header, 6);
    Ipv4Ident {
        identification: u16::from_be_bytes(id),
        dont_fragment: flags[0] & DF_BIT != 0,
    }
}

/// A basis with no rows: solves only syndrome 0 (never used; keeps lookups panic-free).
const EMPTY_BASIS: IdentBasis = IdentBasis {
    roce_len: 0,
    columns: [0; COLUMNS],
    rows: [(0, 0, 0); COLUMNS],
    rank: 0,
};

#[cfg(test)]
#[path = "tests/icrc_ident.rs"]
mod tests;
