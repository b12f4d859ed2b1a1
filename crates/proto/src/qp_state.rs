//! The IBTA queue-pair state machine for `modify_qp`, as declarative data.
//!
//! Reference: IBA Vol 1 §11.2.5 as Linux checks it (docs/INTEROP-NOTES.md §6), §10.3 for what
//! each state allows.
//!
//! # Data model
//!
//! * [`QpState`] and [`QpType`] carry the verbs ABI values (`ibv_qp_state`, `ibv_qp_type`;
//!   SMI/GSI use the kernel values 0/1).
//! * [`AttrMask`] is the `ibv_qp_attr_mask` bit set. [`AttrMask::attr_name`] names one bit in
//!   the `IBV_QP_PATH_MTU` style, [`AttrMask::single_bits`] walks a mask lowest bit first.
//! * [`MODIFY_TABLE`] is the state table itself: one [`TransitionRule`] per
//!   (transition, QP-type group), in the order of the state table, holding the attributes that
//!   are *required* and those that are *optional* for that transition. Rows that the spec
//!   writes as "INIT/RTR/RTS/SQD/SQE/ERR → ERR" are expanded to one row per source state.
//! * **Validity is per transition, not per type** (INTEROP-NOTES §6 step 2: "the (cur,next)
//!   entry must be valid"). A QP type that a valid transition's rows do not name gets empty
//!   required/optional sets: the transition is allowed with nothing but `IBV_QP_STATE` (for
//!   example RAW_PACKET INIT→RTR). The table spells these out as rows with
//!   [`TransitionRule::implicit`] set, so every (type, from, to) of a valid transition
//!   resolves to exactly one row and [`rule`] never needs a fallback.
//! * A transition with no rows is invalid for every type: RESET→RTR, INIT→RTS, RTR→RTR,
//!   RESET→ERR (current mainline has no such entry), anything →SQE, and so on.
//!
//! [`check_modify`] checks one `modify_qp` call (INTEROP-NOTES §6): (1) `CUR_STATE` is only
//! accepted while the QP is RTR, RTS, SQD or SQE (and must then name the actual state);
//! (2) the (current, next) entry must exist; (3) every required bit must be present;
//! (4) no bit outside required ∪ optional ∪ {`STATE`} may be present. When several bits are
//! missing or foreign the lowest one is reported, so errors are deterministic.
//!
//! [`QpAttrLimits`] adds the value-range checks rxe makes on top of it (INTEROP-NOTES §6), and
//! the [`QpState`] methods [`QpState::send_post`], [`QpState::recv_post`],
//! [`QpState::responder_active`] and [`QpState::requester_active`] say what each state allows
//! the verbs layer and the transport engines to do.
//!
//! Everything here is pure data and total functions: no I/O, no panics, no `unsafe`.

use core::fmt;

use bitflags::bitflags;

/// A queue-pair state (`enum ibv_qp_state`; the discriminants are the ABI values).
///
/// The derived ordering follows the numeric values, which the spec's "≥ RTR"-style rules use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpState {
    /// RESET (0): freshly created or reset; queues hold nothing, no traffic.
    Reset = 0,
    /// INIT (1): receive WRs may be posted; no packets are processed yet.
    Init = 1,
    /// RTR (2), ready to receive: the responder processes request packets.
    Rtr = 2,
    /// RTS (3), ready to send: requester and responder both run.
    Rts = 3,
    /// SQD (4), send queue drain: in-flight send WQEs finish, no new ones start.
    Sqd = 4,
    /// SQE (5), send queue error (UD/UC/SMI/GSI only; rxe never enters it).
    Sqe = 5,
    /// ERR (6): everything outstanding and newly posted is flushed.
    Err = 6,
}

impl QpState {
    /// Every state, in numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The state with ABI value `value`, or `None` for a value outside 0..=6.
    pub const fn from_u32(value: u32) -> Option<QpState> {
        match value {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }

    /// The ABI value (`ibv_qp_state`).
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The spec's upper-case name ("RESET", "RTR", ...).
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }

    /// What happens to a send WR posted in this state; `None` = the post is rejected.
    ///
    /// INTEROP-NOTES §6 (rxe post rules): post_send requires RTS or later (ERR flushes).
    /// * RTS: [`PostOutcome::Process`].
    /// * SQD: [`PostOutcome::Defer`]: queued, but SQD starts no new WQE until the QP is
    ///   moved back to RTS.
    /// * SQE, ERR: [`PostOutcome::Flush`]: completed with `WR_FLUSH_ERR` (IBA §10.3 for ERR; SQE
    ///   is numerically ≥ RTS and its send queue is in error, so it flushes too).
    /// * RESET, INIT, RTR: `None`.
    pub const fn send_post(self) -> Option<PostOutcome> {
        match self {
            QpState::Reset | QpState::Init | QpState::Rtr => None,
            QpState::Rts => Some(PostOutcome::Process),
            QpState::Sqd => Some(PostOutcome::Defer),
            QpState::Sqe | QpState::Err => Some(PostOutcome::Flush),
        }
    }

