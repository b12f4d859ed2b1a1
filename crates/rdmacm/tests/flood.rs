//! A listening RDMA-CM id on a real loopback device under a flood of CM REQs: well-formed
//! REQs (hostile timers, RDMA-CM address header) and random MADs, sent as QP1 datagrams
//! from plain UDP sockets on many source ports of one flooding address. The listener's
//! application accepts every request it gets, as rping's server does. The CM's state stays
//! bounded (the flooder holds at most its per-peer share of unestablished connections),
//! the process's memory does not grow with the flood, and a legitimate client on another
//! address connects, exchanges a SEND and disconnects meanwhile.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::*;
use uroce_net::seal_for;
use uroce_proto::cm::{AgentConfig, ConnectParams};
use uroce_rdmacm::{ConnParam, EventKind, PortSpace};
use uroce_verbs::QpType;
use uroce_wire::cm::rdma_cm::{gid_of, CmaHeader, PortSpace as WirePs, HEADER_LEN};
use uroce_wire::cm::{CmMad, CmMessage, PathRepr};
use uroce_wire::opcode::op;
use uroce_wire::{bth, deth, PacketRepr, Psn, ROCEV2_UDP_PORT};

const SERVER: &str = "127.0.222.1";
const CLIENT: &str = "127.0.222.2";
const FLOODER: &str = "127.0.222.66";
const PORT: u16 = 7700;
/// The GSI Q_Key (IBA 13.5.1).
const GSI_QKEY: u32 = 0x8001_0000;

/// Resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A well-formed RDMA-CM REQ MAD to SERVER:PORT from FLOODER, with a fresh communication
/// ID and QPN and the longest timers IBA allows.
fn flood_req(rng: &mut Rng) -> [u8; 256] {
    let (client, server) = (ip(FLOODER), ip(SERVER));
    let mut private_data = vec![0; HEADER_LEN];
    CmaHeader {
        version: 0,
        src_port: rng.next() as u16,
        src_ip: client,
        dst_ip: server,
    }
    .emit(&mut private_data)
    .unwrap();
    let p = ConnectParams {
        remote: server,
        service_id: WirePs::Tcp.service_id(PORT),
        local_qpn: (rng.next() as u32) & 0x00ff_ffff,
        starting_psn: 0x1000,
        qkey: 0,
        responder_resources: 1,
        initiator_depth: 1,
        transport_service_type: 0,
        extended_transport_type: 0,
        path: PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid_of(client),
            remote_gid: gid_of(server),
            hop_limit: 64,
            local_ack_timeout: 31,
            ..PathRepr::default()
        },
        pkey: 0xffff,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        cm_response_timeout: 31,
        packet_life_time: 0,
        max_cm_retries: 15,
        srq: false,
        private_data,
    };
    // A throwaway agent writes the REQ; the communication ID is made fresh.
    let mut agent = uroce_proto::cm::CmAgent::new(AgentConfig {
        first_id: (rng.next() as u32) | 1,
        ..AgentConfig::default()
    });
    agent
        .connect(uroce_proto::time::Instant::from_nanos(0), &p)
        .unwrap();
    let (_, mad) = agent.poll_transmit().unwrap();
    let m = CmMad::parse(&mad).unwrap();
    assert!(matches!(m.message, CmMessage::Req(_)));
    mad
}

/// `mad` as a QP1 datagram (UD SEND_ONLY to QP 1, GSI Q_Key) from `sock`, sealed.
fn send_mad(sock: &UdpSocket, to: SocketAddr, mad: &[u8]) {
    let pkt = PacketRepr {
        deth: Some(deth::Repr {
            qkey: GSI_QKEY,
            src_qp: 1,
        }),
        ..PacketRepr::new(
            bth::Repr {
                opcode: op::UD_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: 1,
                ack_req: false,
                psn: Psn::ZERO,
            },
            mad,
        )
    };
    let mut bytes = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut bytes).expect("emit");
    seal_for(sock.local_addr().expect("addr"), to, &mut bytes).expect("seal");
    // A full socket buffer drops the datagram, as the network would.
    let _ = sock.send_to(&bytes, to);
}

