//! Send-queue entries: a posted WR plus its transmission progress.

use uroce_wire::{Pmtu, Psn};

use crate::wr::{SendOpcode, SendWr, WcStatus};

/// What kind of packets a WQE produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WqeKind {
    /// SEND / WRITE: one request packet per PSN, acknowledged by ACKs.
    Data,
    /// RDMA READ: one request, `npkts` response PSNs.
    Read,
    /// Atomic: one request, one ATOMIC_ACKNOWLEDGE.
    Atomic,
    /// ATOMIC WRITE (IBA 1.5): one request (RETH + 8 bytes), answered by a zero-length
    /// RDMA READ RESPONSE ONLY.
    AtomicWrite,
    /// BIND_MW / LOCAL_INV: no packets, no PSN; executed through `Memory` when the
    /// requester reaches it, completed once every earlier WQE has completed.
    Local,
}

/// One send WR in the send queue.
#[derive(Debug)]
pub(super) struct SendWqe {
    /// The WR (its SGE list is the one copy the engine keeps).
    pub wr: SendWr,
    /// Message length in bytes (≤ 2^31).
    pub len: u64,
    /// PSNs the message consumes (≥ 1).
    pub npkts: u32,
    /// A PSN range was assigned and (part of) the WR was sent.
    pub started: bool,
    /// First PSN (valid when `started`).
    pub first_psn: Psn,
    /// SEND/WRITE: index of the next packet to send. READ/atomic/ATOMIC WRITE: 0 = the
    /// request must be (re)sent, 1 = sent.
    pub next_pkt: u32,
    /// READ: response packets received and placed so far.
    pub resp_pkts: u32,
    /// An error status found for this WQE; reported when the QP flushes.
    pub error: Option<WcStatus>,
}

impl SendWqe {
    /// A fresh WQE for `wr` with message length `len`.
    pub fn new(wr: SendWr, len: u64, pmtu: Pmtu) -> SendWqe {
        let npkts = match wr.opcode {
            SendOpcode::AtomicCmpAndSwp
            | SendOpcode::AtomicFetchAndAdd
            | SendOpcode::AtomicWrite => 1,
            SendOpcode::LocalInv | SendOpcode::BindMw => 0,
            // invariant: len ≤ 2^31 (post-time check), so ≤ 2^23 packets: fits u32.
            _ => u32::try_from(pmtu.packets_for(len)).unwrap_or(u32::MAX),
        };
        SendWqe {
            wr,
            len,
            npkts,
            started: false,
            first_psn: Psn::ZERO,
            next_pkt: 0,
            resp_pkts: 0,
            error: None,
        }
    }

    /// The packet kind.
    pub fn kind(&self) -> WqeKind {
        match self.wr.opcode {
            SendOpcode::RdmaRead => WqeKind::Read,
            SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd => WqeKind::Atomic,
            SendOpcode::AtomicWrite => WqeKind::AtomicWrite,
            SendOpcode::LocalInv | SendOpcode::BindMw => WqeKind::Local,
            _ => WqeKind::Data,
        }
    }

    /// READ, atomic or ATOMIC WRITE: answered by a response, counted against
    /// `max_rd_atomic`.
    pub fn is_rd_atomic(&self) -> bool {
        matches!(
            self.kind(),
            WqeKind::Read | WqeKind::Atomic | WqeKind::AtomicWrite
        )
    }

    /// One past the last PSN of the message.
    pub fn end_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npkts)
    }

    /// Does the started WQE's PSN range contain `psn`?
    pub fn contains(&self, psn: Psn) -> bool {
        self.started && psn.is_at_or_after(self.first_psn) && psn.is_before(self.end_psn())
    }
}
