//! RDMA-CM over real loopback devices: connect / accept / send / disconnect from either
//! side, reject with private data, no listener, loss, a vanished peer.

mod common;

use std::time::Duration;

use common::*;
use uroce_rdmacm::{CmError, CmId, ConnParam, EventChannel, EventKind, PortSpace, RdmaCm};
use uroce_verbs::{QpState, QpType};

/// A listener on `server:port` and a client id with its route to it resolved.
fn setup(
    cm: &RdmaCm,
    client: &str,
    server: &str,
    port: u16,
) -> (CmId, EventChannel, CmId, EventChannel) {
    let chs = cm.create_event_channel().unwrap();
    let listener = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    listener.bind_addr(sa(server, port)).unwrap();
    listener.listen(8).unwrap();
    let chc = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&chc, PortSpace::Tcp).unwrap();
    cid.resolve_addr(Some(sa(client, 0)), sa(server, port), T)
        .unwrap();
    chc.expect(EventKind::AddrResolved, T).unwrap();
    cid.resolve_route(T).unwrap();
    chc.expect(EventKind::RouteResolved, T).unwrap();
    (listener, chs, cid, chc)
}

/// Connects, exchanges one SEND each way, disconnects from the client (`client_ends`) or
/// the server; both sides see DISCONNECTED, the active closer TIMEWAIT_EXIT.
fn round_trip(cm: &RdmaCm, client: &str, server: &str, port: u16, client_ends: bool) {
    let (listener, chs, cid, chc) = setup(cm, client, server, port);
    let cres = Res::new(&cid);
    let cqp = cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    assert_eq!(cqp.state(), QpState::Init);
    cqp.post_recv(cres.recv_wr(0, 256)).unwrap();
    let mut p = ConnParam::new();
    p.private_data = b"hello from the client".to_vec();
    cid.connect(&p).unwrap();

    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    assert!(req.listen_id.as_ref().unwrap().same_id(&listener));
    assert_eq!(&req.private_data()[..21], b"hello from the client");
    assert_eq!(req.param.qp_num, cqp.qp_num());
    let sid = req.take_id().unwrap();
    assert_eq!(sid.peer_addr().unwrap().ip(), ip(client));
    assert_eq!(
        sid.peer_addr().unwrap().port(),
        cid.local_addr().unwrap().port()
    );
    drop(req);
    let sres = Res::new(&sid);
    let sqp = sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
    sqp.post_recv(sres.recv_wr(0, 256)).unwrap();
    let mut a = ConnParam::new();
    a.private_data = b"welcome".to_vec();
    sid.accept(&a).unwrap();
    assert_eq!(sqp.state(), QpState::Rts);

    let est = chc.expect(EventKind::Established, T).unwrap();
    assert_eq!(&est.private_data()[..7], b"welcome");
    assert_eq!(est.param.qp_num, sqp.qp_num());
    drop(est);
    assert_eq!(cqp.state(), QpState::Rts);
    chs.expect(EventKind::Established, T).unwrap();

    cqp.post_send(cres.send_wr(1024, b"ping")).unwrap();
    ok(&cres.completion());
    let wc = sres.completion();
    ok(&wc);
    assert_eq!(sres.read(0, 4), b"ping");
    sqp.post_send(sres.send_wr(1024, b"pong")).unwrap();
    ok(&sres.completion());
    ok(&cres.completion());
    assert_eq!(cres.read(0, 4), b"pong");

    let (closer, closer_ch, other_ch) = if client_ends {
        (&cid, &chc, &chs)
    } else {
        (&sid, &chs, &chc)
    };
    closer.disconnect().unwrap();
    closer_ch.expect(EventKind::Disconnected, T).unwrap();
    other_ch.expect(EventKind::Disconnected, T).unwrap();
    closer_ch.expect(EventKind::TimewaitExit, T).unwrap();
    assert_eq!(cqp.state(), QpState::Err);
    assert_eq!(sqp.state(), QpState::Err);
    // A second connect on a bound, used id is refused with a typed error.
    assert!(matches!(
        cid.connect(&ConnParam::new()),
        Err(CmError::InvalidState { .. })
    ));
    drop((sid, cid, listener));
    assert_eq!(cm.live_ids(), 0, "ids leaked");
}

#[test]
fn connect_send_disconnect_from_the_client() {
    let cm = cm_with(&["127.0.210.1", "127.0.210.2"], None);
    round_trip(&cm, "127.0.210.1", "127.0.210.2", 7001, true);
}

#[test]
fn connect_send_disconnect_from_the_server() {
    let cm = cm_with(&["127.0.211.1", "127.0.211.2"], None);
    round_trip(&cm, "127.0.211.1", "127.0.211.2", 7002, false);
}

