//! Asynchronous events and cancellable waits through the C API: `tests/c/async_events.c`
//! (compiled against the system header, run against the library) connects two RC QPs of
//! one device and checks that the first packet reaching the QP left in RTR raises
//! `IBV_EVENT_COMM_EST` naming that QP (IBA 11.6.3), that a non-blocking `async_fd` with
//! nothing pending gives `EAGAIN`, and that threads blocked in `ibv_get_async_event` and
//! `ibv_get_cq_event` end when cancelled with `pthread_cancel` (as rping's CQ thread is),
//! rather than hanging or aborting the process.

use std::process::Command;
use std::time::Duration;

mod support;

use support::{compile_c, LibDir};
use uroce_testkit::run;

#[test]
fn async_events_and_cancellable_waits() {
    let test = "async_events_and_cancellable_waits";
    let Some(exe) = compile_c(test, "async_events.c", &["-lpthread"]) else {
        return;
    };
    let dir = LibDir::new("async-events");
    let mut cmd = Command::new(exe.path());
    cmd.env("LD_LIBRARY_PATH", &dir.0)
        .env("UROCE_ADDR", "127.0.9.5")
        .env_remove("UROCE_FAULTS");
    let out = run(cmd, Duration::from_secs(60)).expect("run the program");
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
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
