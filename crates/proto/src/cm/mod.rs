//! The communication manager (IBA Vol 1 ch. 12) as a sans-IO agent.
//!
//! [`CmAgent`] is the CM of one port. It never touches a socket or a clock: CM MADs come
//! in through [`CmAgent::handle_mad`] with the sender's IP address and the current time,
//! timers through [`CmAgent::handle_timeout`], application commands through
//! [`CmAgent::listen`], [`CmAgent::connect`], [`CmAgent::accept`], … Out come MADs to send
//! ([`CmAgent::poll_transmit`]: a destination address and 256 bytes for the GSI QP, QP1,
//! to carry), events ([`CmAgent::poll_event`]) and the next deadline
//! ([`CmAgent::poll_timeout`]).
//!
//! What each connection does is the data of [`table::CM_TABLE`]: (state, input) → (next
//! state, actions). The agent matches MADs to connections (by our communication ID, or
//! for a REQ by the peer's ID and address), turns them into table inputs, and carries out
//! the actions: building and sending messages, retrying them with the timeouts the
//! messages carry (4.096 µs × 2^t), the timewait, and the events.
//!
//! Answered without a connection: a REQ for a service nobody listens on (REJ "invalid
//! service ID"), a REQ from a QP that already has a connection with us under another
//! communication ID (REJ "stale connection"), a DREQ for an unknown connection (DREP, so
//! that the peer can finish), a SIDR_REQ for a service nobody listens on (SIDR_REP
//! "unsupported"). Alternate paths are not supported: a LAP is answered with an APR
//! "unsupported". Malformed or unmatched MADs are dropped and counted ([`CmStats`]).

mod act;
mod agent;
mod receive;
pub mod table;

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use uroce_wire::cm::{
    apr_status, msg_kind, private_data_len as pd, rej_reason, sidr_status, AprRepr,
    ClassPortInfoRepr, CmMad, CmMessage, DrepRepr, DreqRepr, MraRepr, PathRepr, RejRepr, RepRepr,
    ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, INFO_LEN,
};
use uroce_wire::mad::{self, MAD_LEN};

use crate::time::Instant;
use table::{transition, Action, CmInput, CmState, EventKind};

/// A connection (or listener) handle: our local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// A CM timeout field as a duration: 4.096 µs × 2^`t` (`t` above 31 counts as 31).
pub fn cm_timeout(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << t.min(31))
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No connection or listener has this ID.
    #[error("no CM connection {0:?}")]
    UnknownId(ConnId),
    /// The connection's state does not allow the command.
    #[error("{input:?} is not allowed in state {state}")]
    InvalidState {
        /// The connection's state.
        state: CmState,
        /// The command.
        input: CmInput,
    },
    /// More private data than the message carries.
    #[error("{len} bytes of private data, at most {max}")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes the message carries.
        max: usize,
    },
    /// A parameter does not fit its field.
    #[error("invalid parameter: {0}")]
    Invalid(#[from] uroce_wire::WireError),
    /// Someone already listens on the service ID.
    #[error("service ID {0:#x} already has a listener")]
    AlreadyListening(u64),
    /// All communication IDs are in use.
    #[error("no communication ID left")]
    NoIdsLeft,
}

/// A non-empty range of communication IDs without 0 (0 is no ID: a REQ's RemoteCommID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdRange {
    first: u32,
    last: u32,
}

impl IdRange {
    /// Every ID: 1 ..= `u32::MAX`.
    pub const ALL: IdRange = IdRange {
        first: 1,
        last: u32::MAX,
    };

    /// `first ..= last`; `None` if it is empty or holds 0.
    pub const fn new(first: u32, last: u32) -> Option<IdRange> {
        if first == 0 || first > last {
            None
        } else {
            Some(IdRange { first, last })
        }
    }

    /// The range of `r`; `None` if it is empty or holds 0.
    pub fn from_range(r: std::ops::RangeInclusive<u32>) -> Option<IdRange> {
        IdRange::new(*r.start(), *r.end())
    }

    /// The first ID.
    pub const fn first(self) -> u32 {
        self.first
    }

    /// The last ID.
    pub const fn last(self) -> u32 {
        self.last
    }

    /// Whether `id` is in the range.
    pub const fn contains(self, id: u32) -> bool {
        id >= self.first && id <= self.last
    }

    /// The number of IDs.
    pub const fn count(self) -> u64 {
        self.last as u64 - self.first as u64 + 1
    }

    /// The ID after `id`, wrapping from the last to the first.
    const fn after(self, id: u32) -> u32 {
        if id >= self.last || id < self.first {
            self.first
        } else {
            id + 1
        }
    }
}

impl Default for IdRange {
    fn default() -> IdRange {
        IdRange::ALL
    }
}

