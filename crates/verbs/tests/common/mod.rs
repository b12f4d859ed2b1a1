//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use uroce_verbs::loopback::Loopback;
use uroce_verbs::{
    AccessFlags, AhAttr, AttrMask, Context, Cq, Device, DeviceConfig, EventType, Gid, Pd, Qp,
    QpAttr, QpCap, QpInitAttr, QpRef, QpState, QpType, SendFlags, SendWr,
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

/// The first PSN of both directions of a loopback link.
pub const LINK_PSN: u32 = 0x12_3456;

/// Moves an RC (or XRC) QP from RESET to `target`, connected to QP `peer` of the same
/// device (the destination GID is the device's own address, which the loopback transport
/// delivers to).
pub fn rc_connect(qp: &QpRef, peer: u32, target: QpState) {
    let (mut rtr, mut rtr_mask) = rtr_attr();
    if qp.qp_type() == QpType::XrcSend {
        // An initiator has no responder side.
        rtr_mask.remove(AttrMask::MIN_RNR_TIMER | AttrMask::MAX_DEST_RD_ATOMIC);
    }
    rtr.ah_attr.dgid = Gid::from_ip(ADDR.parse().expect("ip"));
    rtr.dest_qp_num = peer;
    rtr.rq_psn = Psn::new(LINK_PSN);
    let (mut rts, rts_mask) = rts_attr();
    rts.sq_psn = Psn::new(LINK_PSN);
    for (attr, mask) in [init_attr(), (rtr, rtr_mask), (rts, rts_mask)] {
        qp.modify(&attr, mask).expect("modify");
        if attr.qp_state == target {
            return;
        }
    }
}

/// A context with the loopback transport installed.
pub fn loopback_context() -> (Context, Arc<Loopback>) {
    let ctx = context();
    let lo = Loopback::install(&ctx);
    (ctx, lo)
}

/// An RC QP in RTS with its own CQ, connected over the loopback to a receiving QP: what a
/// test sends from to make a receiver complete work through the protocol engines.
pub struct Sender {
    pub qp: Qp,
    pub cq: Cq,
    pub lo: Arc<Loopback>,
}

/// Creates a [`Sender`] in `pd` and connects it to `receiver`, which this moves from RESET
/// to `target` (RTR or RTS).
pub fn sender_to(
    ctx: &Context,
    lo: &Arc<Loopback>,
    pd: &Pd,
    receiver: &QpRef,
    target: QpState,
) -> Sender {
    let scq = cq(ctx, 256);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &scq, &scq, caps(64)))
        .expect("sender QP");
    rc_connect(receiver, qp.qp_num(), target);
    rc_connect(&qp, receiver.qp_num(), QpState::Rts);
    Sender {
        qp,
        cq: scq,
        lo: lo.clone(),
    }
}

impl Sender {
    /// Posts `wr` and moves packets until nothing moves.
    pub fn send(&self, ctx: &Context, wr: SendWr) {
        self.qp.post_send(wr).expect("post send");
        self.lo.progress(ctx);
    }

    /// Sends one unsignaled empty SEND: the receiver completes one receive WR.
    pub fn send_empty(&self, ctx: &Context) {
        self.send(
            ctx,
            SendWr {
                flags: SendFlags::empty(),
                ..SendWr::send(0, vec![])
            },
        );
    }
}

/// The async events queued now, acknowledged, as their types.
pub fn drain_events(ctx: &Context) -> Vec<EventType> {
    let mut out = Vec::new();
    // Bounded: the queue holds what was raised before.
    for _ in 0..1024 {
        match ctx.try_get_async_event() {
            Some(ev) => {
                out.push(ev.event_type());
                ev.ack();
            }
            None => break,
        }
    }
    out
}
