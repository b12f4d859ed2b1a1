//! # The UC transport engine: one unreliable-connected queue pair as a sans-IO state machine
//!
//! [`UcQp`] implements the IBA unreliable-connected transport (IBA vol. 1, 9.8.2) for one
//! QP, behind the same [`Engine`] interface as RC. It shares RC's request segmentation
//! and packet building (the crate-private `build` module: FIRST/MIDDLE/LAST/ONLY by path
//! MTU, RETH on the first packet of a WRITE, ImmDt on the last, payload gathered straight
//! from the WR's SGEs) and RC's memory access ([`crate::memory`]: gather, scatter, R_Key
//! checks through [`crate::memory::Memory`]).
//!
//! ## Requester
//! SEND, SEND with immediate, RDMA WRITE and RDMA WRITE with immediate. UC has no READ, no
//! atomics, and no wire opcode for SEND with invalidate (IBA 9.2, the BTH opcode table: the
//! `SEND_*_WITH_INVALIDATE` opcodes exist for RC and XRC only), so those are refused at
//! post time with [`WrError::OpcodeNotSupported`]. The local operations BIND_MW (type 2
//! memory windows, which the responder's R_Key checks through [`crate::memory::Memory`]
//! honour as on RC) and LOCAL_INV run when they reach the head of the send queue, take no
//! PSN and complete at once; a refused one completes with MW_BIND_ERR / LOC_QP_OP_ERR and
//! moves the QP to SQE. PSNs are consecutive per packet; AckReq
//! is never set; nothing is acknowledged, retransmitted or timed (no timers at all). A
//! send WR completes (if signalled) as soon as its last packet has been emitted by
//! [`Engine::poll_transmit`].
//!
//! A send WR whose local SGEs cannot be read completes with `LOC_PROT_ERR` and moves the
//! QP to **SQE** (IBA 10.3.1: UC and UD QPs have the Send Queue Error state): the rest of
//! the send queue and every send WR posted later are flushed with `WR_FLUSH_ERR`, the
//! receive side keeps working; modify to RTS resumes sending.
//!
//! ## Responder (IBA 9.7.5 / 9.8.2; what rxe does, see the deviations below)
//! * **PSN.** A packet with the expected PSN continues the message in progress. A packet
//!   *ahead* of it (a gap: something was lost) discards the message in progress; if the
//!   packet is a FIRST or ONLY it starts a new message and resynchronises the expected
//!   PSN, otherwise it and every following packet are dropped until the next FIRST/ONLY.
//!   A packet *behind* the expected PSN (in the half of the 24-bit space that RC calls
//!   duplicates) is a duplicate or stale packet and is dropped without touching the
//!   message in progress: a duplicated or late FIRST/ONLY never delivers a message twice
//!   or out of order.
//! * **Opcode sequence.** Inside a SEND only SEND_MIDDLE/LAST may follow, inside a WRITE
//!   only WRITE_MIDDLE/LAST; a FIRST/ONLY inside a message discards the partial message
//!   and starts the new one; a MIDDLE/LAST without its FIRST discards and drops until the
//!   next FIRST/ONLY.
//! * **Receive WQE.** A SEND takes one at its FIRST/ONLY packet, a WRITE with immediate at
//!   its last packet. None available: the message is dropped (UC has no RNR NAK). A SEND
//!   that is discarded part-way does **not** consume its receive WQE: the WQE goes back to
//!   the head of the receive queue (with an SRQ it is kept by the QP) and receives the
//!   next SEND, which overwrites the partial data.
//! * **Errors are class D: silent drops, no state change** (IBA 9.9.3 responder error
//!   behaviour for UC). A WRITE to a QP without remote WRITE access, an R_Key, bounds or
//!   permission violation, packet lengths that break the PMTU segmentation rules or the
//!   RETH length, a SEND longer than its receive WQE: the message is discarded (its
//!   receive WQE reused as above), the QP stays where it is, nothing is reported to
//!   either side. Bytes of a discarded RDMA WRITE already placed stay placed (IBA: the
//!   target buffer's contents are undefined then).
//! * A receive WQE whose own SGEs cannot be written (bad lkey) is a local error: it
//!   completes with `LOC_PROT_ERR` and the QP goes to ERR, as on RC.
//!
//! ## Where we deviate from rxe
//! * A FIRST/ONLY behind the expected PSN is dropped as a duplicate; rxe accepts any
//!   FIRST/ONLY after a gap or a duplicate, so a duplicated SEND_ONLY is delivered twice.
//! * After a MIDDLE is lost, the next message is received: rxe also drops the FIRST packet
//!   that follows a discarded SEND (its opcode-sequence check still sees the old message)
//!   and so loses two messages.
//! * With an SRQ, rxe completes the receive WQE of a discarded message with an error
//!   status; here it is kept and reused, as without SRQ.
//! * A local send error moves the QP to SQE; rxe moves it to ERR.
//! * Receive completions do not carry the `GRH` flag (as on RC).

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::IpAddr;

