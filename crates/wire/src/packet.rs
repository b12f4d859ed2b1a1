//! A whole RoCEv2 transport packet: BTH, the extension headers its opcode calls for,
//! payload, pad and ICRC (the UDP payload of a RoCEv2 datagram; IBA Vol 1 ch. 9,
//! Annex A17), plus the message segmenter senders use to cut a message into packets.
//!
//! [`PacketRepr::parse`] and [`PacketRepr::emit`] check the packet against the opcode
//! table ([`crate::opcode`]); neither computes the ICRC, which covers the IP and UDP
//! headers too: [`crate::icrc`] seals an emitted packet and verifies a received one.
//!
//! ```
//! use uroce_wire::{bth, packet::PacketRepr, opcode::op, Psn};
//!
//! let repr = PacketRepr::new(
//!     bth::Repr {
//!         opcode: op::RC_SEND_ONLY, solicited: false, mig_req: false, pad_cnt: 0,
//!         pkey: 0xffff, fecn: false, becn: false, dest_qp: 0x11, ack_req: true,
//!         psn: Psn::new(100),
//!     },
//!     b"hello",
//! );
//! let mut buf = [0u8; 64];
//! let n = repr.emit(&mut buf)?;
//! assert_eq!(n, 12 + 5 + 3 + 4); // BTH + payload + pad + ICRC
//! let parsed = PacketRepr::parse(&buf[..n])?;
//! assert_eq!(parsed.payload, b"hello");
//! assert_eq!(parsed.bth.pad_cnt, 3);
//! assert_eq!(parsed.to_string(), "RC SEND_ONLY dqp=0x000011 psn=100 A pad=3 len=5");
//! # Ok::<(), uroce_wire::WireError>(())
//! ```

use core::fmt;
use core::iter::FusedIterator;

use crate::error::{HeaderKind, WireError};
use crate::opcode::{self, HeaderSet, OpcodeInfo, Position};
use crate::pmtu::Pmtu;
use crate::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, xrceth, ICRC_LEN,
};

/// The largest BTH..ICRC length [`PacketRepr::emit`] produces: what fits one IPv4 UDP
/// datagram (65535 − 20 − 8 = 65507 bytes), rounded down to a multiple of 4.
pub const MAX_ROCE_LEN: usize = 65_504;

/// A RoCEv2 packet from the BTH to the ICRC, as validated values.
///
/// Exactly the extension headers the opcode's table row lists are `Some`
/// ([`PacketRepr::parse`] guarantees it, [`PacketRepr::emit`] checks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// Base transport header. `emit` ignores `bth.pad_cnt` and derives it from the payload.
    pub bth: bth::Repr,
    /// XRC extended transport header (XRC requests).
    pub xrceth: Option<xrceth::Repr>,
    /// Datagram extended transport header (UD).
    pub deth: Option<deth::Repr>,
    /// FLUSH extended transport header (RC FLUSH, IBA 1.5).
    pub feth: Option<feth::Repr>,
    /// RDMA extended transport header.
    pub reth: Option<reth::Repr>,
    /// ACK extended transport header.
    pub aeth: Option<aeth::Repr>,
    /// Atomic extended transport header.
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// Atomic ACK extended transport header.
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    /// Immediate data.
    pub immdt: Option<immdt::Repr>,
    /// Invalidate extended transport header.
    pub ieth: Option<ieth::Repr>,
    /// Payload, without the pad bytes.
    pub payload: &'a [u8],
}

/// The bytes of `roce` from `offset` on, if at least `needed` of them are there; else
/// `Truncated` for `header` at `offset`.
fn header_at(
    roce: &[u8],
    offset: usize,
    header: HeaderKind,
    needed: usize,
) -> Result<&[u8], WireError> {
    let rest = roce.get(offset..).unwrap_or(&[]);
    if rest.len() < needed {
        Err(WireError::Truncated {
            header,
            offset,
            needed,
            available: rest.len(),
        })
    } else {
        Ok(rest)
    }
}

