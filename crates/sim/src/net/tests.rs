//! Tests of the simulator itself, with the go-back-N fake of `crate::fake`.

use std::time::Duration;

use uroce_wire::opcode::op;
use uroce_wire::{bth, Psn};

use super::*;
use crate::fake::{fake_engine_commands, Fake, FakeCompletion, Quirk};
use uroce_proto::engine::{Reply, Transmit};

const SEC: Duration = Duration::from_secs(1);

/// Node 0 sends `total` messages from QP 0x10 to QP 0x20 on node 1.
fn pair(seed: u64, total: u32) -> (SimNet<Fake>, QpId, QpId) {
    let mut net = SimNet::new(seed);
    let a = net.add_node().unwrap();
    let b = net.add_node().unwrap();
    let (addr_a, addr_b) = (net.addr(a).unwrap(), net.addr(b).unwrap());
    let qa = net
        .add_qp(a, b, Fake::new(0x10, 0x20, total).to(addr_b))
        .unwrap();
    let qb = net
        .add_qp(b, a, Fake::new(0x20, 0x10, 0).to(addr_a))
        .unwrap();
    (net, qa, qb)
}

fn all_done(total: u32, qa: QpId, qb: QpId) -> impl Fn(&SimNet<Fake>) -> bool {
    move |n: &SimNet<Fake>| {
        n.completions(qa).unwrap().len() == total as usize
            && n.completions(qb).unwrap().len() == total as usize
    }
}

/// Every message exactly once, in order, on both sides.
fn assert_exactly_once(net: &SimNet<Fake>, total: u32, qa: QpId, qb: QpId) {
    let sent: Vec<_> = (0..total)
        .map(|n| FakeCompletion::Sent(n).wc(0x10))
        .collect();
    let recv: Vec<_> = (0..total)
        .map(|n| FakeCompletion::Received(n).wc(0x20))
        .collect();
    assert_eq!(
        net.completions(qa).unwrap(),
        &sent[..],
        "\n{}",
        net.trace().tail(40)
    );
    assert_eq!(
        net.completions(qb).unwrap(),
        &recv[..],
        "\n{}",
        net.trace().tail(40)
    );
    assert_eq!(net.qp(qb).unwrap().corrupt_payloads, 0);
}

#[test]
fn addresses_are_loopback_and_distinct() {
    let (net, _, _) = pair(1, 0);
    assert_eq!(net.addr(0).unwrap(), IpAddr::from([127, 0, 0, 1]));
    assert_eq!(net.addr(1).unwrap(), IpAddr::from([127, 0, 0, 2]));
    assert_eq!(net.addr(2), Err(SimError::UnknownNode(2)));
}

#[test]
fn fake_pair_sees_the_real_addresses() {
    let (mut net, qa, qb) = pair(1, 3);
    net.run_until(all_done(3, qa, qb), 1000, SEC).unwrap();
    let (a, b) = (net.addr(0).unwrap(), net.addr(1).unwrap());
    let at_b = &net.qp(qb).unwrap().arrivals;
    assert_eq!(at_b.len(), 3);
    assert!(at_b.iter().all(|x| *x == Arrival::new(a, b)), "{at_b:?}");
    let at_a = &net.qp(qa).unwrap().arrivals;
    assert!(!at_a.is_empty() && at_a.iter().all(|x| (x.src, x.dst) == (b, a)));
}

/// Sends one SEND_ONLY to each target in turn (per-packet destinations, like a UD QP)
/// and records every arrival with its DestQP.
#[derive(Debug, Default)]
struct Scatter {
    qpn: u32,
    targets: std::collections::VecDeque<(IpAddr, u32)>,
    arrivals: Vec<Arrival>,
}

impl Scatter {
    fn new(qpn: u32, targets: &[(IpAddr, u32)]) -> Scatter {
        Scatter {
            qpn,
            targets: targets.iter().copied().collect(),
            arrivals: Vec::new(),
        }
    }
}

impl Engine for Scatter {
    fake_engine_commands!();

