//! IBA 1.5 ATOMIC WRITE through the C API: `tests/c/atomic_write.c` (compiled against the
//! system header, run against the library) posts it with `ibv_wr_atomic_write` and with
//! `IBV_WR_ATOMIC_WRITE` through `ibv_post_send` (the 8 bytes from the SGE list) between
//! two RC QPs of one device and checks the target's 8 bytes and the completion
//! (`IBV_WC_ATOMIC_WRITE`, `byte_len` 8), a wrong length refused at post with `EINVAL`, a
//! misaligned address (`IBV_WC_REM_INV_REQ_ERR`) and a region without remote write access
//! (`IBV_WC_REM_ACCESS_ERR`) leaving memory untouched, and the `send_ops_flags` rules
//! (`EOPNOTSUPP` on UC and for a QP created without the flag).

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

#[test]
fn atomic_write_through_the_c_api() {
    let test = "atomic_write_through_the_c_api";
    let Some(exe) = compile_c(test, "atomic_write.c", &[]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 47, 1),
        &[],
        Duration::from_secs(60),
    );
    for check in [
        "wr_atomic_write",
        "post_send",
        "inline",
        "wrong_length",
        "misaligned",
        "no_remote_write",
        "send_ops",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == format!("PASS {check}")),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
