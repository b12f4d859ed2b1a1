//! UD multicast over IPv6 between two devices on the two ends of a veth pair (see
//! `uroce_net::mcast`).
//!
//! Linux refuses IPv6 multicast on a `lo` without the MULTICAST flag, so the test re-runs
//! itself in a private network namespace (`unshare --net`) and makes a veth pair there
//! (`mc6a` ↔ `mc6b`, both up, with the MULTICAST flag and the kernel's `ff00::/8` route),
//! `fd00:6d63::1/64` on one end and `fd00:6d63::2/64` on the other (unique local addresses,
//! without duplicate address detection). Device A (`::1`) sends; device B (`::2`) has two
//! members of the group, a member with another Q_Key and a QP attached then detached; A has
//! a member of its own (multicast loopback: as an HCA without
//! `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`, the sender's device gets its copy). Every member
//! gets every datagram exactly once, with its data and the group as the GRH destination;
//! after the last member of a device detaches, that device receives nothing more.
//! Both a link-local-scope group (`ff12::…`, whose socket must be bound with the
//! interface as scope) and a site-local-scope one (`ff15::…`) are checked, then an IPv4
//! group between `10.77.6.1/24` and `10.77.6.2/24` on the same two interfaces. "Exactly
//! once" matters: with both interfaces joined, a group socket not bound to its device's
//! interface also got the copy that arrived on the other interface.
//!
//! Skipped, with a note, when no namespace or veth pair can be made
//! (`UROCE_REQUIRE_TOOLS=1` makes that a failure).

mod support;

#[path = "support/ud.rs"]
mod ud;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use ud::{node, open, poll, sge, ud_qp, Node};
use uroce_net::NetDevice;
use uroce_verbs::mcast::MULTICAST_QPN;
use uroce_verbs::{AhAttr, Gid, Qp, RecvWr, SendWr, UdDest, WcStatus, WorkCompletion};

const TEST: &str = "mcast_ipv6";
/// Environment variable that lets the child test run (inside the private namespace).
const NETNS_CHILD: &str = "UROCE_MCAST6_NETNS_CHILD";
/// Name of the child test.
const CHILD_TEST: &str = "ipv6_multicast_in_a_private_namespace";
/// What the child prints (then the reason) when the namespace cannot be set up.
const UNAVAILABLE: &str = "IPV6 MULTICAST NAMESPACE UNAVAILABLE:";

const QKEY: u32 = 0x1234_5678 & 0x7fff_ffff;
const LEN: usize = 64;
/// Datagrams sent to the group per round.
const ROUNDS: usize = 4;
/// Receive buffers of one QP: one per datagram, 1 KiB each.
const SLOT: usize = 1024;

/// Runs [`ipv6_multicast_in_a_private_namespace`] in a new network namespace.
#[test]
fn a_datagram_to_an_ipv6_group_reaches_every_attached_qp_over_a_veth_pair() {
    let Some(out) = support::run_in_new_netns(TEST, CHILD_TEST, NETNS_CHILD) else {
        return;
    };
    if let Some(at) = out.stdout.find(UNAVAILABLE) {
        let why = out.stdout[at..].lines().next().unwrap_or(UNAVAILABLE);
        support::skip(TEST, why);
        return;
    }
    assert!(
        out.status.success() && out.stdout.contains("1 passed"),
        "child test failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

/// Runs `ip args…` in the namespace; `Err` says why it failed.
fn ip(args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    let out = support::run(cmd, Duration::from_secs(20))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`ip {}`: {}", args.join(" "), out.stderr.trim()))
    }
}

/// The IPv4 addresses of the two ends (private addresses, in the private namespace only).
const V4_A: Ipv4Addr = Ipv4Addr::new(10, 77, 6, 1);
const V4_B: Ipv4Addr = Ipv4Addr::new(10, 77, 6, 2);

/// `fd00:6d63::n`.
fn addr(n: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x6d63, 0, 0, 0, 0, 0, n)
}

/// The veth pair `mc6a` (`fd00:6d63::1`) ↔ `mc6b` (`fd00:6d63::2`), both up.
fn set_up_namespace() -> Result<(), String> {
    ip(&["link", "set", "lo", "up"])?;
    ip(&[
        "link", "add", "mc6a", "type", "veth", "peer", "name", "mc6b",
    ])?;
    for (dev, n) in [("mc6a", 1), ("mc6b", 2)] {
        ip(&["link", "set", dev, "multicast", "on"])?;
        ip(&["link", "set", dev, "up"])?;
        let a = format!("{}/64", addr(n));
        ip(&["-6", "addr", "add", &a, "dev", dev, "nodad"])?;
        let v4 = if n == 1 { V4_A } else { V4_B };
        ip(&["addr", "add", &format!("{v4}/24"), "dev", dev])?;
        // IPv4 drops a datagram from a local source address that arrives on an interface
        // unless `accept_local` (both ends' addresses are local in this namespace).
        for (conf, knob, value) in [
            (dev, "accept_local", "1"),
            (dev, "rp_filter", "0"),
            ("all", "rp_filter", "0"),
        ] {
            let path = format!("/proc/sys/net/ipv4/conf/{conf}/{knob}");
            std::fs::write(&path, value).map_err(|e| format!("{path}: {e}"))?;
        }
    }
    Ok(())
}

