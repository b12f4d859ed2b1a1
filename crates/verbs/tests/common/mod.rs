//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::net::IpAddr;
use std::time::Duration;

use uroce_verbs::{
    AccessFlags, AhAttr, AttrMask, Context, Cq, Device, DeviceConfig, Gid, QpAttr, QpCap, QpRef,
    QpState,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

/// The address every test device uses.
pub const ADDR: &str = "10.1.2.3";

pub fn device() -> Device {
    let addr: IpAddr = ADDR.parse().expect("address");
    Device::new(DeviceConfig::new("uroce0", addr)).expect("device")
}

pub fn context() -> Context {
    let ctx = Context::open(&device()).expect("open");
    ctx.set_destroy_timeout(Duration::from_secs(10));
    ctx
}

pub fn caps(wr: u32) -> QpCap {
    QpCap {
        max_send_wr: wr,
        max_recv_wr: wr,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

pub fn cq(ctx: &Context, cqe: u32) -> Cq {
    ctx.create_cq(cqe, None, 0).expect("cq")
}

/// RESET→INIT attributes for RC (PKEY_INDEX, PORT, ACCESS_FLAGS).
pub fn init_attr() -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    };
    (
        attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
}

/// INIT→RTR attributes for RC.
pub fn rtr_attr() -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr {
            dgid: Gid::from_ip("10.9.8.7".parse().expect("ip")),
            ..AhAttr::default()
        },
        path_mtu: Pmtu::Mtu1024,
        dest_qp_num: 0x00ab_cdef,
        rq_psn: Psn::new(0x12_3456),
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    (
        attr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
}

/// RTR→RTS attributes for RC.
pub fn rts_attr() -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: Psn::new(0x65_4321),
        max_rd_atomic: 8,
        ..QpAttr::default()
    };
    (
        attr,
        AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
}

/// Moves an RC QP from RESET to `target` (INIT, RTR or RTS).
pub fn rc_to(qp: &QpRef, target: QpState) {
    let steps = [init_attr(), rtr_attr(), rts_attr()];
    for (attr, mask) in steps {
        qp.modify(&attr, mask).expect("modify");
        if attr.qp_state == target {
            return;
        }
    }
}

/// Moves any QP to ERR.
pub fn to_err(qp: &QpRef) {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&attr, AttrMask::STATE).expect("to ERR");
}
