//! Typed errors, one enum per operation.
//!
//! Each variant says what was wrong and carries the offending value and its limit, so a
//! caller (or the C ABI layer later) can both report and map it (`EINVAL`, `EBUSY`,
//! `ENOMEM`, ...).

use std::fmt;
use std::net::IpAddr;

use uroce_proto::qp_state::{AttrMask, ModifyError, QpState, QpType};

use crate::event::{ElementKind, EventType};

/// Object kinds, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A device context.
    Context,
    /// A protection domain.
    Pd,
    /// A memory region.
    Mr,
    /// A completion queue.
    Cq,
    /// A completion channel.
    CompChannel,
    /// A queue pair.
    Qp,
    /// A shared receive queue.
    Srq,
    /// An XRC domain.
    Xrcd,
    /// An address handle.
    Ah,
    /// A memory window.
    Mw,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Context => "context",
            ObjectKind::Pd => "PD",
            ObjectKind::Mr => "MR",
            ObjectKind::Mw => "MW",
            ObjectKind::Cq => "CQ",
            ObjectKind::CompChannel => "completion channel",
            ObjectKind::Qp => "QP",
            ObjectKind::Srq => "SRQ",
            ObjectKind::Xrcd => "XRC domain",
            ObjectKind::Ah => "AH",
        })
    }
}

/// The live children that keep a parent from being destroyed (only non-zero counts are
/// printed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Children {
    /// Protection domains.
    pub pds: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Completion channels.
    pub channels: usize,
    /// XRC domains.
    pub xrcds: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Shared receive queues (including XRC SRQs).
    pub srqs: usize,
    /// Address handles.
    pub ahs: usize,
    /// Memory windows.
    pub mws: usize,
}

impl Children {
    /// Whether every count is zero.
    pub fn is_empty(&self) -> bool {
        *self == Children::default()
    }
}

impl fmt::Display for Children {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            (self.pds, "PD"),
            (self.cqs, "CQ"),
            (self.channels, "completion channel"),
            (self.xrcds, "XRC domain"),
            (self.qps, "QP"),
            (self.mrs, "MR"),
            (self.srqs, "SRQ"),
            (self.ahs, "AH"),
        ];
        let mut first = true;
        for (n, name) in parts {
            if n > 0 {
                if !first {
                    f.write_str(", ")?;
                }
                write!(f, "{n} {name}(s)")?;
                first = false;
            }
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

/// Why an explicit destroy failed. The handle is returned with the error, unchanged in the
/// `Busy` case; in the `InUse` case the object is already unpublished (no new lookups, no new
/// events) and a later `destroy` or drop finishes the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DestroyError {
    /// The object still has children (`EBUSY` in verbs).
    #[error("cannot destroy the {object}: it still has {children}")]
    Busy {
        /// What was being destroyed.
        object: ObjectKind,
        /// Its live children.
        children: Children,
    },
    /// References to the object were still held when the destroy timeout expired
    /// (unacknowledged events, lookups by the transport, references the application kept).
    #[error("cannot destroy the {object}: {references} reference(s) still held (unacknowledged events?)")]
    InUse {
        /// What was being destroyed.
        object: ObjectKind,
        /// References beyond the handle's own.
        references: usize,
    },
    /// The memory of a memory region could not be retired (accesses still in progress).
    #[error("cannot deregister the MR: {0}")]
    Memory(#[from] crate::mem::MemError),
}

/// Invalid device configuration or query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The name is empty, too long or has characters other than ASCII alphanumerics, `_`, `-`.
    #[error("invalid device name {name:?}: 1-63 characters of [A-Za-z0-9_-]")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// The address is unspecified (`0.0.0.0` / `::`).
    #[error("device address {addr} is unspecified")]
    UnspecifiedAddress {
        /// The address given.
        addr: IpAddr,
    },
    /// The link MTU cannot carry even a 256-byte payload plus headers.
    #[error("link MTU {link_mtu} is below the minimum {min}")]
    LinkMtuTooSmall {
        /// The MTU given.
        link_mtu: u32,
        /// Smallest usable link MTU.
        min: u32,
    },
    /// The QPN range is empty, includes QP0 or QP1, or goes beyond 24 bits.
    #[error("QP number range {first:#x}..={last:#x} is empty or outside 2..=0xffffff")]
    InvalidQpnRange {
        /// Its first number.
        first: u32,
        /// Its last number.
        last: u32,
    },
    /// The SRQ number range is empty, includes 0, or goes beyond 24 bits.
    #[error("SRQ number range {first:#x}..={last:#x} is empty or outside 1..=0xffffff")]
    InvalidSrqnRange {
        /// Its first number.
        first: u32,
        /// Its last number.
        last: u32,
    },
    /// Only port 1 exists.
    #[error("port {port} does not exist (the device has port 1 only)")]
    InvalidPort {
        /// The port asked for.
        port: u8,
    },
    /// GID index out of the table.
    #[error("GID index {index} is outside the table of {len} entries")]
    InvalidGidIndex {
        /// The index asked for.
        index: u32,
        /// Table length.
        len: u32,
    },
    /// P_Key index out of the table.
    #[error("P_Key index {index} is outside the table of {len} entries")]
    InvalidPkeyIndex {
        /// The index asked for.
        index: u16,
        /// Table length.
        len: u16,
    },
}

