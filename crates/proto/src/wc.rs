//! Work completions: what a completion queue's poll returns (the verbs layer re-exports
//! these types; the transport engines produce them).
//!
//! The numeric values are the verbs ABI's: [`WcStatus`] is `enum ibv_wc_status`
//! (`<infiniband/verbs.h>`), [`WcOpcode`] is `enum ibv_wc_opcode` and [`WcFlags`] the `wc_flags`
//! bits.

use std::fmt;

bitflags::bitflags! {
    /// Work-completion flags (`ibv_wc_flags`, `<infiniband/verbs.h>`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A GRH (for RoCE: the IP header, 40 bytes) precedes the payload (UD receives).
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 2;
        /// The IP checksum was verified.
        const IP_CSUM_OK = 4;
        /// `invalidated_rkey` is valid (SEND_WITH_INV received).
        const WITH_INV = 8;
    }
}

/// Completion status (`enum ibv_wc_status`; IBA Vol 1 §11.6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcStatus {
    /// 0: the WR completed successfully.
    #[default]
    Success = 0,
    /// 1: local length error.
    LocLenErr = 1,
    /// 2: local QP operation error.
    LocQpOpErr = 2,
    /// 3: local EE context operation error (RD only).
    LocEecOpErr = 3,
    /// 4: local protection error.
    LocProtErr = 4,
    /// 5: flushed because the QP is in ERR.
    WrFlushErr = 5,
    /// 6: memory-window bind error.
    MwBindErr = 6,
    /// 7: bad response.
    BadRespErr = 7,
    /// 8: local access error.
    LocAccessErr = 8,
    /// 9: remote invalid request.
    RemInvReqErr = 9,
    /// 10: remote access error.
    RemAccessErr = 10,
    /// 11: remote operation error.
    RemOpErr = 11,
    /// 12: transport retry counter exceeded.
    RetryExcErr = 12,
    /// 13: RNR retry counter exceeded.
    RnrRetryExcErr = 13,
    /// 14: local RDD violation (RD only).
    LocRddViolErr = 14,
    /// 15: remote invalid RD request (RD only).
    RemInvRdReqErr = 15,
    /// 16: remote aborted.
    RemAbortErr = 16,
    /// 17: invalid EE context number (RD only).
    InvEecnErr = 17,
    /// 18: invalid EE context state (RD only).
    InvEecStateErr = 18,
    /// 19: fatal error.
    FatalErr = 19,
    /// 20: response timeout.
    RespTimeoutErr = 20,
    /// 21: general error.
    GeneralErr = 21,
}

impl WcStatus {
    /// Every status, in numeric order.
    pub const ALL: [WcStatus; 22] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
    ];

    /// The ABI value.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The status with ABI value `v`, or `None`.
    pub fn from_u32(v: u32) -> Option<WcStatus> {
        WcStatus::ALL.iter().copied().find(|s| s.as_u32() == v)
    }

    /// The text `ibv_wc_status_str` style tools print.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }

    /// Whether this is [`WcStatus::Success`].
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation a completion reports (`enum ibv_wc_opcode`, `<infiniband/verbs.h>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcOpcode {
    /// 0: SEND (also SEND_WITH_IMM / SEND_WITH_INV on the sender).
    #[default]
    Send = 0,
    /// 1: RDMA WRITE (with or without immediate) on the requester.
    RdmaWrite = 1,
    /// 2: RDMA READ.
    RdmaRead = 2,
    /// 3: atomic compare-and-swap.
    CompSwap = 3,
    /// 4: atomic fetch-and-add.
    FetchAdd = 4,
    /// 5: memory-window bind.
    BindMw = 5,
    /// 6: local invalidate.
    LocalInv = 6,
    /// 7: TCP segmentation offload.
    Tso = 7,
    /// 8: FLUSH.
    Flush = 8,
    /// 9: ATOMIC WRITE.
    AtomicWrite = 9,
    /// 128: a receive consumed by an incoming SEND.
    Recv = 128,
    /// 129: a receive consumed by an incoming RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// The ABI value.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The opcode with ABI value `v`, or `None`.
    pub const fn from_u32(v: u32) -> Option<WcOpcode> {
        Some(match v {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            7 => WcOpcode::Tso,
            8 => WcOpcode::Flush,
            9 => WcOpcode::AtomicWrite,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            _ => return None,
        })
    }

    /// Whether this is a receive-side opcode (bit 7, `IBV_WC_RECV` and above).
    pub const fn is_recv(self) -> bool {
        (self as u32) & 0x80 != 0
    }
}

/// One work completion (`struct ibv_wc`).
///
/// For an error completion only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful
/// (IBA §11.6.2); uroce also fills `opcode` with the operation of the WR that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WorkCompletion {
    /// The application's identifier of the work request.
    pub wr_id: u64,
    /// Completion status.
    pub status: WcStatus,
    /// Which operation completed.
    pub opcode: WcOpcode,
    /// Vendor error syndrome (0 unless an error sets it).
    pub vendor_err: u32,
    /// Bytes transferred (receives: bytes placed, including the 40-byte GRH on UD).
    pub byte_len: u32,
    /// Immediate data in host order, valid with [`WcFlags::WITH_IMM`].
    pub imm_data: u32,
    /// The R_Key invalidated by a SEND_WITH_INV, valid with [`WcFlags::WITH_INV`].
    pub invalidated_rkey: u32,
    /// The local QP the WR belonged to.
    pub qp_num: u32,
    /// Remote QP number (UD receives: the sender's QPN from the DETH).
    pub src_qp: u32,
    /// Completion flags.
    pub wc_flags: WcFlags,
    /// P_Key index (UD/GSI receives).
    pub pkey_index: u16,
    /// The sender asked for a solicited event (receive completions). Not an `ibv_wc`
    /// field: the CQ uses it for solicited-only notification.
    pub solicited: bool,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits (0 on RoCE).
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// An error completion: `wr_id`, `status`, `opcode`, `qp_num` set, everything else zero.
    pub fn error(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            qp_num,
            ..WorkCompletion::default()
        }
    }
}

impl WorkCompletion {
    /// A completion with `status`, `opcode` and `qp_num`, every other field zero.
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
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            solicited: false,
        }
    }
}

#[cfg(test)]
#[path = "tests/wc.rs"]
mod tests;
