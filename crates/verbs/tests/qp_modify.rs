//! modify_qp on real QPs uses the proto state table; rejected modifies leave the QP
//! unchanged; query_qp returns what was set; post rules per state.
mod common;

use std::time::Duration;

use common::*;
use uroce_proto::wr::WrError;
use uroce_verbs::{
    AccessFlags, AtomicInfo, AttrMask, EventType, ModifyQpError, PostError, QpAttr, QpInitAttr,
    QpState, QpType, RecvWr, SendFlags, SendOpcode, SendWr, Sge, WcStatus,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

struct Fixture {
    _ctx: uroce_verbs::Context,
    _pd: uroce_verbs::Pd,
    cq: uroce_verbs::Cq,
    qp: uroce_verbs::Qp,
}

fn fixture(qp_type: QpType) -> Fixture {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 256);
    let qp = pd
        .create_qp(&QpInitAttr::new(qp_type, &cq, &cq, caps(8)))
        .expect("qp");
    Fixture {
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
    }
}

/// Moves a UD QP from RESET to RTS.
fn ud_to_rts(qp: &uroce_verbs::QpRef) {
    let init = QpAttr {
        qp_state: QpState::Init,
        qkey: 0x1111,
        ..QpAttr::default()
    };
    qp.modify(
        &init,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
    )
    .expect("UD RESET→INIT");
    for state in [QpState::Rtr, QpState::Rts] {
        let mask = if state == QpState::Rts {
            AttrMask::STATE | AttrMask::SQ_PSN
        } else {
            AttrMask::STATE
        };
        qp.modify(
            &QpAttr {
                qp_state: state,
                ..QpAttr::default()
            },
            mask,
        )
        .expect("UD modify");
    }
}

