//! The BTH opcode table: which headers, payload and message position each opcode has
//! (IBA Vol 1 §9.2, OpCode field; Annex A14 for XRC).
//!
//! [`OPCODE_TABLE`] is plain data, one [`OpcodeInfo`] row per opcode; [`info`] looks an
//! opcode up in O(1). Everything else (which headers a packet carries, whether it may
//! carry payload, whether an opcode is valid on a QP type, which opcode a sender uses for
//! a segment) is derived from the table, so there is one place to read and test.
//!
//! Not in the table: the RD opcodes 0x40-0x55 (no current stack uses RD, and there is no
//! RDETH here), the reserved op codes 0x15/0x18-0x1B, and vendor opcodes; [`info`]
//! returns `None` for them.

use core::fmt;

use bitflags::bitflags;

use crate::error::HeaderKind;
use crate::{aeth, atomic_ack_eth, atomic_eth, deth, feth, ieth, immdt, reth, xrceth};

/// The transport service, from the top three bits of the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Transport {
    /// Reliable Connected (prefix 0x00).
    Rc = 0x00,
    /// Unreliable Connected (prefix 0x20).
    Uc = 0x20,
    /// Reliable Datagram (prefix 0x40; not implemented).
    Rd = 0x40,
    /// Unreliable Datagram (prefix 0x60).
    Ud = 0x60,
    /// Congestion notification (prefix 0x80).
    Cnp = 0x80,
    /// Extended Reliable Connected (prefix 0xA0).
    Xrc = 0xA0,
    /// Manufacturer specific (prefix 0xE0).
    Vendor = 0xE0,
}

impl Transport {
    /// Mask of the transport bits of an opcode.
    pub const MASK: u8 = 0xE0;

    /// The transport of `opcode` (`opcode & 0xE0`); `None` for the unassigned prefix 0xC0.
    pub const fn of(opcode: u8) -> Option<Transport> {
        match opcode & Self::MASK {
            0x00 => Some(Transport::Rc),
            0x20 => Some(Transport::Uc),
            0x40 => Some(Transport::Rd),
            0x60 => Some(Transport::Ud),
            0x80 => Some(Transport::Cnp),
            0xA0 => Some(Transport::Xrc),
            0xE0 => Some(Transport::Vendor),
            _ => None,
        }
    }

    /// The opcode prefix (the enum value).
    pub const fn prefix(self) -> u8 {
        self as u8
    }

    /// Short upper-case name ("RC", "UD", …).
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
            Transport::Vendor => "VENDOR",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

bitflags! {
    /// A set of extension headers after the BTH. The bits are declared in wire order, so
    /// iterating a set ([`HeaderSet::header_order`]) yields the headers in the order
    /// they follow each other on the wire.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct HeaderSet: u16 {
        /// XRC extended transport header (XRC requests).
        const XRCETH = 1 << 0;
        /// Datagram extended transport header (UD).
        const DETH = 1 << 1;
        /// Flush extended transport header (FLUSH).
        const FETH = 1 << 2;
        /// RDMA extended transport header.
        const RETH = 1 << 3;
        /// ACK extended transport header.
        const AETH = 1 << 4;
        /// Atomic extended transport header.
        const ATOMIC_ETH = 1 << 5;
        /// Atomic ACK extended transport header.
        const ATOMIC_ACK_ETH = 1 << 6;
        /// Immediate data.
        const IMMDT = 1 << 7;
        /// Invalidate extended transport header.
        const IETH = 1 << 8;
    }
}

impl HeaderSet {
    /// Every header, in wire order.
    pub const WIRE_ORDER: [HeaderSet; 9] = [
        HeaderSet::XRCETH,
        HeaderSet::DETH,
        HeaderSet::FETH,
        HeaderSet::RETH,
        HeaderSet::AETH,
        HeaderSet::ATOMIC_ETH,
        HeaderSet::ATOMIC_ACK_ETH,
        HeaderSet::IMMDT,
        HeaderSet::IETH,
    ];

    /// The headers of this set one by one, in wire order.
    pub fn header_order(self) -> impl Iterator<Item = HeaderSet> {
        HeaderSet::WIRE_ORDER
            .into_iter()
            .filter(move |h| self.contains(*h))
    }

