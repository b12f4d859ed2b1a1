//! The responder: the receive pipeline for request packets and the queue of what it
//! answers (IBA Vol 1 §9.7, responder side).
//!
//! Pipeline per request packet: PSN check → opcode sequence → access rights (QP flags,
//! responder resources) → receive WQE (RNR NAK when none) → length checks → R_Key check
//! (through `Memory`) → execute → complete → acknowledge.
//!
//! State: the expected PSN (`epsn`), the MSN, whether a PSN sequence NAK was sent for the
//! current gap, the receive queue, the message in progress (a SEND with its receive WQE and
//! the bytes placed so far, or a WRITE with its RETH and progress), the responder resources
//! (a ring of `max_dest_rd_atomic` remembered READ/atomic requests, for duplicates) and the
//! output queue: ACKs/NAKs (an ACK following an ACK replaces it: coalescing), atomic ACKs
//! and READ response streams, transmitted in order. READ response payload is read from
//! memory when its packet is built.

use std::collections::VecDeque;

use uroce_wire::aeth::{self, NakCode, Syndrome};
use uroce_wire::opcode::{self, OpcodeInfo, Operation, Position};
use uroce_wire::{atomic_ack_eth, bth, PacketRepr, Psn};

use super::{
    Env, QpEvent, RcConfig, RcQp, RemoteAccess, ATOMIC_WRITE_LEN, MAX_MSG_LEN, MAX_READ_PSNS,
};
use crate::build::{build, BuildError};
use crate::memory::{scatter, sg_total, AtomicOp, RemoteAccessError, RemoteOp};
use crate::qp_state::QpState;
use crate::wr::{RecvWr, WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// MSNs are 24 bits.
const MSN_MASK: u32 = 0x00ff_ffff;
/// Output queue room beyond one entry per responder resource.
const OUT_SLACK: usize = 32;

/// One queued responder output.
#[derive(Debug, Clone, Copy)]
pub(super) enum RespOut {
    /// ACKNOWLEDGE: ACK, RNR NAK or NAK.
    Ack {
        /// PSN carried.
        psn: Psn,
        /// MSN carried.
        msn: u32,
        /// Syndrome.
        syndrome: Syndrome,
    },
    /// ATOMIC_ACKNOWLEDGE.
    AtomicAck {
        /// The atomic's PSN.
        psn: Psn,
        /// MSN carried.
        msn: u32,
        /// Original remote value.
        orig: u64,
    },
    /// The packets of one READ response.
    Read(ReadStream),
}

/// A READ response being transmitted.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadStream {
    rkey: u32,
    va: u64,
    len: u64,
    /// PSN of response packet 0.
    psn0: Psn,
    npkts: u32,
    /// Next packet index.
    next: u32,
    msn: u32,
    /// XRC target: the SRQ the request named (its PD governs the memory read).
    srqn: u32,
}

/// A remembered READ/atomic request (responder resource).
#[derive(Debug, Clone, Copy)]
enum Resource {
    Read {
        first: Psn,
        npkts: u32,
        rkey: u32,
        va: u64,
        len: u64,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// A request answered by a zero-length RDMA READ RESPONSE ONLY (IBA 1.5 ATOMIC
    /// WRITE): a duplicate gets that response again, `op` must match.
    Empty {
        psn: Psn,
        msn: u32,
        op: Operation,
    },
}

/// The incoming message in progress.
#[derive(Debug)]
pub(super) enum InMsg {
    /// A SEND: its receive WQE and the bytes placed so far.
    Send { wr: RecvWr, received: u64 },
    /// A WRITE: from its RETH, and the bytes written so far.
    Write {
        rkey: u32,
        va: u64,
        len: u64,
        done: u64,
    },
}

/// Responder state of one QP.
#[derive(Debug)]
pub(super) struct Responder {
    /// Expected PSN.
    pub epsn: Psn,
    /// Message sequence number (24 bits): completed messages.
    pub msn: u32,
    /// A PSN sequence error NAK (or RNR NAK) was sent for the current gap.
    pub sent_psn_nak: bool,
    /// The receive queue.
    pub rq: VecDeque<RecvWr>,
    /// The message in progress.
    pub cur: Option<InMsg>,
    resources: Vec<Option<Resource>>,
    next_resource: usize,
    /// Output, in transmission order.
    pub out: VecDeque<RespOut>,
    out_cap: usize,
    /// In ERR after a responder-detected error: `out` (ending with the NAK) is still sent.
    pub drain_in_err: bool,
    /// XRC target: the SRQ named by the message in progress (or the last one executed);
    /// its receive completions go to that SRQ's CQ.
    pub xrc_srqn: u32,
    /// A request message went ahead of the plain ACK at the head of `out` (see
    /// [`Responder::ack_may_wait`]): the ACK goes when that message's last packet is out.
    pub ack_waited: bool,
}

impl Responder {
    /// Fresh state from the configuration.
    pub fn new(cfg: &RcConfig) -> Responder {
        Responder {
            epsn: cfg.rq_psn,
            xrc_srqn: 0,
            msn: 0,
            sent_psn_nak: false,
            rq: VecDeque::new(),
            cur: None,
            resources: vec![None; usize::from(cfg.max_dest_rd_atomic)],
            next_resource: 0,
            out: VecDeque::new(),
            out_cap: usize::from(cfg.max_dest_rd_atomic) + OUT_SLACK,
            drain_in_err: false,
            ack_waited: false,
        }
    }

