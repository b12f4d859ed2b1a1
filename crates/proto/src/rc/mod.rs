//! # The RC transport engine: one reliable-connected queue pair as a sans-IO state machine
//!
//! [`RcQp`] implements the IBA reliable-connected transport (IBA Vol 1 ch. 9, §9.7) for one
//! QP. It owns no socket, clock or thread: the caller feeds it work requests
//! ([`Engine::post_send`], [`Engine::post_recv`]), received packets ([`Engine::handle_packet`],
//! already parsed and ICRC-checked) and the time ([`Engine::handle_timeout`]), and drains
//! its outputs: packets ([`Engine::poll_transmit`], built one at a time into the caller's
//! buffer), the next timer deadline ([`Engine::poll_timeout`]), work completions
//! ([`Engine::poll_completion`]) and asynchronous events ([`Engine::poll_event`]). Memory is
//! reached only through [`crate::memory::Memory`] (in [`Env`]), so the same engine runs over
//! the verbs layer's registered regions and over test buffers.
//!
//! ## The three parts (after rxe's split)
//! * **Requester** (`requester.rs`): walks the send queue in order and builds request
//!   packets on demand, gathering payload straight from the WR's SGEs (or inline bytes) into
//!   the caller's buffer: a message is never materialised. It assigns PSNs (a READ consumes
//!   `ceil(len / PMTU)` PSNs, at least one; an atomic one), sets AckReq on the last packet of
//!   every message and at least every 64 packets, keeps at most 512 PSNs unacknowledged,
//!   at most `max_rd_atomic` READ/atomic WRs outstanding, and holds a `FENCE` WR until every
//!   earlier READ/atomic has completed.
//! * **Completer** (`completer.rs`): processes ACKs, NAKs, READ responses and atomic
//!   ACKs. One ACK completes every SEND/WRITE up to its PSN; READ responses are scattered
//!   into the WR's SGEs as they arrive; an ACK or response beyond an unanswered READ/atomic
//!   is an implicit NAK. Loss recovery is go-back-N from the oldest unacknowledged PSN.
//!   Work completions leave strictly in posting order.
//! * **Responder** (`responder.rs`): the receive pipeline of IBA Vol 1 §9.7: PSN check
//!   (sequence-error NAK once per gap, duplicates re-acknowledged or answered from the
//!   responder resources without re-execution), opcode sequence, access rights, receive WQE
//!   (RNR NAK when none), length checks, R_Key checks through `Memory`, execution,
//!   completion, coalesced acknowledgement. READ responses are generated from memory at
//!   transmit time, one packet per [`Engine::poll_transmit`] call.
//!
//! [`Engine::poll_transmit`] sends responder output (ACKs, NAKs, READ responses, atomic
//! ACKs) before new requests.
//!
//! ## Timers
//! Two deadlines, both reported by [`Engine::poll_timeout`]:
//! * the **retransmit timer** (local ACK timeout, [`crate::time::local_ack_timeout`] of
//!   `timeout`; `0` = never): armed when a request packet is sent and none is pending,
//!   re-armed on every forward progress while PSNs are unacknowledged, disarmed when all
//!   are. On expiry the requester goes back to the oldest unacknowledged PSN.
//! * the **RNR timer**: after an RNR NAK the requester waits
//!   [`uroce_wire::aeth::rnr_timer_micros`] of the NAK's timer code, then resends from the
//!   NAKed PSN. The retransmit timer is suspended meanwhile.
//!
//! ## Retry counting
//! `retry_cnt` is the number of retries allowed after a local ACK timeout, a PSN sequence
//! error NAK or an implicit NAK (lost READ/atomic responses: at most one such retry between
//! two forward progresses); it is reloaded on every forward progress (a valid ACK or
//! response that advances the oldest unacknowledged PSN). `rnr_retry` counts RNR NAKs the
//! same way; `rnr_retry == 7` means unlimited. With `retry_cnt = n` a message is sent at
//! most `n + 1` times before `RETRY_EXC_ERR` when its timers fire on time.
//!
//! A retransmit timeout that fired more than half a period late (at least 1 ms: this
//! process was not scheduled), or after a packet from the peer arrived on the QP since the
//! previous timeout and since the last forward progress (the peer runs), is *excused*: it
//! retransmits without consuming a retry, at most `retry_cnt` times between two forward
//! progresses (`timeouts_excused`).
//! IBA's Local ACK Timeout is a minimum (the requester waits *at least* that long,
//! C9-140), and a late timer tells nothing about the peer: on a loaded machine (a CI
//! runner) the timers of a live connection fire late, and counting them failed live
//! connections with `RETRY_EXC_ERR`. A peer that is really gone still fails: after exactly
//! `retry_cnt` retries when the timers fire on time (as IBA), after at most
//! `2 × retry_cnt + 1` timeouts when they do not.
//!
//! ## Spec rules followed, and where we deviate from rxe
//! * `retry_cnt == 7` is **finite** (seven retries), as IBA specifies; rxe treats it as
//!   infinite. `rnr_retry == 7` is infinite in both.
//! * An incoming message longer than the receive buffer completes the responder's receive
//!   WQE with `LOC_LEN_ERR` (IBA's local length error); rxe reports `REM_INV_REQ_ERR` there.
//!   Either way the requester gets NAK Invalid Request → `REM_INV_REQ_ERR` and both QPs
//!   end in ERR.
//! * A receive WQE whose SGEs cannot be written completes with `LOC_PROT_ERR`, and the
//!   requester gets NAK Remote Operational Error.
//! * Receive completions on RC do not carry the `GRH` flag (it describes a GRH in the
//!   receive buffer, which only UD has); rxe sets it on every receive.
//! * The responder raises `QP_REQ_ERR` / `QP_ACCESS_ERR` when an invalid request or an
//!   access violation moves the QP to ERR (IBA); rxe raises neither.
//! * An incoming READ may span at most 2^22 PSNs (1 GiB at PMTU 256, the whole 2 GiB IBA
//!   maximum from PMTU 512 up): a longer response range would not fit the half of the
//!   24-bit PSN space that PSN comparison relies on. The requester refuses such a READ at
//!   post time and keeps at most 2^22 + 512 PSNs in flight.
//! * Before entering ERR on an error it detected itself, the responder still transmits
//!   what it had queued before the error (READ responses, ACKs) and then the error NAK,
//!   so that earlier requests complete normally at the requester, as they would at a
//!   responder that processes requests strictly one after another.
//! * LOCAL_INV / BIND_MW (local operations) are not executed here: the verbs layer owns
//!   memory windows and regions. [`Engine::post_send`] refuses them.
//! * P_Key check as rxe: low 15 bits equal and non-zero, membership bit on either side.
//!
//! Nothing here panics on packet contents: header presence, lengths and PSNs are checked
//! before use, arithmetic on message offsets is done in `u64` with checked or saturating
//! operations where the operands come from the wire.