    /// Total length in bytes of the headers in this set.
    pub const fn wire_len(self) -> usize {
        let mut len = 0;
        let mut i = 0;
        while i < HeaderSet::WIRE_ORDER.len() {
            // invariant: i < WIRE_ORDER.len() (loop condition).
            let h = HeaderSet::WIRE_ORDER[i];
            if self.contains(h) {
                len += h.single_len();
            }
            i += 1;
        }
        len
    }

    /// Length of a single-header set (0 for the empty set; for several headers use
    /// [`HeaderSet::wire_len`]).
    const fn single_len(self) -> usize {
        match self.bits() {
            b if b == HeaderSet::XRCETH.bits() => xrceth::LEN,
            b if b == HeaderSet::DETH.bits() => deth::LEN,
            b if b == HeaderSet::FETH.bits() => feth::LEN,
            b if b == HeaderSet::RETH.bits() => reth::LEN,
            b if b == HeaderSet::AETH.bits() => aeth::LEN,
            b if b == HeaderSet::ATOMIC_ETH.bits() => atomic_eth::LEN,
            b if b == HeaderSet::ATOMIC_ACK_ETH.bits() => atomic_ack_eth::LEN,
            b if b == HeaderSet::IMMDT.bits() => immdt::LEN,
            b if b == HeaderSet::IETH.bits() => ieth::LEN,
            _ => 0,
        }
    }

    /// The [`HeaderKind`] of a single-header set; `None` for the empty set and
    /// multi-header sets.
    pub const fn kind(self) -> Option<HeaderKind> {
        match self.bits() {
            b if b == HeaderSet::XRCETH.bits() => Some(HeaderKind::XrcEth),
            b if b == HeaderSet::DETH.bits() => Some(HeaderKind::Deth),
            b if b == HeaderSet::FETH.bits() => Some(HeaderKind::Feth),
            b if b == HeaderSet::RETH.bits() => Some(HeaderKind::Reth),
            b if b == HeaderSet::AETH.bits() => Some(HeaderKind::Aeth),
            b if b == HeaderSet::ATOMIC_ETH.bits() => Some(HeaderKind::AtomicEth),
            b if b == HeaderSet::ATOMIC_ACK_ETH.bits() => Some(HeaderKind::AtomicAckEth),
            b if b == HeaderSet::IMMDT.bits() => Some(HeaderKind::ImmDt),
            b if b == HeaderSet::IETH.bits() => Some(HeaderKind::Ieth),
            _ => None,
        }
    }
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message (S flag).
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message (E flag).
    Last,
    /// The whole message in one packet (S and E flags).
    Only,
}

impl Position {
    /// S flag: the packet starts a message (first or only).
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// E flag: the packet ends a message (last or only).
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }

    /// The position with these S and E flags.
    pub const fn from_flags(start: bool, end: bool) -> Position {
        match (start, end) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, true) => Position::Last,
            (false, false) => Position::Middle,
        }
    }
}

/// The operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (with or without immediate / invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// ACK / NAK.
    Acknowledge,
    /// Atomic ACK.
    AtomicAcknowledge,
    /// Atomic compare-and-swap.
    CompareSwap,
    /// Atomic fetch-and-add.
    FetchAdd,
    /// FLUSH (IBA 1.5).
    Flush,
    /// ATOMIC WRITE (IBA 1.5).
    AtomicWrite,
    /// Congestion notification packet.
    Cnp,
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// The BTH opcode.
    pub opcode: u8,
    /// IBTA name without the transport prefix, e.g. `"SEND_ONLY"`.
    pub name: &'static str,
    /// Transport (the opcode's top three bits).
    pub transport: Transport,
    /// Operation.
    pub operation: Operation,
    /// Extension headers after the BTH (wire order: [`HeaderSet::header_order`]).
    pub headers: HeaderSet,
    /// Whether the packet may carry payload.
    pub payload: bool,
    /// Position in the message (the S and E flags).
    pub position: Position,
    /// Carries immediate data (ImmDt).
    pub with_imm: bool,
    /// Carries an R_Key to invalidate (IETH).
    pub with_inv: bool,
    /// C flag: the packet generates a receive completion at the responder.
    pub completes_recv: bool,
    /// R flag: the packet consumes a receive WQE at the responder.
    pub consumes_rwqe: bool,
    /// A request (sent by the requester) rather than a response/ACK (or CNP).
    pub is_request: bool,
    /// `Some(n)`: the payload must be exactly `n` bytes (ATOMIC_WRITE: 8; CNP: its 16
    /// reserved bytes).
    pub exact_payload: Option<usize>,
}

