//! The completer: ACKs, NAKs, READ responses and atomic ACKs in; work completions,
//! retries and timer decisions out (IBA Vol 1 §9.7).
//!
//! Rules, by packet:
//! * Any response with PSN `p` in `[comp_psn, high_psn)` implicitly acknowledges the
//!   SEND/WRITE PSNs before it: those WQEs complete (in order, from the head), `comp_psn`
//!   advances. A SEND/WRITE acknowledged part-way stays at the head with `comp_psn` inside
//!   it. READ/atomic WQEs complete only with their data.
//! * ACK `p`: acknowledges through `p`. If the oldest incomplete WQE is a READ/atomic whose
//!   first PSN is ≤ `p`, its response was lost: implicit NAK → retry.
//! * READ response `p`: must be the next response of the oldest WQE (a READ); opcode and
//!   length must fit its position; the payload is scattered into the WR's SGEs at
//!   `(p − first_psn) × PMTU`. A later PSN means responses were lost: retry (once per gap).
//! * Atomic ACK `p`: must answer the oldest WQE (an atomic); the original value goes to
//!   its 8-byte SGE.
//! * A zero-length READ RESPONSE ONLY `p` answering the oldest WQE, an ATOMIC WRITE (IBA
//!   1.5) with first PSN `p`, completes it (any other READ response opcode or a payload
//!   there is BAD_RESP_ERR). It is a response like an atomic ACK: an ACK or response
//!   beyond an unanswered ATOMIC WRITE is an implicit NAK.
//! * NAK PSN sequence error `q`: acknowledges before `q`, then go back to `comp_psn`.
//! * RNR NAK `p`: acknowledges before `p`, then wait the RNR timer and resend from `p`.
//! * Other NAKs: acknowledge before `p`; the oldest incomplete WQE fails with
//!   REM_INV_REQ_ERR / REM_ACCESS_ERR / REM_OP_ERR; the QP goes to ERR.
//! * PSNs before `comp_psn` are duplicates (ignored); PSNs at or after `high_psn` were
//!   never sent (dropped).
//! * The responder NAKs a gap once and stays silent until the missing packet arrives, so
//!   a sequence NAK equal to the one already acted on (no progress since), or an RNR NAK
//!   during the RNR wait it started, is a network duplicate: ignored, not counted as a
//!   retry.

use core::time::Duration;

use uroce_wire::aeth::{rnr_timer_micros, NakCode, Syndrome};
use uroce_wire::opcode::{OpcodeInfo, Operation, Position};
use uroce_wire::{PacketRepr, Psn};

use super::wqe::WqeKind;
use super::{Env, RcQp};
use crate::memory::scatter;
use crate::time::{local_ack_timeout, Instant};
use crate::wr::{SendPayload, WcStatus};

/// What a response PSN means relative to the requester's window.
enum PsnClass {
    /// Before `comp_psn`: already handled.
    Duplicate,
    /// At or after `high_psn`: never sent.
    Unsent,
    /// In `[comp_psn, high_psn)`.
    Valid,
}

impl RcQp {
    /// Dispatches a response packet (the caller checked state, QPN and transport).
    pub(super) fn completer_packet(
        &mut self,
        now: Instant,
        pkt: &PacketRepr<'_>,
        info: &OpcodeInfo,
        env: &mut Env<'_>,
    ) {
        match info.operation {
            Operation::Acknowledge => self.on_acknowledge(now, pkt),
            Operation::RdmaReadResponse => self.on_read_response(now, pkt, info, env),
            Operation::AtomicAcknowledge => self.on_atomic_ack(now, pkt, env),
            _ => self.drop_bad_opcode(),
        }
    }