    /// Whether the only output is a positive ACK, which lets one request message go first
    /// (`mid_message`: the requester has sent part of a message). In a ping-pong the
    /// application's reply and the ACK of the request it answers leave in the same
    /// transmit batch. Reply first: a busy-polling peer that completes its request when
    /// the ACK arrives and then stops calling in (it spins on memory for the reply's RDMA
    /// WRITE, as `ib_write_lat` does) has the reply already; with the ACK first, a step
    /// that read the ACK alone left the reply unread until the peer's progress thread
    /// came by (hundreds of microseconds). A one-packet reply and the ACK, equal in length
    /// or the ACK shorter, also form one segmentation-offload train: one datagram
    /// through the kernel. The ACK waits for one message at most (whose packets the
    /// requester's window bounds); NAKs and READ and atomic responses never wait. The two
    /// directions of a connection have separate PSN sequences (IBA Vol 1 §9.7), so the
    /// order between a request and an ACK means nothing to the peer.
    pub fn ack_may_wait(&self, mid_message: bool) -> bool {
        (!self.ack_waited || mid_message)
            && self.out.len() == 1
            && matches!(
                self.out.front(),
                Some(RespOut::Ack {
                    syndrome: Syndrome::Ack { .. },
                    ..
                })
            )
    }

    /// Takes the receive WQE of the SEND in progress, if any.
    pub fn take_current_recv(&mut self) -> Option<RecvWr> {
        match self.cur.take() {
            Some(InMsg::Send { wr, .. }) => Some(wr),
            other => {
                self.cur = other;
                None
            }
        }
    }

    fn bump_msn(&mut self) {
        self.msn = self.msn.wrapping_add(1) & MSN_MASK;
    }

    fn remember(&mut self, r: Resource) {
        let n = self.resources.len();
        if let Some(slot) = self.resources.get_mut(self.next_resource) {
            *slot = Some(r);
            self.next_resource = (self.next_resource + 1) % n;
        }
    }

    fn find_read(&self, psn: Psn) -> Option<Resource> {
        self.resources.iter().flatten().copied().find(|r| match *r {
            Resource::Read { first, npkts, .. } => {
                psn.is_at_or_after(first) && psn.is_before(first.wrapping_add(npkts))
            }
            Resource::Atomic { .. } | Resource::Empty { .. } => false,
        })
    }

    /// The MSN of the remembered `op` request (answered by an empty READ response) with
    /// this PSN.
    fn find_empty(&self, psn: Psn, op: Operation) -> Option<u32> {
        self.resources.iter().flatten().find_map(|r| match *r {
            Resource::Empty { psn: p, msn, op: o } if p == psn && o == op => Some(msn),
            _ => None,
        })
    }

    fn find_atomic(&self, psn: Psn) -> Option<(u64, u32)> {
        self.resources.iter().flatten().find_map(|r| match *r {
            Resource::Atomic { psn: p, orig, msn } if p == psn => Some((orig, msn)),
            _ => None,
        })
    }

    /// Does `info` continue the message in progress correctly (or start one when none)?
    fn sequence_ok(&self, info: &OpcodeInfo) -> bool {
        match &self.cur {
            Some(InMsg::Send { .. }) => {
                info.operation == Operation::Send && !info.position.starts()
            }
            Some(InMsg::Write { .. }) => {
                info.operation == Operation::RdmaWrite && !info.position.starts()
            }
            None => info.position.starts(),
        }
    }

