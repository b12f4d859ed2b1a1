//! The CM state machine as data: one row per (state, input) that does something.
//!
//! States are those of IBA Vol 1 §12.9 (the Linux CM's `enum ib_cm_state` names them the
//! same way). A (state, input) pair without a row is dropped: a stray or late message, or
//! a command the state does not allow (the agent answers a command with
//! [`super::CmError::InvalidState`]). Rows whose state is `LISTEN` describe the *new*
//! connection a listener creates for a REQ or SIDR_REQ; the listener itself stays in
//! `LISTEN`.

use core::fmt;

/// A connection's CM state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum CmState {
    Idle,
    Listen,
    ReqSent,
    ReqRcvd,
    MraReqSent,
    MraReqRcvd,
    RepSent,
    RepRcvd,
    MraRepSent,
    MraRepRcvd,
    Established,
    DreqSent,
    DreqRcvd,
    Timewait,
    SidrReqSent,
    SidrReqRcvd,
}

impl CmState {
    /// Every state, in the order of IBA §12.9.
    pub const ALL: [CmState; 16] = [
        CmState::Idle,
        CmState::Listen,
        CmState::ReqSent,
        CmState::ReqRcvd,
        CmState::MraReqSent,
        CmState::MraReqRcvd,
        CmState::RepSent,
        CmState::RepRcvd,
        CmState::MraRepSent,
        CmState::MraRepRcvd,
        CmState::Established,
        CmState::DreqSent,
        CmState::DreqRcvd,
        CmState::Timewait,
        CmState::SidrReqSent,
        CmState::SidrReqRcvd,
    ];

    /// The specification's name ("REQ_SENT", …).
    pub const fn name(self) -> &'static str {
        match self {
            CmState::Idle => "IDLE",
            CmState::Listen => "LISTEN",
            CmState::ReqSent => "REQ_SENT",
            CmState::ReqRcvd => "REQ_RCVD",
            CmState::MraReqSent => "MRA_REQ_SENT",
            CmState::MraReqRcvd => "MRA_REQ_RCVD",
            CmState::RepSent => "REP_SENT",
            CmState::RepRcvd => "REP_RCVD",
            CmState::MraRepSent => "MRA_REP_SENT",
            CmState::MraRepRcvd => "MRA_REP_RCVD",
            CmState::Established => "ESTABLISHED",
            CmState::DreqSent => "DREQ_SENT",
            CmState::DreqRcvd => "DREQ_RCVD",
            CmState::Timewait => "TIMEWAIT",
            CmState::SidrReqSent => "SIDR_REQ_SENT",
            CmState::SidrReqRcvd => "SIDR_REQ_RCVD",
        }
    }
}

impl fmt::Display for CmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What happens to a connection: an application command, a received message (already
/// matched to the connection) or a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CmInput {
    /// Command: send a REQ.
    Connect,
    /// Command: send a SIDR_REQ.
    SidrRequest,
    /// Command: accept a REQ (send a REP).
    Accept,
    /// Command: reject (send a REJ).
    Reject,
    /// Command: acknowledge receipt, ask for more time (send an MRA).
    Delay,
    /// Command: the connection is usable; on the active side sends the RTU, on the
    /// passive side it is the "communication established" notice (data arrived before
    /// the RTU).
    Establish,
    /// Command: disconnect (send a DREQ, or the DREP to a received DREQ).
    Disconnect,
    /// Internal command: answer a SIDR_REQ from the listener's QPN and Q_Key.
    SidrAnswer,
    /// A REQ (on a listener: a new one; on a connection: a duplicate).
    RecvReq,
    /// An MRA.
    RecvMra,
    /// A REJ.
    RecvRej,
    /// A REP (the first in REQ_SENT / MRA_REQ_RCVD, a duplicate elsewhere).
    RecvRep,
    /// An RTU.
    RecvRtu,
    /// A DREQ.
    RecvDreq,
    /// A DREP.
    RecvDrep,
    /// A LAP.
    RecvLap,
    /// A SIDR_REQ (on a listener).
    RecvSidrReq,
    /// A SIDR_REP.
    RecvSidrRep,
    /// The retry timer expired and retries are left.
    Timeout,
    /// The retry timer expired with no retries left.
    RetriesExhausted,
    /// The timewait timer expired.
    TimewaitExpired,
}

