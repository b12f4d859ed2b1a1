//! The packet trace of a [`crate::net::SimNet`]: what every engine sent, what the link did
//! to it and what became of it at the receiver, with virtual timestamps.
//!
//! Scenario tests assert on it ("the retransmission of PSN 1 left at 67.1 ms"); every test
//! prints it (or its tail) when it fails, so a failure can be read packet by packet.

use std::collections::VecDeque;
use std::fmt;

use uroce_proto::time::Instant;
use uroce_wire::{aeth, opcode, PacketRepr, Psn};

/// The destination node of a trace entry for a packet sent to an address no node has.
pub const NO_NODE: usize = usize::MAX;

/// The fields of a packet a trace keeps (no payload bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketSummary {
    /// BTH opcode.
    pub opcode: u8,
    /// BTH PSN.
    pub psn: Psn,
    /// BTH DestQP.
    pub dest_qp: u32,
    /// BTH AckReq.
    pub ack_req: bool,
    /// Payload length (without pad).
    pub payload_len: usize,
    /// The AETH, for ACKs, NAKs and READ responses that carry one.
    pub aeth: Option<aeth::Repr>,
    /// RETH DMA length, for requests that carry one.
    pub dma_len: Option<u32>,
    /// The original value of an ATOMIC_ACKNOWLEDGE.
    pub atomic_orig: Option<u64>,
    /// The XRCETH SRQ number, for XRC requests.
    pub xrc_srqn: Option<u32>,
}

impl PacketSummary {
    /// The summary of a parsed packet.
    pub fn of(p: &PacketRepr<'_>) -> PacketSummary {
        PacketSummary {
            opcode: p.bth.opcode,
            psn: p.bth.psn,
            dest_qp: p.bth.dest_qp,
            ack_req: p.bth.ack_req,
            payload_len: p.payload.len(),
            aeth: p.aeth,
            dma_len: p.reth.map(|r| r.dma_len),
            atomic_orig: p.atomic_ack_eth.map(|a| a.orig),
            xrc_srqn: p.xrceth.map(|x| x.srqn),
        }
    }

    /// The AETH syndrome, if the packet has an AETH.
    pub fn syndrome(&self) -> Option<aeth::Syndrome> {
        self.aeth.map(|a| a.syndrome)
    }
}

impl fmt::Display for PacketSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match opcode::info(self.opcode) {
            Some(info) => write!(f, "{info}")?,
            None => write!(f, "op={:#04x}", self.opcode)?,
        }
        write!(f, " dqp={:#x} psn={}", self.dest_qp, self.psn)?;
        if self.ack_req {
            f.write_str(" A")?;
        }
        write!(f, " len={}", self.payload_len)?;
        if let Some(l) = self.dma_len {
            write!(f, " dlen={l}")?;
        }
        if let Some(a) = self.aeth {
            write!(f, " [{} msn={}]", a.syndrome, a.msn)?;
        }
        if let Some(o) = self.atomic_orig {
            write!(f, " orig={o:#x}")?;
        }
        Ok(())
    }
}

/// Why a packet that reached its destination node was not handed to an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The IP or UDP header did not parse (a corrupted version, length, protocol…).
    BadIp,
    /// The IPv4 header checksum is wrong (the kernel would drop it).
    IpChecksum,
    /// The UDP checksum is not the zero RoCEv2 senders use (the kernel would verify it and
    /// drop the datagram).
    UdpChecksum,
    /// The UDP destination port is not 4791.
    NotRoce,
    /// The ICRC does not match.
    Icrc,
    /// `PacketRepr::parse` refused the transport packet.
    Parse,
    /// No node with the destination address (the entry's `dst` is [`NO_NODE`]), or no QP
    /// with the DestQP there.
    Unroutable,
}

/// What happened to a packet at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    /// The engine emitted the packet (always the first entry of a packet id).
    Transmitted,
    /// The link model lost it.
    Lost,
    /// The link's packet filter dropped it.
    Filtered,
    /// A copy is on the way (copy 0 is the original, 1.. are duplicates).
    InFlight {
        /// Copy number.
        copy: u8,
        /// Delivery time.
        arrive_at: Instant,
        /// The bit (0 = most significant bit of the first IP byte) flipped in this copy.
        corrupted_bit: Option<u32>,
        /// The copy was held back so that later packets may overtake it.
        reordered: bool,
    },
    /// A copy was handed to the destination engine.
    Delivered {
        /// Copy number.
        copy: u8,
    },
    /// A copy was dropped at the receiving node.
    Dropped {
        /// Copy number.
        copy: u8,
        /// Why.
        reason: DropReason,
    },
}

