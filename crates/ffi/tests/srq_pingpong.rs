//! The unmodified Debian `ibv_srq_pingpong` (package ibverbs-utils) runs between two
//! processes against uroce's cdylib presented as `libibverbs.so.1` through
//! `LD_LIBRARY_PATH`: one uroce device on 127.0.60.x per process, several RC QPs per side
//! (16 by default, 8 with `-q 8`) that all take their receive WQEs from one shared
//! receive queue (`ibv_create_srq`, the `post_srq_recv` slot, `ibv_create_qp` with
//! `init_attr.srq`, `ibv_destroy_srq`), in busy-polling and event mode, and with a small
//! SRQ (`-r 16`: the queue may run dry, which the responder answers with RNR NAKs and
//! the requester with retries).
//!
//! Expectations come from the program's documented behaviour, not from uroce: both exit
//! 0; each prints one "local address" and one "remote address" line per QP, its own GID
//! being `::ffff:<addr>` (RFC 4291 §2.5.5.2), and the peer's list of (QPN, PSN, GID) equals
//! what the peer printed as its own, in order; each counts `2 * size * iters` bytes. The
//! library must also define every `IBVERBS_*` symbol the binary imports, with that exact
//! version (read from the binary with `readelf`). Without the tools the test is skipped,
//! or fails under `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{assert_library_defines_imports, have_program, run_pingpong};

const PROGRAM: &str = "/usr/bin/ibv_srq_pingpong";
/// Per-process limit (the runs take well under a second).
const LIMIT: Duration = Duration::from_secs(60);
/// Message size (the program's default, passed explicitly) and iterations.
const SIZE: u64 = 4096;
const ITERS: u64 = 500;
/// The program's default number of QPs.
const DEFAULT_QPS: usize = 16;

/// `(QPN, PSN, GID)` of every line starting with `prefix` ("local address:" or "remote
/// address:"), in output order.
fn addresses(out: &str, prefix: &str) -> Vec<(String, String, String)> {
    out.lines()
        .map(str::trim)
        .filter(|l| l.starts_with(prefix))
        .map(|line| {
            let word_after = |key: &str| {
                line.split_whitespace()
                    .skip_while(|w| *w != key)
                    .nth(1)
                    .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                    .trim_end_matches(',')
                    .to_owned()
            };
            (word_after("QPN"), word_after("PSN"), word_after("GID"))
        })
        .collect()
}

/// Runs server and client with `extra` options, expecting `qps` QPs per side; checks both
/// outputs.
fn run_pair(test: &str, server: Ipv4Addr, client: Ipv4Addr, qps: usize, extra: &[&str]) {
    let (s_out, c_out) = run_pingpong(test, PROGRAM, (server, client), (SIZE, ITERS), extra, LIMIT);
    let s_local = addresses(&s_out, "local address:");
    let s_remote = addresses(&s_out, "remote address:");
    let c_local = addresses(&c_out, "local address:");
    let c_remote = addresses(&c_out, "remote address:");
    for (who, list) in [
        ("server local", &s_local),
        ("server remote", &s_remote),
        ("client local", &c_local),
        ("client remote", &c_remote),
    ] {
        assert_eq!(list.len(), qps, "{test}: {who} address lines");
    }
    let s_gid = server.to_ipv6_mapped().to_string();
    let c_gid = client.to_ipv6_mapped().to_string();
    assert!(s_local.iter().all(|a| a.2 == s_gid), "{s_local:?}");
    assert!(c_local.iter().all(|a| a.2 == c_gid), "{c_local:?}");
    let mut qpns: Vec<&String> = s_local.iter().map(|a| &a.0).collect();
    qpns.sort();
    qpns.dedup();
    assert_eq!(qpns.len(), qps, "the server's QPNs are distinct");
    assert_eq!(s_remote, c_local, "server's view of the client");
    assert_eq!(c_remote, s_local, "client's view of the server");

    let bytes = format!("{} bytes in ", 2 * SIZE * ITERS);
    let iters = format!("{ITERS} iters in ");
    for (who, out) in [("server", &s_out), ("client", &c_out)] {
        for want in [&bytes, &iters] {
            assert!(
                out.lines().any(|l| l.starts_with(want.as_str())),
                "{test} {who}: no line starting with {want:?}:\n{out}"
            );
        }
    }
}

#[test]
fn library_defines_every_symbol_srq_pingpong_imports() {
    const TEST: &str = "library_defines_every_symbol_srq_pingpong_imports";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    assert_library_defines_imports(TEST, PROGRAM, 20, &["ibv_create_srq@@"]);
}

#[test]
fn debian_srq_pingpong_default_qps() {
    const TEST: &str = "debian_srq_pingpong_default_qps";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 60, 2),
        Ipv4Addr::new(127, 0, 60, 1),
        DEFAULT_QPS,
        &[],
    );
}

#[test]
fn debian_srq_pingpong_eight_qps_event_mode() {
    const TEST: &str = "debian_srq_pingpong_eight_qps_event_mode";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 60, 4),
        Ipv4Addr::new(127, 0, 60, 3),
        8,
        &["-q", "8", "-e"],
    );
}

#[test]
fn debian_srq_pingpong_small_srq_runs_dry() {
    const TEST: &str = "debian_srq_pingpong_small_srq_runs_dry";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    // rx_depth = number of QPs: the program reposts only when fewer than that many WQEs
    // remain, so the SRQ can be empty when a message arrives (RNR NAK, then a retry).
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 60, 6),
        Ipv4Addr::new(127, 0, 60, 5),
        DEFAULT_QPS,
        &["-r", "16"],
    );
}