    fn qpn(&self) -> u32 {
        self.qpn
    }
    fn handle_packet(
        &mut self,
        _now: Instant,
        from: &Arrival,
        pkt: &PacketRepr<'_>,
        _env: &mut Env<'_>,
    ) -> Reply {
        assert_eq!(pkt.bth.dest_qp, self.qpn);
        self.arrivals.push(*from);
        Reply::Now
    }
    fn handle_timeout(&mut self, _now: Instant, _env: &mut Env<'_>) {}
    fn poll_transmit(
        &mut self,
        _now: Instant,
        _env: &mut Env<'_>,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let (dst, dest_qp) = self.targets.pop_front()?;
        let mut b = empty_bth();
        b.opcode = op::RC_SEND_ONLY;
        b.dest_qp = dest_qp;
        let len = PacketRepr::new(b, b"datagram").emit(buf).ok()?;
        Some(Transmit { len, dst })
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        None
    }
    fn poll_event(&mut self) -> Option<QpEvent> {
        None
    }
    fn is_idle(&self) -> bool {
        true
    }
}

/// Three nodes made by `add`; node 0's datagram QP 0x10 sends to QP 0x20 on node 1, QP
/// 0x30 on node 2, node 1 again, and `stranger` (no node): each packet goes where its
/// own destination says and arrives with the real addresses.
fn scatter_to_three_nodes(add: fn(&mut SimNet<Scatter>) -> usize, stranger: IpAddr) {
    let mut net = SimNet::new(1);
    let (n0, n1, n2) = (add(&mut net), add(&mut net), add(&mut net));
    let (a0, a1, a2) = (
        net.addr(n0).unwrap(),
        net.addr(n1).unwrap(),
        net.addr(n2).unwrap(),
    );
    let targets = [(a1, 0x20), (a2, 0x30), (a1, 0x20), (stranger, 0x20)];
    net.add_datagram_qp(n0, Scatter::new(0x10, &targets))
        .unwrap();
    let q1 = net.add_datagram_qp(n1, Scatter::new(0x20, &[])).unwrap();
    let q2 = net.add_datagram_qp(n2, Scatter::new(0x30, &[])).unwrap();
    net.run_until_quiet(100, SEC).unwrap();
    let s = net.stats();
    assert_eq!((s.transmitted, s.delivered, s.unroutable), (4, 3, 1));
    assert_eq!(net.trace().transmitted(n0, n1).len(), 2);
    assert_eq!(net.trace().transmitted(n0, n2).len(), 1);
    assert_eq!(net.trace().transmitted(n0, NO_NODE).len(), 1);
    assert_eq!(
        net.qp(q1).unwrap().arrivals,
        vec![Arrival::new(a0, a1), Arrival::new(a0, a1)]
    );
    assert_eq!(net.qp(q2).unwrap().arrivals, vec![Arrival::new(a0, a2)]);
}

#[test]
fn every_packet_goes_to_its_own_destination_ipv4() {
    scatter_to_three_nodes(|n| n.add_node().unwrap(), IpAddr::from([127, 0, 0, 99]));
}

#[test]
fn every_packet_goes_to_its_own_destination_ipv6() {
    // An IPv4 node exists, but an IPv6 socket cannot reach it: unroutable.
    scatter_to_three_nodes(
        |n| {
            let i = n.add_node_v6().unwrap();
            if i == 2 {
                n.add_node().unwrap();
            }
            i
        },
        IpAddr::from([127, 0, 0, 4]),
    );
}

#[test]
fn ipv6_addresses_and_duplicates() {
    let mut net: SimNet<Fake> = SimNet::new(1);
    let a = net.add_node_v6().unwrap();
    assert_eq!(net.addr(a).unwrap(), "fd00::1".parse::<IpAddr>().unwrap());
    let b = net.add_node().unwrap();
    assert_eq!(net.addr(b).unwrap(), IpAddr::from([127, 0, 0, 2]));
    assert_eq!(
        net.add_node_at(IpAddr::from([127, 0, 0, 2])),
        Err(SimError::DuplicateAddr(IpAddr::from([127, 0, 0, 2])))
    );
    assert_eq!(net.node_by_addr("fd00::1".parse().unwrap()), Some(a));
}

#[test]
fn arrival_carries_the_ip_header_fields() {
    let mut net: SimNet<Fake> = SimNet::new(1);
    let a = net.add_node_v6().unwrap();
    let b = net.add_node_v6().unwrap();
    let mut d = net.seal(a, 0x10, b, &[0; 16]).unwrap();
    // Traffic class 0xAB, flow label 0x12345, hop limit 7.
    d[0] = 0x60 | 0x0A;
    d[1] = 0xB1;
    d[2] = 0x23;
    d[3] = 0x45;
    d[7] = 7;
    let x = arrival_of(&Datagram::parse_ip(&d).unwrap());
    assert_eq!(
        (x.traffic_class, x.flow_label, x.hop_limit),
        (0xAB, 0x12345, 7)
    );
    let mut net: SimNet<Fake> = SimNet::new(1);
    let a = net.add_node().unwrap();
    let b = net.add_node().unwrap();
    let mut d = net.seal(a, 0x10, b, &[0; 16]).unwrap();
    d[1] = 0x48;
    d[4] = 0x12;
    d[5] = 0x34;
    d[8] = 9;
    let x = arrival_of(&Datagram::parse_ip(&d).unwrap());
    assert_eq!(
        (x.traffic_class, x.ipv4_id, x.hop_limit, x.flow_label),
        (0x48, 0x1234, 9, 0)
    );
}

#[test]
fn perfect_link_delivers_in_order_without_timeouts() {
    let (mut net, qa, qb) = pair(1, 100);
    net.set_links(0, 1, LinkConfig::with_delay(Duration::from_micros(5)))
        .unwrap();
    let stats = net.run_until(all_done(100, qa, qb), 100_000, SEC).unwrap();
    assert_exactly_once(&net, 100, qa, qb);
    assert_eq!(stats.timeouts, 0);
    assert_eq!(stats.lost + stats.icrc + stats.parse + stats.duplicated, 0);
    // 100 requests plus one ACK per delivered request.
    assert_eq!(stats.transmitted, 200);
    assert_eq!(stats.delivered, 200);
    net.run_until_quiet(1000, SEC).unwrap();
    assert!(net.is_quiet());
    // The first request left at t = 0 and arrived 5 µs later.
    let sent = net.trace().transmitted(0, 1);
    let got = net.trace().delivered(0, 1);
    assert_eq!(sent[0].0, Instant::ZERO);
    assert_eq!(got[0].0, Instant::from_nanos(5_000));
    assert_eq!(got[0].1.opcode, op::RC_SEND_ONLY);
}

#[test]
fn lossy_link_still_delivers_exactly_once() {
    let cfg = LinkConfig {
        loss: 0.1,
        dup: 0.1,
        reorder: 0.2,
        corrupt: 0.1,
        delay: Duration::from_micros(10),
        jitter: Duration::from_micros(30),
    };
    for seed in 0..8 {
        let (mut net, qa, qb) = pair(seed, 300);
        net.set_links(0, 1, cfg).unwrap();
        net.run_until(all_done(300, qa, qb), 1_000_000, 100 * SEC)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", net.trace().tail(60)));
        net.run_until_quiet(1_000_000, 100 * SEC).unwrap();
        assert_exactly_once(&net, 300, qa, qb);
        let s = net.stats();
        assert!(
            s.lost > 0 && s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0,
            "{s:?}"
        );
        assert!(s.timeouts > 0);
        // Every corrupted copy was dropped by one of the checks or carried its flip in
        // BTH byte 4, the only bits nothing checks.
        let caught = s.bad_ip
            + s.ip_checksum
            + s.udp_checksum
            + s.not_roce
            + s.icrc
            + s.parse
            + s.unroutable;
        assert_eq!(s.corrupted, caught + s.corrupted_delivered, "{s:?}");
        assert!(s.icrc > 0, "{s:?}");
    }
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let cfg = LinkConfig {
        loss: 0.05,
        dup: 0.05,
        reorder: 0.1,
        corrupt: 0.05,
        delay: Duration::from_micros(3),
        jitter: Duration::from_micros(7),
    };
    let run = |seed| {
        let (mut net, qa, qb) = pair(seed, 200);
        net.set_links(0, 1, cfg).unwrap();
        net.run_until(all_done(200, qa, qb), 1_000_000, 100 * SEC)
            .unwrap();
        (net.trace().to_string(), net.stats())
    };
    let (t1, s1) = run(42);
    let (t2, s2) = run(42);
    let (t3, s3) = run(43);
    assert_eq!(s1, s2);
    assert_eq!(t1, t2);
    assert_ne!(t1, t3);
    assert_ne!(s1, s3);
}

#[test]
fn filter_drops_exactly_the_second_packet_and_the_timeout_resends_it() {
    let (mut net, qa, qb) = pair(7, 3);
    net.set_links(0, 1, LinkConfig::with_delay(Duration::from_micros(1)))
        .unwrap();
    net.set_filter(
        0,
        1,
        Some(Box::new(|_p: &PacketRepr<'_>, nth| {
            if nth == 1 {
                Verdict::Drop
            } else {
                Verdict::Deliver
            }
        })),
    )
    .unwrap();
    net.run_until(all_done(3, qa, qb), 10_000, SEC).unwrap();
    assert_exactly_once(&net, 3, qa, qb);
    let psns: Vec<(u64, u32)> = net
        .trace()
        .transmitted(0, 1)
        .iter()
        .map(|(t, p)| (t.as_nanos(), p.psn.value()))
        .collect();
    // PSN 0, 1 (dropped), 2 at t = 0; the receiver ignores 2 (out of order); ACK of 0
    // arrives at 2 µs and re-arms the 100 µs timer; go-back-N resends 1 and 2 then.
    assert_eq!(
        psns,
        vec![(0, 0), (0, 1), (0, 2), (102_000, 1), (102_000, 2)]
    );
    assert_eq!(net.stats().filtered, 1);
    assert_eq!(net.stats().timeouts, 1);
}

