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

/// Agent-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentConfig {
    /// The local CA GUID put in REQ and REP.
    pub local_ca_guid: u64,
    /// The upper 32 bits of every transaction ID this agent starts.
    pub tid_high: u32,
    /// Where communication ID allocation starts (IDs then count up, skipping those in
    /// use and 0, so a just-freed ID is not handed out again until the others were).
    pub first_id: u32,
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

impl CmAgent {
    /// An agent with no connections.
    pub fn new(config: AgentConfig) -> CmAgent {
        CmAgent {
            next_id: config.first_id.max(1),
            next_tid: 0,
            config,
            listeners: BTreeMap::new(),
            held_reqs: Vec::new(),
            conns: BTreeMap::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The drop and send counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of a connection (`Listen` for a listener), `None` once it is gone.
    pub fn state(&self, id: ConnId) -> Option<CmState> {
        if self.listeners.contains_key(&id.0) {
            return Some(CmState::Listen);
        }
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// Number of connections (listeners not counted).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    fn alloc_id(&mut self) -> Result<u32, CmError> {
        if self.conns.len() + self.listeners.len() >= self.config.max_connections {
            return Err(CmError::NoIdsLeft);
        }
        // At most one pass over the IDs in use finds a free one.
        for _ in 0..=self.conns.len() + self.listeners.len() {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.conns.contains_key(&id) && !self.listeners.contains_key(&id) {
                return Ok(id);
            }
        }
        Err(CmError::NoIdsLeft)
    }

    /// A wait a peer's message asks for (4.096 µs × 2^`t`), at most
    /// [`AgentConfig::max_peer_wait`].
    fn peer_wait(&self, t: u8) -> Duration {
        cm_timeout(t).min(self.config.max_peer_wait)
    }

    fn fresh_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        (u64::from(self.config.tid_high) << 32) | u64::from(self.next_tid)
    }

    /// Listens on `service_id`; `sidr` answers SIDR_REQs for it.
    pub fn listen(&mut self, service_id: u64, sidr: Option<SidrAnswer>) -> Result<ConnId, CmError> {
        if self.listeners.values().any(|l| l.service_id == service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        let id = self.alloc_id()?;
        self.listeners.insert(
            id,
            Listener {
                service_id,
                sidr,
                sidr_deferred: false,
            },
        );
        Ok(ConnId(id))
    }

    /// Listens for SIDR requests on `service_id` and reports each one
    /// ([`CmEvent::SidrReqReceived`]) without answering: the caller answers with
    /// [`CmAgent::sidr_answer`] (the passive side of an RDMA-CM UD id, which makes a QP
    /// per request).
    ///
    /// # Errors
    /// [`CmError::AlreadyListening`]; no free communication ID.
    pub fn listen_sidr_deferred(&mut self, service_id: u64) -> Result<ConnId, CmError> {
        if self.listeners.values().any(|l| l.service_id == service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        let id = self.alloc_id()?;
        self.listeners.insert(
            id,
            Listener {
                service_id,
                sidr: None,
                sidr_deferred: true,
            },
        );
        Ok(ConnId(id))
    }

    /// Answers a reported SIDR request (`id` from [`CmEvent::SidrReqReceived`]) with a
    /// SIDR_REP naming `answer`'s QP and Q_Key.
    ///
    /// # Errors
    /// [`CmError::UnknownId`] when `id` is not a SIDR request waiting for its answer.
    pub fn sidr_answer(
        &mut self,
        now: Instant,
        id: ConnId,
        answer: SidrAnswer,
    ) -> Result<(), CmError> {
        match self.conns.get_mut(&id.0) {
            Some(c) if c.state == CmState::SidrReqRcvd => c.sidr_answer = Some(answer),
            _ => return Err(CmError::UnknownId(id)),
        }
        self.apply(now, id.0, CmInput::SidrAnswer, NO_CTX);
        Ok(())
    }

    /// Stops listening.
    pub fn stop_listening(&mut self, id: ConnId) -> Result<(), CmError> {
        self.listeners
            .remove(&id.0)
            .map(|_| ())
            .ok_or(CmError::UnknownId(id))
    }

    /// Sends a REQ; the connection reports `RepReceived`, `Rejected` or `Unreachable`.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<ConnId, CmError> {
        let private_data = padded::<{ pd::REQ }>(&p.private_data)?;
        let id = self.alloc_id()?;
        let req = ReqRepr {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: p.qkey,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.cm_response_timeout,
            transport_service_type: p.transport_service_type,
            e2e_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: p.pkey,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: p.extended_transport_type,
            primary_path: p.path,
            alternate_path: PathRepr::default(),
            sap_supported: false,
            private_data,
        };
        req.validate()?;
        let mut c = Conn::new(CmState::Idle, p.remote);
        c.local_qpn = p.local_qpn;
        c.req_tid = (u64::from(self.config.tid_high) << 32) | u64::from(id);
        c.timeout = cm_timeout(p.cm_response_timeout) + 2 * cm_timeout(p.packet_life_time);
        c.max_retries = p.max_cm_retries;
        c.timewait = cm_timeout(p.path.local_ack_timeout) + 2 * cm_timeout(p.packet_life_time);
        c.req = Some(req);
        self.conns.insert(id, c);
        self.command(now, ConnId(id), CmInput::Connect)?;
        Ok(ConnId(id))
    }

    /// Accepts a connection in REQ_RCVD / MRA_REQ_SENT: sends the REP.
    pub fn accept(&mut self, now: Instant, id: ConnId, p: &AcceptParams) -> Result<(), CmError> {
        let private_data = padded::<{ pd::REP }>(&p.private_data)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        let rep = RepRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: p.qkey,
            local_qpn: p.local_qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: 0,
            e2e_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.config.local_ca_guid,
            private_data,
        };
        rep.validate()?;
        if transition(c.state, CmInput::Accept).is_some() {
            c.rep = Some(rep);
            c.local_qpn = p.local_qpn;
        }
        self.command(now, id, CmInput::Accept)
    }

    /// Rejects a REQ (or, on the active side, a REP) with `reason` and private data.
    pub fn reject(
        &mut self,
        now: Instant,
        id: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let data = padded::<{ pd::REJ }>(private_data)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        c.rej_reason = reason;
        c.rej_private_data = data;
        self.command(now, id, CmInput::Reject)
    }

    /// Sends an MRA for the REQ or REP received, asking for 4.096 µs × 2^`service_timeout`.
    pub fn delay(&mut self, now: Instant, id: ConnId, service_timeout: u8) -> Result<(), CmError> {
        let extended = now + self.config.max_unanswered_req;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        c.mra_service_timeout = service_timeout.min(31);
        // The application asked for time: it has it, as long as for a fresh request.
        if c.unanswered_until.is_some() {
            c.unanswered_until = Some(extended);
        }
        self.command(now, id, CmInput::Delay)
    }

    /// Active side after `RepReceived`: sends the RTU. Passive side: data arrived before
    /// the RTU, the connection is established.
    pub fn establish(&mut self, now: Instant, id: ConnId) -> Result<(), CmError> {
        self.command(now, id, CmInput::Establish)
    }

    /// Disconnects: sends a DREQ when established, the DREP after `DisconnectRequested`,
    /// and gives up a REQ or SIDR_REQ not answered yet.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let data = padded::<{ pd::DREQ }>(private_data)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        c.dreq_private_data = data;
        self.command(now, id, CmInput::Disconnect)
    }

