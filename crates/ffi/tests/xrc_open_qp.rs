//! `ibv_open_qp` through the C API: `tests/c/xrc_open_qp.c` (compiled against the system
//! header, run against the library) opens two contexts of the one device, an XRC domain
//! on a file from each (the same domain), an XRC SRQ and an XRC_RECV QP through the first,
//! then the target QP by number through the second (`ibv_open_qp`; an unknown number is
//! refused). The target is moved to INIT and RTR through the second context's handle only;
//! an XRC_SEND QP naming the SRQ's number sends to it, and the receive completes on the
//! SRQ's CQ with the target's QP number and the bytes sent. Then `ibv_destroy_qp` of one
//! of the two handles closes just that handle (the QP still receives, the other handle
//! still answers a query, the QP can be opened again) and the last handle's destroy
//! destroys the QP (it can no longer be opened; a SEND to it ends in a retry-exceeded
//! error): round 1 destroys the created handle first, round 2 the opened one. Finally
//! every object is destroyed and both domain users close.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, run_c_program};
use uroce_testkit::TempFile;

#[test]
fn open_qp_second_context_receives() {
    let test = "open_qp_second_context_receives";
    let Some(exe) = compile_c(test, "xrc_open_qp.c", &[]) else {
        return;
    };
    let domain = TempFile::new("xrc-open-qp-domain", "");
    let path = domain.path().to_str().expect("temp path");
    let out = run_c_program(
        test,
        &exe,
        Ipv4Addr::new(127, 0, 51, 3),
        &[path],
        Duration::from_secs(60),
    );
    let passed: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PASS "))
        .collect();
    let round = [
        "open_unknown_number",
        "open_by_number",
        "modify_through_opened",
        "receive_through_opened",
        "destroy_one_handle",
        "receive_after_one_destroyed",
        "reopen_and_close",
        "destroy_last_handle",
        "gone_after_last",
    ];
    let expected: Vec<String> = round
        .iter()
        .map(|s| s.to_string())
        .chain(round.iter().map(|s| format!("{s}_2")))
        .chain(["teardown".to_string()])
        .collect();
    assert_eq!(passed, expected, "{}\n{}", out.stdout, out.stderr);
}
