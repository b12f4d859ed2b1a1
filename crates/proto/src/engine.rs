//! The transport-engine interface: what every QP transport (RC and its XRC halves, UC, UD
//! and the GSI QP) implements, and the only thing the layers above drive.
//!
//! The contract follows quinn-proto's sans-IO connection. An engine's methods come in four
//! groups:
//! * getters (`&self`): [`Engine::qpn`], [`Engine::qp_type`], [`Engine::state`],
//!   [`Engine::counters`], [`Engine::is_idle`], [`Engine::poll_timeout`];
//! * inputs: [`Engine::handle_packet`] (a parsed, ICRC-checked packet *with the address it
//!   came from*: an [`Arrival`]) and [`Engine::handle_timeout`];
//! * application commands: [`Engine::post_send`] (and [`Engine::check_send_list`], which
//!   says whether a list of WRs would all be accepted), [`Engine::post_recv`],
//!   [`Engine::enter_rts`], [`Engine::set_state`];
//! * outputs: [`Engine::poll_transmit`] (one packet, written into the caller's buffer,
//!   *with the address it goes to*: a [`Transmit`]), [`Engine::poll_completion`],
//!   [`Engine::poll_event`].
//!
//! After any input or command the caller drives the outputs: `poll_transmit` until it
//! returns `None`, then `poll_completion` and `poll_event` until empty, then re-reads
//! `poll_timeout`. `now` never goes backwards. Nothing here knows a socket, a thread or a
//! clock; the caller passes the time in.
//!
//! Addresses are per packet, not per QP: a connected transport (RC, UC) sends everything to
//! the peer of its address vector, a datagram transport (UD, GSI) sends each message to the
//! address handle its work request names, and receives from anyone.

use std::fmt;
use std::net::IpAddr;

use uroce_wire::PacketRepr;

use crate::qp_state::{QpState, QpType};
use bitflags::bitflags;
use thiserror::Error;
use uroce_wire::Psn;

use crate::memory::Memory;
use crate::time::Instant;
use crate::wr::{RecvWr, SendWr, WorkCompletion};

pub use crate::counters::EngineCounters;

/// The largest message (IBA: 2^31 bytes).
pub const MAX_MSG_LEN: u64 = 1 << 31;

bitflags! {
    /// What remote peers may do on this QP (`qp_access_flags`; the `ibv_access_flags`
    /// values of the remote bits).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct RemoteAccess: u32 {
        /// RDMA WRITE (and WRITE with immediate).
        const WRITE = 2;
        /// RDMA READ.
        const READ = 4;
        /// Atomics.
        const ATOMIC = 8;
    }
}

/// The requester attributes an RTR→RTS (or SQD→RTS) transition sets; see
/// [`Engine::enter_rts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttrs {
    /// First PSN the requester uses.
    pub sq_psn: Psn,
    /// Local ACK timeout code (0 = none).
    pub timeout: u8,
    /// Retries after timeouts and sequence NAKs (0..=7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (7 = unlimited).
    pub rnr_retry: u8,
    /// Outstanding READ/atomic WRs we may initiate.
    pub max_rd_atomic: u8,
}

/// The attributes `ibv_modify_qp` may change while the QP has an engine (RTR→RTS,
/// RTS→RTS, SQD→SQD, SQD→RTS: the optional attributes of IBA Vol 1 §11.2.4.2's state
/// table), as they are after the change; see [`Engine::reconfigure`]. A transport ignores
/// what it has no use for: datagram QPs the path, access and RNR timer, connected QPs the
/// Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveAttrs {
    /// Remote access the responder allows (`IBV_QP_ACCESS_FLAGS`).
    pub access: RemoteAccess,
    /// The RNR NAK timer code the responder advertises.
    pub min_rnr_timer: u8,
    /// The peer's address (the address vector's destination GID); packets from any other
    /// address are dropped.
    pub peer: IpAddr,
    /// The QP's own address (the address vector's source GID), when known.
    pub local: Option<IpAddr>,
    /// The QP's P_Key index and the P_Key it names.
    pub pkey_index: u16,
    /// The P_Key at `pkey_index`.
    pub pkey: u16,
    /// Datagram QPs: the Q_Key.
    pub qkey: u32,
}

