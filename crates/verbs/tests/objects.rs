//! Device, port, GID and GUID values; Busy on destroy for every parent kind; drop order.
mod common;

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use common::*;
use uroce_verbs::device::{LinkLayer, PortState};
use uroce_verbs::{
    AccessFlags, AhAttr, Context, DestroyError, Device, DeviceConfig, EventType, Gid, MemBlock,
    ObjectKind, QpInitAttr, QpType, RecvWr, SrqInitAttr,
};
use uroce_wire::pmtu::Pmtu;

#[test]
fn device_values_derive_from_the_address() {
    let dev = device();
    assert_eq!(dev.name(), "uroce0");
    // GID 0 is the IPv4-mapped address ::ffff:10.1.2.3 (IBA Vol 1 Annex A17), built here with
    // std's parser rather than the crate's helper.
    let mapped: Ipv6Addr = "::ffff:10.1.2.3".parse().expect("v6");
    assert_eq!(dev.gid(1, 0).expect("gid0"), Gid(mapped.octets()));
    assert_eq!(
        dev.gid(1, 0).expect("gid0").to_string(),
        "0000:0000:0000:0000:0000:ffff:0a01:0203"
    );
    assert_eq!(
        dev.gid(1, 1).expect("gid1"),
        Gid::ZERO,
        "unused entries are zero"
    );
    assert!(dev.gid(1, 1024).is_err(), "1024 entries (INTEROP-NOTES §8)");
    assert!(dev.gid(2, 0).is_err(), "only port 1");
    // GUID: EUI-64 of the pseudo-MAC 02:00:0a:01:02:03 with the U/L bit flipped back:
    // 00:00:0a:ff:fe:01:02:03.
    let expect_guid = u64::from_be_bytes([0x00, 0x00, 10, 0xff, 0xfe, 1, 2, 3]);
    assert_eq!(dev.node_guid(), expect_guid);
    assert_eq!(dev.attr().sys_image_guid, expect_guid);
    // Limits from docs/INTEROP-NOTES.md §8.
    let a = dev.attr();
    assert_eq!(
        (
            a.max_qp,
            a.max_qp_wr,
            a.max_sge,
            a.max_cq,
            a.max_srq,
            a.max_srq_wr,
            a.max_srq_sge
        ),
        (0x10000, 0x4000, 32, 16384, 960, 0x4000, 27)
    );
    assert_eq!(
        (a.max_qp_rd_atom, a.max_qp_init_rd_atom, a.max_msg_sz),
        (128, 128, 0x80_0000)
    );
    assert_eq!(a.max_cqe, (1 << 22) - 1);
    assert_eq!(a.phys_port_cnt, 1);
    // Port: Ethernet, ACTIVE, 1500 → 1024 (INTEROP-NOTES §4).
    let p = dev.port_attr(1).expect("port");
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.link_layer, LinkLayer::Ethernet);
    assert_eq!(p.active_mtu, Pmtu::Mtu1024);
    assert_eq!(p.max_mtu, Pmtu::Mtu4096);
    assert_eq!(dev.pkey(1, 0).expect("pkey"), 0xffff);
    assert!(dev.port_attr(0).is_err());
}

#[test]
fn jumbo_mtu_and_ipv6_devices() {
    let mut cfg = DeviceConfig::new("uroce1", "10.0.0.1".parse().expect("ip"));
    cfg.link_mtu = 9000;
    let dev = Device::new(cfg).expect("device");
    assert_eq!(
        dev.port_attr(1).expect("port").active_mtu,
        Pmtu::Mtu4096,
        "9000 → 4096 (INTEROP-NOTES §4)"
    );
    assert_eq!(
        dev.node_guid(),
        0x0000_0aff_fe00_0001,
        "worked example in the module docs"
    );

    let v6: IpAddr = "2001:db8::1:2:3".parse().expect("ip");
    let dev = Device::new(DeviceConfig::new("uroce2", v6)).expect("device");
    let octets = match v6 {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(_) => unreachable!(),
    };
    assert_eq!(
        dev.gid(1, 0).expect("gid").0,
        octets,
        "IPv6: the GID is the address"
    );
    // Pseudo-MAC 02 + last five bytes (00:01:00:02:00:03 → 00 01 00 02 00 03 minus first).
    let m = [
        0x02, octets[11], octets[12], octets[13], octets[14], octets[15],
    ];
    let guid = u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]);
    assert_eq!(dev.node_guid(), guid);
}

#[test]
fn context_queries_match_device() {
    let ctx = context();
    assert_eq!(ctx.query_device(), ctx.device().attr().clone());
    assert_eq!(ctx.query_port(1).expect("port").active_mtu, Pmtu::Mtu1024);
    assert_eq!(
        ctx.query_gid(1, 0).expect("gid"),
        Gid::from_ip(ADDR.parse().expect("ip"))
    );
}

