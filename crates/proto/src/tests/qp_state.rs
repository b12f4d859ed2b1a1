use super::*;

#[test]
fn state_and_type_values_round_trip() {
    for v in 0..=40u32 {
        if let Some(s) = QpState::from_u32(v) {
            assert_eq!(s.as_u32(), v);
        }
        if let Some(t) = QpType::from_u32(v) {
            assert_eq!(t.as_u32(), v);
        }
    }
    // ABI values from `<infiniband/verbs.h>` (`enum ibv_qp_state`).
    assert_eq!(QpState::from_u32(4), Some(QpState::Sqd));
    assert_eq!(QpState::from_u32(7), None);
    assert_eq!(QpType::from_u32(9), Some(QpType::XrcSend));
    assert_eq!(QpType::from_u32(10), Some(QpType::XrcRecv));
    assert_eq!(QpType::from_u32(5), None);
    assert_eq!(QpType::from_u32(11), None);
    assert_eq!(QpState::ALL.len(), 7);
    assert_eq!(QpType::ALL.len(), 8);
}

#[test]
fn post_rules_follow_spec() {
    use PostOutcome::*;
    use QpState::*;
    // INTEROP-NOTES §6: post_send needs ≥ RTS, ERR flushed; SQD holds WQEs.
    let send = [
        (Reset, None),
        (Init, None),
        (Rtr, None),
        (Rts, Some(Process)),
        (Sqd, Some(Defer)),
        (Sqe, Some(Flush)),
        (Err, Some(Flush)),
    ];
    for (s, want) in send {
        assert_eq!(s.send_post(), want, "{s}");
        assert_eq!(s.can_post_send(), want.is_some(), "{s}");
    }
    // post_recv needs ≥ INIT; ERR flushed (IBA §10.3).
    let recv = [
        (Reset, None),
        (Init, Some(Process)),
        (Rtr, Some(Process)),
        (Rts, Some(Process)),
        (Sqd, Some(Process)),
        (Sqe, Some(Process)),
        (Err, Some(Flush)),
    ];
    for (s, want) in recv {
        assert_eq!(s.recv_post(), want, "{s}");
        assert_eq!(s.can_post_recv(), want.is_some(), "{s}");
    }
}

#[test]
fn engine_activity_follows_spec() {
    use QpState::*;
    // (state, responder, requester, starts new send WQEs)
    let want = [
        (Reset, false, false, false),
        (Init, false, false, false),
        (Rtr, true, false, false),
        (Rts, true, true, true),
        (Sqd, true, true, false),
        (Sqe, true, false, false),
        (Err, false, false, false),
    ];
    for (s, resp, req, start) in want {
        assert_eq!(s.responder_active(), resp, "{s}");
        assert_eq!(s.requester_active(), req, "{s}");
        assert_eq!(s.starts_send_wqes(), start, "{s}");
    }
}

#[test]
fn attr_names_and_bits() {
    assert_eq!(AttrMask::PATH_MTU.attr_name(), "IBV_QP_PATH_MTU");
    assert_eq!(AttrMask::RATE_LIMIT.attr_name(), "IBV_QP_RATE_LIMIT");
    assert_eq!(AttrMask::STATE.attr_name(), "IBV_QP_STATE");
    assert_eq!(AttrMask::empty().attr_name(), "IBV_QP_<unknown>");
    assert_eq!(
        (AttrMask::AV | AttrMask::PORT).attr_name(),
        "IBV_QP_<unknown>"
    );
    assert_eq!(
        AttrMask::from_bits_retain(1 << 21).attr_name(),
        "IBV_QP_<unknown>"
    );
    // Every named flag's name is "IBV_QP_" + its bitflags name.
    for (flag_name, flag) in AttrMask::all().iter_names() {
        assert_eq!(flag.attr_name(), format!("IBV_QP_{flag_name}"));
    }
    assert_eq!(AttrMask::all().iter().count(), 22);

    let m = AttrMask::from_bits_retain(0x8000_0000 | (1 << 8) | 1);
    let bits: Vec<u32> = m.single_bits().map(|b| b.bits()).collect();
    assert_eq!(bits, vec![1, 1 << 8, 0x8000_0000]);
    assert_eq!(m.single_bits().len(), 3);
    assert_eq!(m.lowest_bit(), Some(AttrMask::STATE));
    assert_eq!(AttrMask::empty().lowest_bit(), None);
    assert_eq!(AttrMask::empty().single_bits().next(), None);
    assert_eq!(m.unknown_bits(), 0x8000_0000);
}

