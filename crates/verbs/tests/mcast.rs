//! `QpRef::attach_mcast` / `detach_mcast`: the per-context membership table, its rules
//! and the transport's join/leave calls.

mod common;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use uroce_verbs::mcast::McastError;
use uroce_verbs::{Gid, QpInitAttr, QpType, Transport};

/// A transport that records joins and leaves.
#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<(bool, IpAddr)>>,
    refuse: Mutex<bool>,
}

impl Transport for Recorder {
    fn ring(&self, _qpn: u32) {}
    fn poll_progress(&self) -> bool {
        false
    }
    fn flush(&self, _qpn: u32) {}
    fn join_group(&self, group: IpAddr) -> std::io::Result<()> {
        if *self.refuse.lock().unwrap() {
            return Err(std::io::Error::from_raw_os_error(19));
        }
        self.log.lock().unwrap().push((true, group));
        Ok(())
    }
    fn leave_group(&self, group: IpAddr) {
        self.log.lock().unwrap().push((false, group));
    }
}

fn gid(s: &str) -> Gid {
    Gid::from_ip(s.parse().unwrap())
}

#[test]
fn attach_detach_membership_joins_and_leaves() {
    let ctx = common::context();
    let rec = Arc::new(Recorder::default());
    ctx.set_transport(rec.clone()).ok().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = common::cq(&ctx, 16);
    let ud = |_: u8| {
        pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, common::caps(8)))
            .unwrap()
    };
    let (a, b, c) = (ud(0), ud(1), ud(2));
    let g4: IpAddr = "239.1.1.1".parse().unwrap();
    let g6: IpAddr = "ff12::1234".parse().unwrap();
    a.attach_mcast(gid("239.1.1.1"), 0).unwrap();
    a.attach_mcast(gid("239.1.1.1"), 0).unwrap(); // twice: attached once
    b.attach_mcast(gid("239.1.1.1"), 0).unwrap();
    c.attach_mcast(gid("ff12::1234"), 0).unwrap();
    assert_eq!(ctx.mcast_members(g4), vec![a.qp_num(), b.qp_num()]);
    assert_eq!(ctx.mcast_members(g6), vec![c.qp_num()]);
    assert_eq!(*rec.log.lock().unwrap(), vec![(true, g4), (true, g6)]);

    // Not multicast, not attached, not UD.
    assert!(matches!(
        a.attach_mcast(gid("10.0.0.1"), 0),
        Err(McastError::NotMulticast(_))
    ));
    assert!(matches!(
        c.detach_mcast(gid("239.1.1.1"), 0),
        Err(McastError::NotAttached)
    ));
    let rc = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, common::caps(8)))
        .unwrap();
    assert!(matches!(
        rc.attach_mcast(gid("239.1.1.1"), 0),
        Err(McastError::WrongQpType)
    ));

    // Detach one: still joined; the other: left.
    a.detach_mcast(gid("239.1.1.1"), 0).unwrap();
    assert_eq!(ctx.mcast_members(g4), vec![b.qp_num()]);
    assert_eq!(rec.log.lock().unwrap().len(), 2);
    b.detach_mcast(gid("239.1.1.1"), 0).unwrap();
    assert!(ctx.mcast_members(g4).is_empty());
    assert_eq!(rec.log.lock().unwrap().last(), Some(&(false, g4)));

    // Destroying a QP detaches it (and leaves its last group).
    c.destroy().map_err(|(_, e)| e).unwrap();
    assert!(ctx.mcast_members(g6).is_empty());
    assert_eq!(rec.log.lock().unwrap().last(), Some(&(false, g6)));
    assert!(ctx.mcast_groups().is_empty());

    // A refused join leaves nothing behind.
    *rec.refuse.lock().unwrap() = true;
    assert!(matches!(
        a.attach_mcast(gid("239.9.9.9"), 0),
        Err(McastError::Join(_))
    ));
    assert!(ctx.mcast_groups().is_empty());
}
