//! UD multicast through the C API: `tests/c/mcast.c` (compiled against the system header,
//! run against the library) checks the device's multicast limits, the refusals of
//! `ibv_attach_mcast` / `ibv_detach_mcast` (RC QP, unicast GID, detach without attach),
//! delivery of a datagram to the multicast GID (remote QPN 0xFFFFFF) to both attached QPs
//! of the device, and that a detached QP no longer receives.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};

#[test]
fn attach_send_detach_through_the_c_api() {
    let test = "attach_send_detach_through_the_c_api";
    let Some(exe) = compile_c(test, "mcast.c", &[]) else {
        return;
    };
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 41, 5),
        &[],
        Duration::from_secs(60),
    );
    for check in [
        "device_attr",
        "refusals",
        "attach",
        "both_members",
        "detach",
        "teardown",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == format!("PASS {check}")),
            "no PASS {check} in:\n{}",
            out.stdout
        );
    }
}