use uroce_wire::opcode::{self, OpcodeInfo, Operation, Transport};
use uroce_wire::{PacketRepr, Pmtu, Psn};

use crate::build::{build, data_packet, fill_payload, pkey_match, BuildError};
use crate::engine::{Arrival, Engine, EngineCounters, LiveAttrs, Transmit};
use crate::engine::{
    CqKind, Env, Outbox, PostError, QpEvent, RemoteAccess, Reply, RtsAttrs, MAX_MSG_LEN,
};
use crate::memory::{scatter, sg_total, RemoteOp};
use crate::qp_state::{QpState, QpType};
use crate::time::Instant;
use crate::wr::{RecvWr, SendOpcode, SendWr, WcOpcode, WcStatus, WorkCompletion, WrError};

/// The attributes of a UC QP the engine uses.
#[derive(Debug, Clone)]
pub struct UcConfig {
    /// Our QP number (24 bits).
    pub qpn: u32,
    /// The connected peer's QP number (24 bits): DestQP of everything we send.
    pub dest_qpn: u32,
    /// The peer's IP address (from the address vector): where every packet goes, and
    /// where every packet the QP accepts must come from.
    pub peer: IpAddr,
    /// Our own address on the QP's path (its source GID), when known: every packet the QP
    /// accepts must be addressed to it. `None`: not checked.
    pub local: Option<IpAddr>,
    /// Path MTU: payload bytes per packet.
    pub pmtu: Pmtu,
    /// First PSN the requester uses.
    pub sq_psn: Psn,
    /// First PSN the responder expects.
    pub rq_psn: Psn,
    /// What remote peers may do on this QP (only WRITE matters on UC).
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
}

impl UcConfig {
    /// Defaults: PMTU 1024, PSNs 0, remote WRITE allowed, selective signalling, 1024 WRs
    /// per queue, no SRQ, P_Key 0xFFFF, local address unchecked.
    pub fn new(qpn: u32, dest_qpn: u32, peer: IpAddr) -> UcConfig {
        UcConfig {
            qpn,
            dest_qpn,
            peer,
            local: None,
            pmtu: Pmtu::Mtu1024,
            sq_psn: Psn::ZERO,
            rq_psn: Psn::ZERO,
            access: RemoteAccess::WRITE,
            sq_sig_all: false,
            max_send_wr: 1024,
            max_recv_wr: 1024,
            use_srq: false,
            pkey: 0xffff,
        }
    }
}

/// One send WR in the send queue.
#[derive(Debug)]
struct SendWqe {
    wr: SendWr,
    /// Message length (≤ 2^31).
    len: u64,
    /// Packets (= PSNs) of the message (≥ 1).
    npkts: u32,
    /// Packets already emitted.
    next_pkt: u32,
    /// PSN of packet 0 (valid once `next_pkt > 0`).
    first_psn: Psn,
}

