//! A small go-back-N engine used to test the simulator itself (before and independently
//! of the real RC engine): SEND_ONLY packets whose payload encodes their PSN, cumulative
//! ACKs, a fixed retransmission timeout. It implements `Engine` like the real ones, with
//! only what the simulator drives: it sends `total` messages by itself, so it refuses
//! posted work requests, and its completions carry the message number as `wr_id`. Exactly-once in-order delivery through a lossy,
//! duplicating, reordering, corrupting link proves that the link model and the receive
//! checks behave.

use std::collections::VecDeque;
use std::time::Duration;

use std::net::{IpAddr, Ipv4Addr};

use uroce_proto::engine::{Arrival, CqKind, Engine, Env, QpEvent, Reply, Transmit};
use uroce_proto::time::Instant;
use uroce_proto::wr::{WcOpcode, WcStatus, WorkCompletion};
use uroce_wire::{aeth, bth, opcode::op, PacketRepr, Psn};

/// The `Engine` methods a test fake that sends by itself has no use for: an RC QP in RTS
/// that refuses posted work requests, ignores state changes and counts nothing.
macro_rules! fake_engine_commands {
    () => {
        fn qp_type(&self) -> uroce_proto::qp_state::QpType {
            uroce_proto::qp_state::QpType::Rc
        }

        fn state(&self) -> uroce_proto::qp_state::QpState {
            uroce_proto::qp_state::QpState::Rts
        }

        fn counters(&self) -> uroce_proto::counters::EngineCounters {
            uroce_proto::counters::EngineCounters::default()
        }

        fn post_send(
            &mut self,
            _wr: uroce_proto::wr::SendWr,
        ) -> Result<(), uroce_proto::engine::PostError> {
            Err(uroce_proto::engine::PostError::BadState(
                uroce_proto::qp_state::QpState::Rts,
            ))
        }

        fn check_send_list(
            &self,
            _wrs: &[uroce_proto::wr::SendWr],
        ) -> Result<(), (usize, uroce_proto::engine::PostError)> {
            Err((
                0,
                uroce_proto::engine::PostError::BadState(uroce_proto::qp_state::QpState::Rts),
            ))
        }

        fn post_recv(
            &mut self,
            _wr: uroce_proto::wr::RecvWr,
        ) -> Result<(), uroce_proto::engine::PostError> {
            Err(uroce_proto::engine::PostError::BadState(
                uroce_proto::qp_state::QpState::Rts,
            ))
        }

        fn enter_rts(&mut self, _rts: uroce_proto::engine::RtsAttrs) {}

        fn set_state(&mut self, _to: uroce_proto::qp_state::QpState) {}

        fn reconfigure(&mut self, _attrs: &uroce_proto::engine::LiveAttrs) {}
    };
}
pub(crate) use fake_engine_commands;

/// What the fake reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FakeCompletion {
    /// Message `n` was acknowledged.
    Sent(u32),
    /// Message `n` arrived (in order, first time).
    Received(u32),
}

impl FakeCompletion {
    /// The work completion the fake's `poll_completion` reports for it (on the send or
    /// receive CQ, `wr_id` = the message number).
    pub(crate) fn wc(self, qpn: u32) -> (CqKind, WorkCompletion) {
        let (kind, n, opcode) = match self {
            FakeCompletion::Sent(n) => (CqKind::Send, n, WcOpcode::Send),
            FakeCompletion::Received(n) => (CqKind::Recv, n, WcOpcode::Recv),
        };
        (
            kind,
            WorkCompletion::new(u64::from(n), WcStatus::Success, opcode, qpn),
        )
    }
}

/// Misbehaviours to provoke the simulator's error paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Quirk {
    #[default]
    None,
    /// Never clears its deadline.
    StuckTimer,
    /// Emits bytes that do not parse.
    Garbage,
    /// Reports a longer packet than the buffer.
    Overflow,
}

#[derive(Debug)]
pub(crate) struct Fake {
    pub qpn: u32,
    pub dest_qpn: u32,
    pub total: u32,
    pub window: u32,
    pub timeout: Option<Duration>,
    pub quirk: Quirk,
    /// Where its packets go (set by the test; `0.0.0.0` until then).
    pub peer: IpAddr,
    /// Every arrival's addresses, in order.
    pub arrivals: Vec<Arrival>,
    next: u32,
    acked: u32,
    deadline: Option<Instant>,
    expected: u32,
    ack_due: Option<u32>,
    pub corrupt_payloads: u32,
    completions: VecDeque<FakeCompletion>,
}

