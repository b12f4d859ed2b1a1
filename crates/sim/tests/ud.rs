//! The UD engine (`uroce_proto::ud::UdQp`) on the simulated network: datagram QPs on
//! several nodes, each packet routed by its own destination address.
//!
//! Expectations come from the IBA UD rules (ch. 9.8.3, Q_Keys 10.2.5) and from what a
//! Linux UDP socket puts in the IP header (ID 0, DF, TTL 64, TOS 0), which the GRH area of
//! a receive must reproduce; they are written out here, never read back from the engine.

use std::net::IpAddr;
use std::time::Duration;

use uroce_proto::engine::Engine;
use uroce_proto::rc::{CqKind, PostError, RtsAttrs};
use uroce_proto::ud::{UdConfig, UdQp, GRH_LEN};
use uroce_proto::wr::{
    RecvWr, SendFlags, SendOpcode, SendWr, UdDest, WcFlags, WcStatus, WorkCompletion, WrError,
};
use uroce_sim::{Access, LinkConfig, QpId, RegionHandle, SimNet};
use uroce_wire::{Pmtu, Psn};

const STEPS: u64 = 1_000_000;
const TIME: Duration = Duration::from_secs(60);

fn rts(qp: &mut UdQp, psn: u32) {
    qp.enter_rts(RtsAttrs {
        sq_psn: Psn::new(psn),
        timeout: 0,
        retry_cnt: 0,
        rnr_retry: 0,
        max_rd_atomic: 0,
    });
}

/// Adds a UD QP in RTS on `node`.
fn add_ud(net: &mut SimNet<UdQp>, node: usize, qpn: u32, qkey: u32) -> QpId {
    let mut cfg = UdConfig::new(qpn, qkey, net.addr(node).unwrap());
    cfg.pmtu = Pmtu::Mtu1024;
    let mut qp = UdQp::new_rtr(cfg);
    rts(&mut qp, 100 * qpn);
    net.add_datagram_qp(node, qp).unwrap()
}

/// A registered region on `qp`'s node holding `data` at offset 0.
fn source(net: &SimNet<UdQp>, qp: QpId, data: &[u8]) -> RegionHandle {
    let m = net.memory(qp.node).unwrap();
    let h = m.register(data.len().max(1), Access::LOCAL_WRITE);
    m.write(&h, 0, data).unwrap();
    h
}

fn send(net: &mut SimNet<UdQp>, from: QpId, wr_id: u64, data: &[u8], dest: UdDest) {
    let h = source(net, from, data);
    let mut wr = SendWr::new(wr_id, SendOpcode::Send, vec![h.sge(0, data.len() as u32)]);
    wr.flags = SendFlags::SIGNALED;
    wr.ud = Some(dest);
    net.qp_mut(from).unwrap().post_send(wr).unwrap();
}

/// Posts a receive of `len` bytes on `qp`; returns its buffer.
fn recv(net: &mut SimNet<UdQp>, qp: QpId, wr_id: u64, len: usize) -> RegionHandle {
    let h = net
        .memory(qp.node)
        .unwrap()
        .register(len, Access::LOCAL_WRITE);
    net.qp_mut(qp)
        .unwrap()
        .post_recv(RecvWr::new(wr_id, vec![h.sge(0, len as u32)]))
        .unwrap();
    h
}

fn recv_wcs(net: &mut SimNet<UdQp>, qp: QpId) -> Vec<WorkCompletion> {
    net.take_completions(qp)
        .unwrap()
        .into_iter()
        .filter(|(k, _)| *k == CqKind::Recv)
        .map(|(_, wc)| wc)
        .collect()
}

fn dest(net: &SimNet<UdQp>, to: QpId, qkey: u32) -> UdDest {
    UdDest::new(net.addr(to.node).unwrap(), to.qpn, qkey)
}

