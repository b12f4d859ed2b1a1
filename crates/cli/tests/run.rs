//! `uroce run -- PROGRAM`: unmodified rdmacm-utils programs on uroce's libraries with no
//! address configured, and the one-line reason when a device cannot open.
//!
//! `uroce run` finds `liburoce_ffi.so` and `liburoce_ffi_rdmacm.so` next to the `uroce`
//! binary; scripts/test builds them (`cargo build -p uroce-ffi -p uroce-ffi-rdmacm`) before
//! the tests. Without them, or without rdmacm-utils / ibverbs-utils, the tests are skipped
//! (failing under `UROCE_REQUIRE_TOOLS=1`). This file is its own test binary, so no other
//! test of this crate holds a loopback device meanwhile.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_testkit::{run, skip};

mod support;
use support::libs_built;

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");

fn have(test: &str, program: &str) -> bool {
    if Path::new(program).exists() {
        return true;
    }
    skip(
        test,
        &format!("{program} is missing (install rdmacm-utils / ibverbs-utils)"),
    );
    false
}

/// Whether UDP `addr`:4791 is bound on this host.
fn bound(addr: Ipv4Addr) -> bool {
    let want = format!("{:08X}:12B7", u32::from_le_bytes(addr.octets()));
    std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&want))
    })
}

fn uroce_run(args: &[&str]) -> Command {
    let mut c = Command::new(UROCE);
    c.arg("run")
        .arg("--")
        .args(args)
        .env_remove("UROCE_ADDR")
        .env_remove("UROCE_FAULTS");
    c
}

#[test]
fn two_processes_without_addresses() {
    let test = "two_processes_without_addresses";
    if !libs_built(test) || !have(test, "/usr/bin/ucmatose") {
        return;
    }
    // The rule: a device takes the first 127.0.0.x (x = 1, 2, …) whose UDP 4791 is free.
    // Usually the server gets 127.0.0.1; if another process holds it, the next one.
    let server = (1..=64u8)
        .map(|x| Ipv4Addr::new(127, 0, 0, x))
        .find(|a| !bound(*a))
        .expect("a free loopback address");
    let srv = std::thread::spawn(|| {
        run(
            uroce_run(&["ucmatose", "-p", "7481"]),
            Duration::from_secs(60),
        )
    });
    let until = Instant::now() + Duration::from_secs(20);
    while !bound(server) {
        assert!(
            Instant::now() < until && !srv.is_finished(),
            "the server's device did not take {server}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let co = run(
        uroce_run(&["ucmatose", "-s", &server.to_string(), "-p", "7481"]),
        Duration::from_secs(60),
    )
    .expect("client");
    let so = srv.join().expect("server thread").expect("server");
    for (who, o) in [("server", &so), ("client", &co)] {
        assert!(
            o.status.success() && o.stdout.contains("return status 0"),
            "{who} ({:?}):\n{}\n{}",
            o.status,
            o.stdout,
            o.stderr
        );
    }
}

#[test]
fn unusable_address_is_explained_in_one_line() {
    let test = "unusable_address_is_explained_in_one_line";
    if !libs_built(test) || !have(test, "/usr/bin/ibv_devinfo") {
        return;
    }
    // 192.0.2.1 (TEST-NET-1) is not an address of this host.
    let mut c = uroce_run(&["ibv_devinfo"]);
    c.env("UROCE_ADDR", "192.0.2.1");
    let o = run(c, Duration::from_secs(30)).expect("ibv_devinfo");
    assert!(!o.status.success(), "ibv_devinfo succeeded:\n{}", o.stdout);
    let lines: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("uroce:"))
        .collect();
    assert_eq!(lines.len(), 1, "stderr:\n{}", o.stderr);
    assert!(
        lines[0].contains("192.0.2.1") && lines[0].contains("not an address of this host"),
        "{}",
        lines[0]
    );
}

#[test]
fn missing_program_fails() {
    let test = "missing_program_fails";
    if !libs_built(test) {
        return;
    }
    let o = run(
        uroce_run(&["/nonexistent/program"]),
        Duration::from_secs(30),
    )
    .expect("uroce");
    assert!(!o.status.success());
    assert!(o.stderr.contains("/nonexistent/program"), "{}", o.stderr);
}