#[test]
fn rc_reset_to_rts_and_query_returns_what_was_set() {
    let f = fixture(QpType::Rc);
    let (attr, info) = f.qp.query();
    assert_eq!(attr.qp_state, QpState::Reset);
    assert_eq!(attr.path_mtu, Pmtu::Mtu256, "new QPs start at 256 (rxe)");
    assert_eq!(info.cap, caps(8));
    assert_eq!(info.qp_type, QpType::Rc);

    let (a, m) = init_attr();
    f.qp.modify(&a, m).expect("RESET→INIT");
    let (q, _) = f.qp.query();
    assert_eq!(q.qp_state, QpState::Init);
    assert_eq!(q.port_num, 1);
    assert_eq!(
        q.qp_access_flags,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
    );

    let (a, m) = rtr_attr();
    f.qp.modify(&a, m).expect("INIT→RTR");
    let (q, _) = f.qp.query();
    assert_eq!(q.qp_state, QpState::Rtr);
    assert_eq!(q.ah_attr.dest_ip().to_string(), "10.9.8.7");
    assert_eq!(q.path_mtu, Pmtu::Mtu1024);
    assert_eq!(q.dest_qp_num, 0x00ab_cdef);
    assert_eq!(q.rq_psn, Psn::new(0x12_3456));
    assert_eq!(q.max_dest_rd_atomic, 16);
    assert_eq!(q.min_rnr_timer, 12);

    let (a, m) = rts_attr();
    f.qp.modify(&a, m).expect("RTR→RTS");
    let (q, _) = f.qp.query();
    assert_eq!(q.qp_state, QpState::Rts);
    assert_eq!(q.cur_qp_state, QpState::Rts);
    assert_eq!((q.timeout, q.retry_cnt, q.rnr_retry), (14, 7, 7));
    assert_eq!(q.sq_psn, Psn::new(0x65_4321));
    assert_eq!(q.max_rd_atomic, 8);
    // Values from earlier steps are kept.
    assert_eq!(q.dest_qp_num, 0x00ab_cdef);

    // RTS→RTS with an optional attribute (MIN_RNR_TIMER is optional for RC, INTEROP-NOTES §6).
    let a = QpAttr {
        min_rnr_timer: 3,
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    f.qp.modify(&a, AttrMask::MIN_RNR_TIMER)
        .expect("attribute-only modify");
    assert_eq!(f.qp.query().0.min_rnr_timer, 3);
}

/// Tries `attr`/`mask`, expects an error naming `expect_attr`, and checks nothing changed.
fn rejected(f: &Fixture, attr: &QpAttr, mask: AttrMask, expect_attr: AttrMask) -> ModifyQpError {
    let before = f.qp.query();
    let err = f.qp.modify(attr, mask).expect_err("must be rejected");
    assert_eq!(err.attr(), Some(expect_attr), "{err}");
    if expect_attr == AttrMask::STATE {
        assert!(
            err.to_string().contains('→'),
            "message names the transition: {err}"
        );
    } else {
        assert!(
            err.to_string().contains(expect_attr.attr_name()),
            "message names the attribute: {err}"
        );
    }
    assert_eq!(f.qp.query(), before, "QP unchanged after {err}");
    err
}

#[test]
fn rejected_modifies_leave_the_qp_unchanged() {
    let f = fixture(QpType::Rc);
    // RESET→RTR is not in the table.
    let (mut a, m) = rtr_attr();
    rejected(&f, &a, m, AttrMask::STATE);
    let (i, im) = init_attr();
    f.qp.modify(&i, im).expect("init");
    // INIT→RTR without DEST_QPN (required for RC).
    rejected(&f, &a, m - AttrMask::DEST_QPN, AttrMask::DEST_QPN);
    // QKEY is not allowed for RC INIT→RTR.
    rejected(&f, &a, m | AttrMask::QKEY, AttrMask::QKEY);
    // Value errors, caught after the table: the first two by proto's value limits, the
    // others by the verbs layer's device checks. Each leaves every attribute unchanged even
    // though the other fields in the same call were valid.
    a.min_rnr_timer = 32;
    rejected(&f, &a, m, AttrMask::MIN_RNR_TIMER);
    a.min_rnr_timer = 12;
    a.max_dest_rd_atomic = 129;
    rejected(&f, &a, m, AttrMask::MAX_DEST_RD_ATOMIC);
    a.max_dest_rd_atomic = 16;
    a.ah_attr.sgid_index = 3;
    rejected(&f, &a, m, AttrMask::AV);
    a.ah_attr.sgid_index = 0;
    a.dest_qp_num = 0x0100_0000;
    rejected(&f, &a, m, AttrMask::DEST_QPN);
    a.dest_qp_num = 5;
    let mut alt = a;
    alt.alt_ah_attr = a.ah_attr;
    rejected(&f, &alt, m | AttrMask::ALT_PATH, AttrMask::ALT_PATH);
    // INIT→INIT with a bad port / P_Key index / access flags.
    let mut ii = i;
    ii.port_num = 2;
    rejected(&f, &ii, AttrMask::PORT, AttrMask::PORT);
    ii.port_num = 1;
    ii.pkey_index = 64;
    rejected(&f, &ii, AttrMask::PKEY_INDEX, AttrMask::PKEY_INDEX);
    ii.pkey_index = 0;
    ii.qp_access_flags = AccessFlags::ZERO_BASED;
    rejected(&f, &ii, AttrMask::ACCESS_FLAGS, AttrMask::ACCESS_FLAGS);
    // CUR_STATE is only accepted in RTR/RTS/SQD/SQE.
    let mut c = i;
    c.cur_qp_state = QpState::Init;
    rejected(&f, &c, AttrMask::CUR_STATE, AttrMask::CUR_STATE);

    // The valid call still works afterwards.
    f.qp.modify(&a, m).expect("INIT→RTR");
    let (r, rm) = rts_attr();
    let mut bad = r;
    bad.timeout = 32;
    rejected(&f, &bad, rm, AttrMask::TIMEOUT);
    // CUR_STATE naming the wrong state.
    let mut cs = r;
    cs.cur_qp_state = QpState::Rts;
    rejected(&f, &cs, rm | AttrMask::CUR_STATE, AttrMask::CUR_STATE);
    cs.cur_qp_state = QpState::Rtr;
    f.qp.modify(&cs, rm | AttrMask::CUR_STATE)
        .expect("RTR→RTS with CUR_STATE");
    // INIT→RTS style jumps are invalid: RTS→INIT.
    rejected(&f, &i, im, AttrMask::STATE);
}

#[test]
fn ud_uses_its_own_table_rows() {
    let f = fixture(QpType::Ud);
    let (i, im) = init_attr();
    // UD RESET→INIT requires QKEY and does not accept ACCESS_FLAGS (INTEROP-NOTES §6).
    let err =
        f.qp.modify(&i, im)
            .expect_err("ACCESS_FLAGS not allowed for UD");
    assert_eq!(
        err.attr(),
        Some(AttrMask::QKEY),
        "the missing QKEY is reported first"
    );
    let ud_init = QpAttr {
        qp_state: QpState::Init,
        qkey: 0x1111_1111,
        port_num: 1,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
    let err =
        f.qp.modify(&ud_init, mask | AttrMask::ACCESS_FLAGS)
            .expect_err("foreign bit");
    assert_eq!(err.attr(), Some(AttrMask::ACCESS_FLAGS));
    f.qp.modify(&ud_init, mask).expect("UD RESET→INIT");
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    f.qp.modify(&rtr, AttrMask::STATE)
        .expect("UD INIT→RTR needs nothing");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: Psn::new(5),
        ..QpAttr::default()
    };
    f.qp.modify(&rts, AttrMask::STATE)
        .expect_err("SQ_PSN required");
    f.qp.modify(&rts, AttrMask::STATE | AttrMask::SQ_PSN)
        .expect("UD RTR→RTS");
    let q = f.qp.query().0;
    assert_eq!(
        (q.qp_state, q.qkey, q.sq_psn),
        (QpState::Rts, 0x1111_1111, Psn::new(5))
    );
}

#[test]
fn reset_returns_to_initial_attributes() {
    let f = fixture(QpType::Rc);
    rc_to(&f.qp, QpState::Rts);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    f.qp.post_send(SendWr::send(1, vec![])).expect("post");
    f.qp.modify(&reset, AttrMask::STATE).expect("RTS→RESET");
    let (q, _) = f.qp.query();
    assert_eq!(q.qp_state, QpState::Reset);
    assert_eq!(q.dest_qp_num, 0);
    assert_eq!(q.cap, caps(8), "caps survive");
    assert!(
        f.qp.engine_counters().is_none(),
        "the engine, and the queue it held, discarded"
    );
    assert!(f.cq.is_empty(), "RESET discards without completions");
}

#[test]
fn sqd_drains_then_raises_sq_drained() {
    let (ctx, lo) = loopback_context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 256);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(8)))
        .expect("qp");
    // The peer QP receives what `qp` sends.
    let peer = sender_to(&ctx, &lo, &pd, &qp, QpState::Rts);
    for id in 0..3 {
        peer.qp.post_recv(RecvWr::new(id, vec![])).expect("post");
    }
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        ..QpAttr::default()
    };
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    // Nothing in flight: SQ_DRAINED immediately.
    qp.modify(&sqd, AttrMask::STATE).expect("RTS→SQD");
    let ev = ctx.try_get_async_event().expect("SQ_DRAINED");
    assert_eq!(ev.event_type(), EventType::SqDrained);
    assert!(ev.qp().expect("qp").same_qp(&qp));
    ev.ack();
    qp.modify(&rts, AttrMask::STATE).expect("SQD→RTS");

    // Two in flight (transmitted, not yet acknowledged), one waiting.
    for id in 0..2 {
        qp.post_send(SendWr::send(id, vec![])).expect("post");
    }
    assert_eq!(lo.transmit(&ctx), 2);
    qp.post_send(SendWr::send(2, vec![])).expect("post");
    qp.modify(&sqd, AttrMask::STATE).expect("RTS→SQD");
    assert!(qp.query().0.sq_draining);
    assert!(ctx.try_get_async_event().is_none(), "still draining");
    assert_eq!(lo.transmit(&ctx), 0, "SQD starts nothing new");
    let err = qp.modify(&rts, AttrMask::STATE).expect_err("draining");
    assert_eq!(err.attr(), Some(AttrMask::STATE));
    // Everything arrives: the second completes, the QP is drained.
    lo.progress(&ctx);
    let ev = ctx
        .get_async_event(Some(Duration::from_secs(1)))
        .expect("SQ_DRAINED after the last in-flight WR");
    assert_eq!(ev.event_type(), EventType::SqDrained);
    drop(ev);
    assert!(ctx.try_get_async_event().is_none(), "raised once");
    assert!(!qp.query().0.sq_draining);
    let done: Vec<u64> = cq.poll(8).iter().map(|w| w.wr_id).collect();
    assert_eq!(done, vec![0, 1], "the waiting WR did not start");
    qp.modify(&rts, AttrMask::STATE).expect("SQD→RTS");
    lo.progress(&ctx);
    let wcs = cq.poll(8);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (2, WcStatus::Success),
        "the third WR"
    );
}

