//! Memory windows between two network devices over loopback: type 1 and type 2 binds,
//! RDMA WRITE/READ through a window with data checked, accesses outside a window, with
//! missing rights, after LOCAL_INV and after a peer's SEND with Invalidate (each
//! REM_ACCESS_ERR with the target memory untouched), SEND with Invalidate naming what a
//! peer may not invalidate, send-queue ordering of local operations, and deregistration
//! of a region with a bound window.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::mw::inc_rkey;
use uroce_verbs::{
    AccessFlags, BindMwWr, Cq, DestroyError, MemBlock, Mr, MwBindInfo, MwType, Pd, Qp, QpCap,
    QpInitAttr, QpType, RcConnect, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, Sge, WcFlags,
    WcOpcode, WcStatus, WorkCompletion,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

const LEN: usize = 64 * 1024;
/// Where the windows of these tests start in the target region, and their length.
const WIN_OFF: u64 = 4096;
const WIN_LEN: u64 = 8192;

struct Side {
    dev: NetDevice,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(addr: &str, access: AccessFlags) -> Side {
    let mut cfg = NetConfig::new(addr.parse::<IpAddr>().expect("addr"));
    cfg.faults = None;
    let dev = NetDevice::open(cfg).expect("open device");
    let ctx = dev.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(256, None, 0).expect("cq");
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
        .expect("qp");
    let mr = pd
        .reg_mr(MemBlock::new(LEN).expect("block"), access)
        .expect("mr");
    Side {
        dev,
        pd,
        cq,
        qp,
        mr,
    }
}

fn full_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::MW_BIND
}

/// A connected pair on 127.0.77.(2n+1) and 127.0.77.(2n+2); `b` is the window owner.
fn pair(n: u8, b_access: AccessFlags) -> (Side, Side) {
    let a = side(&format!("127.0.77.{}", 2 * n + 1), full_access());
    let b = side(&format!("127.0.77.{}", 2 * n + 2), b_access);
    for (me, peer) in [(&a, &b), (&b, &a)] {
        let c = RcConnect {
            path_mtu: Pmtu::Mtu1024,
            rq_psn: Psn::new(10),
            sq_psn: Psn::new(10),
            min_rnr_timer: 1,
            // 67 ms and the default 7 retries: nothing here is lost, and a shorter budget
            // failed on a loaded 2-core machine with a starved peer thread.
            timeout: 14,
            ..RcConnect::new(peer.dev.local_addr().ip(), peer.qp.qp_num())
        };
        me.qp.connect_rc(&c).expect("RESET to RTS");
    }
    (a, b)
}

/// Waits (bounded) for `n` completions on `cq`.
fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        out.extend(cq.poll(n - out.len()));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out with {} of {n} completions: {out:?}",
            out.len()
        );
    }
    out
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(37).wrapping_add(u32::from(seed)) as u8)
        .collect()
}