#[test]
fn reject_with_private_data_reaches_the_client() {
    let cm = cm_with(&["127.0.212.1", "127.0.212.2"], None);
    let (_l, chs, cid, chc) = setup(&cm, "127.0.212.1", "127.0.212.2", 7003);
    let cres = Res::new(&cid);
    let cqp = cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    let sid = req.take_id().unwrap();
    sid.reject(b"go away").unwrap();
    let ev = chc.expect(EventKind::Rejected, T).unwrap();
    // IBA Vol 1 §12.6.7.2: 28 = consumer defined.
    assert_eq!(ev.status, 28);
    assert_eq!(&ev.private_data()[..7], b"go away");
    assert_eq!(cqp.state(), QpState::Init, "a rejected QP is not moved");
}

#[test]
fn connect_to_a_port_nobody_listens_on_is_rejected() {
    let cm = cm_with(&["127.0.213.1", "127.0.213.2"], None);
    let chc = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&chc, PortSpace::Tcp).unwrap();
    // No source: the device that reaches the destination (loopback: any of the family).
    cid.resolve_addr(None, sa("127.0.213.2", 7999), T).unwrap();
    chc.expect(EventKind::AddrResolved, T).unwrap();
    cid.resolve_route(T).unwrap();
    chc.expect(EventKind::RouteResolved, T).unwrap();
    let cres = Res::new(&cid);
    cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    let ev = chc.expect(EventKind::Rejected, T).unwrap();
    // 8 = invalid service ID.
    assert_eq!(ev.status, 8);
}

#[test]
fn a_vanished_peer_ends_in_unreachable_and_a_closed_one_in_disconnected() {
    // Nobody at the destination: every REQ is lost.
    let cm = cm_with(&["127.0.214.1"], None);
    let chc = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&chc, PortSpace::Tcp).unwrap();
    cid.set_cm_timeouts(12, 3, 14);
    cid.resolve_addr(Some(sa("127.0.214.1", 0)), sa("127.0.214.9", 7004), T)
        .unwrap();
    chc.expect(EventKind::AddrResolved, T).unwrap();
    cid.resolve_route(T).unwrap();
    chc.expect(EventKind::RouteResolved, T).unwrap();
    let cres = Res::new(&cid);
    cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    let ev = chc.expect(EventKind::Unreachable, T).unwrap();
    assert_eq!(ev.status, -110);

    // A connected peer whose device closes: our DREQ is never answered.
    let client = cm_with(&["127.0.214.2"], None);
    let server = cm_with(&["127.0.214.3"], None);
    let chs = server.create_event_channel().unwrap();
    let l = server.create_id(&chs, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.214.3", 7005)).unwrap();
    l.listen(1).unwrap();
    let chc = client.create_event_channel().unwrap();
    let cid = client.create_id(&chc, PortSpace::Tcp).unwrap();
    cid.set_cm_timeouts(12, 3, 14);
    cid.resolve_addr(Some(sa("127.0.214.2", 0)), sa("127.0.214.3", 7005), T)
        .unwrap();
    cid.resolve_route(T).unwrap();
    let cres = Res::new(&cid);
    cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    let sid = req.take_id().unwrap();
    drop(req);
    let sres = Res::new(&sid);
    sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
    sid.accept(&ConnParam::new()).unwrap();
    chs.expect(EventKind::Established, T).unwrap();
    chc.expect(EventKind::AddrResolved, T).unwrap();
    chc.expect(EventKind::RouteResolved, T).unwrap();
    chc.expect(EventKind::Established, T).unwrap();
    // The server goes away: its ids (destroying a connected id sends a DREQ),
    // resources and device. The client ends disconnected, not hanging.
    drop((sid, l, sres, chs, server));
    chc.expect(EventKind::Disconnected, T).unwrap();
    // A disconnect after the peer's succeeds, as with the kernel's RDMA CM (rdma-core's
    // RDMA-CM tests disconnect after DISCONNECTED); no second event follows.
    cid.disconnect().expect("a late disconnect succeeds");
    assert!(chc
        .expect(EventKind::Disconnected, Duration::from_millis(200))
        .is_err());
    std::thread::sleep(Duration::from_millis(1));
}

