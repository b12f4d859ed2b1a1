//! Work requests: what the application posts. (Work completions are in [`crate::wc`] and
//! re-exported here.)
//!
//! These are the verbs-level values the engines consume and produce. Numeric values match
//! `enum ibv_wr_opcode`, `enum ibv_wc_status`, `enum ibv_wc_opcode` and the flag bits of
//! libibverbs (`<infiniband/verbs.h>`), so the C ABI can convert by value.

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
    /// TCP segmentation offload (raw packet QPs; not on RoCE).
    Tso = 10,
    /// Driver-specific operation.
    Driver1 = 11,
    /// FLUSH (IBA 1.5 persistence).
    Flush = 14,
    /// ATOMIC WRITE (IBA 1.5).
    AtomicWrite = 15,
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
            10 => SendOpcode::Tso,
            11 => SendOpcode::Driver1,
            14 => SendOpcode::Flush,
            15 => SendOpcode::AtomicWrite,
            _ => return None,
        })
    }

    /// True for READ, the two atomics and ATOMIC WRITE: each is answered by a response
    /// the requester waits for, takes a responder resource at the target (which replays
    /// the response to a duplicate without executing it again) and counts against the
    /// `max_rd_atomic` budget and for FENCE (see `rc::requester` for why ATOMIC WRITE is
    /// counted).
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOpcode::RdmaRead
                | SendOpcode::AtomicCmpAndSwp
                | SendOpcode::AtomicFetchAndAdd
                | SendOpcode::AtomicWrite
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
            SendOpcode::Tso => WcOpcode::Tso,
            SendOpcode::Driver1 => WcOpcode::Send,
            SendOpcode::Flush => WcOpcode::Flush,
            SendOpcode::AtomicWrite => WcOpcode::AtomicWrite,
        }
    }

    /// The ABI value.
    pub const fn as_u32(self) -> u32 {
        self as u32
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

/// A work request's scatter/gather list. One entry is kept in place (the size of a `Vec`),
/// so the common single-buffer work request is posted without an allocation; longer lists
/// go to the heap. Build one from a `Vec` with `.into()`, from an iterator with
/// `collect()`, or with [`SgList::from_slice`].
pub type SgList = smallvec::SmallVec<[Sge; 1]>;

/// The payload of an inline send, copied at post time: up to 64 bytes kept in place, so
/// small inline sends (latency tests, 64-byte message-rate tests, control messages) post
/// without an allocation. (A work request grows by 48 bytes over a `Vec`; send queues hold
/// only the work requests in flight.)
pub type InlineData = smallvec::SmallVec<[u8; 64]>;

/// Where the data of a send WR comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SendPayload {
    /// Gathered from local memory when the packets are built.
    Sges(SgList),
    /// Copied at post time (`IBV_SEND_INLINE`): no local memory access later.
    Inline(InlineData),
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
    /// one 8-byte SGE receiving the original remote value; for ATOMIC WRITE exactly the 8
    /// bytes stored at the target (SGEs or inline).
    pub payload: SendPayload,
    /// Immediate data as the 32-bit value carried in ImmDt (big-endian on the wire).
    pub imm_data: u32,
    /// SEND_WITH_INV: the R_Key the target invalidates.
    pub invalidate_rkey: u32,
    /// RDMA and atomics: remote virtual address.
    pub remote_addr: u64,
    /// RDMA and atomics: remote key.
    pub rkey: u32,
    /// Atomics: compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD). (ATOMIC WRITE
    /// carries its 8 bytes in `payload`, as `ibv_post_send` does in the SGE list.)
    pub compare_add: u64,
    /// Atomics: swap value (CMP_AND_SWP).
    pub swap: u64,
    /// UD and GSI QPs: where the datagram goes (the address handle, remote QPN and
    /// Q_Key of `wr.ud`); `None` on connected QPs.
    pub ud: Option<UdDest>,
    /// XRC_SEND QPs: the SRQ number at the target (`qp_type.xrc.remote_srqn`).
    pub remote_srqn: u32,
    /// BIND_MW: the window, region, range and rights (`None` for every other opcode).
    pub bind: Option<crate::memory::MwBind>,
}

