//! AETH: the 4-byte ACK Extended Transport Header of acknowledgements and RDMA READ
//! responses (IBA Vol 1 §9.3.5).
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

/// Credits granted by an ACK credit count code (IBA Vol 1 §9.3.5, §9.7):
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

/// The RNR NAK delay, in microseconds, of a 5-bit RNR timer code (IBA Vol 1 §9.7:
/// code 0 is the longest, 655.36 ms; code 25 is 61.44 ms). Only the low 5 bits of
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
#[path = "tests/aeth.rs"]
mod tests;
