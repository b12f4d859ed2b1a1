//! The device-owned GSI QP (QP1): MADs between two devices on loopback, the Q_Key rule,
//! no buffer leaks, and the ownership rule (an application cannot create QP1).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce_net::gsi::{GsiError, GSI_RECV_DEPTH, GSI_SEND_DEPTH};
use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AhAttr, CreateQpError, MemBlock, QpCap, QpInitAttr, QpState, QpType, SendWr, Sge, UdDest,
    WcStatus,
};
use uroce_wire::mad::{self, cm_attr, MAD_LEN};

fn open(addr: &str) -> NetDevice {
    let mut cfg = NetConfig::new(addr.parse::<IpAddr>().expect("addr"));
    cfg.faults = None;
    NetDevice::open(cfg).expect("open device")
}

fn ip(dev: &NetDevice) -> IpAddr {
    dev.local_addr().ip()
}

/// A CM-class MAD with transaction id `tid`, attribute `attr` and a payload derived from
/// `tid`.
fn cm_mad(tid: u64, attr: u16) -> Vec<u8> {
    let mut buf = vec![0u8; MAD_LEN];
    let mut h = mad::Header::new_checked(&mut buf[..]).expect("header");
    h.set_base_version(mad::BASE_VERSION);
    h.set_mgmt_class(mad::MGMT_CLASS_CM);
    h.set_class_version(mad::CM_CLASS_VERSION);
    h.set_response_method(false, mad::METHOD_SEND);
    h.set_transaction_id(tid);
    h.set_attribute_id(attr);
    for (i, b) in h.data_mut().iter_mut().enumerate() {
        *b = (tid as u8).wrapping_mul(7).wrapping_add(i as u8);
    }
    buf
}

fn tid_of(m: &[u8]) -> u64 {
    mad::Header::new_checked(m)
        .expect("header")
        .transaction_id()
}

/// Waits (bounded) until `cond` holds.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_mad_goes_to_the_peers_qp1_and_the_answer_comes_back() {
    let a = open("127.0.37.1");
    let b = open("127.0.37.2");
    assert_eq!(a.gsi().qp_num(), 1);
    assert_eq!(a.gsi().state(), QpState::Rts);
    assert_eq!(b.gsi().recv_queue_depth(), GSI_RECV_DEPTH);

    let req = cm_mad(0x1122_3344_5566_7788, cm_attr::REQ);
    a.gsi().send_mad(ip(&b), 1, &req).expect("send REQ");
    let got = b
        .gsi()
        .recv_mad(Duration::from_secs(5))
        .expect("recv")
        .expect("a MAD within 5 s");
    assert_eq!(got.mad, req, "the 256 bytes differ");
    assert_eq!(got.src, ip(&a));
    assert_eq!((got.src_qpn, got.pkey_index), (1, 0));

    let rep = cm_mad(0x1122_3344_5566_7788 ^ 0xff, cm_attr::REP);
    b.gsi()
        .send_mad(got.src, got.src_qpn, &rep)
        .expect("send REP");
    let back = a
        .gsi()
        .recv_mad(Duration::from_secs(5))
        .expect("recv")
        .expect("the answer within 5 s");
    assert_eq!(back.mad, rep);
    assert_eq!((back.src, back.src_qpn), (ip(&b), 1));

    // Nothing else arrives.
    assert_eq!(
        a.gsi().recv_mad(Duration::from_millis(50)).expect("recv"),
        None
    );
    assert_eq!(a.gsi().counters().mads_sent, 1);
    assert_eq!(a.gsi().counters().mads_received, 1);
    assert_eq!(b.gsi().recv_queue_depth(), GSI_RECV_DEPTH);
    a.close().expect("close a");
    b.close().expect("close b");
}

#[test]
fn a_datagram_with_another_qkey_is_dropped_and_counted() {
    let a = open("127.0.37.3");
    let b = open("127.0.37.4");
    // An application UD QP on A, Q_Key 0x1234 (high bit clear: sent as is, IBA C10-15).
    let ctx = a.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16, None, 0).expect("cq");
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ud = pd
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, cap))
        .expect("ud qp");
    ud.activate_ud(0x1234).expect("activate");
    let mr = pd
        .reg_mr(
            MemBlock::new(MAD_LEN).expect("block"),
            uroce_verbs::AccessFlags::empty(),
        )
        .expect("mr");
    mr.block()
        .copy_in(0, &cm_mad(0xbad, cm_attr::REQ))
        .expect("fill");
    let ah = pd.create_ah(&AhAttr::to_ip(ip(&b))).expect("ah");
    let mut wr = SendWr::send(
        9,
        vec![Sge {
            addr: mr.iova(),
            length: MAD_LEN as u32,
            lkey: mr.lkey(),
        }],
    );
    wr.ud = Some(UdDest {
        ah: ah.reference(),
        remote_qpn: 1,
        remote_qkey: 0x1234,
    });
    ud.post_send(wr).expect("post");
    let start = Instant::now();
    let wc = loop {
        if let Some(wc) = cq.poll(1).pop() {
            break wc;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no send completion"
        );
    };
    assert_eq!(wc.status, WcStatus::Success);

    eventually("B's QP1 counts the Q_Key violation", || {
        b.gsi().counters().engine.dropped_bad_qkey == 1
    });
    assert_eq!(
        b.gsi().recv_mad(Duration::from_millis(100)).expect("recv"),
        None,
        "a datagram with the wrong Q_Key was delivered"
    );
    // The GSI path itself works: a MAD from A's QP1 arrives.
    let good = cm_mad(0x600d, cm_attr::DREQ);
    a.gsi().send_mad(ip(&b), 1, &good).expect("send");
    let got = b
        .gsi()
        .recv_mad(Duration::from_secs(5))
        .expect("recv")
        .expect("the GSI MAD");
    assert_eq!(tid_of(&got.mad), 0x600d);
    let c = b.gsi().counters();
    assert_eq!((c.mads_received, c.engine.dropped_bad_qkey), (1, 1));
    assert_eq!(b.gsi().recv_queue_depth(), GSI_RECV_DEPTH);
}