#[test]
fn lost_cm_messages_are_retried() {
    // 30 % of every packet each device sends is lost, REQ/REP/RTU/DREQ/DREP included.
    let faults = Some("drop=0.3,seed=11");
    for (i, port) in (7010u16..7014).enumerate() {
        let (a, b) = (
            format!("127.0.215.{}", 2 * i + 1),
            format!("127.0.215.{}", 2 * i + 2),
        );
        let cm = cm_with(&[&a, &b], faults);
        let (_l, chs, cid, chc) = setup(&cm, &a, &b, port);
        cid.set_cm_timeouts(14, 15, 14);
        let cres = Res::new(&cid);
        cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
        cid.connect(&ConnParam::new()).unwrap();
        let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
        let sid = req.take_id().unwrap();
        drop(req);
        let sres = Res::new(&sid);
        sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
        sid.accept(&ConnParam::new()).unwrap();
        chc.expect(EventKind::Established, T).unwrap();
        // A lost RTU: the server is established by the REP retry's RTU.
        chs.expect(EventKind::Established, T).unwrap();
        cid.disconnect().unwrap();
        chc.expect(EventKind::Disconnected, T).unwrap();
        chs.expect(EventKind::Disconnected, T).unwrap();
        let dev = cid.device().unwrap();
        let c = dev.cm().unwrap().counters();
        assert!(c.mads_sent > 0);
    }
}

#[test]
fn a_listener_on_another_process_loopback_address_is_reached() {
    // Two CMs as two processes: the server's device is 127.0.216.1, the client's
    // 127.0.216.2. Both use 127.0.216.9, which neither device owns (as two processes
    // share 127.0.0.1 of a kernel device): the server binds and listens there (announced),
    // the client connects there and reaches the server's device.
    let server = cm_with(&["127.0.216.1"], None);
    let client = cm_with(&["127.0.216.2"], None);
    let chs = server.create_event_channel().unwrap();
    let l = server.create_id(&chs, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.216.9", 7006)).unwrap();
    l.listen(1).unwrap();
    let chc = client.create_event_channel().unwrap();
    let cid = client.create_id(&chc, PortSpace::Tcp).unwrap();
    cid.resolve_addr(Some(sa("127.0.216.9", 0)), sa("127.0.216.9", 7006), T)
        .unwrap();
    chc.expect(EventKind::AddrResolved, T).unwrap();
    cid.resolve_route(T).unwrap();
    chc.expect(EventKind::RouteResolved, T).unwrap();
    let cres = Res::new(&cid);
    cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    let sid = req.take_id().unwrap();
    drop(req);
    assert_eq!(sid.peer_addr().unwrap().ip(), ip("127.0.216.2"));
    let sres = Res::new(&sid);
    sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
    sid.accept(&ConnParam::new()).unwrap();
    chs.expect(EventKind::Established, T).unwrap();
    chc.expect(EventKind::Established, T).unwrap();
    assert_eq!(cid.peer_addr().unwrap().ip(), ip("127.0.216.1"));
    // Once the listener is gone, nothing announces the address any more: a new connect
    // goes to 127.0.216.9 itself, where no device answers.
    drop((sid, l));
    // Its own channel: the first connection's DISCONNECTED may still arrive on `chc`.
    let chc2 = client.create_event_channel().unwrap();
    let cid2 = client.create_id(&chc2, PortSpace::Tcp).unwrap();
    cid2.set_cm_timeouts(12, 2, 14);
    cid2.resolve_addr(None, sa("127.0.216.9", 7006), T).unwrap();
    chc2.expect(EventKind::AddrResolved, T).unwrap();
    cid2.resolve_route(T).unwrap();
    chc2.expect(EventKind::RouteResolved, T).unwrap();
    let cres2 = Res::new(&cid2);
    cid2.create_qp(&cres2.pd, &cres2.attr(QpType::Rc)).unwrap();
    cid2.connect(&ConnParam::new()).unwrap();
    assert_eq!(cid2.peer_addr().unwrap().ip(), ip("127.0.216.9"));
}

/// A REQ from a raw CM agent on another device, with `path_mtu` (the IB MTU enum) and an
/// RDMA-CM address header, to `server:port`.
fn raw_req(
    dev: &uroce_net::NetDevice,
    server: std::net::IpAddr,
    port: u16,
    qpn: u32,
    path_mtu: u8,
) {
    use uroce_proto::cm::ConnectParams;
    use uroce_wire::cm::rdma_cm::{gid_of, CmaHeader, PortSpace as WirePs, HEADER_LEN};
    use uroce_wire::cm::PathRepr;
    let client = dev.local_addr().ip();
    let mut private_data = vec![0; HEADER_LEN];
    CmaHeader {
        version: 0,
        src_port: 40_000 + qpn as u16,
        src_ip: client,
        dst_ip: server,
    }
    .emit(&mut private_data)
    .unwrap();
    let p = ConnectParams {
        remote: server,
        service_id: WirePs::Tcp.service_id(port),
        local_qpn: qpn,
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
            local_ack_timeout: 14,
            ..PathRepr::default()
        },
        pkey: 0xffff,
        path_mtu,
        retry_count: 7,
        rnr_retry_count: 7,
        cm_response_timeout: 14,
        packet_life_time: 0,
        max_cm_retries: 3,
        srq: false,
        private_data,
    };
    dev.cm()
        .unwrap()
        .with_agent(|ag, now| ag.connect(now, &p))
        .unwrap();
}

