//! The scaling benchmark `bench/mt_post_poll.c` (see `docs/BENCHMARKS.md`), run briefly as
//! a test: two threads, each with its own RC QP pair and CQ on one device, a few thousand
//! SENDs (checked on arrival: order, length, bytes) and then RDMA WRITEs (checked in the
//! target buffer), each posted with `ibv_post_send` and then through the `ibv_wr_*` API;
//! then the call modes, which take the network out (two threads, each repeating data-path
//! calls on its own objects: `ibv_poll_cq` of an empty CQ, `ibv_req_notify_cq`,
//! `ibv_post_recv` on a QP in the Error state + `ibv_poll_cq` of its flush completion, and
//! `ibv_wr_start`/`ibv_wr_send`/`ibv_wr_set_sge`/`ibv_wr_abort`). The test checks what
//! the program verified (completions, data, flush statuses and work request ids, nothing
//! posted by an aborted list) and the counts it reports — never the timing.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c_file, run_c_program};

/// Messages per thread.
const MESSAGES: u64 = 3000;

/// Iterations per thread of the call modes.
const ITERATIONS: u64 = 20000;

#[test]
fn mt_post_poll_completes_and_checks_data() {
    let test = "mt_post_poll_completes_and_checks_data";
    let Some(exe) = compile_c_file(test, "bench/mt_post_poll.c", &["-lpthread"]) else {
        return;
    };
    for (op, addr) in [
        ("send", Ipv4Addr::new(127, 0, 57, 3)),
        ("write", Ipv4Addr::new(127, 0, 57, 4)),
        ("wr_send", Ipv4Addr::new(127, 0, 57, 5)),
        ("wr_write", Ipv4Addr::new(127, 0, 57, 6)),
    ] {
        let out = run_c_program(
            test,
            &exe,
            addr,
            &["2", &MESSAGES.to_string(), op],
            Duration::from_secs(120),
        );
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with("threads="))
            .unwrap_or_else(|| panic!("{op}: no result line in:\n{}", out.stdout));
        assert!(
            line.contains(&format!("op={op} "))
                && line.contains(&format!("messages={} ", 2 * MESSAGES)),
            "{op}: {line}"
        );
        assert!(
            out.stdout.lines().any(|l| l == "CHECK ok"),
            "{op}: the program did not verify its data:\n{}",
            out.stdout
        );
    }
}

#[test]
fn mt_call_modes_check_their_results() {
    let test = "mt_call_modes_check_their_results";
    let Some(exe) = compile_c_file(test, "bench/mt_post_poll.c", &["-lpthread"]) else {
        return;
    };
    // (mode, library calls per iteration, address)
    for (op, calls, addr) in [
        ("poll_empty", 1, Ipv4Addr::new(127, 0, 33, 7)),
        ("notify", 1, Ipv4Addr::new(127, 0, 33, 8)),
        ("recv_flush", 2, Ipv4Addr::new(127, 0, 33, 9)),
        ("wr_abort", 4, Ipv4Addr::new(127, 0, 33, 10)),
    ] {
        let out = run_c_program(
            test,
            &exe,
            addr,
            &["2", &ITERATIONS.to_string(), op],
            Duration::from_secs(120),
        );
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with("threads="))
            .unwrap_or_else(|| panic!("{op}: no result line in:\n{}", out.stdout));
        let iterations = 2 * ITERATIONS;
        assert!(
            line.starts_with(&format!(
                "threads=2 op={op} iterations={iterations} calls={} ",
                iterations * calls
            )),
            "{op}: {line}"
        );
        assert!(
            out.stdout.lines().any(|l| l == "CHECK ok"),
            "{op}: the program did not verify its results:\n{}",
            out.stdout
        );
    }
}
