//! One network device with a PD, a CQ, a 64 KiB region and UD QPs, for the multicast tests
//! (`mcast.rs` on loopback, `mcast_ipv6.rs` on a veth pair).
//!
//! Include it with `#[path = "support/ud.rs"] mod ud;` (not part of `support/mod.rs`).
#![allow(dead_code)] // each test binary uses a different subset

use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, Sge, WorkCompletion,
};

/// A device on `addr` without injected faults.
pub fn open(addr: IpAddr) -> NetDevice {
    let mut cfg = NetConfig::new(addr);
    cfg.faults = None;
    NetDevice::open(cfg).expect("open device")
}

/// A device's PD, its one CQ (sends and receives of every QP) and its region.
pub struct Node {
    pub pd: Pd,
    pub cq: Cq,
    pub mr: Mr,
}

/// The verbs objects of `dev`: a CQ of 256 entries, a 64 KiB region with local write.
pub fn node(dev: &NetDevice) -> Node {
    let ctx = dev.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(256, None, 0).expect("cq");
    let mr = pd
        .reg_mr(
            MemBlock::new(64 * 1024).expect("block"),
            AccessFlags::LOCAL_WRITE,
        )
        .expect("mr");
    Node { pd, cq, mr }
}

/// A UD QP of `n` with Q_Key `qkey`, in RTS (16 send and receive WRs, one SGE each).
pub fn ud_qp(n: &Node, qkey: u32) -> Qp {
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp =
        n.pd.create_qp(&QpInitAttr::new(QpType::Ud, &n.cq, &n.cq, cap))
            .expect("ud qp");
    qp.activate_ud(qkey).expect("activate");
    qp
}

/// An SGE of `n`'s region: `len` bytes at offset `off`.
pub fn sge(n: &Node, off: usize, len: usize) -> Sge {
    Sge {
        addr: n.mr.iova() + off as u64,
        length: len as u32,
        lkey: n.mr.lkey(),
    }
}

/// Completions of `cq` within `limit` (bounded), until `n` arrived.
pub fn poll(cq: &Cq, n: usize, limit: Duration) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n && start.elapsed() < limit {
        let c = cq.poll(16);
        if c.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        got.extend(c);
    }
    got
}
