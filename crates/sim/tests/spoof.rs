//! Packets with the right destination QP and the next expected PSN, from a host that is
//! not the QP's peer (or to an address that is not the QP's own), on the simulated
//! network: an RC RDMA WRITE, a UC RDMA WRITE and an XRC SEND. A connected QP must drop
//! them (counted in `dropped_bad_address`) without executing, answering or changing
//! anything, and then go on with its real peer at that very PSN.

use std::time::Duration;

use uroce_proto::engine::Engine;
use uroce_proto::qp_state::QpType;
use uroce_proto::rc::{CqKind, RcConfig, RcQp};
use uroce_proto::uc::{UcConfig, UcQp};
use uroce_proto::wr::{RecvWr, SendFlags, SendOpcode, SendWr, WcStatus};
use uroce_sim::rc::Pair;
use uroce_sim::{Access, QpId, SimNet};
use uroce_wire::opcode::op;
use uroce_wire::{bth, reth, xrceth, PacketRepr, Psn};

const STEPS: u64 = 1_000_000;
const TIME: Duration = Duration::from_secs(60);

fn bth(opcode: u8, dest_qp: u32, psn: u32) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: true,
        psn: Psn::new(psn),
    }
}

/// An RDMA WRITE ONLY of `data` to `va`/`rkey`.
fn write_only<'a>(
    opcode: u8,
    dest_qp: u32,
    psn: u32,
    va: u64,
    rkey: u32,
    data: &'a [u8],
) -> PacketRepr<'a> {
    PacketRepr {
        reth: Some(reth::Repr {
            va,
            rkey,
            dma_len: data.len() as u32,
        }),
        ..PacketRepr::new(bth(opcode, dest_qp, psn), data)
    }
}

#[test]
fn rc_write_from_another_host_is_dropped_and_the_peer_goes_on() {
    let mut pair = Pair::new(3);
    let (a, b) = (pair.a, pair.b);
    let attacker = pair.net.add_node().unwrap();
    let dst = pair.register(b, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    pair.mem(b).fill(&dst, 0).unwrap();
    let evil = [0xee; 16];
    let pkt = write_only(
        op::RC_RDMA_WRITE_ONLY,
        Pair::QPN_B,
        Pair::PSN_A,
        dst.va(0),
        dst.rkey,
        &evil,
    );
    pair.net
        .inject(attacker, 0x99, b.node, &pkt, Duration::ZERO)
        .unwrap();
    pair.run_until_quiet().unwrap();
    assert_eq!(
        pair.mem(b).read(&dst, 0, 16).unwrap(),
        vec![0; 16],
        "memory untouched"
    );
    let c = Engine::counters(pair.qp(b).unwrap());
    assert_eq!((c.dropped_bad_address, c.dropped_packets), (1, 1));
    assert!(
        pair.net.trace().transmitted(b.node, attacker).is_empty(),
        "no answer to the spoofer:\n{}",
        pair.net.trace()
    );
    // The real peer's WRITE at the same PSN is executed.
    let src = pair.register(a, 16, Access::LOCAL_WRITE);
    pair.mem(a).write(&src, 0, &[0x5a; 16]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, 16)]);
    wr.remote_addr = dst.va(0);
    wr.rkey = dst.rkey;
    wr.flags = SendFlags::SIGNALED;
    pair.post_send(a, wr).unwrap();
    let wcs = pair.wait_completions(a, CqKind::Send, 1).unwrap();
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(pair.mem(b).read(&dst, 0, 16).unwrap(), vec![0x5a; 16]);
}

#[test]
fn rc_packet_to_an_address_that_is_not_the_qps_own_is_dropped() {
    // B's QP is on B's other address (its source GID names node 2's address): what A
    // sends to B's node address is not on its path.
    let (mut ca, mut cb) = Pair::configs();
    let mut net: SimNet<RcQp> = SimNet::new(4);
    let (n0, n1, n2) = (
        net.add_node().unwrap(),
        net.add_node().unwrap(),
        net.add_node().unwrap(),
    );
    ca.peer = net.addr(n1).unwrap();
    ca.local = Some(net.addr(n0).unwrap());
    ca.retry_cnt = 1;
    cb.peer = net.addr(n0).unwrap();
    cb.local = Some(net.addr(n2).unwrap());
    let a = net.add_qp(n0, n1, RcQp::new(ca)).unwrap();
    let b = net.add_qp(n1, n0, RcQp::new(cb)).unwrap();
    let dst = net
        .memory(n1)
        .unwrap()
        .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    net.memory(n1).unwrap().fill(&dst, 0).unwrap();
    let src = net.memory(n0).unwrap().register(8, Access::LOCAL_WRITE);
    net.memory(n0).unwrap().write(&src, 0, &[0x11; 8]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, 8)]);
    wr.remote_addr = dst.va(0);
    wr.rkey = dst.rkey;
    net.qp_mut(a).unwrap().post_send(wr).unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();
    assert_eq!(
        net.memory(n1).unwrap().read(&dst, 0, 8).unwrap(),
        vec![0; 8]
    );
    // The first try and the one retry.
    assert_eq!(Engine::counters(net.qp(b).unwrap()).dropped_bad_address, 2);
    let wcs = net.take_completions(a).unwrap();
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].1.status, WcStatus::RetryExcErr);
}