#[test]
fn a_listener_under_a_req_flood_stays_bounded_and_still_accepts() {
    let cm = cm_with(&[SERVER, CLIENT], None);
    let chs = cm.create_event_channel().unwrap();
    let listener = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    listener.bind_addr(sa(SERVER, PORT)).unwrap();
    listener.listen(1024).unwrap();
    let server_dev = listener.device().unwrap();
    let to = SocketAddr::new(ip(SERVER), ROCEV2_UDP_PORT);
    // The flood comes from 16 sockets (source ports) of one address.
    let flooders: Vec<UdpSocket> = (0..16)
        .map(|_| UdpSocket::bind((ip(FLOODER), 0)).expect("flooder socket"))
        .collect();
    let mut rng = Rng(0x000f_100d_5eed);
    let rss_before = rss_kib();

    // The server's application: accepts every request (a QP each), counts them.
    let mut accepted = Vec::new();
    let serve = |accepted: &mut Vec<_>| {
        while let Ok(mut ev) = chs.get_event(Duration::ZERO) {
            if ev.kind != EventKind::ConnectRequest {
                continue;
            }
            let Some(sid) = ev.take_id() else { continue };
            drop(ev);
            let res = Res::new(&sid);
            let qp = sid.create_qp(&res.pd, &res.attr(QpType::Rc)).unwrap();
            qp.post_recv(res.recv_wr(0, 256)).unwrap();
            sid.accept(&ConnParam::new()).unwrap();
            accepted.push((qp, sid, res));
        }
    };

    // The flood: 20000 REQs and 20000 random MADs, interleaved with the application.
    let start = Instant::now();
    for i in 0..40_000u32 {
        let s = &flooders[i as usize % flooders.len()];
        if i % 2 == 0 {
            send_mad(s, to, &flood_req(&mut rng));
        } else {
            let mut mad = [0u8; 256];
            mad.iter_mut().for_each(|b| *b = rng.next() as u8);
            mad[0..4].copy_from_slice(&[1, 7, 2, 3]);
            send_mad(s, to, &mad);
        }
        if i % 256 == 0 {
            serve(&mut accepted);
            // Let the CM thread keep up (the socket buffer would drop the rest).
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    eprintln!("flood of 40000 MADs sent in {:?}", start.elapsed());

    // Meanwhile, a legitimate client connects from another address.
    let chc = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&chc, PortSpace::Tcp).unwrap();
    cid.resolve_addr(Some(sa(CLIENT, 0)), sa(SERVER, PORT), T)
        .unwrap();
    chc.expect(EventKind::AddrResolved, T).unwrap();
    cid.resolve_route(T).unwrap();
    chc.expect(EventKind::RouteResolved, T).unwrap();
    let cres = Res::new(&cid);
    let cqp = cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    // Bounded: the server's application serves until the client is established.
    let until = Instant::now() + T;
    let established = loop {
        serve(&mut accepted);
        if let Ok(ev) = chc.get_event(Duration::from_millis(10)) {
            assert_eq!(ev.kind, EventKind::Established, "{:?}", ev.kind);
            break true;
        }
        if Instant::now() > until {
            break false;
        }
    };
    assert!(
        established,
        "the legitimate client connected during the flood"
    );
    // Data flows on the legitimate connection.
    let (sqp, sid, sres) = accepted
        .iter()
        .find(|(_, sid, _)| sid.peer_addr().is_some_and(|a| a.ip() == ip(CLIENT)))
        .expect("the client's connection on the server");
    cqp.post_send(cres.send_wr(1024, b"still here")).unwrap();
    ok(&cres.completion());
    ok(&sres.completion());
    assert_eq!(sres.read(0, 10), b"still here");
    let _ = (sid, sqp);

    // Bounded state: the flooder's address holds at most its share of unestablished
    // connections (the rest of its REQs were dropped and counted), and the random MADs
    // left nothing.
    let bound = AgentConfig::default().max_unestablished_per_peer;
    let from_flooder = accepted
        .iter()
        .filter(|(_, sid, _)| sid.peer_addr().is_some_and(|a| a.ip() == ip(FLOODER)))
        .count();
    let (conns, stats) = server_dev
        .cm()
        .unwrap()
        .with_agent(|a, _| (a.connections(), a.stats()));
    eprintln!(
        "flooder's requests accepted: {from_flooder}; CM connections: {conns}; {stats:?}; \
         RSS {rss_before} KiB -> {} KiB",
        rss_kib()
    );
    assert!(from_flooder <= bound, "{from_flooder} > {bound}");
    assert!(conns <= bound + 1, "{conns} connections");
    assert!(
        stats.req_over_limit > 0,
        "REQs beyond the bound were dropped"
    );
    // Random MADs: unparsable ones are malformed, CM MADs of unknown attributes ignored.
    assert!(
        stats.malformed + stats.ignored > 0,
        "random MADs were counted"
    );
    // Memory: 40000 MADs leave no trace beyond the bounded connections (each with a QP
    // of the application's; generous margin for allocator noise).
    assert!(
        rss_kib() < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {} KiB",
        rss_kib()
    );
    // The QP handles go before their ids (an id waits for the handles of the QP it
    // destroys).
    drop(accepted);
}
