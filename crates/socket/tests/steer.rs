//! Steering a real `SO_REUSEPORT` group on loopback by destination QP
//! (`uroce_socket::steer`): member sockets bound to one address and port, the generated
//! classic BPF program attached, datagrams from a plain sender; each must arrive at the
//! member socket of its QPN's slot, before and after a member in the middle closes (the
//! last member moves into its index) and after a new one joins.
//!
//! XRC requests go by the XRC SRQ their XRCETH names (127.0.95.1).
//!
//! Each test uses an address of its own (127.0.79.x, 127.0.95.x): a port-0 bind with `SO_REUSEPORT`
//! may be given the port of another group of the same user on the same address (the
//! kernel counts such a port as free for it), which would merge two tests' groups.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use uroce_socket::steer::{self, GroupOrder, QpnLayout, SteeringTable};

const TEST: &str = "steer";

/// A BTH (RC SEND only) to `qpn`, followed by a tag that makes each datagram unique.
fn datagram(qpn: u32, tag: u32) -> Vec<u8> {
    let mut b = vec![0u8; 20];
    b[0] = 0x04;
    b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    b[12..16].copy_from_slice(&tag.to_be_bytes());
    b
}

/// Member sockets (non-blocking) and the slot each holds.
struct Group {
    addr: SocketAddr,
    members: Vec<(u16, UdpSocket)>,
    order: GroupOrder,
    layout: QpnLayout,
}

impl Group {
    /// Binds a member for each of `slots`, in order, to `ip` (the first on an ephemeral
    /// port, the others to the same port).
    fn bind(ip: IpAddr, slots: &[u16]) -> io::Result<Group> {
        let mut g = Group {
            addr: SocketAddr::new(ip, 0),
            members: Vec::new(),
            order: GroupOrder::default(),
            layout: QpnLayout::default(),
        };
        for &slot in slots {
            g.join(slot)?;
        }
        Ok(g)
    }

    fn join(&mut self, slot: u16) -> io::Result<()> {
        let s = steer::bind_member(self.addr)?;
        s.set_nonblocking(true)?;
        self.addr = s.local_addr()?;
        self.members.push((slot, s));
        self.order.joined(slot);
        Ok(())
    }

    /// Closes the member of `slot`.
    fn close(&mut self, slot: u16) {
        let i = self.members.iter().position(|m| m.0 == slot).unwrap();
        drop(self.members.remove(i));
        assert!(self.order.left(slot));
    }

    fn table(&self) -> SteeringTable {
        SteeringTable::from_order(self.layout, &self.order).unwrap()
    }

    /// Attaches the program for the current order through the first member; a kernel
    /// without the option fails the test, loudly.
    fn attach(&self) {
        let program = self.table().program();
        if let Err(e) = steer::attach(&self.members[0].1, &program) {
            panic!(
                "{TEST}: SO_ATTACH_REUSEPORT_CBPF refused ({e}); this kernel ({}) cannot \
                 steer a reuseport group (Linux 4.5+ needed)",
                std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()
            );
        }
    }

