//! `QpRef::connect_rc`: RESET→INIT→RTR→RTS in one call, with every attribute applied.

mod common;

use std::net::IpAddr;

use uroce_verbs::{AccessFlags, QpInitAttr, QpState, QpType, RcConnect};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

#[test]
fn connect_rc_reaches_rts_with_the_given_attributes() {
    let ctx = common::context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = common::cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, common::caps(8)))
        .expect("qp");
    let peer: IpAddr = "10.0.0.9".parse().expect("ip");
    let c = RcConnect {
        access: AccessFlags::REMOTE_READ,
        path_mtu: Pmtu::Mtu2048,
        rq_psn: Psn::new(0x12_3456),
        sq_psn: Psn::new(0x65_4321),
        max_dest_rd_atomic: 4,
        max_rd_atomic: 2,
        min_rnr_timer: 5,
        timeout: 9,
        retry_cnt: 3,
        rnr_retry: 6,
        ..RcConnect::new(peer, 0x00ab_cdef)
    };
    qp.connect_rc(&c).expect("connect");
    let (attr, _) = qp.query();
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!(attr.qp_access_flags, AccessFlags::REMOTE_READ);
    assert_eq!(attr.ah_attr.dest_ip(), peer);
    assert_eq!(attr.dest_qp_num, 0x00ab_cdef);
    assert_eq!(attr.path_mtu, Pmtu::Mtu2048);
    assert_eq!(attr.rq_psn, Psn::new(0x12_3456));
    assert_eq!(attr.sq_psn, Psn::new(0x65_4321));
    assert_eq!(
        (
            attr.max_dest_rd_atomic,
            attr.max_rd_atomic,
            attr.min_rnr_timer
        ),
        (4, 2, 5)
    );
    assert_eq!((attr.timeout, attr.retry_cnt, attr.rnr_retry), (9, 3, 6));
}

#[test]
fn connect_rc_stops_at_the_first_refused_transition() {
    let ctx = common::context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = common::cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, common::caps(8)))
        .expect("qp");
    // A 25-bit QPN is refused at RTR: the QP stays in INIT.
    let c = RcConnect::new("10.0.0.9".parse().expect("ip"), 0x0100_0000);
    assert!(qp.connect_rc(&c).is_err());
    assert_eq!(qp.query().0.qp_state, QpState::Init);
}