impl OpcodeInfo {
    /// Length of the extension headers after the BTH.
    pub const fn header_len(&self) -> usize {
        self.headers.wire_len()
    }

    /// Whether this opcode may be received on (or sent by) a QP of `transport`.
    pub const fn valid_for(&self, transport: Transport) -> bool {
        self.transport as u8 == transport as u8
    }

    /// S flag: first or only packet of a message.
    pub const fn starts_message(&self) -> bool {
        self.position.starts()
    }

    /// E flag: last or only packet of a message.
    pub const fn ends_message(&self) -> bool {
        self.position.ends()
    }
}

impl fmt::Display for OpcodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.transport, self.name)
    }
}

/// Named opcode values (IBTA names as in IBA Vol 1 §9.2, with the transport prefix).
pub mod op {
    #![allow(missing_docs)] // the names are the documentation
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_LAST_WITH_IMM: u8 = 0x03;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_SEND_ONLY_WITH_IMM: u8 = 0x05;
    pub const RC_RDMA_WRITE_FIRST: u8 = 0x06;
    pub const RC_RDMA_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_RDMA_WRITE_LAST: u8 = 0x08;
    pub const RC_RDMA_WRITE_LAST_WITH_IMM: u8 = 0x09;
    pub const RC_RDMA_WRITE_ONLY: u8 = 0x0A;
    pub const RC_RDMA_WRITE_ONLY_WITH_IMM: u8 = 0x0B;
    pub const RC_RDMA_READ_REQUEST: u8 = 0x0C;
    pub const RC_RDMA_READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const RC_RDMA_READ_RESPONSE_LAST: u8 = 0x0F;
    pub const RC_RDMA_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const RC_ACKNOWLEDGE: u8 = 0x11;
    pub const RC_ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const RC_COMPARE_SWAP: u8 = 0x13;
    pub const RC_FETCH_ADD: u8 = 0x14;
    pub const RC_SEND_LAST_WITH_INVALIDATE: u8 = 0x16;
    pub const RC_SEND_ONLY_WITH_INVALIDATE: u8 = 0x17;
    pub const RC_FLUSH: u8 = 0x1C;
    pub const RC_ATOMIC_WRITE: u8 = 0x1D;

    pub const UC_SEND_FIRST: u8 = 0x20;
    pub const UC_SEND_MIDDLE: u8 = 0x21;
    pub const UC_SEND_LAST: u8 = 0x22;
    pub const UC_SEND_LAST_WITH_IMM: u8 = 0x23;
    pub const UC_SEND_ONLY: u8 = 0x24;
    pub const UC_SEND_ONLY_WITH_IMM: u8 = 0x25;
    pub const UC_RDMA_WRITE_FIRST: u8 = 0x26;
    pub const UC_RDMA_WRITE_MIDDLE: u8 = 0x27;
    pub const UC_RDMA_WRITE_LAST: u8 = 0x28;
    pub const UC_RDMA_WRITE_LAST_WITH_IMM: u8 = 0x29;
    pub const UC_RDMA_WRITE_ONLY: u8 = 0x2A;
    pub const UC_RDMA_WRITE_ONLY_WITH_IMM: u8 = 0x2B;

    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_WITH_IMM: u8 = 0x65;

    pub const CNP: u8 = 0x81;

    pub const XRC_SEND_FIRST: u8 = 0xA0;
    pub const XRC_SEND_MIDDLE: u8 = 0xA1;
    pub const XRC_SEND_LAST: u8 = 0xA2;
    pub const XRC_SEND_LAST_WITH_IMM: u8 = 0xA3;
    pub const XRC_SEND_ONLY: u8 = 0xA4;
    pub const XRC_SEND_ONLY_WITH_IMM: u8 = 0xA5;
    pub const XRC_RDMA_WRITE_FIRST: u8 = 0xA6;
    pub const XRC_RDMA_WRITE_MIDDLE: u8 = 0xA7;
    pub const XRC_RDMA_WRITE_LAST: u8 = 0xA8;
    pub const XRC_RDMA_WRITE_LAST_WITH_IMM: u8 = 0xA9;
    pub const XRC_RDMA_WRITE_ONLY: u8 = 0xAA;
    pub const XRC_RDMA_WRITE_ONLY_WITH_IMM: u8 = 0xAB;
    pub const XRC_RDMA_READ_REQUEST: u8 = 0xAC;
    pub const XRC_RDMA_READ_RESPONSE_FIRST: u8 = 0xAD;
    pub const XRC_RDMA_READ_RESPONSE_MIDDLE: u8 = 0xAE;
    pub const XRC_RDMA_READ_RESPONSE_LAST: u8 = 0xAF;
    pub const XRC_RDMA_READ_RESPONSE_ONLY: u8 = 0xB0;
    pub const XRC_ACKNOWLEDGE: u8 = 0xB1;
    pub const XRC_ATOMIC_ACKNOWLEDGE: u8 = 0xB2;
    pub const XRC_COMPARE_SWAP: u8 = 0xB3;
    pub const XRC_FETCH_ADD: u8 = 0xB4;
    pub const XRC_SEND_LAST_WITH_INVALIDATE: u8 = 0xB6;
    pub const XRC_SEND_ONLY_WITH_INVALIDATE: u8 = 0xB7;
}