#[test]
fn post_send_rules() {
    let f = fixture(QpType::Rc);
    for target in [QpState::Reset, QpState::Init, QpState::Rtr] {
        if target != QpState::Reset {
            rc_to(&f.qp, target);
        }
        assert_eq!(
            f.qp.post_send(SendWr::send(1, vec![])),
            Err(PostError::InvalidState {
                queue: "send",
                state: target
            })
        );
    }
    rc_to_rts_from_rtr(&f.qp);
    let sge = Sge {
        addr: 0x1000,
        length: 8,
        lkey: 1,
    };
    assert!(matches!(
        f.qp.post_send(SendWr::send(1, vec![sge; 5])),
        Err(PostError::TooManySge { num: 5, max: 4 })
    ));
    let inline = SendWr {
        flags: SendFlags::INLINE,
        inline_data: vec![0; 65].into(),
        ..SendWr::send(2, vec![])
    };
    assert!(matches!(
        f.qp.post_send(inline),
        Err(PostError::InlineTooLong { len: 65, max: 64 })
    ));
    let read_inline = SendWr {
        opcode: SendOpcode::RdmaRead,
        flags: SendFlags::INLINE,
        ..SendWr::default()
    };
    assert!(matches!(
        f.qp.post_send(read_inline),
        Err(PostError::Refused(WrError::InlineForReadOrAtomic))
    ));
    let atomic = |addr: u64, len: u32| SendWr {
        opcode: SendOpcode::AtomicFetchAndAdd,
        sg_list: vec![Sge { length: len, ..sge }].into(),
        atomic: AtomicInfo {
            remote_addr: addr,
            ..AtomicInfo::default()
        },
        ..SendWr::default()
    };
    assert!(matches!(
        f.qp.post_send(atomic(0x1004, 8)),
        Err(PostError::Refused(WrError::AtomicAlignment {
            addr: 0x1004
        }))
    ));
    assert!(matches!(
        f.qp.post_send(atomic(0x1000, 4)),
        Err(PostError::Refused(WrError::AtomicLength { len: 4 }))
    ));
    f.qp.post_send(atomic(0x1000, 8)).expect("valid atomic");
    let mw = SendWr {
        opcode: SendOpcode::BindMw,
        ..SendWr::default()
    };
    assert!(matches!(
        f.qp.post_send(mw),
        Err(PostError::Refused(uroce_proto::wr::WrError::MissingBind))
    ));
    // Fill the queue (8 WRs: one is already queued).
    for id in 0..7 {
        f.qp.post_send(SendWr::send(id, vec![])).expect("post");
    }
    assert!(matches!(
        f.qp.post_send(SendWr::send(99, vec![])),
        Err(PostError::QueueFull { max: 8, .. })
    ));
    assert!(f.cq.is_empty(), "refused WRs complete nothing");
}

