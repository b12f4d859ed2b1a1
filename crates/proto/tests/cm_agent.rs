//! Two CM agents over an in-memory wire with virtual time: connection setup and teardown,
//! lost messages, vanished peers, rejects, duplicates, stale connections, timewait, SIDR,
//! LAP refusal, and arbitrary bytes.

use std::net::IpAddr;
use std::time::Duration;

use proptest::prelude::*;
use uroce_proto::cm::table::CmState;
use uroce_proto::cm::{
    cm_timeout, AcceptParams, AgentConfig, CmAgent, CmEvent, ConnId, ConnectParams, SidrAnswer,
    SidrParams,
};
use uroce_proto::time::Instant;
use uroce_wire::cm::rdma_cm::{gid_of, PortSpace};
use uroce_wire::cm::{apr_status, rej_reason, sidr_status, CmMad, CmMessage, LapRepr, PathRepr};
use uroce_wire::mad::cm_attr;

const A: usize = 0;
const B: usize = 1;
const SERVICE: u64 = PortSpace::Tcp.service_id(7174);
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x12;
/// CM response timeout exponent used by the tests: 4.096 µs × 2^12 ≈ 16.8 ms per try.
const RESPONSE: u8 = 12;
const RETRIES: u8 = 3;

fn addr(side: usize) -> IpAddr {
    IpAddr::from([10, 0, 0, 1 + side as u8])
}

fn connect_params(to: usize, from: usize, qpn: u32) -> ConnectParams {
    ConnectParams {
        remote: addr(to),
        service_id: SERVICE,
        local_qpn: qpn,
        starting_psn: 0x1000,
        qkey: 0,
        responder_resources: 4,
        initiator_depth: 4,
        transport_service_type: 0,
        extended_transport_type: 0,
        path: PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid_of(addr(from)),
            remote_gid: gid_of(addr(to)),
            hop_limit: 64,
            local_ack_timeout: 14,
            ..PathRepr::default()
        },
        pkey: 0xffff,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        cm_response_timeout: RESPONSE,
        packet_life_time: 0,
        max_cm_retries: RETRIES,
        srq: false,
        private_data: b"hello".to_vec(),
    }
}

fn accept_params(qpn: u32) -> AcceptParams {
    AcceptParams {
        local_qpn: qpn,
        starting_psn: 0x2000,
        qkey: 0,
        responder_resources: 4,
        initiator_depth: 4,
        target_ack_delay: 15,
        rnr_retry_count: 7,
        srq: false,
        private_data: b"welcome".to_vec(),
    }
}

/// A sent MAD on the wire.
#[derive(Debug, Clone)]
struct Sent {
    from: usize,
    attr: u16,
}

/// Two agents, a wire that can lose chosen messages, and applications that accept,
/// establish and answer disconnects unless told not to.
struct World {
    now: Instant,
    agents: [CmAgent; 2],
    events: [Vec<(Instant, CmEvent)>; 2],
    /// (sender, attribute, how many more of them to drop).
    drops: Vec<(usize, u16, usize)>,
    /// Drop everything a side sends (a vanished peer).
    dead: [bool; 2],
    sent: Vec<Sent>,
    auto_accept: bool,
    auto_establish: bool,
    auto_disconnect_reply: bool,
}

impl World {
    fn new() -> World {
        let cfg = |i: u32| AgentConfig {
            local_ca_guid: 0x0200_00ff_fe00_0000 | u64::from(i),
            tid_high: 0x100 + i,
            first_id: 0x1000 * (i + 1),
            max_connections: 64,
            ..AgentConfig::default()
        };
        World {
            now: Instant::from_nanos(1_000_000_000),
            agents: [CmAgent::new(cfg(0)), CmAgent::new(cfg(1))],
            events: [Vec::new(), Vec::new()],
            drops: Vec::new(),
            dead: [false, false],
            sent: Vec::new(),
            auto_accept: true,
            auto_establish: true,
            auto_disconnect_reply: true,
        }
    }

    fn side(ip: IpAddr) -> Option<usize> {
        (0..2).find(|&s| addr(s) == ip)
    }

    /// Applications react to new events.
    fn react(&mut self, side: usize, ev: &CmEvent) {
        let now = self.now;
        let agent = &mut self.agents[side];
        match ev {
            CmEvent::ReqReceived { id, .. } if self.auto_accept => {
                let qpn = if side == B { QPN_B } else { QPN_A };
                agent.accept(now, *id, &accept_params(qpn)).unwrap();
            }
            CmEvent::RepReceived { id, .. } if self.auto_establish => {
                agent.establish(now, *id).unwrap();
            }
            CmEvent::DisconnectRequested { id } if self.auto_disconnect_reply => {
                agent.disconnect(now, *id, &[]).unwrap();
            }
            _ => {}
        }
    }

