//! The extended QP's work-request API through the C header's inlines: `tests/c/wr_api.c`
//! (compiled against the system header, run against the library) posts every RC opcode
//! in one `ibv_wr_start` … `ibv_wr_complete` list (SEND with an SGE, SEND with immediate
//! and inline data, RDMA WRITE with an SGE list, RDMA WRITE with immediate, RDMA READ,
//! both atomics, SEND with an inline data list) and checks completions, data, READ bytes
//! and the atomics' old and new values; checks that `ibv_wr_abort` and every failing list
//! (inline too long, ATOMIC WRITE, more WRs than the queue holds, a setter first, a UD
//! address on RC) post nothing; that operations outside `send_ops_flags` fail with
//! `EOPNOTSUPP` and `ibv_create_qp_ex` refuses flags the type cannot do; memory windows
//! through `ibv_wr_bind_mw`, `ibv_wr_local_inv` and `ibv_wr_send_inv` (a WRITE with an
//! invalidated key fails with `REM_ACCESS_ERR` and leaves memory untouched); SEND and
//! WRITE (with and without immediate) on UC, a memory window bound and invalidated
//! through the UC send queue (a WRITE after `ibv_wr_local_inv` is dropped, memory
//! untouched), SEND with `ibv_wr_set_ud_addr` on UD, and
//! SEND with `ibv_wr_set_xrc_srqn` from an XRC_SEND QP to an XRC SRQ. QPs of one device,
//! connected to each other over loopback.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

#[test]
fn wr_api_through_the_c_header() {
    let test = "wr_api_through_the_c_header";
    let Some(exe) = compile_c(test, "wr_api.c", &[]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 79, 3),
        &[],
        Duration::from_secs(120),
    );
    for check in [
        "rc_all_opcodes",
        "abort",
        "batch_error",
        "send_ops_flags",
        "mw_bind_local_inv",
        "mw_send_inv",
        "uc",
        "uc_mw",
        "ud",
        "xrc",
        "teardown",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == format!("PASS {check}")),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