/// Agent-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentConfig {
    /// The local CA GUID put in REQ and REP.
    pub local_ca_guid: u64,
    /// The upper 32 bits of every transaction ID this agent starts.
    pub tid_high: u32,
    /// Where communication ID allocation starts (IDs then count up inside
    /// [`AgentConfig::id_range`], skipping those in use and wrapping from its last to its
    /// first, so a just-freed ID is not handed out again until the others were). An ID
    /// outside the range counts as the range's first.
    pub first_id: u32,
    /// The communication IDs this agent allots (listeners and connections alike): the
    /// whole 32-bit space but 0 by default. Several agents that must never allot the same
    /// ID are given disjoint ranges: the processes sharing one host-wide device each allot
    /// from their member slot's range, the IDs whose top bits are the slot, as their QPNs
    /// (`uroce_socket::steer::QpnLayout::comm_ids`), which is how the kernel steers the
    /// MADs answering a connection to the process that owns it.
    pub id_range: IdRange,
    /// The most connections and listeners at once.
    pub max_connections: usize,
    /// The most connection requests one listener holds unanswered by its application
    /// (REQ_RCVD, MRA_REQ_SENT); a REQ beyond is dropped and counted
    /// ([`CmStats::req_over_limit`]), and the peer's CM sends it again after its timeout.
    pub max_pending_per_listener: usize,
    /// The most passive connections not yet established (from REQ received to RTU) with
    /// one peer address: a flood from one host (any number of ports) cannot take a
    /// listener's whole backlog from others.
    pub max_unestablished_per_peer: usize,
    /// The longest wait the agent takes from a peer's message (4.096 µs × 2^t of a REQ's
    /// response timeouts, an MRA's service timeout, a path's ACK timeout for timewait):
    /// IBA allows 2^31 (2.4 hours), which would let one REQ hold state for days.
    pub max_peer_wait: Duration,
    /// How long a connection request waits for its application to accept, reject or
    /// delay it, at most (otherwise until the requester's own retries are over: its
    /// response timeout × (retries + 1)); then it is forgotten, as the requester has given
    /// up, and a later answer fails with [`CmError::UnknownId`].
    pub max_unanswered_req: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            local_ca_guid: 0,
            tid_high: 1,
            first_id: 1,
            id_range: IdRange::ALL,
            max_connections: 4096,
            max_pending_per_listener: 256,
            max_unestablished_per_peer: 32,
            // 4.096 µs × 2^24: above the 2^20..2^22 that RDMA-CM and the Linux CM use.
            max_peer_wait: cm_timeout(24),
            max_unanswered_req: Duration::from_secs(60),
        }
    }
}

/// The starting PSNs of one side's RC/UC QP, taken from the REQ and REP of its connection.
///
/// Each side announces the PSN it expects to *receive*: the REQ's Starting PSN is the PSN of
/// the packets from the passive to the active side, the REP's the PSN of the packets from the
/// active to the passive side (REQ and REP of IBA Vol 1 §12.6.5 and §12.6.8; the Linux
/// kernel's CM fills and reads the two fields this way). Taking the REQ's PSN as the active
/// side's send PSN instead makes a Linux passive side see every packet as a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartPsns {
    /// The PSN of the first packet this side sends (`sq_psn` of its QP's RTS transition).
    pub sq_psn: u32,
    /// The PSN of the first packet this side expects (`rq_psn` of its RTR transition).
    pub rq_psn: u32,
}

impl StartPsns {
    /// The active side's PSNs: receives from the REQ's PSN, sends from the REP's.
    #[must_use]
    pub const fn active(req_starting_psn: u32, rep_starting_psn: u32) -> StartPsns {
        StartPsns {
            sq_psn: rep_starting_psn & 0x00FF_FFFF,
            rq_psn: req_starting_psn & 0x00FF_FFFF,
        }
    }

    /// The passive side's PSNs: sends from the REQ's PSN, receives from the REP's.
    #[must_use]
    pub const fn passive(req_starting_psn: u32, rep_starting_psn: u32) -> StartPsns {
        StartPsns {
            sq_psn: req_starting_psn & 0x00FF_FFFF,
            rq_psn: rep_starting_psn & 0x00FF_FFFF,
        }
    }
}

