//! Asynchronous events and cancellable waits through the C API: `tests/c/async_events.c`
//! (compiled against the system header, run against the library) connects two RC QPs of
//! one device and checks that the first packet reaching the QP left in RTR raises
//! `IBV_EVENT_COMM_EST` naming that QP (IBA 11.6.3), that a non-blocking `async_fd` with
//! nothing pending gives `EAGAIN`, and that threads blocked in `ibv_get_async_event` and
//! `ibv_get_cq_event` end when cancelled with `pthread_cancel` (as rping's CQ thread is),
//! rather than hanging or aborting the process. `tests/c/ctx_events.c` checks that two
//! `ibv_open_device` handles have their own event queues: a QP's event makes only its
//! creator's `async_fd` readable and is returned only there.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

#[test]
fn async_events_and_cancellable_waits() {
    let test = "async_events_and_cancellable_waits";
    let Some(exe) = compile_c(test, "async_events.c", &["-lpthread"]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 53, 5),
        &[],
        Duration::from_secs(60),
    );
    for check in [
        "nonblocking_empty",
        "comm_est",
        "cancel_async_event",
        "cancel_cq_event",
        "teardown",
    ] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with(&format!("PASS {check}"))),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}

#[test]
fn each_context_gets_its_own_events() {
    let test = "each_context_gets_its_own_events";
    let Some(exe) = compile_c(test, "ctx_events.c", &[]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 53, 2),
        &[],
        Duration::from_secs(60),
    );
    for check in [
        "own_async_fd",
        "first_to_second",
        "second_to_first",
        "teardown",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == format!("PASS {check}")),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
