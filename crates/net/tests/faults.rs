//! Fault injection: configuration parsing, determinism, statistics of the injector on
//! its own, and corruption end to end over loopback sockets, where the receiver's ICRC
//! check must flag exactly the corrupted packets.

mod support;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use uroce_net::faults::{Effects, Outgoing, MASKED_BTH_BYTE, MAX_HOLD_DISTANCE};
use uroce_net::{
    verify_icrc, FaultConfig, FaultInjector, FaultParseError, IcrcCheck, OutPacket, RecvBatch,
    RecvStatus, RoceSocket, SocketConfig,
};
use uroce_wire::PacketRepr;

use support::Rng;

#[test]
fn parses_good_configurations() {
    let c = FaultConfig::parse("drop=0.01,dup=0.001,reorder=0.01,corrupt=0.0001,seed=7").unwrap();
    assert_eq!(
        c,
        FaultConfig {
            drop: 0.01,
            dup: 0.001,
            reorder: 0.01,
            corrupt: 0.0001,
            seed: 7
        }
    );
    assert_eq!(FaultConfig::parse("").unwrap(), FaultConfig::NONE);
    assert!(FaultConfig::parse("").unwrap().is_none());
    let c = FaultConfig::parse(" corrupt = 1 , seed=0xFF ,").unwrap();
    assert_eq!((c.corrupt, c.seed, c.drop), (1.0, 255, 0.0));
    assert!(!c.is_none());
    assert_eq!(FaultConfig::parse("drop=1e-3").unwrap().drop, 0.001);
    assert_eq!(FaultConfig::parse("drop=0").unwrap(), FaultConfig::NONE);
    assert_eq!(
        FaultConfig::parse(&format!("seed={}", u64::MAX))
            .unwrap()
            .seed,
        u64::MAX
    );
    // Display writes what parse reads back.
    for s in [
        "drop=0.25,dup=0.5,reorder=0.125,corrupt=1,seed=99",
        "seed=3",
    ] {
        let c: FaultConfig = s.parse().unwrap();
        assert_eq!(FaultConfig::parse(&c.to_string()).unwrap(), c);
    }
}

#[test]
fn rejects_bad_configurations_naming_the_culprit() {
    let bad_p = |k: &str, v: &str| FaultParseError::BadProbability {
        key: k.into(),
        value: v.into(),
    };
    let cases: Vec<(&str, FaultParseError)> = vec![
        (
            "drop",
            FaultParseError::MissingValue {
                item: "drop".into(),
            },
        ),
        ("drop=2", bad_p("drop", "2")),
        ("dup=-0.1", bad_p("dup", "-0.1")),
        ("reorder=abc", bad_p("reorder", "abc")),
        ("corrupt=NaN", bad_p("corrupt", "NaN")),
        ("drop=", bad_p("drop", "")),
        (
            "loss=0.1",
            FaultParseError::UnknownKey { key: "loss".into() },
        ),
        (
            "drop=0.1,DROP=0.1",
            FaultParseError::UnknownKey { key: "DROP".into() },
        ),
        (
            "drop=0.1,drop=0.2",
            FaultParseError::DuplicateKey { key: "drop".into() },
        ),
        ("seed=-1", FaultParseError::BadSeed { value: "-1".into() }),
        (
            "seed=0xZZ",
            FaultParseError::BadSeed {
                value: "0xZZ".into(),
            },
        ),
        (
            "seed=18446744073709551616",
            FaultParseError::BadSeed {
                value: "18446744073709551616".into(),
            },
        ),
    ];
    for (input, want) in cases {
        let got = FaultConfig::parse(input).unwrap_err();
        assert_eq!(got, want, "{input:?}");
        // The message names the key or value.
        let msg = got.to_string();
        let named = match &want {
            FaultParseError::MissingValue { item } => item.clone(),
            FaultParseError::UnknownKey { key } | FaultParseError::DuplicateKey { key } => {
                key.clone()
            }
            FaultParseError::BadProbability { key, .. } => key.clone(),
            FaultParseError::BadSeed { value } => value.clone(),
            other => panic!("unexpected {other:?}"),
        };
        assert!(msg.contains(&named), "{msg:?} names {named:?}");
    }
}

fn dst() -> SocketAddr {
    "127.0.0.2:4791".parse().unwrap()
}

/// Packet `i`: 32 bytes carrying `i`, `!i` and `i * K` (K odd), so that any two packets
/// differ in at least 3 bits and a copy with one flipped bit is nearest to exactly one.
fn packet(i: u64) -> Vec<u8> {
    let mut p = vec![0u8; 32];
    p[8..16].copy_from_slice(&i.to_be_bytes());
    p[16..24].copy_from_slice(&(!i).to_be_bytes());
    p[24..32].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    p
}

