//! XRC (IBA Vol 1 Annex A14) on the simulated network: an XRC_SEND (initiator) QP on
//! node 0 connected to an XRC_RECV (target) QP on node 1, whose node has XRC SRQs in two
//! domains. Expectations come from Annex A14: every request packet carries an XRCETH with
//! the WR's SRQ number, responses use the XRC opcodes without XRCETH, the receive WQE
//! comes from the SRQ the packet names and its completion belongs on that SRQ's CQ; an
//! SRQ number that is unknown or of another domain is an invalid request (NAK Invalid
//! Request, both QPs in ERR). On failure each test prints the packet trace.

use std::collections::BTreeMap;
use std::time::Duration;

use uroce_proto::engine::Engine;
use uroce_proto::qp_state::{QpState, QpType};
use uroce_proto::rc::{CqKind, QpEvent, RcConfig, RcQp};
use uroce_proto::wr::{RecvWr, SendFlags, SendOpcode, SendWr, WcOpcode, WcStatus};
use uroce_sim::{Access, LinkConfig, QpId, SimNet};
use uroce_wire::aeth::{NakCode, Syndrome};
use uroce_wire::opcode::op;
use uroce_wire::{Pmtu, Psn};

const PSN0: u32 = 1000;
/// The target QPs' domain, and another one.
const DOMAIN: u32 = 1;
const OTHER_DOMAIN: u32 = 2;
/// SRQs of the target's domain, and one of the other domain.
const SRQS: [u32; 3] = [5, 6, 7];
const FOREIGN_SRQ: u32 = 9;

const STEPS: u64 = 50_000_000;
const TIME: Duration = Duration::from_secs(3600);

/// Two nodes, `n` initiator/target pairs (initiator QPN 0x10 + i on node 0, target QPN
/// 0x20 + i on node 1), the SRQs above on node 1.
fn xrc_net(seed: u64, n: u32, pmtu: Pmtu) -> (SimNet<RcQp>, Vec<(QpId, QpId)>) {
    let mut net = SimNet::new(seed);
    let n0 = net.add_node().unwrap();
    let n1 = net.add_node().unwrap();
    let mut pairs = Vec::new();
    for i in 0..n {
        let (qi, qt) = (0x10 + i, 0x20 + i);
        let mut ini = RcConfig::new(qi, qt);
        ini.qp_type = QpType::XrcSend;
        ini.sq_psn = Psn::new(PSN0);
        ini.pmtu = pmtu;
        ini.peer = net.addr(n1).unwrap();
        let mut tgt = RcConfig::new(qt, qi);
        tgt.qp_type = QpType::XrcRecv;
        tgt.rq_psn = Psn::new(PSN0);
        tgt.pmtu = pmtu;
        tgt.peer = net.addr(n0).unwrap();
        let a = net.add_qp(n0, n1, RcQp::new(ini)).unwrap();
        let b = net.add_qp(n1, n0, RcQp::new(tgt)).unwrap();
        pairs.push((a, b));
    }
    let x = net.xrc_mut(n1).unwrap();
    x.target_domain = DOMAIN;
    for s in SRQS {
        x.add_srq(s, DOMAIN);
    }
    x.add_srq(FOREIGN_SRQ, OTHER_DOMAIN);
    (net, pairs)
}

fn send(wr_id: u64, srqn: u32, sge: uroce_proto::memory::Sge) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOpcode::Send, vec![sge]);
    wr.flags = SendFlags::SIGNALED;
    wr.remote_srqn = srqn;
    wr
}

/// (opcode, PSN, XRCETH SRQ, AETH syndrome) of everything `src` sent to `dst`.
type Sent = (u8, u32, Option<u32>, Option<Syndrome>);
fn sent(net: &SimNet<RcQp>, src: usize, dst: usize) -> Vec<Sent> {
    net.trace()
        .transmitted(src, dst)
        .iter()
        .map(|(_, s)| (s.opcode, s.psn.value(), s.xrc_srqn, s.syndrome()))
        .collect()
}

