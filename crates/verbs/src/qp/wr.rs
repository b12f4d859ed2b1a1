//! Work requests as the application posts them (`struct ibv_send_wr`, `ibv_recv_wr`).

use crate::ah::AhRef;

/// Largest total length of a receive WR (roce-spec §4 notes: "< 2^31").
pub const MAX_RECV_LEN: u64 = (1 << 31) - 1;

/// Send WR flags (`enum ibv_send_flags`): the protocol layer's type. With
/// [`SendFlags::INLINE`] the payload is [`SendWr::inline_data`], copied at post time.
pub use uroce_proto::wr::SendFlags;

/// Work-request opcodes (`enum ibv_wr_opcode`, ABI values): the protocol layer's one
/// vocabulary.
pub use uroce_proto::wr::SendOpcode;

/// One scatter/gather element (the protocol layer's type).
pub use uroce_proto::memory::Sge;

/// A scatter/gather list and an inline payload (the protocol layer's types): the first
/// entry, and up to 64 inline bytes, kept in place, so a single-buffer or small inline
/// work request is posted without an allocation.
pub use uroce_proto::wr::{InlineData, SgList};

/// RDMA READ/WRITE (and ATOMIC WRITE) target (`wr.rdma`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RdmaInfo {
    /// Remote virtual address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// Atomic operands (`wr.atomic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicInfo {
    /// Remote virtual address (8-byte aligned).
    pub remote_addr: u64,
    /// Compare value (CAS) or addend (FAA).
    pub compare_add: u64,
    /// Swap value (CAS).
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// UD destination (`wr.ud`).
#[derive(Debug, Clone)]
pub struct UdDest {
    /// The address handle (must belong to the QP's PD).
    pub ah: AhRef,
    /// Destination QPN.
    pub remote_qpn: u32,
    /// Q_Key.
    pub remote_qkey: u32,
}

/// A send work request (`struct ibv_send_wr`); unused fields stay at their defaults.
#[derive(Debug, Clone)]
pub struct SendWr {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: SendOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// Local buffers (ignored with [`SendFlags::INLINE`]).
    pub sg_list: SgList,
    /// The payload of an INLINE send, copied at post time.
    pub inline_data: InlineData,
    /// Immediate data (host order) for `*_WITH_IMM`.
    pub imm_data: u32,
    /// R_Key to invalidate (`SEND_WITH_INV`, `LOCAL_INV`).
    pub invalidate_rkey: u32,
    /// RDMA READ/WRITE and ATOMIC WRITE target.
    pub rdma: RdmaInfo,
    /// Atomic operands.
    pub atomic: AtomicInfo,
    /// UD destination.
    pub ud: Option<UdDest>,
    /// XRC_SEND: the remote XRC SRQ number.
    pub xrc_remote_srqn: u32,
    /// BIND_MW: the window, its new R_Key, the region, range and rights (`wr.bind_mw`).
    pub bind_mw: Option<crate::mw::BindMwWr>,
}

impl Default for SendWr {
    /// An unsignaled SEND with no data; every other field zero or empty.
    fn default() -> SendWr {
        SendWr {
            wr_id: 0,
            opcode: SendOpcode::Send,
            flags: SendFlags::empty(),
            sg_list: SgList::new(),
            inline_data: InlineData::new(),
            imm_data: 0,
            invalidate_rkey: 0,
            rdma: RdmaInfo::default(),
            atomic: AtomicInfo::default(),
            ud: None,
            xrc_remote_srqn: 0,
            bind_mw: None,
        }
    }
}

impl SendWr {
    /// A signaled SEND of `sg_list`.
    pub fn send(wr_id: u64, sg_list: impl Into<SgList>) -> SendWr {
        SendWr {
            wr_id,
            opcode: SendOpcode::Send,
            flags: SendFlags::SIGNALED,
            sg_list: sg_list.into(),
            ..SendWr::default()
        }
    }

    /// A signaled IBA 1.5 ATOMIC WRITE (RC only): `value` (8 bytes, stored in this order)
    /// is written at the target's 8-byte aligned `remote_addr` under `rkey` as one 64-bit
    /// store. The bytes travel inline with the WR ([`SendFlags::INLINE`], not limited by
    /// `max_inline_data`); an SGE list of exactly 8 bytes works too. The region needs
    /// REMOTE_WRITE; the WR counts against `max_rd_atomic` like a READ and completes with
    /// `WcOpcode::AtomicWrite`.
    pub fn atomic_write(wr_id: u64, rkey: u32, remote_addr: u64, value: [u8; 8]) -> SendWr {
        SendWr {
            wr_id,
            opcode: SendOpcode::AtomicWrite,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            inline_data: InlineData::from_slice(&value),
            rdma: RdmaInfo { remote_addr, rkey },
            ..SendWr::default()
        }
    }

    /// Total payload length: inline bytes with INLINE, else the sum of the SGE lengths.
    pub fn total_len(&self) -> u64 {
        if self.flags.contains(SendFlags::INLINE) {
            self.inline_data.len() as u64
        } else {
            self.sg_list.iter().map(|s| u64::from(s.length)).sum()
        }
    }
}

/// A receive work request (the protocol layer's type).
pub use uroce_proto::wr::RecvWr;
