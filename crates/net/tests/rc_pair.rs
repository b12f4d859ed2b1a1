//! Two network devices in one process, an RC QP on each, every RC operation over real
//! loopback sockets, with data checked byte for byte.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, AtomicInfo, CompChannel, Cq, MemBlock, Mr, Pd, Qp, QpCap, QpInitAttr, QpType,
    RcConnect, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

const LEN: usize = 256 * 1024;

struct Side {
    dev: NetDevice,
    _pd: Pd,
    cq: Cq,
    _ch: Option<CompChannel>,
    qp: Qp,
    mr: Mr,
}

fn side(addr: &str, event: bool) -> Side {
    let mut cfg = NetConfig::new(addr.parse::<IpAddr>().expect("addr"));
    cfg.faults = None;
    let dev = NetDevice::open(cfg).expect("open device");
    let ctx = dev.context();
    let pd = ctx.alloc_pd().expect("pd");
    let ch = event.then(|| ctx.create_comp_channel().expect("channel"));
    let cq = ctx.create_cq(4096, ch.as_ref(), 0).expect("cq");
    let cap = QpCap {
        max_send_wr: 512,
        max_recv_wr: 512,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
        .expect("qp");
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd
        .reg_mr(MemBlock::new(LEN).expect("block"), access)
        .expect("mr");
    Side {
        dev,
        _pd: pd,
        cq,
        _ch: ch,
        qp,
        mr,
    }
}

fn connect(a: &Side, b: &Side, mtu: Pmtu) {
    for (me, peer) in [(a, b), (b, a)] {
        let c = RcConnect {
            path_mtu: mtu,
            rq_psn: Psn::new(100),
            sq_psn: Psn::new(100),
            min_rnr_timer: 1,
            // Nothing is lost here: a timeout long enough for a starved peer thread.
            timeout: 14,
            ..RcConnect::new(peer.dev.local_addr().ip(), peer.qp.qp_num())
        };
        me.qp.connect_rc(&c).expect("RESET to RTS");
    }
}

/// Waits (bounded) for `n` completions on `cq`, busy polling.
fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        out.extend(cq.poll(n - out.len()));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out with {} of {n} completions",
            out.len()
        );
    }
    out
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(u32::from(seed)) as u8)
        .collect()
}

