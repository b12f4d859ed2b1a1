//! IBA 1.5 ATOMIC WRITE between two network devices in one process, over real loopback
//! sockets: the 8 bytes land as one store (a reader on the target never sees a torn
//! word), the work completion says ATOMIC_WRITE, a misaligned address and a region without
//! REMOTE_WRITE fail with the statuses the responder's NAKs map to, memory untouched.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, Mr, Pd, PostError, Qp, QpCap, QpInitAttr, QpType, RcConnect,
    RdmaInfo, SendFlags, SendOpcode, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

const LEN: usize = 4096;
/// Two values whose halves differ: a torn store would show a mix.
const P1: [u8; 8] = [0x11; 8];
const P2: [u8; 8] = [0xEE, 0xDD, 0xCC, 0xBB, 0xAA, 0x99, 0x88, 0x77];

struct Side {
    dev: NetDevice,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

/// A device at `addr` with an RC QP (`max_inline_data` 0: ATOMIC WRITE's 8 bytes are an
/// operand, not inline data) and a 4 KiB region with `access`.
fn side(addr: &str, access: AccessFlags) -> Side {
    let mut cfg = NetConfig::new(addr.parse::<IpAddr>().expect("addr"));
    cfg.faults = None;
    let dev = NetDevice::open(cfg).expect("open device");
    let ctx = dev.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(256, None, 0).expect("cq");
    let cap = QpCap {
        max_send_wr: 4096,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
        .expect("qp");
    let mr = pd
        .reg_mr(MemBlock::new(LEN).expect("block"), access)
        .expect("mr");
    Side {
        dev,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn pair(a: &str, b: &str, b_access: AccessFlags) -> (Side, Side) {
    let a = side(a, AccessFlags::LOCAL_WRITE);
    let b = side(b, b_access);
    for (me, peer) in [(&a, &b), (&b, &a)] {
        let c = RcConnect {
            timeout: 10,
            ..RcConnect::new(peer.dev.local_addr().ip(), peer.qp.qp_num())
        };
        me.qp.connect_rc(&c).expect("RESET to RTS");
    }
    (a, b)
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

fn word(mr: &Mr, off: usize) -> [u8; 8] {
    let mut w = [0u8; 8];
    mr.block().copy_out(off, &mut w).expect("read");
    w
}

#[test]
fn atomic_write_stores_eight_bytes_as_one_word() {
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (a, b) = pair("127.0.46.1", "127.0.46.2", rw);
    b.mr.block().fill(0, LEN, 0x5A).expect("fill");

    // The bytes inline with the WR (the Rust builder), and from an 8-byte SGE.
    a.qp.post_send(SendWr::atomic_write(1, b.mr.rkey(), b.mr.iova() + 8, P1))
        .expect("post inline");
    a.mr.block().copy_in(64, &P2).expect("fill");
    let from_sge = SendWr {
        wr_id: 2,
        opcode: SendOpcode::AtomicWrite,
        flags: SendFlags::SIGNALED,
        sg_list: vec![Sge {
            addr: a.mr.iova() + 64,
            length: 8,
            lkey: a.mr.lkey(),
        }],
        rdma: RdmaInfo {
            remote_addr: b.mr.iova() + 16,
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(from_sge).expect("post sge");
    let wc = wait(&a.cq, 2);
    let got: Vec<_> = wc
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::AtomicWrite, 8),
            (2, WcStatus::Success, WcOpcode::AtomicWrite, 8),
        ]
    );
    assert_eq!(word(&b.mr, 8), P1);
    assert_eq!(word(&b.mr, 16), P2);
    assert_eq!(word(&b.mr, 0), [0x5A; 8], "neighbours untouched");
    assert_eq!(word(&b.mr, 24), [0x5A; 8]);

    // A reader on B loads the word while A writes P1 and P2 alternately: each load sees a
    // whole value, never a mix of the two.
    let target = 128;
    b.mr.block()
        .atomic_store(target, u64::from_ne_bytes(P1))
        .expect("store");
    let stop = AtomicBool::new(false);
    let (p1, p2) = (u64::from_ne_bytes(P1), u64::from_ne_bytes(P2));
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut loads, mut seen2) = (0u64, 0u64);
            // Bounded: A's writes end within the 20 s of `wait`, and so does this loop.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let v = b.mr.block().atomic_load(target).expect("load");
                assert!(v == p1 || v == p2, "torn word {v:#018x}");
                loads += 1;
                seen2 += u64::from(v == p2);
            }
            (loads, seen2)
        });
        // Unsignaled but the last: each leaves the send queue when it completes.
        const N: u64 = 2000;
        for i in 0..N {
            let value = if i % 2 == 0 { P2 } else { P1 };
            let at = b.mr.iova() + target as u64;
            let mut w = SendWr::atomic_write(100 + i, b.mr.rkey(), at, value);
            if i + 1 < N {
                w.flags -= SendFlags::SIGNALED;
            }
            a.qp.post_send(w).expect("post");
        }
        let wc = wait(&a.cq, 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (100 + N - 1, WcStatus::Success)
        );
        stop.store(true, Ordering::Relaxed);
        let (loads, seen2) = reader.join().expect("reader");
        assert!(
            loads > 0 && seen2 > 0,
            "loads {loads}, saw P2 {seen2} times"
        );
    });
    assert_eq!(word(&b.mr, target), P1, "the last value written");
}

#[test]
fn atomic_write_errors() {
    // Post time: not 8 bytes; not on UC (refused by the verbs layer).
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (a, b) = pair("127.0.46.3", "127.0.46.4", rw);
    let mut w = SendWr::atomic_write(1, b.mr.rkey(), b.mr.iova(), P1);
    w.inline_data.pop();
    assert!(matches!(
        a.qp.post_send(w),
        Err(PostError::AtomicWriteLength { len: 7 })
    ));

    // A misaligned address: the target NAKs an invalid request, memory untouched.
    b.mr.block().fill(0, LEN, 0x5A).expect("fill");
    a.qp.post_send(SendWr::atomic_write(2, b.mr.rkey(), b.mr.iova() + 4, P1))
        .expect("post");
    let wc = wait(&a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::RemInvReqErr));
    assert_eq!(word(&b.mr, 0), [0x5A; 8]);
    assert_eq!(word(&b.mr, 8), [0x5A; 8]);

    // A region without REMOTE_WRITE: remote access error, memory untouched.
    let ro = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (a, b) = pair("127.0.46.5", "127.0.46.6", ro);
    b.mr.block().fill(0, LEN, 0x5A).expect("fill");
    a.qp.post_send(SendWr::atomic_write(3, b.mr.rkey(), b.mr.iova() + 8, P1))
        .expect("post");
    let wc = wait(&a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (3, WcStatus::RemAccessErr));
    assert_eq!(word(&b.mr, 8), [0x5A; 8]);

    // UC has no ATOMIC WRITE.
    let dev = NetDevice::open(NetConfig::new("127.0.46.7".parse().expect("addr"))).expect("dev");
    let ctx = dev.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16, None, 0).expect("cq");
    let uc = pd
        .create_qp(&QpInitAttr::new(QpType::Uc, &cq, &cq, QpCap::default()))
        .expect("uc qp");
    assert!(matches!(
        uc.post_send(SendWr::atomic_write(4, 1, 0, P1)),
        Err(PostError::UnsupportedOpcode {
            opcode: SendOpcode::AtomicWrite,
            qp_type: QpType::Uc
        })
    ));
}