// ---- the table -------------------------------------------------------------------------

const NONE: HeaderSet = HeaderSet::empty();
const X: HeaderSet = HeaderSet::XRCETH;
const D: HeaderSet = HeaderSet::DETH;
const F: HeaderSet = HeaderSet::FETH;
const RE: HeaderSet = HeaderSet::RETH;
const A: HeaderSet = HeaderSet::AETH;
const AT: HeaderSet = HeaderSet::ATOMIC_ETH;
const AA: HeaderSet = HeaderSet::ATOMIC_ACK_ETH;
const I: HeaderSet = HeaderSet::IMMDT;
const IE: HeaderSet = HeaderSet::IETH;

/// Payload allowed.
const PAY: bool = true;
/// No payload.
const NOPAY: bool = false;
/// C flag (receive completion).
const C: u8 = 1;
/// R flag (consumes a receive WQE).
const R: u8 = 2;

/// Builds one row; transport, with_imm, with_inv and is_request follow from the
/// other columns.
const fn row(
    opcode: u8,
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: HeaderSet,
    payload: bool,
    cr: u8,
) -> OpcodeInfo {
    let transport = match Transport::of(opcode) {
        Some(t) => t,
        // invariant: `row` is only evaluated in the const table at compile time, so packet
        // bytes never reach this; a typo in the table fails the build.
        None => panic!("opcode with an unassigned transport prefix in OPCODE_TABLE"), // invariant
    };
    let is_request = !matches!(
        operation,
        Operation::RdmaReadResponse
            | Operation::Acknowledge
            | Operation::AtomicAcknowledge
            | Operation::Cnp
    );
    let exact_payload = match operation {
        Operation::AtomicWrite => Some(8),
        Operation::Cnp => Some(16),
        _ => None,
    };
    OpcodeInfo {
        opcode,
        name,
        transport,
        operation,
        headers,
        payload,
        position,
        with_imm: headers.contains(HeaderSet::IMMDT),
        with_inv: headers.contains(HeaderSet::IETH),
        completes_recv: cr & C != 0,
        consumes_rwqe: cr & R != 0,
        is_request,
        exact_payload,
    }
}

const fn u(a: HeaderSet, b: HeaderSet) -> HeaderSet {
    a.union(b)
}

use Operation::{
    AtomicAcknowledge as AtomAck, AtomicWrite as AtomWr, CompareSwap as Cmp, FetchAdd as Fadd,
    RdmaReadRequest as RdReq, RdmaReadResponse as RdResp, RdmaWrite as Wr,
};
use Position::{First, Last, Middle, Only};

