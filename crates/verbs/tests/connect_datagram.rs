//! The UC and UD counterparts of `connect_rc` (`connect_uc`, `activate_ud`) and
//! `AhAttr::from_wc`, the reply address of a received datagram.

mod common;

use std::net::IpAddr;

use uroce_verbs::{
    AccessFlags, AhAttr, AhFromWcError, CreateQpError, Gid, QpInitAttr, QpState, QpType, UcConnect,
    UdActivate, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

#[test]
fn connect_uc_reaches_rts_with_the_given_attributes() {
    let ctx = common::context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = common::cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Uc, &cq, &cq, common::caps(8)))
        .expect("qp");
    let peer: IpAddr = "10.0.0.7".parse().expect("ip");
    let c = UcConnect {
        path_mtu: Pmtu::Mtu4096,
        rq_psn: Psn::new(0x11_2233),
        sq_psn: Psn::new(0x44_5566),
        ..UcConnect::new(peer, 0x00a1_b2c3)
    };
    qp.connect_uc(&c).expect("connect");
    let (attr, _) = qp.query();
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!(attr.qp_access_flags, AccessFlags::REMOTE_WRITE);
    assert_eq!(attr.ah_attr.dest_ip(), peer);
    assert_eq!(attr.dest_qp_num, 0x00a1_b2c3);
    assert_eq!(attr.path_mtu, Pmtu::Mtu4096);
    assert_eq!(attr.rq_psn, Psn::new(0x11_2233));
    assert_eq!(attr.sq_psn, Psn::new(0x44_5566));
}

#[test]
fn connect_uc_stops_at_the_first_refused_transition() {
    let ctx = common::context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = common::cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Uc, &cq, &cq, common::caps(8)))
        .expect("qp");
    let c = UcConnect::new("10.0.0.9".parse().expect("ip"), 0x0100_0000);
    assert!(qp.connect_uc(&c).is_err());
    assert_eq!(qp.query().0.qp_state, QpState::Init);
    // From INIT, a valid connection finishes the job.
    let c = UcConnect::new("10.0.0.9".parse().expect("ip"), 0x42);
    qp.connect_uc_from_init(&c).expect("from init");
    assert_eq!(qp.query().0.qp_state, QpState::Rts);
}

#[test]
fn activate_ud_sets_the_qkey_and_reaches_rts() {
    let ctx = common::context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = common::cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, common::caps(8)))
        .expect("qp");
    qp.activate_ud(0x1234_5678).expect("activate");
    let (attr, _) = qp.query();
    assert_eq!(
        (attr.qp_state, attr.qkey, attr.pkey_index),
        (QpState::Rts, 0x1234_5678, 0)
    );
    // A second activation is a RESET-only transition from RTS: refused, QP unchanged.
    assert!(qp.activate_ud(1).is_err());
    assert_eq!(qp.query().0.qkey, 0x1234_5678);
}

#[test]
fn activate_ud_works_for_the_gsi_qp_and_refuses_a_bad_pkey_index() {
    let ctx = common::context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = common::cq(&ctx, 16);
    let gsi = pd
        .create_qp(&QpInitAttr::new(QpType::Gsi, &cq, &cq, common::caps(8)))
        .expect("gsi");
    assert_eq!(gsi.qp_num(), 1);
    assert!(matches!(
        pd.create_qp(&QpInitAttr::new(QpType::Gsi, &cq, &cq, common::caps(8))),
        Err(CreateQpError::GsiExists)
    ));
    gsi.activate_ud(0x8001_0000).expect("activate");
    assert_eq!(gsi.query().0.qp_state, QpState::Rts);

    let ud = pd
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, common::caps(8)))
        .expect("ud");
    let a = UdActivate {
        pkey_index: 0xfff0,
        ..UdActivate::new(7)
    };
    assert!(ud.activate_ud_with(&a).is_err());
    assert_eq!(ud.query().0.qp_state, QpState::Reset);
}

fn v4_grh(src: [u8; 4], dst: [u8; 4], ttl: u8, tos: u8) -> [u8; 40] {
    let mut a = [0u8; 40];
    let h = &mut a[20..];
    h[0] = 0x45;
    h[1] = tos;
    h[2..4].copy_from_slice(&300u16.to_be_bytes());
    h[6] = 0x40;
    h[8] = ttl;
    h[9] = 17;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let c = uroce_wire::ip::ipv4_checksum(h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    a
}

fn recv_wc(flags: WcFlags) -> WorkCompletion {
    WorkCompletion {
        wc_flags: flags,
        src_qp: 0x77,
        sl: 3,
        byte_len: 40 + 16,
        ..WorkCompletion::error(1, WcStatus::Success, WcOpcode::Recv, 20)
    }
}

#[test]
fn ah_attr_from_wc_answers_the_source() {
    let ctx = common::context();
    let dev = ctx.device();
    let local = match dev.addr() {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => panic!("the test context is IPv4"),
    };
    let grh = v4_grh([192, 0, 2, 33], local, 61, 0x48);
    let attr = AhAttr::from_wc(dev, &grh, &recv_wc(WcFlags::GRH)).expect("reply");
    assert_eq!(attr.dest_ip(), "192.0.2.33".parse::<IpAddr>().expect("ip"));
    assert_eq!(
        (attr.sgid_index, attr.hop_limit, attr.traffic_class, attr.sl),
        (0, 61, 0x48, 3)
    );
    assert!(attr.is_global);
    // The attributes make an AH.
    let pd = ctx.alloc_pd().expect("pd");
    let ah = pd.create_ah(&attr).expect("ah");
    assert_eq!(ah.dest_ip(), attr.dest_ip());

    assert_eq!(
        AhAttr::from_wc(dev, &grh, &recv_wc(WcFlags::empty())),
        Err(AhFromWcError::NoGrh)
    );
    assert!(matches!(
        AhAttr::from_wc(dev, &[0u8; 40], &recv_wc(WcFlags::GRH)),
        Err(AhFromWcError::Grh(_))
    ));
    let elsewhere = v4_grh([192, 0, 2, 33], [198, 51, 100, 1], 64, 0);
    assert!(matches!(
        AhAttr::from_wc(dev, &elsewhere, &recv_wc(WcFlags::GRH)),
        Err(AhFromWcError::NotLocal(_))
    ));
    let multicast = v4_grh([192, 0, 2, 33], [224, 0, 0, 1], 64, 0);
    assert!(matches!(
        AhAttr::from_wc(dev, &multicast, &recv_wc(WcFlags::GRH)),
        Err(AhFromWcError::Multicast(_))
    ));
    assert_eq!(Gid::from_ip(attr.dest_ip()), attr.dgid);
}