/// RFC 791 one's-complement header checksum, written here independently.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[test]
fn qkey_mismatch_is_dropped_and_counted_never_completed() {
    let mut net = SimNet::new(1);
    let (n0, n1) = (net.add_node().unwrap(), net.add_node().unwrap());
    let a = add_ud(&mut net, n0, 0x11, 0);
    let b = add_ud(&mut net, n1, 0x22, 0x1234);
    recv(&mut net, b, 1, 256);
    let d = dest(&net, b, 0x4321);
    send(&mut net, a, 1, b"wrong key", d);
    net.run_until_quiet(STEPS, TIME).unwrap();
    assert!(recv_wcs(&mut net, b).is_empty());
    let k = net.qp(b).unwrap().counters();
    assert_eq!((k.dropped_bad_qkey, k.dropped_packets), (1, 1));
    assert_eq!(
        net.stats().delivered,
        1,
        "the sim delivered it; the QP refused it"
    );
    // The sender's completion is unaffected: UD does not know.
    let wcs = net.take_completions(a).unwrap();
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].1.status, WcStatus::Success);
}

#[test]
fn datagram_to_a_missing_qpn_is_dropped_by_the_device() {
    let mut net = SimNet::new(2);
    let (n0, n1) = (net.add_node().unwrap(), net.add_node().unwrap());
    let a = add_ud(&mut net, n0, 0x11, 0);
    let b = add_ud(&mut net, n1, 0x22, 5);
    recv(&mut net, b, 1, 256);
    let mut d = dest(&net, b, 5);
    d.remote_qpn = 0x23;
    send(&mut net, a, 1, b"nobody", d);
    net.run_until_quiet(STEPS, TIME).unwrap();
    let s = net.stats();
    assert_eq!((s.transmitted, s.unroutable, s.delivered), (1, 1, 0));
    assert!(recv_wcs(&mut net, b).is_empty());
    assert_eq!(net.qp(b).unwrap().counters().packets_received, 0);
}

#[test]
fn grh_area_ipv4_reproduces_the_ip_header_on_the_wire() {
    let mut net = SimNet::new(3);
    let (n0, n1) = (net.add_node().unwrap(), net.add_node().unwrap());
    let a = add_ud(&mut net, n0, 0x11, 0);
    let b = add_ud(&mut net, n1, 0x22, 9);
    let buf = recv(&mut net, b, 1, 512);
    let data: Vec<u8> = (0..77u8).collect();
    let d = dest(&net, b, 9);
    send(&mut net, a, 1, &data, d);
    net.run_until_quiet(STEPS, TIME).unwrap();
    let wcs = recv_wcs(&mut net, b);
    assert_eq!(wcs.len(), 1);
    let wc = wcs[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.byte_len as usize, GRH_LEN + 77);
    assert_eq!(wc.src_qp, 0x11);
    assert_eq!(wc.wc_flags, WcFlags::GRH);
    let got = net.memory(n1).unwrap().read(&buf, 0, GRH_LEN + 77).unwrap();
    // 77 bytes + 3 pad + BTH 12 + DETH 8 + ICRC 4 = 104; + UDP 8 + IPv4 20 = 132.
    let mut ip = vec![
        0x45, 0x00, 0x00, 132, 0x00, 0x00, 0x40, 0x00, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 2,
    ];
    let c = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    assert_eq!(&got[..20], &[0u8; 20]);
    assert_eq!(&got[20..40], &ip[..]);
    assert_eq!(&got[40..], &data[..]);
}

