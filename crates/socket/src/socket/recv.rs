//! The receive batch: datagrams from one `recvmmsg`, GRO-coalesced ones cut back into
//! packets, each classified (ICRC, parse) before the device sees it.

use super::*;

/// What became of one received packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecvStatus {
    /// Accepted: a well-formed RoCEv2 transport packet whose ICRC check gave this result
    /// ([`IcrcCheck::Ok`], or [`IcrcCheck::Mismatch`] for IPv4 under
    /// [`IcrcPolicy::AcceptUnverified`]).
    Accepted(IcrcCheck),
    /// Dropped: longer than its slot (`truncated`); for a coalesced datagram cut short,
    /// the part after its last complete packet.
    Truncated,
    /// Dropped: the kernel reported no IPv4/IPv6 source address (`bad_source`).
    BadSource,
    /// Dropped: the ICRC does not match (`bad_icrc`).
    BadIcrc,
    /// Dropped: no ICRC could be computed, e.g. shorter than BTH + ICRC
    /// (`icrc_unverifiable`).
    Unverifiable,
    /// Dropped: the ICRC is fine but the packet is not a valid RoCEv2 transport packet
    /// (`parse_errors`).
    ParseError,
    /// Not a transport packet: a steering probe (`crate::steer::probe`) from this
    /// host's own address, which a shared device reads from the batch
    /// ([`RecvBatch::probes`]) to learn its socket's index in the group.
    Probe,
}

/// One packet of a [`RecvBatch`]: where its bytes are and what became of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct PacketSlot {
    /// The datagram (receive slot) it came in.
    pub(super) datagram: usize,
    /// Its first byte in the batch's storage.
    pub(super) start: usize,
    /// Its length.
    pub(super) len: usize,
    /// What became of it.
    pub(super) status: RecvStatus,
    /// The IPv4 header its ICRC was found valid for (accepted IPv4 packets).
    pub(super) ident: Option<Ipv4Ident>,
}

impl PacketSlot {
    const EMPTY: PacketSlot = PacketSlot {
        datagram: 0,
        start: 0,
        len: 0,
        status: RecvStatus::Truncated,
        ident: None,
    };
}

/// Preallocated buffers for [`RoceSocket::recv_batch`]: `slots` datagrams of up to
/// `slot_len` bytes each, and what happened to each packet in them (a datagram the kernel
/// coalesced carries several; see the module docs).
#[derive(Debug)]
pub struct RecvBatch {
    pub(super) storage: Vec<u8>,
    pub(super) slot_len: usize,
    pub(super) meta: Vec<RecvMeta>,
    /// Room for every packet the slots can carry, preallocated; the first `filled` are
    /// the last receive's.
    pub(super) packets: Vec<PacketSlot>,
    /// Entries of `packets` one datagram may use.
    pub(super) per_datagram: usize,
    /// Packets of the last receive.
    pub(super) filled: usize,
    /// Datagrams of the last receive.
    pub(super) datagrams: usize,
    /// Steering probes in the last receive.
    pub(super) probes: usize,
}

/// An accepted packet of a [`RecvBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received<'a> {
    /// Its source address and port.
    pub src: SocketAddr,
    /// The UDP payload: BTH..ICRC.
    pub roce: &'a [u8],
    /// The ICRC check result.
    pub icrc: IcrcCheck,
    /// IPv4: the Identification and DF flag of the header the ICRC is valid for
    /// ([`Ipv4Ident::UROCE`] for a uroce peer's single datagram; `None` for IPv6 and for
    /// a packet accepted unverified). With the addresses and the length this is the
    /// sender's IPv4 header, e.g. for the GRH area of a UD receive.
    pub ident: Option<Ipv4Ident>,
    /// The parsed transport packet.
    pub packet: PacketRepr<'a>,
}

/// Any packet of a [`RecvBatch`], accepted or dropped: one datagram as its sender's
/// kernel emitted it (a coalesced datagram is split into the packets it carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvDatagram<'a> {
    /// Its source, if the kernel reported an IP address.
    pub src: Option<SocketAddr>,
    /// The bytes received (for a truncated datagram: only what fitted its slot).
    pub bytes: &'a [u8],
    /// What became of it.
    pub status: RecvStatus,
    /// As [`Received::ident`] (accepted IPv4 packets only).
    pub ident: Option<Ipv4Ident>,
}

impl RecvBatch {
    /// Slot size of [`RecvBatch::default`]: [`RecvBatch::GRO_SLOT_LEN`], so that the
    /// socket can let the kernel coalesce datagrams.
    pub const DEFAULT_SLOT_LEN: usize = Self::GRO_SLOT_LEN;
    /// Slots of [`RecvBatch::default`].
    pub const DEFAULT_SLOTS: usize = 32;
    /// The slot size from which a socket receiving into the batch turns `UDP_GRO` on:
    /// room for the largest UDP payload (65 527 bytes) and so for any coalesced datagram.
    pub const GRO_SLOT_LEN: usize = 64 << 10;
    /// The smallest useful slot: a BTH and an ICRC.
    pub const MIN_SLOT_LEN: usize = MIN_PACKET_LEN;