mod completer;
mod requester;
mod responder;
mod wqe;

#[cfg(test)]
pub(crate) mod tests;

use uroce_wire::opcode::{self, Operation, Transport};
use uroce_wire::{PacketRepr, Pmtu, Psn};

use crate::build::pkey_match;
use crate::qp_state::{QpState, QpType};
use crate::time::Instant;
use crate::wr::{
    RecvWr, SendOpcode, SendPayload, SendWr, WcOpcode, WcStatus, WorkCompletion, WrError,
};

use requester::Requester;
use responder::Responder;
use wqe::SendWqe;

/// At most this many PSNs are sent and not yet acknowledged. rxe uses 128; with 4 KiB
/// packets that is 512 KiB in flight, which on loopback left the link idle while ACKs
/// travelled (1 MiB RDMA WRITE: 0.95 GB/s at 128, 2.4–2.9 GB/s at 512). 512 packets are
/// 2 MiB, within a 4 MiB socket receive buffer.
pub const MAX_UNACKED_PSNS: u32 = 512;
/// AckReq is set at least once every this many request packets (rxe `RXE_MAX_PKT_PER_ACK`).
pub const MAX_PKTS_PER_ACKREQ: u32 = 64;
/// The most PSNs one RDMA READ may consume (see the module doc).
pub const MAX_READ_PSNS: u64 = 1 << 22;
/// The payload (and RETH DMA length) of an ATOMIC WRITE (IBA 1.5): one 64-bit word.
pub const ATOMIC_WRITE_LEN: u64 = 8;