#[test]
fn filter_duplicate_and_delay() {
    let (mut net, qa, qb) = pair(7, 2);
    net.set_filter(
        0,
        1,
        Some(Box::new(|_p: &PacketRepr<'_>, nth| match nth {
            0 => Verdict::Delay(Duration::from_micros(50)),
            _ => Verdict::Duplicate,
        })),
    )
    .unwrap();
    net.run_until(all_done(2, qa, qb), 10_000, SEC).unwrap();
    assert_exactly_once(&net, 2, qa, qb);
    let got: Vec<(u64, u32)> = net
        .trace()
        .delivered(0, 1)
        .iter()
        .map(|(t, p)| (t.as_nanos(), p.psn.value()))
        .collect();
    // PSN 1 (two copies) overtakes PSN 0, which is held 50 µs; the fake ignores the early
    // PSN 1; the ACK of PSN 0 re-arms the 100 µs timer, whose go-back-N resends PSN 1
    // (duplicated again by the filter) at 150 µs.
    assert_eq!(
        got,
        [(0, 1), (0, 1), (50_000, 0), (150_000, 1), (150_000, 1)]
    );
    assert_eq!(net.stats().duplicated, 2);
}

#[test]
fn every_single_bit_flip_is_caught_except_in_bth_byte_4() {
    let (mut net, _qa, qb) = pair(1, 0);
    let bth = bth::Repr {
        opcode: op::RC_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp: 0x20,
        ack_req: true,
        psn: Psn::new(0),
    };
    let payload = Fake::payload(0);
    let pkt = PacketRepr::new(bth, &payload[..13]);
    let mut roce = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut roce).unwrap();
    let clean = net.seal(0, 0x10, 1, &roce).unwrap();
    let bits = clean.len() * 8;
    let bth_byte4 = 20 + 8 + 4;
    let mut delivered_bits = Vec::new();
    for bit in 0..bits {
        let mut d = clean.clone();
        d[bit / 8] ^= 0x80 >> (bit % 8);
        let before = net.stats().delivered;
        net.inject_raw(0, 1, d, Duration::ZERO).unwrap();
        net.run_until(|n| n.in_flight() == 0, 100, SEC).unwrap();
        if net.stats().delivered > before {
            delivered_bits.push(bit);
        }
    }
    assert_eq!(
        delivered_bits,
        ((bth_byte4 * 8)..(bth_byte4 * 8 + 8)).collect::<Vec<_>>()
    );
    // The clean datagram is delivered.
    net.inject_raw(0, 1, clean, Duration::ZERO).unwrap();
    net.run_until(|n| n.in_flight() == 0, 100, SEC).unwrap();
    let s = net.stats();
    assert_eq!(s.delivered, 9);
    assert_eq!(
        s.bad_ip + s.ip_checksum + s.udp_checksum + s.not_roce + s.icrc + s.parse + s.unroutable,
        bits as u64 - 8
    );
    assert!(s.icrc > 0 && s.ip_checksum > 0 && s.udp_checksum > 0 && s.not_roce > 0);
    // The receiver saw PSN 0 first with a 13-byte payload (the fake refuses it as
    // corrupt) and never a wrong PSN.
    assert_eq!(net.qp(qb).unwrap().corrupt_payloads, 9);
}

