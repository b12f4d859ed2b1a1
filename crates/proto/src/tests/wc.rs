use super::*;

#[test]
fn status_values_match_spec_table() {
    // `enum ibv_wc_status` of `<infiniband/verbs.h>`.
    let expect = [
        (0, "SUCCESS"),
        (5, "WR_FLUSH_ERR"),
        (9, "REM_INV_REQ_ERR"),
        (12, "RETRY_EXC_ERR"),
        (13, "RNR_RETRY_EXC_ERR"),
        (19, "FATAL_ERR"),
        (21, "GENERAL_ERR"),
    ];
    let by_name = |n: &str| match n {
        "SUCCESS" => WcStatus::Success,
        "WR_FLUSH_ERR" => WcStatus::WrFlushErr,
        "REM_INV_REQ_ERR" => WcStatus::RemInvReqErr,
        "RETRY_EXC_ERR" => WcStatus::RetryExcErr,
        "RNR_RETRY_EXC_ERR" => WcStatus::RnrRetryExcErr,
        "FATAL_ERR" => WcStatus::FatalErr,
        _ => WcStatus::GeneralErr,
    };
    for (v, n) in expect {
        assert_eq!(by_name(n).as_u32(), v, "{n}");
        assert_eq!(WcStatus::from_u32(v), Some(by_name(n)));
    }
    assert_eq!(WcStatus::from_u32(22), None);
    for (i, s) in WcStatus::ALL.iter().enumerate() {
        assert_eq!(s.as_u32() as usize, i, "ALL is dense and ordered");
    }
}

#[test]
fn opcode_and_flag_values_match_spec() {
    // `enum ibv_wc_opcode` and `enum ibv_wc_flags` of `<infiniband/verbs.h>`.
    for (v, op) in [
        (0, WcOpcode::Send),
        (1, WcOpcode::RdmaWrite),
        (2, WcOpcode::RdmaRead),
        (3, WcOpcode::CompSwap),
        (4, WcOpcode::FetchAdd),
        (5, WcOpcode::BindMw),
        (6, WcOpcode::LocalInv),
        (7, WcOpcode::Tso),
        (8, WcOpcode::Flush),
        (9, WcOpcode::AtomicWrite),
        (128, WcOpcode::Recv),
        (129, WcOpcode::RecvRdmaWithImm),
    ] {
        assert_eq!(op.as_u32(), v);
        assert_eq!(WcOpcode::from_u32(v), Some(op));
        assert_eq!(op.is_recv(), v >= 128);
    }
    assert_eq!(WcOpcode::from_u32(10), None);
    assert_eq!(WcFlags::GRH.bits(), 1);
    assert_eq!(WcFlags::WITH_IMM.bits(), 2);
    assert_eq!(WcFlags::IP_CSUM_OK.bits(), 4);
    assert_eq!(WcFlags::WITH_INV.bits(), 8);
}