/// Why opening a context or allocating a simple object (PD, channel, XRC domain) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The device limit for this kind of object is reached.
    #[error("too many {object}s (device limit {max})")]
    Limit {
        /// What was being allocated.
        object: ObjectKind,
        /// The limit.
        max: u32,
    },
    /// The eventfd behind a pollable queue could not be created.
    #[error("eventfd creation failed: {0}")]
    Eventfd(rustix::io::Errno),
}

/// Why `create_cq` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateCqError {
    /// `cqe` is 0 or above the device's `max_cqe`.
    #[error("CQ size {cqe} is outside 1..={max}")]
    InvalidSize {
        /// The size asked for.
        cqe: u32,
        /// `max_cqe`.
        max: u32,
    },
    /// The completion channel belongs to another context.
    #[error("the completion channel belongs to another context")]
    ForeignChannel,
    /// Device limit on CQs reached.
    #[error("too many CQs (device limit {max})")]
    Limit {
        /// `max_cq`.
        max: u32,
    },
}

/// Why [`crate::CqRef::resize`] failed (`ibv_resize_cq`: `EINVAL` for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResizeCqError {
    /// `cqe` is 0 or above the device's `max_cqe`.
    #[error("CQ size {cqe} is outside 1..={max}")]
    InvalidSize {
        /// The size asked for.
        cqe: u32,
        /// `max_cqe`.
        max: u32,
    },
    /// The CQ holds more completions than the new size.
    #[error("CQ size {cqe} is below the {pending} completions it holds")]
    TooSmall {
        /// The size asked for.
        cqe: u32,
        /// Completions waiting to be polled.
        pending: usize,
    },
}

/// Why `req_notify` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// The CQ was created without a completion channel, so there is nothing to notify.
    #[error("the CQ has no completion channel to notify")]
    NoChannel,
}

/// Why a blocking wait on an event queue or completion channel ended without an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The queue was shut down (context closed / channel shut down) and is empty.
    #[error("the queue was shut down")]
    Shutdown,
    /// The timeout expired.
    #[error("timed out")]
    Timeout,
    /// `poll(2)` failed.
    #[error("poll failed: {0}")]
    Poll(rustix::io::Errno),
}

/// Why an event could not be raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RaiseError {
    /// The event type names a different kind of object.
    #[error("{event} is about a {expected:?}, not a {given:?}")]
    WrongElement {
        /// The event type.
        event: EventType,
        /// The kind it names.
        expected: ElementKind,
        /// The kind it was raised on.
        given: ElementKind,
    },
}

/// Why `create_qp` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateQpError {
    /// uroce does not implement this QP type (SMI, RAW_PACKET), or, on a context with a
    /// transport (a network device's), no transport engine exists for it (see
    /// [`crate::engine::engine_supported`]).
    #[error("QP type {0} is not supported")]
    UnsupportedType(QpType),
    /// This QP type is created elsewhere (XRC_RECV: through its XRC domain).
    #[error("a {0} QP must be created through an XRC domain")]
    NeedsXrcDomain(QpType),
    /// A capability exceeds the device limit.
    #[error("QP capability {cap} = {value} exceeds the device limit {max}")]
    CapTooLarge {
        /// Which capability (`max_send_wr`, ...).
        cap: &'static str,
        /// The value asked for.
        value: u32,
        /// The limit.
        max: u32,
    },
    /// A CQ the QP type needs was not given.
    #[error("a {qp_type} QP needs a {which} CQ")]
    MissingCq {
        /// The QP type.
        qp_type: QpType,
        /// "send" or "recv".
        which: &'static str,
    },
    /// The QP type has no receive side but a receive CQ or SRQ was given.
    #[error("a {qp_type} QP has no receive queue; {what} must not be given")]
    NoReceiveSide {
        /// The QP type.
        qp_type: QpType,
        /// What was given.
        what: &'static str,
    },
    /// The SRQ is an XRC SRQ (only usable through XRC QPs) or otherwise unusable.
    #[error("the SRQ cannot be attached to a {0} QP")]
    BadSrq(QpType),
    /// A CQ, SRQ or domain belongs to another context.
    #[error("the {0} belongs to another context")]
    ForeignObject(ObjectKind),
    /// Device QP limit reached, or the QPN space is full.
    #[error("too many QPs (limit {max})")]
    Limit {
        /// `max_qp`.
        max: u32,
    },
    /// The GSI QP (QPN 1) already exists in this context.
    #[error("the GSI QP (QPN 1) already exists")]
    GsiExists,
    /// The number asked for (an XRC target QP numbered by its domain) is in use in this
    /// context.
    #[error("QP number {0:#x} is already in use")]
    QpnInUse(u32),
}

