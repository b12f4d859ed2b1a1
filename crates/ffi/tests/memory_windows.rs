//! Memory windows through the C API: `tests/c/memory_windows.c` (compiled against the
//! system header, run against the library) binds a type 1 window with `ibv_bind_mw` and a
//! type 2 window with an `IBV_WR_BIND_MW` work request, checks RDMA WRITEs through both
//! byte for byte, invalidates with `IBV_WR_LOCAL_INV` and with the peer's
//! `IBV_WR_SEND_WITH_INV` (the receive completion's `IBV_WC_WITH_INV` and
//! `invalidated_rkey`), checks that a WRITE with the invalidated key completes with
//! `IBV_WC_REM_ACCESS_ERR` and leaves memory untouched, that `ibv_dereg_mr` of a region
//! with bound windows fails with `EBUSY`, and that `ibv_dealloc_mw` of a bound window
//! succeeds. Two RC QPs of one device, connected to each other.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

#[test]
fn memory_windows_through_the_c_api() {
    let test = "memory_windows_through_the_c_api";
    let Some(exe) = compile_c(test, "memory_windows.c", &[]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 78, 7),
        &[],
        Duration::from_secs(60),
    );
    for check in [
        "type1_bind_write",
        "type2_bind_write",
        "local_inv",
        "dereg_busy",
        "send_with_inv",
        "write_after_invalidate",
        "teardown",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == format!("PASS {check}")),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