/// The attributes of an RC QP the engine uses (the RTS-relevant `ibv_qp_attr` subset).
#[derive(Debug, Clone)]
pub struct RcConfig {
    /// Our QP number (24 bits).
    pub qpn: u32,
    /// The connected peer's QP number (24 bits): DestQP of everything we send.
    pub dest_qpn: u32,
    /// Path MTU: payload bytes per packet.
    pub pmtu: Pmtu,
    /// First PSN the requester uses.
    pub sq_psn: Psn,
    /// First PSN the responder expects.
    pub rq_psn: Psn,
    /// Local ACK timeout code: 4.096 µs × 2^timeout; 0 = never time out.
    pub timeout: u8,
    /// Retries after timeouts / sequence NAKs (0..=7; IBA: 7 is seven, not infinite).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code sent in our RNR NAKs.
    pub min_rnr_timer: u8,
    /// READ/atomic WRs we may have outstanding (initiator depth).
    pub max_rd_atomic: u8,
    /// Responder resources: incoming READ/atomics we remember for duplicates.
    pub max_dest_rd_atomic: u8,
    /// What remote peers may do on this QP.
    pub access: RemoteAccess,
    /// Every send WR generates a completion (else only `SIGNALED` ones and errors).
    pub sq_sig_all: bool,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Receive WQEs come from [`Env::srq`] instead of the QP's own receive queue.
    pub use_srq: bool,
    /// P_Key sent and matched (0xFFFF).
    pub pkey: u16,
    /// The peer's IP address (from the address vector): where every packet goes, and
    /// where every packet the QP accepts must come from.
    pub peer: std::net::IpAddr,
    /// Our own address on the QP's path (its source GID), when known: every packet the QP
    /// accepts must be addressed to it. `None`: not checked.
    pub local: Option<std::net::IpAddr>,
    /// `Rc`, or one of the two halves of XRC (IBA Vol 1 Annex A14), which run the same
    /// engine on the XRC opcodes: `XrcSend` (initiator: requester and completer only; every
    /// request packet carries an XRCETH with its WR's `remote_srqn`) and `XrcRecv` (target:
    /// responder only; each request's XRCETH names the SRQ, resolved through [`Env::xrc`],
    /// that its receive WQE comes from and whose CQ gets the completion). Other types are
    /// treated as `Rc`.
    pub qp_type: QpType,
}

impl RcConfig {
    /// Defaults: PMTU 1024, PSNs 0, timeout 14 (≈ 67 ms), retry_cnt 7, rnr_retry 7,
    /// min_rnr_timer 12 (0.64 ms), 16 READ/atomics each way, all remote access, selective
    /// signalling, 1024 WRs per queue, no SRQ, P_Key 0xFFFF, peer 0.0.0.0, local address
    /// unchecked.
    pub fn new(qpn: u32, dest_qpn: u32) -> RcConfig {
        RcConfig {
            qpn,
            dest_qpn,
            pmtu: Pmtu::Mtu1024,
            sq_psn: Psn::ZERO,
            rq_psn: Psn::ZERO,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            access: RemoteAccess::all(),
            sq_sig_all: false,
            max_send_wr: 1024,
            max_recv_wr: 1024,
            use_srq: false,
            pkey: 0xffff,
            peer: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            local: None,
            qp_type: QpType::Rc,
        }
    }

    /// The transport of the packets: XRC for the XRC types, RC otherwise.
    pub fn transport(&self) -> Transport {
        match self.qp_type {
            QpType::XrcSend | QpType::XrcRecv => Transport::Xrc,
            _ => Transport::Rc,
        }
    }

    /// Whether this is an XRC target (XRC_RECV) QP.
    pub fn is_xrc_target(&self) -> bool {
        self.qp_type == QpType::XrcRecv
    }

    /// The opcode of this QP's transport with the operation of the RC opcode `rc_op`
    /// (IBA Vol 1 §9.2: the XRC opcodes 0xA0-0xB7 are the RC ones 0x00-0x17 under the XRC
    /// transport prefix).
    pub(crate) fn wire_opcode(&self, rc_op: u8) -> u8 {
        match self.transport() {
            Transport::Xrc => (rc_op & 0x1f) | Transport::Xrc as u8,
            _ => rc_op,
        }
    }
}

// The transport-neutral parts of the engine contract live in `engine`; re-exported here
// under the paths the layers above have always used.
pub use crate::counters::EngineCounters as RcCounters;
pub use crate::engine::{
    CqKind, Env, PostError, QpEvent, RemoteAccess, RtsAttrs, SharedRecvQueue, XrcSrqError, XrcSrqs,
    MAX_MSG_LEN,
};
use crate::engine::{Engine, LiveAttrs, Outbox, Reply};