/// Sends one datagram of `LEN` bytes of `fill` to the group and waits for its send
/// completion; returns the other completions of `n.cq` seen meanwhile (receives).
fn send_to_group(n: &Node, qp: &Qp, group: IpAddr, fill: u8, wr_id: u64) -> Vec<WorkCompletion> {
    n.mr.block().copy_in(0, &[fill; LEN]).expect("fill");
    let ah = n.pd.create_ah(&AhAttr::to_ip(group)).expect("ah");
    let mut wr = SendWr::send(wr_id, vec![sge(n, 0, LEN)]);
    wr.ud = Some(UdDest {
        ah: ah.reference(),
        remote_qpn: MULTICAST_QPN,
        remote_qkey: QKEY,
    });
    qp.post_send(wr).expect("post");
    let start = Instant::now();
    let mut others = Vec::new();
    let mut sent = false;
    while !sent && start.elapsed() < Duration::from_secs(5) {
        for w in poll(&n.cq, 1, Duration::from_millis(100)) {
            if w.qp_num == qp.qp_num() {
                assert_eq!((w.wr_id, w.status), (wr_id, WcStatus::Success));
                sent = true;
            } else {
                others.push(w);
            }
        }
    }
    assert!(sent, "no send completion");
    others
}

/// Posts `ROUNDS` receives on `qp`; receive `i` of member `slot` lands at
/// `SLOT * (slot * ROUNDS + i + 1)` and has wr_id `slot * ROUNDS + i`.
fn post_receives(n: &Node, qp: &Qp, slot: usize) {
    for i in 0..ROUNDS {
        let k = slot * ROUNDS + i;
        qp.post_recv(RecvWr::new(k as u64, vec![sge(n, SLOT * (k + 1), SLOT)]))
            .expect("recv");
    }
}

/// Checks one receive completion on `n`: status, source QP, length, data (`fill` of the
/// datagram its position says) and the group as the GRH area's destination.
fn check_recv(n: &Node, w: &WorkCompletion, src_qp: u32, group: IpAddr, fills: &[u8]) {
    assert_eq!(w.status, WcStatus::Success, "{w:?}");
    assert_eq!(w.src_qp, src_qp);
    assert_eq!(w.byte_len as usize, 40 + LEN);
    let k = w.wr_id as usize;
    let off = SLOT * (k + 1);
    let mut data = [0u8; LEN];
    n.mr.block().copy_out(off + 40, &mut data).expect("read");
    assert_eq!(data, [fills[k % ROUNDS]; LEN], "data of receive {k}");
    let mut grh = [0u8; 40];
    n.mr.block().copy_out(off, &mut grh).expect("read");
    match group {
        // The GRH is the IPv6 header: its destination, bytes 24..40, is the group.
        IpAddr::V6(g) => {
            assert_eq!(grh[0] >> 4, 6, "GRH IP version");
            assert_eq!(grh[24..40], g.octets(), "GRH destination");
        }
        // The IPv4 header in the GRH area's last 20 bytes: destination at 20 + 16.
        IpAddr::V4(g) => assert_eq!(grh[36..40], g.octets(), "IPv4 destination"),
    }
}

