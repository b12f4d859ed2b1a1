//! Building one packet into the caller's buffer with the payload filled in place (shared by
//! the transport engines).
//!
//! [`PacketRepr::emit`] copies a payload slice; the engines instead gather payload straight
//! from memory into the payload area of the output buffer. [`build`] lays the packet out
//! (headers | payload | pad | ICRC), lets the caller fill the payload area, then writes the
//! headers (emitted from the payload-less repr) and the PadCnt in front of it.

use uroce_wire::{bth, PacketRepr, ICRC_LEN};

use crate::memory::{gather, Memory, SgError};
use crate::wr::SendPayload;

/// Room for BTH plus the largest extension-header set plus the ICRC placeholder.
const HEADER_SCRATCH: usize = 128;

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
    // Emitting the payload-less repr validates it (opcode table, header set, fields).
    let emitted = hdr.emit(&mut scratch).map_err(|_| BuildError::Buffer)?;
    if !hdr.payload.is_empty() || emitted != hlen + ICRC_LEN {
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