/// Runs `n` packets through an injector; returns, per output packet, the index of the
/// input packet whose processing released it, and the effects per input packet.
fn run(config: FaultConfig, n: u64) -> (Vec<(u64, Outgoing)>, Vec<Effects>) {
    let mut inj = FaultInjector::new(config);
    let mut out = Vec::new();
    let mut released = Vec::new();
    let mut effects = Vec::new();
    for i in 0..n {
        out.clear();
        effects.push(inj.process(dst(), &packet(i), &mut out));
        released.extend(out.drain(..).map(|o| (i, o)));
    }
    inj.release_all(&mut out);
    assert_eq!(inj.held(), 0);
    released.extend(out.drain(..).map(|o| (n, o)));
    (released, effects)
}

#[test]
fn same_seed_same_faults_other_seed_other_faults() {
    let config = FaultConfig::parse("drop=0.1,dup=0.1,reorder=0.1,corrupt=0.1,seed=7").unwrap();
    let a = run(config, 2000);
    let b = run(config, 2000);
    assert_eq!(a, b);
    let c = run(FaultConfig { seed: 8, ..config }, 2000);
    assert_ne!(a.1, c.1);
    // No faults configured: every packet passes unchanged and in order.
    let (out, fx) = run(FaultConfig::NONE, 500);
    assert!(fx.iter().all(|e| *e == Effects::default()));
    let bytes: Vec<_> = out.into_iter().map(|(_, o)| o.bytes).collect();
    assert_eq!(bytes, (0..500).map(packet).collect::<Vec<_>>());
}

/// |observed − n·p| within 5 standard deviations of a binomial(n, p).
fn assert_rate(what: &str, observed: usize, n: usize, p: f64) {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (observed as f64 - mean).abs() <= 5.0 * sd,
        "{what}: {observed} of {n}, expected {mean} ± {}",
        5.0 * sd
    );
}

#[test]
fn rates_and_invariants_over_ten_thousand_packets() {
    const N: u64 = 10_000;
    let config =
        FaultConfig::parse("drop=0.1,dup=0.05,reorder=0.1,corrupt=0.02,seed=12345").unwrap();
    let (out, fx) = run(config, N);
    let n = N as usize;
    let drops = fx.iter().filter(|e| e.dropped).count();
    let dups = fx.iter().filter(|e| e.duplicated).count();
    let holds = fx.iter().filter(|e| e.held_for.is_some()).count();
    let corrupts = fx.iter().filter(|e| e.corrupted_bit.is_some()).count();
    assert_rate("drop", drops, n, 0.1);
    // Duplication, reordering and corruption apply to the packets not dropped.
    assert_rate("dup", dups, n - drops, 0.05);
    assert_rate("reorder", holds, n - drops, 0.1);
    assert_rate("corrupt", corrupts, n - drops, 0.02);

    // What came out, checked against the original packets independently of `fx`'s
    // bookkeeping: identify each output by the original it is at most one bit away from
    // (there is exactly one, see `packet`).
    let originals: Vec<Vec<u8>> = (0..N).map(packet).collect();
    let mut copies = vec![0usize; n];
    let mut corrupted_seen = vec![false; n];
    let mut inversions = 0;
    let mut last_index = 0u64;
    for (released_at, o) in &out {
        assert_eq!(o.dst, dst());
        let index = (0..N)
            .find(|&i| {
                let diff: u32 = originals[i as usize]
                    .iter()
                    .zip(&o.bytes)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum();
                diff <= 1
            })
            .expect("every output is an original or one bit away from one");
        let i = index as usize;
        copies[i] += 1;
        let diff: Vec<usize> = originals[i]
            .iter()
            .zip(&o.bytes)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(k, _)| k)
            .collect();
        if let Some(&byte) = diff.first() {
            assert_ne!(byte, MASKED_BTH_BYTE, "the masked BTH byte is never hit");
            corrupted_seen[i] = true;
            assert_eq!(o.corrupted_bit.map(|b| b / 8), Some(byte));
        } else {
            assert_eq!(o.corrupted_bit, None);
        }
        // Held packets go out within MAX_HOLD_DISTANCE further packets (or at the end).
        assert!(
            *released_at >= index
                && (*released_at - index <= MAX_HOLD_DISTANCE || *released_at == N),
            "packet {index} released at {released_at}"
        );
        if index < last_index {
            inversions += 1;
        }
        last_index = index;
    }
    for (i, e) in fx.iter().enumerate() {
        let want = if e.dropped {
            0
        } else if e.duplicated {
            2
        } else {
            1
        };
        assert_eq!(copies[i], want, "packet {i}: {e:?}");
        assert_eq!(corrupted_seen[i], e.corrupted_bit.is_some(), "packet {i}");
    }
    assert_eq!(out.len(), n - drops + dups);
    assert!(inversions > 0, "reordering reorders");
}