    /// Queues an output; ACKs coalesce with an ACK at the back. `force` ignores the cap
    /// (error NAKs). Returns false if the queue was full.
    fn push(&mut self, item: RespOut, force: bool) -> bool {
        if let RespOut::Ack {
            psn,
            msn,
            syndrome: Syndrome::Ack { .. },
        } = item
        {
            if let Some(RespOut::Ack {
                psn: bpsn,
                msn: bmsn,
                syndrome: Syndrome::Ack { .. },
            }) = self.out.back_mut()
            {
                *bpsn = psn;
                *bmsn = msn;
                return true;
            }
        }
        if !force && self.out.len() >= self.out_cap {
            return false;
        }
        self.out.push_back(item);
        true
    }
}

impl RcQp {
    /// Processes a request packet (the caller checked state, QPN and transport).
    pub(super) fn responder_packet(
        &mut self,
        pkt: &PacketRepr<'_>,
        info: &OpcodeInfo,
        env: &mut Env<'_>,
    ) {
        if pkt.present_headers() != info.headers {
            // Only possible for a hand-made repr: parse guarantees the header set.
            self.drop_bad_opcode();
            return;
        }
        let psn = pkt.bth.psn;
        let d = psn.diff(self.resp.epsn);
        // XRC target: the XRCETH (present: the header set matched) names the SRQ.
        let xrc_srqn = match (self.cfg.is_xrc_target(), pkt.xrceth) {
            (true, Some(x)) => Some(x.srqn),
            (true, None) => {
                self.drop_bad_opcode();
                return;
            }
            (false, _) => None,
        };
        if d < 0 {
            if let Some(srqn) = xrc_srqn {
                // A duplicate is only answered for an SRQ of the domain (READ replays read
                // memory under that SRQ's PD); otherwise it is dropped.
                if env.xrc.as_deref_mut().map(|x| x.select(srqn)) != Some(Ok(())) {
                    self.drop_unmatched_duplicate();
                    return;
                }
            }
            self.duplicate_request(pkt, info, env);
            return;
        }
        if d > 0 {
            if self.resp.sent_psn_nak {
                self.counters.dropped_packets += 1;
                self.counters.dropped_out_of_sequence += 1;
            } else {
                self.resp.sent_psn_nak = true;
                let e = self.resp.epsn;
                self.queue_resp(self.nak(e, NakCode::PsnSequenceError), false);
            }
            return;
        }
        self.resp.sent_psn_nak = false;
        if self.state == QpState::Rtr && !self.comm_est_sent {
            self.comm_est_sent = true;
            self.outbox.push_event(QpEvent::CommEst);
        }
        if !self.resp.sequence_ok(info) {
            self.invalid_request(psn, None);
            return;
        }
        if let Some(srqn) = xrc_srqn {
            // Annex A14: an SRQ number that is not an XRC SRQ of the target's domain is an
            // invalid request (NAK, QP → ERR); so is a message whose packets name
            // different SRQs.
            let continues = self.resp.cur.is_some();
            let selected = env.xrc.as_deref_mut().map(|x| x.select(srqn));
            if selected != Some(Ok(())) || (continues && srqn != self.resp.xrc_srqn) {
                self.counters.bad_xrc_srqn += 1;
                self.invalid_request(psn, None);
                return;
            }
            self.resp.xrc_srqn = srqn;
        }
        match info.operation {
            Operation::Send => self.rx_send(pkt, info, env),
            Operation::RdmaWrite => self.rx_write(pkt, info, env),
            Operation::RdmaReadRequest => self.rx_read(pkt, env),
            Operation::CompareSwap | Operation::FetchAdd => self.rx_atomic(pkt, info, env),
            Operation::AtomicWrite => self.rx_atomic_write(pkt, env),
            Operation::Flush => self.rx_flush(psn),
            // Responses, ACKs and CNPs are not requests: `handle_packet` gives them to the
            // completer (or drops them), so they cannot reach this point.
            Operation::RdmaReadResponse
            | Operation::Acknowledge
            | Operation::AtomicAcknowledge
            | Operation::Cnp => self.invalid_request(psn, None),
        }
    }

    /// IBA 1.5 FLUSH (Annex A19), in sequence: uroce does not execute it (the C ABI it
    /// follows has no way to post one or to grant `IBV_ACCESS_FLUSH_*`, and persistence is
    /// impossible on process memory; see docs/SUPPORT.md), so it is an invalid request like
    /// any other operation this responder does not support: NAK Invalid Request with the
    /// FLUSH's PSN (the requester completes it with `REM_INV_REQ_ERR`), `QP_REQ_ERR`, QP →
    /// ERR. Nothing is remembered, so a later duplicate of it matches no responder
    /// resource and is dropped.
    fn rx_flush(&mut self, psn: Psn) {
        self.invalid_request(psn, None);
    }

