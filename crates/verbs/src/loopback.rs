//! An in-process loopback [`Transport`]: the QPs of one context reach each other through
//! in-memory packet delivery, with no sockets and no threads (cargo feature `loopback`).
//!
//! It exists so that the object model can be tested end to end through the one QP path
//! (the protocol engines) without the network layer: a test connects two QPs of the same
//! device (the destination GID is the device's own address), posts real work requests and
//! calls [`Loopback::progress`], which moves every packet the engines emit to the QP its
//! BTH names until nothing moves. Nothing happens on its own: posting only rings (a no-op
//! here) and polling an empty CQ does not drive progress, so a test decides exactly when
//! packets travel ([`Loopback::transmit`], [`Loopback::deliver`]) and when time passes
//! ([`Loopback::advance`], a virtual clock that starts at zero).
//!
//! Packets addressed to anything but the device's address are dropped (and counted), like
//! datagrams to a host that does not answer: a requester's WRs then stay in flight until
//! its retry timer runs out.
//!
//! The ICRC is neither sealed nor checked (the engines leave it zero and the packet never
//! leaves the process); the network layer's own tests cover it.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use uroce_proto::engine::Arrival;
use uroce_proto::time::Instant;
use uroce_wire::PacketRepr;

use crate::context::Context;
use crate::engine::{Transport, TxPacket};

/// Largest packet an engine may emit (BTH..ICRC of a 4096-byte MTU with every header).
const MAX_PACKET: usize = 4096 + 128;
/// Packets one transmit call takes from one QP.
const TX_BATCH: usize = 64;
/// Bound on transmit/deliver rounds of one [`Loopback::progress`] call.
const MAX_ROUNDS: usize = 100_000;

/// A packet on the in-memory wire.
struct InFlight {
    bytes: Vec<u8>,
    dst: IpAddr,
}

#[derive(Default)]
struct State {
    now: Instant,
    wire: VecDeque<InFlight>,
    dropped: u64,
}

/// The loopback transport of one context; see the module docs.
pub struct Loopback {
    addr: IpAddr,
    state: Mutex<State>,
}

impl Transport for Loopback {
    fn ring(&self, _qpn: u32) {}

    fn poll_progress(&self) -> bool {
        false
    }

    fn flush(&self, _qpn: u32) {}
}

impl Loopback {
    /// Installs a loopback transport on `ctx` (which must not have one yet).
    ///
    /// # Panics
    /// If `ctx` already has a transport.
    pub fn install(ctx: &Context) -> Arc<Loopback> {
        let lo = Arc::new(Loopback {
            addr: ctx.device().addr(),
            state: Mutex::new(State::default()),
        });
        if ctx.set_transport(lo.clone()).is_err() {
            panic!("the context already has a transport");
        }
        lo
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The virtual time.
    pub fn now(&self) -> Instant {
        self.state().now
    }

    /// Packets dropped: addressed elsewhere, unparsable, or for a QP without an engine.
    pub fn dropped(&self) -> u64 {
        self.state().dropped
    }

    /// Packets waiting on the wire (transmitted, not yet delivered).
    pub fn in_flight(&self) -> usize {
        self.state().wire.len()
    }

    /// Moves what every QP of `ctx` has to send onto the wire. Returns the packets moved.
    pub fn transmit(&self, ctx: &Context) -> usize {
        let now = self.now();
        let mut buf = vec![0u8; MAX_PACKET * TX_BATCH];
        let mut lens: Vec<TxPacket> = Vec::new();
        let mut moved = 0;
        for qpn in ctx.qp_numbers() {
            let Some(qp) = ctx.lookup_qp(qpn) else {
                continue;
            };
            // Bounded: an engine has at most its send queue's worth of packets to send.
            for _ in 0..MAX_ROUNDS {
                lens.clear();
                let t = qp.engine_transmit(now, &mut buf, MAX_PACKET, TX_BATCH, &mut lens);
                let mut st = self.state();
                let mut at = 0;
                for p in &lens {
                    let bytes = buf.get(at..at + p.len).unwrap_or_default().to_vec();
                    at += p.len;
                    if p.dst == self.addr {
                        st.wire.push_back(InFlight { bytes, dst: p.dst });
                    } else {
                        st.dropped += 1;
                    }
                }
                moved += t.packets;
                if !t.limited {
                    break;
                }
            }
        }
        moved
    }

    /// Delivers every packet on the wire, in order, to the QP its BTH names. Returns the
    /// packets delivered.
    pub fn deliver(&self, ctx: &Context) -> usize {
        let waiting = self.in_flight();
        let mut delivered = 0;
        // Only what was on the wire when called: replies wait for the next call.
        for _ in 0..waiting {
            if self.deliver_one(ctx) {
                delivered += 1;
            }
        }
        delivered
    }

    /// Delivers the oldest packet on the wire, if any (to stop a message part way).
    /// Returns whether one was delivered.
    pub fn deliver_one(&self, ctx: &Context) -> bool {
        let now = self.now();
        let Some(p) = self.state().wire.pop_front() else {
            return false;
        };
        let handled = PacketRepr::parse(&p.bytes).ok().and_then(|pkt| {
            let qp = ctx.qp_for_packet(pkt.bth.dest_qp)?;
            qp.engine_handle_packet(now, &Arrival::new(self.addr, p.dst), &pkt)
        });
        if handled.is_none() {
            self.state().dropped += 1;
        }
        handled.is_some()
    }

    /// Transmits and delivers until nothing moves. Returns the packets delivered.
    pub fn progress(&self, ctx: &Context) -> usize {
        let mut delivered = 0;
        for _ in 0..MAX_ROUNDS {
            let sent = self.transmit(ctx);
            let got = self.deliver(ctx);
            delivered += got;
            if sent == 0 && got == 0 {
                break;
            }
        }
        delivered
    }

    /// Advances the virtual clock by `d`, runs the timers that are due (retransmission,
    /// RNR wait, ACK coalescing) and then [`Loopback::progress`].
    pub fn advance(&self, ctx: &Context, d: Duration) -> usize {
        let now = {
            let mut st = self.state();
            st.now = st.now.saturating_add(d);
            st.now
        };
        for qpn in ctx.qp_numbers() {
            let Some(qp) = ctx.lookup_qp(qpn) else {
                continue;
            };
            if qp.engine_poll_timeout().is_some_and(|t| t <= now) {
                qp.engine_handle_timeout(now);
            }
        }
        self.progress(ctx)
    }
}
