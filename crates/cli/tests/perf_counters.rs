//! `uroce perf --counters`: after each test the client prints its own and the server's
//! device and per-QP counters (the server's fetched over the out-of-band connection).
//!
//! The expected packet counts follow from the RC rules, not from the tool: a message of
//! S bytes at path MTU P travels in ceil(S / P) packets (WRITE and SEND requests, READ
//! responses); the path MTU of two loopback devices is 4096 (the loopback interface's
//! MTU of 65536 less the 80 header bytes, rounded down to an IB MTU — the value `uroce
//! devinfo` reports); bandwidth tests send exactly `--iters` messages per QP. What one side
//! sent, the other received: on loopback nothing is lost, so the client's tx_packets and
//! the server's rx_packets must agree (up to a few packets, should the kernel drop one).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{exclusive, parse_table, run_uroce, Background};

const CLIENT_LIMIT: Duration = Duration::from_secs(120);
const SERVER_LIMIT: Duration = Duration::from_secs(30);
/// Path MTU between two loopback devices (see the module docs).
const PATH_MTU: u64 = 4096;
/// Message size: 5 packets at the path MTU, the last one short.
const SIZE: u64 = 20_000;
const ITERS: u64 = 50;
const QPS: usize = 2;

/// Counters of one line: name → value (absent: zero).
type Fields = BTreeMap<String, u64>;

/// The counter lines printed after one test.
#[derive(Debug, Default)]
struct Block {
    /// `test size`, from the `counters after … B:` line.
    test: String,
    client_dev: Fields,
    server_dev: Fields,
    client_qps: Vec<(u32, Fields)>,
    server_qps: Vec<(u32, Fields)>,
}

/// `name=value name=value …` (or `all zero`) into a map.
fn fields(text: &str) -> Fields {
    if text.trim() == "all zero" {
        return Fields::new();
    }
    text.split_whitespace()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .unwrap_or_else(|| panic!("{kv:?} is not name=value"));
            let v: u64 = v
                .parse()
                .unwrap_or_else(|_| panic!("{kv:?}: value is not a number"));
            assert!(v != 0, "{kv:?}: zero counters must be left out");
            (k.to_string(), v)
        })
        .collect()
}

/// Every counter block of `stdout`, in order.
fn blocks(stdout: &str) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("counters ") else {
            continue;
        };
        if let Some(t) = rest.strip_prefix("after ") {
            let test = t
                .strip_suffix(" B:")
                .unwrap_or_else(|| panic!("bad block header {line:?}"));
            out.push(Block {
                test: test.to_string(),
                ..Block::default()
            });
            continue;
        }
        let block = out
            .last_mut()
            .unwrap_or_else(|| panic!("counter line before any block header: {line:?}"));
        let (head, values) = rest
            .split_once(": ")
            .unwrap_or_else(|| panic!("bad counter line {line:?}"));
        let words: Vec<&str> = head.split_whitespace().collect();
        match words.as_slice() {
            ["client", "dev"] => block.client_dev = fields(values),
            ["server", "dev"] => block.server_dev = fields(values),
            [side @ ("client" | "server"), "qp", qpn] => {
                let hex = qpn
                    .strip_prefix("0x")
                    .unwrap_or_else(|| panic!("QP number {qpn:?} is not 0x…"));
                let qpn = u32::from_str_radix(hex, 16).expect("hex QP number");
                let list = if *side == "client" {
                    &mut block.client_qps
                } else {
                    &mut block.server_qps
                };
                list.push((qpn, fields(values)));
            }
            _ => panic!("unknown counter line {line:?}"),
        }
    }
    out
}

fn get(f: &Fields, name: &str) -> u64 {
    f.get(name).copied().unwrap_or(0)
}

/// `a` and `b` agree up to 8 packets or 1 %.
fn close(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= 8.max(a.max(b) / 100)
}

/// Checks that hold after every test.
fn check_block(b: &Block, qps: usize) {
    let what = &b.test;
    for (side, dev) in [("client", &b.client_dev), ("server", &b.server_dev)] {
        assert!(
            get(dev, "tx_packets") > 0,
            "{what}: {side} sent nothing: {dev:?}"
        );
        assert!(
            get(dev, "rx_packets") > 0,
            "{what}: {side} got nothing: {dev:?}"
        );
        for bad in [
            "bad_icrc",
            "unverified_icrc",
            "icrc_unverifiable",
            "icrc_id_no_df",
            "parse_errors",
            "truncated",
        ] {
            assert_eq!(get(dev, bad), 0, "{what}: {side} {bad}: {dev:?}");
        }
        // A uroce peer's packets take the exact ICRC path (ID 0) or, as segments of a
        // GSO train, the solved one with DF: every packet one of the two.
        assert_eq!(
            get(dev, "icrc_exact") + get(dev, "icrc_id_df"),
            get(dev, "rx_packets"),
            "{what}: {side} ICRC paths: {dev:?}"
        );
    }
    let (c, s) = (&b.client_dev, &b.server_dev);
    assert!(
        close(get(c, "tx_packets"), get(s, "rx_packets")),
        "{what}: client tx_packets vs server rx_packets: {c:?} / {s:?}"
    );
    assert!(
        close(get(s, "tx_packets"), get(c, "rx_packets")),
        "{what}: server tx_packets vs client rx_packets: {c:?} / {s:?}"
    );
    for (side, list) in [("client", &b.client_qps), ("server", &b.server_qps)] {
        assert_eq!(list.len(), qps, "{what}: {side} QP lines");
        let mut qpns: Vec<u32> = list.iter().map(|(n, _)| *n).collect();
        qpns.sort_unstable();
        qpns.dedup();
        assert_eq!(qpns.len(), qps, "{what}: {side} QP numbers repeat");
    }
}