    /// Delivers every queued MAD and event until both agents are quiet (bounded).
    fn pump(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            for side in [A, B] {
                while let Some(ev) = self.agents[side].poll_event() {
                    moved = true;
                    self.events[side].push((self.now, ev.clone()));
                    self.react(side, &ev);
                }
                while let Some((to_ip, mad)) = self.agents[side].poll_transmit() {
                    moved = true;
                    let attr = u16::from_be_bytes([mad[16], mad[17]]);
                    let Some(to) = World::side(to_ip) else {
                        continue;
                    };
                    self.sent.push(Sent { from: side, attr });
                    if self.dead[side] || self.dead[to] {
                        continue;
                    }
                    if let Some(d) = self
                        .drops
                        .iter_mut()
                        .find(|d| d.0 == side && d.1 == attr && d.2 > 0)
                    {
                        d.2 -= 1;
                        continue;
                    }
                    self.agents[to].handle_mad(self.now, addr(side), &mad);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the agents never went quiet");
    }

    /// Pumps, then advances virtual time to each next deadline until there are none or
    /// `limit` of virtual time has passed (bounded).
    fn run(&mut self, limit: Duration) {
        let end = self.now + limit;
        self.pump();
        for _ in 0..10_000 {
            let next = [A, B]
                .iter()
                .filter_map(|&s| self.agents[s].poll_timeout())
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    for s in [A, B] {
                        self.agents[s].handle_timeout(self.now);
                    }
                    self.pump();
                }
                _ => {
                    self.now = end;
                    return;
                }
            }
        }
        panic!("timers never settled");
    }

    fn count(&self, from: usize, attr: u16) -> usize {
        self.sent
            .iter()
            .filter(|s| s.from == from && s.attr == attr)
            .count()
    }

    fn has(&self, side: usize, f: impl Fn(&CmEvent) -> bool) -> bool {
        self.events[side].iter().any(|(_, e)| f(e))
    }

    fn established(&self, side: usize, id: Option<ConnId>) -> bool {
        self.has(
            side,
            |e| matches!(e, CmEvent::Established { id: i } if id.is_none_or(|x| x == *i)),
        )
    }

    /// The connection ID B gave the REQ.
    fn passive_id(&self) -> ConnId {
        self.events[B]
            .iter()
            .find_map(|(_, e)| match e {
                CmEvent::ReqReceived { id, .. } => Some(*id),
                _ => None,
            })
            .expect("B got a REQ")
    }
}

fn listening_world() -> World {
    let mut w = World::new();
    w.agents[B].listen(SERVICE, None).unwrap();
    w
}

/// Connects A → B; returns A's ID.
fn connect(w: &mut World) -> ConnId {
    let now = w.now;
    let id = w.agents[A]
        .connect(now, &connect_params(B, A, QPN_A))
        .unwrap();
    w.run(Duration::from_millis(1));
    id
}

#[test]
fn connect_and_disconnect_from_the_active_side() {
    let mut w = listening_world();
    let a = connect(&mut w);
    let b = w.passive_id();
    assert!(w.established(A, Some(a)) && w.established(B, Some(b)));
    assert_eq!(w.agents[A].state(a), Some(CmState::Established));
    assert_eq!(w.agents[B].state(b), Some(CmState::Established));
    // REQ, REP, RTU exactly once each.
    assert_eq!(
        (
            w.count(A, cm_attr::REQ),
            w.count(B, cm_attr::REP),
            w.count(A, cm_attr::RTU)
        ),
        (1, 1, 1)
    );
    // The REQ carried what A asked for; the REP what B answered.
    let req = w.events[B].iter().find_map(|(_, e)| match e {
        CmEvent::ReqReceived { req, from, .. } => Some((req.clone(), *from)),
        _ => None,
    });
    let (req, from) = req.unwrap();
    assert_eq!(from, addr(A));
    assert_eq!((req.local_qpn, req.service_id), (QPN_A, SERVICE));
    assert_eq!(&req.private_data[..5], b"hello");
    let rep = w.events[A].iter().find_map(|(_, e)| match e {
        CmEvent::RepReceived { rep, .. } => Some(rep.clone()),
        _ => None,
    });
    let rep = rep.unwrap();
    assert_eq!((rep.local_qpn, rep.starting_psn), (QPN_B, 0x2000));
    assert_eq!(&rep.private_data[..7], b"welcome");

    let t0 = w.now;
    w.agents[A].disconnect(t0, a, b"bye").unwrap();
    w.run(Duration::from_millis(1));
    assert!(w.has(
        B,
        |e| matches!(e, CmEvent::DisconnectRequested { id } if *id == b)
    ));
    assert!(w.has(A, |e| matches!(e, CmEvent::Disconnected { id } if *id == a)));
    assert!(w.has(B, |e| matches!(e, CmEvent::Disconnected { id } if *id == b)));
    assert_eq!(w.agents[A].state(a), Some(CmState::Timewait));
    assert_eq!(w.agents[B].state(b), Some(CmState::Timewait));
    assert_eq!(
        (w.count(A, cm_attr::DREQ), w.count(B, cm_attr::DREP)),
        (1, 1)
    );
    // Timewait ends, and not before its time (the path's ACK timeout).
    w.run(Duration::from_secs(1));
    for (side, id) in [(A, a), (B, b)] {
        let (at, _) = w.events[side]
            .iter()
            .find(|(_, e)| matches!(e, CmEvent::TimewaitExit { id: i } if *i == id))
            .expect("timewait exit");
        assert!(at.saturating_duration_since(t0) >= cm_timeout(14));
        assert_eq!(w.agents[side].state(id), None);
        assert_eq!(w.agents[side].connections(), 0);
    }
}

