//! The data path allocates nothing: RC SEND ping-pong between two devices of this process
//! (127.0.66.x), driven by the application thread (post, then busy polling, which runs the
//! device's progress step: receive, engines, transmit), counting the heap allocations that
//! thread makes once warmed up. The work requests are built before counting starts (a
//! `SendWr` owns its scatter list). The progress threads are not counted: they publish the
//! counters for `uroce stat` now and then, which is time-driven, not per message.

#[path = "support/pair.rs"]
mod pair;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use pair::{connect, ConnectOpts, Side, SideConfig};
use uroce_verbs::{RecvWr, SendFlags, SendWr, WcStatus, WorkCompletion};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the thread-locals may be gone while a thread exits.
    let on = COUNTING.try_with(Cell::get).unwrap_or(false);
    if on {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: every method forwards to the system allocator with the caller's arguments; the
// counting touches only const-initialised thread-locals (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `rounds` SEND ping-pong rounds: a SEND from `a`, its receive completion on `b` (which
/// posts the next receive), its send completion on `a`.
fn rounds(a: &Side, b: &Side, n: usize, sends: &mut Vec<SendWr>, recvs: &mut Vec<RecvWr>) {
    let mut wcs = [WorkCompletion::default(); 16];
    let until = Instant::now() + Duration::from_secs(60);
    for _ in 0..n {
        a.qp.post_send(sends.pop().expect("a prepared send"))
            .expect("post_send");
        let mut got = 0;
        while got < 2 {
            assert!(Instant::now() < until, "the ping-pong stalled");
            for (cq, is_b) in [(&a.send_cq, false), (&b.recv_cq, true)] {
                let k = cq.poll_into(&mut wcs);
                for wc in wcs.iter().take(k) {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    got += 1;
                    if is_b {
                        b.qp.post_recv(recvs.pop().expect("a prepared receive"))
                            .expect("post_recv");
                    }
                }
            }
        }
    }
}

#[test]
fn send_ping_pong_allocates_nothing() {
    const WARM: usize = 500;
    const COUNTED: usize = 5000;
    let a = Side::open(&SideConfig::new("127.0.66.1", "uroce0"));
    let b = Side::open(&SideConfig::new("127.0.66.2", "uroce1"));
    connect(&a, &b, &ConnectOpts::default());
    let total = WARM + COUNTED;
    let mut sends: Vec<SendWr> = (0..total)
        .map(|i| SendWr {
            wr_id: i as u64,
            flags: SendFlags::SIGNALED,
            sg_list: vec![a.sge(0, 8)].into(),
            ..SendWr::default()
        })
        .collect();
    let mut recvs: Vec<RecvWr> = (0..total + 32)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sg_list: vec![b.sge(0, 64)].into(),
        })
        .collect();
    for _ in 0..32 {
        b.qp.post_recv(recvs.pop().expect("receive"))
            .expect("post_recv");
    }
    rounds(&a, &b, WARM, &mut sends, &mut recvs);
    COUNTING.with(|c| c.set(true));
    rounds(&a, &b, COUNTED, &mut sends, &mut recvs);
    COUNTING.with(|c| c.set(false));
    let allocations = ALLOCATIONS.with(Cell::get);
    // The work requests the test hands over are freed on the way (their scatter lists);
    // nothing is allocated.
    eprintln!("{COUNTED} SEND round trips: {allocations} allocations on the polling thread");
    assert_eq!(
        allocations, 0,
        "the data path allocated {allocations} times in {COUNTED} round trips"
    );
}
