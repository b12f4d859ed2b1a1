//! The scaling benchmark `bench/mt_post_poll.c` (see `docs/BENCHMARKS.md`), run briefly as
//! a test: two threads, each with its own RC QP pair and CQ on one device, a few thousand
//! SENDs (checked on arrival: order, length, bytes) and then RDMA WRITEs (checked in the
//! target buffer), each posted with `ibv_post_send` and then through the `ibv_wr_*` API. The test checks the completions and the data the program verified and
//! the message count it reports — never the timing.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c_file, run_c_program};

/// Messages per thread.
const MESSAGES: u64 = 3000;

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
