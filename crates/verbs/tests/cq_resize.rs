//! `CqRef::resize` (`ibv_resize_cq`): the new size lies in 1..=max_cqe and holds every
//! queued completion, queued completions survive in order, and the new size is the one a
//! later push is held to (overrun one past it, not one past the old size).
mod common;

use common::*;
use uroce_verbs::{
    Context, Cq, EventType, Pd, Qp, QpInitAttr, QpState, QpType, RecvWr, ResizeCqError,
};

/// A QP in RTR whose receive completions go to `cq`, with `n` receives posted, and the
/// QP that sends to it over the loopback.
fn receiver(ctx: &Context, lo: &std::sync::Arc<Loopback>, cq: &Cq, n: u64) -> (Pd, Qp, Sender) {
    let pd = ctx.alloc_pd().expect("pd");
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, cq, cq, caps(64)))
        .expect("qp");
    let sender = sender_to(ctx, lo, &pd, &qp, QpState::Rtr);
    for id in 0..n {
        qp.post_recv(RecvWr::new(id, vec![])).expect("post");
    }
    (pd, qp, sender)
}

#[test]
fn resize_keeps_entries_and_moves_the_overrun_point() {
    let (ctx, lo) = loopback_context();
    let max = ctx.device().attr().max_cqe;
    let cq = cq(&ctx, 3);
    let (_pd, qp, sender) = receiver(&ctx, &lo, &cq, 16);
    sender.send_empty(&ctx);
    sender.send_empty(&ctx);
    assert_eq!(cq.len(), 2);

    assert_eq!(
        cq.resize(1),
        Err(ResizeCqError::TooSmall { cqe: 1, pending: 2 })
    );
    assert_eq!(
        cq.resize(0),
        Err(ResizeCqError::InvalidSize { cqe: 0, max })
    );
    assert_eq!(
        cq.resize(max + 1),
        Err(ResizeCqError::InvalidSize { cqe: max + 1, max })
    );
    assert_eq!(cq.capacity(), 3, "a refused resize changes nothing");

    // Exactly the queued count is enough.
    assert_eq!(cq.resize(2), Ok(2));
    assert_eq!(cq.capacity(), 2);
    // Grow: three more fit (5), the sixth overruns.
    assert_eq!(cq.resize(5), Ok(5));
    for _ in 0..3 {
        sender.send_empty(&ctx);
    }
    assert_eq!(cq.len(), 5, "fits the new size");
    assert!(!cq.is_overrun());
    let _ = drain_events(&ctx);
    sender.send_empty(&ctx);
    assert!(cq.is_overrun(), "the sixth overruns");
    // The receiving QP could not complete its work: it is in ERR (QP_FATAL).
    assert_eq!(qp.state(), QpState::Err);
    let events = drain_events(&ctx);
    assert!(events.contains(&EventType::CqErr), "{events:?}");
    assert!(events.contains(&EventType::QpFatal), "{events:?}");
    let ids: Vec<u64> = cq.poll(16).iter().map(|wc| wc.wr_id).collect();
    assert_eq!(
        ids,
        vec![0, 1, 2, 3, 4],
        "queued completions kept, in order"
    );
    // Empty again: the smallest size is allowed.
    assert_eq!(cq.resize(1), Ok(1));
}