impl CmInput {
    /// Every input.
    pub const ALL: [CmInput; 21] = [
        CmInput::Connect,
        CmInput::SidrRequest,
        CmInput::Accept,
        CmInput::Reject,
        CmInput::Delay,
        CmInput::Establish,
        CmInput::Disconnect,
        CmInput::SidrAnswer,
        CmInput::RecvReq,
        CmInput::RecvMra,
        CmInput::RecvRej,
        CmInput::RecvRep,
        CmInput::RecvRtu,
        CmInput::RecvDreq,
        CmInput::RecvDrep,
        CmInput::RecvLap,
        CmInput::RecvSidrReq,
        CmInput::RecvSidrRep,
        CmInput::Timeout,
        CmInput::RetriesExhausted,
        CmInput::TimewaitExpired,
    ];

    /// Whether the input is an application command (refused, not dropped, without a row).
    pub const fn is_command(self) -> bool {
        matches!(
            self,
            CmInput::Connect
                | CmInput::SidrRequest
                | CmInput::Accept
                | CmInput::Reject
                | CmInput::Delay
                | CmInput::Establish
                | CmInput::Disconnect
                | CmInput::SidrAnswer
        )
    }
}

/// The kind of an event reported to the application ([`super::CmEvent`] carries the
/// details).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A REQ arrived for a listener (a new connection in REQ_RCVD).
    ReqReceived,
    /// The REP to our REQ arrived.
    RepReceived,
    /// The connection is established.
    Established,
    /// The peer rejected.
    Rejected,
    /// The peer asked to disconnect (answer with a disconnect command).
    DisconnectRequested,
    /// The connection is disconnected (now in TIMEWAIT).
    Disconnected,
    /// The timewait is over; the QP may be reused.
    TimewaitExit,
    /// The peer did not answer a REQ, REP or SIDR_REQ in any retry.
    Unreachable,
    /// The peer did not answer a DREQ in any retry (now in TIMEWAIT).
    DisconnectTimeout,
    /// A SIDR_REQ arrived for a listener (answered at once).
    SidrReqReceived,
    /// The SIDR_REP to our SIDR_REQ arrived.
    SidrReply,
}

/// What a transition does, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Send a REQ.
    SendReq,
    /// Send a REP.
    SendRep,
    /// Send an RTU.
    SendRtu,
    /// Send an MRA (for the message the state says).
    SendMra,
    /// Send a REJ with the reason the command or the agent gives.
    SendRej,
    /// Send a REJ with reason TIMEOUT (we gave up waiting).
    SendRejTimeout,
    /// Send a REJ with reason STALE_CONN.
    SendRejStale,
    /// Send a DREQ.
    SendDreq,
    /// Send a DREP.
    SendDrep,
    /// Send an APR with status "unsupported".
    SendAprUnsupported,
    /// Send a SIDR_REQ.
    SendSidrReq,
    /// Send a SIDR_REP.
    SendSidrRep,
    /// Resend the message the retry timer guards (the last REQ, REP, DREQ or SIDR_REQ
    /// sent; sending one of those makes it the guarded message with full retries).
    Resend,
    /// (Re)start the retry timer of the guarded message.
    ArmRetry,
    /// Push the retry deadline out by the MRA's service timeout.
    ExtendTimer,
    /// Stop the retry timer.
    CancelTimer,
    /// Start the timewait timer.
    StartTimewait,
    /// Report an event to the application.
    Report(EventKind),
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state the row applies in.
    pub from: CmState,
    /// The input.
    pub input: CmInput,
    /// The state after.
    pub to: CmState,
    /// What to do, in order.
    pub actions: &'static [Action],
}

use Action::*;
use CmInput as I;
use CmState as S;
use EventKind as E;

const fn row(from: CmState, input: CmInput, to: CmState, actions: &'static [Action]) -> Transition {
    Transition {
        from,
        input,
        to,
        actions,
    }
}