/// Receive WQEs shared by several QPs (an SRQ). The verbs layer implements it.
pub trait SharedRecvQueue {
    /// Takes the next receive WQE, if any.
    fn take(&mut self) -> Option<RecvWr>;
}

/// Why an XRCETH's SRQ number was refused (IBA Vol 1 Annex A14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum XrcSrqError {
    /// No XRC SRQ has this number.
    #[error("no XRC SRQ {0}")]
    Unknown(u32),
    /// The SRQ exists but belongs to another XRC domain than the target QP.
    #[error("XRC SRQ {0} belongs to another XRC domain")]
    OtherDomain(u32),
}

/// The XRC SRQs an XRC target QP may use: those of its XRC domain, by number. The verbs
/// layer implements it over its SRQ table; tests over plain maps.
///
/// Contract: the engine calls [`XrcSrqs::select`] with the XRCETH SRQ number of every
/// request packet it executes (and of every READ response it builds) before touching
/// receive WQEs or memory. After a successful `select`, [`XrcSrqs::take`] takes from
/// that SRQ, and [`Env::mem`] checks remote accesses against the protection domain of
/// that SRQ (an XRC target QP has no PD of its own: IBA Annex A14 uses the PD of the XRC
/// SRQ). The completion of a WQE is emitted as [`CqKind::XrcSrq`] with the SRQ number: it
/// goes to that SRQ's CQ.
pub trait XrcSrqs {
    /// Makes `srqn` the current SRQ; an unknown number or an SRQ of another domain is
    /// refused (the engine NAKs the request with Invalid Request).
    fn select(&mut self, srqn: u32) -> Result<(), XrcSrqError>;
    /// Takes the next receive WQE of the current SRQ, if any.
    fn take(&mut self) -> Option<RecvWr>;
}

/// What an engine call may touch besides the QP itself.
pub struct Env<'a> {
    /// Local and remote-accessible memory.
    pub mem: &'a dyn Memory,
    /// The SRQ of a QP created with `use_srq`.
    pub srq: Option<&'a mut dyn SharedRecvQueue>,
    /// XRC target QPs: the SRQs of the QP's XRC domain, by number (see [`XrcSrqs`]).
    pub xrc: Option<&'a mut dyn XrcSrqs>,
}

impl<'a> Env<'a> {
    /// An environment over `mem` without SRQ.
    pub fn new(mem: &'a dyn Memory) -> Env<'a> {
        Env {
            mem,
            srq: None,
            xrc: None,
        }
    }

    /// An environment over `mem` whose receive WQEs come from `srq`.
    pub fn with_srq(mem: &'a dyn Memory, srq: &'a mut dyn SharedRecvQueue) -> Env<'a> {
        Env {
            mem,
            srq: Some(srq),
            xrc: None,
        }
    }

    /// An environment for an XRC target QP: receive WQEs (and the protection domain `mem`
    /// checks against) come from the XRC SRQ each packet names, resolved by `xrc`.
    pub fn with_xrc(mem: &'a dyn Memory, xrc: &'a mut dyn XrcSrqs) -> Env<'a> {
        Env {
            mem,
            srq: None,
            xrc: Some(xrc),
        }
    }
}

/// Which completion queue a work completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CqKind {
    /// The send CQ (send WRs).
    Send,
    /// The receive CQ (receive WRs).
    Recv,
    /// A receive of an XRC target QP: the CQ of the XRC SRQ with this number.
    XrcSrq(u32),
}

/// What an engine has produced for its owner and not yet handed out: work completions in
/// the order they were generated, asynchronous events, and how many completions of each
/// work queue are still waiting to be polled. Every engine keeps one; a completion not yet
/// polled still occupies its work queue's slot (`send_cqes`/`recv_cqes` count against
/// `max_send_wr`/`max_recv_wr`), as a CQE does on an HCA until the CQ is read.
#[derive(Debug, Default)]
pub struct Outbox {
    completions: std::collections::VecDeque<(CqKind, WorkCompletion)>,
    send_cqes: usize,
    recv_cqes: usize,
    events: std::collections::VecDeque<QpEvent>,
}

