//! Issue check: "A small C program of our own (compiled in the test against the system
//! headers) that checks data integrity for SEND, WRITE, READ and both atomics through the C
//! API, including error completions for a bad rkey."
//!
//! `tests/c/verbs_integrity.c` uses nothing but `<infiniband/verbs.h>`: the exported
//! functions and the header's inline data path (`ibv_post_send`, `ibv_post_recv` and
//! `ibv_poll_cq` go through `ibv_context.ops`). It is compiled here with `$CC` (else `cc`)
//! and linked against the system's libibverbs, as any application would be; at run time
//! `LD_LIBRARY_PATH` puts uroce's cdylib in its place. Two processes (server and client,
//! one uroce device each on 127.0.61.x, connected like `ibv_rc_pingpong` over TCP) check,
//! in both directions, byte for byte: SENDs of 0, 1, MTU, MTU + 1 and 10000 bytes, a
//! multi-SGE SEND, SEND_WITH_IMM and an INLINE SEND; RDMA WRITEs (odd offset, multi-packet,
//! multi-SGE, unsignaled, inline), WRITE_WITH_IMM (also zero-length); RDMA READs (1 byte,
//! multi-packet, multi-SGE); FETCH_AND_ADD and CMP_AND_SWP (returned original values and
//! the peer's memory, swap taken and not taken); and, on QP pairs of their own, R_Key
//! violations (wrong key for WRITE, READ, WRITE_WITH_IMM and FETCH_AND_ADD, a WRITE past
//! the region's end) and a SEND longer than the receive buffer: the requester's error
//! completion (`IBV_WC_REM_ACCESS_ERR`, `IBV_WC_REM_INV_REQ_ERR`), flushes and ERR state,
//! the responder's ERR state and receive completions, untouched memory. The expectations are
//! the verbs API's and the transport's (the C file's header says which), not uroce's: the
//! program exits non-zero at the first deviation.
//!
//! This test asserts that both processes exit 0 and that each printed every expected
//! `PASS <name>` line, once per round, and nothing else. A second run repeats the data
//! checks under injected packet loss, duplication, reordering and corruption on both
//! sides (`UROCE_FAULTS`), where retransmission must keep every byte intact. Without a C
//! compiler or the header (Debian package libibverbs-dev) the tests are skipped, or fail
//! under `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod support;

use support::{assert_both_succeeded, debian_command, free_tcp_port, run_server_client, LibDir};
use uroce_testkit::{run, skip, TempFile};

/// The C program.
const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/verbs_integrity.c");
/// The header the program is compiled against.
const HEADER: &str = "/usr/include/infiniband/verbs.h";
/// Per-process limit (a run takes a few seconds).
const LIMIT: Duration = Duration::from_secs(120);
/// How long the compiler may take.
const COMPILE_LIMIT: Duration = Duration::from_secs(120);

/// The data checks: each process prints each once per round.
const DATA_CHECKS: &[&str] = &[
    "send_0B",
    "send_1B",
    "send_mtu",
    "send_mtu_plus_1",
    "send_10000B",
    "send_multi_sge",
    "send_with_imm",
    "send_inline",
    "write_unsignaled_no_completion",
    "write_13B_unaligned",
    "write_10000B",
    "write_multi_sge",
    "write_with_imm",
    "write_inline",
    "write_with_imm_0B",
    "read_10000B",
    "read_1B",
    "read_multi_sge",
    "atomic_fetch_add_returns_original",
    "atomic_cmp_swp_returns_original",
    "atomic_fetch_add_peer_memory",
    "atomic_cmp_swp_peer_memory",
];

/// The error checks (R_Key violations, a receive overflow): each process prints each once
/// (it is requester for one direction, responder for the other).
const ERROR_CHECKS: &[&str] = &[
    "bad_rkey_write_requester",
    "bad_rkey_write_responder",
    "bad_rkey_read_requester",
    "bad_rkey_read_responder",
    "bad_rkey_write_with_imm_requester",
    "bad_rkey_write_with_imm_responder",
    "bad_rkey_fetch_add_requester",
    "bad_rkey_fetch_add_responder",
    "write_beyond_mr_requester",
    "write_beyond_mr_responder",
    "send_longer_than_receive_requester",
    "send_longer_than_receive_responder",
];

