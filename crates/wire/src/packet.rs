//! A whole RoCEv2 transport packet: BTH, the extension headers its opcode calls for,
//! payload, pad and ICRC (the UDP payload of a RoCEv2 datagram; roce-spec.md §1.1, §1.5,
//! §1.6), plus the message segmenter senders use to cut a message into packets.
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
use crate::{aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, xrceth, ICRC_LEN};

/// The largest BTH..ICRC length [`PacketRepr::emit`] produces: what fits one IPv4 UDP
/// datagram (65535 − 20 − 8 = 65507 bytes), rounded down to a multiple of 4.
pub const MAX_ROCE_LEN: usize = 65_504;

/// A RoCEv2 packet from the BTH to the ICRC, as validated values.
///
/// Exactly the extension headers the opcode's table row lists are `Some`
/// ([`PacketRepr::parse`] guarantees it, [`PacketRepr::emit`] checks it). FLUSH (whose
/// FETH has no field here) is refused with [`WireError::UnsupportedOpcode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// Base transport header. `emit` ignores `bth.pad_cnt` and derives it from the payload.
    pub bth: bth::Repr,
    /// XRC extended transport header (XRC requests).
    pub xrceth: Option<xrceth::Repr>,
    /// Datagram extended transport header (UD).
    pub deth: Option<deth::Repr>,
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
    /// Checks, in order: BTH length and TVer; opcode in the table (`UnknownOpcode`;
    /// `UnsupportedOpcode` for FLUSH); each extension header of the opcode present in full
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
        if info.headers.contains(HeaderSet::FETH) {
            return Err(WireError::UnsupportedOpcode(bth.opcode));
        }
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
                // invariant: FETH was refused above and header_order() yields single
                // flags only, so no other header can reach this branch.
                return Err(WireError::UnsupportedOpcode(bth.opcode));
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
    /// Errors: `UnknownOpcode` / `UnsupportedOpcode`; `HeaderMismatch` when the headers
    /// present differ from the opcode's; `PayloadNotAllowed`; `BadLength` for the exact
    /// payload of ATOMIC_WRITE / CNP; `InvalidField` for a 24-bit field (DestQP, SrcQP,
    /// SRQN, MSN) out of range or an AETH syndrome that does not encode losslessly;
    /// `PayloadTooLarge` beyond [`MAX_ROCE_LEN`]. `bth.pad_cnt` is not checked (ignored).
    pub fn check(&self) -> Result<&'static OpcodeInfo, WireError> {
        let opcode = self.bth.opcode;
        let info = self.info().ok_or(WireError::UnknownOpcode(opcode))?;
        if info.headers.contains(HeaderSet::FETH) {
            return Err(WireError::UnsupportedOpcode(opcode));
        }
        let present = self.present_headers();
        let kinds = [
            (HeaderSet::XRCETH, HeaderKind::XrcEth),
            (HeaderSet::DETH, HeaderKind::Deth),
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
    /// message (roce-spec.md §1.6): FIRST and MIDDLE carry exactly `pmtu` bytes, LAST
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
/// ICRC is sent least-significant byte first, roce-spec.md §2.1).
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

/// Cuts a message of `len` bytes into packets for path MTU `pmtu` (roce-spec.md §1.6):
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
mod tests {
    use super::*;
    use crate::aeth::{NakCode, Syndrome};
    use crate::opcode::op;
    use crate::psn::Psn;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// roce-spec.md §2.2, IPv4 vector: the UDP payload (IP datagram minus 20 + 8 bytes of
    /// IPv4 and UDP header) followed by the ICRC.
    fn ipv4_vector() -> Vec<u8> {
        let datagram = hex(concat!(
            "45000034000040004011b765c0a80101c0a80102c00112b7002000000430ffff",
            "000000118000006468656c6c6f000000",
            "4a73e3b9"
        ));
        datagram[28..].to_vec()
    }

    /// roce-spec.md §2.2, IPv6 vector: 40 + 8 bytes of IPv6 and UDP header stripped.
    fn ipv6_vector() -> Vec<u8> {
        let datagram = hex(concat!(
            "61012345001c1140fe800000000000000000000000000001fe800000000000000000000000000002",
            "c00112b7001c00001100ffff00000022000000101f000007",
            "0fc36cd8"
        ));
        datagram[48..].to_vec()
    }

    fn bth(opcode: u8) -> bth::Repr {
        bth::Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: false,
            psn: Psn::new(1),
        }
    }

    #[test]
    fn parse_ipv4_spec_vector() {
        let roce = ipv4_vector();
        assert_eq!(roce.len(), 24);
        let p = PacketRepr::parse(&roce).unwrap();
        assert_eq!(p.bth.opcode, op::RC_SEND_ONLY);
        assert_eq!(p.bth.pad_cnt, 3);
        assert_eq!(p.bth.dest_qp, 0x11);
        assert_eq!(p.bth.psn, Psn::new(0x64));
        assert!(p.bth.ack_req);
        assert_eq!(p.payload, b"hello");
        assert_eq!(p.present_headers(), HeaderSet::empty());
        assert_eq!(p.buffer_len(), roce.len());
        // Wire bytes 4a 73 e3 b9, least significant first.
        assert_eq!(icrc_on_wire(&roce).unwrap(), 0xb9e3_734a);
        assert_eq!(
            p.to_string(),
            "RC SEND_ONLY dqp=0x000011 psn=100 A pad=3 len=5"
        );

        let mut out = vec![0xaa; 40];
        assert_eq!(p.emit(&mut out).unwrap(), 24);
        assert_eq!(out[..20], roce[..20]);
        assert_eq!(out[20..24], [0, 0, 0, 0], "ICRC left for the caller");
        assert_eq!(out[24..], [0xaa; 16], "nothing written past buffer_len");
    }

    #[test]
    fn parse_ipv6_spec_vector() {
        let roce = ipv6_vector();
        let p = PacketRepr::parse(&roce).unwrap();
        assert_eq!(p.bth.opcode, op::RC_ACKNOWLEDGE);
        assert_eq!(p.bth.dest_qp, 0x22);
        assert_eq!(p.bth.psn, Psn::new(0x10));
        assert_eq!(
            p.aeth,
            Some(aeth::Repr {
                syndrome: Syndrome::Ack { credit: 0x1f },
                msn: 7
            })
        );
        assert!(p.payload.is_empty());
        assert_eq!(icrc_on_wire(&roce).unwrap(), 0xd86c_c30f);
        assert_eq!(
            p.to_string(),
            "RC ACKNOWLEDGE dqp=0x000022 psn=16 pad=0 len=0 ACK credit=31 msn=7"
        );
        let mut out = vec![0u8; p.buffer_len()];
        p.emit(&mut out).unwrap();
        assert_eq!(out[..roce.len() - 4], roce[..roce.len() - 4]);
    }

    #[test]
    fn parse_ud_gsi_send_by_hand() {
        // UD SEND_ONLY to QP1, P_Key 0xFFFF, DETH Q_Key 0x80010000 SrcQP 1 (§6.1),
        // 4 payload bytes, ICRC bytes 11 22 33 44.
        let roce = hex("6400ffff00000001000000058001000000000001cafebabe11223344");
        let p = PacketRepr::parse(&roce).unwrap();
        assert_eq!(
            p.deth,
            Some(deth::Repr {
                qkey: 0x8001_0000,
                src_qp: 1
            })
        );
        assert_eq!(p.payload, [0xca, 0xfe, 0xba, 0xbe]);
        assert_eq!(icrc_on_wire(&roce).unwrap(), 0x4433_2211);
        assert_eq!(p.header_len(), 20);
    }

    #[test]
    fn parse_xrc_write_with_imm_by_hand() {
        // XRC RDMA_WRITE_ONLY_WITH_IMM (0xAB): XRCETH (SRQ 0x000042), RETH (VA 0x1000,
        // R_Key 0x77, DMA length 2), ImmDt 0x01020304, payload "hi" + 2 pad, ICRC.
        let roce = hex(concat!(
            "ab20ffff00000099000000070000004200000000000010000000007700000002",
            "01020304",
            "68690000",
            "00000000"
        ));
        let p = PacketRepr::parse(&roce).unwrap();
        assert_eq!(p.xrceth, Some(xrceth::Repr { srqn: 0x42 }));
        assert_eq!(
            p.reth,
            Some(reth::Repr {
                va: 0x1000,
                rkey: 0x77,
                dma_len: 2
            })
        );
        assert_eq!(p.immdt, Some(immdt::Repr { imm: 0x0102_0304 }));
        assert_eq!(p.payload, b"hi");
        assert_eq!(p.pad_len(), 2);
        let mut out = vec![0u8; p.buffer_len()];
        p.emit(&mut out).unwrap();
        assert_eq!(out, roce);
    }

    #[test]
    fn parse_errors_name_what_and_where() {
        let v4 = ipv4_vector();
        assert_eq!(
            PacketRepr::parse(&v4[..11]),
            Err(WireError::Truncated {
                header: HeaderKind::Bth,
                offset: 0,
                needed: 12,
                available: 11
            })
        );
        let mut bad = v4.clone();
        bad[1] = 0x32;
        assert_eq!(PacketRepr::parse(&bad), Err(WireError::BadTver(2)));
        bad = v4.clone();
        bad[0] = 0x15;
        assert_eq!(PacketRepr::parse(&bad), Err(WireError::UnknownOpcode(0x15)));
        bad[0] = op::RC_FLUSH;
        assert_eq!(
            PacketRepr::parse(&bad),
            Err(WireError::UnsupportedOpcode(op::RC_FLUSH))
        );
        // RC RDMA WRITE ONLY needs 16 bytes of RETH after the BTH; only 12 are there.
        bad = v4.clone();
        bad[0] = op::RC_RDMA_WRITE_ONLY;
        assert_eq!(
            PacketRepr::parse(&bad),
            Err(WireError::Truncated {
                header: HeaderKind::Reth,
                offset: 12,
                needed: 16,
                available: 12
            })
        );
        // BTH only: no room for the ICRC.
        assert_eq!(
            PacketRepr::parse(&v4[..14]),
            Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                offset: 12,
                needed: 4,
                available: 2
            })
        );
        assert_eq!(
            PacketRepr::parse(&v4[..23]),
            Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "BTH..ICRC length mod 4",
                value: 3,
                expected: 0
            })
        );
        // 4 bytes of payload+pad but PadCnt 3 on a 16-byte packet: fine; on the BTH+ICRC
        // only packet, PadCnt 3 points before the headers' end.
        let mut short = v4[..16].to_vec();
        assert_eq!(
            PacketRepr::parse(&short),
            Err(WireError::PadBeyondPayload { pad: 3, payload: 0 })
        );
        short[1] = 0x00;
        assert_eq!(PacketRepr::parse(&short).unwrap().payload, b"");
        // ACKNOWLEDGE with 4 stray bytes.
        let v6 = ipv6_vector();
        let mut ack = v6[..16].to_vec();
        ack.extend_from_slice(&[0, 0, 0, 0]);
        ack.extend_from_slice(&v6[16..]);
        assert_eq!(
            PacketRepr::parse(&ack),
            Err(WireError::PayloadNotAllowed {
                opcode: op::RC_ACKNOWLEDGE,
                len: 4
            })
        );
        // Reserved AETH syndrome class.
        let mut nak = v6.clone();
        nak[12] = 0x45;
        assert_eq!(
            PacketRepr::parse(&nak),
            Err(WireError::InvalidField {
                header: HeaderKind::Aeth,
                field: "syndrome",
                value: 0x45
            })
        );
    }

    #[test]
    fn exact_payload_lengths() {
        // CNP: BTH (BECN) + 16 reserved bytes + ICRC.
        let mut cnp = hex("8100ffff4000001100000000");
        cnp.extend_from_slice(&[0; 20]);
        let p = PacketRepr::parse(&cnp).unwrap();
        assert!(p.bth.becn);
        assert_eq!(p.payload.len(), 16);
        let cnp_short = [&cnp[..12], &[0; 12][..]].concat();
        assert_eq!(
            PacketRepr::parse(&cnp_short),
            Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "payload length",
                value: 8,
                expected: 16
            })
        );
        let reth = reth::Repr {
            va: 8,
            rkey: 1,
            dma_len: 8,
        };
        let aw = PacketRepr {
            reth: Some(reth),
            ..PacketRepr::new(bth(op::RC_ATOMIC_WRITE), &[1, 2, 3, 4, 5, 6, 7, 8])
        };
        let mut buf = [0u8; 64];
        let n = aw.emit(&mut buf).unwrap();
        assert_eq!(n, 12 + 16 + 8 + 4);
        assert_eq!(PacketRepr::parse(&buf[..n]).unwrap(), aw);
        let aw4 = PacketRepr {
            payload: &[1, 2, 3, 4],
            ..aw
        };
        assert_eq!(
            aw4.emit(&mut buf),
            Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "payload length",
                value: 4,
                expected: 8
            })
        );
    }

    #[test]
    fn emit_errors() {
        let mut buf = [0x5au8; 64];
        // UD SEND_ONLY without its DETH.
        let p = PacketRepr::new(bth(op::UD_SEND_ONLY), b"x");
        assert_eq!(
            p.emit(&mut buf),
            Err(WireError::HeaderMismatch {
                opcode: op::UD_SEND_ONLY,
                header: HeaderKind::Deth,
                present: false
            })
        );
        // RC SEND_ONLY with a DETH.
        let p = PacketRepr {
            deth: Some(deth::Repr { qkey: 1, src_qp: 2 }),
            ..PacketRepr::new(bth(op::RC_SEND_ONLY), b"x")
        };
        assert_eq!(
            p.emit(&mut buf),
            Err(WireError::HeaderMismatch {
                opcode: op::RC_SEND_ONLY,
                header: HeaderKind::Deth,
                present: true
            })
        );
        let p = PacketRepr {
            aeth: Some(aeth::Repr {
                syndrome: Syndrome::Nak(NakCode::InvalidRequest),
                msn: 1,
            }),
            ..PacketRepr::new(bth(op::RC_ACKNOWLEDGE), b"x")
        };
        assert_eq!(
            p.emit(&mut buf),
            Err(WireError::PayloadNotAllowed {
                opcode: op::RC_ACKNOWLEDGE,
                len: 1
            })
        );
        let p = PacketRepr::new(bth(0x1e), b"");
        assert_eq!(p.emit(&mut buf), Err(WireError::UnknownOpcode(0x1e)));
        let mut wide = bth(op::RC_SEND_ONLY);
        wide.dest_qp = 0x0100_0000;
        assert_eq!(
            PacketRepr::new(wide, b"").emit(&mut buf),
            Err(WireError::InvalidField {
                header: HeaderKind::Bth,
                field: "dest_qp",
                value: 0x0100_0000
            })
        );
        let p = PacketRepr::new(bth(op::RC_SEND_ONLY), &[1u8; 49]);
        assert_eq!(
            p.emit(&mut buf),
            Err(WireError::BufferTooSmall {
                needed: 12 + 49 + 3 + 4,
                available: 64
            })
        );
        assert_eq!(buf, [0x5a; 64], "untouched on error");
        let huge = vec![0u8; MAX_ROCE_LEN];
        assert_eq!(
            PacketRepr::new(bth(op::RC_SEND_ONLY), &huge).emit(&mut buf),
            Err(WireError::PayloadTooLarge {
                len: MAX_ROCE_LEN,
                max: MAX_ROCE_LEN - 16
            })
        );
    }

    #[test]
    fn emit_ignores_given_pad_cnt() {
        let mut b = bth(op::RC_SEND_ONLY);
        b.pad_cnt = 3;
        let mut buf = [0u8; 32];
        let n = PacketRepr::new(b, b"abcd").emit(&mut buf).unwrap();
        assert_eq!(n, 20);
        assert_eq!(buf[1] & 0x30, 0, "PadCnt 0 for a 4-byte payload");
        b.pad_cnt = 0;
        let n = PacketRepr::new(b, b"a").emit(&mut buf).unwrap();
        assert_eq!(n, 20);
        assert_eq!(buf[1] & 0x30, 0x30, "PadCnt 3 for a 1-byte payload");
        assert_eq!(buf[13..20], [0; 7], "pad and ICRC zero");
    }

    #[test]
    fn icrc_on_wire_needs_four_bytes() {
        assert_eq!(icrc_on_wire(&[1, 2, 3, 4]).unwrap(), 0x0403_0201);
        assert_eq!(
            icrc_on_wire(&[1, 2, 3]),
            Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                offset: 0,
                needed: 4,
                available: 3
            })
        );
    }

    fn segs(len: u64, pmtu: Pmtu) -> Vec<(u64, u32, Position)> {
        segment(len, pmtu)
            .map(|s| (s.offset, s.len, s.position))
            .collect()
    }

    #[test]
    fn segmentation_by_hand() {
        use Position::*;
        let m = Pmtu::Mtu256;
        assert_eq!(segs(0, m), [(0, 0, Only)]);
        assert_eq!(segs(1, m), [(0, 1, Only)]);
        assert_eq!(segs(256, m), [(0, 256, Only)]);
        assert_eq!(segs(257, m), [(0, 256, First), (256, 1, Last)]);
        assert_eq!(
            segs(1000, m),
            [
                (0, 256, First),
                (256, 256, Middle),
                (512, 256, Middle),
                (768, 232, Last)
            ]
        );
        assert_eq!(
            segs(8192, Pmtu::Mtu4096),
            [(0, 4096, First), (4096, 4096, Last)]
        );
        let it = segment(1 << 20, Pmtu::Mtu1024);
        assert_eq!(it.size_hint(), (1024, Some(1024)));
        assert_eq!(it.map(|s| u64::from(s.len)).sum::<u64>(), 1 << 20);
    }

    #[test]
    fn pmtu_rules() {
        let m = Pmtu::Mtu256;
        let full = [0u8; 256];
        let check = |opcode: u8, len: usize| {
            let mut p = PacketRepr::new(bth(opcode), &full[..len]);
            if opcode == op::RC_RDMA_READ_RESPONSE_FIRST {
                p.aeth = Some(aeth::Repr {
                    syndrome: Syndrome::ACK_NO_CREDIT,
                    msn: 0,
                });
            }
            p.check_pmtu(m)
        };
        assert!(check(op::RC_SEND_FIRST, 256).is_ok());
        assert!(check(op::RC_SEND_MIDDLE, 256).is_ok());
        assert!(check(op::RC_RDMA_READ_RESPONSE_FIRST, 256).is_ok());
        assert_eq!(
            check(op::RC_SEND_FIRST, 255),
            Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "payload length of a first/middle packet",
                value: 255,
                expected: 256
            })
        );
        assert!(check(op::RC_SEND_LAST, 1).is_ok());
        assert_eq!(
            check(op::RC_SEND_LAST, 0),
            Err(WireError::BadLength {
                header: HeaderKind::Payload,
                field: "payload length of a last packet",
                value: 0,
                expected: 1
            })
        );
        assert!(check(op::RC_SEND_ONLY, 0).is_ok());
        assert!(check(op::RC_SEND_ONLY, 256).is_ok());
        let big = [0u8; 257];
        assert_eq!(
            PacketRepr::new(bth(op::RC_SEND_ONLY), &big).check_pmtu(m),
            Err(WireError::PayloadTooLarge { len: 257, max: 256 })
        );
        assert!(check(op::RC_ACKNOWLEDGE, 0).is_ok());
        // Every segment of a message passes.
        for len in [0u64, 1, 255, 256, 257, 511, 512, 513, 2000] {
            let data = vec![0u8; len as usize];
            for s in segment(len, m) {
                let op = opcode::opcode_for(
                    opcode::Transport::Rc,
                    opcode::Operation::Send,
                    s.position,
                    false,
                    false,
                )
                .unwrap();
                let start = s.offset as usize;
                let p = PacketRepr::new(bth(op), &data[start..start + s.len as usize]);
                assert_eq!(p.check_pmtu(m), Ok(()), "len {len} segment {s:?}");
            }
        }
    }
}