#[test]
fn packets_from_a_stranger_reach_the_qp_which_decides() {
    let (mut net, _qa, _qb) = pair(1, 0);
    let c = net.add_node().unwrap();
    let pkt = PacketRepr {
        aeth: Some(uroce_wire::aeth::Repr {
            syndrome: uroce_wire::aeth::Syndrome::ACK_NO_CREDIT,
            msn: 0,
        }),
        ..PacketRepr::new(
            bth::Repr {
                opcode: op::RC_ACKNOWLEDGE,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: 0x20,
                ack_req: false,
                psn: Psn::new(0),
            },
            &[],
        )
    };
    net.inject(c, 0x10, 1, &pkt, Duration::ZERO).unwrap();
    let mut to_nowhere = pkt;
    to_nowhere.bth.dest_qp = 0x99;
    net.inject(0, 0x10, 1, &to_nowhere, Duration::ZERO).unwrap();
    net.run_until(|n| n.in_flight() == 0, 100, SEC).unwrap();
    // The stranger's packet is delivered to the QP (its engine checks the source, as a
    // host's socket would deliver it); the one for no QP is dropped.
    assert_eq!(net.stats().unroutable, 1);
    assert_eq!(net.stats().delivered, 1);
}

#[test]
fn run_until_reports_stall_time_and_step_limits() {
    // Everything lost and no timer: nothing can happen any more.
    let (mut net, qa, qb) = pair(1, 1);
    net.qp_mut(qa).unwrap().timeout = None;
    net.set_link(
        0,
        1,
        LinkConfig {
            loss: 1.0,
            ..LinkConfig::PERFECT
        },
    )
    .unwrap();
    assert_eq!(
        net.run_until(all_done(1, qa, qb), 100, SEC),
        Err(SimError::Stalled { now: Instant::ZERO })
    );

    // Everything lost with a 100 µs timer: the time limit hits first.
    let (mut net, qa, qb) = pair(1, 1);
    net.set_link(
        0,
        1,
        LinkConfig {
            loss: 1.0,
            ..LinkConfig::PERFECT
        },
    )
    .unwrap();
    let err = net.run_until(all_done(1, qa, qb), 1_000_000, Duration::from_micros(350));
    assert_eq!(
        err,
        Err(SimError::TimeLimit {
            limit: Instant::from_nanos(350_000),
            next: Instant::from_nanos(400_000),
        })
    );
    let err = net.run_until(all_done(1, qa, qb), 5, SEC);
    assert!(
        matches!(err, Err(SimError::StepLimit { steps: 5, .. })),
        "{err:?}"
    );
}