#[test]
fn grh_area_ipv6_is_the_ipv6_header() {
    let mut net = SimNet::new(4);
    let (n0, n1) = (net.add_node_v6().unwrap(), net.add_node_v6().unwrap());
    let a = add_ud(&mut net, n0, 0x11, 0);
    let b = add_ud(&mut net, n1, 0x22, 9);
    let buf = recv(&mut net, b, 1, 512);
    let data = vec![0xee; 200];
    let d = dest(&net, b, 9);
    send(&mut net, a, 1, &data, d);
    net.run_until_quiet(STEPS, TIME).unwrap();
    let wcs = recv_wcs(&mut net, b);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].byte_len, 240);
    let got = net.memory(n1).unwrap().read(&buf, 0, 240).unwrap();
    let (IpAddr::V6(s), IpAddr::V6(d)) = (net.addr(n0).unwrap(), net.addr(n1).unwrap()) else {
        panic!("IPv6 nodes");
    };
    // Version 6, traffic class 0, flow label 0; payload length = UDP length
    // 8 + 12 + 8 + 200 + 4 = 232; next header 17; hop limit 64.
    let mut hdr = vec![0x60, 0, 0, 0, 0, 232, 17, 64];
    hdr.extend(s.octets());
    hdr.extend(d.octets());
    assert_eq!(&got[..40], &hdr[..]);
    assert_eq!(&got[40..], &data[..]);
}

#[test]
fn oversize_send_is_refused_and_nothing_leaves() {
    let mut net = SimNet::new(5);
    let (n0, n1) = (net.add_node().unwrap(), net.add_node().unwrap());
    let a = add_ud(&mut net, n0, 0x11, 0);
    let b = add_ud(&mut net, n1, 0x22, 0);
    recv(&mut net, b, 1, 4096);
    let data = vec![1u8; 1025];
    let h = source(&net, a, &data);
    let mut wr = SendWr::new(1, SendOpcode::Send, vec![h.sge(0, 1025)]);
    wr.ud = Some(dest(&net, b, 0));
    assert_eq!(
        net.qp_mut(a).unwrap().post_send(wr),
        Err(PostError::InvalidWr(WrError::LargerThanMtu {
            len: 1025,
            mtu: 1024
        }))
    );
    net.run_until_quiet(STEPS, TIME).unwrap();
    assert_eq!(net.stats().transmitted, 0);
    assert!(net.take_completions(a).unwrap().is_empty());
    assert!(recv_wcs(&mut net, b).is_empty());
}

#[test]
fn one_qp_talks_to_three_nodes_and_they_answer() {
    let mut net = SimNet::new(6);
    let hub_node = net.add_node().unwrap();
    let hub = add_ud(&mut net, hub_node, 0x10, 0x77);
    let leaves: Vec<QpId> = (0..3)
        .map(|i| {
            let n = net.add_node().unwrap();
            add_ud(&mut net, n, 0x20 + i, 0x77)
        })
        .collect();
    let bufs: Vec<RegionHandle> = leaves.iter().map(|l| recv(&mut net, *l, 1, 256)).collect();
    let hub_bufs: Vec<RegionHandle> = (0..3).map(|i| recv(&mut net, hub, i, 256)).collect();
    for (i, l) in leaves.iter().enumerate() {
        let d = dest(&net, *l, 0x77);
        send(&mut net, hub, i as u64, &[i as u8 + 1; 10], d);
    }
    net.run_until_quiet(STEPS, TIME).unwrap();
    for (i, l) in leaves.iter().enumerate() {
        let w = recv_wcs(&mut net, *l);
        assert_eq!(w.len(), 1);
        let got = net.memory(l.node).unwrap().read(&bufs[i], 40, 10).unwrap();
        assert_eq!(got, vec![i as u8 + 1; 10]);
        // Answer the hub at the address and QPN the GRH area and completion name.
        let grh = net.memory(l.node).unwrap().read(&bufs[i], 20, 20).unwrap();
        let src = IpAddr::from([grh[12], grh[13], grh[14], grh[15]]);
        let d = UdDest::new(src, w[0].src_qp, 0x77);
        send(&mut net, *l, 9, &[0xa0 + i as u8; 4], d);
    }
    net.run_until_quiet(STEPS, TIME).unwrap();
    let w = recv_wcs(&mut net, hub);
    assert_eq!(w.len(), 3);
    let mut answers: Vec<(u32, u8)> = w
        .iter()
        .map(|wc| {
            let b = &hub_bufs[wc.wr_id as usize];
            let byte = net.memory(hub_node).unwrap().read(b, 40, 1).unwrap()[0];
            (wc.src_qp, byte)
        })
        .collect();
    answers.sort_unstable();
    assert_eq!(answers, [(0x20, 0xa0), (0x21, 0xa1), (0x22, 0xa2)]);
}