/// `post_send_all` posts a list whole or not at all: a bad WR anywhere, or a list longer
/// than the room left in the send queue, posts none of it (the queue's room afterwards
/// proves it).
#[test]
fn post_send_all_is_all_or_nothing() {
    let f = fixture(QpType::Rc);
    let sends = |ids: std::ops::Range<u64>| ids.map(|i| SendWr::send(i, vec![])).collect();
    assert!(
        matches!(
            f.qp.post_send_all(sends(0..3)),
            Err(uroce_verbs::BatchPostError {
                index: 0,
                error: PostError::InvalidState { .. }
            })
        ),
        "RESET refuses at the first WR"
    );
    rc_to(&f.qp, QpState::Rtr);
    rc_to_rts_from_rtr(&f.qp);
    let e =
        f.qp.post_send_all(sends(0..9))
            .expect_err("9 > max_send_wr 8");
    assert_eq!(e.index, 8, "the first WR that does not fit");
    assert!(matches!(e.error, PostError::QueueFull { max: 8, .. }));
    let sge = Sge {
        addr: 0x1000,
        length: 8,
        lkey: 1,
    };
    let mut bad: Vec<SendWr> = sends(0..3);
    bad[2] = SendWr::send(2, vec![sge; 5]);
    let e = f.qp.post_send_all(bad).expect_err("too many SGEs in WR 2");
    assert_eq!(e.index, 2);
    assert!(matches!(e.error, PostError::TooManySge { num: 5, max: 4 }));
    f.qp.post_send_all(Vec::new()).expect("an empty list");
    // Nothing of the refused lists was queued: all 8 slots are free.
    f.qp.post_send_all(sends(10..18)).expect("8 WRs fit");
    let e =
        f.qp.post_send_all(sends(20..21))
            .expect_err("the queue is full");
    assert_eq!(e.index, 0);
    assert!(f.cq.is_empty(), "refused lists complete nothing");
}

