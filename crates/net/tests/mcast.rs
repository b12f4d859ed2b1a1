//! UD multicast between devices on loopback (see `uroce_net::mcast`): a datagram to a
//! multicast GID reaches every QP attached to the group on every device that joined it
//! (two receivers here), with each QP's own Q_Key check, and not a detached QP; after the
//! last QP detaches, the device no longer receives the group.

#[path = "support/ud.rs"]
mod ud;

use std::net::IpAddr;
use std::time::Duration;

use ud::{node, open, poll, sge, ud_qp, Node};
use uroce_verbs::mcast::MULTICAST_QPN;
use uroce_verbs::{AhAttr, Gid, Qp, RecvWr, SendWr, UdDest, WcStatus};

const QKEY: u32 = 0x1234_5678 & 0x7fff_ffff;
const LEN: usize = 64;

fn send_to_group(n: &Node, qp: &Qp, group: IpAddr, fill: u8, wr_id: u64) {
    n.mr.block().copy_in(0, &[fill; LEN]).expect("fill");
    let ah = n.pd.create_ah(&AhAttr::to_ip(group)).expect("ah");
    let mut wr = SendWr::send(wr_id, vec![sge(n, 0, LEN)]);
    wr.ud = Some(UdDest {
        ah: ah.reference(),
        remote_qpn: MULTICAST_QPN,
        remote_qkey: QKEY,
    });
    qp.post_send(wr).expect("post");
    let wc = poll(&n.cq, 1, Duration::from_secs(5));
    assert_eq!(wc.len(), 1, "send completion");
    assert_eq!((wc[0].wr_id, wc[0].status), (wr_id, WcStatus::Success));
}

#[test]
fn a_datagram_to_the_group_reaches_every_attached_qp_of_two_devices() {
    let group: IpAddr = "239.77.3.1".parse().expect("group");
    let mgid = Gid::from_ip(group);
    let a = open("127.0.39.1".parse().expect("addr"));
    let b = open("127.0.39.2".parse().expect("addr"));
    let c = open("127.0.39.3".parse().expect("addr"));
    let (na, nb, nc) = (node(&a), node(&b), node(&c));
    let sender = ud_qp(&na, QKEY);
    // B: two members, one member with another Q_Key, one QP attached then detached.
    let r1 = ud_qp(&nb, QKEY);
    let r2 = ud_qp(&nb, QKEY);
    let wrong = ud_qp(&nb, QKEY ^ 1);
    let gone = ud_qp(&nb, QKEY);
    // C: one member (the second receiving device).
    let r3 = ud_qp(&nc, QKEY);
    for (i, q) in [&r1, &r2, &wrong, &gone].into_iter().enumerate() {
        q.post_recv(RecvWr::new(i as u64, vec![sge(&nb, 1024 * (i + 1), 1024)]))
            .expect("recv");
        q.attach_mcast(mgid, 0).expect("attach");
    }
    r3.post_recv(RecvWr::new(0, vec![sge(&nc, 1024, 1024)]))
        .expect("recv");
    r3.attach_mcast(mgid, 0).expect("attach");
    gone.detach_mcast(mgid, 0).expect("detach");
    assert_eq!(
        b.context().mcast_members(group),
        vec![r1.qp_num(), r2.qp_num(), wrong.qp_num()]
    );

    send_to_group(&na, &sender, group, 0xab, 77);

    let got_b = poll(&nb.cq, 2, Duration::from_secs(5));
    let got_c = poll(&nc.cq, 1, Duration::from_secs(5));
    // Anything more would arrive at once: give a stray copy a moment.
    std::thread::sleep(Duration::from_millis(50));
    let extra_b = nb.cq.poll(16);
    let mut qpns: Vec<u32> = got_b.iter().map(|w| w.qp_num).collect();
    qpns.sort_unstable();
    let mut want = vec![r1.qp_num(), r2.qp_num()];
    want.sort_unstable();
    assert_eq!(qpns, want, "B's two members, and only they");
    assert!(extra_b.is_empty(), "unexpected completions {extra_b:?}");
    assert_eq!(got_c.len(), 1, "C's member");
    for (w, n) in got_b
        .iter()
        .map(|w| (w, &nb))
        .chain(got_c.iter().map(|w| (w, &nc)))
    {
        assert_eq!(w.status, WcStatus::Success);
        assert_eq!(w.src_qp, sender.qp_num());
        assert_eq!(w.byte_len as usize, 40 + LEN);
        let off = 1024 * (w.wr_id as usize + 1);
        let mut data = [0u8; LEN];
        n.mr.block().copy_out(off + 40, &mut data).expect("read");
        assert_eq!(data, [0xab; LEN]);
        // The GRH area's destination (IPv4 header bytes 16..20, at offset 20) is the group.
        let mut dst = [0u8; 4];
        n.mr.block().copy_out(off + 36, &mut dst).expect("read");
        assert_eq!(dst, [239, 77, 3, 1]);
    }
    let bad = b
        .qp_counters(wrong.qp_num())
        .expect("counters")
        .transport
        .dropped_bad_qkey;
    assert_eq!(bad, 1, "the member with another Q_Key dropped it");
    let seen = |q: &Qp| {
        b.qp_counters(q.qp_num())
            .expect("counters")
            .transport
            .packets_received
    };
    assert_eq!(seen(&gone), 0, "the detached QP got nothing");
    assert_eq!(seen(&r1), 1, "a member got it once");

    // After every member of C detaches, C has left the group: nothing arrives there.
    r3.detach_mcast(mgid, 0).expect("detach");
    r3.post_recv(RecvWr::new(0, vec![sge(&nc, 1024, 1024)]))
        .expect("recv");
    r1.post_recv(RecvWr::new(0, vec![sge(&nb, 1024, 1024)]))
        .expect("recv");
    send_to_group(&na, &sender, group, 0xcd, 78);
    let again_b = poll(&nb.cq, 1, Duration::from_secs(5));
    assert!(!again_b.is_empty(), "B is still a member");
    std::thread::sleep(Duration::from_millis(50));
    assert!(nc.cq.poll(16).is_empty(), "C left the group");
    assert_eq!(c.context().mcast_groups(), Vec::<IpAddr>::new());
}
