//! The requester: walks the send queue and builds request packets one at a time.
//!
//! State: the send queue (WQEs with their PSN ranges and progress), `send_idx` (the first
//! WQE with packets left to send), `next_psn` (the PSN of the next request packet),
//! `comp_psn` (the oldest PSN not yet acknowledged; kept by the completer), `high_psn`
//! (one past the highest PSN ever sent: responses beyond it are bogus), the number of
//! outstanding READ/atomic WQEs and the AckReq spacing counter. The timers and retry
//! counters live here too but are driven by the completer.

use std::collections::VecDeque;

use uroce_wire::opcode::{self, Transport};
use uroce_wire::{atomic_eth, bth, reth, xrceth, PacketRepr, Psn};

use super::wqe::{SendWqe, WqeKind};
use super::{
    RcConfig, RcQp, ATOMIC_WRITE_LEN, MAX_PKTS_PER_ACKREQ, MAX_READ_PSNS, MAX_UNACKED_PSNS,
};
use crate::build::{build, data_packet, fill_payload, BuildError};
use crate::qp_state::QpState;
use crate::time::{local_ack_timeout, Instant};
use crate::wr::{SendFlags, SendOpcode, WcStatus};

/// Requester and completer state of one QP.
#[derive(Debug)]
pub(super) struct Requester {
    /// Posted send WQEs not yet completed, in posting order.
    pub sq: VecDeque<SendWqe>,
    /// Index in `sq` of the first WQE with packets left to send.
    pub send_idx: usize,
    /// PSN of the next request packet.
    pub next_psn: Psn,
    /// Oldest PSN not yet acknowledged (or answered).
    pub comp_psn: Psn,
    /// One past the highest PSN ever sent.
    pub high_psn: Psn,
    /// Started READ/atomic WQEs not yet completed.
    pub rd_atomic_outstanding: u32,
    /// Request packets sent since the last one with AckReq.
    pub pkts_since_ackreq: u32,
    /// Timeout / sequence-NAK retries left.
    pub retry_left: u8,
    /// Timeouts that may still be excused (not consume a retry) because they fired late
    /// or the peer was heard from since the previous one; reloaded with `retry_left`.
    pub excused_left: u8,
    /// A packet from the peer arrived on this QP since the last retransmit timeout and the
    /// last forward progress.
    pub peer_heard: bool,
    /// RNR retries left (ignored when `rnr_retry` is 7).
    pub rnr_left: u8,
    /// Retransmit timer.
    pub rto_deadline: Option<Instant>,
    /// End of the RNR wait; no request is sent before it.
    pub rnr_deadline: Option<Instant>,
    /// A retry for a gap in the responses was already started since the last progress.
    pub gap_retried: bool,
    /// The PSN of the sequence NAK acted on since the last progress: the responder NAKs a
    /// gap once, so the same NAK again before any progress is a network duplicate.
    pub nak_retry_psn: Option<Psn>,
}

impl Requester {
    /// Fresh state from the configuration.
    pub fn new(cfg: &RcConfig) -> Requester {
        Requester {
            sq: VecDeque::new(),
            send_idx: 0,
            next_psn: cfg.sq_psn,
            comp_psn: cfg.sq_psn,
            high_psn: cfg.sq_psn,
            rd_atomic_outstanding: 0,
            pkts_since_ackreq: 0,
            retry_left: cfg.retry_cnt,
            excused_left: cfg.retry_cnt,
            peer_heard: false,
            rnr_left: cfg.rnr_retry,
            rto_deadline: None,
            rnr_deadline: None,
            gap_retried: false,
            nak_retry_psn: None,
        }
    }

    /// Is any WQE started and not yet completed?
    pub fn has_started_wqe(&self) -> bool {
        self.sq.front().is_some_and(|w| w.started)
    }

    /// Are PSNs sent and not acknowledged?
    pub fn in_flight(&self) -> bool {
        self.comp_psn.is_before(self.next_psn)
    }

    /// Go back to `psn`: the next packet sent is the one with this PSN (a SEND/WRITE
    /// resumes at the right packet, a partially answered READ is re-issued for the rest),
    /// and every later started WQE is sent again in full.
    pub fn rewind_to(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.pkts_since_ackreq = 0;
        let mut send_idx = None;
        for (i, w) in self.sq.iter_mut().enumerate() {
            if !w.started {
                send_idx.get_or_insert(i);
                break;
            }
            if send_idx.is_some() {
                w.next_pkt = 0;
            } else if w.end_psn().is_after(psn) {
                send_idx = Some(i);
                w.next_pkt = match w.kind() {
                    WqeKind::Data => u32::try_from(psn.diff(w.first_psn)).unwrap_or(0),
                    WqeKind::Read | WqeKind::Atomic | WqeKind::AtomicWrite | WqeKind::Local => 0,
                };
            }
        }
        self.send_idx = send_idx.unwrap_or(self.sq.len());
    }
}

