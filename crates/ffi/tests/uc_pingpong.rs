//! The unmodified Debian `ibv_uc_pingpong` (package ibverbs-utils) runs between two
//! processes against uroce's cdylib presented as `libibverbs.so.1` through
//! `LD_LIBRARY_PATH`: one uroce device on 127.0.22.x per process, QP numbers, PSNs and GIDs
//! exchanged by the program itself over TCP, then `iters` round trips of `size` bytes over
//! a connected UC QP pair (path MTU 1024, the program's default):
//! - the defaults (4096 bytes: four packets FIRST/MIDDLE/MIDDLE/LAST, 1000 iterations) in
//!   busy-polling mode and in event mode (`-e`);
//! - with buffer validation (`-c`): 1 byte (SEND_ONLY), 4096 bytes, and 10000 iterations
//!   of the default size (the 500-deep receive queue refilled 20 times).
//!
//! Expectations come from the program's documented behaviour, not from uroce: both exit
//! 0; each prints its own and its peer's address and the peer's QPN/PSN equal what the
//! peer printed as its own; each counts `2 * size * iters` bytes; with `-c` no "invalid
//! data in page" report. On loopback nothing is lost, so every UC message arrives (UC has
//! no retransmission: a lost packet would lose its message and hang the program, which
//! the time limit turns into a failure). Without the tools the test is skipped, or fails
//! under `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{assert_library_defines_imports, have_program, pingpong_pair};

const PROGRAM: &str = "/usr/bin/ibv_uc_pingpong";
/// Per-process limit (each run takes well under a second alone).
const LIMIT: Duration = Duration::from_secs(60);
/// uc_pingpong's default message size and iterations (passed explicitly).
const SIZE: u64 = 4096;
const ITERS: u64 = 1000;

fn addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 22, n)
}

/// Runs server `addr(n)` and client `addr(n + 1)` exchanging `size` bytes `iters` times.
fn run_pair(test: &str, n: u8, size: u64, iters: u64, extra: &[&str]) {
    let pair = (addr(n), addr(n + 1));
    pingpong_pair(test, PROGRAM, pair, (size, iters), extra, LIMIT);
}

#[test]
fn library_defines_every_symbol_uc_pingpong_imports() {
    const TEST: &str = "library_defines_every_symbol_uc_pingpong_imports";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    assert_library_defines_imports(TEST, PROGRAM, 15, &[]);
}

#[test]
fn debian_uc_pingpong_busy_polling() {
    run_pair("debian_uc_pingpong_busy_polling", 1, SIZE, ITERS, &[]);
}

#[test]
fn debian_uc_pingpong_event_mode() {
    run_pair("debian_uc_pingpong_event_mode", 3, SIZE, ITERS, &["-e"]);
}

#[test]
fn debian_uc_pingpong_one_byte_validated() {
    run_pair(
        "debian_uc_pingpong_one_byte_validated",
        5,
        1,
        ITERS,
        &["-c"],
    );
}

#[test]
fn debian_uc_pingpong_4096_bytes_validated() {
    run_pair(
        "debian_uc_pingpong_4096_bytes_validated",
        7,
        SIZE,
        ITERS,
        &["-c"],
    );
}

#[test]
fn debian_uc_pingpong_10000_iterations_validated() {
    run_pair(
        "debian_uc_pingpong_10000_iterations_validated",
        9,
        SIZE,
        10_000,
        &["-c"],
    );
}