/// Why `modify_qp` failed; the QP is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyQpError {
    /// The state table refused the transition or attribute set (names the attribute).
    #[error(transparent)]
    Table(#[from] ModifyError),
    /// An attribute value is invalid.
    #[error("attribute {name} is invalid: {reason}")]
    InvalidValue {
        /// The attribute bit.
        attr: AttrMask,
        /// Its verbs name (`IBV_QP_...`).
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl ModifyQpError {
    /// The attribute the error is about, when it names one.
    pub fn attr(&self) -> Option<AttrMask> {
        match self {
            ModifyQpError::Table(
                ModifyError::MissingAttribute { attr, .. }
                | ModifyError::UnexpectedAttribute { attr, .. }
                | ModifyError::ValueOutOfRange { attr, .. },
            )
            | ModifyQpError::InvalidValue { attr, .. } => Some(*attr),
            ModifyQpError::Table(
                ModifyError::CurStateNotAllowed { .. }
                | ModifyError::CurStateMismatch { .. }
                | ModifyError::CurStateValueMissing,
            ) => Some(AttrMask::CUR_STATE),
            ModifyQpError::Table(
                ModifyError::InvalidTransition { .. }
                | ModifyError::StateAttributeMissing { .. }
                | ModifyError::SqStillDraining { .. },
            ) => Some(AttrMask::STATE),
            _ => None,
        }
    }
}

/// Why `post_send` / `post_recv` refused a work request (nothing was queued for it, and no
/// completion is generated).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// The QP state does not accept this kind of post.
    #[error("cannot post a {queue} WR in state {state}")]
    InvalidState {
        /// "send" or "receive".
        queue: &'static str,
        /// The QP's state.
        state: QpState,
    },
    /// The QP has no such queue (XRC_RECV has no SQ; XRC_SEND no RQ).
    #[error("a {qp_type} QP has no {queue} queue")]
    NoQueue {
        /// The QP type.
        qp_type: QpType,
        /// "send" or "receive".
        queue: &'static str,
    },
    /// The QP receives from an SRQ; post to the SRQ instead.
    #[error("the QP is attached to an SRQ; post receives to the SRQ")]
    SrqAttached,
    /// More SGEs than the queue allows.
    #[error("{num} SGEs exceed the queue's max_sge {max}")]
    TooManySge {
        /// SGEs in the WR.
        num: usize,
        /// The limit.
        max: u32,
    },
    /// Inline data larger than `max_inline_data`.
    #[error("{len} bytes of inline data exceed max_inline_data {max}")]
    InlineTooLong {
        /// Inline bytes.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// The AH belongs to another protection domain than the QP.
    #[error("the AH belongs to another protection domain")]
    ForeignAh,
    /// An XRC_SEND WR without a valid 24-bit remote SRQ number.
    #[error("an XRC send WR needs a 24-bit remote SRQ number, got {0:#x}")]
    BadRemoteSrqn(u32),
    /// The message is longer than the device (or, for UD, the port MTU) allows.
    #[error("message of {len} bytes exceeds the maximum {max}")]
    MessageTooLong {
        /// Total bytes.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The transport engine refused the WR, for the typed reason given.
    #[error("work request refused: {0}")]
    Refused(uroce_proto::wr::WrError),
    /// The queue already holds `max_*_wr` outstanding WRs.
    #[error("the {queue} queue is full ({max} outstanding WRs)")]
    QueueFull {
        /// "send", "receive" or "SRQ".
        queue: &'static str,
        /// Its capacity.
        max: u32,
    },
    /// The object is being destroyed.
    #[error("the {0} is being destroyed")]
    Destroyed(ObjectKind),
}

/// A batch post stopped at a bad WR; WRs before `index` were posted (`bad_wr` in verbs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("WR #{index} was refused: {error}")]
pub struct BatchPostError {
    /// Index of the refused WR in the batch.
    pub index: usize,
    /// Why it was refused.
    pub error: PostError,
}

/// Why `create_srq` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateSrqError {
    /// A size exceeds the device limit or is zero.
    #[error("SRQ {what} = {value} is outside 1..={max}")]
    InvalidSize {
        /// `max_wr` or `max_sge`.
        what: &'static str,
        /// The value asked for.
        value: u32,
        /// The limit.
        max: u32,
    },
    /// `srq_limit` larger than `max_wr`.
    #[error("srq_limit {limit} exceeds max_wr {max_wr}")]
    LimitTooLarge {
        /// The limit asked for.
        limit: u32,
        /// `max_wr`.
        max_wr: u32,
    },
    /// An object belongs to another context.
    #[error("the {0} belongs to another context")]
    ForeignObject(ObjectKind),
    /// Device SRQ limit reached.
    #[error("too many SRQs (limit {max})")]
    Limit {
        /// `max_srq`.
        max: u32,
    },
}

/// Why `modify_srq` failed; the SRQ is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifySrqError {
    /// `srq_limit` larger than `max_wr`.
    #[error("srq_limit {limit} exceeds max_wr {max_wr}")]
    LimitTooLarge {
        /// The limit asked for.
        limit: u32,
        /// `max_wr`.
        max_wr: u32,
    },
    /// A resize below the number of queued WRs or above the device limit.
    #[error("max_wr {requested} is outside {min}..={max}")]
    InvalidSize {
        /// The size asked for.
        requested: u32,
        /// Smallest allowed (WRs queued now, at least 1).
        min: u32,
        /// `max_srq_wr`.
        max: u32,
    },
}

/// Why `create_ah` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateAhError {
    /// Only port 1 exists.
    #[error("port {0} does not exist")]
    InvalidPort(u8),
    /// The source GID index names no populated GID entry.
    #[error("source GID index {0} has no GID")]
    InvalidSgidIndex(u8),
    /// RoCE needs a global route: the destination GID must be set.
    #[error("the destination GID is zero (RoCE address vectors must be global)")]
    ZeroDgid,
    /// The flow label has bits above the 20-bit field.
    #[error("flow label {0:#x} exceeds 20 bits")]
    FlowLabel(u32),
    /// Device limit on AHs reached.
    #[error("too many AHs (limit {max})")]
    Limit {
        /// `max_ah`.
        max: u32,
    },
}