#[test]
fn connect_and_disconnect_from_the_passive_side() {
    let mut w = listening_world();
    let a = connect(&mut w);
    let b = w.passive_id();
    let now = w.now;
    w.agents[B].disconnect(now, b, &[]).unwrap();
    w.run(Duration::from_millis(1));
    assert!(w.has(
        A,
        |e| matches!(e, CmEvent::DisconnectRequested { id } if *id == a)
    ));
    assert!(w.has(A, |e| matches!(e, CmEvent::Disconnected { .. })));
    assert!(w.has(B, |e| matches!(e, CmEvent::Disconnected { .. })));
    assert_eq!(
        (w.count(B, cm_attr::DREQ), w.count(A, cm_attr::DREP)),
        (1, 1)
    );
    w.run(Duration::from_secs(1));
    assert!(w.has(A, |e| matches!(e, CmEvent::TimewaitExit { .. })));
    assert!(w.has(B, |e| matches!(e, CmEvent::TimewaitExit { .. })));
    // A fresh connection after the old one is gone gets a new ID on both sides.
    let a2 = connect(&mut w);
    assert_ne!(a2, a);
    assert!(w.established(A, Some(a2)));
}

#[test]
fn every_lost_message_is_retried_and_the_connection_completes() {
    for (sender, attr) in [
        (A, cm_attr::REQ),
        (B, cm_attr::REP),
        (A, cm_attr::RTU),
        (A, cm_attr::DREQ),
        (B, cm_attr::DREP),
    ] {
        let what = cm_attr::name(attr).unwrap();
        let mut w = listening_world();
        w.drops.push((sender, attr, 1));
        let now = w.now;
        let a = w.agents[A]
            .connect(now, &connect_params(B, A, QPN_A))
            .unwrap();
        w.run(Duration::from_millis(200));
        assert!(w.established(A, Some(a)), "{what} lost: A not established");
        assert!(w.established(B, None), "{what} lost: B not established");
        let now = w.now;
        w.agents[A].disconnect(now, a, &[]).unwrap();
        w.run(Duration::from_millis(200));
        assert!(
            w.has(A, |e| matches!(e, CmEvent::Disconnected { .. })),
            "{what} lost: A not disconnected"
        );
        assert!(w.has(B, |e| matches!(e, CmEvent::Disconnected { .. })));
        assert_eq!(w.drops[0].2, 0, "{what} was never dropped");
        assert!(w.count(sender, attr) >= 2, "{what} lost: never sent again");
        // No timeouts were reported.
        for s in [A, B] {
            assert!(!w.has(s, |e| matches!(
                e,
                CmEvent::Unreachable { .. } | CmEvent::DisconnectTimeout { .. }
            )));
        }
    }
}

#[test]
fn a_vanished_passive_side_ends_in_unreachable_after_bounded_retries() {
    let mut w = listening_world();
    w.dead[B] = true;
    let t0 = w.now;
    let a = w.agents[A]
        .connect(t0, &connect_params(B, A, QPN_A))
        .unwrap();
    w.run(Duration::from_secs(10));
    let (at, _) = w.events[A]
        .iter()
        .find(|(_, e)| matches!(e, CmEvent::Unreachable { id } if *id == a))
        .expect("unreachable");
    // 1 + max_cm_retries REQs, each waited for the response timeout plus twice the
    // packet lifetime (exponent 0 here); then a REJ "timeout".
    assert_eq!(w.count(A, cm_attr::REQ), 1 + RETRIES as usize);
    assert_eq!(
        at.saturating_duration_since(t0),
        (cm_timeout(RESPONSE) + 2 * cm_timeout(0)) * (1 + RETRIES as u32)
    );
    assert_eq!(w.count(A, cm_attr::REJ), 1);
    assert_eq!(w.agents[A].state(a), None);
    assert_eq!(w.agents[A].poll_timeout(), None, "no timer left");
}