    /// Fires the RNR and retransmit timers that are due.
    pub(super) fn completer_timeout(&mut self, now: Instant) {
        if self.req.rnr_deadline.is_some_and(|t| now >= t) {
            self.req.rnr_deadline = None;
            let c = self.req.comp_psn;
            self.req.rewind_to(c);
        }
        if let Some(deadline) = self.req.rto_deadline.filter(|t| now >= *t) {
            self.req.rto_deadline = None;
            let heard = std::mem::take(&mut self.req.peer_heard);
            if self.req.in_flight() {
                self.counters.timeouts += 1;
                // A timeout that fired late says this process was not scheduled, and one
                // after a packet from the peer says the peer runs: neither says the peer
                // is gone. Such a timeout retransmits without consuming a retry, at most
                // `retry_cnt` times between two forward progresses, so a peer that is
                // really gone still fails after at most 2 × retry_cnt + 1 timeouts (IBA's
                // Local ACK Timeout is a minimum, C9-140; see the module documentation).
                let late = local_ack_timeout(self.cfg.timeout)
                    .is_some_and(|t| now.saturating_duration_since(deadline) > late_margin(t));
                if (late || heard) && self.req.excused_left > 0 {
                    self.req.excused_left -= 1;
                    self.counters.timeouts_excused += 1;
                    let c = self.req.comp_psn;
                    self.req.rewind_to(c);
                } else {
                    self.retry();
                }
            }
        }
    }

    fn classify(&self, psn: Psn) -> PsnClass {
        if psn.is_before(self.req.comp_psn) {
            PsnClass::Duplicate
        } else if psn.is_before(self.req.high_psn) {
            PsnClass::Valid
        } else {
            PsnClass::Unsent
        }
    }

    /// Classifies `psn`, counting duplicates and unsent PSNs; true when valid.
    fn accept_psn(&mut self, psn: Psn) -> bool {
        match self.classify(psn) {
            PsnClass::Valid => true,
            PsnClass::Duplicate => {
                self.counters.duplicates_received += 1;
                false
            }
            PsnClass::Unsent => {
                self.drop_unexpected_response();
                false
            }
        }
    }

    fn on_acknowledge(&mut self, now: Instant, pkt: &PacketRepr<'_>) {
        let Some(aeth) = pkt.aeth else {
            self.drop_bad_opcode();
            return;
        };
        let p = pkt.bth.psn;
        match aeth.syndrome {
            Syndrome::Ack { .. } => {
                self.counters.acks_received += 1;
                if !self.accept_psn(p) {
                    return;
                }
                let progress = self.ack_through(p.wrapping_add(1));
                self.after_progress(now, progress);
                let implicit_nak = self
                    .req
                    .sq
                    .front()
                    .is_some_and(|w| w.started && w.is_rd_atomic() && !w.first_psn.is_after(p));
                if implicit_nak {
                    self.counters.implicit_naks += 1;
                    self.gap_retry();
                }
            }
            Syndrome::RnrNak { timer } => {
                self.counters.rnr_naks_received += 1;
                if !self.accept_psn(p) {
                    return;
                }
                if self.req.rnr_deadline.is_some() && p == self.req.comp_psn {
                    // Nothing was sent since the RNR NAK we are waiting on: a duplicate.
                    self.counters.duplicates_received += 1;
                    return;
                }
                let progress = self.ack_through(p);
                self.after_progress(now, progress);
                if self.cfg.rnr_retry != 7 {
                    if self.req.rnr_left == 0 {
                        self.counters.rnr_retry_exceeded += 1;
                        self.fail_head(WcStatus::RnrRetryExcErr);
                        return;
                    }
                    self.req.rnr_left -= 1;
                }
                let wait = Duration::from_micros(rnr_timer_micros(timer));
                self.req.rnr_deadline = Some(now + wait);
                self.req.rto_deadline = None;
                let c = self.req.comp_psn;
                self.req.rewind_to(c);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                self.counters.seq_naks_received += 1;
                if !self.accept_psn(p) {
                    return;
                }
                if self.req.rnr_deadline.is_some() && p == self.req.comp_psn {
                    // Already going back to exactly this PSN when the RNR wait ends.
                    return;
                }
                if self.req.nak_retry_psn == Some(p) {
                    self.counters.duplicates_received += 1;
                    return;
                }
                let progress = self.ack_through(p);
                self.after_progress(now, progress);
                self.retry();
                self.req.nak_retry_psn = Some(p);
            }
            Syndrome::Nak(code) => {
                self.counters.error_naks_received += 1;
                if !self.accept_psn(p) {
                    return;
                }
                let progress = self.ack_through(p);
                self.after_progress(now, progress);
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail_head(status);
            }
        }
    }