/// Why `reg_mr` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegMrError {
    /// The region parameters are invalid.
    #[error(transparent)]
    Mr(#[from] crate::mr::MrError),
    /// Device MR limit reached.
    #[error("too many MRs (limit {max})")]
    Limit {
        /// `max_mr`.
        max: u32,
    },
}

/// Why an XRC-domain operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XrcError {
    /// `open_qp` / `reg_xrc_rcv_qp`: the domain has no XRC_RECV QP with this number.
    #[error("the XRC domain has no XRC_RECV QP {0:#x}")]
    NoSuchQp(u32),
    /// `unreg_xrc_rcv_qp`: the QP is not registered.
    #[error("XRC_RECV QP {0:#x} is not registered")]
    NotRegistered(u32),
    /// `create_reg_qp`: the QP could not be created.
    #[error("creating the XRC_RECV QP: {0}")]
    Create(#[source] CreateQpError),
    /// `create_reg_qp`: the QP could not be taken to RTR.
    #[error("taking the XRC_RECV QP to RTR: {0}")]
    Modify(#[source] ModifyQpError),
    /// `unreg_xrc_rcv_qp`: the QP could not be destroyed.
    #[error("destroying the XRC_RECV QP: {0}")]
    Destroy(#[source] DestroyError),
}

/// Why [`crate::AhAttr::from_wc`] cannot answer a received datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AhFromWcError {
    /// The completion has no GRH area (`WcFlags::GRH` is clear: not a UD/GSI receive).
    #[error("the completion carries no GRH (not a datagram receive)")]
    NoGrh,
    /// The GRH area holds no RoCEv2 IPv4 or IPv6 header.
    #[error(transparent)]
    Grh(#[from] uroce_wire::grh_area::GrhAreaError),
    /// The datagram went to a multicast address: there is no local GID to answer from.
    #[error("the datagram went to multicast address {0}")]
    Multicast(std::net::IpAddr),
    /// The datagram's destination is not this device's GID.
    #[error("the datagram's destination {0} is no GID of this device")]
    NotLocal(std::net::IpAddr),
}