impl<'a> PacketRepr<'a> {
    /// A packet with `bth` and `payload` and no extension headers (fill them in with
    /// struct update syntax: `PacketRepr { reth: Some(r), ..PacketRepr::new(bth, &[]) }`).
    pub const fn new(bth: bth::Repr, payload: &'a [u8]) -> PacketRepr<'a> {
        PacketRepr {
            bth,
            xrceth: None,
            deth: None,
            feth: None,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload,
        }
    }

    /// Parses `roce`, the whole UDP payload of a RoCEv2 datagram (BTH … ICRC).
    ///
    /// Checks, in order: BTH length and TVer; opcode in the table (`UnknownOpcode`);
    /// each extension header of the opcode present in full
    /// (`Truncated` with its packet offset) and valid (e.g. a reserved AETH syndrome is
    /// `InvalidField`); room for the ICRC (`Truncated { header: Icrc, .. }`); total length
    /// a multiple of 4 (`BadLength`); no payload where the opcode allows none
    /// (`PayloadNotAllowed`); PadCnt not beyond the bytes after the headers
    /// (`PadBeyondPayload`); the exact payload length of ATOMIC_WRITE and CNP (`BadLength`).
    ///
    /// Not checked: the ICRC (see [`crate::icrc`]), that pad bytes are zero, P_Key, QPs
    /// and PSNs (transport checks belong to the protocol layer), PMTU
    /// ([`PacketRepr::check_pmtu`]).
    pub fn parse(roce: &'a [u8]) -> Result<PacketRepr<'a>, WireError> {
        let bth = bth::Repr::parse(&bth::Header::new_checked(roce)?)?;
        let info = opcode::info(bth.opcode).ok_or(WireError::UnknownOpcode(bth.opcode))?;
        let mut repr = PacketRepr::new(bth, &[]);
        let mut offset = bth::LEN;
        for header in info.headers.header_order() {
            if header == HeaderSet::XRCETH {
                let b = header_at(roce, offset, HeaderKind::XrcEth, xrceth::LEN)?;
                repr.xrceth = Some(xrceth::Repr::parse(&xrceth::Header::new_unchecked(b))?);
                offset += xrceth::LEN;
            } else if header == HeaderSet::DETH {
                let b = header_at(roce, offset, HeaderKind::Deth, deth::LEN)?;
                repr.deth = Some(deth::Repr::parse(&deth::Header::new_unchecked(b))?);
                offset += deth::LEN;
            } else if header == HeaderSet::FETH {
                let b = header_at(roce, offset, HeaderKind::Feth, feth::LEN)?;
                repr.feth = Some(feth::Repr::parse(&feth::Header::new_unchecked(b))?);
                offset += feth::LEN;
            } else if header == HeaderSet::RETH {
                let b = header_at(roce, offset, HeaderKind::Reth, reth::LEN)?;
                repr.reth = Some(reth::Repr::parse(&reth::Header::new_unchecked(b))?);
                offset += reth::LEN;
            } else if header == HeaderSet::AETH {
                let b = header_at(roce, offset, HeaderKind::Aeth, aeth::LEN)?;
                repr.aeth = Some(aeth::Repr::parse(&aeth::Header::new_unchecked(b))?);
                offset += aeth::LEN;
            } else if header == HeaderSet::ATOMIC_ETH {
                let b = header_at(roce, offset, HeaderKind::AtomicEth, atomic_eth::LEN)?;
                repr.atomic_eth = Some(atomic_eth::Repr::parse(
                    &atomic_eth::Header::new_unchecked(b),
                )?);
                offset += atomic_eth::LEN;
            } else if header == HeaderSet::ATOMIC_ACK_ETH {
                let b = header_at(roce, offset, HeaderKind::AtomicAckEth, atomic_ack_eth::LEN)?;
                repr.atomic_ack_eth = Some(atomic_ack_eth::Repr::parse(
                    &atomic_ack_eth::Header::new_unchecked(b),
                )?);
                offset += atomic_ack_eth::LEN;
            } else if header == HeaderSet::IMMDT {
                let b = header_at(roce, offset, HeaderKind::ImmDt, immdt::LEN)?;
                repr.immdt = Some(immdt::Repr::parse(&immdt::Header::new_unchecked(b))?);
                offset += immdt::LEN;
            } else if header == HeaderSet::IETH {
                let b = header_at(roce, offset, HeaderKind::Ieth, ieth::LEN)?;
                repr.ieth = Some(ieth::Repr::parse(&ieth::Header::new_unchecked(b))?);
                offset += ieth::LEN;
            } else {
                // invariant: header_order() yields single flags of WIRE_ORDER only, each
                // handled above, so this branch is never taken; were a header added to
                // the table without a branch here, its opcode would be refused.
                return Err(WireError::UnknownOpcode(bth.opcode));
            }
        }

        let after_headers = header_at(roce, offset, HeaderKind::Icrc, ICRC_LEN)?;
        if roce.len() % 4 != 0 {
            return Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "BTH..ICRC length mod 4",
                value: roce.len() % 4,
                expected: 0,
            });
        }
        // `header_at` guaranteed after_headers.len() >= ICRC_LEN.
        let padded = after_headers
            .get(..after_headers.len() - ICRC_LEN)
            .unwrap_or(&[]);
        if !info.payload && !padded.is_empty() {
            return Err(WireError::PayloadNotAllowed {
                opcode: bth.opcode,
                len: padded.len(),
            });
        }
        let pad = usize::from(bth.pad_cnt);
        let payload = padded
            .len()
            .checked_sub(pad)
            .and_then(|n| padded.get(..n))
            .ok_or(WireError::PadBeyondPayload {
                pad: bth.pad_cnt,
                payload: padded.len(),
            })?;
        if let Some(expected) = info.exact_payload {
            if payload.len() != expected {
                return Err(WireError::BadLength {
                    header: HeaderKind::Payload,
                    field: "payload length",
                    value: payload.len(),
                    expected,
                });
            }
        }
        repr.payload = payload;
        Ok(repr)
    }