/// Everything about the next request packet except its payload bytes.
struct Plan {
    hdr: PacketRepr<'static>,
    /// Payload offset in the message and length.
    offset: u64,
    len: usize,
    /// PSN to continue with after this packet.
    next_psn: Psn,
}

impl RcQp {
    /// Builds the next request packet into `buf`, if the send queue has one ready.
    pub(super) fn requester_poll(
        &mut self,
        now: Instant,
        env: &mut super::Env<'_>,
        buf: &mut [u8],
    ) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.rnr_deadline.is_some() {
            return None;
        }
        self.run_local_ops(env)?;
        let idx = self.req.send_idx;
        let wqe = self.req.sq.get(idx)?;
        let in_flight = u64::try_from(self.req.next_psn.diff(self.req.comp_psn)).unwrap_or(0);
        if in_flight >= u64::from(MAX_UNACKED_PSNS) {
            return None;
        }
        if !wqe.started {
            if self.state == QpState::Sqd {
                return None;
            }
            if wqe.wr.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_outstanding > 0 {
                return None;
            }
            // ATOMIC WRITE counts against `max_rd_atomic` like READ and the atomics (as
            // rxe's requester does): the responder keeps a responder resource for it, to
            // answer a duplicate from the stored response without storing the 8 bytes
            // again (IBA 1.5 makes it a read-like operation for ordering, answered with
            // an RDMA READ response). A requester with more of them outstanding than the
            // target's `max_dest_rd_atomic` resources would let the target recycle the
            // resource of one still unanswered, whose retransmission would then find no
            // stored response and be dropped: the WR could only end in RETRY_EXC_ERR.
            // Counting it also makes FENCE wait for it, as for a READ.
            if wqe.is_rd_atomic() {
                if self.req.rd_atomic_outstanding >= u32::from(self.cfg.max_rd_atomic) {
                    return None;
                }
                if in_flight + u64::from(wqe.npkts) > MAX_READ_PSNS + u64::from(MAX_UNACKED_PSNS) {
                    return None;
                }
            }
        }
        let first_psn = if wqe.started {
            wqe.first_psn
        } else {
            self.req.next_psn
        };
        let ack_every = self.req.pkts_since_ackreq + 1 >= MAX_PKTS_PER_ACKREQ;
        let plan = self.plan(wqe, first_psn, ack_every)?;
        let psn = plan.hdr.bth.psn;
        let ack_req = plan.hdr.bth.ack_req;
        let built = build(buf, &plan.hdr, plan.len, |dst| {
            fill_payload(env.mem, &wqe.wr.payload, plan.offset, dst)
        });
        let n = match built {
            Ok(n) => n,
            Err(BuildError::Buffer) => return None,
            Err(BuildError::Fill(_)) => {
                // The requester cannot read its own SGEs: LOC_PROT_ERR, QP → ERR.
                if let Some(w) = self.req.sq.get_mut(idx) {
                    w.error = Some(WcStatus::LocProtErr);
                }
                self.enter_err(false);
                return None;
            }
        };