/// The incoming message in progress.
#[derive(Debug)]
enum InMsg {
    /// A SEND: its receive WQE and the bytes placed so far.
    Send { wr: RecvWr, received: u64 },
    /// An RDMA WRITE: from its RETH, and the bytes written so far.
    Write {
        rkey: u32,
        va: u64,
        len: u64,
        done: u64,
    },
}

/// Why the responder drops a packet (and the message it belongs to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drop {
    /// PSN gap, opcode out of sequence, or the rest of a discarded message.
    Sequence,
    /// No receive WQE.
    NoRecvWqe,
    /// WRITE access, R_Key, bounds, permissions.
    Access,
    /// Length rules.
    Length,
}

/// One UC queue pair.
///
/// Method groups, after quinn's sans-IO contract (see [`crate::engine`]): getters;
/// inputs (`handle_packet`; `handle_timeout` does nothing: UC has no timers); commands
/// (`post_send`, `post_recv`, `enter_rts`, `set_state`); outputs (`poll_transmit`,
/// `poll_completion`, `poll_event`).
#[derive(Debug)]
pub struct UcQp {
    cfg: UcConfig,
    state: QpState,
    /// Send WQEs not yet completed, in posting order; only the head is ever in progress.
    sq: VecDeque<SendWqe>,
    /// PSN of the next request packet.
    next_psn: Psn,
    /// Expected PSN: one past the last packet at or ahead of the previous expected PSN.
    epsn: Psn,
    /// The receive queue (unused with an SRQ).
    rq: VecDeque<RecvWr>,
    /// With an SRQ: a receive WQE taken from it by a message that was then discarded,
    /// used by the next message before the SRQ.
    spare: Option<RecvWr>,
    /// The message in progress.
    cur: Option<InMsg>,
    /// Dropping packets until the next FIRST/ONLY.
    drop_msg: bool,
    outbox: Outbox,
    counters: EngineCounters,
    drained_notified: bool,
    comm_est_sent: bool,
}

impl UcQp {
    /// A QP in RTS with `cfg`: both sides active, queues empty.
    pub fn new(mut cfg: UcConfig) -> UcQp {
        cfg.qpn &= 0x00ff_ffff;
        cfg.dest_qpn &= 0x00ff_ffff;
        UcQp {
            next_psn: cfg.sq_psn,
            epsn: cfg.rq_psn,
            cfg,
            state: QpState::Rts,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            spare: None,
            cur: None,
            drop_msg: false,
            outbox: Outbox::default(),
            counters: EngineCounters::default(),
            drained_notified: false,
            comm_est_sent: false,
        }
    }

    /// Starts the engine in RTR: the responder accepts packets, the requester sends
    /// nothing until [`Engine::enter_rts`] (the verbs layer builds the engine at the
    /// INIT→RTR transition).
    pub fn new_rtr(cfg: UcConfig) -> UcQp {
        let mut qp = UcQp::new(cfg);
        qp.state = QpState::Rtr;
        qp
    }

    /// The configuration.
    pub fn config(&self) -> &UcConfig {
        &self.cfg
    }

    /// Emits the next packet of the send queue's head WR into `buf` (at least 4096 + 64
    /// bytes) and returns its length; `None` when nothing is ready. The WR completes when
    /// its last packet is emitted.
    fn emit(&mut self, env: &mut Env<'_>, buf: &mut [u8]) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        self.run_local_ops(env);
        let w = self.sq.front()?;
        if w.next_pkt == 0 && self.state == QpState::Sqd {
            return None;
        }
        let first_psn = if w.next_pkt == 0 {
            self.next_psn
        } else {
            w.first_psn
        };
        let p = data_packet(
            Transport::Uc,
            self.cfg.pmtu,
            self.cfg.pkey,
            self.cfg.dest_qpn,
            &w.wr,
            w.len,
            w.npkts,
            w.next_pkt,
            first_psn,
        )?;
        let n = match build(buf, &p.hdr, p.len, |dst| {
            fill_payload(env.mem, &w.wr.payload, p.offset, dst)
        }) {
            Ok(n) => n,
            Err(BuildError::Buffer) => return None,
            Err(BuildError::Fill(_)) => {
                // The requester cannot read its own SGEs: LOC_PROT_ERR, QP → SQE.
                self.enter_sqe(Some(WcStatus::LocProtErr));
                return None;
            }
        };
        let w = self.sq.front_mut()?;
        w.first_psn = first_psn;
        w.next_pkt += 1;
        let done = w.next_pkt >= w.npkts;
        self.next_psn = p.hdr.bth.psn.wrapping_add(1);
        self.counters.packets_sent += 1;
        if done {
            self.complete_send_head(WcStatus::Success);
            self.check_drained();
        }
        Some(n)
    }

