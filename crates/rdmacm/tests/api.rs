//! The calls librdmacm programs use beyond connect / accept, over real loopback devices:
//! `migrate` (`rdma_migrate_id`), `qp_attr` (`rdma_init_qp_attr`) for a QP the caller
//! moves itself, `establish` without a later Established event, `notify_established`
//! (`rdma_notify` with COMM_EST), and the QP types each port space takes.

mod common;

use common::*;
use uroce_rdmacm::{CmError, ConnParam, EventKind, PortSpace};
use uroce_verbs::{AttrMask, QpState, QpType};

/// An event channel reports nothing within a short wait.
fn quiet(ch: &uroce_rdmacm::EventChannel) -> bool {
    ch.get_event(std::time::Duration::from_millis(300)).is_err()
}

#[test]
fn migrate_moves_pending_and_later_events() {
    let cm = cm_with(&["127.0.217.1", "127.0.217.2"], None);
    let chs = cm.create_event_channel().unwrap();
    let l = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.217.2", 7101)).unwrap();
    l.listen(1).unwrap();
    let ch1 = cm.create_event_channel().unwrap();
    let ch2 = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&ch1, PortSpace::Tcp).unwrap();
    // Two events wait on ch1 when the id moves: they move too, in order.
    cid.resolve_addr(Some(sa("127.0.217.1", 0)), sa("127.0.217.2", 7101), T)
        .unwrap();
    // Migrating to the channel it is on changes nothing.
    cid.migrate(&ch1);
    assert_eq!(ch1.pending(), 1);
    cid.migrate(&ch2);
    assert_eq!((ch1.pending(), ch2.pending()), (0, 1));
    ch2.expect(EventKind::AddrResolved, T).unwrap();
    cid.resolve_route(T).unwrap();
    ch2.expect(EventKind::RouteResolved, T).unwrap();
    let res = Res::new(&cid);
    cid.create_qp(&res.pd, &res.attr(QpType::Rc)).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    let sid = req.take_id().unwrap();
    drop(req);
    // The server's new id moves to a channel of its own before it accepts.
    let ch3 = cm.create_event_channel().unwrap();
    sid.migrate(&ch3);
    let sres = Res::new(&sid);
    sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
    sid.accept(&ConnParam::new()).unwrap();
    ch2.expect(EventKind::Established, T).unwrap();
    ch3.expect(EventKind::Established, T).unwrap();
    assert!(quiet(&ch1), "an event on the channel the client id left");
    assert!(
        quiet(&chs),
        "an event on the listener's channel for the migrated id"
    );
    cid.disconnect().unwrap();
    ch2.expect(EventKind::Disconnected, T).unwrap();
    ch3.expect(EventKind::Disconnected, T).unwrap();
}