    /// Waits (bounded) until `want` datagrams arrived in all; returns (slot, payload) of
    /// each, the slot being that of the member socket that received it.
    fn collect(&self, want: usize) -> Vec<(u16, Vec<u8>)> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        let mut buf = [0u8; 128];
        while got.len() < want && Instant::now() < deadline {
            let mut any = false;
            for (slot, s) in &self.members {
                match s.recv(&mut buf) {
                    Ok(n) => {
                        got.push((*slot, buf[..n].to_vec()));
                        any = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("recv: {e}"),
                }
            }
            if !any {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // Nothing more than expected.
        std::thread::sleep(Duration::from_millis(20));
        for (_, s) in &self.members {
            assert!(
                matches!(s.recv(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
                "an unexpected datagram"
            );
        }
        got
    }

    /// Sends, from two senders (different source ports, so different hashes), datagrams
    /// to QPNs of every slot in `slots` and of the special QPs, and probes for every index;
    /// checks each arrived at the member the model says.
    fn check(&self, senders: &[UdpSocket], slots: &[u16], round: u32) {
        let l = self.layout;
        let designated = self.order.slots().iter().copied().min().unwrap();
        let mut expect = Vec::new();
        let mut tag = round << 16;
        let mut qpns: Vec<(u32, u16)> = Vec::new();
        for &slot in slots {
            let owner = if self.order.index_of(slot).is_some() {
                slot
            } else {
                designated
            };
            for local in [0, 1, 0x1234, l.max_local()] {
                qpns.push((l.qpn(slot, local).unwrap(), owner));
            }
        }
        qpns.push((1, designated));
        qpns.push((0, designated));
        qpns.push((steer::MULTICAST_QPN, designated));
        for (qpn, owner) in qpns {
            for s in senders {
                tag += 1;
                let d = datagram(qpn, tag);
                s.send_to(&d, self.addr).unwrap();
                expect.push((owner, d));
            }
        }
        for (i, &slot) in self.order.slots().iter().enumerate() {
            let p = steer::probe(i as u32, u64::from(round));
            senders[0].send_to(&p, self.addr).unwrap();
            expect.push((slot, p.to_vec()));
        }
        let mut got = self.collect(expect.len());
        got.sort();
        expect.sort();
        assert_eq!(got.len(), expect.len(), "round {round}: datagrams lost");
        for (g, e) in got.iter().zip(&expect) {
            assert_eq!(g, e, "round {round}: (member slot, datagram)");
        }
    }
}

fn senders(ip: IpAddr) -> Vec<UdpSocket> {
    (0..2)
        .map(|_| UdpSocket::bind(SocketAddr::new(ip, 0)).unwrap())
        .collect()
}

fn steer_on(ip: IpAddr, sender_ip: IpAddr) {
    let mut g = Group::bind(ip, &[5, 9, 2]).unwrap();
    let tx = senders(sender_ip);
    g.attach();
    let all = [5, 9, 2, 11, 254];
    g.check(&tx, &all, 1);

    // The member in the middle (index 1) closes: the last (slot 2) moves into index 1.
    // With the old program slot 2's datagrams ask for index 2, out of range now: the
    // kernel falls back to hashing, so they reach some member, none is dropped.
    g.close(9);
    assert_eq!(g.order.slots(), &[5, 2]);
    let qpn2 = g.layout.qpn(2, 7).unwrap();
    for (i, s) in tx.iter().enumerate() {
        s.send_to(&datagram(qpn2, i as u32), g.addr).unwrap();
    }
    assert_eq!(g.collect(2).len(), 2, "stale program: delivered by hash");
    g.attach();
    g.check(&tx, &all, 2);

    // A new member joins at the end.
    g.join(11).unwrap();
    g.attach();
    assert_eq!(g.order.slots(), &[5, 2, 11]);
    g.check(&tx, &all, 3);

    // Any member may replace the program: the last one attaches after the first leaves.
    let first = g.members[0].0;
    let last = g.members.len() - 1;
    g.members.swap(0, last);
    g.close(first);
    assert_eq!(g.order.slots(), &[11, 2]);
    g.attach();
    g.check(&tx, &all, 4);

    // Detached: hash selection again (every datagram still delivered).
    steer::detach(&g.members[0].1).unwrap();
    for (i, s) in tx.iter().enumerate() {
        s.send_to(&datagram(qpn2, i as u32), g.addr).unwrap();
    }
    assert_eq!(g.collect(2).len(), 2);
}

#[test]
fn steers_an_ipv4_group_by_qpn() {
    steer_on(
        IpAddr::V4(Ipv4Addr::new(127, 0, 79, 11)),
        IpAddr::V4(Ipv4Addr::LOCALHOST),
    );
}

#[test]
fn steers_an_ipv6_group_by_qpn() {
    if UdpSocket::bind((Ipv6Addr::LOCALHOST, 0)).is_err() {
        eprintln!("{TEST}: IPv6 loopback unavailable, IPv6 group skipped");
        return;
    }
    steer_on(
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    );
}

/// An XRC packet (opcode `opcode`) to `qpn` whose bytes 12-15 are an XRCETH naming
/// `srqn`, then a tag.
fn xrc_datagram(opcode: u8, qpn: u32, srqn: u32, tag: u32) -> Vec<u8> {
    let mut b = datagram(qpn, 0);
    b[0] = opcode;
    b[13..16].copy_from_slice(&srqn.to_be_bytes()[1..]);
    b[16..20].copy_from_slice(&tag.to_be_bytes());
    b
}

/// Sends XRC requests (SEND, RDMA READ, FETCH_ADD, SEND with invalidate) to a target
/// QP of slot 5 naming SRQs of every slot in `slots`, and XRC responses (ACK, READ
/// response, whose bytes 12-15 are no XRCETH) to initiator QPs of every slot; checks each
/// arrived at the member of its SRQ's slot (requests) or QPN's slot (responses), the
/// designated member for a slot without one; requests naming SRQs of slot 0 go by the
/// target QP.
fn check_xrc(g: &Group, tx: &UdpSocket, slots: &[u16], round: u32) {
    let l = g.layout;
    let designated = g.order.slots().iter().copied().min().unwrap();
    let owner = |slot| {
        if g.order.index_of(slot).is_some() {
            slot
        } else {
            designated
        }
    };
    let target = l.qpn(5, 0x42).unwrap();
    let mut expect = Vec::new();
    let mut tag = round << 16;
    // SRQ numbers of slot 0 (no member's numbering): by the target QP.
    for srqn in [1, 0xFFFF] {
        tag += 1;
        expect.push((owner(5), xrc_datagram(0xA4, target, srqn, tag)));
    }
    for &slot in slots {
        let srqn = l.qpn(slot, 3).unwrap();
        for op in [0xA4, 0xAC, 0xB4, 0xB7] {
            tag += 1;
            expect.push((owner(slot), xrc_datagram(op, target, srqn, tag)));
        }
        for op in [0xB1, 0xB0] {
            tag += 1;
            let initiator = l.qpn(slot, 9).unwrap();
            let d = xrc_datagram(op, initiator, l.qpn(9, 1).unwrap(), tag);
            expect.push((owner(slot), d));
        }
    }
    for (_, d) in &expect {
        tx.send_to(d, g.addr).unwrap();
    }
    let mut got = g.collect(expect.len());
    got.sort();
    expect.sort();
    assert_eq!(got, expect, "round {round}: (member slot, datagram)");
}

/// XRC requests reach the member that owns the XRC SRQ their XRCETH names, whoever owns
/// the target QP; XRC responses the member of their destination QP; before and after a
/// member in the middle closes.
#[test]
fn steers_xrc_requests_by_srq_on_a_real_group() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 95, 1));
    let mut g = Group::bind(ip, &[5, 9, 2]).unwrap();
    let tx = UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)).unwrap();
    g.attach();
    let all = [5, 9, 2, 11];
    check_xrc(&g, &tx, &all, 1);
    g.close(9);
    g.attach();
    check_xrc(&g, &tx, &all, 2);
}

