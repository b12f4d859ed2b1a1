//! CQ capacity and overrun, notification arming, the completion channel's fd, cancellation.
mod common;

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use common::*;
use rustix::event::{PollFd, PollFlags, Timespec};
use uroce_verbs::{
    Context, Cq, DestroyError, EventType, NotifyError, Pd, Qp, QpInitAttr, QpState, QpType,
    RecvCompletion, RecvWr, WaitError, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let ts = Timespec::try_from(timeout).expect("timespec");
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    rustix::event::poll(&mut fds, Some(&ts)).expect("poll") == 1
}

/// A QP in RTR whose receive completions go to `cq`, with `n` receives posted.
fn receiver(ctx: &Context, cq: &Cq, n: u64) -> (Pd, Qp) {
    let pd = ctx.alloc_pd().expect("pd");
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, cq, cq, caps(64)))
        .expect("qp");
    rc_to(&qp, QpState::Rtr);
    for id in 0..n {
        qp.post_recv(RecvWr::new(id, vec![])).expect("post");
    }
    (pd, qp)
}

/// The engine receives one message: takes a WQE and completes it.
fn deliver(
    qp: &Qp,
    status: WcStatus,
    solicited: bool,
) -> Result<WorkCompletion, uroce_verbs::EngineError> {
    qp.take_recv_wqe()?;
    qp.complete_recv(&RecvCompletion {
        status,
        opcode: WcOpcode::Recv,
        byte_len: 100,
        imm_data: Some(0xdead_beef),
        solicited,
        ..RecvCompletion::default()
    })
}

#[test]
fn overrun_raises_cq_err_once_and_keeps_entries() {
    let ctx = context();
    let cq = cq(&ctx, 3);
    assert_eq!(cq.capacity(), 3);
    let (_pd, qp) = receiver(&ctx, &cq, 6);
    for _ in 0..3 {
        deliver(&qp, WcStatus::Success, false).expect("fits");
    }
    assert!(!cq.is_overrun());
    assert_eq!(
        deliver(&qp, WcStatus::Success, false),
        Err(uroce_verbs::EngineError::CqOverrun)
    );
    assert!(cq.is_overrun());
    assert_eq!(
        deliver(&qp, WcStatus::Success, false),
        Err(uroce_verbs::EngineError::CqOverrun),
        "stays in error"
    );
    let ev = ctx.try_get_async_event().expect("CQ_ERR");
    assert_eq!(ev.event_type(), EventType::CqErr);
    assert_eq!(ev.cq().expect("cq").id(), cq.id());
    ev.ack();
    assert!(ctx.try_get_async_event().is_none(), "exactly once");
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
    let ctx = context();
    let ch = ctx.create_comp_channel().expect("channel");
    let cq = ctx.create_cq(16, Some(&ch), 0).expect("cq");
    let (_pd, qp) = receiver(&ctx, &cq, 8);

    deliver(&qp, WcStatus::Success, false).expect("unarmed completion");
    assert!(
        !readable(ch.fd(), Duration::from_millis(10)),
        "not armed: no event"
    );
    cq.req_notify(false).expect("arm");
    assert!(
        !readable(ch.fd(), Duration::from_millis(10)),
        "arming alone fires nothing"
    );
    deliver(&qp, WcStatus::Success, false).expect("completion");
    assert!(readable(ch.fd(), Duration::from_secs(1)));
    deliver(&qp, WcStatus::Success, false).expect("second completion, disarmed");
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
    let ctx = context();
    let ch = ctx.create_comp_channel().expect("channel");
    let cq = ctx.create_cq(16, Some(&ch), 0).expect("cq");
    let (_pd, qp) = receiver(&ctx, &cq, 8);

    cq.req_notify(true).expect("arm solicited");
    deliver(&qp, WcStatus::Success, false).expect("unsolicited");
    assert!(
        ch.try_get_cq_event().is_none(),
        "unsolicited success does not fire"
    );
    deliver(&qp, WcStatus::Success, true).expect("solicited");
    ch.try_get_cq_event().expect("solicited fires").ack();

    cq.req_notify(true).expect("arm solicited");
    deliver(&qp, WcStatus::RemAccessErr, false).expect("error");
    ch.try_get_cq_event()
        .expect("errors fire a solicited arm")
        .ack();

    // A next-arm is not downgraded by a later solicited arm.
    cq.req_notify(false).expect("arm next");
    cq.req_notify(true).expect("arm solicited");
    deliver(&qp, WcStatus::Success, false).expect("unsolicited");
    ch.try_get_cq_event().expect("still armed for next").ack();

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
    let ctx = context();
    ctx.set_destroy_timeout(Duration::from_millis(50));
    let ch = ctx.create_comp_channel().expect("channel");
    let cq = ctx.create_cq(16, Some(&ch), 0).expect("cq");
    let (pd, qp) = receiver(&ctx, &cq, 4);
    cq.req_notify(false).expect("arm");
    deliver(&qp, WcStatus::Success, false).expect("completion");
    qp.destroy().expect("qp");
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
    let (pd, qp) = receiver(&ctx, &cq, 4);
    cq.req_notify(false).expect("arm");
    deliver(&qp, WcStatus::Success, false).expect("completion");
    qp.destroy().expect("qp");
    pd.destroy().expect("pd");
    assert_eq!(ch.pending(), 1);
    cq.destroy().expect("pending notification discarded");
    assert_eq!(ch.pending(), 0);
    ch.destroy().expect("channel");
}