fn rc_to_rts_from_rtr(qp: &uroce_verbs::QpRef) {
    let (a, m) = rts_attr();
    qp.modify(&a, m).expect("RTR→RTS");
}

#[test]
fn opcode_validity_per_qp_type() {
    let uc = fixture(QpType::Uc);
    rc_to(&uc.qp, QpState::Init);
    let (mut a, m) = rtr_attr();
    a.max_dest_rd_atomic = 0;
    uc.qp
        .modify(
            &a,
            m - AttrMask::MAX_DEST_RD_ATOMIC - AttrMask::MIN_RNR_TIMER,
        )
        .expect("UC INIT→RTR");
    uc.qp
        .modify(
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            AttrMask::STATE | AttrMask::SQ_PSN,
        )
        .expect("UC RTR→RTS");
    let read = SendWr {
        opcode: SendOpcode::RdmaRead,
        ..SendWr::default()
    };
    assert!(matches!(
        uc.qp.post_send(read),
        Err(PostError::Refused(WrError::OpcodeNotSupported {
            opcode: SendOpcode::RdmaRead,
            qp_type: QpType::Uc
        }))
    ));
    let write = SendWr {
        opcode: SendOpcode::RdmaWriteWithImm,
        ..SendWr::default()
    };
    uc.qp.post_send(write).expect("UC write with imm");

    let ud = fixture(QpType::Ud);
    let write = SendWr {
        opcode: SendOpcode::RdmaWrite,
        ..SendWr::default()
    };
    // The protocol checks are the engine's: before RTS the state refuses.
    assert!(matches!(
        ud.qp.post_send(write.clone()),
        Err(PostError::InvalidState { .. })
    ));
    ud_to_rts(&ud.qp);
    assert!(matches!(
        ud.qp.post_send(write),
        Err(PostError::Refused(WrError::OpcodeNotSupported { .. }))
    ));
    assert!(matches!(
        ud.qp.post_send(SendWr::send(1, vec![])),
        Err(PostError::Refused(WrError::MissingDestination))
    ));
}