    fn nak(&self, psn: Psn, code: NakCode) -> RespOut {
        RespOut::Ack {
            psn,
            msn: self.resp.msn,
            syndrome: Syndrome::Nak(code),
        }
    }

    fn queue_resp(&mut self, item: RespOut, force: bool) {
        if !self.resp.push(item, force) {
            self.counters.dropped_responses += 1;
        }
    }

    fn queue_ack(&mut self, psn: Psn) {
        let item = RespOut::Ack {
            psn,
            msn: self.resp.msn,
            syndrome: Syndrome::ACK_NO_CREDIT,
        };
        self.queue_resp(item, false);
    }

    fn take_recv(&mut self, env: &mut Env<'_>) -> Option<RecvWr> {
        if self.cfg.is_xrc_target() {
            env.xrc.as_deref_mut().and_then(|x| x.take())
        } else if self.cfg.use_srq {
            env.srq.as_deref_mut().and_then(|s| s.take())
        } else {
            self.resp.rq.pop_front()
        }
    }

    /// No receive WQE: RNR NAK with our `min_rnr_timer` and this packet's PSN. Later
    /// packets are dropped silently until this one is resent.
    fn rnr_nak(&mut self, psn: Psn) {
        self.resp.sent_psn_nak = true;
        let item = RespOut::Ack {
            psn,
            msn: self.resp.msn,
            syndrome: Syndrome::RnrNak {
                timer: self.cfg.min_rnr_timer & 0x1f,
            },
        };
        self.queue_resp(item, false);
    }

    /// A class A/C error: NAK `code` with `psn`; the receive WQE of the message (`wqe`, or
    /// the one of the SEND in progress) completes with `recv_status`; `event`; QP → ERR.
    fn responder_error(
        &mut self,
        psn: Psn,
        code: NakCode,
        wqe: Option<RecvWr>,
        recv_status: WcStatus,
        event: Option<QpEvent>,
    ) {
        let nak = self.nak(psn, code);
        self.queue_resp(nak, true);
        if let Some(wr) = wqe.or_else(|| self.resp.take_current_recv()) {
            self.complete_recv_error(wr.wr_id, recv_status);
        }
        if let Some(e) = event {
            self.outbox.push_event(e);
        }
        self.enter_err(true);
    }

    fn invalid_request(&mut self, psn: Psn, wqe: Option<RecvWr>) {
        self.responder_error(
            psn,
            NakCode::InvalidRequest,
            wqe,
            WcStatus::RemInvReqErr,
            Some(QpEvent::QpReqErr),
        );
    }

    fn access_error(&mut self, psn: Psn, wqe: Option<RecvWr>) {
        self.responder_error(
            psn,
            NakCode::RemoteAccessError,
            wqe,
            WcStatus::RemAccessErr,
            Some(QpEvent::QpAccessErr),
        );
    }

    fn recv_completion(
        &self,
        wr_id: u64,
        opcode: WcOpcode,
        byte_len: u64,
        pkt: &PacketRepr<'_>,
    ) -> WorkCompletion {
        let (qpn, dest) = (self.cfg.qpn, self.cfg.dest_qpn);
        crate::build::connected_recv_completion(qpn, dest, wr_id, opcode, byte_len, pkt)
    }

