//! AETH: the 4-byte ACK Extended Transport Header of acknowledgements and RDMA READ
//! responses (roce-spec.md §1.3, §1.4).
//!
//! ```text
//! byte  0     Syndrome: bit 7 reserved (0); bits 6:5 class; bits 4:0 value
//!               00 ACK      value = credit count code (0x1F: no credit information)
//!               01 RNR NAK  value = RNR timer code
//!               10 reserved
//!               11 NAK      value = NAK code (0 PSN sequence error … 4 invalid RD request)
//! bytes 1-3   MSN (24)
//! ```

use core::fmt;

use crate::error::{check_len, field, HeaderKind, WireError};
use crate::psn::PSN_MASK;

/// Length of the AETH in bytes.
pub const LEN: usize = 4;

mod offset {
    pub const SYNDROME: usize = 0;
    pub const MSN: usize = 1;
}

/// The credit code meaning "no credit information / no end-to-end flow control"; rxe
/// sends every ACK with it.
pub const CREDIT_INVALID: u8 = 0x1f;

const CLASS_MASK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1f;
const CLASS_ACK: u8 = 0x00;
const CLASS_RNR: u8 = 0x20;
const CLASS_NAK: u8 = 0x60;
const RESERVED_BIT: u8 = 0x80;

/// NAK codes (syndrome 0x60 | code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (the requester retransmits from the NAKed PSN).
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// 5-31: reserved codes, kept so that they can be logged. Only 5..=31 are valid here;
    /// other values are rejected by [`Syndrome::validate`].
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c,
        }
    }

    /// From the low 5 bits of `code`.
    pub const fn from_code(code: u8) -> NakCode {
        match code & VALUE_MASK {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NakCode::PsnSequenceError => f.write_str("PSN sequence error"),
            NakCode::InvalidRequest => f.write_str("invalid request"),
            NakCode::RemoteAccessError => f.write_str("remote access error"),
            NakCode::RemoteOperationalError => f.write_str("remote operational error"),
            NakCode::InvalidRdRequest => f.write_str("invalid RD request"),
            NakCode::Reserved(c) => write!(f, "reserved NAK code {c}"),
        }
    }
}

/// The AETH syndrome byte, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with a 5-bit credit count code
    /// ([`CREDIT_INVALID`] = no credit information; see [`credit_count`]).
    Ack {
        /// Credit count code (0..=0x1F).
        credit: u8,
    },
    /// Receiver-not-ready NAK with a 5-bit RNR timer code (see [`rnr_timer_micros`]).
    RnrNak {
        /// RNR timer code (0..=0x1F).
        timer: u8,
    },
    /// NAK.
    Nak(NakCode),
}

impl Syndrome {
    /// ACK without credit information (syndrome 0x1F), what rxe sends.
    pub const ACK_NO_CREDIT: Syndrome = Syndrome::Ack {
        credit: CREDIT_INVALID,
    };

    /// Decodes a syndrome byte. Bit 7 set, or the reserved class 0x40-0x5F, is
    /// `InvalidField { header: Aeth, field: "syndrome", .. }`.
    pub const fn from_byte(byte: u8) -> Result<Syndrome, WireError> {
        if byte & RESERVED_BIT != 0 {
            return Err(WireError::InvalidField {
                header: HeaderKind::Aeth,
                field: "syndrome",
                value: byte as u64,
            });
        }
        let value = byte & VALUE_MASK;
        match byte & CLASS_MASK {
            CLASS_ACK => Ok(Syndrome::Ack { credit: value }),
            CLASS_RNR => Ok(Syndrome::RnrNak { timer: value }),
            CLASS_NAK => Ok(Syndrome::Nak(NakCode::from_code(value))),
            // 0x40: the reserved class.
            _ => Err(WireError::InvalidField {
                header: HeaderKind::Aeth,
                field: "syndrome",
                value: byte as u64,
            }),
        }
    }