#[test]
fn qp_attr_moves_a_caller_owned_qp_and_establish_reports_nothing() {
    let cm = cm_with(&["127.0.217.3", "127.0.217.4"], None);
    let chs = cm.create_event_channel().unwrap();
    let l = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.217.4", 7102)).unwrap();
    l.listen(1).unwrap();
    let chc = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&chc, PortSpace::Tcp).unwrap();
    // Nothing to answer before the id is bound.
    assert!(matches!(
        cid.qp_attr(QpType::Rc, QpState::Init),
        Err(CmError::InvalidState { .. })
    ));
    cid.resolve_addr(Some(sa("127.0.217.3", 0)), sa("127.0.217.4", 7102), T)
        .unwrap();
    chc.expect(EventKind::AddrResolved, T).unwrap();
    cid.resolve_route(T).unwrap();
    chc.expect(EventKind::RouteResolved, T).unwrap();
    // RTR needs the peer: refused before the REP.
    assert!(matches!(
        cid.qp_attr(QpType::Rc, QpState::Rtr),
        Err(CmError::InvalidState { .. })
    ));
    assert!(matches!(
        cid.qp_attr(QpType::Rc, QpState::Sqd),
        Err(CmError::Invalid(_))
    ));

    // The client's QP is its own: not bound to the id, moved with qp_attr.
    let cres = Res::new(&cid);
    let cqp = cres.pd.create_qp(&cres.attr(QpType::Rc)).unwrap();
    let (a, m) = cid.qp_attr(QpType::Rc, QpState::Init).unwrap();
    cqp.modify(&a, m).unwrap();
    let mut p = ConnParam::new();
    p.qp_num = cqp.qp_num();
    cid.connect(&p).unwrap();

    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    assert_eq!(req.param.qp_num, cqp.qp_num());
    let sid = req.take_id().unwrap();
    drop(req);
    // The passive side's RTR names the client's QP; its RTS the PSN the REP will carry.
    let (rtr, rm) = sid.qp_attr(QpType::Rc, QpState::Rtr).unwrap();
    assert!(rm.contains(AttrMask::DEST_QPN | AttrMask::RQ_PSN | AttrMask::AV));
    assert_eq!(rtr.dest_qp_num, cqp.qp_num());
    let sres = Res::new(&sid);
    let sqp = sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
    sqp.post_recv(sres.recv_wr(0, 64)).unwrap();
    sid.accept(&ConnParam::new()).unwrap();

    let resp = chc.expect(EventKind::ConnectResponse, T).unwrap();
    assert_eq!(resp.param.qp_num, sqp.qp_num());
    drop(resp);
    let (rtr, rm) = cid.qp_attr(QpType::Rc, QpState::Rtr).unwrap();
    assert!(rm.contains(AttrMask::DEST_QPN));
    assert_eq!(rtr.dest_qp_num, sqp.qp_num());
    cqp.modify(&rtr, rm).unwrap();
    let (rts, sm) = cid.qp_attr(QpType::Rc, QpState::Rts).unwrap();
    assert!(sm.contains(AttrMask::SQ_PSN));
    cqp.modify(&rts, sm).unwrap();
    cid.establish().unwrap();
    chs.expect(EventKind::Established, T).unwrap();
    // The PSNs agree: a SEND arrives.
    cqp.post_send(cres.send_wr(1024, b"own qp")).unwrap();
    ok(&cres.completion());
    ok(&sres.completion());
    assert_eq!(sres.read(0, 6), b"own qp");
    assert!(quiet(&chc), "an event after establish");
    sid.disconnect().unwrap();
    chc.expect(EventKind::Disconnected, T).unwrap();
}

#[test]
fn notify_establishes_an_accepted_connection_once() {
    let cm = cm_with(&["127.0.217.5", "127.0.217.6"], None);
    let chs = cm.create_event_channel().unwrap();
    let l = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.217.6", 7103)).unwrap();
    l.listen(1).unwrap();
    // Not connecting: nothing to establish.
    assert!(matches!(
        l.notify_established(),
        Err(CmError::InvalidState { .. })
    ));
    let chc = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&chc, PortSpace::Tcp).unwrap();
    cid.resolve_addr(Some(sa("127.0.217.5", 0)), sa("127.0.217.6", 7103), T)
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
    // Before or after the RTU: either it establishes now or it already was.
    match sid.notify_established() {
        Ok(()) | Err(CmError::AlreadyConnected) => {}
        Err(e) => panic!("notify after accept: {e}"),
    }
    chs.expect(EventKind::Established, T).unwrap();
    assert!(quiet(&chs), "a second Established");
    assert_eq!(sid.notify_established(), Err(CmError::AlreadyConnected));
}

#[test]
fn port_spaces_take_their_qp_types() {
    let cm = cm_with(&["127.0.217.7"], None);
    let ch = cm.create_event_channel().unwrap();
    for (ps, good, bad) in [
        (PortSpace::Tcp, QpType::Rc, QpType::Ud),
        (PortSpace::Udp, QpType::Ud, QpType::Rc),
        (PortSpace::Ib, QpType::XrcSend, QpType::Ud),
    ] {
        let id = cm.create_id(&ch, ps).unwrap();
        id.bind_addr(sa("127.0.217.7", 0)).unwrap();
        let res = Res::new(&id);
        assert!(
            matches!(
                id.create_qp(&res.pd, &res.attr(bad)),
                Err(CmError::Invalid(_))
            ),
            "{ps:?} took a {bad:?} QP"
        );
        let mut attr = res.attr(good);
        if good == QpType::XrcSend {
            // An XRC initiator has no receive side.
            attr.recv_cq = None;
            attr.cap.max_recv_wr = 0;
            attr.cap.max_recv_sge = 0;
        }
        let qp = id.create_qp(&res.pd, &attr).unwrap();
        assert_eq!(
            qp.state(),
            if good == QpType::Ud {
                QpState::Rts
            } else {
                QpState::Init
            }
        );
        assert_eq!(qp.qp_type(), good, "{ps:?}");
        // The id's QP is destroyed with it once no reference is left.
        drop(qp);
        id.destroy().unwrap();
    }
    assert!(matches!(
        cm.create_id(&ch, PortSpace::IpoIb),
        Err(CmError::Invalid(_))
    ));
}
