//! The unmodified Debian `ibv_xsrq_pingpong` (package ibverbs-utils) runs between
//! processes against uroce's cdylib presented as `libibverbs.so.1` through
//! `LD_LIBRARY_PATH` (one uroce device on 127.0.14.x per process, `-g 0`). The program
//! opens an XRC domain on the file `/tmp/xrc_domain` (`ibv_open_xrcd` with `O_CREAT`),
//! creates an XRC SRQ (`ibv_create_srq_ex`) whose CQ is its receive CQ, one XRC_RECV QP
//! (`ibv_create_qp_ex` in the domain) and one XRC_SEND QP per client, exchanges QPNs, PSNs
//! and SRQ numbers (`ibv_get_srq_num`) over TCP, then ping-pongs: every SEND names the
//! peer's SRQ in `qp_type.xrc.remote_srqn`, lands in that SRQ through the peer's target QP
//! and completes on the peer's receive CQ. At the end it destroys both QPs, the SRQ, and
//! closes the domain (`ibv_close_xrcd`).
//!
//! Runs: the default (4096 bytes, 5 round trips), `-s 1`, `-n 1000`, event mode (`-e`),
//! messages of many packets (`-s 100000`), a server with two clients (`-c 2`), and a
//! server and client on one address with and without `UROCE_XRC_SRQ_SLOTS=1`
//! (127.0.14.21-22).
//!
//! Expectations come from the program's documented behaviour, not from uroce: every
//! process exits 0 and prints "success" last; what each side prints as its peer's
//! address ("remote: …": QPNs, PSN, SRQ number, GID) equals what the peer printed as its
//! own ("local: …"). Without the tools the test is skipped, or fails under
//! `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{
    assert_both_succeeded, assert_library_defines_imports, debian_command, free_tcp_port,
    have_program, listening, run_server_client, LibDir,
};
use uroce_testkit::{run, Output};

const PROGRAM: &str = "/usr/bin/ibv_xsrq_pingpong";
/// Per-process limit (each run takes well under a second alone).
const LIMIT: Duration = Duration::from_secs(60);

fn addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 14, n)
}

/// The address lines a process printed: (`local` lines, `remote` lines), each without
/// its label.
fn addresses(out: &str) -> (Vec<String>, Vec<String>) {
    let mut local = Vec::new();
    let mut remote = Vec::new();
    for l in out.lines() {
        let l = l.trim();
        if let Some(rest) = l.strip_prefix("local:") {
            local.push(rest.trim().to_owned());
        } else if let Some(rest) = l.strip_prefix("remote:") {
            remote.push(rest.trim().to_owned());
        }
    }
    (local, remote)
}

#[track_caller]
fn assert_success(test: &str, who: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{test} {who} failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert_eq!(
        out.stdout.lines().last().map(str::trim),
        Some("success"),
        "{test} {who}:\n{}",
        out.stdout
    );
}

