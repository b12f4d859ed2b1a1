//! `uroce run -- PROGRAM`: unmodified programs on uroce's libraries with no address
//! configured (every process on the host's shared device at 127.0.0.1; with
//! `UROCE_SHARED=0`, each on its own first free 127.0.0.x), and the one-line reason when a
//! device cannot open.
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

/// The tests without an address take turns: which 127.0.0.x is free depends on the
/// devices the others hold.
static NO_ADDRESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Starts `server`, waits (bounded) until UDP `addr`:4791 is bound and a moment more for
/// its listener, runs `client`, and returns both outputs.
fn server_then_client(
    server: Command,
    client: Command,
    addr: Ipv4Addr,
) -> (uroce_testkit::Output, uroce_testkit::Output) {
    let srv = std::thread::spawn(move || run(server, Duration::from_secs(60)));
    let until = Instant::now() + Duration::from_secs(20);
    while !bound(addr) {
        assert!(
            Instant::now() < until && !srv.is_finished(),
            "the server's device did not take {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let co = run(client, Duration::from_secs(60)).expect("client");
    let so = srv.join().expect("server thread").expect("server");
    (so, co)
}

/// Asserts that `o` (the `who` of a pair) exited 0 and printed `needle`.
fn check_ok(who: &str, o: &uroce_testkit::Output, needle: &str) {
    assert!(
        o.status.success() && o.stdout.contains(needle),
        "{who} ({:?}):\n{}\n{}",
        o.status,
        o.stdout,
        o.stderr
    );
}

/// The GIDs `ibv_rc_pingpong` printed: its local one and its peer's.
fn pingpong_gids(o: &uroce_testkit::Output) -> (String, String) {
    let gid = |prefix: &str| {
        o.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .and_then(|l| l.split("GID ").nth(1))
            .map(|g| g.trim().to_string())
            .unwrap_or_default()
    };
    (gid("local address"), gid("remote address"))
}

#[test]
fn two_processes_without_addresses_share_the_device() {
    let test = "two_processes_without_addresses_share_the_device";
    if !libs_built(test) || !have(test, "/usr/bin/ucmatose") {
        return;
    }
    let _turn = NO_ADDRESS.lock().unwrap_or_else(|p| p.into_inner());
    // The rule: with nothing configured every process's device is the host's shared
    // device on 127.0.0.1, whatever else holds it (the kernel steers each datagram and
    // CM MAD to the process of its QP or connection).
    let mut server = uroce_run(&["ucmatose", "-p", "7481"]);
    server.env_remove("UROCE_SHARED");
    let mut client = uroce_run(&["ucmatose", "-s", "127.0.0.1", "-p", "7481"]);
    client.env_remove("UROCE_SHARED");
    let (so, co) = server_then_client(server, client, Ipv4Addr::LOCALHOST);
    for (who, o) in [("server", &so), ("client", &co)] {
        check_ok(who, o, "return status 0");
    }
}

#[test]
fn pingpong_without_addresses_runs_on_one_address() {
    let test = "pingpong_without_addresses_runs_on_one_address";
    if !libs_built(test) || !have(test, "/usr/bin/ibv_rc_pingpong") {
        return;
    }
    let _turn = NO_ADDRESS.lock().unwrap_or_else(|p| p.into_inner());
    let args = ["ibv_rc_pingpong", "-g", "0", "-n", "200", "-p", "18741"];
    let mut server = uroce_run(&args);
    server.env_remove("UROCE_SHARED");
    let mut client = uroce_run(&[&args[..], &["127.0.0.1"]].concat());
    client.env_remove("UROCE_SHARED");
    let (so, co) = server_then_client(server, client, Ipv4Addr::LOCALHOST);
    let one = "::ffff:127.0.0.1".to_string();
    for (who, o) in [("server", &so), ("client", &co)] {
        check_ok(who, o, "200 iters");
        // Both ends are 127.0.0.1: one device, two processes.
        assert_eq!(pingpong_gids(o), (one.clone(), one.clone()), "{who}");
    }
}

#[test]
fn unshared_devices_take_the_next_free_address() {
    let test = "unshared_devices_take_the_next_free_address";
    if !libs_built(test) || !have(test, "/usr/bin/ibv_rc_pingpong") {
        return;
    }
    let _turn = NO_ADDRESS.lock().unwrap_or_else(|p| p.into_inner());
    // UROCE_SHARED=0: each process's device binds its address alone, the first
    // 127.0.0.x (x = 1, 2, …) whose UDP 4791 is free; the client, which connects to the
    // server's, takes the next one.
    let server_addr = (1..=64u8)
        .map(|x| Ipv4Addr::new(127, 0, 0, x))
        .find(|a| !bound(*a))
        .expect("a free loopback address");
    let args = ["ibv_rc_pingpong", "-g", "0", "-n", "200", "-p", "18742"];
    let mut server = uroce_run(&args);
    server.env("UROCE_SHARED", "0");
    let srv = server_addr.to_string();
    let mut client = uroce_run(&[&args[..], &[srv.as_str()]].concat());
    client.env("UROCE_SHARED", "0");
    let (so, co) = server_then_client(server, client, server_addr);
    for (who, o) in [("server", &so), ("client", &co)] {
        check_ok(who, o, "200 iters");
    }
    let (server_local, _) = pingpong_gids(&so);
    let (client_local, client_remote) = pingpong_gids(&co);
    assert_eq!(server_local, format!("::ffff:{server_addr}"));
    assert_eq!(client_remote, server_local);
    assert!(
        client_local.starts_with("::ffff:127.0.0.") && client_local != server_local,
        "the client's device should take another 127.0.0.x: {client_local}"
    );
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
