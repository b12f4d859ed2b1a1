//! IBA 1.5 ATOMIC WRITE between two network devices in one process, over real loopback
//! sockets: the 8 bytes land as one store (a reader on the target never sees a torn
//! word), the work completion says ATOMIC_WRITE, a misaligned address and a region without
//! REMOTE_WRITE fail with the statuses the responder's NAKs map to, memory untouched.

#[path = "support/pair.rs"]
mod pair;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pair::{connect, ConnectOpts, Side, SideConfig};
use uroce_net::{NetConfig, NetDevice};
use uroce_proto::wr::WrError;
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, Mr, PostError, QpCap, QpInitAttr, QpType, RdmaInfo, SendFlags,
    SendOpcode, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

const LEN: usize = 4096;
/// Two values whose halves differ: a torn store would show a mix.
const P1: [u8; 8] = [0x11; 8];
const P2: [u8; 8] = [0xEE, 0xDD, 0xCC, 0xBB, 0xAA, 0x99, 0x88, 0x77];

/// Two devices with connected RC QPs: send queues of 4096 (the torn-word run posts 2000
/// WRs) and `max_inline_data` 0 (ATOMIC WRITE's 8 bytes are an operand, not inline data).
fn pair(a: &str, b: &str) -> (Side, Side) {
    let open = |addr: &str, name: &str| {
        let mut cfg = SideConfig::new(addr, name);
        cfg.queue_depth = 4096;
        cfg.max_inline = 0;
        Side::open(&cfg)
    };
    let (a, b) = (open(a, "atomic-write-a"), open(b, "atomic-write-b"));
    connect(&a, &b, &ConnectOpts::default());
    (a, b)
}

/// Waits (bounded) for `n` completions on `cq`, busy polling.
fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    pair::wait(cq, n, Duration::from_secs(20), "atomic write")
}

fn word(mr: &Mr, off: usize) -> [u8; 8] {
    let mut w = [0u8; 8];
    mr.block().copy_out(off, &mut w).expect("read");
    w
}

#[test]
fn atomic_write_stores_eight_bytes_as_one_word() {
    let (a, b) = pair("127.0.46.1", "127.0.46.2");
    b.mr.block().fill(0, LEN, 0x5A).expect("fill");

    // The bytes inline with the WR (the Rust builder), and from an 8-byte SGE.
    a.qp.post_send(SendWr::atomic_write(1, b.mr.rkey(), b.mr.iova() + 8, P1))
        .expect("post inline");
    a.mr.block().copy_in(64, &P2).expect("fill");
    let from_sge = SendWr {
        wr_id: 2,
        opcode: SendOpcode::AtomicWrite,
        flags: SendFlags::SIGNALED,
        sg_list: vec![a.sge(64, 8)].into(),
        rdma: RdmaInfo {
            remote_addr: b.mr.iova() + 16,
            rkey: b.mr.rkey(),
        },
        ..SendWr::default()
    };
    a.qp.post_send(from_sge).expect("post sge");
    let wc = wait(&a.send_cq, 2);
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
    // whole value, never a mix of the two. The writes go in rounds of 100 back to back;
    // after each round A waits until the reader has seen the round's last value, so the
    // reader provably ran all along, however the two threads are scheduled.
    let target = 128;
    b.mr.block()
        .atomic_store(target, u64::from_ne_bytes(P1))
        .expect("store");
    let stop = AtomicBool::new(false);
    let seen = [AtomicU64::new(0), AtomicU64::new(0)];
    let (p1, p2) = (u64::from_ne_bytes(P1), u64::from_ne_bytes(P2));
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut loads = 0u64;
            // Bounded: the writer's rounds end within their waits, and so does this loop.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let v = b.mr.block().atomic_load(target).expect("load");
                assert!(v == p1 || v == p2, "torn word {v:#018x}");
                loads += 1;
                seen[usize::from(v == p2)].fetch_add(1, Ordering::Relaxed);
            }
            loads
        });
        const ROUNDS: u64 = 20;
        const PER_ROUND: u64 = 100;
        for round in 0..ROUNDS {
            // Even rounds end with P2, odd ones with P1.
            let last = usize::from(round % 2 == 0);
            for i in 0..PER_ROUND {
                let is_last = i + 1 == PER_ROUND;
                let value = match (is_last, i % 2) {
                    (true, _) => [P1, P2][last],
                    (false, 0) => P2,
                    (false, _) => P1,
                };
                let at = b.mr.iova() + target as u64;
                let mut w = SendWr::atomic_write(round * PER_ROUND + i, b.mr.rkey(), at, value);
                // Unsignaled but the round's last: each leaves the send queue when the
                // signaled one completes.
                if !is_last {
                    w.flags -= SendFlags::SIGNALED;
                }
                a.qp.post_send(w).expect("post");
            }
            let wc = wait(&a.send_cq, 1);
            assert_eq!(
                (wc[0].wr_id, wc[0].status),
                ((round + 1) * PER_ROUND - 1, WcStatus::Success)
            );
            let before = seen[last].load(Ordering::Relaxed);
            let deadline = Instant::now() + Duration::from_secs(10);
            while seen[last].load(Ordering::Relaxed) == before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(
                seen[last].load(Ordering::Relaxed) > before,
                "round {round}: the reader never saw the round's last value"
            );
        }
        stop.store(true, Ordering::Relaxed);
        let loads = reader.join().expect("reader");
        assert!(loads > 0, "the reader loaded nothing");
    });
    assert_eq!(word(&b.mr, target), P1, "the last value written");
}