    /// A packet addressed to this QP, parsed and ICRC-checked by the caller. Accepted in
    /// RTR, RTS, SQD and SQE; everything else (another DestQP, a P_Key mismatch, an opcode
    /// that is not UC, another state) is dropped and counted.
    fn receive(&mut self, pkt: &PacketRepr<'_>, env: &mut Env<'_>) {
        self.counters.packets_received += 1;
        if pkt.bth.dest_qp == self.cfg.qpn && !pkey_match(pkt.bth.pkey, self.cfg.pkey) {
            self.counters.dropped_packets += 1;
            self.counters.dropped_bad_pkey += 1;
            return;
        }
        if pkt.bth.dest_qp != self.cfg.qpn
            || !matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
        {
            self.count_drop_wrong_state();
            return;
        }
        let Some(info) = opcode::info(pkt.bth.opcode)
            .filter(|i| i.transport == Transport::Uc && pkt.present_headers() == i.headers)
        else {
            self.counters.dropped_packets += 1;
            self.counters.dropped_bad_opcode += 1;
            return;
        };
        if self.state == QpState::Rtr && !self.comm_est_sent {
            self.comm_est_sent = true;
            self.outbox.push_event(QpEvent::CommEst);
        }
        let psn = pkt.bth.psn;
        let d = psn.diff(self.epsn);
        if d < 0 {
            self.counters.duplicates_received += 1;
            self.counters.dropped_packets += 1;
            self.counters.dropped_duplicates += 1;
            return;
        }
        self.epsn = psn.wrapping_add(1);
        let starts = info.position.starts();
        if d > 0 {
            // A gap: the message in progress lost packets.
            if self.cur.is_some() {
                self.discard_message();
            } else if !starts && !self.drop_msg {
                // The FIRST of this message was lost.
                self.counters.messages_dropped += 1;
            }
            if !starts {
                self.drop_msg = true;
                self.count_drop(Drop::Sequence);
                return;
            }
        }
        if starts {
            self.drop_msg = false;
            if self.cur.is_some() {
                // A new message inside one: the partial one is lost.
                self.discard_message();
            }
        } else {
            let continues = match &self.cur {
                Some(InMsg::Send { .. }) => info.operation == Operation::Send,
                Some(InMsg::Write { .. }) => info.operation == Operation::RdmaWrite,
                None => false,
            };
            if self.drop_msg || !continues {
                if !self.drop_msg {
                    if self.cur.is_some() {
                        self.discard_message();
                    } else {
                        self.counters.messages_dropped += 1;
                    }
                    self.drop_msg = true;
                }
                self.count_drop(Drop::Sequence);
                return;
            }
        }
        let result = match info.operation {
            Operation::Send => self.rx_send(pkt, info, env),
            Operation::RdmaWrite => self.rx_write(pkt, info, env),
            // Not reachable: the UC opcode table has SENDs and WRITEs only.
            _ => Err(Drop::Sequence),
        };
        if let Err(cause) = result {
            self.count_drop(cause);
            if self.state == QpState::Err {
                return;
            }
            if self.cur.is_some() {
                self.discard_message();
            } else {
                self.counters.messages_dropped += 1;
            }
            self.drop_msg = !info.position.ends();
        }
    }