#[test]
fn table_rows_do_not_overlap_and_cover_valid_transitions() {
    for from in QpState::ALL {
        for to in QpState::ALL {
            let valid = is_valid_transition(from, to);
            for t in QpType::ALL {
                let n = MODIFY_TABLE
                    .iter()
                    .filter(|r| r.from == from && r.to == to && r.applies_to(t))
                    .count();
                assert_eq!(n, usize::from(valid), "{t} {from}→{to}");
            }
        }
    }
    for r in MODIFY_TABLE {
        assert!(r.required.intersection(r.optional).is_empty());
        assert!(!r.allowed().is_empty());
        if r.implicit {
            assert!(r.required.is_empty() && r.optional.is_empty());
        }
    }
}

#[test]
fn error_display_names_the_attribute() {
    let e = check_modify(
        QpType::Rc,
        QpState::Init,
        QpState::Rtr,
        AttrMask::STATE | AttrMask::AV,
        None,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "missing required attribute IBV_QP_PATH_MTU for INIT→RTR"
    );
    let e = check_modify(
        QpType::Ud,
        QpState::Rts,
        QpState::Err,
        AttrMask::STATE | AttrMask::QKEY,
        None,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "attribute IBV_QP_QKEY is not allowed for RTS→ERR"
    );
    let e = check_modify(
        QpType::Rc,
        QpState::Reset,
        QpState::Rtr,
        AttrMask::STATE,
        None,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid QP state transition RESET→RTR for QP type RC"
    );
    let e = check_modify(
        QpType::Ud,
        QpState::Rts,
        QpState::Rts,
        AttrMask::CUR_STATE,
        Some(QpState::Sqd),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "IBV_QP_CUR_STATE says SQD, but the QP is in RTS"
    );
    let e = check_modify(
        QpType::Ud,
        QpState::Init,
        QpState::Init,
        AttrMask::CUR_STATE,
        Some(QpState::Init),
    )
    .unwrap_err();
    assert!(e.to_string().contains("IBV_QP_CUR_STATE"), "{e}");
    assert!(e.to_string().contains("INIT"), "{e}");
    let e = check_modify(
        QpType::Ud,
        QpState::Init,
        QpState::Init,
        AttrMask::from_bits_retain(1 << 22),
        None,
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "attribute mask has unknown bits 0x00400000");
    let e = QpAttrLimits::rxe(3)
        .check_values(
            AttrMask::TIMEOUT,
            &QpAttrValues {
                timeout: 32,
                ..QpAttrValues::default()
            },
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "attribute IBV_QP_TIMEOUT value 32 is outside 0..=31"
    );
    assert!(check_sq_drain(QpState::Sqd, QpState::Rts, true)
        .unwrap_err()
        .to_string()
        .contains("SQD→RTS"));
}

#[test]
fn state_change_needs_state_bit() {
    assert_eq!(
        check_modify(
            QpType::Rc,
            QpState::Reset,
            QpState::Init,
            AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            None
        ),
        Err(ModifyError::StateAttributeMissing {
            current: QpState::Reset,
            next: QpState::Init
        })
    );
    assert_eq!(
        check_modify(
            QpType::Rc,
            QpState::Reset,
            QpState::Init,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            None
        ),
        Ok(())
    );
    // CUR_STATE in the mask without a value.
    assert_eq!(
        check_modify(
            QpType::Rc,
            QpState::Rts,
            QpState::Rts,
            AttrMask::CUR_STATE,
            None
        ),
        Err(ModifyError::CurStateValueMissing)
    );
}