#[test]
fn sends_land_in_the_srq_they_name_with_xrc_opcodes() {
    let (mut net, pairs) = xrc_net(1, 1, Pmtu::Mtu256);
    let (ini, tgt) = pairs[0];
    let src = net.memory(0).unwrap().register(600, Access::LOCAL_WRITE);
    let data: Vec<u8> = (0..600u32).map(|i| (i * 7 + 1) as u8).collect();
    net.memory(0).unwrap().write(&src, 0, &data).unwrap();
    let d5 = net.memory(1).unwrap().register(600, Access::LOCAL_WRITE);
    let d6 = net.memory(1).unwrap().register(600, Access::LOCAL_WRITE);
    let x = net.xrc_mut(1).unwrap();
    assert!(x.post(5, RecvWr::new(55, vec![d5.sge(0, 600)])));
    assert!(x.post(6, RecvWr::new(66, vec![d6.sge(0, 600)])));
    let q = net.qp_mut(ini).unwrap();
    q.post_send(send(1, 6, src.sge(0, 600))).unwrap();
    q.post_send(send(2, 5, src.sge(0, 10))).unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();

    let req = sent(&net, 0, 1);
    assert_eq!(
        req,
        vec![
            (op::XRC_SEND_FIRST, PSN0, Some(6), None),
            (op::XRC_SEND_MIDDLE, PSN0 + 1, Some(6), None),
            (op::XRC_SEND_LAST, PSN0 + 2, Some(6), None),
            (op::XRC_SEND_ONLY, PSN0 + 3, Some(5), None),
        ],
        "{}",
        net.trace()
    );
    let resp = sent(&net, 1, 0);
    assert!(!resp.is_empty());
    for r in &resp {
        assert_eq!((r.0, r.2), (op::XRC_ACKNOWLEDGE, None), "{}", net.trace());
        assert_eq!(r.3, Some(Syndrome::ACK_NO_CREDIT));
    }
    assert_eq!(resp.last().map(|r| r.1), Some(PSN0 + 3));

    let sends = net.take_completions(ini).unwrap();
    let ids: Vec<_> = sends.iter().map(|(k, w)| (*k, w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        vec![
            (CqKind::Send, 1, WcStatus::Success),
            (CqKind::Send, 2, WcStatus::Success)
        ]
    );
    let recvs = net.take_completions(tgt).unwrap();
    let got: Vec<_> = recvs
        .iter()
        .map(|(k, w)| (*k, w.wr_id, w.status, w.opcode, w.byte_len, w.qp_num))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                CqKind::XrcSrq(6),
                66,
                WcStatus::Success,
                WcOpcode::Recv,
                600,
                0x20
            ),
            (
                CqKind::XrcSrq(5),
                55,
                WcStatus::Success,
                WcOpcode::Recv,
                10,
                0x20
            ),
        ]
    );
    assert_eq!(net.memory(1).unwrap().read(&d6, 0, 600).unwrap(), data);
    assert_eq!(net.memory(1).unwrap().read(&d5, 0, 10).unwrap(), data[..10]);
}

/// The NAK an SRQ number outside the target's domain gets, packet by packet.
fn bad_srq_is_naked(srqn: u32) {
    let (mut net, pairs) = xrc_net(2, 1, Pmtu::Mtu1024);
    let (ini, tgt) = pairs[0];
    let src = net.memory(0).unwrap().register(64, Access::LOCAL_WRITE);
    let dst = net.memory(1).unwrap().register(64, Access::LOCAL_WRITE);
    // A WQE waits on every SRQ (the foreign one too): none may be consumed.
    for s in SRQS.iter().chain([FOREIGN_SRQ].iter()) {
        assert!(net
            .xrc_mut(1)
            .unwrap()
            .post(*s, RecvWr::new(u64::from(*s), vec![dst.sge(0, 64)])));
    }
    net.qp_mut(ini)
        .unwrap()
        .post_send(send(1, srqn, src.sge(0, 16)))
        .unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();

    assert_eq!(
        sent(&net, 0, 1),
        vec![(op::XRC_SEND_ONLY, PSN0, Some(srqn), None)],
        "{}",
        net.trace()
    );
    assert_eq!(
        sent(&net, 1, 0),
        vec![(
            op::XRC_ACKNOWLEDGE,
            PSN0,
            None,
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )],
        "{}",
        net.trace()
    );
    let sends = net.take_completions(ini).unwrap();
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert_eq!(
        (sends[0].0, sends[0].1.wr_id, sends[0].1.status),
        (CqKind::Send, 1, WcStatus::RemInvReqErr)
    );
    assert_eq!(net.qp(ini).unwrap().state(), QpState::Err);
    let t = net.qp(tgt).unwrap();
    assert_eq!(t.state(), QpState::Err);
    assert_eq!(t.counters().bad_xrc_srqn, 1);
    assert!(net.take_events(tgt).unwrap().contains(&QpEvent::QpReqErr));
    // No receive completion, and every SRQ still holds its WQE.
    assert!(net.take_completions(tgt).unwrap().is_empty());
    let x = net.xrc_mut(1).unwrap();
    for s in SRQS.iter().chain([FOREIGN_SRQ].iter()) {
        assert_eq!(x.len(*s), 1, "SRQ {s}");
    }
}