/// The destination of a UD send: the resolved address handle plus `wr.ud`'s remote QPN
/// and Q_Key (IBA 11.4.1.1, Post Send Request: "Address Vector, Destination QP, Q_Key").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The IP address the address handle's GID resolves to.
    pub ip: std::net::IpAddr,
    /// The destination QP number (24 bits).
    pub remote_qpn: u32,
    /// The Q_Key of the WR. A value with the high-order bit set means "use the QP's own
    /// Q_Key" (IBA 10.2.5, C10-15).
    pub remote_qkey: u32,
    /// GRH traffic class (IPv4 TOS / IPv6 traffic class).
    pub traffic_class: u8,
    /// GRH hop limit (IPv4 TTL / IPv6 hop limit).
    pub hop_limit: u8,
    /// GRH flow label (20 bits).
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
}

impl UdDest {
    /// A destination with the address-handle defaults (traffic class 0, hop limit 64,
    /// flow label 0, SL 0).
    pub const fn new(ip: std::net::IpAddr, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            ip,
            remote_qpn,
            remote_qkey,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            sl: 0,
        }
    }
}

/// Why an engine refused a work request (`PostError::InvalidWr`): each reason an engine
/// or the verbs layer can give, so that callers and tests can tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WrError {
    /// The opcode is not executed by this QP type (e.g. READ on UC, WRITE on UD).
    #[error("opcode {opcode:?} is not supported on a {qp_type:?} QP")]
    OpcodeNotSupported {
        /// The refused opcode.
        opcode: SendOpcode,
        /// The QP's transport.
        qp_type: crate::qp_state::QpType,
    },
    /// LOCAL_INV / BIND_MW on a QP type whose engine does not execute local operations
    /// (UC, UD, GSI).
    #[error("{0:?} is a local operation, not a transport one")]
    LocalOperation(SendOpcode),
    /// BIND_MW without its bind description (`SendWr::bind` is `None`).
    #[error("BIND_MW without a bind description")]
    MissingBind,
    /// Inline data with READ or an atomic.
    #[error("inline payload for READ or atomic")]
    InlineForReadOrAtomic,
    /// READ or an atomic on a QP whose `max_rd_atomic` is 0.
    #[error("READ/atomic on a QP with max_rd_atomic 0")]
    NoReadAtomicBudget,
    /// The message is longer than 2^31 bytes.
    #[error("message of {len} bytes is longer than 2^31")]
    MessageTooLong {
        /// The message length.
        len: u64,
    },
    /// A UD message larger than the path MTU (IBA 9.8.3.1: UD is single-packet).
    #[error("UD message of {len} bytes exceeds the path MTU of {mtu} bytes")]
    LargerThanMtu {
        /// The message length.
        len: u64,
        /// The path MTU.
        mtu: u32,
    },
    /// An atomic's local buffer (or ATOMIC WRITE's payload) is not 8 bytes.
    #[error("atomic local buffer is {len} bytes, not 8")]
    AtomicLength {
        /// The local buffer length.
        len: u64,
    },
    /// An atomic's remote address is not 8-byte aligned.
    #[error("atomic remote address {addr:#x} is not 8-byte aligned")]
    AtomicAlignment {
        /// The remote address.
        addr: u64,
    },
    /// A READ would span more than 2^22 PSNs.
    #[error("READ spans more than 2^22 PSNs")]
    ReadTooLong,
    /// A datagram WR without a destination (`ud` is `None`) on a UD/GSI QP.
    #[error("UD work request without an address handle")]
    MissingDestination,
    /// `post_recv` on a QP that takes its receive WQEs from an SRQ.
    #[error("the QP takes its receive WQEs from an SRQ")]
    UsesSrq,
    /// The QP the request names does not exist (test harnesses).
    #[error("no such QP")]
    UnknownQp,
    /// `post_send` on an XRC target (XRC_RECV) QP, which has no send queue.
    #[error("an XRC target QP has no send queue")]
    NoSendQueue,
    /// `post_recv` on an XRC initiator (XRC_SEND) QP, which has no receive queue.
    #[error("an XRC initiator QP has no receive queue")]
    NoRecvQueue,
}

impl SendWr {
    /// A WR with `opcode` over `sges` and every other field zero/empty.
    pub fn new(wr_id: u64, opcode: SendOpcode, sges: impl Into<SgList>) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::empty(),
            payload: SendPayload::Sges(sges.into()),
            imm_data: 0,
            invalidate_rkey: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            remote_srqn: 0,
            bind: None,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data is scattered.
    pub sg_list: SgList,
}

impl RecvWr {
    /// A receive WR scattering into `sg_list` (a `Vec<Sge>`, an array or an [`SgList`]).
    pub fn new(wr_id: u64, sg_list: impl Into<SgList>) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: sg_list.into(),
        }
    }

    /// Total bytes the WR can receive.
    pub fn total_len(&self) -> u64 {
        crate::memory::sg_total(&self.sg_list)
    }
}
