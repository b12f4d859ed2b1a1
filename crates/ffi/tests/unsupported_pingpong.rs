//! The unmodified Debian `ibv_xsrq_pingpong` (package ibverbs-utils) needs XRC domains,
//! which uroce does not provide. Run against uroce's cdylib presented as
//! `libibverbs.so.1` through `LD_LIBRARY_PATH` (server and client at once, `-g 0`, one
//! uroce device on 127.0.14.x per process), it must fail cleanly: no crash, no hang, the
//! program's own error message. (`ibv_uc_pingpong` and `ibv_ud_pingpong` run:
//! `uc_pingpong.rs`, `ud_pingpong.rs`.)
//!
//! Expectations come from the program's documented behaviour and the verbs header, not
//! from uroce. The program sets up its verbs objects before it opens its TCP connection,
//! prints its error on stderr when a setup step fails and returns 1 from `main` having
//! printed nothing on stdout:
//! - `ibv_xsrq_pingpong`: "Couldn't Open the XRC Domain <errno>" when `ibv_open_xrcd`
//!   fails; that function is inline in `<infiniband/verbs.h>` and reports `EOPNOTSUPP`
//!   when the context's `open_xrcd` op is absent. (The program also creates
//!   `/tmp/xrc_domain` first and leaves it behind; it may warn, without stopping, when it
//!   cannot.)
//!
//! So each side must exit with status 1 within the time limit (not be killed by a
//! signal, not be stopped by the test), and print nothing but the program's own messages:
//! no loader error for a missing symbol, no panic text or diagnostics from the library.
//! The library must also define every `IBVERBS_*` symbol the binaries import (read with
//! `readelf`). Without the tools the tests are skipped, or fail under
//! `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt as _;
use std::time::{Duration, Instant};

mod support;

use support::{
    assert_library_defines_imports, debian_command, free_tcp_port, have_program, LibDir,
};
use uroce_testkit::{run, Output};

const XSRQ: &str = "/usr/bin/ibv_xsrq_pingpong";
/// Per-process limit: a setup failure takes milliseconds; a process still running after
/// this long hangs.
const LIMIT: Duration = Duration::from_secs(20);
/// The warning `ibv_xsrq_pingpong` prints, and goes on, when it cannot create
/// `/tmp/xrc_domain` (it appends an errno value).
const XRC_FILE_WARNING: &str = "Couldn't create the file for the XRC Domain but not stopping";

/// Runs `program` as server and as client at the same time with `extra` options; returns
/// `(who, result)` for both.
fn run_both(
    test: &str,
    program: &str,
    server: Ipv4Addr,
    client: Ipv4Addr,
    extra: &[&str],
) -> Vec<(&'static str, Result<Output, String>)> {
    let dir = LibDir::new(&format!("unsupported-{test}"));
    let port = free_tcp_port();
    let mut args: Vec<String> = vec!["-g".into(), "0".into(), "-p".into(), port.to_string()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let server_cmd = debian_command(&dir, program, server, &args);
    let mut client_args = args.clone();
    client_args.push(server.to_string());
    let client_cmd = debian_command(&dir, program, client, &client_args);

    let start = Instant::now();
    let server_thread = std::thread::spawn(move || run(server_cmd, LIMIT));
    let client_result = run(client_cmd, LIMIT);
    let server_result = server_thread.join().expect("server thread");
    eprintln!("{test}: both finished in {:?}", start.elapsed());
    vec![("server", server_result), ("client", client_result)]
}

/// Checks that `program` failed cleanly on both sides: exit status 1, stdout empty, and
/// every stderr line either `expected` (which must appear) or one of `tolerated`.
fn assert_clean_failure(
    test: &str,
    results: Vec<(&str, Result<Output, String>)>,
    expected: &str,
    tolerated: &[&str],
) {
    for (who, result) in results {
        let out = result.unwrap_or_else(|e| panic!("{test} {who} did not fail cleanly: {e}"));
        let report = format!(
            "{test} {who} ({:?}):\nstdout:\n{}\nstderr:\n{}",
            out.status, out.stdout, out.stderr
        );
        assert_eq!(out.status.signal(), None, "killed by a signal: {report}");
        assert_eq!(out.status.code(), Some(1), "exit status: {report}");
        assert!(
            out.stderr.lines().any(|l| l.trim() == expected),
            "no {expected:?} line: {report}"
        );
        let unexpected: Vec<&str> = out
            .stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && *l != expected)
            .filter(|l| !tolerated.iter().any(|t| l.starts_with(t)))
            .collect();
        assert!(
            unexpected.is_empty(),
            "unexpected stderr lines {unexpected:?}: {report}"
        );
        assert!(out.stdout.trim().is_empty(), "unexpected stdout: {report}");
    }
}

#[test]
fn library_defines_every_symbol_the_programs_import() {
    const TEST: &str = "library_defines_every_symbol_the_programs_import";
    if !have_program(TEST, XSRQ) {
        return;
    }
    assert_library_defines_imports(TEST, XSRQ, 15, &[]);
}

#[test]
fn debian_xsrq_pingpong_fails_cleanly() {
    const TEST: &str = "debian_xsrq_pingpong_fails_cleanly";
    if !have_program(TEST, XSRQ) {
        return;
    }
    let results = run_both(
        TEST,
        XSRQ,
        Ipv4Addr::new(127, 0, 14, 6),
        Ipv4Addr::new(127, 0, 14, 5),
        &[],
    );
    let expected = format!("Couldn't Open the XRC Domain {}", libc::EOPNOTSUPP);
    assert_clean_failure(TEST, results, &expected, &[XRC_FILE_WARNING]);
}