        // Commit.
        let w = self.req.sq.get_mut(idx)?;
        if !w.started {
            w.started = true;
            w.first_psn = first_psn;
            if w.is_rd_atomic() {
                self.req.rd_atomic_outstanding += 1;
            }
        }
        let done = match w.kind() {
            WqeKind::Data => {
                w.next_pkt += 1;
                w.next_pkt >= w.npkts
            }
            WqeKind::Read | WqeKind::Atomic | WqeKind::AtomicWrite | WqeKind::Local => {
                w.next_pkt = 1;
                true
            }
        };
        if done {
            self.req.send_idx += 1;
        }
        self.req.next_psn = plan.next_psn;
        self.req.pkts_since_ackreq = if ack_req {
            0
        } else {
            self.req.pkts_since_ackreq + 1
        };
        if psn.is_before(self.req.high_psn) {
            self.counters.retransmitted_packets += 1;
        }
        if plan.next_psn.is_after(self.req.high_psn) {
            self.req.high_psn = plan.next_psn;
        }
        if self.req.rto_deadline.is_none() {
            self.req.rto_deadline = local_ack_timeout(self.cfg.timeout).map(|d| now + d);
        }
        Some(n)
    }

    /// Executes the local operations (BIND_MW, LOCAL_INV) at `send_idx`, in send-queue
    /// order: a local WQE runs when the requester reaches it, i.e. after every earlier WQE
    /// has been started (and, with FENCE, after earlier READs/atomics completed). It takes
    /// no PSN; it completes once it is the oldest WQE (at once if it already is). A failure
    /// completes it with MW_BIND_ERR / LOC_QP_OP_ERR and moves the QP to ERR (IBA
    /// Vol 1 10.6.7). Returns `None` when the requester must stop (fence, ERR).
    fn run_local_ops(&mut self, env: &mut super::Env<'_>) -> Option<()> {
        for _ in 0..self.req.sq.len() {
            let idx = self.req.send_idx;
            let Some(w) = self.req.sq.get(idx) else {
                break;
            };
            if w.kind() != WqeKind::Local {
                break;
            }
            if !w.started {
                if self.state == QpState::Sqd {
                    return None;
                }
                if w.wr.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_outstanding > 0 {
                    return None;
                }
                let (result, status) = match (w.wr.opcode, w.wr.bind) {
                    (SendOpcode::BindMw, Some(b)) => (env.mem.bind_window(&b), WcStatus::MwBindErr),
                    (SendOpcode::BindMw, None) => (
                        Err(crate::memory::MwError::NotSupported),
                        WcStatus::MwBindErr,
                    ),
                    _ => (
                        env.mem.invalidate_local(w.wr.invalidate_rkey),
                        WcStatus::LocQpOpErr,
                    ),
                };
                let next_psn = self.req.next_psn;
                let w = self.req.sq.get_mut(idx)?;
                w.started = true;
                w.first_psn = next_psn;
                if result.is_err() {
                    w.error = Some(status);
                    self.enter_err(false);
                    return None;
                }
            }
            self.req.send_idx += 1;
        }
        self.complete_local_heads();
        Some(())
    }

    /// The headers and payload extent of the next packet of `wqe` (whose first PSN is
    /// `first_psn`). `None` only if the opcode table has no opcode for it (not reachable for
    /// the WR opcodes `post_send` accepts).
    fn plan(&self, wqe: &SendWqe, first_psn: Psn, ack_every: bool) -> Option<Plan> {
        let pmtu = u64::from(self.cfg.pmtu.bytes());
        let wr = &wqe.wr;
        let mut bth = bth::Repr {
            opcode: 0,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: self.cfg.pkey,
            fecn: false,
            becn: false,
            dest_qp: self.cfg.dest_qpn,
            ack_req: false,
            psn: first_psn,
        };
        let mut hdr = PacketRepr::new(bth, &[]);
        let (offset, len, next_psn) = match wqe.kind() {
            WqeKind::Data => {
                let p = data_packet(
                    self.cfg.transport(),
                    self.cfg.pmtu,
                    self.cfg.pkey,
                    self.cfg.dest_qpn,
                    wr,
                    wqe.len,
                    wqe.npkts,
                    wqe.next_pkt,
                    first_psn,
                )?;
                hdr = p.hdr;
                bth = hdr.bth;
                bth.ack_req = p.position.ends() || ack_every;
                (p.offset, p.len as u64, bth.psn.wrapping_add(1))
            }
            WqeKind::Read => {
                // A partially answered READ is re-issued for the rest: VA advanced past the
                // responses already placed, PSN of the first missing response.
                let done = u64::from(wqe.resp_pkts) * pmtu;
                bth.opcode = self.cfg.wire_opcode(opcode::op::RC_RDMA_READ_REQUEST);
                bth.psn = first_psn.wrapping_add(wqe.resp_pkts);
                bth.ack_req = true;
                hdr.reth = Some(reth::Repr {
                    va: wr.remote_addr.wrapping_add(done),
                    rkey: wr.rkey,
                    dma_len: u32::try_from(wqe.len.saturating_sub(done)).unwrap_or(u32::MAX),
                });
                (0, 0, first_psn.wrapping_add(wqe.npkts))
            }
            WqeKind::Local => return None,
            WqeKind::AtomicWrite => {
                // IBA 1.5 ATOMIC WRITE: RETH (DMA length 8) and the 8 bytes as payload.
                bth.opcode = self.cfg.wire_opcode(opcode::op::RC_ATOMIC_WRITE);
                bth.ack_req = true;
                hdr.reth = Some(reth::Repr {
                    va: wr.remote_addr,
                    rkey: wr.rkey,
                    dma_len: ATOMIC_WRITE_LEN as u32,
                });
                (0, ATOMIC_WRITE_LEN, first_psn.wrapping_add(1))
            }
            WqeKind::Atomic => {
                let (opcode, swap_add, compare) = match wr.opcode {
                    SendOpcode::AtomicCmpAndSwp => {
                        (opcode::op::RC_COMPARE_SWAP, wr.swap, wr.compare_add)
                    }
                    _ => (opcode::op::RC_FETCH_ADD, wr.compare_add, 0),
                };
                bth.opcode = self.cfg.wire_opcode(opcode);
                bth.ack_req = true;
                hdr.atomic_eth = Some(atomic_eth::Repr {
                    va: wr.remote_addr,
                    rkey: wr.rkey,
                    swap_add,
                    compare,
                });
                (0, 0, first_psn.wrapping_add(1))
            }
        };
        hdr.bth = bth;
        if self.cfg.transport() == Transport::Xrc {
            // Every XRC request packet names the target's SRQ (Annex A14).
            hdr.xrceth = Some(xrceth::Repr {
                srqn: wr.remote_srqn & 0x00ff_ffff,
            });
        }
        Some(Plan {
            hdr,
            offset,
            // invariant: len ≤ PMTU ≤ 4096.
            len: usize::try_from(len).unwrap_or(0),
            next_psn,
        })
    }
}