    /// What happens to a receive WR posted in this state; `None` = the post is rejected.
    ///
    /// INTEROP-NOTES §6: post_recv requires ≥ INIT; IBA §10.3: WRs posted in ERR are flushed.
    /// * INIT, RTR, RTS, SQD, SQE: [`PostOutcome::Process`] (queued on the RQ and consumed by
    ///   incoming SENDs once the responder runs; SQE only affects the send queue).
    /// * ERR: [`PostOutcome::Flush`].
    /// * RESET: `None`.
    pub const fn recv_post(self) -> Option<PostOutcome> {
        match self {
            QpState::Reset => None,
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe => {
                Some(PostOutcome::Process)
            }
            QpState::Err => Some(PostOutcome::Flush),
        }
    }

    /// Whether `ibv_post_send` accepts a WR in this state (RTS, SQD, SQE, ERR); see
    /// [`QpState::send_post`] for what then happens to it.
    pub const fn can_post_send(self) -> bool {
        self.send_post().is_some()
    }

    /// Whether `ibv_post_recv` accepts a WR in this state (every state but RESET); see
    /// [`QpState::recv_post`] for what then happens to it.
    pub const fn can_post_recv(self) -> bool {
        self.recv_post().is_some()
    }

    /// Whether the responder processes incoming *request* packets: RTR, RTS, SQD, SQE.
    ///
    /// IBA §9.6: request packets need responder state ≥ RTR; INTEROP-NOTES §6: RTR enables the
    /// responder. SQD and SQE only stop the send side. ERR passes the numeric "≥ RTR" test
    /// of the receive path but its responder only flushes (IBA §10.3), so it is not active here.
    pub const fn responder_active(self) -> bool {
        matches!(
            self,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// Whether the requester/completer run: RTS, and SQD while it drains.
    ///
    /// IBA §9.6: response packets need requester state RTS/SQD; INTEROP-NOTES §6: RTS enables
    /// the requester; SQD starts draining and raises SQ_DRAINED when done. In SQD the requester
    /// still (re)transmits and completes WQEs already started but starts no new one; see
    /// [`QpState::starts_send_wqes`].
    pub const fn requester_active(self) -> bool {
        matches!(self, QpState::Rts | QpState::Sqd)
    }

    /// Whether the requester may start a *new* send WQE: RTS only (SQD drains, IBA §10.3).
    pub const fn starts_send_wqes(self) -> bool {
        matches!(self, QpState::Rts)
    }

    /// Whether `IBV_QP_CUR_STATE` may be given while the QP is in this state (INTEROP-NOTES §6
    /// step 1: RTR, RTS, SQD or SQE).
    pub const fn accepts_cur_state_attr(self) -> bool {
        matches!(
            self,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the verbs layer does with a work request posted in a given state
/// ([`QpState::send_post`], [`QpState::recv_post`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PostOutcome {
    /// Queued and eligible for processing now.
    Process,
    /// Queued, but not started until the QP returns to a processing state (SQD send queue).
    Defer,
    /// Accepted and completed with `IBV_WC_WR_FLUSH_ERR` (IBA §10.3).
    Flush,
}

/// A queue-pair transport type (`enum ibv_qp_type`; SMI/GSI carry the kernel values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpType {
    /// SMI (QP0; kernel `IB_QPT_SMI` = 0). Not used on RoCE (IBA Annex A17) but part of the table.
    Smi = 0,
    /// GSI (QP1; kernel `IB_QPT_GSI` = 1): CM and other MADs.
    Gsi = 1,
    /// Reliable connected (`IBV_QPT_RC` = 2).
    Rc = 2,
    /// Unreliable connected (`IBV_QPT_UC` = 3).
    Uc = 3,
    /// Unreliable datagram (`IBV_QPT_UD` = 4).
    Ud = 4,
    /// Raw packet (`IBV_QPT_RAW_PACKET` = 8).
    RawPacket = 8,
    /// XRC send side (`IBV_QPT_XRC_SEND` = 9; kernel `IB_QPT_XRC_INI`).
    XrcSend = 9,
    /// XRC receive side (`IBV_QPT_XRC_RECV` = 10; kernel `IB_QPT_XRC_TGT`).
    XrcRecv = 10,
}

impl QpType {
    /// Every QP type, in numeric order.
    pub const ALL: [QpType; 8] = [
        QpType::Smi,
        QpType::Gsi,
        QpType::Rc,
        QpType::Uc,
        QpType::Ud,
        QpType::RawPacket,
        QpType::XrcSend,
        QpType::XrcRecv,
    ];

    /// The type with ABI value `value`, or `None` for an unknown value.
    pub const fn from_u32(value: u32) -> Option<QpType> {
        match value {
            0 => Some(QpType::Smi),
            1 => Some(QpType::Gsi),
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            8 => Some(QpType::RawPacket),
            9 => Some(QpType::XrcSend),
            10 => Some(QpType::XrcRecv),
            _ => None,
        }
    }

    /// The ABI value.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The name the state table uses ("RC", "XRC_INI", "RAW_PACKET", ...).
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Smi => "SMI",
            QpType::Gsi => "GSI",
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::RawPacket => "RAW_PACKET",
            QpType::XrcSend => "XRC_INI",
            QpType::XrcRecv => "XRC_TGT",
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

bitflags! {
    /// `ibv_qp_attr_mask`: which fields of a `modify_qp` attribute block are valid.
    ///
    /// Bits 21..=24 (reserved in the kernel) and 26..=31 are not named; a mask carrying them
    /// is refused by [`check_modify`] with [`ModifyError::UnknownAttributeBits`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct AttrMask: u32 {
        /// `IBV_QP_STATE`: `qp_state` (the target state).
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`: `cur_qp_state` (the state the consumer believes the QP is in).
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: raise SQ_DRAINED when SQD finishes draining.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`: `qp_access_flags` (remote read/write/atomic).
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`: `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`: `port_num`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`: `qkey` (UD/GSI).
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`: `ah_attr`, the primary path's address vector.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`: `path_mtu` (enum value 1..=5 = 256..4096 bytes).
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`: `timeout` (local ACK timeout exponent, 0..=31).
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`: `retry_cnt` (0..=7).
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`: `rnr_retry` (0..=7, 7 = infinite).
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`: `rq_psn` (responder expected PSN).
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: `max_rd_atomic` (initiator depth).
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`: the alternate path (`alt_ah_attr`, `alt_timeout`, ...).
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`: `min_rnr_timer` (code 0..=31 sent in RNR NAKs).
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`: `sq_psn` (requester first PSN).
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: `max_dest_rd_atomic` (responder resources).
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`: `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`: `cap` (queue sizes).
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`: `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT`: `rate_limit` (RAW_PACKET).
        const RATE_LIMIT = 1 << 25;
    }
}

impl AttrMask {
    /// The verbs name of a single attribute bit (`AttrMask::PATH_MTU` → `"IBV_QP_PATH_MTU"`).
    ///
    /// Returns `"IBV_QP_<unknown>"` for anything that is not exactly one named bit (empty,
    /// several bits, or an unnamed bit).
    pub const fn attr_name(self) -> &'static str {
        match self.bits() {
            0x0000_0001 => "IBV_QP_STATE",
            0x0000_0002 => "IBV_QP_CUR_STATE",
            0x0000_0004 => "IBV_QP_EN_SQD_ASYNC_NOTIFY",
            0x0000_0008 => "IBV_QP_ACCESS_FLAGS",
            0x0000_0010 => "IBV_QP_PKEY_INDEX",
            0x0000_0020 => "IBV_QP_PORT",
            0x0000_0040 => "IBV_QP_QKEY",
            0x0000_0080 => "IBV_QP_AV",
            0x0000_0100 => "IBV_QP_PATH_MTU",
            0x0000_0200 => "IBV_QP_TIMEOUT",
            0x0000_0400 => "IBV_QP_RETRY_CNT",
            0x0000_0800 => "IBV_QP_RNR_RETRY",
            0x0000_1000 => "IBV_QP_RQ_PSN",
            0x0000_2000 => "IBV_QP_MAX_QP_RD_ATOMIC",
            0x0000_4000 => "IBV_QP_ALT_PATH",
            0x0000_8000 => "IBV_QP_MIN_RNR_TIMER",
            0x0001_0000 => "IBV_QP_SQ_PSN",
            0x0002_0000 => "IBV_QP_MAX_DEST_RD_ATOMIC",
            0x0004_0000 => "IBV_QP_PATH_MIG_STATE",
            0x0008_0000 => "IBV_QP_CAP",
            0x0010_0000 => "IBV_QP_DEST_QPN",
            0x0200_0000 => "IBV_QP_RATE_LIMIT",
            _ => "IBV_QP_<unknown>",
        }
    }

    /// Every set bit of `self` as its own mask, lowest bit first (unnamed bits included).
    pub fn single_bits(self) -> SingleBits {
        SingleBits {
            remaining: self.bits(),
        }
    }

    /// The lowest set bit of `self`, or `None` for an empty mask.
    pub const fn lowest_bit(self) -> Option<AttrMask> {
        let bits = self.bits();
        if bits == 0 {
            None
        } else {
            // `bits & bits.wrapping_neg()` isolates the lowest set bit.
            Some(AttrMask::from_bits_retain(bits & bits.wrapping_neg()))
        }
    }

    /// The bits of `self` that have no name in [`AttrMask`].
    pub const fn unknown_bits(self) -> u32 {
        self.bits() & !AttrMask::all().bits()
    }
}

/// Iterator over the single bits of an [`AttrMask`], lowest first ([`AttrMask::single_bits`]).
///
/// At most 32 items: every step clears one bit of a `u32`.
#[derive(Debug, Clone)]
pub struct SingleBits {
    remaining: u32,
}

impl Iterator for SingleBits {
    type Item = AttrMask;

    fn next(&mut self) -> Option<AttrMask> {
        let bit = AttrMask::from_bits_retain(self.remaining).lowest_bit()?;
        self.remaining &= !bit.bits();
        Some(bit)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for SingleBits {}

/// One row of the modify-QP table: the `from`→`to` transition for the QP types in `types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransitionRule {
    /// Current state.
    pub from: QpState,
    /// Target state (equal to `from` for attribute-only modifies).
    pub to: QpState,
    /// The QP types this row applies to (no type appears in two rows of one transition).
    pub types: &'static [QpType],
    /// Attributes that must all be in the mask.
    pub required: AttrMask,
    /// Attributes that may be in the mask (besides `required` and `STATE`).
    pub optional: AttrMask,
    /// `true` when the state table does not name these types for this (valid) transition: the
    /// row exists because validity is per transition, and unnamed types have empty
    /// required/optional sets (see the module docs).
    pub implicit: bool,
}

impl TransitionRule {
    /// Whether this row applies to `qp_type`.
    pub fn applies_to(&self, qp_type: QpType) -> bool {
        self.types.contains(&qp_type)
    }

    /// Every bit a mask may carry for this transition: required ∪ optional ∪ {`STATE`}.
    pub const fn allowed(&self) -> AttrMask {
        self.required.union(self.optional).union(AttrMask::STATE)
    }
}

// Table abbreviations (INTEROP-NOTES §6), to keep the table below close to its text.
const PKI: AttrMask = AttrMask::PKEY_INDEX;
const ACC: AttrMask = AttrMask::ACCESS_FLAGS;
const CUR: AttrMask = AttrMask::CUR_STATE;
const MIG: AttrMask = AttrMask::PATH_MIG_STATE;
const MDRA: AttrMask = AttrMask::MAX_DEST_RD_ATOMIC;
const MQRA: AttrMask = AttrMask::MAX_QP_RD_ATOMIC;
const RNRT: AttrMask = AttrMask::MIN_RNR_TIMER;
const ALT: AttrMask = AttrMask::ALT_PATH;
const SQDN: AttrMask = AttrMask::EN_SQD_ASYNC_NOTIFY;
const PORT: AttrMask = AttrMask::PORT;
const QKEY: AttrMask = AttrMask::QKEY;
const AV: AttrMask = AttrMask::AV;
const PATH_MTU: AttrMask = AttrMask::PATH_MTU;
const DEST_QPN: AttrMask = AttrMask::DEST_QPN;
const RQ_PSN: AttrMask = AttrMask::RQ_PSN;
const SQ_PSN: AttrMask = AttrMask::SQ_PSN;
const TIMEOUT: AttrMask = AttrMask::TIMEOUT;
const RETRY_CNT: AttrMask = AttrMask::RETRY_CNT;
const RNR_RETRY: AttrMask = AttrMask::RNR_RETRY;
const RATE_LIMIT: AttrMask = AttrMask::RATE_LIMIT;

// QP-type groups as the state table writes them.
const ALL_TYPES: &[QpType] = &QpType::ALL;
const UD: &[QpType] = &[QpType::Ud];
const UC: &[QpType] = &[QpType::Uc];
const RC: &[QpType] = &[QpType::Rc];
const XRC_INI: &[QpType] = &[QpType::XrcSend];
const XRC_TGT: &[QpType] = &[QpType::XrcRecv];
const RAW: &[QpType] = &[QpType::RawPacket];
const SMI_GSI: &[QpType] = &[QpType::Smi, QpType::Gsi];
const UC_RC_XRC: &[QpType] = &[QpType::Uc, QpType::Rc, QpType::XrcSend, QpType::XrcRecv];
const RC_XRC: &[QpType] = &[QpType::Rc, QpType::XrcSend, QpType::XrcRecv];
const ALL_BUT_RAW: &[QpType] = &[
    QpType::Ud,
    QpType::Uc,
    QpType::Rc,
    QpType::XrcSend,
    QpType::XrcRecv,
    QpType::Smi,
    QpType::Gsi,
];

/// Builds one [`TransitionRule`]; `[]` is the spec's "–".
macro_rules! rule {
    ($from:ident => $to:ident, $types:expr, [$($req:ident),*], [$($opt:ident),*]) => {
        rule!(@ $from, $to, $types, [$($req),*], [$($opt),*], false)
    };
    (implicit $from:ident => $to:ident, $types:expr) => {
        rule!(@ $from, $to, $types, [], [], true)
    };
    (@ $from:ident, $to:ident, $types:expr, [$($req:ident),*], [$($opt:ident),*], $implicit:expr) => {
        TransitionRule {
            from: QpState::$from,
            to: QpState::$to,
            types: $types,
            required: AttrMask::from_bits_retain(0 $(| $req.bits())*),
            optional: AttrMask::from_bits_retain(0 $(| $opt.bits())*),
            implicit: $implicit,
        }
    };
}

/// The modify-QP state table (INTEROP-NOTES §6), one row per (transition, QP-type group), in the
/// spec's order. Rows marked `implicit` give the types a valid transition does not name their
/// empty attribute sets; transitions with no row are invalid.
pub static MODIFY_TABLE: &[TransitionRule] = &[
    rule!(Reset => Reset, ALL_TYPES, [], []),
    // RESET → INIT
    rule!(Reset => Init, UD, [PKI, PORT, QKEY], []),
    rule!(Reset => Init, UC_RC_XRC, [PKI, PORT, ACC], []),
    rule!(Reset => Init, SMI_GSI, [PKI, QKEY], []),
    rule!(Reset => Init, RAW, [PORT], []),
    // INIT → INIT
    rule!(Init => Init, UD, [], [PKI, PORT, QKEY]),
    rule!(Init => Init, UC_RC_XRC, [], [PKI, PORT, ACC]),
    rule!(Init => Init, SMI_GSI, [], [PKI, QKEY]),
    rule!(implicit Init => Init, RAW),
    // INIT → RTR
    rule!(Init => Rtr, UD, [], [PKI, QKEY]),
    rule!(Init => Rtr, UC, [AV, PATH_MTU, DEST_QPN, RQ_PSN], [ALT, ACC, PKI]),
    rule!(Init => Rtr, RC, [AV, PATH_MTU, DEST_QPN, RQ_PSN, MDRA, RNRT], [ALT, ACC, PKI]),
    rule!(Init => Rtr, XRC_INI, [AV, PATH_MTU, DEST_QPN, RQ_PSN], [ALT, ACC, PKI]),
    rule!(Init => Rtr, XRC_TGT, [AV, PATH_MTU, DEST_QPN, RQ_PSN, MDRA, RNRT], [ALT, ACC, PKI]),
    rule!(Init => Rtr, SMI_GSI, [], [PKI, QKEY]),
    rule!(implicit Init => Rtr, RAW),
    // RTR → RTS
    rule!(Rtr => Rts, UD, [SQ_PSN], [CUR, QKEY]),
    rule!(Rtr => Rts, UC, [SQ_PSN], [CUR, ALT, ACC, MIG]),
    rule!(Rtr => Rts, RC, [TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MQRA], [CUR, ALT, ACC, RNRT, MIG]),
    rule!(Rtr => Rts, XRC_INI, [TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MQRA], [CUR, ALT, ACC, MIG]),
    rule!(Rtr => Rts, XRC_TGT, [TIMEOUT, SQ_PSN], [CUR, ALT, ACC, RNRT, MIG]),
    rule!(Rtr => Rts, SMI_GSI, [SQ_PSN], [CUR, QKEY]),
    rule!(Rtr => Rts, RAW, [], [RATE_LIMIT]),
    // RTS → RTS
    rule!(Rts => Rts, UD, [], [CUR, QKEY]),
    rule!(Rts => Rts, UC, [], [CUR, ACC, ALT, MIG]),
    rule!(Rts => Rts, RC, [], [CUR, ACC, ALT, MIG, RNRT]),
    rule!(Rts => Rts, XRC_INI, [], [CUR, ACC, ALT, MIG]),
    rule!(Rts => Rts, XRC_TGT, [], [CUR, ACC, ALT, MIG, RNRT]),
    rule!(Rts => Rts, SMI_GSI, [], [CUR, QKEY]),
    rule!(Rts => Rts, RAW, [], [RATE_LIMIT]),
    // RTS → SQD
    rule!(Rts => Sqd, ALL_BUT_RAW, [], [SQDN]),
    rule!(implicit Rts => Sqd, RAW),
    // SQD → RTS
    rule!(Sqd => Rts, UD, [], [CUR, QKEY]),
    rule!(Sqd => Rts, UC, [], [CUR, ALT, ACC, MIG]),
    rule!(Sqd => Rts, RC, [], [CUR, ALT, ACC, RNRT, MIG]),
    rule!(Sqd => Rts, XRC_INI, [], [CUR, ALT, ACC, MIG]),
    rule!(Sqd => Rts, XRC_TGT, [], [CUR, ALT, ACC, RNRT, MIG]),
    rule!(Sqd => Rts, SMI_GSI, [], [CUR, QKEY]),
    rule!(implicit Sqd => Rts, RAW),
    // SQD → SQD
    rule!(Sqd => Sqd, UD, [], [PKI, QKEY]),
    rule!(Sqd => Sqd, UC, [], [AV, ALT, ACC, PKI, MIG]),
    rule!(
        Sqd => Sqd,
        RC,
        [],
        [PORT, AV, TIMEOUT, RETRY_CNT, RNR_RETRY, MQRA, MDRA, ALT, ACC, PKI, RNRT, MIG]
    ),
    rule!(
        Sqd => Sqd,
        XRC_INI,
        [],
        [PORT, AV, TIMEOUT, RETRY_CNT, RNR_RETRY, MQRA, ALT, ACC, PKI, MIG]
    ),
    rule!(Sqd => Sqd, XRC_TGT, [], [PORT, AV, TIMEOUT, MDRA, ALT, ACC, PKI, RNRT, MIG]),
    rule!(Sqd => Sqd, SMI_GSI, [], [PKI, QKEY]),
    rule!(implicit Sqd => Sqd, RAW),
    // SQE → RTS
    rule!(Sqe => Rts, UD, [], [CUR, QKEY]),
    rule!(Sqe => Rts, UC, [], [CUR, ACC]),
    rule!(Sqe => Rts, SMI_GSI, [], [CUR, QKEY]),
    // The spec lists RC and XRC explicitly: entry valid, no attributes besides STATE.
    rule!(Sqe => Rts, RC_XRC, [], []),
    rule!(implicit Sqe => Rts, RAW),
    // INIT/RTR/RTS/SQD/SQE/ERR → ERR
    rule!(Init => Err, ALL_TYPES, [], []),
    rule!(Rtr => Err, ALL_TYPES, [], []),
    rule!(Rts => Err, ALL_TYPES, [], []),
    rule!(Sqd => Err, ALL_TYPES, [], []),
    rule!(Sqe => Err, ALL_TYPES, [], []),
    rule!(Err => Err, ALL_TYPES, [], []),
    // INIT/RTR/RTS/SQD/SQE/ERR → RESET
    rule!(Init => Reset, ALL_TYPES, [], []),
    rule!(Rtr => Reset, ALL_TYPES, [], []),
    rule!(Rts => Reset, ALL_TYPES, [], []),
    rule!(Sqd => Reset, ALL_TYPES, [], []),
    rule!(Sqe => Reset, ALL_TYPES, [], []),
    rule!(Err => Reset, ALL_TYPES, [], []),
];

/// The table row for `qp_type` going `from` → `to`, or `None` if the transition is invalid.
pub fn rule(qp_type: QpType, from: QpState, to: QpState) -> Option<&'static TransitionRule> {
    MODIFY_TABLE
        .iter()
        .find(|r| r.from == from && r.to == to && r.applies_to(qp_type))
}

/// Whether the state table has an entry for `from` → `to` (for any QP type).
pub fn is_valid_transition(from: QpState, to: QpState) -> bool {
    MODIFY_TABLE.iter().any(|r| r.from == from && r.to == to)
}

/// Why a `modify_qp` call was refused (verbs would answer `EINVAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// The state table has no entry for this transition.
    #[error("invalid QP state transition {from}→{to} for QP type {qp_type}")]
    InvalidTransition {
        /// The QP's type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute is absent from the mask (the lowest such bit).
    #[error("missing required attribute {name} for {from}→{to}")]
    MissingAttribute {
        /// The missing bit.
        attr: AttrMask,
        /// Its verbs name (`IBV_QP_...`).
        name: &'static str,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The mask carries an attribute the transition does not accept (the lowest such bit).
    #[error("attribute {name} is not allowed for {from}→{to}")]
    UnexpectedAttribute {
        /// The foreign bit.
        attr: AttrMask,
        /// Its verbs name (`IBV_QP_...`).
        name: &'static str,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// `IBV_QP_CUR_STATE` was given while the QP is not RTR, RTS, SQD or SQE.
    #[error(
        "IBV_QP_CUR_STATE may only be given in RTR, RTS, SQD or SQE, but the QP is in {current}"
    )]
    CurStateNotAllowed {
        /// The QP's actual state.
        current: QpState,
    },
    /// `IBV_QP_CUR_STATE` names a state other than the QP's actual one.
    #[error("IBV_QP_CUR_STATE says {given}, but the QP is in {actual}")]
    CurStateMismatch {
        /// The value passed with `IBV_QP_CUR_STATE`.
        given: QpState,
        /// The QP's actual state.
        actual: QpState,
    },
    /// The mask has `IBV_QP_CUR_STATE` but the caller supplied no value for it.
    #[error("IBV_QP_CUR_STATE is set in the mask but no current-state value was supplied")]
    CurStateValueMissing,
    /// The caller asked for a state change without `IBV_QP_STATE` in the mask.
    #[error("target state {next} differs from the current state {current} but IBV_QP_STATE is not in the mask")]
    StateAttributeMissing {
        /// The QP's actual state.
        current: QpState,
        /// The target state passed in.
        next: QpState,
    },
    /// The mask has bits that name no attribute.
    #[error("attribute mask has unknown bits {bits:#010x}")]
    UnknownAttributeBits {
        /// The unknown bits only.
        bits: u32,
    },
    /// An attribute value is outside its allowed range ([`QpAttrLimits`]).
    #[error("attribute {name} value {value} is outside {min}..={max}")]
    ValueOutOfRange {
        /// The attribute bit the value belongs to.
        attr: AttrMask,
        /// Its verbs name (`IBV_QP_...`).
        name: &'static str,
        /// The value given.
        value: u32,
        /// Smallest allowed value.
        min: u32,
        /// Largest allowed value.
        max: u32,
    },
    /// rxe refuses to leave SQD (for anything but ERR) while the send queue still drains.
    #[error("cannot move SQD→{to} while the send queue is still draining")]
    SqStillDraining {
        /// The requested state.
        to: QpState,
    },
}

/// Validates a `modify_qp` call against the state table.
///
/// * `current`: the QP's actual state.
/// * `next`: the target state when `mask` has `STATE`; otherwise it must equal `current`
///   (an attribute-only modify is checked as the X→X transition), else
///   [`ModifyError::StateAttributeMissing`].
/// * `cur_state_attr`: the `cur_qp_state` value; consulted only when `mask` has `CUR_STATE`.
///
/// Checks, in order: unknown mask bits; `next` vs `STATE`; (1) `CUR_STATE` only in
/// RTR/RTS/SQD/SQE and equal to `current`; (2) the entry exists; (3) every required bit is
/// present (lowest missing bit reported); (4) nothing outside required ∪ optional ∪ {`STATE`}
/// (lowest foreign bit reported).
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    next: QpState,
    mask: AttrMask,
    cur_state_attr: Option<QpState>,
) -> Result<(), ModifyError> {
    let unknown = mask.unknown_bits();
    if unknown != 0 {
        return Err(ModifyError::UnknownAttributeBits { bits: unknown });
    }
    if !mask.contains(AttrMask::STATE) && next != current {
        return Err(ModifyError::StateAttributeMissing { current, next });
    }
    // (1) CUR_STATE.
    if mask.contains(AttrMask::CUR_STATE) {
        if !current.accepts_cur_state_attr() {
            return Err(ModifyError::CurStateNotAllowed { current });
        }
        match cur_state_attr {
            None => return Err(ModifyError::CurStateValueMissing),
            Some(given) if given != current => {
                return Err(ModifyError::CurStateMismatch {
                    given,
                    actual: current,
                })
            }
            Some(_) => {}
        }
    }
    // (2) The entry.
    let Some(row) = rule(qp_type, current, next) else {
        return Err(ModifyError::InvalidTransition {
            qp_type,
            from: current,
            to: next,
        });
    };
    // (3) Required bits.
    if let Some(attr) = row.required.difference(mask).lowest_bit() {
        return Err(ModifyError::MissingAttribute {
            attr,
            name: attr.attr_name(),
            from: current,
            to: next,
        });
    }
    // (4) Foreign bits.
    if let Some(attr) = mask.difference(row.allowed()).lowest_bit() {
        return Err(ModifyError::UnexpectedAttribute {
            attr,
            name: attr.attr_name(),
            from: current,
            to: next,
        });
    }
    Ok(())
}

/// rxe's extra rule (INTEROP-NOTES §6): leaving SQD for anything but ERR is refused while the send
/// queue is still draining. `sq_draining` is the requester's drain status; attribute-only
/// modifies (SQD→SQD) are not "leaving" and pass.
pub fn check_sq_drain(
    current: QpState,
    next: QpState,
    sq_draining: bool,
) -> Result<(), ModifyError> {
    if current == QpState::Sqd && sq_draining && next != QpState::Sqd && next != QpState::Err {
        Err(ModifyError::SqStillDraining { to: next })
    } else {
        Ok(())
    }
}

/// The attribute values [`QpAttrLimits::check_values`] range-checks; a field is only looked
/// at when its bit is in the mask.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpAttrValues {
    /// `path_mtu` (`PATH_MTU`): enum value 1..=5 (256, 512, 1024, 2048, 4096 bytes).
    pub path_mtu: u32,
    /// `timeout` (`TIMEOUT`).
    pub timeout: u8,
    /// `alt_timeout` (part of `ALT_PATH`).
    pub alt_timeout: u8,
    /// `retry_cnt` (`RETRY_CNT`).
    pub retry_cnt: u8,
    /// `rnr_retry` (`RNR_RETRY`).
    pub rnr_retry: u8,
    /// `min_rnr_timer` (`MIN_RNR_TIMER`).
    pub min_rnr_timer: u8,
    /// `max_rd_atomic` (`MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u32,
    /// `max_dest_rd_atomic` (`MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u32,
}

/// Value ranges for `modify_qp` attributes (INTEROP-NOTES §6, §8; IBA §9.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrLimits {
    /// Largest `timeout` / `alt_timeout` exponent (31: 5-bit field, IBA §9.7, INTEROP-NOTES §6).
    pub max_timeout: u8,
    /// Largest `retry_cnt` (7: 3-bit field, IBA §9.7).
    pub max_retry_cnt: u8,
    /// Largest `rnr_retry` (7 = infinite, IBA §9.7).
    pub max_rnr_retry: u8,
    /// Largest `min_rnr_timer` code (31: 5-bit timer code).
    pub max_min_rnr_timer: u8,
    /// Largest `max_rd_atomic` and `max_dest_rd_atomic` (128: rxe `max_qp_rd_atom` and
    /// `max_qp_init_rd_atom`, INTEROP-NOTES §6, §8).
    pub max_rd_atomic: u32,
    /// The port's active MTU as its enum value (1..=5); `path_mtu` must not exceed it.
    pub port_max_mtu: u32,
}

/// The smallest valid MTU enum value (`IBV_MTU_256`).
pub const MTU_ENUM_MIN: u32 = 1;
/// The largest valid MTU enum value (`IBV_MTU_4096`).
pub const MTU_ENUM_MAX: u32 = 5;

impl QpAttrLimits {
    /// rxe's limits for a port whose MTU enum value is `port_max_mtu` (1..=5). A value outside
    /// 1..=5 makes every `path_mtu` fail the check.
    pub const fn rxe(port_max_mtu: u32) -> QpAttrLimits {
        QpAttrLimits {
            max_timeout: 31,
            max_retry_cnt: 7,
            max_rnr_retry: 7,
            max_min_rnr_timer: 31,
            max_rd_atomic: 128,
            port_max_mtu,
        }
    }