    fn rx_send(&mut self, pkt: &PacketRepr<'_>, info: &OpcodeInfo, env: &mut Env<'_>) {
        let psn = pkt.bth.psn;
        let mut taken = None;
        if info.position.starts() {
            match self.take_recv(env) {
                Some(wr) => taken = Some(wr),
                None => {
                    self.rnr_nak(psn);
                    return;
                }
            }
        }
        if pkt.check_pmtu(self.cfg.pmtu).is_err() {
            self.invalid_request(psn, taken);
            return;
        }
        if let Some(wr) = taken {
            self.resp.cur = Some(InMsg::Send { wr, received: 0 });
        }
        let Some(InMsg::Send { wr, received }) = &self.resp.cur else {
            // invariant: sequence_ok() guarantees a SEND in progress here.
            self.invalid_request(psn, None);
            return;
        };
        let offset = *received;
        let len = pkt.payload.len() as u64;
        let end = offset.saturating_add(len);
        if end > MAX_MSG_LEN || end > sg_total(&wr.sg_list) {
            // The message does not fit the receive buffer: local length error here,
            // NAK Invalid Request to the requester.
            self.responder_error(
                psn,
                NakCode::InvalidRequest,
                None,
                WcStatus::LocLenErr,
                Some(QpEvent::QpReqErr),
            );
            return;
        }
        if scatter(env.mem, &wr.sg_list, offset, pkt.payload).is_err() {
            // The receive WQE's own buffers are bad.
            self.responder_error(
                psn,
                NakCode::RemoteOperationalError,
                None,
                WcStatus::LocProtErr,
                None,
            );
            return;
        }
        if let Some(InMsg::Send { received, .. }) = &mut self.resp.cur {
            *received = end;
        }
        self.resp.epsn = psn.wrapping_add(1);
        if info.position.ends() {
            let Some(wr) = self.resp.take_current_recv() else {
                return;
            };
            let mut wc = self.recv_completion(wr.wr_id, WcOpcode::Recv, end, pkt);
            if let Some(ieth) = pkt.ieth {
                if env.mem.invalidate_remote(ieth.rkey).is_err() {
                    self.invalid_request(psn, Some(wr));
                    return;
                }
                wc.wc_flags |= WcFlags::WITH_INV;
                wc.invalidated_rkey = ieth.rkey;
            }
            self.resp.bump_msn();
            self.outbox.push_completion(self.recv_cq_kind(), wc);
        }
        if pkt.bth.ack_req {
            self.queue_ack(psn);
        }
    }

    fn rx_write(&mut self, pkt: &PacketRepr<'_>, info: &OpcodeInfo, env: &mut Env<'_>) {
        let psn = pkt.bth.psn;
        let pmtu = u64::from(self.cfg.pmtu.bytes());
        if !self.cfg.access.contains(RemoteAccess::WRITE) {
            self.invalid_request(psn, None);
            return;
        }
        let mut taken = None;
        if info.consumes_rwqe {
            match self.take_recv(env) {
                Some(wr) => taken = Some(wr),
                None => {
                    self.rnr_nak(psn);
                    return;
                }
            }
        }
        if pkt.check_pmtu(self.cfg.pmtu).is_err() {
            self.invalid_request(psn, taken);
            return;
        }
        if info.position.starts() {
            let Some(reth) = pkt.reth else {
                self.invalid_request(psn, taken);
                return;
            };
            let len = u64::from(reth.dma_len);
            if len > MAX_MSG_LEN {
                self.invalid_request(psn, taken);
                return;
            }
            if env
                .mem
                .check_remote(reth.rkey, reth.va, len, RemoteOp::Write)
                .is_err()
            {
                self.access_error(psn, taken);
                return;
            }
            self.resp.cur = Some(InMsg::Write {
                rkey: reth.rkey,
                va: reth.va,
                len,
                done: 0,
            });
        }
        let Some(InMsg::Write {
            rkey,
            va,
            len,
            done,
        }) = self.resp.cur
        else {
            // invariant: sequence_ok() guarantees a WRITE in progress here.
            self.invalid_request(psn, taken);
            return;
        };
        let resid = len.saturating_sub(done);
        let plen = pkt.payload.len() as u64;
        if plen != resid.min(pmtu) || info.position.ends() != (resid <= pmtu) {
            // Not exactly the bytes the RETH length leaves for this position.
            self.invalid_request(psn, taken);
            return;
        }
        if plen > 0 {
            let ok = va
                .checked_add(done)
                .is_some_and(|at| env.mem.write_remote(rkey, at, pkt.payload).is_ok());
            if !ok {
                self.access_error(psn, taken);
                return;
            }
        }
        if let Some(InMsg::Write { done, .. }) = &mut self.resp.cur {
            *done += plen;
        }
        self.resp.epsn = psn.wrapping_add(1);
        if info.position.ends() {
            self.resp.cur = None;
            self.resp.bump_msn();
            if let Some(wr) = taken {
                // WRITE with immediate: byte_len is the RETH length (docs/INTEROP-NOTES.md §5).
                let wc = self.recv_completion(wr.wr_id, WcOpcode::RecvRdmaWithImm, len, pkt);
                self.outbox.push_completion(self.recv_cq_kind(), wc);
            }
        }
        if pkt.bth.ack_req {
            self.queue_ack(psn);
        }
    }

