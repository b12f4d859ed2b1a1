//! The QP ↔ id binding: one id per QP, a QP destroyed during setup aborts it, and a
//! stress race of connect / accept / reject / disconnect against QP and id destroy.

mod common;

use std::time::Duration;

use common::*;
use uroce_rdmacm::{CmError, ConnParam, EventKind, PortSpace};
use uroce_verbs::QpType;

#[test]
fn a_qp_binds_to_one_id_only() {
    let cm = cm_with(&["127.0.220.1"], None);
    let ch = cm.create_event_channel().unwrap();
    let a = cm.create_id(&ch, PortSpace::Tcp).unwrap();
    let b = cm.create_id(&ch, PortSpace::Tcp).unwrap();
    a.bind_addr(sa("127.0.220.1", 0)).unwrap();
    b.bind_addr(sa("127.0.220.1", 0)).unwrap();
    let res = Res::new(&a);
    let qp = res.pd.create_qp(&res.attr(QpType::Rc)).unwrap();
    a.bind_qp(&qp).unwrap();
    assert_eq!(b.bind_qp(&qp), Err(CmError::QpBound));
    assert_eq!(a.bind_qp(&qp), Err(CmError::QpBound));
    assert!(qp.bound_endpoint().is_some());
    a.destroy_qp().unwrap();
    assert_eq!(qp.bound_endpoint(), None);
    b.bind_qp(&qp).unwrap();
    // Destroying the QP unbinds it; the id can take another.
    qp.destroy().map_err(|(_, e)| e).unwrap();
    assert_eq!(b.qp_num(), None);
    let qp2 = res.pd.create_qp(&res.attr(QpType::Rc)).unwrap();
    b.bind_qp(&qp2).unwrap();
    drop((a, b));
    assert_eq!(qp2.bound_endpoint(), None);
}

#[test]
fn a_qp_destroyed_during_setup_aborts_it() {
    let cm = cm_with(&["127.0.221.1", "127.0.221.2"], None);
    let chs = cm.create_event_channel().unwrap();
    let l = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.221.2", 7100)).unwrap();
    l.listen(4).unwrap();
    let chc = cm.create_event_channel().unwrap();
    let cid = cm.create_id(&chc, PortSpace::Tcp).unwrap();
    cid.resolve_addr(Some(sa("127.0.221.1", 0)), sa("127.0.221.2", 7100), T)
        .unwrap();
    cid.resolve_route(T).unwrap();
    let res = Res::new(&cid);
    let qp = res.pd.create_qp(&res.attr(QpType::Rc)).unwrap();
    cid.bind_qp(&qp).unwrap();
    cid.connect(&ConnParam::new()).unwrap();
    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    // The client's QP goes while the server has not answered: the setup aborts.
    qp.destroy().map_err(|(_, e)| e).unwrap();
    assert_eq!(cid.qp_num(), None);
    let sid = req.take_id().unwrap();
    drop(req);
    let sres = Res::new(&sid);
    sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
    sid.accept(&ConnParam::new()).unwrap();
    // The abort purged the id's undelivered events, and nothing comes for the dead QP.
    let mut kinds = Vec::new();
    while let Ok(ev) = chc.get_event(Duration::from_millis(300)) {
        kinds.push(ev.kind);
    }
    assert_eq!(kinds, Vec::<EventKind>::new());
    // The server is never established (the client's REJ, or no RTU).
    if let Ok(ev) = chs.get_event(Duration::from_secs(1)) {
        assert_ne!(ev.kind, EventKind::Established);
    }
    drop((sid, cid, l));
    assert_eq!(cm.live_ids(), 0);
}

#[test]
fn stress_setup_races_destroy() {
    let cm = cm_with(&["127.0.222.1", "127.0.222.2"], None);
    let chs = cm.create_event_channel().unwrap();
    let l = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.222.2", 7200)).unwrap();
    l.listen(64).unwrap();
    let server = {
        let chs = chs.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            // Bounded: stops when no request comes for a second.
            while let Ok(mut ev) = chs.get_event(Duration::from_secs(1)) {
                if let Some(sid) = ev.take_id() {
                    drop(ev);
                    n += 1;
                    match n % 3 {
                        0 => {
                            let _ = sid.reject(b"no");
                        }
                        1 => {
                            let res = Res::new(&sid);
                            if sid.create_qp(&res.pd, &res.attr(QpType::Rc)).is_ok() {
                                let _ = sid.accept(&ConnParam::new());
                            }
                            // Destroyed at once, racing the RTU.
                            drop(sid);
                            drop(res);
                        }
                        _ => drop(sid),
                    }
                }
            }
            n
        })
    };
    let mut workers = Vec::new();
    for t in 0..3u64 {
        let cm = cm.clone();
        workers.push(std::thread::spawn(move || {
            for i in 0..12u64 {
                let ch = cm.create_event_channel().unwrap();
                let cid = cm.create_id(&ch, PortSpace::Tcp).unwrap();
                cid.set_cm_timeouts(14, 2, 14);
                cid.resolve_addr(Some(sa("127.0.222.1", 0)), sa("127.0.222.2", 7200), T)
                    .unwrap();
                cid.resolve_route(T).unwrap();
                let res = Res::new(&cid);
                let qp = res.pd.create_qp(&res.attr(QpType::Rc)).unwrap();
                cid.bind_qp(&qp).unwrap();
                cid.connect(&ConnParam::new()).unwrap();
                match (t + i) % 3 {
                    0 => {
                        let _ = qp.destroy();
                    }
                    1 => {
                        if let Ok(ev) = ch.get_event(Duration::from_millis(20)) {
                            drop(ev);
                        }
                        let _ = cid.disconnect();
                        drop(cid);
                    }
                    _ => drop(cid),
                }
            }
        }));
    }
    for w in workers {
        w.join().unwrap();
    }
    let n = server.join().unwrap();
    assert!(n > 0, "no request reached the server");
    drop(l);
    drop(chs);
    // Bounded wait for ids the stress left to the CM thread's last events.
    let deadline = std::time::Instant::now() + T;
    while cm.live_ids() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(cm.live_ids(), 0, "ids leaked");
}