/// What the active side asks for in its REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The passive side's IP address (where the REQ goes).
    pub remote: IpAddr,
    /// The service ID.
    pub service_id: u64,
    /// Our QPN.
    pub local_qpn: u32,
    /// The PSN the passive side starts sending with: the PSN we expect to receive
    /// (see [`StartPsns`]).
    pub starting_psn: u32,
    /// Q_Key (UD) or 0.
    pub qkey: u32,
    /// RDMA reads/atomics we accept at once.
    pub responder_resources: u8,
    /// RDMA reads/atomics we issue at once.
    pub initiator_depth: u8,
    /// Transport service type (0 RC, 1 UC, 3 with an extended type: IBA 12.6.5).
    pub transport_service_type: u8,
    /// Extended transport type when `transport_service_type` is 3 (1 XRC: IBA Annex A14).
    pub extended_transport_type: u8,
    /// The primary path (GIDs are the IP addresses).
    pub path: PathRepr,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (IBA enumeration).
    pub path_mtu: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// How long the passive side may take to answer (5-bit exponent); also our own
    /// response time put in the REQ.
    pub cm_response_timeout: u8,
    /// Packet lifetime (5-bit exponent), twice of which is added to each wait.
    pub packet_life_time: u8,
    /// How often a CM message is resent (4 bits).
    pub max_cm_retries: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// Private data (at most 92 bytes; zero-padded).
    pub private_data: Vec<u8>,
}

/// What the passive side answers with in its REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our QPN.
    pub local_qpn: u32,
    /// The PSN the active side starts sending with: the PSN we expect to receive
    /// (see [`StartPsns`]).
    pub starting_psn: u32,
    /// Q_Key (UD) or 0.
    pub qkey: u32,
    /// RDMA reads/atomics we accept at once.
    pub responder_resources: u8,
    /// RDMA reads/atomics we issue at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5-bit exponent).
    pub target_ack_delay: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// Private data (at most 196 bytes).
    pub private_data: Vec<u8>,
}

/// A listener's answer to SIDR_REQs: the UD QP serving the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrAnswer {
    /// The QPN.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// A service ID resolution request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrParams {
    /// Where the SIDR_REQ goes.
    pub remote: IpAddr,
    /// The service ID to resolve.
    pub service_id: u64,
    /// Partition key.
    pub pkey: u16,
    /// Wait per try (5-bit exponent).
    pub timeout: u8,
    /// Resends before giving up.
    pub max_retries: u8,
    /// Private data (at most 216 bytes).
    pub private_data: Vec<u8>,
}

/// What the agent reports to the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for the listener `listener` created connection `id` (in REQ_RCVD): accept,
    /// reject or delay it.
    ReqReceived {
        /// The new connection.
        id: ConnId,
        /// The listener it came to.
        listener: ConnId,
        /// The active side's address.
        from: IpAddr,
        /// The REQ.
        req: Box<ReqRepr>,
    },
    /// The REP to our REQ: set the QP up from it, then [`CmAgent::establish`].
    RepReceived {
        /// The connection.
        id: ConnId,
        /// The REP.
        rep: Box<RepRepr>,
    },
    /// The connection is established.
    Established {
        /// The connection.
        id: ConnId,
    },
    /// The peer rejected (the connection is gone or in TIMEWAIT).
    Rejected {
        /// The connection.
        id: ConnId,
        /// The REJ reason (see `uroce_wire::cm::rej_reason`).
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The peer sent a DREQ: answer with [`CmAgent::disconnect`].
    DisconnectRequested {
        /// The connection.
        id: ConnId,
    },
    /// The connection is disconnected and in TIMEWAIT: move the QP to the error state.
    Disconnected {
        /// The connection.
        id: ConnId,
    },
    /// TIMEWAIT is over; the connection is gone and its QP may be reused.
    TimewaitExit {
        /// The connection.
        id: ConnId,
    },
    /// The peer never answered our REQ, REP or SIDR_REQ; the connection is gone.
    Unreachable {
        /// The connection.
        id: ConnId,
    },
    /// The peer never answered our DREQ; the connection is in TIMEWAIT.
    DisconnectTimeout {
        /// The connection.
        id: ConnId,
    },
    /// A SIDR_REQ came to `listener` and was answered (a listener of
    /// [`CmAgent::listen_sidr_deferred`]: waits for [`CmAgent::sidr_answer`] on `id`).
    SidrReqReceived {
        /// The request's own ID (for [`CmAgent::sidr_answer`]).
        id: ConnId,
        /// The listener.
        listener: ConnId,
        /// The requester's address.
        from: IpAddr,
        /// The request.
        req: Box<SidrReqRepr>,
    },
    /// The SIDR_REP to our SIDR_REQ.
    SidrReply {
        /// The request.
        id: ConnId,
        /// Status (see `uroce_wire::cm::sidr_status`).
        status: u8,
        /// The service's QPN.
        qpn: u32,
        /// The service's Q_Key.
        qkey: u32,
    },
}

/// What the agent dropped, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs that did not parse or were not CM MADs.
    pub malformed: u64,
    /// CM messages that matched no connection (or came from the wrong address).
    pub unmatched: u64,
    /// CM messages the connection's state had no use for (stray or duplicate).
    pub ignored: u64,
    /// MADs sent.
    pub sent: u64,
    /// REQs dropped because their listener already held
    /// [`AgentConfig::max_pending_per_listener`] unanswered requests, or their peer
    /// [`AgentConfig::max_unestablished_per_peer`] unestablished connections.
    pub req_over_limit: u64,
    /// Connection requests forgotten unanswered by their application
    /// ([`AgentConfig::max_unanswered_req`]).
    pub req_expired: u64,
}