impl Outbox {
    /// Queues a work completion for the CQ `kind`.
    pub fn push_completion(&mut self, kind: CqKind, wc: WorkCompletion) {
        match kind {
            CqKind::Send => self.send_cqes += 1,
            CqKind::Recv | CqKind::XrcSrq(_) => self.recv_cqes += 1,
        }
        self.completions.push_back((kind, wc));
    }

    /// The oldest work completion, which then no longer occupies its queue's slot.
    pub fn pop_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        let c = self.completions.pop_front()?;
        match c.0 {
            CqKind::Send => self.send_cqes = self.send_cqes.saturating_sub(1),
            CqKind::Recv | CqKind::XrcSrq(_) => self.recv_cqes = self.recv_cqes.saturating_sub(1),
        }
        Some(c)
    }

    /// Send completions not yet polled.
    pub fn send_cqes(&self) -> usize {
        self.send_cqes
    }

    /// Receive completions (including XRC SRQ ones) not yet polled.
    pub fn recv_cqes(&self) -> usize {
        self.recv_cqes
    }

    /// Queues an asynchronous event.
    pub fn push_event(&mut self, event: QpEvent) {
        self.events.push_back(event);
    }

    /// The oldest asynchronous event.
    pub fn pop_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }
}

/// Asynchronous QP events (IBA Vol 1 §11.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpEvent {
    /// The first request arrived while the QP was in RTR.
    CommEst,
    /// In SQD, every send WR that had started has completed.
    SqDrained,
    /// An SRQ-attached QP went to ERR: it takes no more WQEs from the SRQ.
    LastWqeReached,
    /// The QP went to ERR for an internal reason no completion reports.
    QpFatal,
    /// The responder received an invalid request and moved the QP to ERR.
    QpReqErr,
    /// The responder detected an access violation and moved the QP to ERR.
    QpAccessErr,
}

/// Why a work request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PostError {
    /// The queue holds its maximum of WRs (counting completions not yet polled).
    #[error("work queue full")]
    QueueFull,
    /// WRs cannot be posted in this QP state.
    #[error("cannot post in QP state {0:?}")]
    BadState(QpState),
    /// The WR itself is invalid for this QP.
    #[error("invalid work request: {0}")]
    InvalidWr(crate::wr::WrError),
}

/// Where a received packet came from, as the I/O layer saw it: the IP addresses and the
/// header fields a UDP socket reports. A datagram transport answers `src` and builds the
/// 40-byte GRH area of a receive from these values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arrival {
    /// The sender's IP address (the IPv4 or IPv6 source address).
    pub src: IpAddr,
    /// The address it was sent to (our device's address).
    pub dst: IpAddr,
    /// IPv4 TOS / IPv6 traffic class, when the socket reports it (else 0).
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit, when the socket reports it (else 64, what Linux sends).
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits; 0 for IPv4 or when unknown).
    pub flow_label: u32,
    /// IPv4 Identification, when known (the ICRC check may recover it; else 0).
    pub ipv4_id: u16,
}

impl Arrival {
    /// Whether the packet travelled the path of a connected QP: it came from `peer` (the
    /// address vector's destination) and, when `local` is known, went to `local` (the QP's
    /// own address). IPv4-mapped IPv6 addresses compare as their IPv4 address.
    ///
    /// RC, UC and XRC QPs drop what did not, as IBA's packet validation drops a connected
    /// QP's packets whose source and destination addresses are not its path's (in RoCEv2
    /// the path's addresses are the IP header's, Annex A17), and as Linux rxe drops
    /// packets whose addresses are not its QP's: otherwise anyone who guesses a QPN and a
    /// PSN could write into registered memory.
    pub fn on_path(&self, peer: IpAddr, local: Option<IpAddr>) -> bool {
        self.src.to_canonical() == peer.to_canonical()
            && local.is_none_or(|l| self.dst.to_canonical() == l.to_canonical())
    }