    /// Range-checks the values whose bits are in `mask`, in mask-bit order, and reports the
    /// first out-of-range one as [`ModifyError::ValueOutOfRange`]. `path_mtu` must lie in
    /// 1..=min(5, `port_max_mtu`); `alt_timeout` is checked with `ALT_PATH`.
    pub fn check_values(&self, mask: AttrMask, values: &QpAttrValues) -> Result<(), ModifyError> {
        let mtu_max = if self.port_max_mtu < MTU_ENUM_MAX {
            self.port_max_mtu
        } else {
            MTU_ENUM_MAX
        };
        // (attribute, value, min, max), in ascending bit order.
        let checks: [(AttrMask, u32, u32, u32); 8] = [
            (AttrMask::PATH_MTU, values.path_mtu, MTU_ENUM_MIN, mtu_max),
            (
                AttrMask::TIMEOUT,
                u32::from(values.timeout),
                0,
                u32::from(self.max_timeout),
            ),
            (
                AttrMask::RETRY_CNT,
                u32::from(values.retry_cnt),
                0,
                u32::from(self.max_retry_cnt),
            ),
            (
                AttrMask::RNR_RETRY,
                u32::from(values.rnr_retry),
                0,
                u32::from(self.max_rnr_retry),
            ),
            (
                AttrMask::MAX_QP_RD_ATOMIC,
                values.max_rd_atomic,
                0,
                self.max_rd_atomic,
            ),
            (
                AttrMask::ALT_PATH,
                u32::from(values.alt_timeout),
                0,
                u32::from(self.max_timeout),
            ),
            (
                AttrMask::MIN_RNR_TIMER,
                u32::from(values.min_rnr_timer),
                0,
                u32::from(self.max_min_rnr_timer),
            ),
            (
                AttrMask::MAX_DEST_RD_ATOMIC,
                values.max_dest_rd_atomic,
                0,
                self.max_rd_atomic,
            ),
        ];
        for (attr, value, min, max) in checks {
            if mask.contains(attr) && !(min..=max).contains(&value) {
                return Err(ModifyError::ValueOutOfRange {
                    attr,
                    name: attr.attr_name(),
                    value,
                    min,
                    max,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "tests/qp_state.rs"]
mod tests;
