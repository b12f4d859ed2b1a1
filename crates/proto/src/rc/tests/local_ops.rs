//! BIND_MW and LOCAL_INV in the RC send queue: executed through `Memory` when the
//! requester reaches them, no PSN, completed in posting order, failures complete with
//! MW_BIND_ERR / LOC_QP_OP_ERR and move the QP to ERR.

use super::*;
use crate::memory::MwBind;
use crate::qp_state::QpState;
use crate::wr::{WcOpcode, WcStatus};

fn bind_wr(wr_id: u64, mw_rkey: u32, new_rkey: u32) -> SendWr {
    let mut w = wr(wr_id, SendOpcode::BindMw, vec![]);
    w.bind = Some(MwBind {
        mw_rkey,
        new_rkey,
        mr_lkey: 1,
        addr: 0x9000,
        length: 64,
        access: REMOTE_WRITE.bits(),
        type1: false,
    });
    w
}

fn inv_wr(wr_id: u64, rkey: u32) -> SendWr {
    let mut w = wr(wr_id, SendOpcode::LocalInv, vec![]);
    w.invalidate_rkey = rkey;
    w
}

#[test]
fn local_inv_runs_in_order_takes_no_psn_and_completes_in_order() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.mem_a.add(0x55, 0x8000, 64, ALL);
    p.mem_b.add(2, 0x2000, 4096, ALL);
    let w = |id| {
        rdma(
            id,
            SendOpcode::RdmaWrite,
            vec![sge(0x1000, 100, 1)],
            0x2000,
            2,
        )
    };
    p.a.post_send(w(1)).unwrap();
    p.a.post_send(inv_wr(2, 0x55)).unwrap();
    p.a.post_send(w(3)).unwrap();
    // First round: both WRITEs leave, the LOCAL_INV between them executes; no ACK yet.
    p.round();
    assert!(
        !p.mem_a.is_key_valid(0x55),
        "executed when the requester reached it"
    );
    assert!(
        p.completions(Side::A).is_empty(),
        "nothing completes before the ACK"
    );
    let psns: Vec<_> = p.sent(Side::A).iter().map(|s| s.psn).collect();
    assert_eq!(psns.len(), 2);
    assert_eq!(psns[1], psns[0].wrapping_add(1), "LOCAL_INV takes no PSN");
    p.run();
    let got: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.opcode))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::LocalInv),
            (3, WcStatus::Success, WcOpcode::RdmaWrite),
        ]
    );
}

#[test]
fn a_local_op_alone_completes_at_once_and_binds() {
    let mut p = Pair::new();
    p.mem_a.add(0x300, 0, 0, Access::NONE);
    p.mem_a.invalidate_local(0x300).unwrap();
    p.a.post_send(bind_wr(7, 0x300, 0x301)).unwrap();
    p.round();
    let wc = p.completions(Side::A);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].1.wr_id, wc[0].1.status, wc[0].1.opcode),
        (7, WcStatus::Success, WcOpcode::BindMw)
    );
    assert!(p.mem_a.is_key_valid(0x301));
    assert!(p.sent(Side::A).is_empty(), "no packet");
}

#[test]
fn failed_local_ops_complete_with_their_error_and_flush() {
    // LOCAL_INV of an unknown key: LOC_QP_OP_ERR, the QP enters ERR, later WRs flush.
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    p.a.post_send(inv_wr(1, 0x99)).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    p.run();
    let got: Vec<_> = p
        .completions(Side::A)
        .iter()
        .map(|c| (c.1.wr_id, c.1.status, c.1.opcode))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::LocQpOpErr, WcOpcode::LocalInv),
            (2, WcStatus::WrFlushErr, WcOpcode::Send),
        ]
    );
    assert_eq!(p.a.state(), QpState::Err);

    // A bind of a window that is bound: MW_BIND_ERR.
    let mut p = Pair::new();
    p.mem_a.add(0x400, 0, 0, Access::NONE);
    p.a.post_send(bind_wr(3, 0x400, 0x401)).unwrap();
    p.run();
    let wc = p.completions(Side::A);
    assert_eq!(
        (wc[0].1.wr_id, wc[0].1.status, wc[0].1.opcode),
        (3, WcStatus::MwBindErr, WcOpcode::BindMw)
    );
    assert_eq!(p.a.state(), QpState::Err);
}
