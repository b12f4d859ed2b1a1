//! Work requests: what the application posts. (Work completions are in [`crate::wc`] and
//! re-exported here.)
//!
//! These are the verbs-level values the engines consume and produce. Numeric values match
//! `enum ibv_wr_opcode`, `enum ibv_wc_status`, `enum ibv_wc_opcode` and the flag bits of
//! libibverbs (roce-spec.md §3.4, §5.1), so the C ABI can convert by value.

use crate::memory::Sge;
pub use crate::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use bitflags::bitflags;

/// The operation of a send work request (`enum ibv_wr_opcode` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum SendOpcode {
    /// RDMA WRITE.
    RdmaWrite = 0,
    /// RDMA WRITE with immediate data (consumes a receive WQE at the target).
    RdmaWriteWithImm = 1,
    /// SEND.
    Send = 2,
    /// SEND with immediate data.
    SendWithImm = 3,
    /// RDMA READ.
    RdmaRead = 4,
    /// Atomic compare-and-swap on 8 bytes.
    AtomicCmpAndSwp = 5,
    /// Atomic fetch-and-add on 8 bytes.
    AtomicFetchAndAdd = 6,
    /// Local invalidate (no wire traffic).
    LocalInv = 7,
    /// Memory-window bind (no wire traffic).
    BindMw = 8,
    /// SEND with invalidate (the target invalidates `invalidate_rkey`).
    SendWithInv = 9,
}

impl SendOpcode {
    /// From the `ibv_wr_opcode` value.
    pub const fn from_u32(v: u32) -> Option<SendOpcode> {
        Some(match v {
            0 => SendOpcode::RdmaWrite,
            1 => SendOpcode::RdmaWriteWithImm,
            2 => SendOpcode::Send,
            3 => SendOpcode::SendWithImm,
            4 => SendOpcode::RdmaRead,
            5 => SendOpcode::AtomicCmpAndSwp,
            6 => SendOpcode::AtomicFetchAndAdd,
            7 => SendOpcode::LocalInv,
            8 => SendOpcode::BindMw,
            9 => SendOpcode::SendWithInv,
            _ => return None,
        })
    }

    /// True for READ and the atomics (they use responder resources and the
    /// `max_rd_atomic` budget, and wait for a response).
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOpcode::RdmaRead | SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd
        )
    }

    /// True for the two atomics.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd
        )
    }

    /// The work-completion opcode reported for this WR.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOpcode::RdmaWrite | SendOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            SendOpcode::Send | SendOpcode::SendWithImm | SendOpcode::SendWithInv => WcOpcode::Send,
            SendOpcode::RdmaRead => WcOpcode::RdmaRead,
            SendOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            SendOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            SendOpcode::LocalInv => WcOpcode::LocalInv,
            SendOpcode::BindMw => WcOpcode::BindMw,
        }
    }
}

bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier READ/atomic WRs to complete before starting this one.
        const FENCE = 1 << 0;
        /// Generate a completion even when the QP does not signal all WRs.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit on the last packet.
        const SOLICITED = 1 << 2;
        /// The data was copied at post time (`SendPayload::Inline`).
        const INLINE = 1 << 3;
        /// IP checksum offload (unused by RoCE).
        const IP_CSUM = 1 << 4;
    }
}

/// Where the data of a send WR comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SendPayload {
    /// Gathered from local memory when the packets are built.
    Sges(Vec<Sge>),
    /// Copied at post time (`IBV_SEND_INLINE`): no local memory access later.
    Inline(Vec<u8>),
}

impl SendPayload {
    /// Total bytes of the payload.
    pub fn len(&self) -> u64 {
        match self {
            SendPayload::Sges(s) => crate::memory::sg_total(s),
            SendPayload::Inline(d) => d.len() as u64,
        }
    }

    /// True for zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: SendOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// Local data: the source of SEND/WRITE, the destination of READ results; for atomics
    /// one 8-byte SGE receiving the original remote value.
    pub payload: SendPayload,
    /// Immediate data as the 32-bit value carried in ImmDt (big-endian on the wire).
    pub imm_data: u32,
    /// SEND_WITH_INV: the R_Key the target invalidates.
    pub invalidate_rkey: u32,
    /// RDMA and atomics: remote virtual address.
    pub remote_addr: u64,
    /// RDMA and atomics: remote key.
    pub rkey: u32,
    /// Atomics: compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD).
    pub compare_add: u64,
    /// Atomics: swap value (CMP_AND_SWP).
    pub swap: u64,
}

impl SendWr {
    /// A WR with `opcode` over `sges` and every other field zero/empty.
    pub fn new(wr_id: u64, opcode: SendOpcode, sges: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::empty(),
            payload: SendPayload::Sges(sges),
            imm_data: 0,
            invalidate_rkey: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data is scattered.
    pub sg_list: Vec<Sge>,
}

impl RecvWr {
    /// A receive WR scattering into `sg_list`.
    pub fn new(wr_id: u64, sg_list: Vec<Sge>) -> RecvWr {
        RecvWr { wr_id, sg_list }
    }

    /// Total bytes the WR can receive.
    pub fn total_len(&self) -> u64 {
        crate::memory::sg_total(&self.sg_list)
    }
}