/// The payload of datagram `seq` from sender `s`: its identity, then bytes derived from it.
fn datagram(s: u8, seq: u32, len: usize) -> Vec<u8> {
    let mut d = vec![s];
    d.extend(seq.to_be_bytes());
    d.extend((0..len.saturating_sub(5)).map(|i| ((i as u32).wrapping_mul(7) ^ seq) as u8 ^ s));
    d
}

#[test]
fn soak_under_loss_duplication_reordering_and_corruption() {
    for seed in [11u64, 12, 13] {
        let mut net = SimNet::new(seed);
        let rn = net.add_node().unwrap();
        let rcv = add_ud(&mut net, rn, 0x30, 0x99);
        let senders: Vec<QpId> = (0..3)
            .map(|i| {
                let n = net.add_node().unwrap();
                add_ud(&mut net, n, 0x40 + i, 0)
            })
            .collect();
        let link = LinkConfig {
            loss: 0.1,
            dup: 0.05,
            reorder: 0.2,
            corrupt: 0.02,
            delay: Duration::from_micros(5),
            jitter: Duration::from_micros(50),
        };
        for s in &senders {
            net.set_link(s.node, rn, link).unwrap();
        }
        const SLOT: usize = 1024 + GRH_LEN;
        let mut bufs = std::collections::HashMap::new();
        let mut sent = Vec::new();
        let mut next_recv = 0u64;
        let mut delivered = 0u64;
        for round in 0..40u32 {
            for _ in 0..12 {
                let h = recv(&mut net, rcv, next_recv, SLOT);
                bufs.insert(next_recv, h);
                next_recv += 1;
            }
            for (i, s) in senders.iter().enumerate() {
                for k in 0..4u32 {
                    let seq = sent.len() as u32;
                    let len = 5 + ((seq * 97 + round * 13 + k) % 1020) as usize;
                    let data = datagram(i as u8, seq, len);
                    let d = dest(&net, rcv, 0x99);
                    send(&mut net, *s, u64::from(seq), &data, d);
                    sent.push((i, data));
                }
            }
            net.run_until_quiet(STEPS, TIME).unwrap();
            for wc in recv_wcs(&mut net, rcv) {
                assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
                let len = wc.byte_len as usize - GRH_LEN;
                let h = &bufs[&wc.wr_id];
                let got = net
                    .memory(rn)
                    .unwrap()
                    .read(h, GRH_LEN as u64, len)
                    .unwrap();
                let seq = u32::from_be_bytes([got[1], got[2], got[3], got[4]]);
                let (i, data) = &sent[seq as usize];
                assert_eq!(&got, data, "seed {seed}: datagram {seq} whole and intact");
                assert_eq!(wc.src_qp, 0x40 + *i as u32);
                delivered += 1;
            }
            for s in &senders {
                for (_, wc) in net.take_completions(*s).unwrap() {
                    assert_eq!(wc.status, WcStatus::Success);
                }
            }
        }
        let st = net.stats();
        let k = net.qp(rcv).unwrap().counters();
        assert_eq!(st.transmitted, sent.len() as u64);
        assert_eq!(k.packets_received, st.delivered);
        assert_eq!(
            delivered + k.dropped_packets,
            st.delivered,
            "seed {seed}: every arrival is a whole delivery or a counted drop"
        );
        // Receive WQEs run short only when duplicates arrive; no other drop cause.
        assert_eq!(k.dropped_packets, k.dropped_no_receive);
        assert!(st.lost > 0 && st.duplicated > 0 && st.reordered > 0 && st.corrupted > 0);
        assert!(
            delivered > sent.len() as u64 * 3 / 4,
            "seed {seed}: {delivered}"
        );
    }
}