    /// Places one SEND packet (sequence already checked).
    fn rx_send(
        &mut self,
        pkt: &PacketRepr<'_>,
        info: &OpcodeInfo,
        env: &mut Env<'_>,
    ) -> Result<(), Drop> {
        if pkt.check_pmtu(self.cfg.pmtu).is_err() {
            return Err(Drop::Length);
        }
        if info.position.starts() {
            let wr = self.take_recv(env).ok_or(Drop::NoRecvWqe)?;
            self.cur = Some(InMsg::Send { wr, received: 0 });
        }
        let Some(InMsg::Send { wr, received }) = &mut self.cur else {
            return Err(Drop::Sequence);
        };
        let offset = *received;
        let end = offset.saturating_add(pkt.payload.len() as u64);
        if end > MAX_MSG_LEN || end > sg_total(&wr.sg_list) {
            return Err(Drop::Length);
        }
        if scatter(env.mem, &wr.sg_list, offset, pkt.payload).is_err() {
            // The receive WQE's own buffers are bad: a local error, as on RC.
            let wr_id = wr.wr_id;
            self.cur = None;
            let wc = WorkCompletion::new(wr_id, WcStatus::LocProtErr, WcOpcode::Recv, self.cfg.qpn);
            self.outbox.push_completion(CqKind::Recv, wc);
            self.enter_err();
            return Ok(());
        }
        *received = end;
        if info.position.ends() {
            if let Some(InMsg::Send { wr, received }) = self.cur.take() {
                let wc = self.recv_completion(wr.wr_id, WcOpcode::Recv, received, pkt);
                self.outbox.push_completion(CqKind::Recv, wc);
            }
        }
        Ok(())
    }