#[test]
fn the_passive_qp_takes_the_smaller_of_the_req_mtu_and_its_port_s() {
    use uroce_wire::Pmtu;
    let server = "127.0.219.2";
    // A server port below the largest IB MTU: an Ethernet link's 1500 bytes give 1024.
    let cm = RdmaCm::new();
    let mut cfg = uroce_net::NetConfig::new(ip(server));
    cfg.faults = None;
    cfg.link_mtu = Some(1500);
    cm.add_device(std::sync::Arc::new(
        uroce_net::NetDevice::open(cfg).expect("open device"),
    ))
    .expect("add device");
    let chs = cm.create_event_channel().unwrap();
    let listener = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    listener.bind_addr(sa(server, 7300)).unwrap();
    listener.listen(8).unwrap();
    let peer = device("127.0.219.1", None, None);
    let port_mtu = listener.device().unwrap().device().active_mtu();
    // IB MTU enum: 2 = 512 (below the port's), 5 = 4096 (above it).
    for (qpn, enum_value, want) in [(0x21, 2, Pmtu::Mtu512), (0x22, 5, port_mtu)] {
        raw_req(&peer, ip(server), 7300, qpn, enum_value);
        let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
        assert_eq!(req.param.qp_num, qpn);
        let sid = req.take_id().unwrap();
        drop(req);
        let res = Res::new(&sid);
        let qp = sid.create_qp(&res.pd, &res.attr(QpType::Rc)).unwrap();
        sid.accept(&ConnParam::new()).unwrap();
        assert_eq!(qp.query().0.path_mtu, want, "REQ MTU enum {enum_value}");
        drop((qp, sid));
    }
    assert!(
        port_mtu < Pmtu::Mtu4096,
        "the port's MTU must be below 4096 here"
    );
}

/// An RDMA CM over a shared device on `addr` (a member of the host-wide device, with the
/// registry in `dir`), as one process of the host has.
fn shared_cm(addr: &str, dir: &std::path::Path) -> RdmaCm {
    let mut cfg = uroce_net::NetConfig::new(ip(addr));
    cfg.faults = None;
    cfg.shared = true;
    cfg.host_dir = Some(dir.to_path_buf());
    cfg.publish_stats = false;
    let cm = RdmaCm::new();
    cm.add_device(std::sync::Arc::new(
        uroce_net::NetDevice::open(cfg).expect("open shared device"),
    ))
    .expect("add device");
    cm
}

#[test]
fn a_port_another_process_listens_on_is_in_use_and_an_ephemeral_one_moves_on() {
    let addr = "127.0.223.1";
    let dir = std::env::temp_dir().join(format!("uroce-rdmacm-ports-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Two members of the host's device on one address, as two processes are.
    let (one, two) = (shared_cm(addr, &dir), shared_cm(addr, &dir));
    let (ch1, ch2) = (
        one.create_event_channel().unwrap(),
        two.create_event_channel().unwrap(),
    );
    let first = one.create_id(&ch1, PortSpace::Tcp).unwrap();
    first.bind_addr(sa(addr, 7400)).unwrap();
    first.listen(8).unwrap();
    // The same port in the other: bound (ports are reserved per process), not listened on.
    let second = two.create_id(&ch2, PortSpace::Tcp).unwrap();
    second.bind_addr(sa(addr, 7400)).unwrap();
    assert!(matches!(second.listen(8), Err(CmError::AddrInUse(7400))));
    // An ephemeral port the other process listens on is left for another one: the next
    // port `two` would pick is taken by a listener of `one` first.
    let probe = two.create_id(&ch2, PortSpace::Tcp).unwrap();
    probe.bind_addr(sa(addr, 0)).unwrap();
    let q = probe.local_addr().unwrap().port();
    let next = if q == *uroce_rdmacm::EPHEMERAL_PORTS.end() {
        *uroce_rdmacm::EPHEMERAL_PORTS.start()
    } else {
        q + 1
    };
    let taken = one.create_id(&ch1, PortSpace::Tcp).unwrap();
    taken.bind_addr(sa(addr, next)).unwrap();
    taken.listen(8).unwrap();
    let moved = two.create_id(&ch2, PortSpace::Tcp).unwrap();
    moved.bind_addr(sa(addr, 0)).unwrap();
    assert_eq!(moved.local_addr().unwrap().port(), next);
    moved.listen(8).unwrap();
    let port = moved.local_addr().unwrap().port();
    assert_ne!(port, next, "the listen moved to another ephemeral port");
    assert!(uroce_rdmacm::EPHEMERAL_PORTS.contains(&port));
    drop((first, second, probe, taken, moved, ch1, ch2, one, two));
    let _ = std::fs::remove_dir_all(&dir);
}