fn busy_children(e: &DestroyError, kind: ObjectKind) -> uroce_verbs::Children {
    match e {
        DestroyError::Busy { object, children } => {
            assert_eq!(*object, kind);
            *children
        }
        other => panic!("expected Busy, got {other:?}"),
    }
}

#[test]
fn pd_busy_with_each_child_kind() {
    let ctx = context();
    let cq = cq(&ctx, 16);
    let pd = ctx.alloc_pd().expect("pd");

    let mr = pd
        .reg_mr(MemBlock::new(64).expect("block"), AccessFlags::LOCAL_WRITE)
        .expect("mr");
    let (pd, e) = pd.destroy().expect_err("busy with MR");
    assert_eq!(busy_children(&e, ObjectKind::Pd).mrs, 1);
    mr.destroy().expect("dereg");

    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    let (pd, e) = pd.destroy().expect_err("busy with QP");
    assert_eq!(busy_children(&e, ObjectKind::Pd).qps, 1);
    qp.destroy().expect("destroy qp");

    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .expect("srq");
    let (pd, e) = pd.destroy().expect_err("busy with SRQ");
    assert_eq!(busy_children(&e, ObjectKind::Pd).srqs, 1);
    srq.destroy().expect("destroy srq");

    let ah = pd
        .create_ah(&AhAttr::to_ip("10.9.9.9".parse().expect("ip")))
        .expect("ah");
    let (pd, e) = pd.destroy().expect_err("busy with AH");
    assert_eq!(busy_children(&e, ObjectKind::Pd).ahs, 1);
    ah.destroy();

    pd.destroy().expect("PD without children");
    cq.destroy().expect("cq");
    assert_eq!(ctx.live_objects(), Default::default());
}

#[test]
fn cq_srq_channel_context_busy() {
    let ctx = context();
    let ch = ctx.create_comp_channel().expect("channel");
    let cq = ctx.create_cq(8, Some(&ch), 0).expect("cq");
    let pd = ctx.alloc_pd().expect("pd");
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .expect("srq");
    let mut init = QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4));
    init.srq = Some(&srq);
    let qp = pd.create_qp(&init).expect("qp");

    let (cq, e) = cq.destroy().expect_err("CQ busy");
    assert_eq!(
        busy_children(&e, ObjectKind::Cq).qps,
        2,
        "send and recv side"
    );
    let (srq, e) = srq.destroy().expect_err("SRQ busy");
    assert_eq!(busy_children(&e, ObjectKind::Srq).qps, 1);
    let (ch, e) = ch.destroy().expect_err("channel busy");
    assert_eq!(busy_children(&e, ObjectKind::CompChannel).cqs, 1);
    let (ctx, e) = ctx.close().expect_err("context busy");
    let c = busy_children(&e, ObjectKind::Context);
    assert_eq!((c.pds, c.cqs, c.channels), (1, 1, 1));

    qp.destroy().expect("qp");
    srq.destroy().expect("srq");
    cq.destroy().expect("cq");
    ch.destroy().expect("channel");
    pd.destroy().expect("pd");
    ctx.close().expect("close");
}

#[test]
fn xrc_domain_busy_with_srq_and_target_qp() {
    let ctx = context();
    let cq = cq(&ctx, 8);
    let pd = ctx.alloc_pd().expect("pd");
    let xrcd = ctx.alloc_xrcd().expect("xrcd");
    let srq = xrcd
        .create_srq(
            &pd,
            &cq,
            &SrqInitAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("xrc srq");
    assert!(srq.is_xrc());
    let tgt = xrcd.create_qp().expect("xrc recv qp");
    assert_eq!(tgt.qp_type(), QpType::XrcRecv);

    let (xrcd, e) = xrcd.destroy().expect_err("busy");
    let c = busy_children(&e, ObjectKind::Xrcd);
    assert_eq!((c.srqs, c.qps), (1, 1));
    // The XRC SRQ also keeps its CQ busy.
    let (cq, e) = cq.destroy().expect_err("cq busy");
    assert_eq!(busy_children(&e, ObjectKind::Cq).qps, 1);

    // Dropping the target QP's handle hands it to the domain: it stays published.
    let qpn = tgt.qp_num();
    drop(tgt);
    assert!(
        ctx.qp_for_packet(qpn).is_some(),
        "domain-owned QP still receives"
    );
    assert_eq!(xrcd.owned_qps(), vec![qpn]);
    let (xrcd, _) = xrcd.destroy().expect_err("still busy with the owned QP");
    let tgt = xrcd.open_qp(qpn).expect("reopen");
    tgt.destroy().expect("destroy target");
    assert!(ctx.qp_for_packet(qpn).is_none());
    srq.destroy().expect("srq");
    xrcd.destroy().expect("xrcd");
    cq.destroy().expect("cq");
    pd.destroy().expect("pd");
    assert_eq!(ctx.live_objects(), Default::default());
}

#[test]
fn dropping_xrcd_destroys_owned_qps() {
    let ctx = context();
    let xrcd = ctx.alloc_xrcd().expect("xrcd");
    let a = xrcd.create_qp().expect("qp");
    let b = xrcd.create_qp().expect("qp");
    let (qa, qb) = (a.qp_num(), b.qp_num());
    drop(a);
    drop(xrcd);
    assert!(
        ctx.qp_for_packet(qa).is_none(),
        "owned QP destroyed with the domain"
    );
    assert!(
        ctx.qp_for_packet(qb).is_some(),
        "a QP with a handle lives on"
    );
    drop(b);
    assert!(ctx.qp_for_packet(qb).is_none());
    assert_eq!(ctx.live_objects(), Default::default());
}

#[test]
fn parents_dropped_before_children_stay_valid() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 8);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    let cq_ref = (*cq).clone();
    // Drop the parents' handles first: the QP keeps their state alive.
    drop(pd);
    drop(cq);
    let live = ctx.live_objects();
    assert_eq!((live.pds, live.cqs, live.qps), (1, 1, 1));
    rc_to(&qp, uroce_verbs::QpState::Init);
    qp.post_recv(RecvWr::new(7, vec![]))
        .expect("post still works");
    to_err(&qp);
    let wcs = cq_ref.poll(8);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].wr_id, 7);
    drop(cq_ref);
    drop(qp);
    assert_eq!(
        ctx.live_objects(),
        Default::default(),
        "everything released with the QP"
    );
}