/// One line of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    /// Virtual time of the event.
    pub time: Instant,
    /// Packet id: one per engine transmission, shared by its copies.
    pub id: u64,
    /// Sending node.
    pub src: usize,
    /// Destination node ([`NO_NODE`] when no node has the destination address).
    pub dst: usize,
    /// The packet as the engine sent it.
    pub packet: PacketSummary,
    /// What happened.
    pub event: TraceEvent,
}

/// Formats an instant as microseconds with nanosecond decimals.
pub(crate) struct Micros(pub Instant);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.as_nanos();
        write!(f, "{}.{:03}us", n / 1000, n % 1000)
    }
}

impl fmt::Display for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dst = if self.dst == NO_NODE {
            "?".to_string()
        } else {
            self.dst.to_string()
        };
        write!(
            f,
            "{:>16} #{:<6} {}->{} {}",
            Micros(self.time).to_string(),
            self.id,
            self.src,
            dst,
            self.packet
        )?;
        match self.event {
            TraceEvent::Transmitted => f.write_str("  : sent"),
            TraceEvent::Lost => f.write_str("  : LOST"),
            TraceEvent::Filtered => f.write_str("  : FILTERED"),
            TraceEvent::InFlight {
                copy,
                arrive_at,
                corrupted_bit,
                reordered,
            } => {
                write!(f, "  : copy {copy} arrives {}", Micros(arrive_at))?;
                if reordered {
                    f.write_str(" (reordered)")?;
                }
                if let Some(bit) = corrupted_bit {
                    write!(f, " (bit {bit} flipped)")?;
                }
                Ok(())
            }
            TraceEvent::Delivered { copy } => write!(f, "  : copy {copy} delivered"),
            TraceEvent::Dropped { copy, reason } => {
                write!(f, "  : copy {copy} DROPPED ({reason:?})")
            }
        }
    }
}

/// A bounded log of [`TraceEntry`]s (the oldest are discarded beyond the limit).
#[derive(Debug, Clone)]
pub struct Trace {
    entries: VecDeque<TraceEntry>,
    limit: usize,
    discarded: u64,
}

impl Default for Trace {
    fn default() -> Self {
        Trace::new(usize::MAX)
    }
}

impl Trace {
    /// A trace that keeps at most `limit` entries (0 records nothing).
    pub fn new(limit: usize) -> Trace {
        Trace {
            entries: VecDeque::new(),
            limit,
            discarded: 0,
        }
    }

    /// Changes the limit, discarding the oldest entries if needed.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
        self.trim();
    }

    fn trim(&mut self) {
        while self.entries.len() > self.limit {
            self.entries.pop_front();
            self.discarded += 1;
        }
    }

    pub(crate) fn push(&mut self, e: TraceEntry) {
        if self.limit == 0 {
            self.discarded += 1;
            return;
        }
        self.entries.push_back(e);
        self.trim();
    }

    /// The entries kept, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &TraceEntry> {
        self.entries.iter()
    }

    /// How many entries were discarded because of the limit.
    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    /// Every packet the engines of node `src` sent to node `dst`, in order, with the time
    /// it was sent.
    pub fn transmitted(&self, src: usize, dst: usize) -> Vec<(Instant, PacketSummary)> {
        self.entries
            .iter()
            .filter(|e| e.src == src && e.dst == dst && e.event == TraceEvent::Transmitted)
            .map(|e| (e.time, e.packet))
            .collect()
    }

    /// Every copy handed to an engine of node `dst` from node `src`, in delivery order,
    /// with the delivery time.
    pub fn delivered(&self, src: usize, dst: usize) -> Vec<(Instant, PacketSummary)> {
        self.entries
            .iter()
            .filter(|e| {
                e.src == src && e.dst == dst && matches!(e.event, TraceEvent::Delivered { .. })
            })
            .map(|e| (e.time, e.packet))
            .collect()
    }

    /// The last `n` entries, one per line.
    pub fn tail(&self, n: usize) -> String {
        let skip = self.entries.len().saturating_sub(n);
        let mut s = String::new();
        for e in self.entries.iter().skip(skip) {
            s.push_str(&e.to_string());
            s.push('\n');
        }
        s
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.discarded > 0 {
            writeln!(f, "({} older entries discarded)", self.discarded)?;
        }
        for e in &self.entries {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}