    /// Places one RDMA WRITE packet (sequence already checked).
    fn rx_write(
        &mut self,
        pkt: &PacketRepr<'_>,
        info: &OpcodeInfo,
        env: &mut Env<'_>,
    ) -> Result<(), Drop> {
        if !self.cfg.access.contains(RemoteAccess::WRITE) {
            return Err(Drop::Access);
        }
        if pkt.check_pmtu(self.cfg.pmtu).is_err() {
            return Err(Drop::Length);
        }
        if info.position.starts() {
            let reth = pkt.reth.ok_or(Drop::Length)?;
            let len = u64::from(reth.dma_len);
            if len > MAX_MSG_LEN {
                return Err(Drop::Length);
            }
            if env
                .mem
                .check_remote(reth.rkey, reth.va, len, RemoteOp::Write)
                .is_err()
            {
                return Err(Drop::Access);
            }
            self.cur = Some(InMsg::Write {
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
        }) = self.cur
        else {
            return Err(Drop::Sequence);
        };
        let pmtu = u64::from(self.cfg.pmtu.bytes());
        let resid = len.saturating_sub(done);
        let plen = pkt.payload.len() as u64;
        if plen != resid.min(pmtu) || info.position.ends() != (resid <= pmtu) {
            // Not exactly the bytes the RETH length leaves for this position.
            return Err(Drop::Length);
        }
        if plen > 0 {
            let ok = va
                .checked_add(done)
                .is_some_and(|at| env.mem.write_remote(rkey, at, pkt.payload).is_ok());
            if !ok {
                return Err(Drop::Access);
            }
        }
        if let Some(InMsg::Write { done, .. }) = &mut self.cur {
            *done += plen;
        }
        if info.position.ends() {
            self.cur = None;
            if info.consumes_rwqe {
                // WRITE with immediate: the data is placed; without a receive WQE the
                // message is not reported.
                let wr = self.take_recv(env).ok_or(Drop::NoRecvWqe)?;
                let wc = self.recv_completion(wr.wr_id, WcOpcode::RecvRdmaWithImm, len, pkt);
                self.outbox.push_completion(CqKind::Recv, wc);
            }
        }
        Ok(())
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

    fn take_recv(&mut self, env: &mut Env<'_>) -> Option<RecvWr> {
        if self.cfg.use_srq {
            self.spare
                .take()
                .or_else(|| env.srq.as_deref_mut().and_then(|s| s.take()))
        } else {
            self.rq.pop_front()
        }
    }

    /// Discards the message in progress: a SEND's receive WQE is not consumed, it goes
    /// back to the head of the receive queue (or is kept, with an SRQ).
    fn discard_message(&mut self) {
        if let Some(InMsg::Send { wr, .. }) = self.cur.take() {
            if self.cfg.use_srq {
                self.spare = Some(wr);
            } else {
                self.rq.push_front(wr);
            }
        }
        self.counters.messages_dropped += 1;
    }

    fn count_drop(&mut self, cause: Drop) {
        self.counters.dropped_packets += 1;
        match cause {
            Drop::Sequence => self.counters.dropped_uc_sequence += 1,
            Drop::NoRecvWqe => self.counters.dropped_no_recv_wqe += 1,
            Drop::Access => self.counters.dropped_remote_access += 1,
            Drop::Length => self.counters.dropped_length += 1,
        }
    }

    fn count_drop_wrong_state(&mut self) {
        self.counters.dropped_packets += 1;
        self.counters.dropped_wrong_state += 1;
    }

    /// Pops the send queue's head and reports it if it is signalled or failed.
    fn complete_send_head(&mut self, status: WcStatus) {
        let Some(w) = self.sq.pop_front() else {
            return;
        };
        let qpn = self.cfg.qpn;
        if let Some(wc) =
            crate::build::send_completion(self.cfg.sq_sig_all, qpn, &w.wr, w.len, status)
        {
            self.outbox.push_completion(CqKind::Send, wc);
        }
    }

    /// Send queue error: the head WR completes with `head_status` (if given), the rest of
    /// the send queue is flushed; the receive side is untouched.
    fn enter_sqe(&mut self, head_status: Option<WcStatus>) {
        if matches!(self.state, QpState::Err | QpState::Reset) {
            return;
        }
        self.state = QpState::Sqe;
        if let Some(status) = head_status {
            self.complete_send_head(status);
        }
        while !self.sq.is_empty() {
            self.complete_send_head(WcStatus::WrFlushErr);
        }
    }

    /// ERR: flushes the send queue in posting order, then the receive WQE held by the
    /// message in progress (or kept from the SRQ), then the receive queue.
    fn enter_err(&mut self) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        while !self.sq.is_empty() {
            self.complete_send_head(WcStatus::WrFlushErr);
        }
        let held = match self.cur.take() {
            Some(InMsg::Send { wr, .. }) => Some(wr),
            _ => None,
        };
        let mut flushed: Vec<RecvWr> = held.into_iter().chain(self.spare.take()).collect();
        flushed.extend(self.rq.drain(..));
        for wr in flushed {
            let wc =
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.cfg.qpn);
            self.outbox.push_completion(CqKind::Recv, wc);
        }
        self.drop_msg = false;
        if self.cfg.use_srq {
            self.outbox.push_event(QpEvent::LastWqeReached);
        }
    }

    /// Executes the local operations (BIND_MW, LOCAL_INV) at the head of the send queue,
    /// in send-queue order (every earlier WR has been sent whole): through `Memory`, no
    /// PSN, completed at once. A refused one completes with MW_BIND_ERR / LOC_QP_OP_ERR
    /// and moves the QP to SQE, like any local send error of UC. Not in SQD (nothing new
    /// starts there).
    fn run_local_ops(&mut self, env: &mut Env<'_>) {
        for _ in 0..self.sq.len() {
            if self.state != QpState::Rts {
                return;
            }
            let Some(w) = self.sq.front() else {
                return;
            };
            let (result, status) = match (w.wr.opcode, w.wr.bind) {
                (SendOpcode::BindMw, Some(b)) => (env.mem.bind_window(&b), WcStatus::MwBindErr),
                (SendOpcode::BindMw, None) => (
                    Err(crate::memory::MwError::NotSupported),
                    WcStatus::MwBindErr,
                ),
                (SendOpcode::LocalInv, _) => (
                    env.mem.invalidate_local(w.wr.invalidate_rkey),
                    WcStatus::LocQpOpErr,
                ),
                _ => return,
            };
            if result.is_err() {
                self.enter_sqe(Some(status));
                return;
            }
            self.complete_send_head(WcStatus::Success);
        }
    }