    /// Buffers for `slots` (1..=64) datagrams of up to `slot_len` (>= 16) bytes. With
    /// `slot_len` below [`RecvBatch::GRO_SLOT_LEN`] a socket receiving into it does not
    /// let the kernel coalesce datagrams.
    ///
    /// # Errors
    /// [`SocketError::BatchSize`] for sizes outside those bounds.
    pub fn new(slots: usize, slot_len: usize) -> Result<RecvBatch, SocketError> {
        let bad = |why| SocketError::BatchSize {
            slots,
            slot_len,
            why,
        };
        if slots == 0 || slots > BATCH_MAX {
            return Err(bad("slots must be 1..=64"));
        }
        if slot_len < Self::MIN_SLOT_LEN {
            return Err(bad("slot_len must be at least 16 (BTH + ICRC)"));
        }
        let total = slots
            .checked_mul(slot_len)
            .ok_or(bad("slots * slot_len overflows"))?;
        // A coalesced datagram of a slot carries at most slot_len / 16 packets (and the
        // kernel puts no more than MAX_SEGMENTS_PER_DATAGRAM in one); one more entry
        // stands for a cut-off rest.
        let per_datagram = (slot_len / Self::MIN_SLOT_LEN).min(MAX_SEGMENTS_PER_DATAGRAM) + 1;
        Ok(RecvBatch {
            storage: vec![0; total],
            slot_len,
            meta: vec![RecvMeta::default(); slots],
            packets: vec![PacketSlot::EMPTY; slots * per_datagram],
            per_datagram,
            filled: 0,
            datagrams: 0,
            probes: 0,
        })
    }

    /// Number of slots: the most datagrams one receive reads.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Packets the last [`RoceSocket::recv_batch`] read, accepted or not (a coalesced
    /// datagram counts as the packets it carries).
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Datagrams the last [`RoceSocket::recv_batch`] took from the socket, a coalesced
    /// one counting once: compare with [`RecvBatch::capacity`] to tell whether more may
    /// be waiting.
    pub fn datagrams(&self) -> usize {
        self.datagrams
    }

    /// True when the last receive read nothing.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// The accepted packets of the last receive, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = Received<'_>> + '_ {
        self.all().filter_map(|d| match (d.status, d.src) {
            (RecvStatus::Accepted(icrc), Some(src)) => {
                // Accepted means it parsed; the filter only keeps this panic-free.
                PacketRepr::parse(d.bytes).ok().map(|packet| Received {
                    src,
                    roce: d.bytes,
                    icrc,
                    ident: d.ident,
                    packet,
                })
            }
            _ => None,
        })
    }

    /// The steering probes of the last receive (`RecvStatus::Probe`: index and key, see
    /// `crate::steer::probe`), in arrival order; nothing to look through when there were
    /// none.
    pub fn probes(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.all()
            .take(if self.probes > 0 { self.filled } else { 0 })
            .filter(|d| d.status == RecvStatus::Probe)
            .filter_map(|d| crate::steer::parse_probe(d.bytes))
    }

    /// Every packet of the last receive with what became of it, in arrival order.
    pub fn all(&self) -> impl Iterator<Item = RecvDatagram<'_>> + '_ {
        self.packets.iter().take(self.filled).map(|p| RecvDatagram {
            src: self.meta.get(p.datagram).and_then(|m| m.src),
            bytes: self
                .storage
                .get(p.start..p.start.saturating_add(p.len))
                .unwrap_or_default(),
            status: p.status,
            ident: p.ident,
        })
    }
}

impl Default for RecvBatch {
    /// [`RecvBatch::DEFAULT_SLOTS`] slots of [`RecvBatch::DEFAULT_SLOT_LEN`] bytes (2 MiB).
    fn default() -> RecvBatch {
        match RecvBatch::new(Self::DEFAULT_SLOTS, Self::DEFAULT_SLOT_LEN) {
            Ok(batch) => batch,
            // invariant: the defaults are within the bounds `new` checks.
            Err(_) => RecvBatch {
                storage: Vec::new(),
                slot_len: Self::DEFAULT_SLOT_LEN,
                meta: Vec::new(),
                packets: Vec::new(),
                per_datagram: 1,
                filled: 0,
                datagrams: 0,
                probes: 0,
            },
        }
    }
}