/// One RC queue pair: requester, completer and responder.
///
/// Method groups, after quinn's sans-IO contract: getters (`&self`); inputs
/// (`handle_packet`, `handle_timeout`); application commands (`post_send`, `post_recv`,
/// `set_state`); outputs (`poll_transmit`, `poll_timeout`, `poll_completion`,
/// `poll_event`). After any input or command, drive the outputs: call `poll_transmit` until
/// it returns `None`, then re-read `poll_timeout`. `now` must never go backwards.
#[derive(Debug)]
pub struct RcQp {
    cfg: RcConfig,
    state: QpState,
    req: Requester,
    resp: Responder,
    outbox: Outbox,
    counters: RcCounters,
    drained_notified: bool,
    comm_est_sent: bool,
}

impl RcQp {
    /// A QP in RTS with `cfg`: requester and responder active, queues empty.
    /// `retry_cnt` and `rnr_retry` above 7 are treated as 7.
    pub fn new(mut cfg: RcConfig) -> RcQp {
        cfg.retry_cnt = cfg.retry_cnt.min(7);
        cfg.rnr_retry = cfg.rnr_retry.min(7);
        cfg.qpn &= 0x00ff_ffff;
        cfg.dest_qpn &= 0x00ff_ffff;
        RcQp {
            req: Requester::new(&cfg),
            resp: Responder::new(&cfg),
            cfg,
            state: QpState::Rts,
            outbox: Outbox::default(),
            counters: RcCounters::default(),
            drained_notified: false,
            comm_est_sent: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RcConfig {
        &self.cfg
    }

    /// A packet addressed to this QP (dest_qp == qpn), already parsed and ICRC-checked by
    /// the caller. Request packets go to the responder (states RTR, RTS, SQD), responses,
    /// ACKs and NAKs to the completer (RTS, SQD). Everything else is dropped and counted:
    /// another DestQP, a P_Key mismatch, an opcode that is not RC, a wrong state.
    /// Processes one received packet; returns when its answer may leave (see
    /// [`Reply::Deferrable`]: the acknowledgement of a SEND or RDMA WRITE request).
    fn receive(&mut self, now: Instant, pkt: &PacketRepr<'_>, env: &mut Env<'_>) -> Reply {
        self.counters.packets_received += 1;
        if pkt.bth.dest_qp != self.cfg.qpn {
            self.drop_wrong_state();
            return Reply::Now;
        }
        if !pkey_match(pkt.bth.pkey, self.cfg.pkey) {
            self.counters.dropped_packets += 1;
            self.counters.dropped_bad_pkey += 1;
            return Reply::Now;
        }
        // The peer runs (see the retransmit timeout in the completer).
        self.req.peer_heard = true;
        let transport = self.cfg.transport();
        let Some(info) = opcode::info(pkt.bth.opcode).filter(|i| i.transport == transport) else {
            self.drop_bad_opcode();
            return Reply::Now;
        };
        // XRC: an initiator has no responder, a target no requester (Annex A14).
        let half = match self.cfg.qp_type {
            QpType::XrcSend => !info.is_request,
            QpType::XrcRecv => info.is_request,
            _ => true,
        };
        if !half {
            self.drop_bad_opcode();
            return Reply::Now;
        }
        let reply = if info.is_request {
            if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                self.drop_wrong_state();
                return Reply::Now;
            }
            self.responder_packet(pkt, info, env);
            // The responder answers a SEND or WRITE with an ACK (or NAK) that may wait;
            // READ and atomic responses may not.
            if matches!(info.operation, Operation::Send | Operation::RdmaWrite) {
                Reply::Deferrable
            } else {
                Reply::Now
            }
        } else {
            if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                self.drop_wrong_state();
                return Reply::Now;
            }
            self.completer_packet(now, pkt, info, env);
            Reply::Now
        };
        self.check_drained();
        reply
    }