/// Compiles the program into a temporary file; `None` (reported as skipped) without a
/// compiler or the header.
fn compile(test: &str) -> Option<TempFile> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    if !Path::new(HEADER).exists() {
        skip(
            test,
            &format!("{HEADER} is missing (install the Debian package libibverbs-dev)"),
        );
        return None;
    }
    let mut probe = Command::new(&cc);
    probe.arg("--version");
    if let Err(e) = run(probe, COMPILE_LIMIT) {
        skip(test, &format!("no C compiler: {e}"));
        return None;
    }
    let exe = TempFile::new("verbs-integrity", "bin");
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(exe.path())
        .arg(SOURCE)
        .arg("-libverbs");
    let out = run(cmd, COMPILE_LIMIT).unwrap_or_else(|e| panic!("{test}: {cc}: {e}"));
    assert!(
        out.status.success(),
        "{test}: {SOURCE} does not compile:\n{}{}",
        out.stdout,
        out.stderr
    );
    Some(exe)
}

/// Runs server (on `server`) and client (on `client`) with `opts`, each with
/// `UROCE_FAULTS` = the given value (if any); asserts both exit 0; returns their stdout.
fn run_pair(
    test: &str,
    exe: &TempFile,
    (server, client): (Ipv4Addr, Ipv4Addr),
    opts: &[&str],
    faults: Option<(&str, &str)>,
) -> (String, String) {
    let dir = LibDir::new(&format!("c-integrity-{test}"));
    let program = exe.path().to_str().expect("temporary path is UTF-8");
    let port = free_tcp_port();
    let mut args: Vec<String> = opts.iter().map(|s| (*s).to_owned()).collect();
    args.push(port.to_string());

    let mut server_cmd = debian_command(&dir, program, server, &args);
    // The server listens on 127.0.0.1 only, whatever its device address.
    args.push(Ipv4Addr::LOCALHOST.to_string());
    let mut client_cmd = debian_command(&dir, program, client, &args);
    if let Some((s, c)) = faults {
        server_cmd.env("UROCE_FAULTS", s);
        client_cmd.env("UROCE_FAULTS", c);
    }

    let (server_out, client_out) = run_server_client(test, server_cmd, client_cmd, port, LIMIT);
    assert_both_succeeded(test, &server_out, &client_out);
    (server_out.stdout, client_out.stdout)
}

/// Asserts that `out` holds `PASS <name>` exactly `times` times for every name of
/// `checks`, no other PASS line, and the closing count.
fn assert_passes(test: &str, who: &str, out: &str, checks: &[&str], times: usize) {
    let passes: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("PASS "))
        .collect();
    for name in checks {
        let n = passes.iter().filter(|p| *p == name).count();
        assert_eq!(
            n, times,
            "{test} {who}: `PASS {name}` printed {n} times, expected {times}:\n{out}"
        );
    }
    let unexpected: Vec<&&str> = passes.iter().filter(|p| !checks.contains(p)).collect();
    assert!(
        unexpected.is_empty(),
        "{test} {who}: unexpected checks {unexpected:?}:\n{out}"
    );
    let total = format!("ALL {} CHECKS PASSED", checks.len() * times);
    assert_eq!(
        out.lines().last().map(str::trim),
        Some(total.as_str()),
        "{test} {who}: last line:\n{out}"
    );
}

#[test]
fn c_program_verifies_data_and_access_errors() {
    const TEST: &str = "c_program_verifies_data_and_access_errors";
    let Some(exe) = compile(TEST) else {
        return;
    };
    let addrs = (Ipv4Addr::new(127, 0, 61, 2), Ipv4Addr::new(127, 0, 11, 1));
    let (s, c) = run_pair(TEST, &exe, addrs, &[], None);
    let all: Vec<&str> = DATA_CHECKS.iter().chain(ERROR_CHECKS).copied().collect();
    assert_passes(TEST, "server", &s, &all, 1);
    assert_passes(TEST, "client", &c, &all, 1);
}

#[test]
fn c_program_verifies_data_under_packet_faults() {
    const TEST: &str = "c_program_verifies_data_under_packet_faults";
    let Some(exe) = compile(TEST) else {
        return;
    };
    // Moderate rates: with retry_cnt 7 (finite per IBA) a message must not lose seven
    // retries in a row, which these rates make vanishingly unlikely.
    const FAULTS: &str = "drop=0.02,dup=0.02,reorder=0.02,corrupt=0.005";
    let (fs, fc) = (format!("{FAULTS},seed=11"), format!("{FAULTS},seed=12"));
    let addrs = (Ipv4Addr::new(127, 0, 61, 4), Ipv4Addr::new(127, 0, 11, 3));
    let rounds = 3;
    let (s, c) = run_pair(
        TEST,
        &exe,
        addrs,
        &["-d", "-n", &rounds.to_string()],
        Some((&fs, &fc)),
    );
    assert_passes(TEST, "server", &s, DATA_CHECKS, rounds);
    assert_passes(TEST, "client", &c, DATA_CHECKS, rounds);
}