/// The transition table (IBA Vol 1 §12.9.6-12.9.8 state diagrams).
pub const CM_TABLE: &[Transition] = &[
    // Active side: connection establishment.
    row(S::Idle, I::Connect, S::ReqSent, &[SendReq, ArmRetry]),
    row(S::ReqSent, I::RecvMra, S::MraReqRcvd, &[ExtendTimer]),
    row(
        S::ReqSent,
        I::RecvRep,
        S::RepRcvd,
        &[CancelTimer, Report(E::RepReceived)],
    ),
    row(
        S::ReqSent,
        I::RecvRej,
        S::Idle,
        &[CancelTimer, Report(E::Rejected)],
    ),
    row(S::ReqSent, I::Timeout, S::ReqSent, &[Resend, ArmRetry]),
    row(
        S::ReqSent,
        I::RetriesExhausted,
        S::Idle,
        &[SendRejTimeout, Report(E::Unreachable)],
    ),
    row(
        S::ReqSent,
        I::Disconnect,
        S::Idle,
        &[CancelTimer, SendRejTimeout],
    ),
    row(S::MraReqRcvd, I::RecvMra, S::MraReqRcvd, &[ExtendTimer]),
    row(
        S::MraReqRcvd,
        I::RecvRep,
        S::RepRcvd,
        &[CancelTimer, Report(E::RepReceived)],
    ),
    row(
        S::MraReqRcvd,
        I::RecvRej,
        S::Idle,
        &[CancelTimer, Report(E::Rejected)],
    ),
    row(
        S::MraReqRcvd,
        I::Timeout,
        S::MraReqRcvd,
        &[Resend, ArmRetry],
    ),
    row(
        S::MraReqRcvd,
        I::RetriesExhausted,
        S::Idle,
        &[SendRejTimeout, Report(E::Unreachable)],
    ),
    row(
        S::MraReqRcvd,
        I::Disconnect,
        S::Idle,
        &[CancelTimer, SendRejTimeout],
    ),
    row(
        S::RepRcvd,
        I::Establish,
        S::Established,
        &[SendRtu, Report(E::Established)],
    ),
    row(S::RepRcvd, I::Delay, S::MraRepSent, &[SendMra]),
    row(
        S::RepRcvd,
        I::Reject,
        S::Timewait,
        &[SendRej, StartTimewait],
    ),
    row(
        S::RepRcvd,
        I::RecvRej,
        S::Timewait,
        &[Report(E::Rejected), StartTimewait],
    ),
    row(
        S::MraRepSent,
        I::Establish,
        S::Established,
        &[SendRtu, Report(E::Established)],
    ),
    row(
        S::MraRepSent,
        I::Reject,
        S::Timewait,
        &[SendRej, StartTimewait],
    ),
    row(S::MraRepSent, I::RecvRep, S::MraRepSent, &[SendMra]),
    row(
        S::MraRepSent,
        I::RecvRej,
        S::Timewait,
        &[Report(E::Rejected), StartTimewait],
    ),
    // Passive side: connection establishment.
    row(S::Listen, I::RecvReq, S::ReqRcvd, &[Report(E::ReqReceived)]),
    row(S::ReqRcvd, I::Accept, S::RepSent, &[SendRep, ArmRetry]),
    row(S::ReqRcvd, I::Reject, S::Idle, &[SendRej]),
    row(S::ReqRcvd, I::Delay, S::MraReqSent, &[SendMra]),
    row(S::ReqRcvd, I::RecvRej, S::Idle, &[Report(E::Rejected)]),
    row(S::MraReqSent, I::Accept, S::RepSent, &[SendRep, ArmRetry]),
    row(S::MraReqSent, I::Reject, S::Idle, &[SendRej]),
    row(S::MraReqSent, I::RecvReq, S::MraReqSent, &[SendMra]),
    row(S::MraReqSent, I::RecvRej, S::Idle, &[Report(E::Rejected)]),
    row(
        S::RepSent,
        I::RecvRtu,
        S::Established,
        &[CancelTimer, Report(E::Established)],
    ),
    row(
        S::RepSent,
        I::Establish,
        S::Established,
        &[CancelTimer, Report(E::Established)],
    ),
    row(S::RepSent, I::RecvMra, S::MraRepRcvd, &[ExtendTimer]),
    row(S::RepSent, I::RecvReq, S::RepSent, &[Resend]),
    row(
        S::RepSent,
        I::RecvRej,
        S::Idle,
        &[CancelTimer, Report(E::Rejected)],
    ),
    row(
        S::RepSent,
        I::Reject,
        S::Timewait,
        &[CancelTimer, SendRej, StartTimewait],
    ),
    row(S::RepSent, I::Timeout, S::RepSent, &[Resend, ArmRetry]),
    row(
        S::RepSent,
        I::RetriesExhausted,
        S::Idle,
        &[SendRejTimeout, Report(E::Unreachable)],
    ),
    row(
        S::MraRepRcvd,
        I::RecvRtu,
        S::Established,
        &[CancelTimer, Report(E::Established)],
    ),
    row(
        S::MraRepRcvd,
        I::Establish,
        S::Established,
        &[CancelTimer, Report(E::Established)],
    ),
    row(S::MraRepRcvd, I::RecvMra, S::MraRepRcvd, &[ExtendTimer]),
    row(S::MraRepRcvd, I::RecvReq, S::MraRepRcvd, &[Resend]),
    row(
        S::MraRepRcvd,
        I::RecvRej,
        S::Idle,
        &[CancelTimer, Report(E::Rejected)],
    ),
    row(
        S::MraRepRcvd,
        I::Reject,
        S::Timewait,
        &[CancelTimer, SendRej, StartTimewait],
    ),
    row(
        S::MraRepRcvd,
        I::Timeout,
        S::MraRepRcvd,
        &[Resend, ArmRetry],
    ),
    row(
        S::MraRepRcvd,
        I::RetriesExhausted,
        S::Idle,
        &[SendRejTimeout, Report(E::Unreachable)],
    ),
    // Established.
    row(
        S::Established,
        I::Disconnect,
        S::DreqSent,
        &[SendDreq, ArmRetry],
    ),
    row(
        S::Established,
        I::RecvDreq,
        S::DreqRcvd,
        &[Report(E::DisconnectRequested)],
    ),
    row(S::Established, I::RecvRep, S::Established, &[SendRtu]),
    row(
        S::Established,
        I::RecvRej,
        S::Timewait,
        &[Report(E::Disconnected), StartTimewait],
    ),
    row(
        S::Established,
        I::RecvLap,
        S::Established,
        &[SendAprUnsupported],
    ),
    // Disconnection.
    row(
        S::DreqSent,
        I::RecvDrep,
        S::Timewait,
        &[CancelTimer, Report(E::Disconnected), StartTimewait],
    ),
    row(
        S::DreqSent,
        I::RecvDreq,
        S::Timewait,
        &[
            CancelTimer,
            SendDrep,
            Report(E::Disconnected),
            StartTimewait,
        ],
    ),
    row(
        S::DreqSent,
        I::RecvRej,
        S::Timewait,
        &[CancelTimer, Report(E::Disconnected), StartTimewait],
    ),
    row(S::DreqSent, I::Timeout, S::DreqSent, &[Resend, ArmRetry]),
    row(
        S::DreqSent,
        I::RetriesExhausted,
        S::Timewait,
        &[Report(E::DisconnectTimeout), StartTimewait],
    ),
    row(
        S::DreqRcvd,
        I::Disconnect,
        S::Timewait,
        &[SendDrep, Report(E::Disconnected), StartTimewait],
    ),
    row(
        S::DreqRcvd,
        I::RecvRej,
        S::Timewait,
        &[Report(E::Disconnected), StartTimewait],
    ),
    row(S::Timewait, I::RecvDreq, S::Timewait, &[SendDrep]),
    row(S::Timewait, I::RecvReq, S::Timewait, &[SendRejStale]),
    row(
        S::Timewait,
        I::TimewaitExpired,
        S::Idle,
        &[Report(E::TimewaitExit)],
    ),
    // Service ID resolution.
    row(
        S::Idle,
        I::SidrRequest,
        S::SidrReqSent,
        &[SendSidrReq, ArmRetry],
    ),
    row(
        S::SidrReqSent,
        I::RecvSidrRep,
        S::Idle,
        &[CancelTimer, Report(E::SidrReply)],
    ),
    row(
        S::SidrReqSent,
        I::Timeout,
        S::SidrReqSent,
        &[Resend, ArmRetry],
    ),
    row(
        S::SidrReqSent,
        I::RetriesExhausted,
        S::Idle,
        &[Report(E::Unreachable)],
    ),
    row(S::SidrReqSent, I::Disconnect, S::Idle, &[CancelTimer]),
    row(
        S::Listen,
        I::RecvSidrReq,
        S::SidrReqRcvd,
        &[Report(E::SidrReqReceived)],
    ),
    row(S::SidrReqRcvd, I::SidrAnswer, S::Idle, &[SendSidrRep]),
];

/// The row for (`from`, `input`), `None` if the input is dropped (or refused) there.
pub fn transition(from: CmState, input: CmInput) -> Option<&'static Transition> {
    CM_TABLE.iter().find(|t| t.from == from && t.input == input)
}
