//! The async event queue: delivery, fd readiness, acknowledgement and destroy interplay.
mod common;

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use common::*;
use rustix::event::{PollFd, PollFlags, Timespec};
use uroce_verbs::{
    DestroyError, ElementKind, EventType, QpInitAttr, QpType, RaiseError, SrqInitAttr, WaitError,
};

fn readable(fd: BorrowedFd<'_>) -> bool {
    let ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    rustix::event::poll(&mut fds, Some(&ts)).expect("poll") == 1
}

#[test]
fn events_are_delivered_in_order_with_their_elements() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .expect("srq");
    assert!(!readable(ctx.async_fd()));
    for t in [
        EventType::CommEst,
        EventType::QpFatal,
        EventType::QpReqErr,
        EventType::QpAccessErr,
    ] {
        assert_eq!(qp.raise_event(t), Ok(true));
    }
    assert_eq!(srq.raise_event(EventType::SrqErr), Ok(true));
    assert!(readable(ctx.async_fd()));
    assert_eq!(ctx.pending_async_events(), 5);
    let mut got = Vec::new();
    while let Some(ev) = ctx.try_get_async_event() {
        got.push(ev.event_type());
        match ev.element().kind() {
            ElementKind::Qp => assert_eq!(ev.qp().expect("qp").qp_num(), qp.qp_num()),
            ElementKind::Srq => assert_eq!(ev.srq().expect("srq").srq_num(), srq.srq_num()),
            k => panic!("unexpected element {k:?}"),
        }
        ev.ack();
    }
    assert_eq!(
        got,
        vec![
            EventType::CommEst,
            EventType::QpFatal,
            EventType::QpReqErr,
            EventType::QpAccessErr,
            EventType::SrqErr
        ]
    );
    assert!(!readable(ctx.async_fd()), "fd not readable once drained");
    // Wrong element kinds are refused.
    assert!(matches!(
        qp.raise_event(EventType::CqErr),
        Err(RaiseError::WrongElement {
            expected: ElementKind::Cq,
            given: ElementKind::Qp,
            ..
        })
    ));
    assert!(srq.raise_event(EventType::QpFatal).is_err());
    assert_eq!(ctx.counters().events_raised, 5);
}

#[test]
fn destroy_discards_undelivered_events() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    let keep = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    for _ in 0..3 {
        qp.raise_event(EventType::CommEst).expect("raise");
    }
    keep.raise_event(EventType::QpFatal).expect("raise");
    let start = Instant::now();
    qp.destroy()
        .expect("undelivered events do not block destroy");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(
        ctx.pending_async_events(),
        1,
        "only the other QP's event is left"
    );
    let ev = ctx.try_get_async_event().expect("event");
    assert!(ev.qp().expect("qp").same_qp(&keep));
}

#[test]
fn destroy_waits_for_acknowledgement() {
    let ctx = context();
    ctx.set_destroy_timeout(Duration::from_millis(50));
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    let qpn = qp.qp_num();
    qp.raise_event(EventType::CommEst).expect("raise");
    let ev = ctx.try_get_async_event().expect("delivered");
    let (qp, err) = qp.destroy().expect_err("event not acknowledged");
    assert!(
        matches!(err, DestroyError::InUse { references: 1, .. }),
        "{err:?}"
    );
    // The QP is already unpublished: no lookups, no new events.
    assert!(ctx.qp_for_packet(qpn).is_none());
    assert_eq!(qp.raise_event(EventType::QpFatal), Ok(false));
    assert_eq!(ctx.pending_async_events(), 0);
    // Acknowledging from another thread lets a waiting destroy finish.
    ctx.set_destroy_timeout(Duration::from_secs(10));
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            ev.ack();
        });
        qp.destroy().expect("destroy after the ack");
    });
    assert_eq!(ctx.live_objects().qps, 0);
    assert_eq!(ctx.table_sizes().0, 0, "QPN released");
}

#[test]
fn blocked_get_async_event_is_woken() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, caps(4)))
        .expect("qp");
    std::thread::scope(|s| {
        // Woken by an event.
        let waiter = s.spawn(|| {
            ctx.get_async_event(Some(Duration::from_secs(10)))
                .map(|e| e.event_type())
        });
        std::thread::sleep(Duration::from_millis(30));
        qp.raise_event(EventType::CommEst).expect("raise");
        assert_eq!(waiter.join().expect("join"), Ok(EventType::CommEst));
        // Woken by shutdown.
        let start = Instant::now();
        let waiter = s.spawn(|| ctx.get_async_event(None).map(|e| e.event_type()));
        std::thread::sleep(Duration::from_millis(30));
        ctx.shutdown();
        assert_eq!(waiter.join().expect("join"), Err(WaitError::Shutdown));
        assert!(start.elapsed() < Duration::from_secs(5));
    });
    assert!(ctx.is_shut_down());
    assert_eq!(
        qp.raise_event(EventType::CommEst),
        Ok(false),
        "refused after shutdown"
    );
}

#[test]
fn unknown_qpns_are_counted() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 4);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    let qpn = qp.qp_num();
    assert!(ctx.qp_for_packet(qpn).is_some());
    assert!(ctx.qp_for_packet(0).is_none(), "QPN 0: no SMI on RoCE");
    assert!(ctx.qp_for_packet(0x00ab_cdef).is_none());
    qp.destroy().expect("destroy");
    assert!(ctx.qp_for_packet(qpn).is_none(), "destroyed");
    assert_eq!(ctx.counters().unknown_qpn_drops, 3);
}
