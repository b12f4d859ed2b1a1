//! The unmodified Debian `ibv_ud_pingpong` (package ibverbs-utils) runs between two
//! processes against uroce's cdylib presented as `libibverbs.so.1` through
//! `LD_LIBRARY_PATH`: one uroce device on 127.0.21.x per process, QP numbers, PSNs and GIDs
//! exchanged by the program itself over TCP, then `iters` round trips of `size` bytes over
//! UD QPs (each side creates an address handle for its peer, `is_global` with `-g 0`, and
//! sends every message with `wr.ud` naming it, the peer's QPN and the Q_Key 0x11111111).
//!
//! The program posts receives of `size + 40` bytes (the GRH area comes first) and refuses
//! a `size` larger than the port's active MTU, which is 4096 on a uroce port on loopback
//! (the interface's 65536-byte MTU less the RoCEv2 headers, rounded down to the largest
//! IB MTU): an explicit `-s 8192` is refused with the program's own message. Without
//! `-s` it exchanges 1024-byte datagrams (its usage text says 2048).
//! The runs: the default size, `-s 4096` (one full-MTU packet per
//! datagram) with and without buffer validation (`-c`), `-s 1`, 10000 iterations (the
//! 500-deep receive queue refilled 20 times) and event mode (`-e`).
//!
//! Expectations come from the program's documented behaviour, not from uroce: both exit
//! 0; each prints its own and its peer's address and the peer's QPN/PSN equal what the
//! peer printed as its own; each counts `2 * size * iters` bytes; with `-c` no "invalid
//! data" report. Without the tools the test is skipped, or fails under
//! `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{
    assert_both_succeeded, assert_library_defines_imports, check_pingpong, debian_command,
    free_tcp_port, have_program, pingpong_pair, run_server_client, LibDir,
};
use uroce_testkit::run;

const PROGRAM: &str = "/usr/bin/ibv_ud_pingpong";
/// Per-process limit (each run takes well under a second alone).
const LIMIT: Duration = Duration::from_secs(60);
/// The largest message: the port's active MTU (loopback's).
const MTU: u64 = 4096;
/// The program's default message size (what it sends without `-s`).
const DEFAULT_SIZE: u64 = 1024;
const ITERS: u64 = 1000;

fn addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 21, n)
}

/// Runs server `addr(n)` and client `addr(n + 1)` exchanging `size` bytes `iters` times.
fn run_pair(test: &str, n: u8, size: u64, iters: u64, extra: &[&str]) {
    let pair = (addr(n), addr(n + 1));
    pingpong_pair(test, PROGRAM, pair, (size, iters), extra, LIMIT);
}

#[test]
fn library_defines_every_symbol_ud_pingpong_imports() {
    const TEST: &str = "library_defines_every_symbol_ud_pingpong_imports";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    assert_library_defines_imports(TEST, PROGRAM, 15, &[]);
}

#[test]
fn debian_ud_pingpong_mtu_sized() {
    run_pair("debian_ud_pingpong_mtu_sized", 1, MTU, ITERS, &[]);
}

#[test]
fn debian_ud_pingpong_mtu_sized_validated() {
    run_pair(
        "debian_ud_pingpong_mtu_sized_validated",
        3,
        MTU,
        ITERS,
        &["-c"],
    );
}

#[test]
fn debian_ud_pingpong_one_byte_validated() {
    run_pair(
        "debian_ud_pingpong_one_byte_validated",
        5,
        1,
        ITERS,
        &["-c"],
    );
}

#[test]
fn debian_ud_pingpong_event_mode() {
    run_pair(
        "debian_ud_pingpong_event_mode",
        7,
        MTU,
        ITERS,
        &["-e", "-c"],
    );
}

#[test]
fn debian_ud_pingpong_10000_iterations() {
    run_pair(
        "debian_ud_pingpong_10000_iterations",
        9,
        MTU,
        10_000,
        &["-c"],
    );
}

/// With no `-s` the program exchanges 1024-byte datagrams (below the port's MTU).
#[test]
fn debian_ud_pingpong_default_size() {
    const TEST: &str = "debian_ud_pingpong_default_size";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    let (server, client) = (addr(11), addr(12));
    let dir = LibDir::new(TEST);
    let port = free_tcp_port();
    let args: Vec<String> = vec!["-g".into(), "0".into(), "-p".into(), port.to_string()];
    let server_cmd = debian_command(&dir, PROGRAM, server, &args);
    let client_args = [args, vec![server.to_string()]].concat();
    let client_cmd = debian_command(&dir, PROGRAM, client, &client_args);
    let (s_out, c_out) = run_server_client(TEST, server_cmd, client_cmd, port, LIMIT);
    assert_both_succeeded(TEST, &s_out, &c_out);
    check_pingpong(
        TEST,
        (server, client),
        (DEFAULT_SIZE, ITERS),
        (&s_out.stdout, &c_out.stdout),
    );
}

/// An explicit size above the port's active MTU is refused by the program itself, with
/// its own message and status 1, before it opens its TCP connection.
#[test]
fn debian_ud_pingpong_refuses_an_explicit_size_above_the_mtu() {
    const TEST: &str = "debian_ud_pingpong_refuses_an_explicit_size_above_the_mtu";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    let dir = LibDir::new(TEST);
    let port = free_tcp_port().to_string();
    let size = (2 * MTU).to_string();
    let args: Vec<String> = ["-g", "0", "-p", &port, "-s", &size]
        .map(str::to_owned)
        .to_vec();
    let cmd = debian_command(&dir, PROGRAM, addr(13), &args);
    let out = run(cmd, LIMIT).unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let report = format!("{TEST}: {:?}\n{}{}", out.status, out.stdout, out.stderr);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let want = format!("Requested size larger than port MTU ({MTU})");
    assert!(out.stderr.lines().any(|l| l.trim() == want), "{report}");
}
