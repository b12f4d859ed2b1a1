//! An incoming IBA 1.5 FLUSH (opcode 0x1C: BTH, FETH, RETH) to a connected RC QP of a
//! network device, over real loopback sockets. A plain UDP socket on a loopback address
//! of its own plays the peer (as a Linux rxe with FLUSH support would send it); uroce
//! does not execute FLUSH, so the datagram must be answered with NAK Invalid Request
//! (not dropped by the I/O layer, as it was while the FETH did not parse), and the QP
//! goes to ERR.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use uroce_net::{seal_for, NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, MemBlock, QpCap, QpInitAttr, QpState, QpType, RcConnect, RecvWr, Sge, WcStatus,
};
use uroce_wire::aeth::{NakCode, Syndrome};
use uroce_wire::opcode::op;
use uroce_wire::{bth, feth, reth, PacketRepr, Psn, ROCEV2_UDP_PORT};

/// The peer's QP number (nothing checks it but the DestQP of the answer).
const PEER_QPN: u32 = 0x99;

#[test]
fn an_incoming_flush_is_answered_with_nak_invalid_request() {
    let peer_ip: IpAddr = "127.0.48.1".parse().expect("addr");
    let peer = match UdpSocket::bind(SocketAddr::new(peer_ip, ROCEV2_UDP_PORT)) {
        Ok(s) => s,
        Err(e) => panic!("cannot bind {peer_ip}:{ROCEV2_UDP_PORT} for the peer: {e}"),
    };
    peer.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");

    let mut cfg = NetConfig::new("127.0.48.2".parse().expect("addr"));
    cfg.faults = None;
    let dev = NetDevice::open(cfg).expect("open device");
    let ctx = dev.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16, None, 0).expect("cq");
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
        .expect("qp");
    let mr = pd
        .reg_mr(
            MemBlock::new(4096).expect("block"),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("mr");
    let c = RcConnect {
        timeout: 10,
        ..RcConnect::new(peer_ip, PEER_QPN)
    };
    qp.connect_rc(&c).expect("RESET to RTS");
    qp.post_recv(RecvWr::new(
        7,
        vec![Sge {
            addr: mr.iova(),
            length: 64,
            lkey: mr.lkey(),
        }],
    ))
    .expect("post_recv");

    // The FLUSH, at the PSN the QP expects (rq_psn 0), sealed for this datagram.
    let flush = PacketRepr {
        feth: Some(feth::Repr {
            selectivity_level: feth::SELECTIVITY_RANGE,
            placement_type: feth::PLACEMENT_GLOBAL_VISIBILITY,
        }),
        reth: Some(reth::Repr {
            va: mr.iova(),
            rkey: mr.rkey(),
            dma_len: 64,
        }),
        ..PacketRepr::new(
            bth::Repr {
                opcode: op::RC_FLUSH,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: qp.qp_num(),
                ack_req: true,
                psn: Psn::ZERO,
            },
            &[],
        )
    };
    let mut bytes = vec![0u8; flush.buffer_len()];
    flush.emit(&mut bytes).expect("emit FLUSH");
    let to = dev.local_addr();
    seal_for(peer.local_addr().expect("addr"), to, &mut bytes).expect("seal");
    peer.send_to(&bytes, to).expect("send");

    // The answer (bounded wait): an ACKNOWLEDGE to the peer's QP with NAK Invalid Request
    // and the FLUSH's PSN.
    let start = Instant::now();
    let mut buf = [0u8; 2048];
    let answer = loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no answer to the FLUSH"
        );
        let Ok((n, from)) = peer.recv_from(&mut buf) else {
            continue;
        };
        assert_eq!(from.ip(), to.ip());
        let pkt = PacketRepr::parse(&buf[..n]).expect("the answer parses");
        break (
            pkt.bth.opcode,
            pkt.bth.dest_qp,
            pkt.bth.psn,
            pkt.aeth.map(|a| a.syndrome),
        );
    };
    assert_eq!(
        answer,
        (
            op::RC_ACKNOWLEDGE,
            PEER_QPN,
            Psn::ZERO,
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )
    );

    // The QP is in ERR: its posted receive comes back flushed.
    let start = Instant::now();
    let wc = loop {
        if let Some(wc) = cq.poll(1).pop() {
            break wc;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no flush completion"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushErr));
    assert_eq!(qp.state(), QpState::Err);
    let counters = dev.qp_counters(qp.qp_num()).expect("qp counters");
    assert_eq!(counters.transport.error_naks_sent, 1);
    assert_eq!(counters.transport.dropped_packets, 0);
}
