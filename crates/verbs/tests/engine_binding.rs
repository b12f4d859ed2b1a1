//! The binding of QPs to transport engines on a context with a transport: which QP types
//! can be created there (only those an engine carries), the engine an RC QP gets at
//! INIT→RTR, and the destination address each transmitted packet carries.
mod common;

use std::net::IpAddr;
use std::sync::Arc;

use common::*;
use uroce_proto::time::Instant;
use uroce_verbs::{
    engine_supported, Arrival, CreateQpError, QpInitAttr, QpState, QpType, SendWr, Transport,
    TxPacket,
};

/// A transport that does nothing: the test drives the engine itself.
struct Idle;

impl Transport for Idle {
    fn ring(&self, _qpn: u32) {}
    fn poll_progress(&self) -> bool {
        false
    }
    fn flush(&self, _qpn: u32) {}
}

/// Creation attributes for `t` (XRC_SEND has no receive side).
fn attr<'a>(t: QpType, cq: &'a uroce_verbs::Cq) -> QpInitAttr<'a> {
    let mut a = QpInitAttr::new(t, cq, cq, caps(4));
    if t == QpType::XrcSend {
        a.recv_cq = None;
        a.cap.max_recv_wr = 0;
        a.cap.max_recv_sge = 0;
    }
    a
}

fn networked() -> uroce_verbs::Context {
    let ctx = context();
    assert!(ctx.set_transport(Arc::new(Idle)).is_ok());
    ctx
}

const CREATED_BY_PD: [QpType; 5] = [
    QpType::Rc,
    QpType::Uc,
    QpType::Ud,
    QpType::Gsi,
    QpType::XrcSend,
];

#[test]
fn the_supported_set_is_rc_uc_ud_gsi_xrc_and_excludes_what_uroce_never_creates() {
    for t in [
        QpType::Rc,
        QpType::Uc,
        QpType::Ud,
        QpType::Gsi,
        QpType::XrcSend,
        QpType::XrcRecv,
    ] {
        assert!(engine_supported(t), "{t}");
    }
    for t in [QpType::Smi, QpType::RawPacket] {
        assert!(!engine_supported(t), "{t}");
    }
}

#[test]
fn a_networked_context_creates_exactly_the_types_an_engine_carries() {
    let ctx = networked();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 16);
    let mut refused = 0;
    for t in CREATED_BY_PD {
        match pd.create_qp(&attr(t, &cq)) {
            Ok(qp) => {
                assert!(engine_supported(t), "{t} created without an engine");
                assert_eq!(qp.query().1.qp_type, t);
            }
            Err(CreateQpError::UnsupportedType(x)) => {
                assert_eq!(x, t);
                assert!(!engine_supported(t), "{t} has an engine but was refused");
                refused += 1;
            }
            Err(e) => panic!("{t}: unexpected refusal {e}"),
        }
    }
    // RC, UC, UD, GSI and XRC_SEND have engines.
    assert_eq!(refused, 0);
    assert_eq!(
        refused,
        CREATED_BY_PD
            .iter()
            .filter(|t| !engine_supported(**t))
            .count()
    );
    let xrcd = ctx.alloc_xrcd().expect("xrcd");
    match xrcd.create_qp() {
        Ok(_) => assert!(engine_supported(QpType::XrcRecv)),
        Err(e) => assert_eq!(e, CreateQpError::UnsupportedType(QpType::XrcRecv)),
    }
}

#[test]
fn without_a_transport_every_type_is_created() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 16);
    for t in CREATED_BY_PD {
        let qp = pd
            .create_qp(&attr(t, &cq))
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(!qp.has_engine());
    }
    assert!(ctx.alloc_xrcd().expect("xrcd").create_qp().is_ok());
}

#[test]
fn an_rc_engine_sends_to_its_address_vector_and_takes_arrivals() {
    let ctx = networked();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 16);
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, caps(4)))
        .expect("qp");
    rc_to(&qp, QpState::Init);
    assert!(!qp.has_engine());
    rc_to(&qp, QpState::Rts);
    assert!(qp.has_engine());
    qp.post_send(SendWr::send(1, Vec::new())).expect("post");
    let mut buf = vec![0u8; 4 * 4160];
    let mut out: Vec<TxPacket> = Vec::new();
    let t = qp.engine_transmit(Instant::ZERO, &mut buf, 4160, 4, &mut out);
    assert_eq!(t.packets, 1);
    let dest: IpAddr = "10.9.8.7".parse().expect("ip");
    assert_eq!(
        out,
        vec![TxPacket {
            len: t.bytes,
            dst: dest
        }]
    );
    let counters = qp.engine_counters().expect("engine");
    assert_eq!(counters.packets_sent, 1);

    // The ACK from the peer, with the addresses it came with.
    let pkt = uroce_wire::PacketRepr {
        aeth: Some(uroce_wire::aeth::Repr {
            syndrome: uroce_wire::aeth::Syndrome::ACK_NO_CREDIT,
            msn: 1,
        }),
        ..uroce_wire::PacketRepr::new(
            uroce_wire::bth::Repr {
                opcode: uroce_wire::opcode::op::RC_ACKNOWLEDGE,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: qp.qp_num(),
                ack_req: false,
                psn: uroce_wire::Psn::new(0x65_4321),
            },
            &[],
        )
    };
    let from = Arrival::new(dest, ADDR.parse().expect("ip"));
    let handled = qp.engine_handle_packet(Instant::from_nanos(1000), &from, &pkt);
    assert_eq!(handled.map(|h| h.delivered), Some(1), "the SEND completes");
    assert_eq!(
        handled.map(|h| h.reply),
        Some(uroce_verbs::Reply::Now),
        "a response is never deferrable"
    );
    assert!(qp.engine_is_idle());
}