    /// The opcode's table row; `None` if `bth.opcode` is not in the table (possible only
    /// for a hand-built repr: `parse` refuses unknown opcodes).
    pub fn info(&self) -> Option<&'static OpcodeInfo> {
        opcode::info(self.bth.opcode)
    }

    /// The extension headers this repr has (`Some`), whatever the opcode says.
    pub fn present_headers(&self) -> HeaderSet {
        let mut set = HeaderSet::empty();
        set.set(HeaderSet::XRCETH, self.xrceth.is_some());
        set.set(HeaderSet::DETH, self.deth.is_some());
        set.set(HeaderSet::FETH, self.feth.is_some());
        set.set(HeaderSet::RETH, self.reth.is_some());
        set.set(HeaderSet::AETH, self.aeth.is_some());
        set.set(HeaderSet::ATOMIC_ETH, self.atomic_eth.is_some());
        set.set(HeaderSet::ATOMIC_ACK_ETH, self.atomic_ack_eth.is_some());
        set.set(HeaderSet::IMMDT, self.immdt.is_some());
        set.set(HeaderSet::IETH, self.ieth.is_some());
        set
    }

    /// BTH plus the extension headers present.
    pub fn header_len(&self) -> usize {
        bth::LEN + self.present_headers().wire_len()
    }

    /// Pad bytes after the payload: `(-payload.len()) mod 4`.
    pub fn pad_len(&self) -> usize {
        self.payload.len().wrapping_neg() % 4
    }

    /// Bytes from the BTH to the end of the ICRC: headers + payload + pad + 4.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + self.pad_len() + ICRC_LEN
    }

    /// Checks that this repr can be emitted and parsed back unchanged; returns its table
    /// row. `emit` runs exactly these checks.
    ///
    /// Errors: `UnknownOpcode`; `HeaderMismatch` when the headers
    /// present differ from the opcode's; `PayloadNotAllowed`; `BadLength` for the exact
    /// payload of ATOMIC_WRITE / CNP; `InvalidField` for a 24-bit field (DestQP, SrcQP,
    /// SRQN, MSN) out of range, an FETH field wider than its bits, or an AETH syndrome
    /// that does not encode losslessly;
    /// `PayloadTooLarge` beyond [`MAX_ROCE_LEN`]. `bth.pad_cnt` is not checked (ignored).
    pub fn check(&self) -> Result<&'static OpcodeInfo, WireError> {
        let opcode = self.bth.opcode;
        let info = self.info().ok_or(WireError::UnknownOpcode(opcode))?;
        let present = self.present_headers();
        let kinds = [
            (HeaderSet::XRCETH, HeaderKind::XrcEth),
            (HeaderSet::DETH, HeaderKind::Deth),
            (HeaderSet::FETH, HeaderKind::Feth),
            (HeaderSet::RETH, HeaderKind::Reth),
            (HeaderSet::AETH, HeaderKind::Aeth),
            (HeaderSet::ATOMIC_ETH, HeaderKind::AtomicEth),
            (HeaderSet::ATOMIC_ACK_ETH, HeaderKind::AtomicAckEth),
            (HeaderSet::IMMDT, HeaderKind::ImmDt),
            (HeaderSet::IETH, HeaderKind::Ieth),
        ];
        for (flag, header) in kinds {
            let has = present.contains(flag);
            if has != info.headers.contains(flag) {
                return Err(WireError::HeaderMismatch {
                    opcode,
                    header,
                    present: has,
                });
            }
        }
        if !info.payload && !self.payload.is_empty() {
            return Err(WireError::PayloadNotAllowed {
                opcode,
                len: self.payload.len(),
            });
        }
        if let Some(expected) = info.exact_payload {
            if self.payload.len() != expected {
                return Err(WireError::BadLength {
                    header: HeaderKind::Payload,
                    field: "payload length",
                    value: self.payload.len(),
                    expected,
                });
            }
        }
        bth::Repr {
            pad_cnt: 0,
            ..self.bth
        }
        .validate()?;
        if let Some(x) = &self.xrceth {
            x.validate()?;
        }
        if let Some(d) = &self.deth {
            d.validate()?;
        }
        if let Some(f) = &self.feth {
            f.validate()?;
        }
        if let Some(a) = &self.aeth {
            a.validate()?;
        }
        let max = MAX_ROCE_LEN - self.header_len() - ICRC_LEN;
        if self.payload.len() > max {
            return Err(WireError::PayloadTooLarge {
                len: self.payload.len(),
                max,
            });
        }
        Ok(info)
    }

    /// Writes the packet into the start of `buf`: BTH (PadCnt derived from the payload
    /// length, `bth.pad_cnt` ignored), extension headers in wire order, payload, zero pad
    /// bytes and 4 zero ICRC bytes (seal it with [`crate::icrc`]). Returns the bytes
    /// written, [`PacketRepr::buffer_len`].
    ///
    /// Fails as [`PacketRepr::check`] does, or with `BufferTooSmall`; `buf` is untouched
    /// on error.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.check()?;
        let len = self.buffer_len();
        let available = buf.len();
        let out = buf.get_mut(..len).ok_or(WireError::BufferTooSmall {
            needed: len,
            available,
        })?;
        // From here on every range lies inside `out` (its length is buffer_len(), the
        // sum of what is written), so the `get_mut`s below always succeed (invariant).
        let pad = self.pad_len();
        let bth = bth::Repr {
            // invariant: pad_len() < 4.
            pad_cnt: pad as u8,
            ..self.bth
        };
        bth.emit(&mut bth::Header::new_unchecked(&mut *out));
        let mut offset = bth::LEN;
        macro_rules! put {
            ($field:expr, $module:ident) => {
                if let Some(r) = &$field {
                    if let Some(dst) = out.get_mut(offset..) {
                        r.emit(&mut $module::Header::new_unchecked(dst));
                    }
                    offset += $module::LEN;
                }
            };
        }
        // Wire order, as HeaderSet::WIRE_ORDER.
        put!(self.xrceth, xrceth);
        put!(self.deth, deth);
        put!(self.feth, feth);
        put!(self.reth, reth);
        put!(self.aeth, aeth);
        put!(self.atomic_eth, atomic_eth);
        put!(self.atomic_ack_eth, atomic_ack_eth);
        put!(self.immdt, immdt);
        put!(self.ieth, ieth);
        let payload_end = offset + self.payload.len();
        if let Some(dst) = out.get_mut(offset..payload_end) {
            dst.copy_from_slice(self.payload);
        }
        if let Some(tail) = out.get_mut(payload_end..) {
            tail.fill(0); // pad + ICRC placeholder
        }
        Ok(len)
    }

    /// Checks the payload length against the path MTU and the packet's position in its
    /// message (IBA Vol 1 §9.6, §9.7): FIRST and MIDDLE carry exactly `pmtu` bytes, LAST
    /// 1..=`pmtu`, ONLY 0..=`pmtu`. Opcodes without payload always pass. For UD pass the
    /// port MTU.
    ///
    /// Errors: `UnknownOpcode`; `PayloadTooLarge` above the MTU; `BadLength` for a short
    /// FIRST/MIDDLE or an empty LAST packet.
    pub fn check_pmtu(&self, pmtu: Pmtu) -> Result<(), WireError> {
        let info = self
            .info()
            .ok_or(WireError::UnknownOpcode(self.bth.opcode))?;
        if !info.payload {
            return Ok(());
        }
        let len = self.payload.len();
        let mtu = pmtu.bytes() as usize;
        if len > mtu {
            return Err(WireError::PayloadTooLarge { len, max: mtu });
        }
        match info.position {
            Position::First | Position::Middle if len != mtu => Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "payload length of a first/middle packet",
                value: len,
                expected: mtu,
            }),
            Position::Last if len == 0 => Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "payload length of a last packet",
                value: 0,
                expected: 1,
            }),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for PacketRepr<'_> {
    /// One tcpdump-like line, e.g.
    /// `RC SEND_ONLY dqp=0x000011 psn=100 A se pad=3 len=5`, then the extension headers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.bth;
        match self.info() {
            Some(info) => write!(f, "{info}")?,
            None => write!(f, "op={:#04x}", b.opcode)?,
        }
        write!(f, " dqp={:#08x} psn={}", b.dest_qp, b.psn)?;
        for (on, flag) in [
            (b.ack_req, " A"),
            (b.solicited, " se"),
            (b.mig_req, " M"),
            (b.fecn, " fecn"),
            (b.becn, " becn"),
        ] {
            if on {
                f.write_str(flag)?;
            }
        }
        if b.pkey != 0xffff {
            write!(f, " pkey={:#06x}", b.pkey)?;
        }
        write!(f, " pad={} len={}", self.pad_len(), self.payload.len())?;
        if let Some(x) = &self.xrceth {
            write!(f, " srqn={:#08x}", x.srqn)?;
        }
        if let Some(d) = &self.deth {
            write!(f, " qkey={:#010x} sqp={:#08x}", d.qkey, d.src_qp)?;
        }
        if let Some(x) = &self.feth {
            write!(
                f,
                " sel={} plt={:#x}",
                x.selectivity_level, x.placement_type
            )?;
        }
        if let Some(r) = &self.reth {
            write!(
                f,
                " va={:#x} rkey={:#010x} dlen={}",
                r.va, r.rkey, r.dma_len
            )?;
        }
        if let Some(a) = &self.aeth {
            write!(f, " {} msn={}", a.syndrome, a.msn)?;
        }
        if let Some(a) = &self.atomic_eth {
            write!(
                f,
                " va={:#x} rkey={:#010x} swap_add={:#x} cmp={:#x}",
                a.va, a.rkey, a.swap_add, a.compare
            )?;
        }
        if let Some(a) = &self.atomic_ack_eth {
            write!(f, " orig={:#x}", a.orig)?;
        }
        if let Some(i) = &self.immdt {
            write!(f, " imm={:#010x}", i.imm)?;
        }
        if let Some(i) = &self.ieth {
            write!(f, " inv_rkey={:#010x}", i.rkey)?;
        }
        Ok(())
    }
}