/// End to end: a sender with fault injection, a Strict receiver. The test finds the
/// corrupted arrivals by comparing bytes with what it sealed; the receiver's ICRC check
/// must flag exactly those, and the counters must agree.
#[test]
fn corrupted_packets_are_exactly_the_ones_the_receiver_rejects() {
    const N: u32 = 1500;
    let faults =
        FaultConfig::parse("drop=0.02,dup=0.02,reorder=0.05,corrupt=0.05,seed=42").unwrap();
    let mut tx = RoceSocket::bind_with(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), 0),
        SocketConfig {
            faults: Some(faults),
            ..SocketConfig::default()
        },
    )
    .unwrap();
    assert_eq!(tx.faults(), Some(&faults));
    let mut rx = RoceSocket::bind_port(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 0).unwrap();
    let (lt, lr) = (tx.local_addr(), rx.local_addr());

    let mut rng = Rng::new(0x6661_756c_7473);
    let info = uroce_wire::opcode::info(uroce_wire::opcode::op::RC_RDMA_WRITE_ONLY).unwrap();
    let mut originals: Vec<Vec<u8>> = Vec::new();
    for psn in 0..N {
        let mut s = support::random_sample(&mut rng, info, 96);
        // PSN = index, so that intact arrivals are identified directly.
        s.roce[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
        tx.seal(lr, &mut s.roce).unwrap();
        originals.push(s.roce);
    }
    let by_content: HashMap<&[u8], usize> = originals
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_slice(), i))
        .collect();

    let mut batch = RecvBatch::default();
    let mut got = Vec::new();
    for chunk in originals.chunks(50) {
        let out: Vec<_> = chunk
            .iter()
            .map(|p| OutPacket { dst: lr, roce: p })
            .collect();
        support::send_all(&mut tx, &out);
        got.extend(support::drain(
            &mut rx,
            &mut batch,
            Duration::from_millis(1),
        ));
    }
    assert_eq!(tx.flush_held().unwrap(), 0);
    got.extend(support::drain(
        &mut rx,
        &mut batch,
        Duration::from_millis(200),
    ));

    let ct = tx.counters();
    let cr = rx.counters();
    let expected = u64::from(N) - ct.injected_drops + ct.injected_dups;
    assert_eq!(got.len() as u64, expected, "{ct:?}");
    assert_eq!(ct.tx_packets, expected);
    assert!(ct.injected_corruptions > 0 && ct.injected_reorders > 0 && ct.injected_drops > 0);

    let mut corrupted_arrivals = 0u64;
    let mut corrupted_originals = std::collections::BTreeSet::new();
    let mut arrived = std::collections::BTreeSet::new();
    let mut inversions = 0;
    let mut last = 0usize;
    for g in &got {
        assert_eq!(g.src, Some(lt));
        let check = verify_icrc(lt, lr, &g.bytes);
        let index = match by_content.get(g.bytes.as_slice()) {
            Some(&i) => {
                assert_eq!(check, IcrcCheck::Ok);
                assert_eq!(g.status, RecvStatus::Accepted(IcrcCheck::Ok));
                i
            }
            None => {
                // Not an original: it must be one exactly one bit away from one.
                let i = originals
                    .iter()
                    .position(|o| {
                        o.len() == g.bytes.len()
                            && o.iter()
                                .zip(&g.bytes)
                                .map(|(a, b)| (a ^ b).count_ones())
                                .sum::<u32>()
                                == 1
                    })
                    .expect("a corrupted packet is one bit off an original");
                assert_eq!(check, IcrcCheck::Mismatch);
                assert_eq!(g.status, RecvStatus::BadIcrc);
                corrupted_arrivals += 1;
                corrupted_originals.insert(i);
                i
            }
        };
        arrived.insert(index);
        if index < last {
            inversions += 1;
        }
        last = index;
    }
    assert_eq!(cr.bad_icrc, corrupted_arrivals);
    assert_eq!(corrupted_originals.len() as u64, ct.injected_corruptions);
    assert_eq!(arrived.len() as u64, u64::from(N) - ct.injected_drops);
    assert!(inversions > 0, "reordered packets arrive out of order");
    assert_eq!(cr.rx_packets, expected);
    assert_eq!(cr.parse_errors + cr.truncated + cr.unverified_icrc, 0);
    // The accepted packets parse as what was sent.
    for g in got.iter().filter(|g| g.status != RecvStatus::BadIcrc) {
        PacketRepr::parse(&g.bytes).unwrap();
    }
    eprintln!("faults end to end: {ct:?}");
}
