//! A CM listener under a flood of REQs (well-formed, with hostile timers, from one host
//! and from many) and of arbitrary MADs: the agent's state stays within its bounds
//! (unanswered requests per listener, unestablished connections per peer address, the
//! longest wait a peer can ask for), forgets what the requester has given up on, and a
//! legitimate requester still connects.

use std::net::IpAddr;
use std::time::Duration;

use uroce_proto::cm::table::CmState;
use uroce_proto::cm::{
    cm_timeout, AcceptParams, AgentConfig, CmAgent, CmEvent, ConnId, ConnectParams,
};
use uroce_proto::time::Instant;
use uroce_wire::cm::rdma_cm::{gid_of, PortSpace};
use uroce_wire::cm::{CmMad, CmMessage, PathRepr, ReqRepr};
use uroce_wire::mad::MAD_LEN;

const SERVICE: u64 = PortSpace::Tcp.service_id(7471);
const SERVER: [u8; 4] = [10, 0, 0, 1];
const CLIENT: [u8; 4] = [10, 0, 0, 2];
const FLOODER: [u8; 4] = [10, 0, 0, 66];

fn ip(a: [u8; 4]) -> IpAddr {
    IpAddr::from(a)
}

/// A deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn connect_params(from: IpAddr, to: IpAddr, qpn: u32) -> ConnectParams {
    ConnectParams {
        remote: to,
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
            local_gid: gid_of(from),
            remote_gid: gid_of(to),
            hop_limit: 64,
            local_ack_timeout: 14,
            ..PathRepr::default()
        },
        pkey: 0xffff,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        cm_response_timeout: 16,
        packet_life_time: 0,
        max_cm_retries: 3,
        srq: false,
        private_data: Vec::new(),
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
        private_data: Vec::new(),
    }
}

/// A well-formed REQ as a real requester sends it, to vary.
fn template_req() -> ReqRepr {
    let mut a = CmAgent::new(AgentConfig::default());
    a.connect(
        Instant::from_nanos(0),
        &connect_params(ip(FLOODER), ip(SERVER), 0x99),
    )
    .unwrap();
    let (_, mad) = a.poll_transmit().unwrap();
    match CmMad::parse(&mad).unwrap().message {
        CmMessage::Req(r) => r,
        m => panic!("not a REQ: {m:?}"),
    }
}

/// A flood REQ: another communication ID and QPN each time, the longest timers IBA
/// allows and 15 retries.
fn flood_req(t: &ReqRepr, rng: &mut Rng) -> [u8; MAD_LEN] {
    let mut r = *t;
    r.local_comm_id = (rng.next() as u32) | 1;
    r.local_qpn = (rng.next() as u32) & 0x00ff_ffff;
    r.remote_cm_response_timeout = 31;
    r.local_cm_response_timeout = 31;
    r.max_cm_retries = 15;
    r.primary_path.local_ack_timeout = 31;
    CmMad::new(rng.next(), CmMessage::Req(r)).to_bytes()
}

/// The server's agent listening on [`SERVICE`].
fn server() -> (CmAgent, ConnId) {
    let mut s = CmAgent::new(AgentConfig {
        first_id: 0x5000,
        ..AgentConfig::default()
    });
    let l = s.listen(SERVICE, None).unwrap();
    (s, l)
}

/// Drains `agent`'s events and MADs; returns the REQs it reported.
fn drain(agent: &mut CmAgent) -> Vec<ConnId> {
    while agent.poll_transmit().is_some() {}
    let mut reqs = Vec::new();
    while let Some(e) = agent.poll_event() {
        if let CmEvent::ReqReceived { id, .. } = e {
            reqs.push(id);
        }
    }
    reqs
}

/// A legitimate client connects to `server` (whose application accepts the client's
/// request) at `now`; returns whether both sides end established.
fn legitimate_connect(server: &mut CmAgent, now: Instant) -> bool {
    let mut client = CmAgent::new(AgentConfig {
        first_id: 0x7000,
        ..AgentConfig::default()
    });
    let cid = client
        .connect(now, &connect_params(ip(CLIENT), ip(SERVER), 0x11))
        .unwrap();
    let (mut server_up, mut client_up) = (false, false);
    // Bounded: a handshake is three messages.
    for _ in 0..10 {
        while let Some((_, mad)) = client.poll_transmit() {
            server.handle_mad(now, ip(CLIENT), &mad);
        }
        while let Some(e) = server.poll_event() {
            match e {
                CmEvent::ReqReceived { id, .. } => {
                    server.accept(now, id, &accept_params(0x12)).unwrap();
                }
                CmEvent::Established { .. } => server_up = true,
                _ => {}
            }
        }
        while let Some((to, mad)) = server.poll_transmit() {
            if to == ip(CLIENT) {
                client.handle_mad(now, ip(SERVER), &mad);
            }
        }
        while let Some(e) = client.poll_event() {
            if let CmEvent::RepReceived { id, .. } = e {
                client.establish(now, id).unwrap();
                client_up = true;
            }
        }
    }
    client_up && server_up && client.state(cid) == Some(CmState::Established)
}

