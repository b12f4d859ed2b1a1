//! Shared contexts through the C API: `tests/c/import.c` (compiled against the system
//! header, run against the library) imports a device from a duplicate of a context's
//! `cmd_fd` (`ibv_import_device`), its PD and MR by handle (`ibv_import_pd`,
//! `ibv_import_mr`), creates a QP, a CQ and a second MR on the imported objects and runs
//! RDMA WRITEs both ways with the data checked (the imported MR's rkey as the target, its
//! lkey as a source); once closing the original context first (traffic goes on, the
//! device file is imported again, the objects are destroyed through imported handles and
//! the original handles then refuse with `EINVAL`), once the imported one first (unimport,
//! the original objects unchanged). Also the refusals: an unknown handle (`ENOENT`), an
//! MR imported under another PD, a descriptor that is not a uroce context (a pipe, -1:
//! `EINVAL`), a context of another process (a forked child: `EOPNOTSUPP`), and the very
//! `cmd_fd` of a live context (the import gets a descriptor of its own).

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

#[test]
fn import_device_pd_and_mr() {
    let test = "import_device_pd_and_mr";
    let Some(exe) = compile_c(test, "import.c", &[]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 53, 9),
        &[],
        Duration::from_secs(60),
    );
    for check in [
        "original_first_import",
        "original_first_traffic",
        "original_first_after_close",
        "original_first_teardown",
        "imported_first_import",
        "imported_first_traffic",
        "imported_first_teardown",
        "unknown_handle",
        "not_a_context",
        "other_process",
        "same_descriptor",
        "done",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == format!("PASS {check}")),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