    fn on_read_response(
        &mut self,
        now: Instant,
        pkt: &PacketRepr<'_>,
        info: &OpcodeInfo,
        env: &mut Env<'_>,
    ) {
        let p = pkt.bth.psn;
        if !self.accept_psn(p) {
            return;
        }
        let progress = self.ack_through(p);
        self.after_progress(now, progress);
        let pmtu = u64::from(self.cfg.pmtu.bytes());
        let Some(w) = self.req.sq.front() else {
            self.drop_unexpected_response();
            return;
        };
        if !w.started {
            self.drop_unexpected_response();
            return;
        }
        if w.kind() == WqeKind::AtomicWrite && w.first_psn == p {
            // IBA 1.5 ATOMIC WRITE is answered by one zero-length READ RESPONSE ONLY.
            if info.position != Position::Only || !pkt.payload.is_empty() {
                self.fail_head(WcStatus::BadRespErr);
                return;
            }
            self.req.comp_psn = p.wrapping_add(1);
            self.complete_send_head(WcStatus::Success);
            self.after_progress(now, true);
            return;
        }
        if w.kind() != WqeKind::Read || !w.contains(p) {
            if w.is_rd_atomic() && w.first_psn.is_before(p) {
                // A response for a later WQE while this one is unanswered: lost responses.
                self.counters.implicit_naks += 1;
                self.gap_retry();
            } else {
                self.drop_unexpected_response();
            }
            return;
        }
        let expected = w.first_psn.wrapping_add(w.resp_pkts);
        if p != expected {
            // p is after the next expected response (earlier ones were rejected as
            // duplicates): responses were lost.
            self.gap_retry();
            return;
        }
        let k = w.resp_pkts;
        let offset = u64::from(k) * pmtu;
        let remaining = w.len.saturating_sub(offset);
        let last = remaining <= pmtu;
        let position_ok = match info.position {
            Position::Only => last,
            Position::Last => last && k > 0,
            Position::First => !last,
            Position::Middle => !last && k > 0,
        };
        if !position_ok || pkt.payload.len() as u64 != remaining.min(pmtu) {
            self.fail_head(WcStatus::BadRespErr);
            return;
        }
        let SendPayload::Sges(sges) = &w.wr.payload else {
            // invariant: post_send refuses inline READs.
            self.fail_head(WcStatus::LocQpOpErr);
            return;
        };
        if scatter(env.mem, sges, offset, pkt.payload).is_err() {
            self.fail_head(WcStatus::LocProtErr);
            return;
        }
        if let Some(w) = self.req.sq.front_mut() {
            w.resp_pkts += 1;
        }
        self.req.comp_psn = p.wrapping_add(1);
        if last {
            self.complete_send_head(WcStatus::Success);
        }
        self.after_progress(now, true);
    }