/// How long a REQ for a service nobody listens to waits for a listener before it is
/// rejected (invalid service ID). Not in IBA, which rejects at once: a server that destroys
/// its listening id and listens again (perftest does, between its two connections) would
/// otherwise reject a client that is quicker than it.
pub const UNMATCHED_REQ_GRACE: Duration = Duration::from_millis(50);

/// The RespTimeValue the agent's ClassPortInfo announces (IBA 13.4.8.1): it answers
/// 4.096 µs × 2^18 ≈ 1.07 s at the latest. The agent answers a MAD as it handles it, on a
/// thread of a process that shares its cores with others; the second covers scheduling
/// delays on a loaded host, not work.
pub const RESP_TIME_VALUE: u8 = 18;

/// At most this many REQs are held at once; beyond, they are rejected at once.
const MAX_HELD_REQS: usize = 64;

#[derive(Debug, Clone)]
struct Listener {
    service_id: u64,
    sidr: Option<SidrAnswer>,
    /// SIDR requests are reported and answered later ([`CmAgent::sidr_answer`]).
    sidr_deferred: bool,
}

#[derive(Debug, Clone)]
struct Conn {
    state: CmState,
    /// Created by a listener for a received REQ.
    passive: bool,
    /// The listener a passive connection came through.
    listener: u32,
    /// A passive connection still unanswered by its application is forgotten then.
    unanswered_until: Option<Instant>,
    remote: IpAddr,
    remote_comm_id: u32,
    remote_qpn: u32,
    local_qpn: u32,
    /// The TID of the REQ / SIDR_REQ (REP, RTU, MRA and REJ reuse it).
    req_tid: u64,
    /// The TID of the last DREQ received (the DREP reuses it).
    dreq_tid: u64,
    /// Wait per try of a guarded message.
    timeout: Duration,
    max_retries: u8,
    retries_left: u8,
    deadline: Option<Instant>,
    timewait: Duration,
    timewait_at: Option<Instant>,
    guarded: Option<[u8; MAD_LEN]>,
    /// The REQ we sent (active) or received (passive).
    req: Option<ReqRepr>,
    /// The REP we send (passive).
    rep: Option<RepRepr>,
    mra_service_timeout: u8,
    rej_reason: u16,
    rej_private_data: [u8; pd::REJ],
    dreq_private_data: [u8; pd::DREQ],
    sidr_req: Option<SidrReqRepr>,
    sidr_answer: Option<SidrAnswer>,
}

impl Conn {
    /// When this passive connection is forgotten if its application has still not
    /// answered the request (`None` once answered).
    fn unanswered_deadline(&self) -> Option<Instant> {
        self.unanswered_until
            .filter(|_| matches!(self.state, CmState::ReqRcvd | CmState::MraReqSent))
    }

    fn new(state: CmState, remote: IpAddr) -> Conn {
        Conn {
            state,
            passive: false,
            listener: 0,
            unanswered_until: None,
            remote,
            remote_comm_id: 0,
            remote_qpn: 0,
            local_qpn: 0,
            req_tid: 0,
            dreq_tid: 0,
            timeout: Duration::ZERO,
            max_retries: 0,
            retries_left: 0,
            deadline: None,
            timewait: Duration::ZERO,
            timewait_at: None,
            guarded: None,
            req: None,
            rep: None,
            mra_service_timeout: 0,
            rej_reason: 0,
            rej_private_data: [0; pd::REJ],
            dreq_private_data: [0; pd::DREQ],
            sidr_req: None,
            sidr_answer: None,
        }
    }
}

/// The message an input came with, for the actions and events that need it.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    tid: u64,
    message: Option<&'a CmMessage>,
}

const NO_CTX: Ctx<'static> = Ctx {
    tid: 0,
    message: None,
};

/// The CM of one port (see the module documentation).
#[derive(Debug)]
pub struct CmAgent {
    config: AgentConfig,
    next_id: u32,
    next_tid: u32,
    listeners: BTreeMap<u32, Listener>,
    /// REQs and SIDR_REQs for a service nobody listens to, rejected (SIDR: answered
    /// UNSUPPORTED) at their deadline if still nobody does ([`UNMATCHED_REQ_GRACE`]).
    held_reqs: Vec<(Instant, IpAddr, [u8; MAD_LEN])>,
    conns: BTreeMap<u32, Conn>,
    tx: VecDeque<(IpAddr, [u8; MAD_LEN])>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
}

fn padded<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    if data.len() > N {
        return Err(CmError::PrivateDataTooLong {
            len: data.len(),
            max: N,
        });
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}
