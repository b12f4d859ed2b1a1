//! Every refusal of an attribute speaks under `UROCE_DEBUG=1`: a C program
//! (`tests/c/refusals.c`) makes one refused call per section (open device, create CQ, QP
//! and SRQ beyond the limits, reg_mr with REMOTE_WRITE alone, an invalid QP transition, a
//! port that does not exist, NULL arguments of the event calls); each section must carry
//! exactly one `uroce: refused (<errno>): <reason>` line on stderr naming the call. A GRH
//! flow label with bits above the 20 is accepted (masked, as drivers do) with its note.
//! Without `UROCE_DEBUG` the library writes nothing.

use std::net::Ipv4Addr;
use std::time::Duration;

mod support;

use support::{compile_c, debian_command, LibDir};
use uroce_testkit::run;

/// A loopback address no other test uses.
const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 56, 2);

/// (section, expected result, what its stderr line must contain).
const SECTIONS: &[(&str, &str, &str)] = &[
    ("open_device", "refused 22", "device is NULL"),
    (
        "create_cq",
        "refused 22",
        "ibv_create_cq: CQ size 1073741824",
    ),
    ("create_qp", "refused 22", "max_send_wr = 1073741824"),
    ("create_srq", "refused 22", "ibv_create_srq: SRQ max_wr"),
    (
        "reg_mr",
        "refused 22",
        "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
    ),
    ("modify_qp", "refused 22", "RESET→RTS"),
    ("query_port", "refused 22", "port 7 does not exist"),
    ("get_cq_event", "refused 22", "ibv_get_cq_event"),
    (
        "get_async_event",
        "refused 22",
        "ibv_get_async_event: event is NULL",
    ),
];

/// stderr split at the program's `--- name` lines: (name, lines of that section).
fn sections(stderr: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in stderr.lines() {
        if let Some(name) = line.strip_prefix("--- ") {
            out.push((name.to_string(), Vec::new()));
        } else if let Some((_, lines)) = out.last_mut() {
            lines.push(line.to_string());
        }
    }
    out
}

#[test]
fn refusals_speak_under_uroce_debug() {
    const TEST: &str = "refusals_speak_under_uroce_debug";
    let Some(exe) = compile_c(TEST, "refusals.c", &[]) else {
        return;
    };
    let lib = LibDir::new("refusals");
    let program = exe.path().to_string_lossy().into_owned();

    let mut cmd = debian_command(&lib, &program, ADDR, &[]);
    cmd.env("UROCE_DEBUG", "1");
    let o = run(cmd, Duration::from_secs(60)).expect("refusals");
    assert!(
        o.status.success(),
        "{:?}\n{}\n{}",
        o.status,
        o.stdout,
        o.stderr
    );
    let secs = sections(&o.stderr);
    for (name, result, reason) in SECTIONS {
        assert!(
            o.stdout.lines().any(|l| l == format!("{name} {result}")),
            "{name}: expected `{result}`:\n{}",
            o.stdout
        );
        let (_, lines) = secs
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no section {name}:\n{}", o.stderr));
        let refused: Vec<_> = lines
            .iter()
            .filter(|l| l.starts_with("uroce: refused ("))
            .collect();
        assert_eq!(refused.len(), 1, "{name}: {lines:?}");
        assert!(refused[0].contains(reason), "{name}: {}", refused[0]);
    }
    assert!(
        o.stdout.lines().any(|l| l == "flow_label accepted 0"),
        "{}",
        o.stdout
    );
    let (_, lines) = secs
        .iter()
        .find(|(n, _)| n == "flow_label")
        .expect("flow_label section");
    assert_eq!(
        lines,
        &["uroce: GRH flow label 0xfffffff masked to its 20 bits (0xfffff)".to_string()]
    );

    // Without UROCE_DEBUG: the same results, and not a word from the library.
    let mut cmd = debian_command(&lib, &program, ADDR, &[]);
    cmd.env_remove("UROCE_DEBUG");
    let o = run(cmd, Duration::from_secs(60)).expect("refusals");
    assert!(o.status.success(), "{}", o.stderr);
    assert!(
        !o.stderr.lines().any(|l| l.starts_with("uroce:")),
        "{}",
        o.stderr
    );
    assert_eq!(o.stdout.lines().count(), SECTIONS.len() + 1, "{}", o.stdout);
}