#[test]
fn many_mads_both_ways_leak_no_buffer() {
    let a = open("127.0.37.5");
    let b = open("127.0.37.6");
    const WINDOW: u64 = 32;
    const ROUNDS: u64 = 20;
    for round in 0..ROUNDS {
        for i in 0..WINDOW {
            let t = round * WINDOW + i;
            a.gsi()
                .send_mad(ip(&b), 1, &cm_mad(t, cm_attr::REQ))
                .expect("a sends");
            b.gsi()
                .send_mad(ip(&a), 1, &cm_mad(1 << 32 | t, cm_attr::REP))
                .expect("b sends");
        }
        for (rx, tx, high) in [(&a, &b, 1u64 << 32), (&b, &a, 0)] {
            for i in 0..WINDOW {
                let m = rx
                    .gsi()
                    .recv_mad(Duration::from_secs(5))
                    .expect("recv")
                    .unwrap_or_else(|| panic!("round {round}: MAD {i} missing"));
                assert_eq!(tid_of(&m.mad), high | (round * WINDOW + i));
                assert_eq!(m.mad, cm_mad(high | (round * WINDOW + i), m.mad[17].into()));
                assert_eq!(m.src, ip(tx));
            }
        }
    }
    for d in [&a, &b] {
        let g = d.gsi();
        let c = g.counters();
        assert_eq!(c.mads_sent, WINDOW * ROUNDS);
        assert_eq!(c.mads_received, WINDOW * ROUNDS);
        assert_eq!(
            (c.send_errors, c.dropped_not_mad, c.repost_failures),
            (0, 0, 0)
        );
        assert_eq!(c.engine.dropped_no_receive, 0);
        assert_eq!(g.recv_queue_depth(), GSI_RECV_DEPTH, "receive slots leaked");
        eventually("every send slot comes back", || {
            g.free_send_slots() == GSI_SEND_DEPTH
        });
    }
}

#[test]
fn qp1_belongs_to_the_device() {
    let a = open("127.0.37.7");
    let ctx = a.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16, None, 0).expect("cq");
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    assert!(matches!(
        pd.create_qp(&QpInitAttr::new(QpType::Gsi, &cq, &cq, cap)),
        Err(CreateQpError::GsiExists)
    ));
    // An application's own UD QP gets an ordinary number.
    let ud = pd
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, cap))
        .expect("ud");
    assert!(ud.qp_num() >= 16);
    assert!(ctx.lookup_qp(1).is_some_and(|q| q.qp_type() == QpType::Gsi));
}

#[test]
fn bad_sends_are_refused_with_typed_errors() {
    let a = open("127.0.37.8");
    let g = a.gsi();
    assert_eq!(
        g.send_mad("127.0.37.9".parse().expect("ip"), 1, &[0u8; 100]),
        Err(GsiError::MadLength(100))
    );
    assert!(matches!(
        g.send_mad("::1".parse().expect("ip"), 1, &cm_mad(1, cm_attr::REQ)),
        Err(GsiError::AddressFamily { .. })
    ));
    assert_eq!(g.counters().mads_sent, 0);
    assert_eq!(g.free_send_slots(), GSI_SEND_DEPTH);
}

#[test]
fn a_device_closes_with_mads_unread_and_its_address_is_free_again() {
    let a = open("127.0.37.10");
    let b = open("127.0.37.11");
    for t in 0..5 {
        a.gsi()
            .send_mad(ip(&b), 1, &cm_mad(t, cm_attr::REQ))
            .expect("send");
    }
    eventually("B's QP1 has received them", || {
        b.gsi().counters().engine.packets_received == 5
    });
    b.close().expect("close with MADs unread");
    a.close().expect("close");
    // Everything of the old device is gone: the address binds again, QP1 is created anew.
    let b2 = open("127.0.37.11");
    assert_eq!(b2.gsi().recv_queue_depth(), GSI_RECV_DEPTH);
    assert_eq!(b2.gsi().counters().mads_received, 0);
}
