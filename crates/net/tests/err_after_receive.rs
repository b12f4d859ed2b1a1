//! A responder that moves its QP to ERR right after it saw the last receive completion (as
//! `rdma_disconnect` does after a program's final message) must first send the ACK it held
//! back for the application's next post: otherwise the requester's SEND, delivered, would
//! be retried into a dead QP and end in `RETRY_EXC_ERR` (libfabric's `fi_pingpong` over
//! verbs MSG endpoints saw it flushed by the disconnect that followed).

#[path = "support/pair.rs"]
mod pair;

use std::time::{Duration, Instant};

use pair::{connect, wait, ConnectOpts, Side, SideConfig};
use uroce_verbs::{AttrMask, QpAttr, QpState, RecvWr, SendFlags, SendOpcode, SendWr, WcStatus};

#[test]
fn the_held_back_ack_leaves_before_the_qp_enters_err() {
    for round in 0..20u32 {
        let a = Side::open(&SideConfig::new("127.0.67.1", "uroce0"));
        let b = Side::open(&SideConfig::new("127.0.67.2", "uroce1"));
        // Short timeouts: a lost ACK ends the SEND in RETRY_EXC_ERR within about 30 ms.
        let o = ConnectOpts {
            timeout: 8,
            retry_cnt: 3,
            ..ConnectOpts::default()
        };
        connect(&a, &b, &o);
        b.qp.post_recv(RecvWr::new(1, vec![b.sge(0, 64)]))
            .expect("post_recv");
        a.qp.post_send(SendWr {
            wr_id: 2,
            opcode: SendOpcode::Send,
            flags: SendFlags::SIGNALED,
            sg_list: vec![a.sge(0, 8)].into(),
            ..SendWr::default()
        })
        .expect("post_send");
        // B busy polls (its steps hold the ACK back for a post that never comes), then
        // leaves at once.
        let got = wait(&b.recv_cq, 1, Duration::from_secs(10), "B's receive");
        assert_eq!(got[0].status, WcStatus::Success, "round {round}: {got:?}");
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        b.qp.modify(&err, AttrMask::STATE).expect("RTS to ERR");
        let until = Instant::now() + Duration::from_secs(10);
        let sent = loop {
            let wcs = a.send_cq.poll(1);
            if let Some(wc) = wcs.first() {
                break *wc;
            }
            assert!(Instant::now() < until, "round {round}: no send completion");
        };
        assert_eq!(
            sent.status,
            WcStatus::Success,
            "round {round}: A's SEND, delivered, did not complete: {sent:?}"
        );
        a.close();
        b.close();
    }
}