    fn on_atomic_ack(&mut self, now: Instant, pkt: &PacketRepr<'_>, env: &mut Env<'_>) {
        let p = pkt.bth.psn;
        let Some(ack) = pkt.atomic_ack_eth else {
            self.drop_bad_opcode();
            return;
        };
        if !self.accept_psn(p) {
            return;
        }
        let progress = self.ack_through(p);
        self.after_progress(now, progress);
        let Some(w) = self.req.sq.front() else {
            self.drop_unexpected_response();
            return;
        };
        if !w.started || w.kind() != WqeKind::Atomic || w.first_psn != p {
            if w.started && w.is_rd_atomic() && w.first_psn.is_before(p) {
                self.counters.implicit_naks += 1;
                self.gap_retry();
            } else {
                self.drop_unexpected_response();
            }
            return;
        }
        let SendPayload::Sges(sges) = &w.wr.payload else {
            // invariant: post_send refuses inline atomics.
            self.fail_head(WcStatus::LocQpOpErr);
            return;
        };
        // The original value as the 64-bit word it was in the responder's memory, in the
        // host order the application reads it in.
        if scatter(env.mem, sges, 0, &ack.orig.to_ne_bytes()).is_err() {
            self.fail_head(WcStatus::LocProtErr);
            return;
        }
        self.req.comp_psn = p.wrapping_add(1);
        self.complete_send_head(WcStatus::Success);
        self.after_progress(now, true);
    }

    /// Acknowledges every PSN before `end`: completes the SEND/WRITE WQEs at the head that
    /// end at or before `end` and advances `comp_psn` (into a SEND/WRITE acknowledged part
    /// way, too). Stops at a READ/atomic. Returns whether `comp_psn` advanced.
    pub(super) fn ack_through(&mut self, end: Psn) -> bool {
        let mut progress = false;
        for _ in 0..self.req.sq.len() {
            let Some(w) = self.req.sq.front() else {
                break;
            };
            if !w.started || w.kind() != WqeKind::Data {
                break;
            }
            let wend = w.end_psn();
            if !wend.is_after(end) {
                if wend.is_after(self.req.comp_psn) {
                    self.req.comp_psn = wend;
                }
                self.complete_send_head(WcStatus::Success);
                progress = true;
            } else {
                if end.is_after(self.req.comp_psn) {
                    self.req.comp_psn = end;
                    progress = true;
                }
                break;
            }
        }
        progress
    }

    /// After `comp_psn` may have moved: keep `next_psn` at or after it, and on progress
    /// reload the retry counters and re-arm (or stop) the retransmit timer.
    fn after_progress(&mut self, now: Instant, progress: bool) {
        if self.req.next_psn.is_before(self.req.comp_psn) {
            let c = self.req.comp_psn;
            self.req.rewind_to(c);
        }
        if !progress {
            return;
        }
        self.req.retry_left = self.cfg.retry_cnt;
        self.req.excused_left = self.cfg.retry_cnt;
        // Progress has been accounted for: only a packet after it excuses a timeout (else
        // the first timeout after a peer vanishes would be excused by its last ACK).
        self.req.peer_heard = false;
        self.req.rnr_left = self.cfg.rnr_retry;
        self.req.gap_retried = false;
        self.req.nak_retry_psn = None;
        if self.req.rnr_deadline.is_none() {
            self.req.rto_deadline = if self.req.in_flight() {
                local_ack_timeout(self.cfg.timeout).map(|d| now + d)
            } else {
                None
            };
        }
    }

    /// A retry for lost responses, at most once between two forward progresses.
    fn gap_retry(&mut self) {
        if !self.req.gap_retried {
            self.req.gap_retried = true;
            self.retry();
        }
    }

    /// Go-back-N from `comp_psn`, or RETRY_EXC_ERR when no retry is left.
    fn retry(&mut self) {
        if self.req.retry_left == 0 {
            self.counters.retry_exceeded += 1;
            self.fail_head(WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        self.counters.retries += 1;
        let c = self.req.comp_psn;
        self.req.rewind_to(c);
        self.req.rto_deadline = None;
    }

    /// The oldest WQE fails with `status`; the QP goes to ERR and flushes the rest.
    pub(super) fn fail_head(&mut self, status: WcStatus) {
        if let Some(w) = self.req.sq.front_mut() {
            w.error = Some(status);
        }
        self.enter_err(false);
    }
}

/// How late a retransmit timer of period `t` may fire and still count as on time: half a
/// period, and never less than 1 ms (a scheduler's tick: below it every timer is late).
fn late_margin(t: Duration) -> Duration {
    (t / 2).max(Duration::from_millis(1))
}