    /// A packet from `src` to `dst` with the header values Linux sends by default
    /// (traffic class 0, hop limit 64, flow label 0, Identification 0).
    pub const fn new(src: IpAddr, dst: IpAddr) -> Arrival {
        Arrival {
            src,
            dst,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            ipv4_id: 0,
        }
    }
}

/// One packet an engine wrote with [`Engine::poll_transmit`]: its length in the caller's
/// buffer (BTH up to and including the 4 ICRC bytes, which are left zero for the I/O layer
/// to seal) and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transmit {
    /// Bytes written at the start of the buffer.
    pub len: usize,
    /// The destination IP address (UDP port 4791).
    pub dst: IpAddr,
}

/// When the answer to a received packet may leave: what [`Engine::handle_packet`] returns.
/// The engine decides; the runtime that carries its output only reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Reply {
    /// Whatever the packet made the engine send (if anything) goes with the next transmit.
    #[default]
    Now,
    /// The packet was a SEND or RDMA WRITE request and its answer is the responder's
    /// acknowledgement, which may wait a moment: the requester does not need it to go on
    /// (its window is larger than one message) and the responder coalesces ACKs (IBA
    /// Vol 1 §9.7.5, the responder: one ACK may acknowledge several requests). A runtime whose
    /// application is about to see what the request brought (a receive completion, data
    /// in its memory) may hold the QP's output until the application's next post, so the
    /// reply and the ACK leave together. READ and atomic responses, and whatever an ACK
    /// unblocks, are never deferrable.
    Deferrable,
}

/// A QP transport as a sans-IO state machine. See the module doc for the calling
/// contract. Implemented by [`crate::rc::RcQp`] (RC, XRC_SEND, XRC_RECV),
/// [`crate::uc::UcQp`] and [`crate::ud::UdQp`] (UD and the GSI QP); `verbs` and the
/// network device drive nothing else.
pub trait Engine: fmt::Debug + Send {
    /// Our QP number (24 bits).
    fn qpn(&self) -> u32;
    /// The transport this engine implements.
    fn qp_type(&self) -> QpType;
    /// The engine's state (it moves to ERR on its own after fatal errors).
    fn state(&self) -> QpState;
    /// Statistics.
    fn counters(&self) -> EngineCounters;
    /// True when nothing is queued, in flight or waiting to be sent or acknowledged.
    fn is_idle(&self) -> bool;
    /// The earliest deadline at which [`Engine::handle_timeout`] must be called.
    fn poll_timeout(&self) -> Option<Instant>;

    /// A packet whose BTH DestQP is this QP, already ICRC-checked and parsed (once, by the
    /// socket layer; the engine parses nothing). Returns when its answer may leave.
    fn handle_packet(
        &mut self,
        now: Instant,
        from: &Arrival,
        pkt: &PacketRepr<'_>,
        env: &mut Env<'_>,
    ) -> Reply;
    /// Called when `now >= poll_timeout()`.
    fn handle_timeout(&mut self, now: Instant, env: &mut Env<'_>);

    /// Queues a send work request.
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostError>;
    /// Whether `post_send` would accept every WR of `wrs` if they were posted now, one
    /// after the other (the state allows posting, each WR is valid, the queue has room
    /// for all of them); queues nothing. `Err((i, e))`: WR `i` would be refused with `e`.
    /// The layers above call it, under the QP's lock, before posting a list that must go
    /// in whole or not at all (the `ibv_wr_*` API's `ibv_wr_complete`).
    fn check_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, PostError)>;
    /// Queues a receive work request.
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError>;
    /// RTR→RTS (or SQD→RTS) with the requester attributes that transition sets. Datagram
    /// and unreliable transports use `sq_psn` only.
    fn enter_rts(&mut self, rts: RtsAttrs);
    /// Application-driven state change (ERR flushes, RESET discards, SQD drains).
    fn set_state(&mut self, to: QpState);
    /// Takes the attributes a modify changed while the engine runs (access flags, the RNR
    /// timer, the path in SQD, the P_Key, a datagram QP's Q_Key): from the next packet on,
    /// the engine checks and answers with these. The layer above calls it after every
    /// modify of a QP that has an engine, before the transition itself.
    fn reconfigure(&mut self, attrs: &LiveAttrs);