    /// Encodes the syndrome byte. Values wider than 5 bits are masked to 5 bits; use
    /// [`Syndrome::validate`] to reject them instead.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit } => CLASS_ACK | (credit & VALUE_MASK),
            Syndrome::RnrNak { timer } => CLASS_RNR | (timer & VALUE_MASK),
            Syndrome::Nak(code) => CLASS_NAK | (code.code() & VALUE_MASK),
        }
    }

    /// `InvalidField` unless the syndrome encodes losslessly: credit and timer codes in
    /// 0..=0x1F, `NakCode::Reserved` only for 5..=31.
    pub const fn validate(self) -> Result<(), WireError> {
        let (ok, value) = match self {
            Syndrome::Ack { credit } => (credit <= VALUE_MASK, credit),
            Syndrome::RnrNak { timer } => (timer <= VALUE_MASK, timer),
            Syndrome::Nak(NakCode::Reserved(c)) => (c >= 5 && c <= VALUE_MASK, c),
            Syndrome::Nak(_) => (true, 0),
        };
        if ok {
            Ok(())
        } else {
            Err(WireError::InvalidField {
                header: HeaderKind::Aeth,
                field: "syndrome",
                value: value as u64,
            })
        }
    }

    /// True for [`Syndrome::Ack`].
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack { credit } => write!(f, "ACK credit={credit}"),
            Syndrome::RnrNak { timer } => write!(f, "RNR-NAK timer={timer}"),
            Syndrome::Nak(code) => write!(f, "NAK {code}"),
        }
    }
}

/// Credits granted by an ACK credit count code (IBA table, roce-spec.md §1.4):
/// `Some(n)` for codes 0..=30, `None` for [`CREDIT_INVALID`] (no flow control) and for
/// values wider than 5 bits.
pub const fn credit_count(code: u8) -> Option<u32> {
    const CREDITS: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    if (code as usize) < CREDITS.len() {
        // invariant: the index was just checked against the table length.
        Some(CREDITS[code as usize])
    } else {
        None
    }
}

/// The RNR NAK delay, in microseconds, of a 5-bit RNR timer code (IBA values, roce-spec.md
/// §1.4: code 0 is the longest, 655.36 ms; code 25 is 61.44 ms). Only the low 5 bits of
/// `code` are used.
pub const fn rnr_timer_micros(code: u8) -> u64 {
    const MICROS: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    // invariant: a 5-bit index is always inside the 32-entry table.
    MICROS[(code & VALUE_MASK) as usize]
}