#[rustfmt::skip]
const TABLE: [OpcodeInfo; 63] = [
    // RC
    row(0x00, "SEND_FIRST", Operation::Send, First, NONE, PAY, R),
    row(0x01, "SEND_MIDDLE", Operation::Send, Middle, NONE, PAY, 0),
    row(0x02, "SEND_LAST", Operation::Send, Last, NONE, PAY, C),
    row(0x03, "SEND_LAST_WITH_IMM", Operation::Send, Last, I, PAY, C),
    row(0x04, "SEND_ONLY", Operation::Send, Only, NONE, PAY, C | R),
    row(0x05, "SEND_ONLY_WITH_IMM", Operation::Send, Only, I, PAY, C | R),
    row(0x06, "RDMA_WRITE_FIRST", Wr, First, RE, PAY, 0),
    row(0x07, "RDMA_WRITE_MIDDLE", Wr, Middle, NONE, PAY, 0),
    row(0x08, "RDMA_WRITE_LAST", Wr, Last, NONE, PAY, 0),
    row(0x09, "RDMA_WRITE_LAST_WITH_IMM", Wr, Last, I, PAY, C | R),
    row(0x0A, "RDMA_WRITE_ONLY", Wr, Only, RE, PAY, 0),
    row(0x0B, "RDMA_WRITE_ONLY_WITH_IMM", Wr, Only, u(RE, I), PAY, C | R),
    row(0x0C, "RDMA_READ_REQUEST", RdReq, Only, RE, NOPAY, 0),
    row(0x0D, "RDMA_READ_RESPONSE_FIRST", RdResp, First, A, PAY, 0),
    row(0x0E, "RDMA_READ_RESPONSE_MIDDLE", RdResp, Middle, NONE, PAY, 0),
    row(0x0F, "RDMA_READ_RESPONSE_LAST", RdResp, Last, A, PAY, 0),
    row(0x10, "RDMA_READ_RESPONSE_ONLY", RdResp, Only, A, PAY, 0),
    row(0x11, "ACKNOWLEDGE", Operation::Acknowledge, Only, A, NOPAY, 0),
    row(0x12, "ATOMIC_ACKNOWLEDGE", AtomAck, Only, u(A, AA), NOPAY, 0),
    row(0x13, "COMPARE_SWAP", Cmp, Only, AT, NOPAY, 0),
    row(0x14, "FETCH_ADD", Fadd, Only, AT, NOPAY, 0),
    row(0x16, "SEND_LAST_WITH_INVALIDATE", Operation::Send, Last, IE, PAY, C),
    row(0x17, "SEND_ONLY_WITH_INVALIDATE", Operation::Send, Only, IE, PAY, C | R),
    row(0x1C, "FLUSH", Operation::Flush, Only, u(F, RE), NOPAY, 0),
    row(0x1D, "ATOMIC_WRITE", AtomWr, Only, RE, PAY, 0),
    // UC
    row(0x20, "SEND_FIRST", Operation::Send, First, NONE, PAY, R),
    row(0x21, "SEND_MIDDLE", Operation::Send, Middle, NONE, PAY, 0),
    row(0x22, "SEND_LAST", Operation::Send, Last, NONE, PAY, C),
    row(0x23, "SEND_LAST_WITH_IMM", Operation::Send, Last, I, PAY, C),
    row(0x24, "SEND_ONLY", Operation::Send, Only, NONE, PAY, C | R),
    row(0x25, "SEND_ONLY_WITH_IMM", Operation::Send, Only, I, PAY, C | R),
    row(0x26, "RDMA_WRITE_FIRST", Wr, First, RE, PAY, 0),
    row(0x27, "RDMA_WRITE_MIDDLE", Wr, Middle, NONE, PAY, 0),
    row(0x28, "RDMA_WRITE_LAST", Wr, Last, NONE, PAY, 0),
    row(0x29, "RDMA_WRITE_LAST_WITH_IMM", Wr, Last, I, PAY, C | R),
    row(0x2A, "RDMA_WRITE_ONLY", Wr, Only, RE, PAY, 0),
    row(0x2B, "RDMA_WRITE_ONLY_WITH_IMM", Wr, Only, u(RE, I), PAY, C | R),
    // UD
    row(0x64, "SEND_ONLY", Operation::Send, Only, D, PAY, C | R),
    row(0x65, "SEND_ONLY_WITH_IMM", Operation::Send, Only, u(D, I), PAY, C | R),
    // CNP (RoCEv2: BECN set, 16 reserved bytes after the BTH)
    row(0x81, "CNP", Operation::Cnp, Only, NONE, PAY, 0),
    // XRC (requests carry an XRCETH; responses 0xAD-0xB2 do not)
    row(0xA0, "SEND_FIRST", Operation::Send, First, X, PAY, R),
    row(0xA1, "SEND_MIDDLE", Operation::Send, Middle, X, PAY, 0),
    row(0xA2, "SEND_LAST", Operation::Send, Last, X, PAY, C),
    row(0xA3, "SEND_LAST_WITH_IMM", Operation::Send, Last, u(X, I), PAY, C),
    row(0xA4, "SEND_ONLY", Operation::Send, Only, X, PAY, C | R),
    row(0xA5, "SEND_ONLY_WITH_IMM", Operation::Send, Only, u(X, I), PAY, C | R),
    row(0xA6, "RDMA_WRITE_FIRST", Wr, First, u(X, RE), PAY, 0),
    row(0xA7, "RDMA_WRITE_MIDDLE", Wr, Middle, X, PAY, 0),
    row(0xA8, "RDMA_WRITE_LAST", Wr, Last, X, PAY, 0),
    row(0xA9, "RDMA_WRITE_LAST_WITH_IMM", Wr, Last, u(X, I), PAY, C | R),
    row(0xAA, "RDMA_WRITE_ONLY", Wr, Only, u(X, RE), PAY, 0),
    row(0xAB, "RDMA_WRITE_ONLY_WITH_IMM", Wr, Only, u(X, u(RE, I)), PAY, C | R),
    row(0xAC, "RDMA_READ_REQUEST", RdReq, Only, u(X, RE), NOPAY, 0),
    row(0xAD, "RDMA_READ_RESPONSE_FIRST", RdResp, First, A, PAY, 0),
    row(0xAE, "RDMA_READ_RESPONSE_MIDDLE", RdResp, Middle, NONE, PAY, 0),
    row(0xAF, "RDMA_READ_RESPONSE_LAST", RdResp, Last, A, PAY, 0),
    row(0xB0, "RDMA_READ_RESPONSE_ONLY", RdResp, Only, A, PAY, 0),
    row(0xB1, "ACKNOWLEDGE", Operation::Acknowledge, Only, A, NOPAY, 0),
    row(0xB2, "ATOMIC_ACKNOWLEDGE", AtomAck, Only, u(A, AA), NOPAY, 0),
    row(0xB3, "COMPARE_SWAP", Cmp, Only, u(X, AT), NOPAY, 0),
    row(0xB4, "FETCH_ADD", Fadd, Only, u(X, AT), NOPAY, 0),
    row(0xB6, "SEND_LAST_WITH_INVALIDATE", Operation::Send, Last, u(X, IE), PAY, C),
    row(0xB7, "SEND_ONLY_WITH_INVALIDATE", Operation::Send, Only, u(X, IE), PAY, C | R),
];