    /// Emits the next packet (BTH..ICRC with the 4 ICRC bytes zero: the I/O layer seals it)
    /// into `buf`, returns its length; `None` when nothing is ready. `buf` must hold at
    /// least 4096 + 64 bytes (a smaller one makes packets that do not fit wait). Packet
    /// order: responses/ACKs first, then requests, except that a lone positive ACK lets
    /// one request message go first (`Responder::ack_may_wait`).
    fn emit(&mut self, now: Instant, env: &mut Env<'_>, buf: &mut [u8]) -> Option<usize> {
        let n = match self.state {
            QpState::Err if self.resp.drain_in_err => {
                let n = self.responder_poll(env, buf);
                if self.resp.out.is_empty() {
                    self.resp.drain_in_err = false;
                }
                n
            }
            QpState::Rtr => self.responder_poll(env, buf),
            QpState::Rts | QpState::Sqd => {
                // The WQE at `send_idx` has started only while its message is partly sent.
                let mid_message = self
                    .req
                    .sq
                    .get(self.req.send_idx)
                    .is_some_and(|w| w.started);
                if self.resp.ack_may_wait(mid_message) {
                    if let Some(n) = self.requester_poll(now, env, buf) {
                        self.resp.ack_waited = true;
                        self.counters.packets_sent += 1;
                        return Some(n);
                    }
                    if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                        // A local operation failed: the QP is in ERR.
                        return None;
                    }
                }
                match self.responder_poll(env, buf) {
                    Some(n) => {
                        self.resp.ack_waited = false;
                        Some(n)
                    }
                    // A responder error moves the QP to ERR: no requests after that.
                    None if matches!(self.state, QpState::Rts | QpState::Sqd) => {
                        self.requester_poll(now, env, buf)
                    }
                    None => None,
                }
            }
            _ => None,
        };
        if n.is_some() {
            self.counters.packets_sent += 1;
        }
        n
    }

    /// Starts the engine in RTR: the responder accepts requests, the requester sends
    /// nothing until [`Engine::enter_rts`] (the verbs layer builds the engine at the
    /// INIT→RTR transition, when the responder attributes are known).
    pub fn new_rtr(cfg: RcConfig) -> RcQp {
        let mut qp = RcQp::new(cfg);
        qp.state = QpState::Rtr;
        qp
    }

    fn apply_rts_attrs(&mut self, rts: &RtsAttrs) {
        self.cfg.timeout = rts.timeout;
        self.cfg.retry_cnt = rts.retry_cnt.min(7);
        self.cfg.rnr_retry = rts.rnr_retry.min(7);
        self.cfg.max_rd_atomic = rts.max_rd_atomic;
    }

    // ----- shared helpers of the three parts -----

    fn drop_wrong_state(&mut self) {
        self.counters.dropped_packets += 1;
        self.counters.dropped_wrong_state += 1;
    }

    fn drop_bad_opcode(&mut self) {
        self.counters.dropped_packets += 1;
        self.counters.dropped_bad_opcode += 1;
    }

    fn drop_unexpected_response(&mut self) {
        self.counters.dropped_packets += 1;
        self.counters.dropped_unexpected_responses += 1;
    }

    /// Raises `SqDrained` once in SQD when no started send WR is left.
    fn check_drained(&mut self) {
        if self.state == QpState::Sqd && !self.drained_notified && !self.req.has_started_wqe() {
            self.drained_notified = true;
            self.outbox.push_event(QpEvent::SqDrained);
        }
    }

    /// Moves the QP to ERR and flushes: the send queue in posting order (a WQE that has an
    /// error status of its own reports it, the others `WR_FLUSH_ERR`), then the receive
    /// WQE in progress and the receive queue. `keep_resp_output`: the responder detected
    /// the error and its queued output (ending with the NAK) is still transmitted.
    fn enter_err(&mut self, keep_resp_output: bool) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        while let Some(w) = self.req.sq.front() {
            let status = w.error.unwrap_or(WcStatus::WrFlushErr);
            self.complete_send_head(status);
        }
        self.req.rto_deadline = None;
        self.req.rnr_deadline = None;
        if let Some(wr) = self.resp.take_current_recv() {
            self.complete_recv_error(wr.wr_id, WcStatus::WrFlushErr);
        }
        while let Some(wr) = self.resp.rq.pop_front() {
            self.complete_recv_error(wr.wr_id, WcStatus::WrFlushErr);
        }
        self.resp.cur = None;
        if self.cfg.use_srq || self.cfg.is_xrc_target() {
            self.outbox.push_event(QpEvent::LastWqeReached);
        }
        if keep_resp_output && !self.resp.out.is_empty() {
            self.resp.drain_in_err = true;
        } else {
            self.resp.out.clear();
            self.resp.drain_in_err = false;
        }
    }

    /// Pops the oldest send WQE and reports it if it is signalled or failed.
    fn complete_send_head(&mut self, status: WcStatus) {
        let Some(w) = self.req.sq.pop_front() else {
            return;
        };
        self.req.send_idx = self.req.send_idx.saturating_sub(1);
        if w.started && w.wr.opcode.is_read_or_atomic() {
            self.req.rd_atomic_outstanding = self.req.rd_atomic_outstanding.saturating_sub(1);
        }
        let qpn = self.cfg.qpn;
        if let Some(wc) =
            crate::build::send_completion(self.cfg.sq_sig_all, qpn, &w.wr, w.len, status)
        {
            self.outbox.push_completion(CqKind::Send, wc);
        }
        if status == WcStatus::Success {
            self.complete_local_heads();
        }
    }

    /// Completes the executed local operations (BIND_MW, LOCAL_INV) at the head of the
    /// send queue: they finish once every earlier WQE has.
    fn complete_local_heads(&mut self) {
        for _ in 0..self.req.sq.len() {
            let Some(w) = self.req.sq.front() else {
                break;
            };
            if w.kind() != wqe::WqeKind::Local || !w.started || w.error.is_some() {
                break;
            }
            let Some(w) = self.req.sq.pop_front() else {
                break;
            };
            self.req.send_idx = self.req.send_idx.saturating_sub(1);
            if let Some(wc) = crate::build::send_completion(
                self.cfg.sq_sig_all,
                self.cfg.qpn,
                &w.wr,
                0,
                WcStatus::Success,
            ) {
                self.outbox.push_completion(CqKind::Send, wc);
            }
        }
    }

    fn complete_recv_error(&mut self, wr_id: u64, status: WcStatus) {
        let wc = WorkCompletion::new(wr_id, status, WcOpcode::Recv, self.cfg.qpn);
        self.outbox.push_completion(self.recv_cq_kind(), wc);
    }

    /// Where receive completions go: the receive CQ, or for an XRC target the CQ of the
    /// SRQ the current message's WQE came from.
    fn recv_cq_kind(&self) -> CqKind {
        if self.cfg.is_xrc_target() {
            CqKind::XrcSrq(self.resp.xrc_srqn)
        } else {
            CqKind::Recv
        }
    }
}