#[test]
fn unknown_srq_number_is_naked_invalid_request() {
    bad_srq_is_naked(0x12345);
}

#[test]
fn srq_of_another_domain_is_naked_invalid_request() {
    bad_srq_is_naked(FOREIGN_SRQ);
}

#[test]
fn rdma_write_and_read_use_xrc_opcodes() {
    let (mut net, pairs) = xrc_net(3, 1, Pmtu::Mtu256);
    let (ini, _tgt) = pairs[0];
    let local = net.memory(0).unwrap().register(1024, Access::LOCAL_WRITE);
    let remote = net
        .memory(1)
        .unwrap()
        .register(512, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let data: Vec<u8> = (0..300u32).map(|i| (i * 13) as u8).collect();
    net.memory(0).unwrap().write(&local, 0, &data).unwrap();
    let mut w = SendWr::new(1, SendOpcode::RdmaWrite, vec![local.sge(0, 300)]);
    w.remote_addr = remote.va(0);
    w.rkey = remote.rkey;
    w.remote_srqn = 7;
    w.flags = SendFlags::SIGNALED;
    let mut r = SendWr::new(2, SendOpcode::RdmaRead, vec![local.sge(512, 300)]);
    r.remote_addr = remote.va(0);
    r.rkey = remote.rkey;
    r.remote_srqn = 7;
    r.flags = SendFlags::SIGNALED;
    let q = net.qp_mut(ini).unwrap();
    q.post_send(w).unwrap();
    q.post_send(r).unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();
    let req: Vec<_> = sent(&net, 0, 1).iter().map(|s| (s.0, s.2)).collect();
    assert_eq!(
        req,
        vec![
            (op::XRC_RDMA_WRITE_FIRST, Some(7)),
            (op::XRC_RDMA_WRITE_LAST, Some(7)),
            (op::XRC_RDMA_READ_REQUEST, Some(7)),
        ],
        "{}",
        net.trace()
    );
    let resp: Vec<_> = sent(&net, 1, 0).iter().map(|s| (s.0, s.2)).collect();
    assert!(
        resp.ends_with(&[
            (op::XRC_RDMA_READ_RESPONSE_FIRST, None),
            (op::XRC_RDMA_READ_RESPONSE_LAST, None)
        ]),
        "{}",
        net.trace()
    );
    let wcs = net.take_completions(ini).unwrap();
    let st: Vec<_> = wcs.iter().map(|(_, w)| (w.wr_id, w.status)).collect();
    assert_eq!(st, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(net.memory(1).unwrap().read(&remote, 0, 300).unwrap(), data);
    assert_eq!(net.memory(0).unwrap().read(&local, 512, 300).unwrap(), data);
}

/// The SRQ message `seq` of initiator `i` names.
fn srq_for(i: u32, seq: u32) -> u32 {
    SRQS[((seq * 7 + i) % 3) as usize]
}

/// Several initiators, messages spread over three SRQs, lossy links that also duplicate
/// and reorder: every message arrives exactly once, in order per initiator QP, in the SRQ
/// it named, with its bytes intact.
#[test]
fn under_loss_every_message_arrives_once_in_order_in_its_srq() {
    const PAIRS: u32 = 3;
    const MSGS: u32 = 40;
    const BUF: u32 = 1024;
    for seed in 0..6u64 {
        let (mut net, pairs) = xrc_net(100 + seed, PAIRS, Pmtu::Mtu256);
        let lossy = LinkConfig {
            loss: 0.05,
            dup: 0.02,
            reorder: 0.05,
            ..LinkConfig::with_delay(Duration::from_micros(5))
        };
        net.set_links(0, 1, lossy).unwrap();
        // Receive buffers: one region per SRQ, slot k of SRQ s has wr_id s << 16 | k.
        let slots = (PAIRS * MSGS) as usize;
        let mut bufs = BTreeMap::new();
        for s in SRQS {
            let r = net
                .memory(1)
                .unwrap()
                .register(slots * BUF as usize, Access::LOCAL_WRITE);
            for k in 0..slots as u64 {
                let wr = RecvWr::new(u64::from(s) << 16 | k, vec![r.sge(k * u64::from(BUF), BUF)]);
                assert!(net.xrc_mut(1).unwrap().post(s, wr));
            }
            bufs.insert(s, r);
        }
        // Messages: 8-byte header (initiator, seq), then filler up to a length that
        // varies from one to three packets.
        for (i, (ini, _)) in pairs.iter().enumerate() {
            let i = i as u32;
            let src = net
                .memory(0)
                .unwrap()
                .register((MSGS * BUF) as usize, Access::LOCAL_WRITE);
            for seq in 0..MSGS {
                let len = 8 + (seq * 97 + i * 31) % 700;
                let mut msg = Vec::with_capacity(len as usize);
                msg.extend_from_slice(&i.to_be_bytes());
                msg.extend_from_slice(&seq.to_be_bytes());
                msg.extend((8..len).map(|b| (b ^ seq ^ i) as u8));
                let off = u64::from(seq * BUF);
                net.memory(0).unwrap().write(&src, off, &msg).unwrap();
                net.qp_mut(*ini)
                    .unwrap()
                    .post_send(send(u64::from(seq), srq_for(i, seq), src.sge(off, len)))
                    .unwrap();
            }
        }
        net.run_until(
            |n| {
                pairs
                    .iter()
                    .all(|(a, _)| n.completions(*a).is_ok_and(|c| c.len() >= MSGS as usize))
            },
            STEPS,
            TIME,
        )
        .unwrap();
        net.run_until_quiet(STEPS, TIME).unwrap();
        for (i, (ini, tgt)) in pairs.iter().enumerate() {
            let i = i as u32;
            let sends = net.take_completions(*ini).unwrap();
            let ok: Vec<_> = sends.iter().map(|(_, w)| (w.wr_id, w.status)).collect();
            let want: Vec<_> = (0..u64::from(MSGS))
                .map(|s| (s, WcStatus::Success))
                .collect();
            assert_eq!(ok, want, "seed {seed} initiator {i}\n{}", net.trace());
            let recvs = net.take_completions(*tgt).unwrap();
            let mut seqs = Vec::new();
            for (kind, wc) in recvs {
                assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
                let CqKind::XrcSrq(s) = kind else {
                    panic!("seed {seed}: receive completion {kind:?}");
                };
                assert_eq!(
                    u64::from(s),
                    wc.wr_id >> 16,
                    "completion on the SRQ of its WQE"
                );
                let k = wc.wr_id & 0xffff;
                let got = net
                    .memory(1)
                    .unwrap()
                    .read(&bufs[&s], k * u64::from(BUF), wc.byte_len as usize)
                    .unwrap();
                let who = u32::from_be_bytes(got[0..4].try_into().unwrap());
                let seq = u32::from_be_bytes(got[4..8].try_into().unwrap());
                assert_eq!(who, i, "seed {seed}: message of another initiator");
                assert_eq!(s, srq_for(i, seq), "seed {seed}: message {seq} in SRQ {s}");
                assert_eq!(wc.byte_len, 8 + (seq * 97 + i * 31) % 700);
                assert!(got[8..]
                    .iter()
                    .enumerate()
                    .all(|(b, v)| *v == ((b as u32 + 8) ^ seq ^ i) as u8));
                seqs.push(seq);
            }
            let want: Vec<u32> = (0..MSGS).collect();
            assert_eq!(seqs, want, "seed {seed} initiator {i}: once and in order");
        }
        let stats = net.stats();
        assert!(
            stats.lost > 0,
            "seed {seed}: the links lost nothing: {stats:?}"
        );
    }
}
