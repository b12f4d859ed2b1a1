//! Unmodified programs, server and client, on ONE address: the shared device, uroce's
//! default (docs/ARCHITECTURE.md "Shared devices"; `UROCE_SHARED` is removed from each
//! program's environment, so the tests see what a user gets). Each process runs under
//! `uroce run` with the same `UROCE_ADDR`; their devices join the host-wide device on that
//! address (one UDP 4791 shared through SO_REUSEPORT, a slot each from the host registry,
//! datagrams and CM MADs steered to the member that owns the QPN / comm ID).
//!
//! * `ibv_rc_pingpong` server and client (verbs, out-of-band TCP exchange);
//! * `rping` server and client (librdmacm: the CM handshake between two members), and a
//!   second `rping` server on the same port refused (`EADDRINUSE`);
//! * perftest's `ib_write_lat`;
//! * four `ibv_rc_pingpong` pairs, eight processes, at once on one address.
//!
//! Each test has its own address (127.0.91.x), its own TCP / rdma_cm ports and its own
//! `UROCE_HOST_DIR` (so its own registry), so the tests run in parallel with each other and
//! with the other test files. Without the C libraries next to `uroce` or the programs, a
//! test is skipped (failing under `UROCE_REQUIRE_TOOLS=1`).

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_testkit::{run, skip, Output};

mod support;
use support::libs_built;
use support::shared::{
    bound, check_ok, check_pingpong, free_tcp_port, have, listening, shared_run, strings, TestDir,
};

const LIMIT: Duration = Duration::from_secs(90);

type Server = std::thread::JoinHandle<Result<Output, String>>;

/// Starts `cmd` in a thread, bounded by [`LIMIT`].
fn start(cmd: Command) -> Server {
    std::thread::spawn(move || run(cmd, LIMIT))
}

/// Waits (at most 30 s) until `ready()`; panics if the server ended first or never got ready.
fn wait_ready(test: &str, server: &Server, ready: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(
            !server.is_finished(),
            "{test}: the server ended before it was ready"
        );
        assert!(
            Instant::now() < until,
            "{test}: the server was not ready in 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `ibv_rc_pingpong` pair on `addr`: starts the server, waits until it listens on its
/// TCP port, runs the client; returns (server, client).
fn pingpong_pair(test: &str, addr: Ipv4Addr, host: &TestDir, iters: u32) -> (Output, Output) {
    let port = free_tcp_port();
    let args = strings(&[
        "ibv_rc_pingpong",
        "-g",
        "0",
        "-n",
        &iters.to_string(),
        "-p",
        &port.to_string(),
    ]);
    let server = start(shared_run(addr, host, &args));
    wait_ready(test, &server, || listening(port));
    let mut cargs = args.clone();
    cargs.push(addr.to_string());
    let client =
        run(shared_run(addr, host, &cargs), LIMIT).unwrap_or_else(|e| panic!("{test} client: {e}"));
    let server = server
        .join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("{test} server: {e}"));
    (server, client)
}

#[test]
fn rc_pingpong_server_and_client_on_one_address() {
    let test = "rc_pingpong_server_and_client_on_one_address";
    if !libs_built(test) || !have(test, "/usr/bin/ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let addr = Ipv4Addr::new(127, 0, 91, 1);
    let host = TestDir::new("hostdir");
    let (s, c) = pingpong_pair(test, addr, &host, 50);
    check_pingpong(test, "server", &s, addr, 50);
    check_pingpong(test, "client", &c, addr, 50);
    // The devices joined through this test's registry (not each a device of its own).
    let joined = std::fs::read_dir(host.path())
        .expect("the host registry directory")
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("host-registry-")
        });
    assert!(joined, "{test}: no host registry in {:?}", host.path());
}

#[test]
fn rping_server_and_client_on_one_address() {
    let test = "rping_server_and_client_on_one_address";
    if !libs_built(test) || !have(test, "/usr/bin/rping", "rdmacm-utils") {
        return;
    }
    let addr = Ipv4Addr::new(127, 0, 91, 2);
    let host = TestDir::new("hostdir");
    let port = free_tcp_port().to_string();
    let a = addr.to_string();
    let count = 10;
    let c_arg = count.to_string();
    let server = start(shared_run(
        addr,
        &host,
        &strings(&["rping", "-s", "-a", &a, "-p", &port, "-C", &c_arg, "-v"]),
    ));
    // The device binds the address when it opens; rping listens right after.
    wait_ready(test, &server, || bound(addr));
    std::thread::sleep(Duration::from_millis(500));
    // A second server on the same port: the port is the first one's on this host, as
    // with the kernel's CM (EADDRINUSE), rather than a listener nothing reaches.
    let second = run(
        shared_run(
            addr,
            &host,
            &strings(&["rping", "-s", "-a", &a, "-p", &port, "-C", &c_arg, "-v"]),
        ),
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{test} second server: {e}"));
    assert!(
        !second.status.success()
            && format!("{}{}", second.stdout, second.stderr).contains("Address already in use"),
        "{test}: a second listener on the port must fail: {second:?}"
    );
    let client = run(
        shared_run(
            addr,
            &host,
            &strings(&["rping", "-c", "-a", &a, "-p", &port, "-C", &c_arg, "-v"]),
        ),
        LIMIT,
    )
    .unwrap_or_else(|e| panic!("{test} client: {e}"));
    let server = server
        .join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("{test} server: {e}"));
    check_ok(test, "server", &server);
    check_ok(test, "client", &client);
    // Ping i carries the 62-character pattern that starts at 'A' + i.
    for i in 0..count {
        let line = format!("ping data: rdma-ping-{i}: ");
        let first = (b'A' + i as u8) as char;
        for (who, o) in [("server", &server), ("client", &client)] {
            let found = o
                .stdout
                .lines()
                .find(|l| l.contains(&line))
                .unwrap_or_else(|| panic!("{test} {who}: no `{line}`:\n{}", o.stdout));
            let pattern = &found[found.find(&line).unwrap_or(0) + line.len()..];
            assert!(
                pattern.starts_with(first),
                "{test} {who}: ping {i} is `{pattern}`"
            );
        }
    }
}