fn sge(mr: &Mr, off: u64, len: u64) -> Sge {
    Sge {
        addr: mr.iova() + off,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

fn rdma(wr_id: u64, opcode: SendOpcode, local: Sge, remote_addr: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        flags: SendFlags::SIGNALED,
        sg_list: vec![local].into(),
        rdma: RdmaInfo { remote_addr, rkey },
        ..SendWr::default()
    }
}

fn window_info(b: &Side, access: AccessFlags) -> MwBindInfo {
    MwBindInfo {
        mr_lkey: b.mr.lkey(),
        addr: b.mr.iova() + WIN_OFF,
        length: WIN_LEN,
        access,
    }
}

fn snapshot(mr: &Mr) -> Vec<u8> {
    let mut v = vec![0; LEN];
    mr.block().copy_out(0, &mut v).expect("read");
    v
}

/// A WRITE of `len` bytes at window offset `off` with `rkey`: one completion on A.
fn write_status(a: &Side, b: &Side, wr_id: u64, rkey: u32, off: u64, len: u64) -> WcStatus {
    let w = rdma(
        wr_id,
        SendOpcode::RdmaWrite,
        sge(&a.mr, 0, len),
        b.mr.iova() + WIN_OFF + off,
        rkey,
    );
    a.qp.post_send(w).expect("post write");
    let wc = wait(&a.cq, 1);
    assert_eq!(wc[0].wr_id, wr_id);
    wc[0].status
}

/// Binds a type 2 window on B's QP with a BIND_MW work request; returns its new R_Key.
fn bind_type2(b: &Side, mw_rkey: u32, access: AccessFlags) -> (u32, WorkCompletion) {
    let new = inc_rkey(mw_rkey);
    let wr = SendWr {
        wr_id: 900,
        opcode: SendOpcode::BindMw,
        flags: SendFlags::SIGNALED,
        bind_mw: Some(BindMwWr::new(mw_rkey, new, window_info(b, access))),
        ..SendWr::default()
    };
    b.qp.post_send(wr).expect("post bind");
    let wc = wait(&b.cq, 1);
    (new, wc[0])
}

#[test]
fn type1_window_write_read_bounds_and_rebind() {
    let (a, b) = pair(0, full_access());
    let mw = b.pd.alloc_mw(MwType::Type1).expect("alloc mw");
    let unbound = mw.rkey();
    let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let rkey = mw
        .bind(&b.qp, 5, SendFlags::SIGNALED, window_info(&b, rw))
        .expect("bind");
    let wc = wait(&b.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (5, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_ne!(rkey, unbound, "a bind changes the key field");
    assert_eq!(mw.rkey(), rkey);
    assert!(mw.is_bound());

    // WRITE the whole window, then READ part of it back.
    let data = pattern(3, WIN_LEN as usize);
    a.mr.block().copy_in(0, &data).expect("fill");
    assert_eq!(write_status(&a, &b, 1, rkey, 0, WIN_LEN), WcStatus::Success);
    let mem = snapshot(&b.mr);
    assert!(mem[WIN_OFF as usize..(WIN_OFF + WIN_LEN) as usize] == data[..]);
    assert!(
        mem[..WIN_OFF as usize].iter().all(|&x| x == 0),
        "before the window"
    );

    let r = rdma(
        2,
        SendOpcode::RdmaRead,
        sge(&a.mr, 32 * 1024, 3000),
        b.mr.iova() + WIN_OFF + 1000,
        rkey,
    );
    a.qp.post_send(r).expect("post read");
    let wc = wait(&a.cq, 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    let mut got = vec![0; 3000];
    a.mr.block().copy_out(32 * 1024, &mut got).expect("read");
    assert!(got[..] == data[1000..4000], "READ through the window");

    // Rebinding (a type 1 window may be rebound) changes the key: the old one is dead.
    let rkey2 = mw
        .bind(&b.qp, 6, SendFlags::SIGNALED, window_info(&b, rw))
        .expect("rebind");
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    assert_ne!(rkey2, rkey);
    let before = snapshot(&b.mr);
    a.mr.block().copy_in(0, &pattern(9, 64)).expect("fill");
    assert_eq!(
        write_status(&a, &b, 3, rkey, 0, 64),
        WcStatus::RemAccessErr,
        "stale key after rebind"
    );
    assert!(snapshot(&b.mr) == before, "memory untouched");
}

#[test]
fn access_past_the_window_end_is_rem_access_err_and_untouched() {
    let (a, b) = pair(1, full_access());
    let mw = b.pd.alloc_mw(MwType::Type1).expect("alloc mw");
    let rkey = mw
        .bind(
            &b.qp,
            5,
            SendFlags::SIGNALED,
            window_info(&b, AccessFlags::REMOTE_WRITE),
        )
        .expect("bind");
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    a.mr.block().copy_in(0, &pattern(4, 64)).expect("fill");
    let before = snapshot(&b.mr);
    // 16 bytes starting 8 before the end: inside the region, outside the window.
    assert_eq!(
        write_status(&a, &b, 1, rkey, WIN_LEN - 8, 16),
        WcStatus::RemAccessErr
    );
    assert!(snapshot(&b.mr) == before, "memory untouched");
}

#[test]
fn wrong_access_rights() {
    let (a, b) = pair(2, full_access());
    // A read-only window refuses a WRITE.
    let mw = b.pd.alloc_mw(MwType::Type1).expect("alloc mw");
    let rkey = mw
        .bind(
            &b.qp,
            5,
            SendFlags::SIGNALED,
            window_info(&b, AccessFlags::REMOTE_READ),
        )
        .expect("bind");
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    a.mr.block().copy_in(0, &pattern(5, 64)).expect("fill");
    let before = snapshot(&b.mr);
    assert_eq!(write_status(&a, &b, 1, rkey, 0, 64), WcStatus::RemAccessErr);
    assert!(snapshot(&b.mr) == before, "memory untouched");

    // A region registered without MW_BIND cannot have a window bound: MW_BIND_ERR.
    let (_a2, b2) = pair(3, full_access() - AccessFlags::MW_BIND);
    let mw2 = b2.pd.alloc_mw(MwType::Type2).expect("alloc mw");
    let (_, wc) = bind_type2(&b2, mw2.rkey(), AccessFlags::REMOTE_READ);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::MwBindErr, WcOpcode::BindMw)
    );
    assert!(!mw2.is_bound());

    // REMOTE_WRITE on a region without LOCAL_WRITE is not allowed (IBA 10.6.7.2).
    let (_a3, b3) = pair(4, AccessFlags::REMOTE_READ | AccessFlags::MW_BIND);
    let mw3 = b3.pd.alloc_mw(MwType::Type2).expect("alloc mw");
    let (_, wc) = bind_type2(&b3, mw3.rkey(), AccessFlags::REMOTE_WRITE);
    assert_eq!(wc.status, WcStatus::MwBindErr);
    assert!(!mw3.is_bound());
}

#[test]
fn type2_bind_local_inv_in_send_queue_order() {
    let (a, b) = pair(5, full_access());
    let mw = b.pd.alloc_mw(MwType::Type2).expect("alloc mw");
    let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (rkey, wc) = bind_type2(&b, mw.rkey(), rw);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(mw.rkey(), rkey);

    let data = pattern(6, 4096);
    a.mr.block().copy_in(0, &data).expect("fill");
    assert_eq!(write_status(&a, &b, 1, rkey, 100, 4096), WcStatus::Success);
    let mem = snapshot(&b.mr);
    let at = (WIN_OFF + 100) as usize;
    assert!(mem[at..at + 4096] == data[..]);

    // On B: a WRITE to A, LOCAL_INV, another WRITE: the completions come in posting order.
    let w1 = rdma(
        11,
        SendOpcode::RdmaWrite,
        sge(&b.mr, 0, 2048),
        a.mr.iova(),
        a.mr.rkey(),
    );
    let inv = SendWr {
        wr_id: 12,
        opcode: SendOpcode::LocalInv,
        flags: SendFlags::SIGNALED,
        invalidate_rkey: rkey,
        ..SendWr::default()
    };
    let w2 = rdma(
        13,
        SendOpcode::RdmaWrite,
        sge(&b.mr, 0, 2048),
        a.mr.iova(),
        a.mr.rkey(),
    );
    for w in [w1, inv, w2] {
        b.qp.post_send(w).expect("post");
    }
    let wcs = wait(&b.cq, 3);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (11, WcStatus::Success, WcOpcode::RdmaWrite),
            (12, WcStatus::Success, WcOpcode::LocalInv),
            (13, WcStatus::Success, WcOpcode::RdmaWrite),
        ]
    );
    assert!(!mw.is_bound());

    // After LOCAL_INV the key is dead.
    let before = snapshot(&b.mr);
    assert_eq!(write_status(&a, &b, 2, rkey, 0, 64), WcStatus::RemAccessErr);
    assert!(snapshot(&b.mr) == before, "memory untouched");

    // LOCAL_INV of a window that is not bound fails: LOC_QP_OP_ERR... on a fresh pair.
    let (_a2, b2) = pair(6, full_access());
    let mw2 = b2.pd.alloc_mw(MwType::Type2).expect("alloc mw");
    let inv = SendWr {
        wr_id: 14,
        opcode: SendOpcode::LocalInv,
        flags: SendFlags::SIGNALED,
        invalidate_rkey: mw2.rkey(),
        ..SendWr::default()
    };
    b2.qp.post_send(inv).expect("post");
    let wc = wait(&b2.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (14, WcStatus::LocQpOpErr, WcOpcode::LocalInv)
    );
}