#[test]
fn a_req_flood_from_one_host_leaves_room_for_others_and_is_forgotten() {
    let config = AgentConfig::default();
    let (mut s, _) = server();
    let t = template_req();
    let mut rng = Rng(0x0005_eedf_100d);
    let now = Instant::from_nanos(1_000_000_000);
    const FLOOD: usize = 100_000;
    let started = std::time::Instant::now();
    let mut reported = 0;
    for i in 0..FLOOD {
        s.handle_mad(now, ip(FLOODER), &flood_req(&t, &mut rng));
        if i % 1000 == 0 {
            reported += drain(&mut s).len();
        }
    }
    reported += drain(&mut s).len();
    eprintln!(
        "{FLOOD} REQs from one address handled in {:?}",
        started.elapsed()
    );
    // The application never answers: what the agent holds is the per-peer bound.
    let cap = config.max_unestablished_per_peer;
    assert_eq!(s.connections(), cap);
    assert_eq!(reported, cap, "one event per request held");
    assert_eq!(s.stats().req_over_limit, (FLOOD - cap) as u64);
    // Another host still connects.
    assert!(
        legitimate_connect(&mut s, now),
        "the legitimate client connected"
    );
    assert_eq!(s.connections(), cap + 1);
    // The flooder's requests are forgotten once their requester would have given up (at
    // most max_unanswered_req), and answering one then fails cleanly.
    let deadline = s
        .poll_timeout()
        .expect("a deadline for the unanswered requests");
    assert!(deadline <= now + config.max_unanswered_req);
    let later = now + config.max_unanswered_req;
    s.handle_timeout(later);
    assert_eq!(s.stats().req_expired, cap as u64);
    assert_eq!(s.connections(), 1, "only the legitimate connection is left");
    let reqs_after = drain(&mut s);
    assert!(reqs_after.is_empty());
}

#[test]
fn a_flood_from_many_hosts_is_bounded_per_listener_then_forgotten() {
    let config = AgentConfig::default();
    let (mut s, _) = server();
    let t = template_req();
    let mut rng = Rng(0xf100d);
    let now = Instant::from_nanos(1_000_000_000);
    // 4000 requests from 400 addresses, 10 each: within every per-peer bound, beyond the
    // listener's.
    for host in 0..400u32 {
        let from = IpAddr::from([10, 1, (host >> 8) as u8, host as u8]);
        for _ in 0..10 {
            s.handle_mad(now, from, &flood_req(&t, &mut rng));
        }
    }
    let held = drain(&mut s).len();
    assert_eq!(held, config.max_pending_per_listener);
    assert_eq!(s.connections(), config.max_pending_per_listener);
    assert_eq!(
        s.stats().req_over_limit,
        4000 - config.max_pending_per_listener as u64
    );
    // The listener is full: a legitimate request now waits for room (dropped; its
    // requester sends it again) ...
    assert!(!legitimate_connect(&mut s, now));
    // ... which the flood's unanswered requests leave when their requesters give up.
    let later = now + config.max_unanswered_req;
    s.handle_timeout(later);
    assert_eq!(s.connections(), 0);
    assert!(legitimate_connect(&mut s, later));
}

#[test]
fn accepted_flood_requests_end_within_the_capped_waits() {
    // An application that accepts every request (as rping's server does): each flood
    // connection waits for an RTU that never comes, retrying its REP with the requester's
    // timeout, capped at max_peer_wait instead of IBA's 2.4 hours.
    let config = AgentConfig::default();
    let (mut s, _) = server();
    let t = template_req();
    let mut rng = Rng(0x00ac_ce97);
    let mut now = Instant::from_nanos(1_000_000_000);
    let mut accepted = 0;
    for _ in 0..1000 {
        s.handle_mad(now, ip(FLOODER), &flood_req(&t, &mut rng));
        while let Some(e) = s.poll_event() {
            if let CmEvent::ReqReceived { id, .. } = e {
                s.accept(now, id, &accept_params(0x100)).unwrap();
                accepted += 1;
            }
        }
        while s.poll_transmit().is_some() {}
    }
    // REP_SENT counts against the peer's bound: the flooder holds at most that many.
    assert_eq!(accepted, config.max_unestablished_per_peer);
    assert_eq!(s.connections(), config.max_unestablished_per_peer);
    let first = s.poll_timeout().expect("REP retry deadline");
    assert!(
        first <= now + config.max_peer_wait,
        "the REP retry waits at most max_peer_wait, not the requester's 2^31"
    );
    // Retries (15) run out within 16 capped waits, then the connections end.
    let end = now + config.max_peer_wait * 16 + Duration::from_secs(1);
    // Bounded: each step handles at least one deadline; 32 connections × 16 tries.
    for _ in 0..10_000 {
        match s.poll_timeout() {
            Some(d) if d <= end => {
                now = now.max(d);
                s.handle_timeout(now);
                while s.poll_transmit().is_some() {}
                while s.poll_event().is_some() {}
            }
            _ => break,
        }
    }
    assert_eq!(s.connections(), 0, "every unanswered REP gave up");
    assert!(legitimate_connect(&mut s, now));
}

#[test]
fn arbitrary_mads_leave_no_state() {
    let (mut s, _) = server();
    let mut rng = Rng(0x0bad_0bad);
    let now = Instant::from_nanos(1);
    for i in 0..50_000 {
        let mut mad = [0u8; MAD_LEN];
        for b in mad.iter_mut() {
            *b = rng.next() as u8;
        }
        if i % 2 == 0 {
            // A CM-class MAD header half the time, so the parser gets past the first check.
            mad[0..4].copy_from_slice(&[1, 7, 2, 3]);
        }
        s.handle_mad(now, ip(FLOODER), &mad);
    }
    let _ = drain(&mut s);
    assert_eq!(s.connections(), 0);
    assert!(s.stats().malformed > 0);
    assert!(legitimate_connect(&mut s, now));
    assert_eq!(cm_timeout(24), AgentConfig::default().max_peer_wait);
}