/// The ICRC as carried by `roce` (BTH … ICRC): its last 4 bytes read little-endian (the
/// ICRC is sent least-significant byte first, IBA Vol 1 §7.8.1).
pub fn icrc_on_wire(roce: &[u8]) -> Result<u32, WireError> {
    let start = roce
        .len()
        .checked_sub(ICRC_LEN)
        .ok_or(WireError::Truncated {
            header: HeaderKind::Icrc,
            offset: 0,
            needed: ICRC_LEN,
            available: roce.len(),
        })?;
    let mut le = [0u8; ICRC_LEN];
    if let Some(src) = roce.get(start..) {
        le.copy_from_slice(src);
    }
    Ok(u32::from_le_bytes(le))
}

/// One packet of a segmented message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Offset of the packet's payload within the message.
    pub offset: u64,
    /// Payload bytes in this packet.
    pub len: u32,
    /// Position in the message (selects the opcode, see [`opcode::opcode_for`]).
    pub position: Position,
}

/// Iterator over the packets of a message; see [`segment`].
#[derive(Debug, Clone)]
pub struct Segments {
    total: u64,
    mtu: u32,
    next: u64,
    count: u64,
}

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        if self.next >= self.count {
            return None;
        }
        let index = self.next;
        self.next += 1;
        // index < count = ceil(total / mtu), so offset < total (or both are 0).
        let offset = index.saturating_mul(u64::from(self.mtu));
        let remaining = self.total.saturating_sub(offset);
        let len = u32::try_from(remaining.min(u64::from(self.mtu))).unwrap_or(self.mtu);
        Some(Segment {
            offset,
            len,
            position: Position::from_flags(index == 0, index + 1 == self.count),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count.saturating_sub(self.next);
        match usize::try_from(left) {
            Ok(n) => (n, Some(n)),
            Err(_) => (usize::MAX, None),
        }
    }
}

impl FusedIterator for Segments {}

/// Cuts a message of `len` bytes into packets for path MTU `pmtu` (IBA Vol 1 §9.7):
/// `ceil(len / pmtu)` packets, at least one; FIRST and MIDDLE carry exactly `pmtu` bytes,
/// LAST 1..=`pmtu`, ONLY 0..=`pmtu`. PadCnt follows from each packet's length
/// ([`PacketRepr::emit`] sets it).
pub fn segment(len: u64, pmtu: Pmtu) -> Segments {
    Segments {
        total: len,
        mtu: pmtu.bytes(),
        next: 0,
        count: pmtu.packets_for(len),
    }
}

#[cfg(test)]
#[path = "tests/packet.rs"]
mod tests;