#[test]
fn a_vanished_active_side_ends_in_unreachable_on_the_passive_side() {
    let mut w = listening_world();
    // A sends its REQ, then disappears: B's REP is never answered.
    w.drops.push((A, cm_attr::RTU, usize::MAX));
    w.auto_establish = false;
    let now = w.now;
    w.agents[A]
        .connect(now, &connect_params(B, A, QPN_A))
        .unwrap();
    w.pump();
    w.dead[A] = true;
    w.run(Duration::from_secs(10));
    let b = w.passive_id();
    assert!(w.has(B, |e| matches!(e, CmEvent::Unreachable { id } if *id == b)));
    assert_eq!(w.count(B, cm_attr::REP), 1 + RETRIES as usize);
    assert_eq!(w.agents[B].connections(), 0);
}

#[test]
fn an_unanswered_dreq_ends_in_timewait_then_exit() {
    let mut w = listening_world();
    let a = connect(&mut w);
    w.dead[B] = true;
    let now = w.now;
    w.agents[A].disconnect(now, a, &[]).unwrap();
    w.run(Duration::from_secs(10));
    assert_eq!(w.count(A, cm_attr::DREQ), 1 + RETRIES as usize);
    assert!(w.has(
        A,
        |e| matches!(e, CmEvent::DisconnectTimeout { id } if *id == a)
    ));
    assert!(w.has(A, |e| matches!(e, CmEvent::TimewaitExit { id } if *id == a)));
    assert_eq!(w.agents[A].connections(), 0);
}

#[test]
fn reject_with_private_data() {
    let mut w = listening_world();
    w.auto_accept = false;
    let now = w.now;
    let a = w.agents[A]
        .connect(now, &connect_params(B, A, QPN_A))
        .unwrap();
    w.pump();
    let b = w.passive_id();
    assert_eq!(w.agents[B].state(b), Some(CmState::ReqRcvd));
    let now = w.now;
    w.agents[B]
        .reject(now, b, rej_reason::CONSUMER_DEFINED, b"go away")
        .unwrap();
    w.run(Duration::from_secs(1));
    let got = w.events[A].iter().find_map(|(_, e)| match e {
        CmEvent::Rejected {
            id,
            reason,
            private_data,
        } if *id == a => Some((*reason, private_data.clone())),
        _ => None,
    });
    let (reason, pd) = got.expect("A saw the REJ");
    assert_eq!(reason, rej_reason::CONSUMER_DEFINED);
    assert_eq!(&pd[..7], b"go away");
    assert!(pd[7..].iter().all(|&b| b == 0));
    assert_eq!(w.agents[A].connections() + w.agents[B].connections(), 0);
    // Nothing retried after the REJ.
    assert_eq!(w.count(A, cm_attr::REQ), 1);
    // Too much private data is refused, not truncated.
    let mut p = connect_params(B, A, QPN_A);
    p.private_data = vec![1; 93];
    assert!(w.agents[A].connect(now, &p).is_err());
}

#[test]
fn no_listener_means_invalid_service_id() {
    let mut w = World::new();
    let now = w.now;
    let a = w.agents[A]
        .connect(now, &connect_params(B, A, QPN_A))
        .unwrap();
    w.run(Duration::from_secs(1));
    assert!(w.has(A, |e| matches!(
        e,
        CmEvent::Rejected { id, reason, .. } if *id == a && *reason == rej_reason::INVALID_SERVICE_ID
    )));
}

