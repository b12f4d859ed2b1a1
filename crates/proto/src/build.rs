//! Request packets shared by the connected transports (RC and UC): segmenting a SEND or
//! RDMA WRITE message by the path MTU, the headers of each packet, gathering its payload,
//! and building one packet into the caller's buffer with the payload filled in place.
//!
//! [`PacketRepr::emit`] copies a payload slice; the engines instead gather payload straight
//! from memory into the payload area of the output buffer. [`build`] lays the packet out
//! (headers | payload | pad | ICRC), lets the caller fill the payload area, then writes the
//! headers (emitted from the payload-less repr) and the PadCnt in front of it.

use uroce_wire::opcode::{self, Operation, Position, Transport};
use uroce_wire::{bth, ieth, immdt, reth, PacketRepr, Pmtu, Psn, ICRC_LEN};

use crate::memory::{gather, Memory, SgError};
use crate::wr::{
    SendFlags, SendOpcode, SendPayload, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

/// Room for BTH plus the largest extension-header set plus the ICRC placeholder.
const HEADER_SCRATCH: usize = 128;
/// The longest exact payload an opcode prescribes (the CNP's 16 reserved bytes; ATOMIC
/// WRITE's 8).
const MAX_EXACT_PAYLOAD: usize = 16;

/// Why [`build`] produced no packet.
#[derive(Debug)]
pub(crate) enum BuildError<E> {
    /// The buffer is too small, or the header repr is not emittable (an engine bug; the
    /// packet is not sent).
    Buffer,
    /// The payload could not be filled.
    Fill(E),
}

/// Writes the packet described by `hdr` (its `payload` must be empty) with `payload_len`
/// payload bytes produced by `fill` into `buf`. Returns the packet length (headers,
/// payload, pad, 4 zero ICRC bytes). On error nothing meaningful is in `buf`.
pub(crate) fn build<E>(
    buf: &mut [u8],
    hdr: &PacketRepr<'_>,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, BuildError<E>> {
    let hlen = hdr.header_len();
    let pad = payload_len.wrapping_neg() % 4;
    let total = hlen + payload_len + pad + ICRC_LEN;
    let mut scratch = [0u8; HEADER_SCRATCH];
    // Emitting the repr validates it (opcode table, header set, fields): payload-less, or
    // for an opcode with an exact payload length (ATOMIC WRITE: 8 bytes) with that many
    // zero bytes, which `fill` overwrites below.
    let exact = opcode::info(hdr.bth.opcode)
        .and_then(|i| i.exact_payload)
        .filter(|&n| n == payload_len && n <= MAX_EXACT_PAYLOAD);
    let zeros = [0u8; MAX_EXACT_PAYLOAD];
    let emitted = match exact {
        Some(n) => {
            let probe = PacketRepr {
                payload: zeros.get(..n).ok_or(BuildError::Buffer)?,
                ..*hdr
            };
            probe.emit(&mut scratch).map_err(|_| BuildError::Buffer)?
        }
        None => hdr.emit(&mut scratch).map_err(|_| BuildError::Buffer)?,
    };
    let expected = hlen + exact.map_or(0, |n| n + n.wrapping_neg() % 4) + ICRC_LEN;
    if !hdr.payload.is_empty() || emitted != expected {
        return Err(BuildError::Buffer);
    }
    let area = buf.get_mut(..total).ok_or(BuildError::Buffer)?;
    let (head, rest) = area.split_at_mut_checked(hlen).ok_or(BuildError::Buffer)?;
    let (payload, tail) = rest
        .split_at_mut_checked(payload_len)
        .ok_or(BuildError::Buffer)?;
    fill(payload).map_err(BuildError::Fill)?;
    tail.fill(0);
    head.copy_from_slice(scratch.get(..hlen).ok_or(BuildError::Buffer)?);
    // invariant: pad < 4.
    bth::Header::new_unchecked(head).set_pad_cnt(pad as u8);
    Ok(total)
}

/// Does a packet's P_Key match ours (IBA 9.2.7: the low 15 bits equal and not zero, the
/// membership bit set on at least one side; as rxe)?
pub(crate) fn pkey_match(a: u16, b: u16) -> bool {
    let (la, lb) = (a & 0x7fff, b & 0x7fff);
    la == lb && la != 0 && (a | b) & 0x8000 != 0
}

/// Copies `dst.len()` bytes at `offset` of the WR's payload into `dst`.
pub(crate) fn fill_payload(
    mem: &dyn Memory,
    payload: &SendPayload,
    offset: u64,
    dst: &mut [u8],
) -> Result<(), SgError> {
    match payload {
        SendPayload::Sges(sges) => gather(mem, sges, offset, dst),
        SendPayload::Inline(data) => {
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            let src = start
                .checked_add(dst.len())
                .and_then(|end| data.get(start..end))
                .ok_or(SgError::Overflow {
                    offset,
                    wanted: dst.len() as u64,
                    total: data.len() as u64,
                })?;
            dst.copy_from_slice(src);
            Ok(())
        }
    }
}

/// One packet of a SEND or RDMA WRITE message: its headers (payload-less, AckReq clear),
/// where it sits in the message, and which bytes of the message it carries.
pub(crate) struct DataPacket {
    /// BTH and extension headers; `payload` is empty.
    pub hdr: PacketRepr<'static>,
    /// First / middle / last / only.
    pub position: Position,
    /// Payload offset in the message.
    pub offset: u64,
    /// Payload length (≤ PMTU).
    pub len: usize,
}

/// The headers and payload extent of packet `k` (0-based) of the SEND / WRITE message `wr`
/// of `len` bytes in `npkts` packets whose first PSN is `first_psn`, on `transport`
/// (IBA 9.7.1 / 9.8.2 segmentation: FIRST and MIDDLE packets carry exactly one PMTU, the
/// LAST one the rest, ONLY the whole message; RETH on the first packet of a WRITE, ImmDt
/// and IETH on the last). The solicited-event bit is set on the last packet of a SEND or a
/// WRITE with immediate when the WR asks for it. AckReq is left clear (RC sets it).
/// `None` when the transport has no opcode for the WR (e.g. SEND with invalidate on UC) or
/// the WR is not a SEND/WRITE.
#[allow(clippy::too_many_arguments)]
pub(crate) fn data_packet(
    transport: Transport,
    pmtu: Pmtu,
    pkey: u16,
    dest_qpn: u32,
    wr: &SendWr,
    len: u64,
    npkts: u32,
    k: u32,
    first_psn: Psn,
) -> Option<DataPacket> {
    let pmtu = u64::from(pmtu.bytes());
    let offset = u64::from(k) * pmtu;
    let plen = len.saturating_sub(offset).min(pmtu);
    let position = Position::from_flags(k == 0, k.saturating_add(1) >= npkts);
    let (operation, with_imm, with_inv) = match wr.opcode {
        SendOpcode::Send => (Operation::Send, false, false),
        SendOpcode::SendWithImm => (Operation::Send, true, false),
        SendOpcode::SendWithInv => (Operation::Send, false, true),
        SendOpcode::RdmaWrite => (Operation::RdmaWrite, false, false),
        SendOpcode::RdmaWriteWithImm => (Operation::RdmaWrite, true, false),
        _ => return None,
    };
    // SE only on the last packet of a SEND or a WRITE with immediate.
    let se_capable =
        operation == Operation::Send || (operation == Operation::RdmaWrite && with_imm);
    let bth = bth::Repr {
        opcode: opcode::opcode_for(transport, operation, position, with_imm, with_inv)?,
        solicited: position.ends() && se_capable && wr.flags.contains(SendFlags::SOLICITED),
        mig_req: false,
        pad_cnt: 0,
        pkey,
        fecn: false,
        becn: false,
        dest_qp: dest_qpn,
        ack_req: false,
        psn: first_psn.wrapping_add(k),
    };
    let mut hdr = PacketRepr::new(bth, &[]);
    if operation == Operation::RdmaWrite && position.starts() {
        hdr.reth = Some(reth::Repr {
            va: wr.remote_addr,
            rkey: wr.rkey,
            // invariant: len ≤ 2^31 (post-time check).
            dma_len: u32::try_from(len).unwrap_or(u32::MAX),
        });
    }
    if position.ends() && with_imm {
        hdr.immdt = Some(immdt::Repr { imm: wr.imm_data });
    }
    if position.ends() && with_inv {
        hdr.ieth = Some(ieth::Repr {
            rkey: wr.invalidate_rkey,
        });
    }
    Some(DataPacket {
        hdr,
        position,
        offset,
        // invariant: plen ≤ PMTU ≤ 4096.
        len: usize::try_from(plen).unwrap_or(0),
    })
}

/// The completion of a send WR that leaves the send queue with `status`, if it is reported:
/// always on error, on success when the QP signals every WR or the WR asked for it
/// (`IBV_SEND_SIGNALED`). `len` is the message length, reported on success; it was checked
/// against 2^31 at post time.
pub(crate) fn send_completion(
    sq_sig_all: bool,
    qpn: u32,
    wr: &SendWr,
    len: u64,
    status: WcStatus,
) -> Option<WorkCompletion> {
    let signaled =
        sq_sig_all || wr.flags.contains(SendFlags::SIGNALED) || status != WcStatus::Success;
    if !signaled {
        return None;
    }
    let mut wc = WorkCompletion::new(wr.wr_id, status, wr.opcode.wc_opcode(), qpn);
    if status == WcStatus::Success {
        // invariant: len ≤ 2^31 (post-time check), so it fits u32.
        wc.byte_len = u32::try_from(len).unwrap_or(u32::MAX);
    }
    Some(wc)
}

/// A successful receive completion on a connected QP (RC, UC, XRC): the peer's QPN as the
/// source, the solicited bit and the immediate data of the message's last packet `pkt`.
pub(crate) fn connected_recv_completion(
    qpn: u32,
    dest_qpn: u32,
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u64,
    pkt: &PacketRepr<'_>,
) -> WorkCompletion {
    let mut wc = WorkCompletion::new(wr_id, WcStatus::Success, opcode, qpn);
    // invariant: message lengths are capped at MAX_MSG_LEN = 2^31.
    wc.byte_len = u32::try_from(byte_len).unwrap_or(u32::MAX);
    wc.src_qp = dest_qpn;
    wc.solicited = pkt.bth.solicited;
    if let Some(imm) = pkt.immdt {
        wc.imm_data = imm.imm;
        wc.wc_flags |= WcFlags::WITH_IMM;
    }
    wc
}