#[test]
fn send_with_invalidate_invalidates_a_type2_window() {
    let (a, b) = pair(7, full_access());
    let mw = b.pd.alloc_mw(MwType::Type2).expect("alloc mw");
    let (rkey, wc) = bind_type2(&b, mw.rkey(), AccessFlags::REMOTE_WRITE);
    assert_eq!(wc.status, WcStatus::Success);

    b.qp.post_recv(RecvWr::new(70, vec![sge(&b.mr, 32 * 1024, 1024)]))
        .expect("recv");
    a.mr.block().copy_in(0, &pattern(7, 100)).expect("fill");
    let s = SendWr {
        wr_id: 1,
        opcode: SendOpcode::SendWithInv,
        flags: SendFlags::SIGNALED,
        sg_list: vec![sge(&a.mr, 0, 100)].into(),
        invalidate_rkey: rkey,
        ..SendWr::default()
    };
    a.qp.post_send(s).expect("send with inv");
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let wc = wait(&b.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (70, WcStatus::Success));
    assert!(wc[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(wc[0].invalidated_rkey, rkey);
    assert!(!mw.is_bound());

    let before = snapshot(&b.mr);
    assert_eq!(write_status(&a, &b, 2, rkey, 0, 64), WcStatus::RemAccessErr);
    assert!(snapshot(&b.mr) == before, "memory untouched");
}

#[test]
fn send_with_invalidate_of_a_region_or_type1_window_is_refused() {
    for (n, type1) in [(8u8, false), (9, true)] {
        let (a, b) = pair(n, full_access());
        let mw = b.pd.alloc_mw(MwType::Type1).expect("alloc mw");
        let target = if type1 {
            let k = mw
                .bind(
                    &b.qp,
                    5,
                    SendFlags::SIGNALED,
                    window_info(&b, AccessFlags::REMOTE_WRITE),
                )
                .expect("bind");
            assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
            k
        } else {
            b.mr.rkey()
        };
        b.qp.post_recv(RecvWr::new(70, vec![sge(&b.mr, 32 * 1024, 1024)]))
            .expect("recv");
        let s = SendWr {
            wr_id: 1,
            opcode: SendOpcode::SendWithInv,
            flags: SendFlags::SIGNALED,
            sg_list: vec![sge(&a.mr, 0, 100)].into(),
            invalidate_rkey: target,
            ..SendWr::default()
        };
        a.qp.post_send(s).expect("send with inv");
        let wc = wait(&a.cq, 1);
        assert_eq!(wc[0].status, WcStatus::RemInvReqErr, "type1 = {type1}");
        if type1 {
            assert!(mw.is_bound(), "a type 1 window stays bound");
        }
    }
}

#[test]
fn dereg_of_a_region_with_a_bound_window_is_busy() {
    let (_a, b) = pair(10, full_access());
    let extra =
        b.pd.reg_mr(MemBlock::new(LEN).expect("block"), full_access())
            .expect("mr");
    let mw = b.pd.alloc_mw(MwType::Type1).expect("alloc mw");
    mw.bind(
        &b.qp,
        5,
        SendFlags::SIGNALED,
        MwBindInfo {
            mr_lkey: extra.lkey(),
            addr: extra.iova(),
            length: 4096,
            access: AccessFlags::REMOTE_READ,
        },
    )
    .expect("bind");
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    let extra = match extra.destroy() {
        Err((mr, DestroyError::Busy { children, .. })) => {
            assert_eq!(children.mws, 1);
            mr
        }
        other => panic!("dereg with a bound window: {:?}", other.err().map(|e| e.1)),
    };
    // Deallocating the bound window is allowed and invalidates it; then dereg succeeds.
    mw.destroy().expect("dealloc mw");
    extra.destroy().expect("dereg after dealloc");
}

#[test]
fn dropping_a_region_with_a_bound_window_retires_its_memory_at_once() {
    let (a, b) = pair(11, full_access());
    let extra =
        b.pd.reg_mr(MemBlock::new(LEN).expect("block"), full_access())
            .expect("mr");
    let mw = b.pd.alloc_mw(MwType::Type1).expect("alloc mw");
    let rkey = mw
        .bind(
            &b.qp,
            5,
            SendFlags::SIGNALED,
            MwBindInfo {
                mr_lkey: extra.lkey(),
                addr: extra.iova(),
                length: 4096,
                access: AccessFlags::REMOTE_WRITE,
            },
        )
        .expect("bind");
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    let addr = extra.iova();
    // The window's reference does not make the drop wait for the destroy timeout.
    let start = Instant::now();
    drop(extra);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // The window still names the region, whose memory is gone: the access fails.
    let w = rdma(1, SendOpcode::RdmaWrite, sge(&a.mr, 0, 64), addr, rkey);
    a.qp.post_send(w).expect("post write");
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
}