#[test]
fn post_recv_rules() {
    let f = fixture(QpType::Rc);
    assert!(matches!(
        f.qp.post_recv(RecvWr::new(1, vec![])),
        Err(PostError::InvalidState { .. })
    ));
    rc_to(&f.qp, QpState::Init);
    f.qp.post_recv(RecvWr::new(1, vec![]))
        .expect("INIT accepts receives");
    let big = Sge {
        addr: 0,
        length: u32::MAX,
        lkey: 1,
    };
    assert!(matches!(
        f.qp.post_recv(RecvWr::new(2, vec![big])),
        Err(PostError::MessageTooLong { .. })
    ));
    to_err(&f.qp);
    let flushed: Vec<u64> = f.cq.poll(8).iter().map(|w| w.wr_id).collect();
    assert_eq!(flushed, vec![1], "only the accepted receive was queued");
}

mod property {
    use super::*;
    use proptest::prelude::*;
    use uroce_proto::qp_state::{check_modify, rule, ModifyError};

    fn attr_for(target: QpState, small: u8, port: u8, cur: QpState) -> QpAttr {
        let (rtr, _) = rtr_attr();
        QpAttr {
            qp_state: target,
            cur_qp_state: cur,
            timeout: small,
            retry_cnt: small % 9,
            rnr_retry: small % 9,
            min_rnr_timer: small,
            max_rd_atomic: small.saturating_mul(4),
            max_dest_rd_atomic: small.saturating_mul(3),
            port_num: port,
            pkey_index: u16::from(small) * 2,
            dest_qp_num: u32::from(small) << 19,
            ah_attr: rtr.ah_attr,
            path_mtu: rtr.path_mtu,
            qkey: 7,
            ..QpAttr::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 128,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Random modify sequences on a real RC QP: the verbs layer accepts only what the
        /// proto table accepts, applies accepted calls completely, and leaves the QP exactly
        /// as it was after a rejected one.
        #[test]
        fn modifies_apply_fully_or_not_at_all(
            steps in prop::collection::vec(
                (0u32..7, any::<u32>(), 0u8..40, 0u8..3, any::<bool>(), 0u32..26),
                1..16,
            )
        ) {
            let f = fixture(QpType::Rc);
            for (target, pick, small, port, noise, noise_bit) in steps {
                let target = QpState::from_u32(target).expect("state");
                let before = f.qp.query().0;
                let cur = before.qp_state;
                // Required bits plus a random subset of the optional ones (when the
                // transition exists), sometimes plus one random extra bit.
                let mut mask = AttrMask::STATE;
                if let Some(r) = rule(QpType::Rc, cur, target) {
                    mask |= r.required;
                    mask |= AttrMask::from_bits_retain(r.optional.bits() & pick);
                }
                if noise {
                    mask |= AttrMask::from_bits_retain(1 << noise_bit);
                }
                let attr = attr_for(target, small, port, cur);
                let table = check_modify(QpType::Rc, cur, target, mask, Some(cur));
                match f.qp.modify(&attr, mask) {
                    Ok(()) => {
                        prop_assert!(table.is_ok(), "accepted what the table refuses: {:?}", table);
                        let after = f.qp.query().0;
                        prop_assert_eq!(after.qp_state, target);
                        if mask.contains(AttrMask::TIMEOUT) {
                            prop_assert_eq!(after.timeout, attr.timeout);
                        }
                        if mask.contains(AttrMask::DEST_QPN) {
                            prop_assert_eq!(after.dest_qp_num, attr.dest_qp_num);
                        }
                        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
                            prop_assert_eq!(after.max_dest_rd_atomic, attr.max_dest_rd_atomic);
                        }
                    }
                    Err(e) => {
                        prop_assert_eq!(f.qp.query().0, before, "changed by rejected {}", e);
                        let unknown_bits = matches!(
                            e,
                            ModifyQpError::Table(ModifyError::UnknownAttributeBits { .. })
                        );
                        prop_assert!(
                            e.attr().is_some() || unknown_bits,
                            "error names an attribute: {}",
                            e
                        );
                        prop_assert!(table.is_err() || e.attr().is_some_and(|a| a != AttrMask::STATE)
                            || matches!(e, ModifyQpError::Table(ModifyError::SqStillDraining { .. })),
                            "a table-valid call refused for its state: {}", e);
                    }
                }
            }
        }
    }
}
