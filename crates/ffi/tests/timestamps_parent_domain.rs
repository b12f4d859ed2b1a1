//! Completion timestamps and parent domains through the C API, each a C program compiled
//! against the system header and run against the library:
//!
//! * `tests/c/cq_timestamps.c`: `hca_core_clock` and `completion_timestamp_mask` of
//!   `ibv_query_device_ex` non-zero, `ibv_query_rt_values_ex`'s raw clock advancing at
//!   `hca_core_clock`, every completion's cycle and wall-clock stamps inside the window of
//!   clock reads around its post and poll, stamps never decreasing along a CQ (also after
//!   completions taken with `ibv_poll_cq`), no timestamp accessors without the flags.
//! * `tests/c/parent_domain.c`: a thread domain and a parent domain with custom allocators;
//!   RC QPs (`ibv_create_qp` and `ibv_create_qp_ex`), MRs and extended CQs
//!   (`IBV_CQ_INIT_ATTR_MASK_PD`) made on it carry SEND and RDMA WRITE data intact; the
//!   busy rules (`EBUSY`, also for the extended CQs and a memory window made through the
//!   parent domain) and the teardown in order.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

/// Runs `file` and checks that it printed `PASS <check>` for each of `checks`.
fn run(test: &str, file: &str, addr: Ipv4Addr, checks: &[&str]) {
    let Some(exe) = compile_c(test, file, &[]) else {
        return;
    };
    let out = run_c_program(test, &exe, addr, &[], Duration::from_secs(60));
    for check in checks {
        assert!(
            out.stdout
                .lines()
                .any(|l| l == format!("PASS {check}") || l.starts_with(&format!("PASS {check} "))),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}

#[test]
fn completion_timestamps_follow_the_device_clock() {
    run(
        "completion_timestamps_follow_the_device_clock",
        "cq_timestamps.c",
        Ipv4Addr::new(127, 0, 43, 1),
        &["core_clock", "create", "window", "monotonic", "teardown"],
    );
}

#[test]
fn parent_domains_carry_data_end_to_end() {
    run(
        "parent_domains_carry_data_end_to_end",
        "parent_domain.c",
        Ipv4Addr::new(127, 0, 44, 1),
        &[
            "alloc",
            "objects",
            "traffic",
            "busy",
            "busy_cq_mw",
            "teardown",
        ],
    );
}