/// A read/write view of an AETH at the start of a buffer.
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

    /// Wraps `buffer` after checking that it holds a whole AETH.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let h = Header::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated { header: Aeth, .. }` if the buffer is shorter than [`LEN`].
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len(HeaderKind::Aeth, self.buffer.as_ref(), 0, LEN)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw syndrome byte.
    pub fn syndrome(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), offset::SYNDROME)
    }

    /// MSN (24 bits).
    pub fn msn(&self) -> u32 {
        field::u24_at(self.buffer.as_ref(), offset::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets the raw syndrome byte.
    pub fn set_syndrome(&mut self, value: u8) {
        field::set_u8(self.buffer.as_mut(), offset::SYNDROME, value);
    }

    /// Sets the MSN from the low 24 bits of `value`.
    pub fn set_msn(&mut self, value: u32) {
        field::set_u24(self.buffer.as_mut(), offset::MSN, value);
    }
}

/// A parsed AETH. `emit` masks the syndrome values to 5 bits and the MSN to 24 bits;
/// [`Repr::validate`] rejects values that would not survive that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Repr {
    /// Parses an AETH view: `Truncated` if short, `InvalidField` for a reserved syndrome.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &Header<&T>) -> Result<Repr, WireError> {
        header.check_len()?;
        Ok(Repr {
            syndrome: Syndrome::from_byte(header.syndrome())?,
            msn: header.msn(),
        })
    }

    /// `InvalidField` for a syndrome that does not encode losslessly or an MSN wider
    /// than 24 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        self.syndrome.validate()?;
        if self.msn > PSN_MASK {
            return Err(WireError::InvalidField {
                header: HeaderKind::Aeth,
                field: "msn",
                value: u64::from(self.msn),
            });
        }
        Ok(())
    }

    /// Writes all 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut Header<&mut T>) {
        header.set_syndrome(self.syndrome.to_byte());
        header.set_msn(self.msn);
    }

    /// Bytes [`Repr::emit`] writes: [`LEN`].
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AETH of the IPv6 test vector of roce-spec.md §2.2: ACK syndrome 0x1F, MSN 7.
    const SPEC_ACK: [u8; LEN] = [0x1f, 0x00, 0x00, 0x07];

    #[test]
    fn parse_spec_vector() {
        let h = Header::new_checked(&SPEC_ACK[..]).unwrap();
        assert_eq!(
            Repr::parse(&h).unwrap(),
            Repr {
                syndrome: Syndrome::Ack { credit: 0x1f },
                msn: 7
            }
        );
        assert_eq!(Syndrome::ACK_NO_CREDIT.to_byte(), 0x1f);
    }

    #[test]
    fn parse_each_class_by_hand() {
        let cases: [([u8; 4], Syndrome, u32); 6] = [
            (
                [0x00, 0x12, 0x34, 0x56],
                Syndrome::Ack { credit: 0 },
                0x12_3456,
            ),
            (
                [0x2e, 0xff, 0xff, 0xff],
                Syndrome::RnrNak { timer: 14 },
                0xff_ffff,
            ),
            (
                [0x60, 0x00, 0x00, 0x01],
                Syndrome::Nak(NakCode::PsnSequenceError),
                1,
            ),
            (
                [0x62, 0x00, 0x00, 0x02],
                Syndrome::Nak(NakCode::RemoteAccessError),
                2,
            ),
            (
                [0x64, 0x00, 0x00, 0x03],
                Syndrome::Nak(NakCode::InvalidRdRequest),
                3,
            ),
            (
                [0x7f, 0x00, 0x01, 0x00],
                Syndrome::Nak(NakCode::Reserved(31)),
                0x100,
            ),
        ];
        for (bytes, syndrome, msn) in cases {
            let h = Header::new_checked(&bytes[..]).unwrap();
            assert_eq!(
                Repr::parse(&h).unwrap(),
                Repr { syndrome, msn },
                "{bytes:02x?}"
            );
            let mut out = [0u8; LEN];
            Repr { syndrome, msn }.emit(&mut Header::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn syndrome_bytes_for_every_value() {
        // From the §1.4 table: 0x00-0x1F ACK, 0x20-0x3F RNR, 0x40-0x5F reserved,
        // 0x60-0x7F NAK (0x60..0x64 named), bit 7 reserved.
        for b in 0u8..=0xff {
            let got = Syndrome::from_byte(b);
            let expect = if b >= 0x80 || (0x40..0x60).contains(&b) {
                Err(WireError::InvalidField {
                    header: HeaderKind::Aeth,
                    field: "syndrome",
                    value: u64::from(b),
                })
            } else if b < 0x20 {
                Ok(Syndrome::Ack { credit: b })
            } else if b < 0x40 {
                Ok(Syndrome::RnrNak { timer: b - 0x20 })
            } else {
                Ok(Syndrome::Nak(match b {
                    0x60 => NakCode::PsnSequenceError,
                    0x61 => NakCode::InvalidRequest,
                    0x62 => NakCode::RemoteAccessError,
                    0x63 => NakCode::RemoteOperationalError,
                    0x64 => NakCode::InvalidRdRequest,
                    _ => NakCode::Reserved(b - 0x60),
                }))
            };
            assert_eq!(got, expect, "syndrome {b:#04x}");
            if let Ok(s) = got {
                assert_eq!(s.to_byte(), b);
                assert!(s.validate().is_ok());
            }
        }
    }

    #[test]
    fn validate_rejects_lossy_syndromes_and_wide_msn() {
        for bad in [
            Syndrome::Ack { credit: 0x20 },
            Syndrome::RnrNak { timer: 0xff },
            Syndrome::Nak(NakCode::Reserved(2)),
            Syndrome::Nak(NakCode::Reserved(32)),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let r = Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 0x0100_0000,
        };
        assert_eq!(
            r.validate(),
            Err(WireError::InvalidField {
                header: HeaderKind::Aeth,
                field: "msn",
                value: 0x0100_0000
            })
        );
    }

    /// Parses "a→b, c→d, …" (the notation of roce-spec.md §1.4).
    fn spec_pairs(text: &str) -> Vec<(u8, &str)> {
        text.split(", ")
            .map(|pair| {
                let (k, v) = pair.split_once('→').unwrap();
                (k.trim().parse().unwrap(), v.trim())
            })
            .collect()
    }

    /// "655.36" (ms) → 655360 (µs), without floating point.
    fn ms_to_micros(ms: &str) -> u64 {
        let (int, frac) = ms.split_once('.').unwrap_or((ms, ""));
        let frac_micros = format!("{frac:0<3}");
        int.parse::<u64>().unwrap() * 1000 + frac_micros.parse::<u64>().unwrap()
    }

    #[test]
    fn credit_table_matches_spec_text() {
        // Verbatim from roce-spec.md §1.4.
        let spec = "0→0, 1→1, 2→2, 3→3, 4→4, 5→6, 6→8, 7→12, 8→16, 9→24, 10→32, 11→48, \
                    12→64, 13→96, 14→128, 15→192, 16→256, 17→384, 18→512, 19→768, 20→1024, \
                    21→1536, 22→2048, 23→3072, 24→4096, 25→6144, 26→8192, 27→12288, \
                    28→16384, 29→24576, 30→32768";
        let pairs = spec_pairs(spec);
        assert_eq!(pairs.len(), 31);
        for (code, credits) in pairs {
            assert_eq!(
                credit_count(code),
                Some(credits.parse().unwrap()),
                "code {code}"
            );
        }
        assert_eq!(credit_count(CREDIT_INVALID), None);
        assert_eq!(credit_count(0x20), None);
        assert_eq!(credit_count(0xff), None);
    }

    #[test]
    fn rnr_table_matches_spec_text() {
        // Verbatim from roce-spec.md §1.4 (milliseconds).
        let spec = "0→655.36, 1→0.01, 2→0.02, 3→0.03, 4→0.04, 5→0.06, 6→0.08, 7→0.12, \
                    8→0.16, 9→0.24, 10→0.32, 11→0.48, 12→0.64, 13→0.96, 14→1.28, 15→1.92, \
                    16→2.56, 17→3.84, 18→5.12, 19→7.68, 20→10.24, 21→15.36, 22→20.48, \
                    23→30.72, 24→40.96, 25→61.44, 26→81.92, 27→122.88, 28→163.84, \
                    29→245.76, 30→327.68, 31→491.52";
        let pairs = spec_pairs(spec);
        assert_eq!(pairs.len(), 32);
        for (code, ms) in pairs {
            assert_eq!(rnr_timer_micros(code), ms_to_micros(ms), "code {code}");
            assert_eq!(rnr_timer_micros(code | 0xe0), ms_to_micros(ms));
        }
    }

    #[test]
    fn every_short_length_is_truncated() {
        for len in 0..LEN {
            let err = WireError::Truncated {
                header: HeaderKind::Aeth,
                offset: 0,
                needed: LEN,
                available: len,
            };
            assert_eq!(Header::new_checked(&SPEC_ACK[..len]).unwrap_err(), err);
            assert_eq!(
                Repr::parse(&Header::new_unchecked(&SPEC_ACK[..len])),
                Err(err)
            );
        }
    }

    #[test]
    fn setters_write_raw_fields() {
        let mut buf = [0u8; LEN];
        let mut h = Header::new_unchecked(&mut buf[..]);
        h.set_syndrome(0x61);
        h.set_msn(0xab_cdef);
        assert_eq!(buf, [0x61, 0xab, 0xcd, 0xef]);
    }
}