/// A socket without SO_REUSEPORT on the address keeps members out, and a member bound
/// first keeps a plain socket out: the kernel enforces that every socket of the group
/// asked for it.
#[test]
fn a_plain_socket_and_a_group_exclude_each_other() {
    let plain = UdpSocket::bind((Ipv4Addr::new(127, 0, 79, 12), 0)).unwrap();
    let e = steer::bind_member(plain.local_addr().unwrap()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    let m = steer::bind_member(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 79, 12)),
        0,
    ))
    .unwrap();
    assert!(UdpSocket::bind(m.local_addr().unwrap()).is_err());
}

/// The largest programs the generator makes are accepted by the kernel and steer their
/// last route: every slot of the default layout, and the [`steer::MAX_ROUTES`] routes of
/// the 12-bit layout, each with [`steer::MAX_LISTENERS`] listeners (4095 instructions).
#[test]
fn the_largest_programs_are_accepted() {
    let mut g = Group::bind(IpAddr::V4(Ipv4Addr::new(127, 0, 79, 13)), &[1, 2]).unwrap();
    let tx = senders(IpAddr::V4(Ipv4Addr::LOCALHOST));
    for layout in [QpnLayout::default(), QpnLayout::new(12).unwrap()] {
        g.layout = layout;
        let mut t = SteeringTable::new(layout, 0);
        let top = layout.max_slot().min(steer::MAX_ROUTES as u16);
        for slot in 1..=top {
            t.route(slot, u32::from(slot % 2));
        }
        for i in 0..steer::MAX_LISTENERS as u64 {
            t.listen(0x0106_0000 + i, 1 + (i % 2) as u16);
        }
        let p = t.program();
        assert!(p.len() <= steer::MAX_INSNS);
        steer::attach(&g.members[0].1, &p)
            .unwrap_or_else(|e| panic!("{TEST}: {} instructions refused: {e}", p.len()));
        // The last route: index top % 2, the member of slot 1 (index 0) or 2 (index 1).
        let d = datagram(layout.qpn(top, 3).unwrap(), 77);
        tx[0].send_to(&d, g.addr).unwrap();
        let got = g.collect(1);
        assert_eq!(
            got,
            vec![(1 + top % 2, d)],
            "{} slot bits",
            layout.slot_bits()
        );
    }
    // One instruction too many is refused before the kernel sees it.
    let too_long = vec![
        steer::Insn {
            code: 6,
            jt: 0,
            jf: 0,
            k: 0
        };
        steer::MAX_INSNS + 1
    ];
    assert_eq!(
        steer::attach(&g.members[0].1, &too_long)
            .unwrap_err()
            .kind(),
        io::ErrorKind::InvalidInput
    );
}

/// Two members closing unseen can leave an order the model cannot know
/// (`GroupOrder::after_unseen_closes` says `None`); probes find the kernel's.
#[test]
fn probes_find_an_order_the_model_cannot_know() {
    let mut g = Group::bind(IpAddr::V4(Ipv4Addr::new(127, 0, 79, 14)), &[1, 2, 3, 4]).unwrap();
    let tx = senders(IpAddr::V4(Ipv4Addr::LOCALHOST));
    g.attach();
    let before = g.order.clone();
    assert_eq!(before.after_unseen_closes(&[1, 2]), None);
    // Closed in this order: [1, 2, 3, 4] -> [4, 2, 3] -> [4, 3].
    g.close(1);
    g.close(2);
    // Whatever the (stale) table says, a probe goes to the index it names.
    let mut found = Vec::new();
    for i in 0..g.members.len() as u32 {
        let p = steer::probe(i, 7);
        tx[0].send_to(&p, g.addr).unwrap();
        let got = g.collect(1);
        assert_eq!(got.len(), 1);
        assert_eq!(steer::parse_probe(&got[0].1), Some((i, 7)));
        found.push(got[0].0);
    }
    assert_eq!(found, [4, 3]);
    assert_eq!(GroupOrder::from_slots(found), g.order);
}