    /// Raises `SqDrained` once in SQD when no send WR is part-way through.
    fn check_drained(&mut self) {
        if self.state == QpState::Sqd
            && !self.drained_notified
            && self.sq.front().is_none_or(|w| w.next_pkt == 0)
        {
            self.drained_notified = true;
            self.outbox.push_event(QpEvent::SqDrained);
        }
    }
}

/// Checks a send WR for a UC QP; returns its message length.
fn validate_send(wr: &SendWr) -> Result<u64, PostError> {
    match wr.opcode {
        SendOpcode::Send
        | SendOpcode::SendWithImm
        | SendOpcode::RdmaWrite
        | SendOpcode::RdmaWriteWithImm => {}
        SendOpcode::BindMw if wr.bind.is_none() => {
            return Err(PostError::InvalidWr(WrError::MissingBind))
        }
        SendOpcode::LocalInv | SendOpcode::BindMw => return Ok(0),
        op => {
            return Err(PostError::InvalidWr(WrError::OpcodeNotSupported {
                opcode: op,
                qp_type: QpType::Uc,
            }))
        }
    }
    let len = wr.payload.len();
    if len > MAX_MSG_LEN {
        return Err(PostError::InvalidWr(WrError::MessageTooLong { len }));
    }
    Ok(len)
}

impl Engine for UcQp {
    fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    fn qp_type(&self) -> QpType {
        QpType::Uc
    }

    fn state(&self) -> QpState {
        self.state
    }

    fn counters(&self) -> EngineCounters {
        self.counters.clone()
    }

    /// True when no send WR is queued (UC has nothing in flight and no timers).
    fn is_idle(&self) -> bool {
        self.sq.is_empty()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn handle_packet(
        &mut self,
        _now: Instant,
        from: &Arrival,
        pkt: &PacketRepr<'_>,
        env: &mut Env<'_>,
    ) -> Reply {
        if !from.on_path(self.cfg.peer, self.cfg.local) {
            self.counters.packets_received += 1;
            self.counters.dropped_packets += 1;
            self.counters.dropped_bad_address += 1;
            return Reply::Now;
        }
        // UC sends no acknowledgements: nothing to defer.
        self.receive(pkt, env);
        Reply::Now
    }

    fn handle_timeout(&mut self, _now: Instant, _env: &mut Env<'_>) {}

    /// Queues a send WR: sent in order in RTS, held in SQD until RTS, flushed at once with
    /// `WR_FLUSH_ERR` in SQE and ERR.
    ///
    /// Errors: `BadState` in RESET, INIT, RTR; `QueueFull` when `max_send_wr` WRs are
    /// queued or completed but not yet polled; `InvalidWr` for READ, atomics, SEND with
    /// invalidate and the other opcodes UC does not carry (`OpcodeNotSupported`), a
    /// BIND_MW without its bind (`MissingBind`), a message longer than 2^31 bytes.
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
            s => return Err(PostError::BadState(s)),
        }
        let len = validate_send(&wr)?;
        if self.sq.len() + self.outbox.send_cqes() >= self.cfg.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if matches!(self.state, QpState::Sqe | QpState::Err) {
            let wc = WorkCompletion::new(
                wr.wr_id,
                WcStatus::WrFlushErr,
                wr.opcode.wc_opcode(),
                self.cfg.qpn,
            );
            self.outbox.push_completion(CqKind::Send, wc);
            return Ok(());
        }
        // invariant: len ≤ 2^31, so at most 2^23 packets: fits u32.
        let npkts = u32::try_from(self.cfg.pmtu.packets_for(len)).unwrap_or(u32::MAX);
        self.sq.push_back(SendWqe {
            wr,
            len,
            npkts,
            next_pkt: 0,
            first_psn: Psn::ZERO,
        });
        Ok(())
    }