    /// Sends a SIDR_REQ; the request reports `SidrReply` or `Unreachable`.
    pub fn sidr_request(&mut self, now: Instant, p: &SidrParams) -> Result<ConnId, CmError> {
        let private_data = padded::<{ pd::SIDR_REQ }>(&p.private_data)?;
        let id = self.alloc_id()?;
        let mut c = Conn::new(CmState::Idle, p.remote);
        c.req_tid = (u64::from(self.config.tid_high) << 32) | u64::from(id);
        c.timeout = cm_timeout(p.timeout);
        c.max_retries = p.max_retries;
        c.sidr_req = Some(SidrReqRepr {
            request_id: id,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data,
        });
        self.conns.insert(id, c);
        self.command(now, ConnId(id), CmInput::SidrRequest)?;
        Ok(ConnId(id))
    }

    fn command(&mut self, now: Instant, id: ConnId, input: CmInput) -> Result<(), CmError> {
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId(id))?;
        if transition(c.state, input).is_none() {
            return Err(CmError::InvalidState {
                state: c.state,
                input,
            });
        }
        self.apply(now, id.0, input, NO_CTX);
        Ok(())
    }

    /// The next MAD to send: the destination's IP address and the 256 bytes for QP1.
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, [u8; MAD_LEN])> {
        self.tx.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline at which [`CmAgent::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .flat_map(|c| [c.deadline, c.timewait_at, c.unanswered_deadline()])
            .flatten()
            .chain(self.held_reqs.iter().map(|h| h.0))
            .min()
    }

    /// Runs the timers that expired by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Held REQs: handled now (a listener appeared: accepted; else rejected).
        let (due, keep): (Vec<_>, Vec<_>) = self.held_reqs.drain(..).partition(|h| h.0 <= now);
        self.held_reqs = keep;
        for (_, from, mad) in due {
            self.handle_mad_inner(now, from, &mad, false);
        }
        // Requests their application never answered: the requester has given up.
        let expired: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.unanswered_deadline().is_some_and(|t| t <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.conns.remove(&id);
            self.stats.req_expired += 1;
        }
        let due: Vec<(u32, CmInput)> = self
            .conns
            .iter()
            .filter_map(|(&id, c)| {
                if c.timewait_at.is_some_and(|t| t <= now) {
                    Some((id, CmInput::TimewaitExpired))
                } else if c.deadline.is_some_and(|t| t <= now) {
                    if c.retries_left > 0 {
                        Some((id, CmInput::Timeout))
                    } else {
                        Some((id, CmInput::RetriesExhausted))
                    }
                } else {
                    None
                }
            })
            .collect();
        for (id, input) in due {
            if let Some(c) = self.conns.get_mut(&id) {
                match input {
                    CmInput::TimewaitExpired => c.timewait_at = None,
                    CmInput::Timeout => c.retries_left = c.retries_left.saturating_sub(1),
                    _ => {}
                }
                c.deadline = c.deadline.filter(|_| input == CmInput::TimewaitExpired);
                if transition(c.state, input).is_some() {
                    self.apply(now, id, input, NO_CTX);
                }
            }
        }
    }

    /// Takes in a MAD that QP1 received from `from`. Never panics; what cannot be used is
    /// dropped and counted.
    pub fn handle_mad(&mut self, now: Instant, from: IpAddr, mad: &[u8]) {
        self.handle_mad_inner(now, from, mad, true);
    }

    fn handle_mad_inner(&mut self, now: Instant, from: IpAddr, mad: &[u8], may_hold: bool) {
        let Ok(m) = CmMad::parse(mad) else {
            self.stats.malformed += 1;
            return;
        };
        let tid = m.header.transaction_id;
        let ctx = Ctx {
            tid,
            message: Some(&m.message),
        };
        match &m.message {
            CmMessage::Req(req)
                if may_hold
                    && self.held_reqs.len() < MAX_HELD_REQS
                    && !self
                        .listeners
                        .values()
                        .any(|l| l.service_id == req.service_id)
                    && !self
                        .conns
                        .values()
                        .any(|c| c.remote == from && c.remote_comm_id == req.local_comm_id) =>
            {
                // Nobody listens (yet): a server may be listening again right now (a
                // program that destroys its listening id and makes a new one). Decide at
                // the grace deadline.
                if let Ok(raw) = <[u8; MAD_LEN]>::try_from(mad) {
                    self.held_reqs.push((now + UNMATCHED_REQ_GRACE, from, raw));
                } else {
                    self.on_req(now, from, tid, req, ctx);
                }
            }
            CmMessage::Req(req) => self.on_req(now, from, tid, req, ctx),
            CmMessage::SidrReq(req)
                if may_hold
                    && self.held_reqs.len() < MAX_HELD_REQS
                    && !self
                        .listeners
                        .values()
                        .any(|l| l.service_id == req.service_id) =>
            {
                // As for a REQ: a UD server may be listening again in a moment.
                if let Ok(raw) = <[u8; MAD_LEN]>::try_from(mad) {
                    self.held_reqs.push((now + UNMATCHED_REQ_GRACE, from, raw));
                } else {
                    self.on_sidr_req(now, from, tid, req, ctx);
                }
            }
            CmMessage::SidrReq(req) => self.on_sidr_req(now, from, tid, req, ctx),
            CmMessage::Mra(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvMra, ctx),
            CmMessage::Rej(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvRej, ctx),
            CmMessage::Rep(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvRep, ctx),
            CmMessage::Rtu(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvRtu, ctx),
            CmMessage::Drep(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvDrep, ctx),
            CmMessage::Lap(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvLap, ctx),
            CmMessage::SidrRep(r) => {
                self.deliver(now, from, r.request_id, CmInput::RecvSidrRep, ctx)
            }
            CmMessage::Dreq(r) => {
                let conn = self
                    .conns
                    .get(&r.remote_comm_id)
                    .filter(|c| c.remote == from && c.remote_comm_id == r.local_comm_id);
                if let Some(c) = conn {
                    // A DREQ counts only if it names our QP (IBA §12.9.7).
                    if c.local_qpn == r.remote_qpn {
                        self.deliver(now, from, r.remote_comm_id, CmInput::RecvDreq, ctx);
                    } else {
                        self.stats.ignored += 1;
                    }
                } else {
                    // Unknown connection: answer so that the peer can finish.
                    self.stats.unmatched += 1;
                    let drep = DrepRepr {
                        local_comm_id: r.remote_comm_id,
                        remote_comm_id: r.local_comm_id,
                        private_data: [0; pd::DREP],
                    };
                    self.send(from, CmMad::new(tid, CmMessage::Drep(drep)));
                }
            }
            CmMessage::ClassPortInfo(_) => {
                if m.header.method == mad::METHOD_GET && !m.header.response {
                    self.answer_class_port_info(from, tid);
                } else {
                    self.stats.ignored += 1;
                }
            }
            CmMessage::Apr(_) | CmMessage::Other { .. } => self.stats.ignored += 1,
        }
    }

    /// Answers a Get(ClassPortInfo) with GetResp and the same transaction ID (IBA 13.4.5,
    /// 13.4.8.1): the CM class version, no traps or notices (CapabilityMask 0),
    /// [`RESP_TIME_VALUE`], and no redirection (zero redirect fields: the class is served
    /// here, on QP1).
    fn answer_class_port_info(&mut self, to: IpAddr, tid: u64) {
        let info = ClassPortInfoRepr {
            base_version: mad::BASE_VERSION,
            class_version: mad::CM_CLASS_VERSION,
            resp_time_value: RESP_TIME_VALUE,
            ..ClassPortInfoRepr::default()
        };
        let mut reply = CmMad::new(tid, CmMessage::ClassPortInfo(info));
        reply.header.method = mad::METHOD_GET;
        reply.header.response = true;
        self.send(to, reply);
    }

    fn deliver(&mut self, now: Instant, from: IpAddr, id: u32, input: CmInput, ctx: Ctx<'_>) {
        let Some(c) = self.conns.get(&id) else {
            self.stats.unmatched += 1;
            return;
        };
        if c.remote != from {
            self.stats.unmatched += 1;
            return;
        }
        // Once the peer's ID is known, every message must name it.
        let peer_id = match ctx.message {
            Some(CmMessage::Rep(r)) => Some(r.local_comm_id),
            Some(CmMessage::Rtu(r)) => Some(r.local_comm_id),
            Some(CmMessage::Drep(r)) => Some(r.local_comm_id),
            Some(CmMessage::Mra(r)) => Some(r.local_comm_id),
            Some(CmMessage::Lap(r)) => Some(r.local_comm_id),
            _ => None,
        };
        let first_rep =
            matches!(c.state, CmState::ReqSent | CmState::MraReqRcvd) && input == CmInput::RecvRep;
        if let Some(peer) = peer_id {
            if c.remote_comm_id != 0 && !first_rep && peer != c.remote_comm_id {
                self.stats.unmatched += 1;
                return;
            }
        }
        if transition(c.state, input).is_none() {
            self.stats.ignored += 1;
            return;
        }
        if first_rep {
            if let Some(CmMessage::Rep(r)) = ctx.message {
                let c = self.conns.get_mut(&id);
                if let Some(c) = c {
                    c.remote_comm_id = r.local_comm_id;
                    c.remote_qpn = r.local_qpn;
                }
            }
        }
        if input == CmInput::RecvDreq {
            if let Some(c) = self.conns.get_mut(&id) {
                c.dreq_tid = ctx.tid;
            }
        }
        self.apply(now, id, input, ctx);
    }

    fn on_req(&mut self, now: Instant, from: IpAddr, tid: u64, req: &ReqRepr, ctx: Ctx<'_>) {
        // A duplicate of a REQ we already have a connection for.
        let dup = self.conns.iter().find_map(|(&id, c)| {
            (c.passive && c.remote == from && c.remote_comm_id == req.local_comm_id).then_some(id)
        });
        if let Some(id) = dup {
            let state = self.conns.get(&id).map(|c| c.state);
            if state.is_some_and(|s| transition(s, CmInput::RecvReq).is_some()) {
                self.apply(now, id, CmInput::RecvReq, ctx);
            } else {
                self.stats.ignored += 1;
            }
            return;
        }
        let rej = |reason: u16| RejRepr {
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            message_rejected: msg_kind::REQ,
            reject_info_length: 0,
            reason,
            ari: [0; INFO_LEN],
            private_data: [0; pd::REJ],
        };
        // A new REQ from a QP that is connected to us under another communication ID.
        let stale = self.conns.values().any(|c| {
            c.remote == from
                && c.remote_qpn == req.local_qpn
                && matches!(
                    c.state,
                    CmState::Established
                        | CmState::RepSent
                        | CmState::MraRepRcvd
                        | CmState::DreqSent
                        | CmState::DreqRcvd
                )
        });
        if stale {
            self.stats.ignored += 1;
            self.send(
                from,
                CmMad::new(tid, CmMessage::Rej(rej(rej_reason::STALE_CONN))),
            );
            return;
        }
        let Some((&listener, _)) = self
            .listeners
            .iter()
            .find(|(_, l)| l.service_id == req.service_id)
        else {
            self.stats.unmatched += 1;
            self.send(
                from,
                CmMad::new(tid, CmMessage::Rej(rej(rej_reason::INVALID_SERVICE_ID))),
            );
            return;
        };
        // Bounded state under a flood of REQs: per listener, what its application has not
        // answered yet; per peer address, what is not yet established. Dropped, not
        // rejected: a REJ would go to an address the REQ may have forged, and a real
        // requester sends its REQ again after its timeout.
        let (mut pending, mut from_peer) = (0, 0);
        for c in self.conns.values().filter(|c| c.passive) {
            let unanswered = matches!(c.state, CmState::ReqRcvd | CmState::MraReqSent);
            if unanswered && c.listener == listener {
                pending += 1;
            }
            if c.remote == from
                && (unanswered || matches!(c.state, CmState::RepSent | CmState::MraRepRcvd))
            {
                from_peer += 1;
            }
        }
        if pending >= self.config.max_pending_per_listener
            || from_peer >= self.config.max_unestablished_per_peer
        {
            self.stats.req_over_limit += 1;
            return;
        }
        let Ok(id) = self.alloc_id() else {
            self.send(
                from,
                CmMad::new(tid, CmMessage::Rej(rej(rej_reason::NO_RESOURCES))),
            );
            return;
        };
        let mut c = Conn::new(CmState::Listen, from);
        c.passive = true;
        c.listener = listener;
        c.remote_comm_id = req.local_comm_id;
        c.remote_qpn = req.local_qpn;
        c.req_tid = tid;
        c.timeout = self.peer_wait(req.local_cm_response_timeout);
        c.max_retries = req.max_cm_retries;
        c.timewait = self.peer_wait(req.primary_path.local_ack_timeout);
        // The requester gives up after its response timeout × (retries + 1) (IBA 12.6.5:
        // Remote CM Response Timeout, Max CM Retries).
        let requester_waits = self
            .peer_wait(req.remote_cm_response_timeout)
            .saturating_mul(u32::from(req.max_cm_retries) + 1);
        c.unanswered_until = Some(now + requester_waits.min(self.config.max_unanswered_req));
        c.req = Some(*req);
        self.conns.insert(id, c);
        self.apply(now, id, CmInput::RecvReq, ctx);
        // The event names the listener.
        if let Some(CmEvent::ReqReceived { listener: l, .. }) = self.events.back_mut() {
            *l = ConnId(listener);
        }
    }

    fn on_sidr_req(
        &mut self,
        now: Instant,
        from: IpAddr,
        tid: u64,
        req: &SidrReqRepr,
        ctx: Ctx<'_>,
    ) {
        let found = self
            .listeners
            .iter()
            .find(|(_, l)| l.service_id == req.service_id)
            .map(|(&id, l)| (id, l.sidr, l.sidr_deferred));
        let answer = match found {
            Some((listener, Some(answer), _)) => Some((listener, Some(answer))),
            Some((listener, None, true)) => Some((listener, None)),
            _ => None,
        };
        let Some((listener, answer)) = answer else {
            self.stats.unmatched += 1;
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status: sidr_status::UNSUPPORTED,
                additional_info_length: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_info: [0; INFO_LEN],
                private_data: [0; pd::SIDR_REP],
            };
            self.send(from, CmMad::new(tid, CmMessage::SidrRep(rep)));
            return;
        };
        let Ok(id) = self.alloc_id() else {
            return;
        };
        let mut c = Conn::new(CmState::Listen, from);
        c.remote_comm_id = req.request_id;
        c.req_tid = tid;
        c.sidr_req = Some(*req);
        c.sidr_answer = answer;
        self.conns.insert(id, c);
        self.apply(now, id, CmInput::RecvSidrReq, ctx);
        if let Some(CmEvent::SidrReqReceived { listener: l, .. }) = self.events.back_mut() {
            *l = ConnId(listener);
        }
        if answer.is_some() {
            self.apply(now, id, CmInput::SidrAnswer, NO_CTX);
        }
    }

    fn send(&mut self, to: IpAddr, mad: CmMad) {
        self.stats.sent += 1;
        self.tx.push_back((to, mad.to_bytes()));
    }

    /// Runs the table row for (state, `input`) on connection `id`.
    fn apply(&mut self, now: Instant, id: u32, input: CmInput, ctx: Ctx<'_>) {
        let Some(c) = self.conns.get(&id) else { return };
        let from = c.state;
        let Some(t) = transition(from, input) else {
            self.stats.ignored += 1;
            return;
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = t.to;
        }
        for &action in t.actions {
            self.act(now, id, from, t.to, action, ctx);
        }
        if t.to == CmState::Idle {
            self.conns.remove(&id);
        }
    }

    fn act(
        &mut self,
        now: Instant,
        id: u32,
        from: CmState,
        to: CmState,
        action: Action,
        ctx: Ctx<'_>,
    ) {
        let ca_guid = self.config.local_ca_guid;
        let fresh_tid = if action == Action::SendDreq {
            self.fresh_tid()
        } else {
            0
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let remote = c.remote;
        let ids = (id, c.remote_comm_id);
        let mut out: Option<(CmMad, bool)> = None; // (message, guarded)
        match action {
            Action::SendReq => {
                if let Some(req) = c.req {
                    out = Some((CmMad::new(c.req_tid, CmMessage::Req(req)), true));
                }
            }
            Action::SendRep => {
                if let Some(rep) = c.rep {
                    out = Some((CmMad::new(c.req_tid, CmMessage::Rep(rep)), true));
                }
            }
            Action::SendRtu => {
                let rtu = RtuRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    private_data: [0; pd::RTU],
                };
                out = Some((CmMad::new(c.req_tid, CmMessage::Rtu(rtu)), false));
            }
            Action::SendMra => {
                let kind = match to {
                    CmState::MraReqSent => msg_kind::REQ,
                    _ => msg_kind::REP,
                };
                let mra = MraRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message_mraed: kind,
                    service_timeout: c.mra_service_timeout,
                    private_data: [0; pd::MRA],
                };
                out = Some((CmMad::new(c.req_tid, CmMessage::Mra(mra)), false));
            }
            Action::SendRej | Action::SendRejTimeout | Action::SendRejStale => {
                let message_rejected = match from {
                    CmState::ReqRcvd | CmState::MraReqSent | CmState::Timewait => msg_kind::REQ,
                    CmState::RepRcvd | CmState::MraRepSent => msg_kind::REP,
                    _ => msg_kind::OTHER,
                };
                let (reason, info_len, ari, private_data) = match action {
                    Action::SendRejTimeout => {
                        let mut ari = [0u8; INFO_LEN];
                        ari[..8].copy_from_slice(&ca_guid.to_be_bytes());
                        (rej_reason::TIMEOUT, 8, ari, [0; pd::REJ])
                    }
                    Action::SendRejStale => {
                        (rej_reason::STALE_CONN, 0, [0; INFO_LEN], [0; pd::REJ])
                    }
                    _ => (c.rej_reason, 0, [0; INFO_LEN], c.rej_private_data),
                };
                let rej = RejRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message_rejected,
                    reject_info_length: info_len,
                    reason,
                    ari,
                    private_data,
                };
                out = Some((CmMad::new(c.req_tid, CmMessage::Rej(rej)), false));
            }
            Action::SendDreq => {
                let dreq = DreqRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    remote_qpn: c.remote_qpn,
                    private_data: c.dreq_private_data,
                };
                out = Some((CmMad::new(fresh_tid, CmMessage::Dreq(dreq)), true));
            }
            Action::SendDrep => {
                let drep = DrepRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    private_data: [0; pd::DREP],
                };
                let tid = if ctx.tid != 0 { ctx.tid } else { c.dreq_tid };
                out = Some((CmMad::new(tid, CmMessage::Drep(drep)), false));
            }
            Action::SendAprUnsupported => {
                let apr = AprRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    additional_info_length: 0,
                    status: apr_status::UNSUPPORTED,
                    additional_info: [0; INFO_LEN],
                    private_data: [0; pd::APR],
                };
                out = Some((CmMad::new(ctx.tid, CmMessage::Apr(apr)), false));
            }
            Action::SendSidrReq => {
                if let Some(req) = c.sidr_req {
                    out = Some((CmMad::new(c.req_tid, CmMessage::SidrReq(req)), true));
                }
            }
            Action::SendSidrRep => {
                if let (Some(req), Some(ans)) = (c.sidr_req, c.sidr_answer) {
                    let rep = SidrRepRepr {
                        request_id: req.request_id,
                        status: sidr_status::SUCCESS,
                        additional_info_length: 0,
                        qpn: ans.qpn,
                        service_id: req.service_id,
                        qkey: ans.qkey,
                        additional_info: [0; INFO_LEN],
                        private_data: [0; pd::SIDR_REP],
                    };
                    out = Some((CmMad::new(c.req_tid, CmMessage::SidrRep(rep)), false));
                }
            }
            Action::Resend => {
                if let Some(bytes) = c.guarded {
                    self.stats.sent += 1;
                    self.tx.push_back((remote, bytes));
                }
            }
            Action::ArmRetry => c.deadline = Some(now + c.timeout),
            Action::ExtendTimer => {
                let service = match ctx.message {
                    Some(CmMessage::Mra(m)) => {
                        cm_timeout(m.service_timeout).min(self.config.max_peer_wait)
                    }
                    _ => Duration::ZERO,
                };
                c.deadline = Some(now + service + c.timeout);
            }
            Action::CancelTimer => {
                c.deadline = None;
                c.guarded = None;
            }
            Action::StartTimewait => {
                c.deadline = None;
                c.guarded = None;
                c.timewait_at = Some(now + c.timewait);
            }
            Action::Report(kind) => {
                let ev = self.event(id, kind, ctx);
                if let Some(ev) = ev {
                    self.events.push_back(ev);
                }
            }
        }
        if let Some((mad, guarded)) = out {
            let bytes = mad.to_bytes();
            if guarded {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.guarded = Some(bytes);
                    c.retries_left = c.max_retries;
                }
            }
            self.stats.sent += 1;
            self.tx.push_back((remote, bytes));
        }
    }

    fn event(&self, id: u32, kind: EventKind, ctx: Ctx<'_>) -> Option<CmEvent> {
        let c = self.conns.get(&id)?;
        let cid = ConnId(id);
        Some(match kind {
            EventKind::ReqReceived => CmEvent::ReqReceived {
                id: cid,
                listener: cid,
                from: c.remote,
                req: Box::new(c.req?),
            },
            EventKind::RepReceived => match ctx.message {
                Some(CmMessage::Rep(r)) => CmEvent::RepReceived {
                    id: cid,
                    rep: Box::new(*r),
                },
                _ => return None,
            },
            EventKind::Established => CmEvent::Established { id: cid },
            EventKind::Rejected => match ctx.message {
                Some(CmMessage::Rej(r)) => CmEvent::Rejected {
                    id: cid,
                    reason: r.reason,
                    private_data: r.private_data.to_vec(),
                },
                _ => return None,
            },
            EventKind::DisconnectRequested => CmEvent::DisconnectRequested { id: cid },
            EventKind::Disconnected => CmEvent::Disconnected { id: cid },
            EventKind::TimewaitExit => CmEvent::TimewaitExit { id: cid },
            EventKind::Unreachable => CmEvent::Unreachable { id: cid },
            EventKind::DisconnectTimeout => CmEvent::DisconnectTimeout { id: cid },
            EventKind::SidrReqReceived => CmEvent::SidrReqReceived {
                id: cid,
                listener: cid,
                from: c.remote,
                req: Box::new(c.sidr_req?),
            },
            EventKind::SidrReply => match ctx.message {
                Some(CmMessage::SidrRep(r)) => CmEvent::SidrReply {
                    id: cid,
                    status: r.status,
                    qpn: r.qpn,
                    qkey: r.qkey,
                },
                _ => return None,
            },
        })
    }
}