    /// Writes the next packet into `buf` (at least 4096 + 64 bytes) and says where it
    /// goes; `None` when nothing is ready.
    fn poll_transmit(
        &mut self,
        now: Instant,
        env: &mut Env<'_>,
        buf: &mut [u8],
    ) -> Option<Transmit>;
    /// The next work completion and the CQ it belongs on.
    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)>;
    /// The next asynchronous event.
    fn poll_event(&mut self) -> Option<QpEvent>;
}

/// A boxed engine is an engine: the layers above hold `Box<dyn Engine>` and generic
/// drivers (the simulator) take either.
impl<E: Engine + ?Sized> Engine for Box<E> {
    fn qpn(&self) -> u32 {
        (**self).qpn()
    }
    fn qp_type(&self) -> QpType {
        (**self).qp_type()
    }
    fn state(&self) -> QpState {
        (**self).state()
    }
    fn counters(&self) -> EngineCounters {
        (**self).counters()
    }
    fn is_idle(&self) -> bool {
        (**self).is_idle()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        (**self).poll_timeout()
    }
    fn handle_packet(
        &mut self,
        now: Instant,
        from: &Arrival,
        pkt: &PacketRepr<'_>,
        env: &mut Env<'_>,
    ) -> Reply {
        (**self).handle_packet(now, from, pkt, env)
    }
    fn handle_timeout(&mut self, now: Instant, env: &mut Env<'_>) {
        (**self).handle_timeout(now, env)
    }
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        (**self).post_send(wr)
    }
    fn check_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, PostError)> {
        (**self).check_send_list(wrs)
    }
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        (**self).post_recv(wr)
    }
    fn enter_rts(&mut self, rts: RtsAttrs) {
        (**self).enter_rts(rts)
    }
    fn set_state(&mut self, to: QpState) {
        (**self).set_state(to)
    }
    fn reconfigure(&mut self, attrs: &LiveAttrs) {
        (**self).reconfigure(attrs)
    }
    fn poll_transmit(
        &mut self,
        now: Instant,
        env: &mut Env<'_>,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        (**self).poll_transmit(now, env, buf)
    }
    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        (**self).poll_completion()
    }
    fn poll_event(&mut self) -> Option<QpEvent> {
        (**self).poll_event()
    }
}

#[cfg(test)]
mod tests {
    use super::Arrival;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[test]
    fn on_path_compares_both_addresses_and_ipv4_mapped_as_ipv4() {
        let v4 = |d| IpAddr::V4(Ipv4Addr::new(10, 0, 0, d));
        let mapped = |d| IpAddr::V6(Ipv4Addr::new(10, 0, 0, d).to_ipv6_mapped());
        let v6 = |d: u16| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, d));
        let a = Arrival::new(v4(1), v4(2));
        assert!(a.on_path(v4(1), Some(v4(2))));
        assert!(
            a.on_path(mapped(1), Some(mapped(2))),
            "GIDs are IPv4-mapped"
        );
        assert!(a.on_path(v4(1), None), "local unknown: source only");
        assert!(!a.on_path(v4(3), Some(v4(2))), "another source");
        assert!(!a.on_path(v4(1), Some(v4(4))), "another destination");
        let b = Arrival::new(v6(1), v6(2));
        assert!(b.on_path(v6(1), Some(v6(2))));
        assert!(!b.on_path(v6(7), Some(v6(2))));
        assert!(!b.on_path(v6(1), Some(v6(8))));
        // An IPv6 address that only shares the low 32 bits is not the IPv4 address.
        assert!(!b.on_path(IpAddr::V4(Ipv4Addr::new(0, 0, 0, 1)), None));
    }
}
