//! Packet-level scenarios of the UC engine on the simulated network (real sealed RoCEv2
//! datagrams, routed by each packet's destination address).
//!
//! Expectations come from IBA vol. 1 9.8.2 (UC: no ACKs, no retransmission, a message
//! with a lost packet is discarded and the responder resumes at the next FIRST/ONLY), not
//! from the engine. On failure each test prints the packet trace.

use std::time::Duration;

use uroce_proto::engine::Engine;
use uroce_proto::qp_state::QpState;
use uroce_proto::rc::CqKind;
use uroce_proto::uc::{UcConfig, UcQp};
use uroce_proto::wr::{RecvWr, SendFlags, SendOpcode, SendWr, WcOpcode, WcStatus};
use uroce_sim::{Access, LinkConfig, QpId, SimNet, Verdict};
use uroce_wire::opcode::op;
use uroce_wire::{PacketRepr, Pmtu, Psn};

/// One-way link delay, ns.
const D: u64 = 10_000;
const QPN_A: u32 = 0x31;
const QPN_B: u32 = 0x42;
const PSN_A: u32 = 0x00ff_fffe;

struct Uc {
    net: SimNet<UcQp>,
    a: QpId,
    b: QpId,
}

fn uc_pair(pmtu: Pmtu) -> Uc {
    let mut net = SimNet::new(7);
    let n0 = net.add_node().unwrap();
    let n1 = net.add_node().unwrap();
    let mut a = UcConfig::new(QPN_A, QPN_B, net.addr(n1).unwrap());
    let mut b = UcConfig::new(QPN_B, QPN_A, net.addr(n0).unwrap());
    a.pmtu = pmtu;
    b.pmtu = pmtu;
    // A's PSNs wrap inside the second message.
    a.sq_psn = Psn::new(PSN_A);
    b.rq_psn = Psn::new(PSN_A);
    let a = net.add_qp(n0, n1, UcQp::new(a)).unwrap();
    let b = net.add_qp(n1, n0, UcQp::new(b)).unwrap();
    net.set_links(n0, n1, LinkConfig::with_delay(Duration::from_nanos(D)))
        .unwrap();
    Uc { net, a, b }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(salt))
        .collect()
}

/// Three 3-packet SENDs from A; the MIDDLE of the first is lost on the link. Exactly
/// these packets go out, at these times: nine request packets back to back and nothing
/// from B. The first message is dropped, the second lands intact in the receive WQE the
/// first would have used, the third in the next one; every send completes successfully
/// at A when its last packet leaves.
#[test]
fn lost_middle_drops_that_message_and_the_next_arrives_intact() {
    let mut p = uc_pair(Pmtu::Mtu256);
    let (a, b) = (p.a, p.b);
    let src = p
        .net
        .memory(a.node)
        .unwrap()
        .register(3 * 1024, Access::LOCAL_WRITE);
    let dst = p
        .net
        .memory(b.node)
        .unwrap()
        .register(3 * 1024, Access::LOCAL_WRITE);
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| pattern(600 + 50 * i, i as u8)).collect();
    for (i, m) in msgs.iter().enumerate() {
        p.net
            .memory(a.node)
            .unwrap()
            .write(&src, 1024 * i as u64, m)
            .unwrap();
    }
    for i in 0..3u64 {
        let wr = RecvWr::new(100 + i, vec![dst.sge(1024 * i, 1024)]);
        Engine::post_recv(p.net.qp_mut(b).unwrap(), wr).unwrap();
    }
    p.net
        .set_filter(
            a.node,
            b.node,
            Some(Box::new(|_p: &PacketRepr<'_>, nth| {
                if nth == 1 {
                    Verdict::Drop
                } else {
                    Verdict::Deliver
                }
            })),
        )
        .unwrap();
    for (i, m) in msgs.iter().enumerate() {
        let mut wr = SendWr::new(
            i as u64 + 1,
            SendOpcode::Send,
            vec![src.sge(1024 * i as u64, m.len() as u32)],
        );
        wr.flags = SendFlags::SIGNALED;
        Engine::post_send(p.net.qp_mut(a).unwrap(), wr).unwrap();
    }
    p.net
        .run_until_quiet(10_000, Duration::from_secs(1))
        .unwrap();

    let psn = |k: u32| Psn::new(PSN_A).wrapping_add(k).value();
    let expected: Vec<(u8, u32)> = [
        op::UC_SEND_FIRST,
        op::UC_SEND_MIDDLE,
        op::UC_SEND_LAST,
        op::UC_SEND_FIRST,
        op::UC_SEND_MIDDLE,
        op::UC_SEND_LAST,
        op::UC_SEND_FIRST,
        op::UC_SEND_MIDDLE,
        op::UC_SEND_LAST,
    ]
    .iter()
    .enumerate()
    .map(|(k, &o)| (o, psn(k as u32)))
    .collect();
    let trace = p.net.trace();
    let sent: Vec<(u8, u32)> = trace
        .transmitted(a.node, b.node)
        .iter()
        .map(|(_, s)| (s.opcode, s.psn.value()))
        .collect();
    assert_eq!(sent, expected, "trace:\n{trace}");
    assert!(
        trace.transmitted(b.node, a.node).is_empty(),
        "UC sends no ACKs\n{trace}"
    );
    assert!(trace
        .transmitted(a.node, b.node)
        .iter()
        .all(|(t, s)| t.as_nanos() == 0 && !s.ack_req));
    let delivered: Vec<u32> = trace
        .delivered(a.node, b.node)
        .iter()
        .map(|(t, s)| {
            assert_eq!(t.as_nanos(), D);
            s.psn.value()
        })
        .collect();
    assert_eq!(
        delivered,
        [0, 2, 3, 4, 5, 6, 7, 8].map(psn).to_vec(),
        "the MIDDLE of the first message is lost"
    );

    let sc = p.net.completions(a).unwrap().to_vec();
    let sends: Vec<_> = sc
        .iter()
        .map(|(k, wc)| (*k, wc.wr_id, wc.status, wc.opcode))
        .collect();
    assert_eq!(
        sends,
        (1..=3)
            .map(|i| (CqKind::Send, i, WcStatus::Success, WcOpcode::Send))
            .collect::<Vec<_>>()
    );
    let rc = p.net.completions(b).unwrap().to_vec();
    let recvs: Vec<_> = rc
        .iter()
        .map(|(k, wc)| (*k, wc.wr_id, wc.status, wc.byte_len))
        .collect();
    assert_eq!(
        recvs,
        vec![
            (CqKind::Recv, 100, WcStatus::Success, 650),
            (CqKind::Recv, 101, WcStatus::Success, 700)
        ]
    );
    let mem_b = p.net.memory(b.node).unwrap();
    assert_eq!(mem_b.read(&dst, 0, 650).unwrap(), msgs[1]);
    assert_eq!(mem_b.read(&dst, 1024, 700).unwrap(), msgs[2]);
    let qb = p.net.qp(b).unwrap();
    let c = Engine::counters(qb);
    assert_eq!(
        (c.messages_dropped, c.dropped_uc_sequence, c.dropped_packets),
        (1, 1, 1)
    );
    assert_eq!(Engine::state(qb), QpState::Rts);
}