fn server(addr: &str, port: &str) -> Background {
    Background::start(&[
        "perf",
        "--server",
        "--addr",
        addr,
        "--oob-port",
        port,
        "--timeout",
        "20",
        "--accept-timeout",
        "60",
        "--counters",
    ])
}

#[test]
fn counters_of_both_sides_after_each_test() {
    let _one_at_a_time = exclusive();
    let (server_addr, client_addr, port) = ("127.0.1.50", "127.0.1.51", "18550");
    let srv = server(server_addr, port);
    let size = SIZE.to_string();
    let iters = ITERS.to_string();
    let qps = QPS.to_string();
    let out = run_uroce(
        &[
            "perf",
            "--client",
            server_addr,
            "--addr",
            client_addr,
            "--oob-port",
            port,
            "--counters",
            "--test",
            "write_bw,read_lat,send_bw",
            "--size",
            &size,
            "--iters",
            &iters,
            "--qps",
            &qps,
            "--tx-depth",
            "16",
            "--timeout",
            "20",
            "--no-progress",
        ],
        CLIENT_LIMIT,
    );
    assert!(
        out.status.success(),
        "client failed ({}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert!(srv.wait(SERVER_LIMIT), "the server failed");
    eprintln!("{}", out.stdout);

    // The table is still there, after the counters.
    let rows = parse_table(&out.stdout);
    assert_eq!(rows.len(), 3, "{}", out.stdout);

    let bs = blocks(&out.stdout);
    let names: Vec<&str> = bs.iter().map(|b| b.test.as_str()).collect();
    assert_eq!(
        names,
        ["write_bw 20000", "read_lat 20000", "send_bw 20000"],
        "{}",
        out.stdout
    );
    for b in &bs {
        check_block(b, QPS);
    }
    // Device counters are cumulative: they never go down from one test to the next.
    for pair in bs.windows(2) {
        for name in ["tx_packets", "rx_packets", "tx_bytes", "rx_bytes"] {
            for (side, before, after) in [
                ("client", &pair[0].client_dev, &pair[1].client_dev),
                ("server", &pair[0].server_dev, &pair[1].server_dev),
            ] {
                assert!(
                    get(after, name) >= get(before, name),
                    "{side} {name} went down from {} to {}",
                    pair[0].test,
                    pair[1].test
                );
            }
        }
    }

    let per_message = SIZE.div_ceil(PATH_MTU);
    // write_bw and send_bw: each client QP sent exactly ITERS messages of 5 packets
    // (plus any retransmissions), and each server QP received them.
    for b in [&bs[0], &bs[2]] {
        for (qpn, f) in &b.client_qps {
            let sent = get(f, "packets_sent") - get(f, "retransmitted_packets");
            assert_eq!(
                sent,
                ITERS * per_message,
                "{}: client QP {qpn:#x} first transmissions: {f:?}",
                b.test
            );
        }
        for (qpn, f) in &b.server_qps {
            assert!(
                get(f, "packets_received") >= ITERS * per_message,
                "{}: server QP {qpn:#x} received too little: {f:?}",
                b.test
            );
        }
    }
    let tx_write = get(&bs[0].client_dev, "tx_packets");
    assert!(
        tx_write >= QPS as u64 * ITERS * per_message,
        "write_bw: client tx_packets {tx_write}"
    );
    let tx_send = get(&bs[2].client_dev, "tx_packets") - get(&bs[1].client_dev, "tx_packets");
    assert!(
        tx_send >= QPS as u64 * ITERS * per_message,
        "send_bw: client tx_packets grew by {tx_send} only"
    );
    // read_lat: at least ITERS READs per QP (a warm-up may add some), each answered by
    // 5 response packets that the client received.
    for (qpn, f) in &bs[1].server_qps {
        let responses = get(f, "read_responses_sent");
        assert!(
            (ITERS * per_message..=2 * ITERS * per_message).contains(&responses),
            "read_lat: server QP {qpn:#x} sent {responses} READ responses: {f:?}"
        );
        assert_eq!(
            responses % per_message,
            0,
            "read_lat: server QP {qpn:#x}: {responses} is not a whole number of READs"
        );
    }
    for (qpn, f) in &bs[1].client_qps {
        assert!(
            get(f, "packets_received") >= ITERS * per_message,
            "read_lat: client QP {qpn:#x} received too little: {f:?}"
        );
    }
}

/// The local pair passes `--counters` on to its client; without it nothing changes.
#[test]
fn a_local_pair_prints_counters_only_when_asked() {
    let _one_at_a_time = exclusive();
    let base = [
        "perf",
        "--addr",
        "127.0.1.52",
        "--server-addr",
        "127.0.1.53",
        "--oob-port",
        "18551",
        "--test",
        "write_lat,atomic_lat",
        "--iters",
        "20",
        "--timeout",
        "20",
        "--no-progress",
    ];
    let mut with = base.to_vec();
    with.push("--counters");
    for (args, counters) in [(&with[..], true), (&base[..], false)] {
        let out = run_uroce(args, CLIENT_LIMIT);
        assert!(
            out.status.success(),
            "uroce {args:?} failed:\n{}\n{}",
            out.stdout,
            out.stderr
        );
        assert_eq!(parse_table(&out.stdout).len(), 2, "{}", out.stdout);
        let bs = blocks(&out.stdout);
        if counters {
            let names: Vec<&str> = bs.iter().map(|b| b.test.as_str()).collect();
            assert_eq!(names, ["write_lat 8", "atomic_lat 8"], "{}", out.stdout);
            for b in &bs {
                check_block(b, 1);
            }
        } else {
            assert!(
                bs.is_empty(),
                "counters without --counters:\n{}",
                out.stdout
            );
        }
    }
}
