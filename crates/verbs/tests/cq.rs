//! CQ capacity and overrun, notification arming, the completion channel's fd, cancellation.
mod common;

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustix::event::{PollFd, PollFlags, Timespec};
use uroce_verbs::{
    AccessFlags, Context, Cq, DestroyError, EventType, MemBlock, Mr, NotifyError, Pd, Qp,
    QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOpcode, SendWr, Sge, WaitError, WcFlags,
    WcStatus, WorkCompletion,
};

fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let ts = Timespec::try_from(timeout).expect("timespec");
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    rustix::event::poll(&mut fds, Some(&ts)).expect("poll") == 1
}

/// What feeds a receiver: the QP sending to it over the loopback and the registered
/// memory both ends use.
struct Feed {
    sender: Sender,
    mr: Mr,
}

/// Receive buffers are this long.
const RECV_LEN: u32 = 128;

/// A QP in RTR whose receive completions go to `cq`, with `n` receives of [`RECV_LEN`]
/// bytes posted, and its [`Feed`].
fn receiver(ctx: &Context, lo: &Arc<Loopback>, cq: &Cq, n: u64) -> (Pd, Qp, Feed) {
    let pd = ctx.alloc_pd().expect("pd");
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, cq, cq, caps(64)))
        .expect("qp");
    let sender = sender_to(ctx, lo, &pd, &qp, QpState::Rtr);
    let mr = pd
        .reg_mr(
            MemBlock::new(4096).expect("block"),
            AccessFlags::LOCAL_WRITE,
        )
        .expect("mr");
    for id in 0..n {
        let sge = Sge {
            addr: mr.iova(),
            length: RECV_LEN,
            lkey: mr.lkey(),
        };
        qp.post_recv(RecvWr::new(id, vec![sge])).expect("post");
    }
    (pd, qp, Feed { sender, mr })
}

impl Feed {
    /// The receiver gets one message: a SEND_WITH_IMM of `len` bytes (immediate
    /// 0xdeadbeef), with the solicited-event bit if `solicited`.
    fn deliver(&self, ctx: &Context, len: u32, solicited: bool) {
        let sge = Sge {
            addr: self.mr.iova(),
            length: len,
            lkey: self.mr.lkey(),
        };
        let wr = SendWr {
            opcode: SendOpcode::SendWithImm,
            imm_data: 0xdead_beef,
            flags: if solicited {
                SendFlags::SOLICITED
            } else {
                SendFlags::empty()
            },
            ..SendWr::send(0, vec![sge])
        };
        self.sender.send(ctx, wr);
    }
}