/// The opcode table: one row per opcode of IBA Vol 1 §9.2 (RC, UC, UD, XRC, plus
/// FLUSH, ATOMIC_WRITE and the RoCEv2 CNP), ordered by opcode value.
pub static OPCODE_TABLE: &[OpcodeInfo] = &TABLE;

/// Marks an opcode without a row in [`INDEX`].
const NO_ROW: u8 = u8::MAX;

/// `INDEX[opcode]` = row of `opcode` in [`TABLE`], or [`NO_ROW`].
const INDEX: [u8; 256] = build_index();

const fn build_index() -> [u8; 256] {
    let mut index = [NO_ROW; 256];
    let mut i = 0;
    while i < TABLE.len() {
        let op = TABLE[i].opcode as usize;
        // Evaluated at compile time only: a duplicated opcode fails the build.
        assert!(index[op] == NO_ROW, "duplicate opcode in OPCODE_TABLE");
        assert!(i < NO_ROW as usize, "OPCODE_TABLE too long for a u8 index");
        index[op] = i as u8;
        i += 1;
    }
    index
}

/// The table row of `opcode`, or `None` if the opcode is not in the table. O(1).
pub fn info(opcode: u8) -> Option<&'static OpcodeInfo> {
    // invariant: a u8 always indexes the 256-entry INDEX.
    let row = INDEX[usize::from(opcode)];
    OPCODE_TABLE.get(usize::from(row))
}

/// The opcode a sender uses for a packet of a message.
///
/// `with_imm` / `with_inv` describe the *message*; they select the opcode only for the
/// packet that ends it (`Last` / `Only`): a SEND-with-immediate of three packets is
/// `SEND_FIRST`, `SEND_MIDDLE`, `SEND_LAST_WITH_IMM`. `None` if the transport has no such
/// opcode (e.g. UD `First`, UC READ, RC WRITE-with-invalidate, or both flags set).
pub fn opcode_for(
    transport: Transport,
    operation: Operation,
    position: Position,
    with_imm: bool,
    with_inv: bool,
) -> Option<u8> {
    let (imm, inv) = if position.ends() {
        (with_imm, with_inv)
    } else {
        (false, false)
    };
    OPCODE_TABLE
        .iter()
        .find(|row| {
            row.transport == transport
                && row.operation == operation
                && row.position == position
                && row.with_imm == imm
                && row.with_inv == inv
        })
        .map(|row| row.opcode)
}

#[cfg(test)]
#[path = "tests/opcode.rs"]
mod tests;