#[test]
fn uc_write_from_another_host_is_dropped_and_the_peer_goes_on() {
    let mut net: SimNet<UcQp> = SimNet::new(5);
    let n0 = net.add_node().unwrap();
    let n1 = net.add_node().unwrap();
    let attacker = net.add_node().unwrap();
    let (qa, qb, psn) = (0x31, 0x42, 700);
    let mut ca = UcConfig::new(qa, qb, net.addr(n1).unwrap());
    let mut cb = UcConfig::new(qb, qa, net.addr(n0).unwrap());
    ca.local = Some(net.addr(n0).unwrap());
    cb.local = Some(net.addr(n1).unwrap());
    ca.sq_psn = Psn::new(psn);
    cb.rq_psn = Psn::new(psn);
    let a = net.add_qp(n0, n1, UcQp::new(ca)).unwrap();
    let b = net.add_qp(n1, n0, UcQp::new(cb)).unwrap();
    let dst = net
        .memory(n1)
        .unwrap()
        .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    net.memory(n1).unwrap().fill(&dst, 0).unwrap();
    let evil = [0xee; 16];
    let pkt = write_only(op::UC_RDMA_WRITE_ONLY, qb, psn, dst.va(0), dst.rkey, &evil);
    net.inject(attacker, 0x99, n1, &pkt, Duration::ZERO)
        .unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();
    assert_eq!(
        net.memory(n1).unwrap().read(&dst, 0, 16).unwrap(),
        vec![0; 16]
    );
    assert_eq!(Engine::counters(net.qp(b).unwrap()).dropped_bad_address, 1);
    // The peer's WRITE at that PSN lands.
    let src = net.memory(n0).unwrap().register(16, Access::LOCAL_WRITE);
    net.memory(n0).unwrap().write(&src, 0, &[0x5a; 16]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, 16)]);
    wr.remote_addr = dst.va(0);
    wr.rkey = dst.rkey;
    net.qp_mut(a).unwrap().post_send(wr).unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();
    assert_eq!(
        net.memory(n1).unwrap().read(&dst, 0, 16).unwrap(),
        vec![0x5a; 16]
    );
}

#[test]
fn xrc_send_from_another_host_takes_no_srq_wqe() {
    let mut net: SimNet<RcQp> = SimNet::new(6);
    let n0 = net.add_node().unwrap();
    let n1 = net.add_node().unwrap();
    let attacker = net.add_node().unwrap();
    let (qi, qt, psn, srqn) = (0x10, 0x20, 1000, 5);
    let mut ini = RcConfig::new(qi, qt);
    ini.qp_type = QpType::XrcSend;
    ini.sq_psn = Psn::new(psn);
    ini.peer = net.addr(n1).unwrap();
    ini.local = Some(net.addr(n0).unwrap());
    let mut tgt = RcConfig::new(qt, qi);
    tgt.qp_type = QpType::XrcRecv;
    tgt.rq_psn = Psn::new(psn);
    tgt.peer = net.addr(n0).unwrap();
    tgt.local = Some(net.addr(n1).unwrap());
    let ini: QpId = net.add_qp(n0, n1, RcQp::new(ini)).unwrap();
    let tgt: QpId = net.add_qp(n1, n0, RcQp::new(tgt)).unwrap();
    let x = net.xrc_mut(n1).unwrap();
    x.target_domain = 1;
    x.add_srq(srqn, 1);
    let d = net.memory(n1).unwrap().register(64, Access::LOCAL_WRITE);
    assert!(net
        .xrc_mut(n1)
        .unwrap()
        .post(srqn, RecvWr::new(55, vec![d.sge(0, 64)])));
    let evil = [0xee; 8];
    let pkt = PacketRepr {
        xrceth: Some(xrceth::Repr { srqn }),
        ..PacketRepr::new(bth(op::XRC_SEND_ONLY, qt, psn), &evil)
    };
    net.inject(attacker, 0x99, n1, &pkt, Duration::ZERO)
        .unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();
    assert_eq!(
        net.xrc_mut(n1).unwrap().len(srqn),
        1,
        "the SRQ's WQE is still there"
    );
    assert!(net.take_completions(tgt).unwrap().is_empty());
    assert_eq!(
        Engine::counters(net.qp(tgt).unwrap()).dropped_bad_address,
        1
    );
    // The initiator's SEND at that PSN takes it.
    let src = net.memory(n0).unwrap().register(8, Access::LOCAL_WRITE);
    net.memory(n0).unwrap().write(&src, 0, &[0x5a; 8]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::Send, vec![src.sge(0, 8)]);
    wr.flags = SendFlags::SIGNALED;
    wr.remote_srqn = srqn;
    net.qp_mut(ini).unwrap().post_send(wr).unwrap();
    net.run_until_quiet(STEPS, TIME).unwrap();
    let got: Vec<_> = net
        .take_completions(tgt)
        .unwrap()
        .iter()
        .map(|(k, w)| (*k, w.wr_id, w.status))
        .collect();
    assert_eq!(got, vec![(CqKind::XrcSrq(srqn), 55, WcStatus::Success)]);
    assert_eq!(
        net.memory(n1).unwrap().read(&d, 0, 8).unwrap(),
        vec![0x5a; 8]
    );
}