#[test]
fn duplicate_req_is_ignored_then_answered_with_the_rep() {
    let mut w = listening_world();
    w.auto_accept = false;
    let now = w.now;
    w.agents[A]
        .connect(now, &connect_params(B, A, QPN_A))
        .unwrap();
    // Capture A's REQ to replay it.
    let (to, req) = w.agents[A].poll_transmit().unwrap();
    assert_eq!(to, addr(B));
    w.agents[B].handle_mad(now, addr(A), &req);
    w.agents[B].handle_mad(now, addr(A), &req);
    w.pump();
    // One connection, one event, no answer yet.
    assert_eq!(w.agents[B].connections(), 1);
    let reqs = w.events[B]
        .iter()
        .filter(|(_, e)| matches!(e, CmEvent::ReqReceived { .. }))
        .count();
    assert_eq!(reqs, 1);
    let b = w.passive_id();
    // Accept; the REP goes out; a duplicate REQ now resends the same REP.
    w.agents[B].accept(now, b, &accept_params(QPN_B)).unwrap();
    let (_, rep1) = w.agents[B].poll_transmit().unwrap();
    w.agents[B].handle_mad(now, addr(A), &req);
    let (_, rep2) = w.agents[B].poll_transmit().unwrap();
    assert_eq!(rep1, rep2);
    assert_eq!(u16::from_be_bytes([rep1[16], rep1[17]]), cm_attr::REP);
    // A takes the REP once; a duplicate REP after establishment resends the RTU.
    w.agents[A].handle_mad(now, addr(B), &rep1);
    w.pump();
    assert!(w.established(A, None) && w.established(B, None));
    let rtus = w.count(A, cm_attr::RTU);
    w.agents[A].handle_mad(now, addr(B), &rep2);
    w.pump();
    assert_eq!(w.count(A, cm_attr::RTU), rtus + 1);
    let established = w.events[A]
        .iter()
        .filter(|(_, e)| matches!(e, CmEvent::Established { .. }))
        .count();
    assert_eq!(established, 1, "no second Established");
}

#[test]
fn mra_extends_the_wait_beyond_the_retries() {
    let mut w = listening_world();
    w.auto_accept = false;
    let now = w.now;
    let a = w.agents[A]
        .connect(now, &connect_params(B, A, QPN_A))
        .unwrap();
    w.pump();
    let b = w.passive_id();
    // B asks for 4.096 µs × 2^18 ≈ 1.07 s, far beyond A's 4 × 16.8 ms of retries.
    w.agents[B].delay(now, b, 18).unwrap();
    w.run(Duration::from_millis(500));
    assert_eq!(w.agents[A].state(a), Some(CmState::MraReqRcvd));
    assert_eq!(w.agents[B].state(b), Some(CmState::MraReqSent));
    assert_eq!(w.count(A, cm_attr::REQ), 1, "no resend while MRAed");
    let now = w.now;
    w.agents[B].accept(now, b, &accept_params(QPN_B)).unwrap();
    w.run(Duration::from_millis(10));
    assert!(w.established(A, Some(a)) && w.established(B, Some(b)));
}

#[test]
fn stale_connection_is_rejected() {
    let mut w = listening_world();
    connect(&mut w);
    let b = w.passive_id();
    // A "restarted" peer at A's address: a second agent whose REQ names the same QPN
    // under a new communication ID while B still has the old connection.
    let mut a2 = CmAgent::new(AgentConfig {
        first_id: 0x9000,
        ..AgentConfig::default()
    });
    let now = w.now;
    let id2 = a2.connect(now, &connect_params(B, A, QPN_A)).unwrap();
    let (_, req) = a2.poll_transmit().unwrap();
    w.agents[B].handle_mad(now, addr(A), &req);
    let (to, rej) = w.agents[B].poll_transmit().expect("B answers");
    assert_eq!(to, addr(A));
    a2.handle_mad(now, addr(B), &rej);
    let ev = a2.poll_event();
    assert!(
        matches!(ev, Some(CmEvent::Rejected { id, reason, .. }) if id == id2 && reason == rej_reason::STALE_CONN),
        "{ev:?}"
    );
    // B's established connection is untouched.
    assert_eq!(w.agents[B].state(b), Some(CmState::Established));
    assert_eq!(w.agents[B].connections(), 1);
}

#[test]
fn duplicate_dreq_in_timewait_resends_the_drep() {
    let mut w = listening_world();
    let a = connect(&mut w);
    let now = w.now;
    w.agents[A].disconnect(now, a, &[]).unwrap();
    let (_, dreq) = w.agents[A].poll_transmit().unwrap();
    w.agents[B].handle_mad(now, addr(A), &dreq);
    w.pump();
    let dreps = w.count(B, cm_attr::DREP);
    assert_eq!(dreps, 1);
    w.agents[B].handle_mad(now, addr(A), &dreq);
    w.pump();
    assert_eq!(w.count(B, cm_attr::DREP), 2);
    // A DREQ for a connection B never had is answered too.
    let mut unknown = CmMad::parse(&dreq).unwrap();
    if let CmMessage::Dreq(d) = &mut unknown.message {
        d.remote_comm_id ^= 0x5555;
    }
    w.agents[B].handle_mad(now, addr(A), &unknown.to_bytes());
    w.pump();
    assert_eq!(w.count(B, cm_attr::DREP), 3);
}

