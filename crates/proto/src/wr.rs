//! Work requests and work completions: what the application posts and what it polls.
//!
//! These are the verbs-level values the engines consume and produce. Numeric values match
//! `enum ibv_wr_opcode`, `enum ibv_wc_status`, `enum ibv_wc_opcode` and the flag bits of
//! libibverbs (roce-spec.md §3.4, §5.1), so the C ABI can convert by value.

use crate::memory::Sge;
use bitflags::bitflags;
use core::fmt;

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
        matches!(self, SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd)
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data is scattered.
    pub sg_list: Vec<Sge>,
}

/// `enum ibv_wc_status` (roce-spec.md §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The libibverbs spelling, e.g. `"IBV_WC_WR_FLUSH_ERR"`'s suffix `"WR_FLUSH_ERR"`.
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "SUCCESS",
            WcStatus::LocLenErr => "LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "LOC_PROT_ERR",
            WcStatus::WrFlushErr => "WR_FLUSH_ERR",
            WcStatus::MwBindErr => "MW_BIND_ERR",
            WcStatus::BadRespErr => "BAD_RESP_ERR",
            WcStatus::LocAccessErr => "LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "REM_ACCESS_ERR",
            WcStatus::RemOpErr => "REM_OP_ERR",
            WcStatus::RetryExcErr => "RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "REM_ABORT_ERR",
            WcStatus::InvEecnErr => "INV_EECN_ERR",
            WcStatus::InvEecStateErr => "INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "FATAL_ERR",
            WcStatus::RespTimeoutErr => "RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "GENERAL_ERR",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A GRH (for RoCE: the IP header) precedes the data (UD).
        const GRH = 1 << 0;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// IP checksum verified.
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// A work completion with the fields of `struct ibv_wc`. For error completions only
/// `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful (as in verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The WR's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Implementation-specific detail for errors (0 when none).
    pub vendor_err: u32,
    /// Bytes transferred (receives: bytes placed; READ: bytes read; atomics: 8).
    pub byte_len: u32,
    /// Immediate data (valid with `WITH_IMM`), as carried in ImmDt.
    pub imm_data: u32,
    /// The invalidated R_Key (valid with `WITH_INV`).
    pub invalidated_rkey: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The remote QP number (UD receives; RC/UC report the connected peer).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (always 0 on uroce).
    pub pkey_index: u16,
    /// Solicited event requested by the sender (receive completions). Not an `ibv_wc` field:
    /// the CQ uses it for solicited-only notification.
    pub solicited: bool,
}

impl WorkCompletion {
    /// A completion with `status` and everything else zero.
    pub const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            solicited: false,
        }
    }
}
