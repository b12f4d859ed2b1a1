//! Extended CQs and stale handles through the C API: `tests/c/cq_ex.c` (compiled against
//! the system header, run against the library) checks every `ibv_wc_read_*` accessor of
//! `ibv_create_cq_ex` CQs against what `ibv_poll_cq` reports for the same completion (RC
//! SEND with immediate, RDMA WRITE with immediate, RECV, an error completion), the data
//! that arrived, the refusals at create (`EOPNOTSUPP`/`EINVAL` as rxe gives them),
//! `ENOENT` on an empty CQ, `ibv_next_poll` in order, completion events of an extended CQ,
//! and that QP, CQ, extended CQ and SRQ handles passed again after their destroy are
//! refused (`EINVAL`, -1) rather than crashing.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

#[test]
fn extended_cq_accessors_and_stale_handles() {
    let test = "extended_cq_accessors_and_stale_handles";
    let Some(exe) = compile_c(test, "cq_ex.c", &[]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 33, 1),
        &[],
        Duration::from_secs(60),
    );
    for check in [
        "refusals",
        "empty_enoent",
        "send_with_imm",
        "rdma_write_with_imm",
        "recv",
        "next_poll",
        "cq_event",
        "error_completion",
        "stale_handles",
        "teardown",
    ] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l == format!("PASS {check}") || l.starts_with(&format!("PASS {check} "))),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