#[test]
fn lap_is_refused_with_apr_unsupported() {
    let mut w = listening_world();
    let a = connect(&mut w);
    let b = w.passive_id();
    let lap = LapRepr {
        local_comm_id: a.0,
        remote_comm_id: b.0,
        remote_qpn: QPN_B,
        remote_cm_response_timeout: RESPONSE,
        alternate_path: PathRepr::default(),
        private_data: [0; 168],
    };
    let mad = CmMad::new(0x77, CmMessage::Lap(lap));
    w.agents[B].handle_mad(w.now, addr(A), &mad.to_bytes());
    let (to, apr) = w.agents[B].poll_transmit().expect("an APR");
    assert_eq!(to, addr(A));
    let apr = CmMad::parse(&apr).unwrap();
    assert_eq!(apr.header.transaction_id, 0x77);
    match apr.message {
        CmMessage::Apr(r) => {
            assert_eq!(r.status, apr_status::UNSUPPORTED);
            assert_eq!((r.local_comm_id, r.remote_comm_id), (b.0, a.0));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w.agents[B].state(b), Some(CmState::Established));
}

#[test]
fn sidr_request_and_response() {
    let mut w = World::new();
    let service = PortSpace::Udp.service_id(7174);
    w.agents[B]
        .listen(
            service,
            Some(SidrAnswer {
                qpn: 0x42,
                qkey: 0x0123_4567,
            }),
        )
        .unwrap();
    let params = |service_id| SidrParams {
        remote: addr(B),
        service_id,
        pkey: 0xffff,
        timeout: RESPONSE,
        max_retries: RETRIES,
        private_data: vec![9; 36],
    };
    let now = w.now;
    w.drops.push((A, cm_attr::SIDR_REQ, 1)); // the first is lost
    let id = w.agents[A].sidr_request(now, &params(service)).unwrap();
    w.run(Duration::from_secs(1));
    assert!(w.has(A, |e| matches!(
        e,
        CmEvent::SidrReply { id: i, status, qpn, qkey }
            if *i == id && *status == sidr_status::SUCCESS && *qpn == 0x42 && *qkey == 0x0123_4567
    )));
    assert!(w.has(
        B,
        |e| matches!(e, CmEvent::SidrReqReceived { from, .. } if *from == addr(A))
    ));
    assert_eq!(w.count(A, cm_attr::SIDR_REQ), 2);
    // An unknown service: UNSUPPORTED.
    let now = w.now;
    let id = w.agents[A]
        .sidr_request(now, &params(PortSpace::Udp.service_id(1)))
        .unwrap();
    w.run(Duration::from_secs(1));
    assert!(w.has(A, |e| matches!(
        e,
        CmEvent::SidrReply { id: i, status, .. } if *i == id && *status == sidr_status::UNSUPPORTED
    )));
    assert_eq!(w.agents[A].connections() + w.agents[B].connections(), 0);
}

#[test]
fn req_waits_briefly_for_a_listener() {
    let mut w = World::new();
    // No listener yet: the REQ is held, not rejected.
    let a = connect(&mut w);
    assert!(!w.has(A, |e| matches!(e, CmEvent::Rejected { .. })));
    // The server listens within the grace: the held REQ is reported to it.
    w.agents[B].listen(SERVICE, None).unwrap();
    w.run(Duration::from_millis(100));
    assert!(w.has(B, |e| matches!(e, CmEvent::ReqReceived { .. })));
    assert!(!w.has(A, |e| matches!(e, CmEvent::Rejected { id, .. } if *id == a)));
    // Nobody listens on another service: rejected once the grace is over.
    let mut w = World::new();
    let a = connect(&mut w);
    w.run(Duration::from_millis(10));
    assert!(!w.has(A, |e| matches!(e, CmEvent::Rejected { .. })));
    w.run(Duration::from_millis(100));
    assert!(w.has(A, |e| matches!(e, CmEvent::Rejected { id, .. } if *id == a)));
}

#[test]
fn sidr_req_waits_briefly_for_a_listener() {
    let service = PortSpace::Udp.service_id(7175);
    let params = SidrParams {
        remote: addr(B),
        service_id: service,
        pkey: 0xffff,
        timeout: RESPONSE,
        max_retries: RETRIES,
        private_data: vec![],
    };
    // The server listens within the grace: answered SUCCESS, not UNSUPPORTED.
    let mut w = World::new();
    let now = w.now;
    let id = w.agents[A].sidr_request(now, &params).unwrap();
    w.run(Duration::from_millis(10));
    assert!(!w.has(A, |e| matches!(e, CmEvent::SidrReply { .. })));
    w.agents[B]
        .listen(
            service,
            Some(SidrAnswer {
                qpn: 0x42,
                qkey: 0x0123_4567,
            }),
        )
        .unwrap();
    w.run(Duration::from_millis(100));
    assert!(w.has(A, |e| matches!(
        e,
        CmEvent::SidrReply { id: i, status, .. } if *i == id && *status == sidr_status::SUCCESS
    )));
    // Nobody listens: UNSUPPORTED, but only once the grace is over.
    let mut w = World::new();
    let now = w.now;
    let id = w.agents[A].sidr_request(now, &params).unwrap();
    w.run(Duration::from_millis(10));
    assert!(!w.has(A, |e| matches!(e, CmEvent::SidrReply { .. })));
    w.run(Duration::from_millis(100));
    assert!(w.has(A, |e| matches!(
        e,
        CmEvent::SidrReply { id: i, status, .. } if *i == id && *status == sidr_status::UNSUPPORTED
    )));
}

#[test]
fn deferred_sidr_answer() {
    let mut w = World::new();
    let service = PortSpace::Udp.service_id(7174);
    let listener = w.agents[B].listen_sidr_deferred(service).unwrap();
    let now = w.now;
    let id = w.agents[A]
        .sidr_request(
            now,
            &SidrParams {
                remote: addr(B),
                service_id: service,
                pkey: 0xffff,
                timeout: RESPONSE,
                max_retries: RETRIES,
                private_data: vec![9; 36],
            },
        )
        .unwrap();
    w.run(Duration::from_millis(1));
    // Reported, not answered yet.
    let req = w.events[B]
        .iter()
        .find_map(|(_, e)| match e {
            CmEvent::SidrReqReceived {
                id,
                listener: l,
                from,
                ..
            } if *l == listener && *from == addr(A) => Some(*id),
            _ => None,
        })
        .expect("the request is reported");
    assert!(!w.has(A, |e| matches!(e, CmEvent::SidrReply { .. })));
    let now = w.now;
    w.agents[B]
        .sidr_answer(
            now,
            req,
            SidrAnswer {
                qpn: 0x77,
                qkey: 0x0123_4567,
            },
        )
        .unwrap();
    // Answered once only.
    assert!(w.agents[B]
        .sidr_answer(now, req, SidrAnswer { qpn: 1, qkey: 1 })
        .is_err());
    w.run(Duration::from_secs(1));
    assert!(w.has(A, |e| matches!(
        e,
        CmEvent::SidrReply { id: i, status, qpn, .. }
            if *i == id && *status == sidr_status::SUCCESS && *qpn == 0x77
    )));
}

#[test]
fn commands_in_the_wrong_state_are_refused() {
    let mut w = listening_world();
    let a = connect(&mut w);
    let now = w.now;
    assert!(w.agents[A].accept(now, a, &accept_params(QPN_A)).is_err());
    assert!(w.agents[A].establish(now, a).is_err());
    assert!(w.agents[A].establish(now, ConnId(12345)).is_err());
    assert!(
        w.agents[B].listen(SERVICE, None).is_err(),
        "second listener"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes, and valid CM MADs with arbitrary changes, never panic an agent
    /// (listening, with a connection established), and its timers still settle.
    #[test]
    fn arbitrary_mads_never_panic(
        junk in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8),
        flips in proptest::collection::vec((0usize..256, any::<u8>()), 0..16),
        attr in prop_oneof![Just(0x10u16), Just(0x11), Just(0x12), Just(0x13), Just(0x14),
                            Just(0x15), Just(0x16), Just(0x17), Just(0x18), Just(0x19), Just(0x1a)],
    ) {
        let mut w = listening_world();
        let a = connect(&mut w);
        let b = w.passive_id();
        let now = w.now;
        for j in &junk {
            w.agents[B].handle_mad(now, addr(A), j);
        }
        // A CM MAD with the right class and IDs that name the live connection, then
        // arbitrary bytes changed.
        let mut mad = [0u8; 256];
        mad[0] = 1;
        mad[1] = 7;
        mad[2] = 2;
        mad[3] = 3;
        mad[16..18].copy_from_slice(&attr.to_be_bytes());
        mad[24..28].copy_from_slice(&a.0.to_be_bytes());
        mad[28..32].copy_from_slice(&b.0.to_be_bytes());
        for (at, v) in &flips {
            mad[*at] = *v;
        }
        w.agents[B].handle_mad(now, addr(A), &mad);
        w.agents[A].handle_mad(now, addr(B), &mad);
        w.run(Duration::from_secs(30));
        // Every timer ran: nothing is left overdue.
        let now = w.now;
        prop_assert!(w.agents.iter().all(|ag| ag.poll_timeout().is_none_or(|t| t > now)));
    }
}

/// A Get(ClassPortInfo) is answered to its sender with GetResp, the same transaction ID and
/// the CM class's ClassPortInfo (IBA 13.4.5, 13.4.8.1); any other method on the attribute
/// (here a Send, and a GetResp coming back) is dropped and counted.
#[test]
fn class_port_info_get_is_answered_with_get_resp() {
    use uroce_proto::cm::RESP_TIME_VALUE;
    use uroce_wire::cm::ClassPortInfoRepr;
    use uroce_wire::mad;
    let mut w = World::new();
    let mut get = CmMad::new(
        0x1234_5678_9abc,
        CmMessage::ClassPortInfo(ClassPortInfoRepr::default()),
    );
    get.header.method = mad::METHOD_GET;
    w.agents[B].handle_mad(w.now, addr(A), &get.to_bytes());
    let (to, resp) = w.agents[B].poll_transmit().expect("a GetResp");
    assert_eq!(to, addr(A));
    assert!(w.agents[B].poll_transmit().is_none());
    let resp = CmMad::parse(&resp).unwrap();
    resp.validate().unwrap();
    assert_eq!(
        (
            resp.header.method,
            resp.header.response,
            resp.header.transaction_id,
            resp.header.attribute_id,
            resp.header.status
        ),
        (
            mad::METHOD_GET,
            true,
            0x1234_5678_9abc,
            cm_attr::CLASS_PORT_INFO,
            0
        )
    );
    assert_eq!(
        resp.message,
        CmMessage::ClassPortInfo(ClassPortInfoRepr {
            base_version: 1,
            class_version: 2,
            resp_time_value: RESP_TIME_VALUE,
            ..ClassPortInfoRepr::default()
        })
    );

    let ignored = w.agents[B].stats().ignored;
    let mut send = get;
    send.header.method = mad::METHOD_SEND;
    w.agents[B].handle_mad(w.now, addr(A), &send.to_bytes());
    w.agents[B].handle_mad(w.now, addr(A), &resp.to_bytes());
    assert!(w.agents[B].poll_transmit().is_none());
    assert_eq!(w.agents[B].stats().ignored, ignored + 2);
}

#[test]
fn communication_ids_stay_in_the_configured_range() {
    use uroce_proto::cm::{CmError, IdRange};
    assert_eq!(AgentConfig::default().id_range, IdRange::ALL);
    assert!(IdRange::new(0, 5).is_none() && IdRange::new(6, 5).is_none());
    assert_eq!(
        IdRange::from_range(0x0300_0000..=0x03ff_ffff)
            .unwrap()
            .count(),
        1 << 24
    );
    // Four IDs, allotment starting at the third: 12, 13, then wrapping to 10, 11.
    let range = IdRange::new(10, 13).unwrap();
    let mut a = CmAgent::new(AgentConfig {
        first_id: 12,
        id_range: range,
        ..AgentConfig::default()
    });
    let service = |i: u64| SERVICE + i;
    let ids: Vec<u32> = (0..4)
        .map(|i| a.listen(service(i), None).unwrap().0)
        .collect();
    assert_eq!(ids, [12, 13, 10, 11]);
    // The range is full.
    assert_eq!(a.listen(service(4), None), Err(CmError::NoIdsLeft));
    let now = Instant::from_nanos(1);
    assert_eq!(
        a.connect(now, &connect_params(B, A, QPN_A)),
        Err(CmError::NoIdsLeft)
    );
    // A freed ID comes back, still inside the range.
    a.stop_listening(ConnId(13)).unwrap();
    assert_eq!(a.listen(service(5), None), Ok(ConnId(13)));
    a.stop_listening(ConnId(10)).unwrap();
    let c = a.connect(now, &connect_params(B, A, QPN_A)).unwrap();
    assert_eq!(c, ConnId(10));
    // A first ID outside the range starts at its first; a one-ID range wraps onto itself.
    let mut b = CmAgent::new(AgentConfig {
        first_id: 1,
        id_range: IdRange::new(u32::MAX, u32::MAX).unwrap(),
        ..AgentConfig::default()
    });
    assert_eq!(b.listen(service(0), None), Ok(ConnId(u32::MAX)));
    assert_eq!(b.listen(service(1), None), Err(CmError::NoIdsLeft));
    b.stop_listening(ConnId(u32::MAX)).unwrap();
    assert_eq!(b.listen(service(1), None), Ok(ConnId(u32::MAX)));
}
