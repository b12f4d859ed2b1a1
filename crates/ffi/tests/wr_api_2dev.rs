//! The `ibv_wr_*` API between two processes with a device each (`tests/c/wr_api_2dev.c`,
//! 127.0.58.10 and 127.0.58.11, connection data over TCP on loopback): every RC opcode
//! in one `ibv_wr_start` … `ibv_wr_complete` list, checked on both sides (receive
//! completions, bytes landed and the atomics' new values at the server; send
//! completions, READ bytes and the atomics' old values at the client); a type 2 window
//! bound by the server with `ibv_wr_bind_mw` takes the client's WRITE, and after the
//! server's `ibv_wr_local_inv` a WRITE with its key fails with `REM_ACCESS_ERR` and leaves
//! the window untouched.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{
    assert_both_succeeded, compile_c, debian_command, free_tcp_port, run_server_client, LibDir,
};

#[test]
fn wr_api_between_two_devices() {
    let test = "wr_api_between_two_devices";
    let Some(exe) = compile_c(test, "wr_api_2dev.c", &[]) else {
        return;
    };
    let dir = LibDir::new(test);
    let port = free_tcp_port();
    let program = exe.path().to_string_lossy().into_owned();
    let server = debian_command(
        &dir,
        &program,
        Ipv4Addr::new(127, 0, 58, 10),
        &[port.to_string()],
    );
    let client = debian_command(
        &dir,
        &program,
        Ipv4Addr::new(127, 0, 58, 11),
        &[port.to_string(), "client".to_string()],
    );
    let (s, c) = run_server_client(test, server, client, port, Duration::from_secs(60));
    assert_both_succeeded(test, &s, &c);
    for check in [
        "rc_all_opcodes",
        "mw_write",
        "mw_after_local_inv",
        "teardown",
    ] {
        for (who, out) in [("server", &s), ("client", &c)] {
            assert!(
                out.stdout.lines().any(|l| l == format!("PASS {check}")),
                "{who}: no PASS {check} in:\n{}",
                out.stdout
            );
        }
    }
}