#[test]
fn context_drop_first_is_safe() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 8);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, caps(4)))
        .expect("qp");
    drop(ctx);
    // Raising after the context handle is gone is refused (queue shut down), not a panic.
    assert_eq!(qp.raise_event(EventType::CommEst), Ok(false));
    qp.destroy().expect("destroy");
    cq.destroy().expect("cq");
    pd.destroy().expect("pd");
}

#[test]
fn port_events_reach_every_context() {
    let dev = device();
    let a = Context::open(&dev).expect("ctx");
    let b = Context::open(&dev).expect("ctx");
    dev.set_port_state(false);
    dev.set_port_state(false); // no change, no event
    assert_eq!(a.query_port(1).expect("port").state, PortState::Down);
    for ctx in [&a, &b] {
        let ev = ctx
            .get_async_event(Some(Duration::from_secs(1)))
            .expect("event");
        assert_eq!(ev.event_type(), EventType::PortErr);
        assert!(matches!(ev.element(), uroce_verbs::EventElement::Port(1)));
        assert!(ctx.try_get_async_event().is_none());
    }
    dev.set_port_state(true);
    dev.raise_fatal();
    let got: Vec<EventType> = std::iter::from_fn(|| a.try_get_async_event())
        .map(|e| e.event_type())
        .collect();
    assert_eq!(got, vec![EventType::PortActive, EventType::DeviceFatal]);
}

#[test]
fn creation_limits_are_enforced() {
    let ctx = context();
    let cqe = ctx.query_device().max_cqe;
    assert!(ctx.create_cq(0, None, 0).is_err());
    assert!(ctx.create_cq(cqe + 1, None, 0).is_err());
    let cq = ctx.create_cq(cqe, None, 0).expect("max size CQ");
    let pd = ctx.alloc_pd().expect("pd");
    let mut c = caps(4);
    c.max_send_sge = 33;
    assert!(matches!(
        pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, c)),
        Err(uroce_verbs::CreateQpError::CapTooLarge {
            cap: "max_send_sge",
            ..
        })
    ));
    assert!(matches!(
        pd.create_qp(&QpInitAttr::new(QpType::RawPacket, &cq, &cq, caps(4))),
        Err(uroce_verbs::CreateQpError::UnsupportedType(
            QpType::RawPacket
        ))
    ));
    let mut xrc_send = QpInitAttr::new(QpType::XrcSend, &cq, &cq, caps(4));
    assert!(
        pd.create_qp(&xrc_send).is_err(),
        "XRC_SEND has no receive CQ"
    );
    xrc_send.recv_cq = None;
    let xs = pd.create_qp(&xrc_send).expect("xrc send");
    assert_eq!(xs.query().1.cap.max_recv_wr, 0);
    let gsi = pd
        .create_qp(&QpInitAttr::new(QpType::Gsi, &cq, &cq, caps(4)))
        .expect("gsi");
    assert_eq!(gsi.qp_num(), 1);
    assert!(matches!(
        pd.create_qp(&QpInitAttr::new(QpType::Gsi, &cq, &cq, caps(4))),
        Err(uroce_verbs::CreateQpError::GsiExists)
    ));
    let other = context();
    let foreign = other.create_cq(4, None, 0).expect("cq");
    assert!(pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &foreign, &cq, caps(4)))
        .is_err());
}
