//! The unmodified Debian `ibv_rc_pingpong` (package ibverbs-utils) runs between two
//! processes against uroce's cdylib presented as `libibverbs.so.1` through
//! `LD_LIBRARY_PATH`: one uroce device on 127.0.59.x per process, the QP numbers, PSNs and
//! GIDs exchanged by the program itself over TCP, then `iters` round trips of `size` bytes
//! over RC:
//! - the defaults (4096 bytes, 1000 iterations) in busy-polling mode and in event mode
//!   (`-e`: completion channel, `ibv_req_notify_cq`, `ibv_get_cq_event`,
//!   `ibv_ack_cq_events`);
//! - with buffer validation (`-c`): 1 byte (one packet); 4097 bytes (four full
//!   1024-byte MTU packets and a fifth of one byte, two pages); 1 MiB (1024 packets,
//!   twice the requester's 512-PSN window, 256 pages), busy and in event mode, with few
//!   iterations so that it stays fast; and 10000 iterations of the default size (the
//!   500-deep receive queue is refilled 20 times, 40000 data packets each way).
//!
//! Independent pairs use distinct addresses and TCP ports, so the harness may run them in
//! parallel.
//!
//! Expectations come from the program's documented behaviour, not from uroce: both exit
//! 0; each prints its own and its peer's address (GID `::ffff:<addr>`, RFC 4291
//! §2.5.5.2) and the peer's QPN/PSN equal what the peer printed as its own; each counts
//! `2 * size * iters` bytes (it sends and receives `size` bytes per iteration). With `-c`
//! the client sets the first byte of every page of its buffer (otherwise filled with
//! 0x7b) to 0 before its first send, and the server, once done, prints
//! `invalid data in page N` for every page whose first byte is not 0; that line does not
//! change its exit status, so the test looks for it. The library must also define every
//! `IBVERBS_*` symbol the binary imports, with that exact version (read from the binary
//! with `readelf`). Without the tools the test is skipped, or fails under
//! `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{assert_library_defines_imports, check_pingpong, have_program, run_pingpong};

const PROGRAM: &str = "/usr/bin/ibv_rc_pingpong";
/// Per-process limit (each run takes well under a second alone, a few seconds on a
/// loaded machine).
const LIMIT: Duration = Duration::from_secs(60);
/// rc_pingpong's default message size and iterations (passed explicitly).
const SIZE: u64 = 4096;
const ITERS: u64 = 1000;
/// Runs server and client exchanging `size` bytes `iters` times, with `extra` options;
/// checks both outputs.
fn run_pair(test: &str, server: Ipv4Addr, client: Ipv4Addr, size: u64, iters: u64, extra: &[&str]) {
    let (s_out, c_out) = run_pingpong(test, PROGRAM, (server, client), (size, iters), extra, LIMIT);
    check_pingpong(test, (server, client), (size, iters), (&s_out, &c_out));
}

#[test]
fn library_defines_every_symbol_rc_pingpong_imports() {
    const TEST: &str = "library_defines_every_symbol_rc_pingpong_imports";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    assert_library_defines_imports(TEST, PROGRAM, 20, &[]);
}

#[test]
fn debian_rc_pingpong_busy_polling() {
    const TEST: &str = "debian_rc_pingpong_busy_polling";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 59, 2),
        Ipv4Addr::new(127, 0, 59, 1),
        SIZE,
        ITERS,
        &[],
    );
}

#[test]
fn debian_rc_pingpong_event_mode() {
    const TEST: &str = "debian_rc_pingpong_event_mode";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 59, 4),
        Ipv4Addr::new(127, 0, 59, 3),
        SIZE,
        ITERS,
        &["-e"],
    );
}

#[test]
fn debian_rc_pingpong_one_byte_validated() {
    const TEST: &str = "debian_rc_pingpong_one_byte_validated";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 59, 6),
        Ipv4Addr::new(127, 0, 59, 5),
        1,
        ITERS,
        &["-c"],
    );
}

#[test]
fn debian_rc_pingpong_4097_bytes_validated() {
    const TEST: &str = "debian_rc_pingpong_4097_bytes_validated";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 59, 8),
        Ipv4Addr::new(127, 0, 59, 7),
        4097,
        ITERS,
        &["-c"],
    );
}

#[test]
fn debian_rc_pingpong_1_mib_validated() {
    const TEST: &str = "debian_rc_pingpong_1_mib_validated";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 59, 10),
        Ipv4Addr::new(127, 0, 59, 9),
        1 << 20,
        100,
        &["-c"],
    );
}

#[test]
fn debian_rc_pingpong_1_mib_event_mode_validated() {
    const TEST: &str = "debian_rc_pingpong_1_mib_event_mode_validated";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 59, 12),
        Ipv4Addr::new(127, 0, 59, 11),
        1 << 20,
        20,
        &["-e", "-c"],
    );
}

#[test]
fn debian_rc_pingpong_10000_iterations_validated() {
    const TEST: &str = "debian_rc_pingpong_10000_iterations_validated";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    run_pair(
        TEST,
        Ipv4Addr::new(127, 0, 59, 14),
        Ipv4Addr::new(127, 0, 59, 13),
        SIZE,
        10_000,
        &["-c"],
    );
}