    fn rx_read(&mut self, pkt: &PacketRepr<'_>, env: &mut Env<'_>) {
        let psn = pkt.bth.psn;
        if !self.cfg.access.contains(RemoteAccess::READ) || self.cfg.max_dest_rd_atomic == 0 {
            self.invalid_request(psn, None);
            return;
        }
        let Some(reth) = pkt.reth else {
            self.invalid_request(psn, None);
            return;
        };
        let len = u64::from(reth.dma_len);
        let npkts = self.cfg.pmtu.packets_for(len);
        if len > MAX_MSG_LEN || npkts > MAX_READ_PSNS {
            self.invalid_request(psn, None);
            return;
        }
        // invariant: npkts ≤ MAX_READ_PSNS = 2^22 fits u32.
        let npkts = u32::try_from(npkts).unwrap_or(1);
        if env
            .mem
            .check_remote(reth.rkey, reth.va, len, RemoteOp::Read)
            .is_err()
        {
            self.access_error(psn, None);
            return;
        }
        // C9-148: the MSN counts the READ when the request is received.
        self.resp.bump_msn();
        let msn = self.resp.msn;
        self.resp.remember(Resource::Read {
            first: psn,
            npkts,
            rkey: reth.rkey,
            va: reth.va,
            len,
            msn,
        });
        let stream = ReadStream {
            rkey: reth.rkey,
            va: reth.va,
            len,
            psn0: psn,
            npkts,
            next: 0,
            msn,
            srqn: self.resp.xrc_srqn,
        };
        self.queue_resp(RespOut::Read(stream), false);
        self.resp.epsn = psn.wrapping_add(npkts);
    }

    fn rx_atomic(&mut self, pkt: &PacketRepr<'_>, info: &OpcodeInfo, env: &mut Env<'_>) {
        let psn = pkt.bth.psn;
        if !self.cfg.access.contains(RemoteAccess::ATOMIC) || self.cfg.max_dest_rd_atomic == 0 {
            self.invalid_request(psn, None);
            return;
        }
        let Some(ae) = pkt.atomic_eth else {
            self.invalid_request(psn, None);
            return;
        };
        if ae.va % 8 != 0 {
            self.invalid_request(psn, None);
            return;
        }
        let op = if info.operation == Operation::CompareSwap {
            AtomicOp::CompareSwap {
                compare: ae.compare,
                swap: ae.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: ae.swap_add }
        };
        let orig = match env.mem.atomic_remote(ae.rkey, ae.va, op) {
            Ok(v) => v,
            Err(RemoteAccessError::Misaligned { .. }) => {
                self.invalid_request(psn, None);
                return;
            }
            Err(_) => {
                self.access_error(psn, None);
                return;
            }
        };
        self.resp.bump_msn();
        let msn = self.resp.msn;
        self.resp.remember(Resource::Atomic { psn, orig, msn });
        self.queue_resp(RespOut::AtomicAck { psn, msn, orig }, false);
        self.resp.epsn = psn.wrapping_add(1);
    }

    /// IBA 1.5 ATOMIC WRITE: the QP needs REMOTE_WRITE and a responder resource (else
    /// NAK Invalid Request, as for READ/atomics); the RETH's DMA length must be 8 and the
    /// VA 8-byte aligned (else NAK Invalid Request); the region must grant REMOTE_WRITE
    /// over `[VA, VA + 8)` (else NAK Remote Access Error, memory untouched). The 8 payload
    /// bytes are stored as one 64-bit atomic store (`Memory::atomic_write_remote`); the
    /// answer is a zero-length RDMA READ RESPONSE ONLY (as rxe answers it), remembered as
    /// a responder resource so that a duplicate gets the same answer without a second
    /// store.
    fn rx_atomic_write(&mut self, pkt: &PacketRepr<'_>, env: &mut Env<'_>) {
        let psn = pkt.bth.psn;
        if !self.cfg.access.contains(RemoteAccess::WRITE) || self.cfg.max_dest_rd_atomic == 0 {
            self.invalid_request(psn, None);
            return;
        }
        let Some(reth) = pkt.reth else {
            self.invalid_request(psn, None);
            return;
        };
        // The wire layer guarantees exactly 8 payload bytes (`exact_payload`).
        let Ok(value) = <[u8; 8]>::try_from(pkt.payload) else {
            self.invalid_request(psn, None);
            return;
        };
        if u64::from(reth.dma_len) != ATOMIC_WRITE_LEN || reth.va % 8 != 0 {
            self.invalid_request(psn, None);
            return;
        }
        match env.mem.atomic_write_remote(reth.rkey, reth.va, value) {
            Ok(()) => {}
            Err(RemoteAccessError::Misaligned { .. }) => {
                self.invalid_request(psn, None);
                return;
            }
            Err(_) => {
                self.access_error(psn, None);
                return;
            }
        }
        self.resp.bump_msn();
        let msn = self.resp.msn;
        self.resp.remember(Resource::Empty {
            psn,
            msn,
            op: Operation::AtomicWrite,
        });
        let answer = self.empty_read_response(psn, msn);
        self.queue_resp(answer, false);
        self.resp.epsn = psn.wrapping_add(1);
    }