impl Fake {
    pub(crate) fn new(qpn: u32, dest_qpn: u32, total: u32) -> Fake {
        Fake {
            qpn,
            dest_qpn,
            total,
            window: 8,
            timeout: Some(Duration::from_micros(100)),
            quirk: Quirk::None,
            peer: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            arrivals: Vec::new(),
            next: 0,
            acked: 0,
            deadline: None,
            expected: 0,
            ack_due: None,
            corrupt_payloads: 0,
            completions: VecDeque::new(),
        }
    }

    /// The same fake, sending to `peer`.
    pub(crate) fn to(mut self, peer: IpAddr) -> Fake {
        self.peer = peer;
        self
    }

    fn bth(&self, opcode: u8, psn: u32, ack_req: bool) -> bth::Repr {
        bth::Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: self.dest_qpn,
            ack_req,
            psn: Psn::new(psn),
        }
    }

    pub(crate) fn payload(psn: u32) -> [u8; 16] {
        let mut p = [0u8; 16];
        for chunk in p.chunks_mut(4) {
            chunk.copy_from_slice(&psn.to_be_bytes());
        }
        p
    }
}

impl Engine for Fake {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn handle_packet(
        &mut self,
        now: Instant,
        from: &Arrival,
        pkt: &PacketRepr<'_>,
        _env: &mut Env<'_>,
    ) -> Reply {
        self.arrivals.push(*from);
        let psn = pkt.bth.psn.value();
        match pkt.bth.opcode {
            op::RC_SEND_ONLY => {
                if psn == self.expected {
                    if pkt.payload != Fake::payload(psn) {
                        self.corrupt_payloads += 1;
                        return Reply::Now;
                    }
                    self.completions.push_back(FakeCompletion::Received(psn));
                    self.expected += 1;
                    self.ack_due = Some(psn);
                } else if psn < self.expected {
                    self.ack_due = Some(self.expected - 1);
                }
            }
            op::RC_ACKNOWLEDGE if psn >= self.acked && psn < self.next => {
                for n in self.acked..=psn {
                    self.completions.push_back(FakeCompletion::Sent(n));
                }
                self.acked = psn + 1;
                self.deadline = if self.acked < self.next {
                    self.timeout.map(|t| now + t)
                } else {
                    None
                };
            }
            _ => {}
        }
        Reply::Now
    }

    fn handle_timeout(&mut self, now: Instant, _env: &mut Env<'_>) {
        if self.quirk == Quirk::StuckTimer {
            return;
        }
        self.next = self.acked;
        self.deadline = self.timeout.map(|t| now + t);
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        _env: &mut Env<'_>,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let dst = self.peer;
        let to = |len| Transmit { len, dst };
        match self.quirk {
            Quirk::Garbage if self.next < self.total => {
                self.next = self.total;
                buf.get_mut(..16)?.fill(0xEE);
                return Some(to(16));
            }
            Quirk::Overflow if self.next < self.total => {
                self.next = self.total;
                return Some(to(buf.len() + 1));
            }
            _ => {}
        }
        if let Some(psn) = self.ack_due.take() {
            let ack = PacketRepr {
                aeth: Some(aeth::Repr {
                    syndrome: aeth::Syndrome::ACK_NO_CREDIT,
                    msn: psn + 1,
                }),
                ..PacketRepr::new(self.bth(op::RC_ACKNOWLEDGE, psn, false), &[])
            };
            return ack.emit(buf).ok().map(to);
        }
        if self.next < self.total && self.next < self.acked + self.window {
            let psn = self.next;
            self.next += 1;
            if self.deadline.is_none() {
                self.deadline = self.timeout.map(|t| now + t);
            }
            let payload = Fake::payload(psn);
            let pkt = PacketRepr::new(self.bth(op::RC_SEND_ONLY, psn, true), &payload);
            return pkt.emit(buf).ok().map(to);
        }
        None
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        let qpn = self.qpn;
        self.completions.pop_front().map(|c| c.wc(qpn))
    }

    fn poll_event(&mut self) -> Option<QpEvent> {
        None
    }

    fake_engine_commands!();

    fn is_idle(&self) -> bool {
        self.acked == self.total && self.ack_due.is_none() && self.deadline.is_none()
    }
}