#[test]
fn overrun_raises_cq_err_once_and_keeps_entries() {
    let (ctx, lo) = loopback_context();
    let cq = cq(&ctx, 3);
    assert_eq!(cq.capacity(), 3);
    let (_pd, qp, feed) = receiver(&ctx, &lo, &cq, 6);
    for _ in 0..3 {
        feed.deliver(&ctx, 100, false);
    }
    assert_eq!(cq.len(), 3, "fits");
    assert!(!cq.is_overrun());
    feed.deliver(&ctx, 100, false);
    assert!(cq.is_overrun());
    // The QP could not complete the fourth: it is in ERR (QP_FATAL), its last receives
    // are lost with the CQ.
    assert_eq!(qp.state(), QpState::Err);
    feed.deliver(&ctx, 100, false);
    assert!(cq.is_overrun(), "stays in error");
    let mut cq_errs = 0;
    let mut fatal = 0;
    // Bounded: a handful of events were raised.
    for _ in 0..16 {
        let Some(ev) = ctx.try_get_async_event() else {
            break;
        };
        match ev.event_type() {
            EventType::CqErr => {
                assert_eq!(ev.cq().expect("cq").id(), cq.id());
                cq_errs += 1;
            }
            EventType::QpFatal => {
                assert!(ev.qp().expect("qp").same_qp(&qp));
                fatal += 1;
            }
            _ => {}
        }
        ev.ack();
    }
    assert_eq!((cq_errs, fatal), (1, 1), "exactly once");
    assert_eq!(ctx.counters().cq_overruns, 1);
    let mut out = [WorkCompletion::default(); 8];
    assert_eq!(cq.poll_into(&mut out), 3);
    assert_eq!(out[0].wr_id, 0);
    assert_eq!(out[0].imm_data, 0xdead_beef);
    assert!(out[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(out[0].byte_len, 100);
    assert_eq!(out[0].qp_num, qp.qp_num());
    assert_eq!(out[2].wr_id, 2);
}

#[test]
fn notify_next_is_one_shot_and_fd_readable() {
    let (ctx, lo) = loopback_context();
    let ch = ctx.create_comp_channel().expect("channel");
    let cq = ctx.create_cq(16, Some(&ch), 0).expect("cq");
    let (_pd, _qp, feed) = receiver(&ctx, &lo, &cq, 8);

    feed.deliver(&ctx, 100, false);
    assert!(
        !readable(ch.fd(), Duration::from_millis(10)),
        "not armed: no event"
    );
    cq.req_notify(false).expect("arm");
    assert!(
        !readable(ch.fd(), Duration::from_millis(10)),
        "arming alone fires nothing"
    );
    feed.deliver(&ctx, 100, false);
    assert!(readable(ch.fd(), Duration::from_secs(1)));
    feed.deliver(&ctx, 100, false); // a second completion, disarmed
    let ev = ch
        .get_cq_event(Some(Duration::from_secs(1)))
        .expect("event");
    assert!(ev.cq().same_cq(&cq));
    assert_eq!(ev.cq().poll(16).len(), 3);
    ev.ack();
    assert!(
        ch.try_get_cq_event().is_none(),
        "one-shot: one event for two completions"
    );
    assert!(!readable(ch.fd(), Duration::from_millis(10)));
}

#[test]
fn solicited_only_arm() {
    let (ctx, lo) = loopback_context();
    let ch = ctx.create_comp_channel().expect("channel");
    let cq = ctx.create_cq(16, Some(&ch), 0).expect("cq");
    let (_pd, qp, feed) = receiver(&ctx, &lo, &cq, 8);

    cq.req_notify(true).expect("arm solicited");
    feed.deliver(&ctx, 100, false);
    assert!(
        ch.try_get_cq_event().is_none(),
        "unsolicited success does not fire"
    );
    feed.deliver(&ctx, 100, true);
    ch.try_get_cq_event().expect("solicited fires").ack();

    // A next-arm is not downgraded by a later solicited arm.
    cq.req_notify(false).expect("arm next");
    cq.req_notify(true).expect("arm solicited");
    feed.deliver(&ctx, 100, false);
    ch.try_get_cq_event().expect("still armed for next").ack();

    // An error completion, unsolicited: a message longer than the receive buffer
    // completes the receive with LOC_LEN_ERR.
    cq.req_notify(true).expect("arm solicited");
    feed.deliver(&ctx, RECV_LEN + 64, false);
    ch.try_get_cq_event()
        .expect("errors fire a solicited arm")
        .ack();
    let wcs = cq.poll(16);
    let failed = wcs
        .iter()
        .find(|w| w.wr_id == 3)
        .expect("the fourth receive");
    assert_eq!(failed.status, WcStatus::LocLenErr);
    assert_eq!(qp.state(), QpState::Err, "the rest are flushed");

    let plain = ctx.create_cq(4, None, 0).expect("cq");
    assert_eq!(plain.req_notify(false), Err(NotifyError::NoChannel));
}

#[test]
fn blocked_get_cq_event_is_woken_by_shutdown() {
    let ctx = context();
    let ch = ctx.create_comp_channel().expect("channel");
    let start = Instant::now();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ch.get_cq_event(None).map(|_| ()));
        std::thread::sleep(Duration::from_millis(50));
        ch.shutdown();
        let res = waiter.join().expect("join");
        assert_eq!(res, Err(WaitError::Shutdown));
    });
    assert!(start.elapsed() < Duration::from_secs(5), "woken promptly");
    assert_eq!(
        ch.get_cq_event(Some(Duration::from_millis(1))).map(|_| ()),
        Err(WaitError::Shutdown)
    );
}

#[test]
fn get_cq_event_times_out() {
    let ctx = context();
    let ch = ctx.create_comp_channel().expect("channel");
    let start = Instant::now();
    assert_eq!(
        ch.get_cq_event(Some(Duration::from_millis(30))).map(|_| ()),
        Err(WaitError::Timeout)
    );
    assert!(start.elapsed() >= Duration::from_millis(30));
}

#[test]
fn destroy_waits_for_unacked_cq_events_and_discards_pending_ones() {
    let (ctx, lo) = loopback_context();
    ctx.set_destroy_timeout(Duration::from_millis(50));
    let ch = ctx.create_comp_channel().expect("channel");
    let cq = ctx.create_cq(16, Some(&ch), 0).expect("cq");
    let (pd, qp, feed) = receiver(&ctx, &lo, &cq, 4);
    cq.req_notify(false).expect("arm");
    feed.deliver(&ctx, 100, false);
    qp.destroy().expect("qp");
    drop(feed);
    pd.destroy().expect("pd");
    let ev = ch.try_get_cq_event().expect("event");
    let (cq, err) = cq.destroy().expect_err("unacked event");
    assert!(
        matches!(err, DestroyError::InUse { references: 1, .. }),
        "{err:?}"
    );
    ev.ack();
    cq.destroy().expect("destroy after ack");

    // A pending (undelivered) notification does not block: destroy discards it.
    let cq = ctx.create_cq(16, Some(&ch), 0).expect("cq");
    let (pd, qp, feed) = receiver(&ctx, &lo, &cq, 4);
    cq.req_notify(false).expect("arm");
    feed.deliver(&ctx, 100, false);
    qp.destroy().expect("qp");
    drop(feed);
    pd.destroy().expect("pd");
    assert_eq!(ch.pending(), 1);
    cq.destroy().expect("pending notification discarded");
    assert_eq!(ch.pending(), 0);
    ch.destroy().expect("channel");
}
