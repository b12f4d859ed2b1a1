//! Modifies of a running QP reach its transport engine: the attributes IBA lets
//! `ibv_modify_qp` change after RTR (access flags in RTS→RTS, the address vector in
//! SQD→SQD; IBA Vol 1 §11.2.4.2's state table) take effect on the next packet. Two (and
//! three) devices on loopback, real sockets.

#[path = "support/pair.rs"]
mod pair;

use std::time::{Duration, Instant};

use pair::{connect, wait, ConnectOpts, Side, SideConfig};
use uroce_verbs::{AccessFlags, AttrMask, QpAttr, QpState, RcConnect, SendWr, WcStatus};

const LIMIT: Duration = Duration::from_secs(10);

/// Posts a 32-byte RDMA WRITE of `byte`s from the start of `from`'s region to `to`'s.
fn post_write(from: &Side, to: &Side, wr_id: u64, byte: u8) {
    from.mr.block().fill(0, 32, byte).expect("fill");
    from.qp
        .post_send(from.write_wr(to, wr_id, 32))
        .expect("post");
}

/// [`post_write`], and the status it completed with.
fn write(from: &Side, to: &Side, wr_id: u64, byte: u8) -> WcStatus {
    post_write(from, to, wr_id, byte);
    let wc = wait(&from.send_cq, 1, LIMIT, "the WRITE");
    assert_eq!(wc[0].wr_id, wr_id);
    wc[0].status
}

#[test]
fn revoking_remote_write_in_rts_refuses_the_next_write() {
    let a = Side::open(&SideConfig::new("127.0.63.1", "uroce0"));
    let b = Side::open(&SideConfig::new("127.0.63.2", "uroce1"));
    let o = ConnectOpts {
        timeout: 14,
        ..ConnectOpts::default()
    };
    connect(&a, &b, &o);
    assert_eq!(write(&a, &b, 1, 0x11), WcStatus::Success);
    assert_eq!(b.mr.block().to_vec().expect("read")[..32], [0x11; 32]);

    // RTS→RTS: B now allows remote READ only.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    };
    b.qp.modify(&attr, AttrMask::STATE | AttrMask::ACCESS_FLAGS)
        .expect("modify RTS->RTS");
    // A QP not enabled for remote WRITE answers NAK Invalid Request (as rxe does; an
    // R_Key violation would be a Remote Access Error).
    assert_eq!(write(&a, &b, 2, 0x22), WcStatus::RemInvReqErr);
    assert_eq!(
        b.mr.block().to_vec().expect("read")[..32],
        [0x11; 32],
        "the WRITE after the revocation landed"
    );
    a.close();
    b.close();
}