#[test]
fn engine_misbehaviour_is_an_error() {
    for (quirk, check) in [
        (Quirk::StuckTimer, "TimerStuck"),
        (Quirk::Garbage, "InvalidTransmit"),
        (Quirk::Overflow, "TransmitOverflow"),
    ] {
        let (mut net, qa, qb) = pair(1, 1);
        net.qp_mut(qa).unwrap().quirk = quirk;
        net.set_link(
            0,
            1,
            LinkConfig {
                loss: 1.0,
                ..LinkConfig::PERFECT
            },
        )
        .unwrap();
        let err = net
            .run_until(all_done(1, qa, qb), 100_000, SEC)
            .unwrap_err();
        assert!(format!("{err:?}").starts_with(check), "{quirk:?}: {err:?}");
    }
}

#[test]
fn bad_probabilities_are_refused() {
    let (mut net, _, _) = pair(1, 0);
    for bad in [-0.1, 1.5, f64::NAN] {
        let cfg = LinkConfig {
            dup: bad,
            ..LinkConfig::PERFECT
        };
        assert!(matches!(
            net.set_link(0, 1, cfg),
            Err(SimError::BadProbability { name: "dup", .. })
        ));
    }
}

#[test]
fn trace_limit_keeps_the_tail() {
    let (mut net, qa, qb) = pair(1, 50);
    net.set_trace_limit(10);
    net.run_until(all_done(50, qa, qb), 100_000, SEC).unwrap();
    assert_eq!(net.trace().entries().count(), 10);
    assert!(net.trace().discarded() > 0);
    assert_eq!(net.trace().tail(3).lines().count(), 3);
    assert!(net.trace().to_string().starts_with('('));
}

#[test]
fn advance_moves_time_without_events() {
    let (mut net, _, _) = pair(1, 0);
    net.advance(Duration::from_millis(3), 10).unwrap();
    assert_eq!(net.now(), Instant::from_nanos(3_000_000));
}