#[test]
fn atomic_write_errors() {
    // Post time: not 8 bytes; not on UC (refused by the engine).
    let (a, b) = pair("127.0.46.3", "127.0.46.4");
    let mut w = SendWr::atomic_write(1, b.mr.rkey(), b.mr.iova(), P1);
    w.inline_data.pop();
    assert!(matches!(
        a.qp.post_send(w),
        Err(PostError::Refused(WrError::AtomicLength { len: 7 }))
    ));

    // A misaligned address: the target NAKs an invalid request, memory untouched.
    b.mr.block().fill(0, LEN, 0x5A).expect("fill");
    a.qp.post_send(SendWr::atomic_write(2, b.mr.rkey(), b.mr.iova() + 4, P1))
        .expect("post");
    let wc = wait(&a.send_cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::RemInvReqErr));
    assert_eq!(word(&b.mr, 0), [0x5A; 8]);
    assert_eq!(word(&b.mr, 8), [0x5A; 8]);

    // A region without REMOTE_WRITE: remote access error, memory untouched.
    let ro = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (a, b) = pair("127.0.46.5", "127.0.46.6");
    let ro_mr =
        b.pd.reg_mr(MemBlock::new(LEN).expect("block"), ro)
            .expect("mr");
    ro_mr.block().fill(0, LEN, 0x5A).expect("fill");
    a.qp.post_send(SendWr::atomic_write(3, ro_mr.rkey(), ro_mr.iova() + 8, P1))
        .expect("post");
    let wc = wait(&a.send_cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (3, WcStatus::RemAccessErr));
    assert_eq!(word(&ro_mr, 8), [0x5A; 8]);
    drop(ro_mr);

    // UC has no ATOMIC WRITE.
    let dev = NetDevice::open(NetConfig::new("127.0.46.7".parse().expect("addr"))).expect("dev");
    let ctx = dev.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16, None, 0).expect("cq");
    let uc = pd
        .create_qp(&QpInitAttr::new(QpType::Uc, &cq, &cq, QpCap::default()))
        .expect("uc qp");
    // The UC engine refuses it (it checks the WR once the QP has one: RTS).
    let conn = uroce_verbs::UcConnect::new("127.0.46.8".parse().expect("peer"), 0x11);
    for (attr, mask) in [conn.init_attr(), conn.rtr_attr(), conn.rts_attr()] {
        uc.modify(&attr, mask).expect("UC to RTS");
    }
    assert!(matches!(
        uc.post_send(SendWr::atomic_write(4, 1, 0, P1)),
        Err(PostError::Refused(WrError::OpcodeNotSupported {
            opcode: SendOpcode::AtomicWrite,
            qp_type: QpType::Uc
        }))
    ));
}