/// Checks a send WR for an RC QP; returns its message length.
fn validate_send(wr: &SendWr, cfg: &RcConfig) -> Result<u64, PostError> {
    match wr.opcode {
        SendOpcode::BindMw if wr.bind.is_none() => {
            return Err(PostError::InvalidWr(WrError::MissingBind))
        }
        SendOpcode::LocalInv | SendOpcode::BindMw => return Ok(0),
        // IBA 1.5 defines ATOMIC WRITE for RC (opcode 0x1D); the XRC opcode table has
        // no such row, so an XRC initiator refuses it.
        op @ (SendOpcode::Tso | SendOpcode::Driver1 | SendOpcode::Flush) => {
            return Err(PostError::InvalidWr(WrError::OpcodeNotSupported {
                opcode: op,
                qp_type: crate::qp_state::QpType::Rc,
            }))
        }
        SendOpcode::AtomicWrite => {
            if cfg.transport() != Transport::Rc {
                return Err(PostError::InvalidWr(WrError::OpcodeNotSupported {
                    opcode: SendOpcode::AtomicWrite,
                    qp_type: cfg.qp_type,
                }));
            }
            if cfg.max_rd_atomic == 0 {
                return Err(PostError::InvalidWr(WrError::NoReadAtomicBudget));
            }
            // The 8 bytes may come inline or from SGEs; the VA's alignment is the
            // responder's check (NAK Invalid Request), as for rxe.
            let len = wr.payload.len();
            if len != ATOMIC_WRITE_LEN {
                return Err(PostError::InvalidWr(WrError::AtomicLength { len }));
            }
            return Ok(len);
        }
        op if op.is_read_or_atomic() => {
            if matches!(wr.payload, SendPayload::Inline(_)) {
                return Err(PostError::InvalidWr(WrError::InlineForReadOrAtomic));
            }
            if cfg.max_rd_atomic == 0 {
                return Err(PostError::InvalidWr(WrError::NoReadAtomicBudget));
            }
        }
        _ => {}
    }
    let len = wr.payload.len();
    if len > MAX_MSG_LEN {
        return Err(PostError::InvalidWr(WrError::MessageTooLong { len }));
    }
    if wr.opcode.is_atomic() {
        if len != 8 {
            return Err(PostError::InvalidWr(WrError::AtomicLength { len }));
        }
        if wr.remote_addr % 8 != 0 {
            return Err(PostError::InvalidWr(WrError::AtomicAlignment {
                addr: wr.remote_addr,
            }));
        }
    }
    if wr.opcode == SendOpcode::RdmaRead && cfg.pmtu.packets_for(len) > MAX_READ_PSNS {
        return Err(PostError::InvalidWr(WrError::ReadTooLong));
    }
    Ok(len)
}