#[test]
fn ib_write_lat_on_one_address() {
    let test = "ib_write_lat_on_one_address";
    if !libs_built(test) || !have(test, "/usr/bin/ib_write_lat", "perftest") {
        return;
    }
    let addr = Ipv4Addr::new(127, 0, 91, 3);
    let host = TestDir::new("hostdir");
    let port = free_tcp_port();
    let args = strings(&[
        "ib_write_lat",
        "-d",
        "uroce0",
        "-x",
        "0",
        "-n",
        "200",
        "-p",
        &port.to_string(),
    ]);
    let server = start(shared_run(addr, &host, &args));
    wait_ready(test, &server, || listening(port));
    let mut cargs = args.clone();
    cargs.push(addr.to_string());
    let client = run(shared_run(addr, &host, &cargs), LIMIT)
        .unwrap_or_else(|e| panic!("{test} client: {e}"));
    let server = server
        .join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("{test} server: {e}"));
    for (who, o) in [("server", &server), ("client", &client)] {
        check_ok(test, who, o);
        // The result row: "#bytes #iterations …" then " 2 200 …".
        let row = o.stdout.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 2 && w[0] == "2" && w[1] == "200"
        });
        assert!(
            row,
            "{test} {who}: no result row for 200 iterations:\n{}",
            o.stdout
        );
    }
}

#[test]
fn four_rc_pingpong_pairs_at_once_on_one_address() {
    let test = "four_rc_pingpong_pairs_at_once_on_one_address";
    if !libs_built(test) || !have(test, "/usr/bin/ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let addr = Ipv4Addr::new(127, 0, 91, 4);
    let host = std::sync::Arc::new(TestDir::new("hostdir"));
    let pairs: Vec<_> = (0..4)
        .map(|_| {
            let host = host.clone();
            std::thread::spawn(move || pingpong_pair(test, addr, &host, 100))
        })
        .collect();
    for (i, p) in pairs.into_iter().enumerate() {
        let (s, c) = p
            .join()
            .unwrap_or_else(|_| panic!("{test}: pair {i} failed"));
        check_pingpong(test, &format!("server {i}"), &s, addr, 100);
        check_pingpong(test, &format!("client {i}"), &c, addr, 100);
    }
}

/// A process that opens the device and forks a child that does not `exec` (Python's
/// `multiprocessing`, forking servers), then closes its device and exits while the child
/// lives on. The child must not keep the member socket (`uroce_socket::fork`): the socket
/// closes with its member, and two new processes on the address talk (with the socket
/// kept alive by the child, the kernel's group would still hold it at the index the
/// registry gave a new member, and their datagrams would go to it).
#[test]
fn a_forked_child_does_not_keep_the_member_socket() {
    let test = "a_forked_child_does_not_keep_the_member_socket";
    const PYTHON: &str = "/usr/bin/python3";
    if !libs_built(test)
        || !have(test, "/usr/bin/ibv_rc_pingpong", "ibverbs-utils")
        || !have(test, PYTHON, "python3")
    {
        return;
    }
    let has_pyverbs = Command::new(PYTHON)
        .args(["-c", "import pyverbs.device"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pyverbs {
        skip(test, "pyverbs is missing (install python3-pyverbs)");
        return;
    }
    let addr = Ipv4Addr::new(127, 0, 91, 5);
    let host = TestDir::new("hostdir");
    // The child sleeps (bounded) and exits; the parent prints the child's pid once its
    // device is closed and exits at once.
    let script = "import os, sys, time\n\
                  from pyverbs.device import Context\n\
                  ctx = Context(name='uroce0')\n\
                  pid = os.fork()\n\
                  if pid == 0:\n    time.sleep(60)\n    os._exit(0)\n\
                  ctx.close()\n\
                  print('child', pid, flush=True)\n\
                  os._exit(0)\n";
    let o = run(
        shared_run(addr, &host, &strings(&[PYTHON, "-c", script])),
        LIMIT,
    )
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    check_ok(test, "parent", &o);
    let child: i32 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{test}: no child pid:\n{}\n{}", o.stdout, o.stderr));
    let alive = || Path::new(&format!("/proc/{child}")).exists();
    assert!(alive(), "{test}: the child ended early");
    let bound_now = bound(addr);
    let pair = (!bound_now).then(|| pingpong_pair(test, addr, &host, 100));
    let still_alive = alive();
    let _ = Command::new("kill").arg(child.to_string()).status();
    assert!(
        !bound_now,
        "{test}: {addr}:4791 is still bound after its only member closed (the forked child \
         kept the socket)"
    );
    assert!(still_alive, "{test}: the child ended before the pair ran");
    if let Some((s, c)) = pair {
        check_pingpong(test, "server", &s, addr, 100);
        check_pingpong(test, "client", &c, addr, 100);
    }
}