/// One group: every datagram reaches every member once, then detaching stops delivery.
fn one_group(group: IpAddr, a: IpAddr, b: IpAddr) {
    let g = group;
    let mgid = Gid::from_ip(g);
    if let IpAddr::V6(v6) = group {
        assert_eq!(mgid.0, v6.octets(), "an IPv6 MGID is the group address");
    }
    let a = open(a);
    let b = open(b);
    let (na, nb) = (node(&a), node(&b));
    let sender = ud_qp(&na, QKEY);
    // A: a member of its own (multicast loopback).
    let own = ud_qp(&na, QKEY);
    // B: two members, one member with another Q_Key, one QP attached then detached.
    let r1 = ud_qp(&nb, QKEY);
    let r2 = ud_qp(&nb, QKEY);
    let wrong = ud_qp(&nb, QKEY ^ 1);
    let gone = ud_qp(&nb, QKEY);
    for (i, q) in [&r1, &r2, &wrong, &gone].into_iter().enumerate() {
        post_receives(&nb, q, i);
        q.attach_mcast(mgid, 0).expect("attach");
    }
    post_receives(&na, &own, 1);
    own.attach_mcast(mgid, 0).expect("attach (sender's device)");
    gone.detach_mcast(mgid, 0).expect("detach");
    assert_eq!(
        b.context().mcast_members(g),
        vec![r1.qp_num(), r2.qp_num(), wrong.qp_num()]
    );
    assert_eq!(a.context().mcast_members(g), vec![own.qp_num()]);

    let fills: Vec<u8> = (0..ROUNDS as u8).map(|i| 0xa0 + i).collect();
    for (i, &f) in fills.iter().enumerate() {
        // A's own copy arrives on A's CQ, before or after the send completion.
        let mut mine = send_to_group(&na, &sender, g, f, 100 + i as u64);
        if mine.is_empty() {
            mine = poll(&na.cq, 1, Duration::from_secs(5));
        }
        assert_eq!(
            mine.len(),
            1,
            "{group}: the sender's device's member, datagram {i}; A: {:?}; B: {:?}",
            a.counters(),
            b.counters()
        );
        assert_eq!(mine[0].qp_num, own.qp_num());
        assert_eq!(mine[0].wr_id as usize, ROUNDS + i, "in order");
        check_recv(&na, &mine[0], sender.qp_num(), group, &fills);
    }
    let got_b = poll(&nb.cq, 2 * ROUNDS, Duration::from_secs(5));
    // Anything more (a duplicate copy) would arrive at once: give it a moment.
    std::thread::sleep(Duration::from_millis(100));
    let extra_b = nb.cq.poll(16);
    let extra_a = na.cq.poll(16);
    assert!(
        extra_b.is_empty(),
        "unexpected completions on B {extra_b:?}"
    );
    assert!(
        extra_a.is_empty(),
        "unexpected completions on A {extra_a:?}"
    );
    assert_eq!(got_b.len(), 2 * ROUNDS, "B's two members, every datagram");
    for q in [&r1, &r2] {
        let mut ids: Vec<u64> = got_b
            .iter()
            .filter(|w| w.qp_num == q.qp_num())
            .map(|w| w.wr_id)
            .collect();
        ids.sort_unstable();
        let slot = if q.qp_num() == r1.qp_num() { 0 } else { 1 };
        let want: Vec<u64> = (0..ROUNDS).map(|i| (slot * ROUNDS + i) as u64).collect();
        assert_eq!(ids, want, "member {slot}: each datagram once");
    }
    for w in &got_b {
        check_recv(&nb, w, sender.qp_num(), group, &fills);
    }
    let counters = |d: &NetDevice, q: &Qp| d.qp_counters(q.qp_num()).expect("counters").transport;
    assert_eq!(
        counters(&b, &wrong).dropped_bad_qkey,
        ROUNDS as u64,
        "the member with another Q_Key dropped each"
    );
    assert_eq!(
        counters(&b, &gone).packets_received,
        0,
        "the detached QP got nothing"
    );
    assert_eq!(counters(&b, &r1).packets_received, ROUNDS as u64);
    assert_eq!(counters(&a, &own).packets_received, ROUNDS as u64);

    // B's members all detach: B leaves the group and receives nothing more; A still does.
    for q in [&r1, &r2, &wrong] {
        q.detach_mcast(mgid, 0).expect("detach");
    }
    assert_eq!(b.context().mcast_groups(), Vec::<IpAddr>::new());
    post_receives(&nb, &r1, 0);
    post_receives(&na, &own, 1);
    let mut again_a = send_to_group(&na, &sender, g, 0xcd, 200);
    if again_a.is_empty() {
        again_a = poll(&na.cq, 1, Duration::from_secs(5));
    }
    assert_eq!(again_a.len(), 1, "A's member still gets it");
    std::thread::sleep(Duration::from_millis(100));
    assert!(nb.cq.poll(16).is_empty(), "B left the group");
    assert_eq!(counters(&b, &r1).packets_received, ROUNDS as u64);
    assert_eq!(
        b.counters().mcast_dropped,
        0,
        "no group datagram reached B unclaimed"
    );
}

/// The child: sets up the veth pair, then checks a link-local-scope and a
/// site-local-scope group.
#[test]
#[ignore = "runs only inside the private namespace made by the test above"]
fn ipv6_multicast_in_a_private_namespace() {
    if std::env::var(NETNS_CHILD).as_deref() != Ok("1") {
        return;
    }
    if let Err(e) = set_up_namespace() {
        println!("{UNAVAILABLE} {e}");
        return;
    }
    let (a, b) = (IpAddr::V6(addr(1)), IpAddr::V6(addr(2)));
    one_group(Ipv6Addr::new(0xff12, 0, 0, 0, 0, 0, 0x6d63, 1).into(), a, b);
    one_group(Ipv6Addr::new(0xff15, 0, 0, 0, 0, 0, 0x6d63, 2).into(), a, b);
    // The same over IPv4 on the same two interfaces (a device's group socket takes only
    // what arrived on its own interface there too).
    let (a4, b4) = (IpAddr::V4(V4_A), IpAddr::V4(V4_B));
    one_group(Ipv4Addr::new(239, 77, 6, 3).into(), a4, b4);
}