    /// A zero-length RDMA READ RESPONSE ONLY with `psn` and `msn` (the answer to an
    /// ATOMIC WRITE): a READ response stream of one empty packet.
    fn empty_read_response(&self, psn: Psn, msn: u32) -> RespOut {
        RespOut::Read(ReadStream {
            rkey: 0,
            va: 0,
            len: 0,
            psn0: psn,
            npkts: 1,
            next: 0,
            msn,
            srqn: self.resp.xrc_srqn,
        })
    }

    /// A request with a PSN before the expected one: never executed again.
    fn duplicate_request(&mut self, pkt: &PacketRepr<'_>, info: &OpcodeInfo, env: &mut Env<'_>) {
        self.counters.duplicates_received += 1;
        let psn = pkt.bth.psn;
        match info.operation {
            Operation::Send | Operation::RdmaWrite => {
                // Re-acknowledge everything processed so far.
                let last = self.resp.epsn.wrapping_sub(1);
                self.queue_ack(last);
            }
            Operation::RdmaReadRequest => {
                let replay = pkt.reth.and_then(|reth| {
                    let Resource::Read {
                        first,
                        npkts,
                        rkey,
                        va,
                        len,
                        msn,
                    } = self.resp.find_read(psn)?
                    else {
                        return None;
                    };
                    let dlen = u64::from(reth.dma_len);
                    let dpkts = self.cfg.pmtu.packets_for(dlen);
                    let into = u64::try_from(psn.diff(first)).ok()?;
                    let subrange = reth.rkey == rkey
                        && reth.va >= va
                        && reth.va.checked_add(dlen)? <= va.checked_add(len)?
                        && into + dpkts <= u64::from(npkts);
                    let still_ok = env
                        .mem
                        .check_remote(reth.rkey, reth.va, dlen, RemoteOp::Read)
                        .is_ok();
                    (subrange && still_ok).then(|| ReadStream {
                        rkey,
                        va: reth.va,
                        len: dlen,
                        psn0: psn,
                        // invariant: dpkts ≤ npkts (checked just above).
                        npkts: u32::try_from(dpkts).unwrap_or(1),
                        next: 0,
                        msn,
                        srqn: pkt.xrceth.map_or(0, |x| x.srqn),
                    })
                });
                match replay {
                    Some(s) => self.queue_resp(RespOut::Read(s), false),
                    None => self.drop_unmatched_duplicate(),
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => match self.resp.find_atomic(psn) {
                // Resend the stored result: an atomic is never executed twice.
                Some((orig, msn)) => self.queue_resp(RespOut::AtomicAck { psn, msn, orig }, false),
                None => self.drop_unmatched_duplicate(),
            },
            Operation::AtomicWrite => match self.resp.find_empty(psn, info.operation) {
                // Answer again; the 8 bytes are not stored a second time.
                Some(msn) => {
                    let answer = self.empty_read_response(psn, msn);
                    self.queue_resp(answer, false);
                }
                None => self.drop_unmatched_duplicate(),
            },
            // A FLUSH is never executed nor remembered (`rx_flush`): no answer to repeat.
            Operation::Flush => self.drop_unmatched_duplicate(),
            Operation::RdmaReadResponse
            | Operation::Acknowledge
            | Operation::AtomicAcknowledge
            | Operation::Cnp => self.drop_unmatched_duplicate(),
        }
    }

    fn drop_unmatched_duplicate(&mut self) {
        self.counters.dropped_packets += 1;
        self.counters.dropped_unmatched_duplicates += 1;
    }

    /// Builds the next responder packet into `buf`.
    pub(super) fn responder_poll(&mut self, env: &mut Env<'_>, buf: &mut [u8]) -> Option<usize> {
        // Two rounds at most: a READ response that fails to read memory is replaced by a
        // NAK, which is then sent.
        for _ in 0..2 {
            let item = *self.resp.out.front()?;
            let mut bth = bth::Repr {
                opcode: self.cfg.wire_opcode(opcode::op::RC_ACKNOWLEDGE),
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: self.cfg.pkey,
                fecn: false,
                becn: false,
                dest_qp: self.cfg.dest_qpn,
                ack_req: false,
                psn: Psn::ZERO,
            };
            match item {
                RespOut::Ack { psn, msn, syndrome } => {
                    bth.psn = psn;
                    let hdr = PacketRepr {
                        aeth: Some(aeth::Repr { syndrome, msn }),
                        ..PacketRepr::new(bth, &[])
                    };
                    let n = build(buf, &hdr, 0, |_| Ok::<(), ()>(())).ok()?;
                    self.resp.out.pop_front();
                    match syndrome {
                        Syndrome::Ack { .. } => self.counters.acks_sent += 1,
                        Syndrome::RnrNak { .. } => self.counters.rnr_naks_sent += 1,
                        Syndrome::Nak(NakCode::PsnSequenceError) => {
                            self.counters.seq_naks_sent += 1
                        }
                        Syndrome::Nak(_) => self.counters.error_naks_sent += 1,
                    }
                    return Some(n);
                }
                RespOut::AtomicAck { psn, msn, orig } => {
                    bth.opcode = self.cfg.wire_opcode(opcode::op::RC_ATOMIC_ACKNOWLEDGE);
                    bth.psn = psn;
                    let hdr = PacketRepr {
                        aeth: Some(aeth::Repr {
                            syndrome: Syndrome::ACK_NO_CREDIT,
                            msn,
                        }),
                        atomic_ack_eth: Some(atomic_ack_eth::Repr { orig }),
                        ..PacketRepr::new(bth, &[])
                    };
                    let n = build(buf, &hdr, 0, |_| Ok::<(), ()>(())).ok()?;
                    self.resp.out.pop_front();
                    self.counters.atomic_acks_sent += 1;
                    return Some(n);
                }
                RespOut::Read(s) => {
                    let pmtu = u64::from(self.cfg.pmtu.bytes());
                    let k = s.next;
                    let offset = u64::from(k) * pmtu;
                    // invariant: ≤ PMTU ≤ 4096.
                    let len = usize::try_from(s.len.saturating_sub(offset).min(pmtu)).unwrap_or(0);
                    let position = Position::from_flags(k == 0, k.saturating_add(1) >= s.npkts);
                    bth.opcode = opcode::opcode_for(
                        self.cfg.transport(),
                        Operation::RdmaReadResponse,
                        position,
                        false,
                        false,
                    )?;
                    bth.psn = s.psn0.wrapping_add(k);
                    let mut hdr = PacketRepr::new(bth, &[]);
                    if position != Position::Middle {
                        hdr.aeth = Some(aeth::Repr {
                            syndrome: Syndrome::ACK_NO_CREDIT,
                            msn: s.msn,
                        });
                    }
                    // XRC target: the read runs under the PD of the SRQ the request named.
                    let selected = !self.cfg.is_xrc_target()
                        || env.xrc.as_deref_mut().map(|x| x.select(s.srqn)) == Some(Ok(()));
                    let mem = env.mem;
                    let built = build(buf, &hdr, len, |dst| {
                        if !selected {
                            return Err(RemoteAccessError::BadKey { rkey: s.rkey });
                        }
                        if dst.is_empty() {
                            return Ok(());
                        }
                        let at =
                            s.va.checked_add(offset)
                                .ok_or(RemoteAccessError::OutOfBounds {
                                    rkey: s.rkey,
                                    va: s.va,
                                    len: s.len,
                                })?;
                        mem.read_remote(s.rkey, at, dst)
                    });
                    match built {
                        Ok(n) => {
                            if let Some(RespOut::Read(f)) = self.resp.out.front_mut() {
                                f.next += 1;
                                if f.next >= f.npkts {
                                    self.resp.out.pop_front();
                                }
                            }
                            self.counters.read_responses_sent += 1;
                            return Some(n);
                        }
                        Err(BuildError::Buffer) => return None,
                        Err(BuildError::Fill(_)) => {
                            // The region went away since the request was checked: NAK
                            // Remote Access Error at this PSN instead; QP → ERR.
                            let nak = self.nak(bth.psn, NakCode::RemoteAccessError);
                            self.resp.out.clear();
                            self.resp.out.push_back(nak);
                            self.outbox.push_event(QpEvent::QpAccessErr);
                            self.enter_err(true);
                            self.resp.drain_in_err = true;
                        }
                    }
                }
            }
        }
        None
    }
}