    fn check_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, PostError)> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
            s => return Err((0, PostError::BadState(s))),
        }
        for (i, wr) in wrs.iter().enumerate() {
            validate_send(wr).map_err(|e| (i, e))?;
        }
        let used = self.sq.len() + self.outbox.send_cqes();
        let room = (self.cfg.max_send_wr as usize).saturating_sub(used);
        if wrs.len() > room {
            return Err((room, PostError::QueueFull));
        }
        Ok(())
    }

    /// Queues a receive WR; in ERR it is completed at once with `WR_FLUSH_ERR`.
    ///
    /// Errors: `BadState` in RESET; `QueueFull` at `max_recv_wr` (counting completions not
    /// yet polled); `InvalidWr(UsesSrq)` on a QP that takes its receive WQEs from an SRQ.
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.cfg.use_srq {
            return Err(PostError::InvalidWr(WrError::UsesSrq));
        }
        if self.state == QpState::Reset {
            return Err(PostError::BadState(self.state));
        }
        let held = usize::from(matches!(self.cur, Some(InMsg::Send { .. })));
        if self.rq.len() + held + self.outbox.recv_cqes() >= self.cfg.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Err {
            let wc =
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.cfg.qpn);
            self.outbox.push_completion(CqKind::Recv, wc);
            return Ok(());
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// RTR→RTS: the requester starts at `rts.sq_psn` (the other attributes are RC's). From
    /// SQD or SQE the QP returns to RTS and PSNs continue. Otherwise nothing happens.
    fn enter_rts(&mut self, rts: RtsAttrs) {
        match self.state {
            QpState::Rtr => {
                self.cfg.sq_psn = rts.sq_psn;
                self.next_psn = rts.sq_psn;
                self.state = QpState::Rts;
            }
            QpState::Rts | QpState::Sqd | QpState::Sqe => self.state = QpState::Rts,
            _ => {}
        }
    }

    /// Application-driven state change (legality is the caller's business, see
    /// [`crate::qp_state`]):
    /// * ERR: the send queue is flushed with `WR_FLUSH_ERR` in posting order, then the
    ///   receive WQE held by a message in progress and the receive queue; an SRQ-attached
    ///   QP raises `LastWqeReached`. Nothing is sent or received any more.
    /// * SQE: the send queue is flushed; the receive side keeps working.
    /// * RESET: queues and PSN state are discarded without completions and re-initialised
    ///   from the configuration (completions already generated stay).
    /// * SQD: no new send WR starts (one part-way through is finished); `SqDrained` is
    ///   raised once none is in progress.
    /// * INIT, RTR, RTS: the state is set.
    ///
    /// From ERR only RESET leaves (other targets are ignored).
    fn set_state(&mut self, to: QpState) {
        match to {
            QpState::Err => self.enter_err(),
            QpState::Reset => {
                self.sq.clear();
                self.rq.clear();
                self.spare = None;
                self.cur = None;
                self.drop_msg = false;
                self.next_psn = self.cfg.sq_psn;
                self.epsn = self.cfg.rq_psn;
                self.state = QpState::Reset;
                self.drained_notified = false;
                self.comm_est_sent = false;
            }
            _ if self.state == QpState::Err => {}
            QpState::Sqe => self.enter_sqe(None),
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
        self.cfg.peer = attrs.peer;
        self.cfg.local = attrs.local;
        self.cfg.pkey = attrs.pkey;
    }

    fn poll_transmit(
        &mut self,
        _now: Instant,
        env: &mut Env<'_>,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let len = self.emit(env, buf)?;
        Some(Transmit {
            len,
            dst: self.cfg.peer,
        })
    }

    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        self.outbox.pop_completion()
    }

    fn poll_event(&mut self) -> Option<QpEvent> {
        self.outbox.pop_event()
    }
}