impl Engine for RcQp {
    /// Our QP number.
    fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    fn qp_type(&self) -> crate::qp_state::QpType {
        match self.cfg.qp_type {
            t @ (QpType::XrcSend | QpType::XrcRecv) => t,
            _ => QpType::Rc,
        }
    }

    /// The current state.
    fn state(&self) -> QpState {
        self.state
    }

    /// Statistics.
    fn counters(&self) -> RcCounters {
        self.counters.clone()
    }

    /// True when nothing is queued, in flight, or waiting to be sent/acknowledged in either
    /// direction: the send queue is empty, no responder output is pending and no timer
    /// runs. Posted receive WRs, a partially received incoming message (the peer's send
    /// queue is busy then) and completions not yet polled do not count.
    fn is_idle(&self) -> bool {
        self.req.sq.is_empty()
            && self.resp.out.is_empty()
            && self.req.rto_deadline.is_none()
            && self.req.rnr_deadline.is_none()
    }

    /// Earliest deadline the engine wants [`Engine::handle_timeout`] to be called at
    /// (retransmit timer, RNR wait); `None` when no timer runs.
    fn poll_timeout(&self) -> Option<Instant> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        match (self.req.rto_deadline, self.req.rnr_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_packet(
        &mut self,
        now: Instant,
        from: &crate::engine::Arrival,
        pkt: &PacketRepr<'_>,
        env: &mut Env<'_>,
    ) -> Reply {
        if !from.on_path(self.cfg.peer, self.cfg.local) {
            self.counters.packets_received += 1;
            self.counters.dropped_packets += 1;
            self.counters.dropped_bad_address += 1;
            return Reply::Now;
        }
        self.receive(now, pkt, env)
    }

    /// Call when `now >= poll_timeout()`: fires the RNR and retransmit timers that are due.
    fn handle_timeout(&mut self, now: Instant, _env: &mut Env<'_>) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        self.completer_timeout(now);
        self.check_drained();
    }

    /// Queues a send WR. In RTS it is sent in order; in SQD it waits until the QP returns
    /// to RTS; in ERR it is accepted and completed at once with `WR_FLUSH_ERR`.
    ///
    /// Errors: `BadState` in RESET, INIT, RTR, SQE; `QueueFull` when `max_send_wr` WRs are
    /// queued or completed but not yet polled; `InvalidWr` for an opcode an RC QP does not
    /// execute (LOCAL_INV, BIND_MW), a message longer than 2^31 bytes, a READ longer than
    /// 2^22 PSNs, inline data for READ/atomic, an atomic whose local buffer is not 8 bytes
    /// or whose remote address is not 8-byte aligned, an ATOMIC WRITE whose payload is not
    /// 8 bytes or on an XRC QP, READ/atomic/ATOMIC WRITE with `max_rd_atomic == 0`, FLUSH.
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if self.cfg.is_xrc_target() {
            return Err(PostError::InvalidWr(WrError::NoSendQueue));
        }
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err(PostError::BadState(s)),
        }
        let len = validate_send(&wr, &self.cfg)?;
        if self.req.sq.len() + self.outbox.send_cqes() >= self.cfg.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Err {
            let wc = WorkCompletion::new(
                wr.wr_id,
                WcStatus::WrFlushErr,
                wr.opcode.wc_opcode(),
                self.cfg.qpn,
            );
            self.outbox.push_completion(CqKind::Send, wc);
            return Ok(());
        }
        self.req.sq.push_back(SendWqe::new(wr, len, self.cfg.pmtu));
        Ok(())
    }

    /// Whether [`Engine::post_send`] would accept every WR of `wrs` now, in order, with the
    /// same checks; queues nothing. `Err((i, e))`: WR `i` would be refused with `e`.
    fn check_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, PostError)> {
        if self.cfg.is_xrc_target() {
            return Err((0, PostError::InvalidWr(WrError::NoSendQueue)));
        }
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err((0, PostError::BadState(s))),
        }
        for (i, wr) in wrs.iter().enumerate() {
            validate_send(wr, &self.cfg).map_err(|e| (i, e))?;
        }
        let used = self.req.sq.len() + self.outbox.send_cqes();
        let room = (self.cfg.max_send_wr as usize).saturating_sub(used);
        if wrs.len() > room {
            return Err((room, PostError::QueueFull));
        }
        Ok(())
    }

    /// Queues a receive WR. In ERR it is accepted and completed at once with
    /// `WR_FLUSH_ERR`.
    ///
    /// Errors: `BadState` in RESET; `QueueFull` at `max_recv_wr` (counting completions not
    /// yet polled); `InvalidWr` on a QP that takes its receive WQEs from an SRQ.
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        match self.cfg.qp_type {
            QpType::XrcSend => return Err(PostError::InvalidWr(WrError::NoRecvQueue)),
            QpType::XrcRecv => return Err(PostError::InvalidWr(WrError::UsesSrq)),
            _ => {}
        }
        if self.cfg.use_srq {
            return Err(PostError::InvalidWr(WrError::UsesSrq));
        }
        if self.state == QpState::Reset {
            return Err(PostError::BadState(self.state));
        }
        if self.resp.rq.len() + self.outbox.recv_cqes() >= self.cfg.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Err {
            let wc =
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.cfg.qpn);
            self.outbox.push_completion(CqKind::Recv, wc);
            return Ok(());
        }
        self.resp.rq.push_back(wr);
        Ok(())
    }

    /// RTR→RTS with the requester attributes that transition sets (`sq_psn`, `timeout`,
    /// `retry_cnt`, `rnr_retry`, `max_rd_atomic`). From RTR the requester starts afresh at
    /// `sq_psn`; from SQD only the timer and retry attributes change (a new `sq_psn` is
    /// ignored: PSNs are already in use). In any other state nothing happens.
    fn enter_rts(&mut self, rts: RtsAttrs) {
        match self.state {
            QpState::Rtr => {
                self.cfg.sq_psn = rts.sq_psn;
                self.apply_rts_attrs(&rts);
                self.req = Requester::new(&self.cfg);
                self.state = QpState::Rts;
            }
            QpState::Sqd | QpState::Rts => {
                self.apply_rts_attrs(&rts);
                self.state = QpState::Rts;
            }
            _ => {}
        }
    }

    /// Application-driven state change (modify_qp). Transition legality is the caller's
    /// business (see [`crate::qp_state`]); this applies the engine side effects:
    /// * ERR (or SQE, which RC does not use): everything outstanding is flushed with
    ///   `WR_FLUSH_ERR`, send queue in posting order, then the receive queue; an
    ///   SRQ-attached QP raises `LastWqeReached`. Nothing is transmitted any more.
    /// * RESET: queues, timers and PSN state are discarded without completions and
    ///   re-initialised from the configuration (completions already generated stay).
    /// * SQD: no new send WR starts; `SqDrained` is raised once every started WR has
    ///   completed. RTS again resumes.
    /// * INIT, RTR, RTS: the state is set (RTR: the responder runs, the requester does not;
    ///   the first request raises `CommEst`).
    ///
    /// From ERR only RESET leaves (other targets are ignored).
    fn set_state(&mut self, to: QpState) {
        match to {
            QpState::Err | QpState::Sqe => self.enter_err(false),
            QpState::Reset => {
                self.req = Requester::new(&self.cfg);
                self.resp = Responder::new(&self.cfg);
                self.state = QpState::Reset;
                self.drained_notified = false;
                self.comm_est_sent = false;
            }
            _ if self.state == QpState::Err => {}
            QpState::Sqd => {
                self.state = QpState::Sqd;
                self.drained_notified = false;
                self.check_drained();
            }
            other => self.state = other,
        }
    }

    fn reconfigure(&mut self, attrs: &LiveAttrs) {
        self.cfg.access = attrs.access;
        self.cfg.min_rnr_timer = attrs.min_rnr_timer;
        self.cfg.peer = attrs.peer;
        self.cfg.local = attrs.local;
        self.cfg.pkey = attrs.pkey;
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        env: &mut Env<'_>,
        buf: &mut [u8],
    ) -> Option<crate::engine::Transmit> {
        let len = self.emit(now, env, buf)?;
        Some(crate::engine::Transmit {
            len,
            dst: self.cfg.peer,
        })
    }

    /// The next work completion: send completions in send-posting order, receive
    /// completions in receive order.
    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        self.outbox.pop_completion()
    }

    /// The next asynchronous event.
    fn poll_event(&mut self) -> Option<QpEvent> {
        self.outbox.pop_event()
    }
}