/// One server and one client with `extra` options on both.
fn run_pair(test: &str, n: u8, extra: &[&str]) {
    if !have_program(test, PROGRAM) {
        return;
    }
    let dir = LibDir::new(test);
    let port = free_tcp_port();
    let mut args: Vec<String> = vec!["-g".into(), "0".into(), "-p".into(), port.to_string()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let server = addr(n);
    let srv = debian_command(&dir, PROGRAM, server, &args);
    let mut cargs = args.clone();
    cargs.push(server.to_string());
    let cli = debian_command(&dir, PROGRAM, addr(n + 1), &cargs);
    let (s, c) = run_server_client(test, srv, cli, port, LIMIT);
    assert_both_succeeded(test, &s, &c);
    assert_success(test, "server", &s);
    assert_success(test, "client", &c);
    let (s_local, s_remote) = addresses(&s.stdout);
    let (c_local, c_remote) = addresses(&c.stdout);
    assert_eq!(s_local.len(), 1, "{test} server:\n{}", s.stdout);
    assert_eq!(c_local.len(), 1, "{test} client:\n{}", c.stdout);
    assert_eq!(s_remote, c_local, "{test}: the server's view of the client");
    assert_eq!(c_remote, s_local, "{test}: the client's view of the server");
}

#[test]
fn library_defines_every_symbol_xsrq_pingpong_imports() {
    const TEST: &str = "library_defines_every_symbol_xsrq_pingpong_imports";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    assert_library_defines_imports(TEST, PROGRAM, 15, &[]);
}

#[test]
fn debian_xsrq_pingpong_default() {
    run_pair("debian_xsrq_pingpong_default", 1, &[]);
}

#[test]
fn debian_xsrq_pingpong_one_byte() {
    run_pair("debian_xsrq_pingpong_one_byte", 3, &["-s", "1"]);
}

#[test]
fn debian_xsrq_pingpong_many_iterations() {
    run_pair("debian_xsrq_pingpong_many_iterations", 5, &["-n", "1000"]);
}

#[test]
fn debian_xsrq_pingpong_event_mode() {
    run_pair("debian_xsrq_pingpong_event_mode", 7, &["-e"]);
}

#[test]
fn debian_xsrq_pingpong_multi_packet_messages() {
    run_pair(
        "debian_xsrq_pingpong_multi_packet_messages",
        9,
        &["-s", "100000", "-n", "50"],
    );
}

/// A server with two clients: one SRQ, two target QPs and two initiator QPs on the
/// server; each client's messages land in the server's one SRQ, the server's in each
/// client's.
#[test]
fn debian_xsrq_pingpong_two_clients() {
    const TEST: &str = "debian_xsrq_pingpong_two_clients";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    let dir = LibDir::new(TEST);
    let port = free_tcp_port();
    let args: Vec<String> = vec!["-g".into(), "0".into(), "-p".into(), port.to_string()];
    let server = addr(11);
    let mut sargs = args.clone();
    sargs.extend(["-c".to_owned(), "2".to_owned()]);
    let srv = debian_command(&dir, PROGRAM, server, &sargs);
    let mut cargs = args.clone();
    cargs.push(server.to_string());
    let c1 = debian_command(&dir, PROGRAM, addr(12), &cargs);
    let c2 = debian_command(&dir, PROGRAM, addr(13), &cargs);
    // The second client starts once the server listens (it accepts both in turn).
    let second = std::thread::spawn(move || {
        for _ in 0..1000 {
            if listening(port) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        run(c2, LIMIT)
    });
    let (s, c1) = run_server_client(TEST, srv, c1, port, LIMIT);
    let c2 = second
        .join()
        .expect("second client thread")
        .unwrap_or_else(|e| panic!("{TEST}: second client: {e}"));
    assert_success(TEST, "server", &s);
    assert_success(TEST, "client 1", &c1);
    assert_success(TEST, "client 2", &c2);
    let (s_local, mut s_remote) = addresses(&s.stdout);
    assert_eq!(s_local.len(), 2, "{TEST} server:\n{}", s.stdout);
    let mut clients_local = Vec::new();
    for (who, c) in [("client 1", &c1), ("client 2", &c2)] {
        let (l, r) = addresses(&c.stdout);
        assert_eq!(l.len(), 1, "{TEST} {who}:\n{}", c.stdout);
        assert_eq!(r.len(), 1, "{TEST} {who}:\n{}", c.stdout);
        assert!(s_local.contains(&r[0]), "{TEST} {who} saw {:?}", r[0]);
        clients_local.extend(l);
    }
    s_remote.sort();
    clients_local.sort();
    assert_eq!(
        s_remote, clients_local,
        "{TEST}: the server's view of its clients"
    );
}

/// The `SRQN`, `QPN RECV` and `QPN SEND` fields of an address line, as numbers.
fn srqn_and_qpns(line: &str) -> (u32, u32, u32) {
    let field = |name: &str| {
        let at = line
            .find(name)
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            + name.len();
        let hex = line[at..]
            .trim_start()
            .split([',', ' '])
            .next()
            .unwrap_or("");
        u32::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad {name} in {line:?}"))
    };
    (field("SRQN"), field("QPN RECV"), field(" SEND"))
}

/// Server and client on one address (two members of the host's shared device): with SRQ
/// numbers from each member's slot (`UROCE_XRC_SRQ_SLOTS=1`) every SEND is steered by the
/// SRQ it names, and the target QPs have numbers of the domain's host-wide allotment (the
/// reserved top slot: the domain is on a file, shared through the host's domains file);
/// without (the default) by the target QP, of the member's slot, its SRQ number 1 as in a
/// lone process; both complete.
#[test]
fn debian_xsrq_pingpong_on_one_address_with_and_without_slot_srq_numbers() {
    const TEST: &str = "debian_xsrq_pingpong_on_one_address_with_and_without_slot_srq_numbers";
    if !have_program(TEST, PROGRAM) {
        return;
    }
    let dir = LibDir::new(TEST);
    // Registry directories of this test's own (one per run), to read the domains file.
    let hosts = std::env::temp_dir().join(format!("uroce-xsrq-host-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&hosts);
    for (slots, n) in [(true, 21), (false, 22)] {
        let host = hosts.join(n.to_string());
        let port = free_tcp_port();
        let args: Vec<String> = vec!["-g".into(), "0".into(), "-p".into(), port.to_string()];
        let ip = addr(n);
        let mut srv = debian_command(&dir, PROGRAM, ip, &args);
        let mut cargs = args.clone();
        cargs.push(ip.to_string());
        let mut cli = debian_command(&dir, PROGRAM, ip, &cargs);
        for c in [&mut srv, &mut cli] {
            c.env("UROCE_SHARED", "1")
                .env("UROCE_HOST_DIR", &host)
                .env("UROCE_XRC_SRQ_SLOTS", if slots { "1" } else { "0" });
        }
        let (s, c) = run_server_client(TEST, srv, cli, port, LIMIT);
        assert_both_succeeded(TEST, &s, &c);
        assert_success(TEST, "server", &s);
        assert_success(TEST, "client", &c);
        for out in [&s, &c] {
            let (local, _) = addresses(&out.stdout);
            assert_eq!(local.len(), 1, "{TEST}:\n{}", out.stdout);
            let (srqn, recv, send) = srqn_and_qpns(&local[0]);
            if slots {
                assert_eq!(
                    srqn >> 16,
                    send >> 16,
                    "{TEST}: SRQ number of the QP's slot"
                );
                // The domain (on the file /tmp/xrc_domain) numbers its target QP from the
                // reserved top slot, host-wide.
                assert_eq!(recv >> 16, 0xFF, "{TEST}: target QP of the top slot");
            } else {
                assert_eq!(
                    recv >> 16,
                    send >> 16,
                    "{TEST}: target QP of the member's slot"
                );
                assert_eq!(srqn, 1, "{TEST}: SRQ number of a lone process");
            }
        }
        // Both processes recorded their reference to the domain of /tmp/xrc_domain in the
        // host's domains file and closed it: no domain is left; with slot SRQ numbers its
        // target QP numbers were allotted there (the cursor moved).
        // The device's domains file: `<registry file>-xrc-<address>`.
        let suffix = format!("-xrc-{ip}");
        let path = std::fs::read_dir(&host)
            .expect("registry directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(&suffix))
            .unwrap_or_else(|| panic!("{TEST}: no domains file *{suffix} in {host:?}"));
        let file = std::fs::read_to_string(path).expect("domains file");
        assert!(
            !file.lines().any(|l| l.starts_with("domain ")),
            "{TEST}: a domain left:\n{file}"
        );
        assert_eq!(
            !file.lines().any(|l| l == "cursor 0"),
            slots,
            "{TEST}: target QP numbers allotted in the file only with slot SRQ numbers:\n{file}"
        );
    }
    let _ = std::fs::remove_dir_all(&hosts);
}
