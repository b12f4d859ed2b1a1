//! `CqRef::resize` (`ibv_resize_cq`): the new size lies in 1..=max_cqe and holds every
//! queued completion, queued completions survive in order, and the new size is the one a
//! later push is held to (overrun one past it, not one past the old size).
mod common;

use common::*;
use uroce_verbs::{
    Context, Cq, EngineError, Pd, Qp, QpInitAttr, QpState, QpType, RecvCompletion, RecvWr,
    ResizeCqError, WcOpcode, WcStatus, WorkCompletion,
};

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
fn deliver(qp: &Qp) -> Result<WorkCompletion, EngineError> {
    qp.take_recv_wqe()?;
    qp.complete_recv(&RecvCompletion {
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len: 8,
        ..RecvCompletion::default()
    })
}

#[test]
fn resize_keeps_entries_and_moves_the_overrun_point() {
    let ctx = context();
    let max = ctx.device().attr().max_cqe;
    let cq = cq(&ctx, 3);
    let (_pd, qp) = receiver(&ctx, &cq, 16);
    deliver(&qp).expect("1");
    deliver(&qp).expect("2");

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
        deliver(&qp).expect("fits the new size");
    }
    assert!(!cq.is_overrun());
    assert_eq!(deliver(&qp), Err(EngineError::CqOverrun));
    let ids: Vec<u64> = cq.poll(16).iter().map(|wc| wc.wr_id).collect();
    assert_eq!(
        ids,
        vec![0, 1, 2, 3, 4],
        "queued completions kept, in order"
    );
    // Empty again: the smallest size is allowed.
    assert_eq!(cq.resize(1), Ok(1));
}
