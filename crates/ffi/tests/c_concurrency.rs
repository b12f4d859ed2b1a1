//! Multi-threaded use of the C API in one process: `tests/c/concurrency.c` (compiled against
//! the system header, run against the library) connects RC QP pairs of one device, all
//! sharing one send CQ and one receive CQ, and checks, each phase under an alarm so that a
//! hang fails:
//! - `event_mode`: four poster threads while one CQ thread waits in `ibv_get_cq_event`,
//!   acknowledges, re-arms and drains: every message arrives exactly once, in order per
//!   stream, with its length and bytes; send and receive queues complete in posting order;
//! - `busy_poll`: the same with a busy-polling CQ thread and two threads posting on one QP
//!   (`ibv_post_send` is thread safe);
//! - destroy under load: an rping-style event thread is cancelled while traffic flows
//!   (`cancel_under_load`); a pair moved to ERR under its posters has every posted WR
//!   completed once, as success or `IBV_WC_WR_FLUSH_ERR`, and is destroyed while the others
//!   carry on and a thread polls the shared CQs; a receiver destroyed while its sender
//!   still sends to it fails exactly one send, the rest flushed (`destroy_qp_under_load`,
//!   `flush_under_load`); `ibv_destroy_cq` gives `EBUSY` while QPs use the CQ
//!   (`destroy_cq_busy`) and 0 once they are gone (`destroy_after_load`);
//! - `refused_destroy`: a refused `ibv_destroy_cq` / `ibv_destroy_srq` / `ibv_dealloc_pd`
//!   (`EBUSY`) never makes the object vanish for a thread using it meanwhile.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

/// Messages each poster thread sends in the two traffic phases.
const MESSAGES: &str = "2000";

#[test]
fn concurrent_posters_pollers_and_destroys() {
    let test = "concurrent_posters_pollers_and_destroys";
    let Some(exe) = compile_c(test, "concurrency.c", &["-lpthread"]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 16, 1),
        &[MESSAGES],
        Duration::from_secs(120),
    );
    for check in [
        "event_mode",
        "busy_poll",
        "cancel_under_load",
        "destroy_qp_under_load",
        "destroy_cq_busy",
        "flush_under_load",
        "destroy_after_load",
        "refused_destroy",
        "teardown",
    ] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with(&format!("PASS {check} ")) || l == format!("PASS {check}")),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