#[test]
fn sq_drain_rule() {
    use QpState::*;
    assert!(check_sq_drain(Sqd, Rts, true).is_err());
    assert!(check_sq_drain(Sqd, Reset, true).is_err());
    assert!(check_sq_drain(Sqd, Err, true).is_ok());
    assert!(check_sq_drain(Sqd, Sqd, true).is_ok());
    assert!(check_sq_drain(Sqd, Rts, false).is_ok());
    assert!(check_sq_drain(Rts, Rts, true).is_ok());
}

#[test]
fn value_limits() {
    let lim = QpAttrLimits::rxe(3); // port MTU 1024
    let ok = QpAttrValues {
        path_mtu: 3,
        timeout: 31,
        alt_timeout: 31,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 31,
        max_rd_atomic: 128,
        max_dest_rd_atomic: 128,
    };
    assert_eq!(lim.check_values(AttrMask::all(), &ok), Ok(()));
    let cases: [(AttrMask, QpAttrValues, u32, u32); 10] = [
        (AttrMask::PATH_MTU, QpAttrValues { path_mtu: 4, ..ok }, 1, 3),
        (AttrMask::PATH_MTU, QpAttrValues { path_mtu: 0, ..ok }, 1, 3),
        (AttrMask::TIMEOUT, QpAttrValues { timeout: 32, ..ok }, 0, 31),
        (
            AttrMask::ALT_PATH,
            QpAttrValues {
                alt_timeout: 32,
                ..ok
            },
            0,
            31,
        ),
        (
            AttrMask::RETRY_CNT,
            QpAttrValues { retry_cnt: 8, ..ok },
            0,
            7,
        ),
        (
            AttrMask::RNR_RETRY,
            QpAttrValues { rnr_retry: 8, ..ok },
            0,
            7,
        ),
        (
            AttrMask::MIN_RNR_TIMER,
            QpAttrValues {
                min_rnr_timer: 32,
                ..ok
            },
            0,
            31,
        ),
        (
            AttrMask::MAX_QP_RD_ATOMIC,
            QpAttrValues {
                max_rd_atomic: 129,
                ..ok
            },
            0,
            128,
        ),
        (
            AttrMask::MAX_DEST_RD_ATOMIC,
            QpAttrValues {
                max_dest_rd_atomic: 129,
                ..ok
            },
            0,
            128,
        ),
        (AttrMask::PATH_MTU, QpAttrValues { path_mtu: 6, ..ok }, 1, 3),
    ];
    for (attr, vals, min, max) in cases {
        match lim.check_values(AttrMask::all(), &vals) {
            Err(ModifyError::ValueOutOfRange {
                attr: a,
                name,
                min: mn,
                max: mx,
                ..
            }) => {
                assert_eq!((a, mn, mx), (attr, min, max));
                assert_eq!(name, attr.attr_name());
            }
            other => panic!("{attr:?}: {other:?}"),
        }
        // Without the bit in the mask the bad value is not looked at.
        assert_eq!(
            lim.check_values(AttrMask::all().difference(attr), &vals),
            Ok(())
        );
    }
    // A 4096-byte port allows MTU 5 but never 6.
    let big = QpAttrLimits::rxe(5);
    assert!(big
        .check_values(AttrMask::PATH_MTU, &QpAttrValues { path_mtu: 5, ..ok })
        .is_ok());
    assert!(big
        .check_values(AttrMask::PATH_MTU, &QpAttrValues { path_mtu: 6, ..ok })
        .is_err());
    // A bogus port MTU above 5 does not widen the range.
    let bogus = QpAttrLimits::rxe(9);
    assert!(bogus
        .check_values(AttrMask::PATH_MTU, &QpAttrValues { path_mtu: 6, ..ok })
        .is_err());
}