#[test]
fn a_new_address_vector_in_sqd_moves_the_connection_to_the_new_path() {
    // A and C number their QPs alike (one QP each), so C's QP can stand in for A's at
    // another address: the same peer QP reached over a new path, as after a failover.
    let a = Side::open(&SideConfig::new("127.0.63.11", "uroce0"));
    let b = Side::open(&SideConfig::new("127.0.63.12", "uroce1"));
    let c = Side::open(&SideConfig::new("127.0.63.13", "uroce2"));
    assert_eq!(
        a.qp.qp_num(),
        c.qp.qp_num(),
        "the test needs C's QP to have A's number"
    );
    let o = ConnectOpts {
        timeout: 14,
        ..ConnectOpts::default()
    };
    connect(&a, &b, &o);
    assert_eq!(write(&a, &b, 1, 0x11), WcStatus::Success);

    // B: RTS → SQD (nothing in flight: drained at once) → SQD with C's address → RTS.
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        ..QpAttr::default()
    };
    b.qp.modify(&sqd, AttrMask::STATE).expect("RTS->SQD");
    let start = Instant::now();
    while b.qp.query().0.sq_draining {
        assert!(start.elapsed() < LIMIT, "B's send queue did not drain");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (to_c, _) = RcConnect::new(c.ip(), c.qp.qp_num()).rtr_attr();
    let path = QpAttr {
        qp_state: QpState::Sqd,
        ah_attr: to_c.ah_attr,
        ..QpAttr::default()
    };
    b.qp.modify(&path, AttrMask::STATE | AttrMask::AV)
        .expect("SQD->SQD with a new address vector");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    b.qp.modify(&rts, AttrMask::STATE).expect("SQD->RTS");

    // C's QP continues A's side of the connection: its first PSN is the one B expects
    // next (A sent one single-packet WRITE).
    let c_opts = ConnectOpts {
        start_psn: o.start_psn + 1,
        ..o
    };
    // Only C's QP is taken through RTR/RTS here; B's stays where it is.
    let (init, mask) = RcConnect::new(b.ip(), b.qp.qp_num()).init_attr();
    c.qp.modify(&init, mask).expect("C to INIT");
    let conn = RcConnect {
        rq_psn: uroce_wire::psn::Psn::new(c_opts.start_psn),
        sq_psn: uroce_wire::psn::Psn::new(c_opts.start_psn),
        timeout: c_opts.timeout,
        ..RcConnect::new(b.ip(), b.qp.qp_num())
    };
    let (rtr, mask) = conn.rtr_attr();
    c.qp.modify(&rtr, mask).expect("C to RTR");
    let (rts, mask) = conn.rts_attr();
    c.qp.modify(&rts, mask).expect("C to RTS");

    // C's WRITE executes on B; before the change it would have been dropped as coming
    // from an address that is not B's peer.
    assert_eq!(write(&c, &b, 2, 0x33), WcStatus::Success);
    assert_eq!(b.mr.block().to_vec().expect("read")[..32], [0x33; 32]);
    // A's packets now come from off the path: dropped and counted, memory untouched.
    let dropped = |s: &Side| {
        s.dev
            .qp_counters(s.qp.qp_num())
            .map_or(0, |c| c.transport.dropped_bad_address)
    };
    assert_eq!(dropped(&b), 0);
    post_write(&a, &b, 3, 0x44);
    let start = Instant::now();
    while dropped(&b) == 0 {
        assert!(start.elapsed() < LIMIT, "A's WRITE was not dropped");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(b.mr.block().to_vec().expect("read")[..32], [0x33; 32]);
    a.close();
    b.close();
    c.close();
}

/// One UD QP on a device of its own, with a 4 KiB region: receive slots at 0 and 1024,
/// the send buffer at 2048.
struct UdNode {
    qp: uroce_verbs::Qp,
    mr: uroce_verbs::Mr,
    cq: uroce_verbs::Cq,
    pd: uroce_verbs::Pd,
    dev: uroce_net::NetDevice,
}

impl UdNode {
    fn open(addr: &str, qkey: u32) -> UdNode {
        use uroce_verbs::{MemBlock, QpCap, QpInitAttr, QpType};
        let dev =
            uroce_net::NetDevice::open(uroce_net::NetConfig::new(addr.parse().expect("address")))
                .expect("open device");
        let pd = dev.context().alloc_pd().expect("pd");
        let cq = dev.context().create_cq(16, None, 0).expect("cq");
        let mr = pd
            .reg_mr(
                MemBlock::new(4096).expect("memory"),
                AccessFlags::LOCAL_WRITE,
            )
            .expect("mr");
        let cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, cap))
            .expect("qp");
        qp.activate_ud(qkey).expect("activate");
        UdNode {
            qp,
            mr,
            cq,
            pd,
            dev,
        }
    }

    fn post_recv(&self, slot: u64) {
        let sge = uroce_verbs::Sge {
            addr: self.mr.iova() + slot * 1024,
            length: 1024,
            lkey: self.mr.lkey(),
        };
        self.qp
            .post_recv(uroce_verbs::RecvWr::new(slot, vec![sge]))
            .expect("post recv");
    }

    /// Sends 16 bytes to `to` with `qkey`; waits for the send completion.
    fn send(&self, to: &UdNode, qkey: u32) {
        let ah = self
            .pd
            .create_ah(&uroce_verbs::AhAttr::to_ip(to.dev.local_addr().ip()))
            .expect("ah");
        self.mr.block().fill(2048, 16, 0x5a).expect("fill");
        let mut wr = SendWr::send(
            9,
            vec![uroce_verbs::Sge {
                addr: self.mr.iova() + 2048,
                length: 16,
                lkey: self.mr.lkey(),
            }],
        );
        wr.ud = Some(uroce_verbs::UdDest {
            ah: ah.reference(),
            remote_qpn: to.qp.qp_num(),
            remote_qkey: qkey,
        });
        self.qp.post_send(wr).expect("post send");
        let wc = wait(&self.cq, 1, LIMIT, "the datagram's send");
        assert_eq!(wc[0].status, WcStatus::Success);
    }

    fn bad_qkey_drops(&self) -> u64 {
        self.dev
            .qp_counters(self.qp.qp_num())
            .map_or(0, |c| c.transport.dropped_bad_qkey)
    }
}

#[test]
fn a_new_qkey_in_rts_is_the_one_datagrams_are_checked_against() {
    const OLD: u32 = 0x1111_0001;
    const NEW: u32 = 0x2222_0002;
    let a = UdNode::open("127.0.63.21", OLD);
    let b = UdNode::open("127.0.63.22", OLD);
    b.post_recv(0);
    a.send(&b, OLD);
    let wc = wait(&b.cq, 1, LIMIT, "the first datagram");
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 40 + 16));

    // RTS→RTS with another Q_Key (IBV_QP_QKEY).
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qkey: NEW,
        ..QpAttr::default()
    };
    b.qp.modify(&attr, AttrMask::STATE | AttrMask::QKEY)
        .expect("modify RTS->RTS with a Q_Key");
    b.post_recv(1);
    // The old Q_Key is now a violation: dropped and counted, the receive WQE stays.
    a.send(&b, OLD);
    let start = Instant::now();
    while b.bad_qkey_drops() == 0 {
        assert!(
            start.elapsed() < LIMIT,
            "a datagram with the old Q_Key was not dropped"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        b.cq.poll(1).is_empty(),
        "the old Q_Key's datagram completed"
    );
    a.send(&b, NEW);
    let wc = wait(&b.cq, 1, LIMIT, "the datagram with the new Q_Key");
    assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, 1));
    assert_eq!(b.bad_qkey_drops(), 1);
}