fn sge(mr: &Mr, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.iova() + off as u64,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

#[test]
fn every_rc_operation_between_two_devices() {
    let a = side("127.0.2.1", false);
    let b = side("127.0.2.2", false);
    connect(&a, &b, Pmtu::Mtu1024);

    // SEND 100 KiB (segmented) into a posted receive.
    let data = pattern(1, 100 * 1024);
    a.mr.block().copy_in(0, &data).expect("fill");
    b.qp.post_recv(RecvWr::new(7, vec![sge(&b.mr, 0, LEN)]))
        .expect("recv");
    a.qp.post_send(SendWr::send(1, vec![sge(&a.mr, 0, data.len())]))
        .expect("send");
    let wa = wait(&a.cq, 1);
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::Send)
    );
    let wb = wait(&b.cq, 1);
    assert_eq!((wb[0].status, wb[0].wr_id), (WcStatus::Success, 7));
    assert_eq!(wb[0].byte_len as usize, data.len());
    let mut got = vec![0; data.len()];
    b.mr.block().copy_out(0, &mut got).expect("read");
    assert!(got == data, "SEND payload differs");

    // RDMA WRITE 200 KiB from A into B at offset 4096.
    let data = pattern(2, 200 * 1024);
    a.mr.block().copy_in(0, &data).expect("fill");
    let mut w = SendWr {
        wr_id: 2,
        opcode: SendOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED,
        sg_list: vec![sge(&a.mr, 0, data.len())].into(),
        rdma: RdmaInfo {
            remote_addr: b.mr.iova() + 4096,
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(w.clone()).expect("write");
    let wa = wait(&a.cq, 1);
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut got = vec![0; data.len()];
    b.mr.block().copy_out(4096, &mut got).expect("read");
    assert!(got == data, "WRITE payload differs");

    // RDMA READ 150 KiB from B back into A at offset 0 (after clearing it).
    a.mr.block().fill(0, LEN, 0).expect("clear");
    w.wr_id = 3;
    w.opcode = SendOpcode::RdmaRead;
    w.sg_list = vec![sge(&a.mr, 0, 150 * 1024)].into();
    a.qp.post_send(w).expect("read");
    let wa = wait(&a.cq, 1);
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = vec![0; 150 * 1024];
    a.mr.block().copy_out(0, &mut got).expect("read back");
    assert!(got == data[..150 * 1024], "READ payload differs");

    // Atomics on B's word at offset 0: fetch-add then compare-swap.
    b.mr.block().atomic_store(0, 40).expect("store");
    let fa = SendWr {
        wr_id: 4,
        opcode: SendOpcode::AtomicFetchAndAdd,
        flags: SendFlags::SIGNALED,
        sg_list: vec![sge(&a.mr, 64, 8)].into(),
        atomic: AtomicInfo {
            remote_addr: b.mr.iova(),
            compare_add: 2,
            swap: 0,
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(fa).expect("fetch-add");
    let wa = wait(&a.cq, 1);
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(a.mr.block().atomic_load(64).expect("load"), 40);
    let cs = SendWr {
        wr_id: 5,
        opcode: SendOpcode::AtomicCmpAndSwp,
        flags: SendFlags::SIGNALED,
        sg_list: vec![sge(&a.mr, 72, 8)].into(),
        atomic: AtomicInfo {
            remote_addr: b.mr.iova(),
            compare_add: 42,
            swap: 7,
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(cs).expect("cmp-swap");
    let wa = wait(&a.cq, 1);
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::CompSwap)
    );
    assert_eq!(a.mr.block().atomic_load(72).expect("load"), 42);
    assert_eq!(b.mr.block().atomic_load(0).expect("load"), 7);

    let ca = a.dev.counters();
    assert!(ca.socket.tx_packets > 100, "{ca:?}");
    assert_eq!(ca.socket.bad_icrc, 0);
    let qc = a.dev.qp_counters(a.qp.qp_num()).expect("qp counters");
    assert!(qc.transport.packets_sent > 100);
}

#[test]
fn event_mode_send_ping_pong() {
    let a = side("127.0.2.3", true);
    let b = side("127.0.2.4", true);
    connect(&a, &b, Pmtu::Mtu4096);
    let ch_b = b._ch.as_ref().expect("channel");
    for i in 0..50u64 {
        b.qp.post_recv(RecvWr::new(i, vec![sge(&b.mr, 0, 64)]))
            .expect("recv");
        b.cq.req_notify(false).expect("arm");
        a.mr.block().copy_in(0, &i.to_le_bytes()).expect("fill");
        a.qp.post_send(SendWr::send(i, vec![sge(&a.mr, 0, 8)]))
            .expect("send");
        // Nobody polls B: only its progress thread can deliver this.
        let ev = ch_b
            .get_cq_event(Some(Duration::from_secs(10)))
            .expect("cq event");
        ev.ack();
        let wc = b.cq.poll(1);
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].wr_id, i);
        assert_eq!(b.mr.block().atomic_load(0).expect("load"), i);
        let wa = wait(&a.cq, 1);
        assert_eq!(wa[0].status, WcStatus::Success);
    }
}

/// A busy-polling receiver holds its ACK back for its next post. If instead it destroys
/// the QP right after its last completion (a ping-pong's last iteration), the ACK must
/// still leave: the sender's SEND completes successfully instead of retrying until
/// RETRY_EXC_ERR.
#[test]
fn held_back_ack_leaves_when_the_receiver_destroys_its_qp() {
    let a = side("127.0.2.5", false);
    let b = side("127.0.2.6", false);
    connect(&a, &b, Pmtu::Mtu1024);
    b.qp.post_recv(RecvWr::new(1, vec![sge(&b.mr, 0, 64)]))
        .expect("recv");
    // B busy polls before the message arrives, so its receive step defers the ACK.
    let early = b.cq.poll(1);
    assert!(early.is_empty());
    a.qp.post_send(SendWr::send(9, vec![sge(&a.mr, 0, 8)]))
        .expect("send");
    let wb = wait(&b.cq, 1);
    assert_eq!(wb[0].status, WcStatus::Success);
    // Destroy B's QP at once, without another poll or post on B.
    let Side { qp, .. } = b;
    qp.destroy().map_err(|(_, e)| e).expect("destroy");
    // With the timeout code 10 of `connect` (about 4 ms, 7 retries) a lost ACK would end
    // in RETRY_EXC_ERR within a few tens of milliseconds.
    let wa = wait(&a.cq, 1);
    assert_eq!(
        (wa[0].wr_id, wa[0].status),
        (9, WcStatus::Success),
        "the SEND must be acknowledged"
    );
}