/// How a received datagram of `len` bytes is cut into packets when it may hold at most
/// `room` of them: `(offset, length, complete)` of each piece, as the receive path lays
/// them out (`segment`: the GRO segment size the kernel reported; `truncated`: the datagram
/// was longer than its buffer). For the fuzz targets and tests of the splitting.
pub fn gro_pieces(
    len: usize,
    segment: Option<usize>,
    truncated: bool,
    room: usize,
) -> Vec<(usize, usize, bool)> {
    let meta = RecvMeta {
        len,
        truncated,
        src: None,
        segment,
    };
    let blank = PacketSlot {
        datagram: 0,
        start: 0,
        len: 0,
        status: RecvStatus::BadSource,
        ident: None,
    };
    let mut entries = vec![blank; room];
    let used = split_datagram(&meta, 0, &mut entries);
    entries
        .iter()
        .take(used)
        .map(|e| (e.start, e.len, e.status != RecvStatus::Truncated))
        .collect()
}

/// Lays out the packets of one received datagram (its slot starts at `base` in the
/// batch's storage) in `entries`: one for an ordinary datagram, one per segment for a
/// coalesced one (the segment size from the kernel; the last may be shorter), and one
/// `Truncated` entry for what follows the last complete segment of a datagram cut short
/// or beyond the entries available. Returns how many entries it used; their `status` is
/// `Truncated` for cut pieces and `BadSource` (a placeholder, to be classified) otherwise.
pub(super) fn split_datagram(meta: &RecvMeta, base: usize, entries: &mut [PacketSlot]) -> usize {
    let pending = RecvStatus::BadSource;
    let segment = match meta.segment {
        Some(seg) if seg > 0 && seg < meta.len => seg,
        _ => {
            let Some(only) = entries.first_mut() else {
                return 0;
            };
            *only = PacketSlot {
                datagram: 0,
                start: base,
                len: meta.len,
                status: if meta.truncated {
                    RecvStatus::Truncated
                } else {
                    pending
                },
                ident: None,
            };
            return 1;
        }
    };
    // Keep one entry for a cut-off rest.
    let room = entries.len().saturating_sub(1);
    let mut used = 0;
    let mut offset = 0;
    // At most `room` passes: each fills one entry.
    while offset < meta.len && used < room {
        let len = segment.min(meta.len - offset);
        if len < segment && meta.truncated {
            // A piece of a cut datagram: the rest of this segment is lost.
            break;
        }
        if let Some(e) = entries.get_mut(used) {
            *e = PacketSlot {
                datagram: 0,
                start: base + offset,
                len,
                status: pending,
                ident: None,
            };
        }
        used += 1;
        offset += len;
    }
    if offset < meta.len || meta.truncated {
        if let Some(e) = entries.get_mut(used) {
            *e = PacketSlot {
                datagram: 0,
                start: base + offset,
                len: meta.len - offset,
                status: RecvStatus::Truncated,
                ident: None,
            };
            used += 1;
        }
    }
    used
}

/// Decides what becomes of one received packet; also returns the IPv4 header its ICRC
/// is valid for, when it was accepted for one. An accepted packet's parse (its structure
/// check) is written to `packet`. `expected` is the IPv4 Identification checked first
/// (the packet's index in its coalesced datagram: see [`check_icrc`]).
pub(super) fn classify<'b>(
    policy: IcrcPolicy,
    local: SocketAddr,
    src: Option<SocketAddr>,
    bytes: &'b [u8],
    expected: u16,
    ids: &mut IdentSolver,
    packet: &mut Option<PacketRepr<'b>>,
) -> (RecvStatus, Option<Ipv4Ident>) {
    let Some(src) = src else {
        return (RecvStatus::BadSource, None);
    };
    // Members send probes from the group's own address; from anywhere else the datagram
    // is judged like any other (and dropped).
    if src.ip() == local.ip() && crate::steer::parse_probe(bytes).is_some() {
        return (RecvStatus::Probe, None);
    }
    let (check, ident) = match check_icrc(src, local, bytes, expected, ids) {
        (IcrcCheck::Ok, Some(found)) if found != Ipv4Ident::UROCE && !policy.accepts(found) => {
            (IcrcCheck::Mismatch, None)
        }
        other => other,
    };
    let accept = match check {
        IcrcCheck::Ok => true,
        IcrcCheck::Mismatch => policy == IcrcPolicy::AcceptUnverified && src.is_ipv4(),
        IcrcCheck::Unverifiable => return (RecvStatus::Unverifiable, None),
    };
    if !accept {
        return (RecvStatus::BadIcrc, None);
    }
    match PacketRepr::parse(bytes) {
        Ok(p) => {
            *packet = Some(p);
            (RecvStatus::Accepted(check), ident)
        }
        Err(_) => (RecvStatus::ParseError, ident),
    }
}
