//! The examples run to completion, and docs/RUST-API.md's RC program is `examples/rc_send.rs`.
//!
//! Each example runs as its own process when cargo has built it (`cargo test` builds the
//! examples before running tests; the binary's exit status is checked); when the examples
//! were not built (e.g. `cargo test --test examples`), its `main` runs in this process
//! instead, from the same source.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../examples/rc_send.rs"]
mod rc_send;
#[path = "../examples/uc_write.rs"]
mod uc_write;
#[path = "../examples/ud_datagrams.rs"]
mod ud_datagrams;

type ExampleMain = fn() -> Result<(), Box<dyn std::error::Error>>;

/// `target/<profile>/examples/<name>`, next to this test's `deps` directory, if it exists
/// and is newer than the example's source and this test (a stale binary is not run).
fn built_example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let path = profile_dir.join("examples").join(name);
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.rs"));
    let built = modified(&path)?;
    (built >= modified(&source)? && built >= modified(&exe)?).then_some(path)
}

fn run(name: &str, main: ExampleMain, expect: &str) {
    let start = Instant::now();
    match built_example(name) {
        Some(path) => {
            let out = Command::new(&path).output().expect("start the example");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{name} failed ({}): {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains(expect), "{name} printed {stdout:?}");
        }
        None => {
            if let Err(e) = main() {
                panic!("{name} failed: {e}");
            }
        }
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{name} took {:?}",
        start.elapsed()
    );
}

#[test]
fn rc_send_runs() {
    run("rc_send", rc_send::main, "B received \"hello, RDMA\"");
}

#[test]
fn uc_write_runs() {
    run("uc_write", uc_write::main, "WRITE_WITH_IMM of 2000 bytes");
}

#[test]
fn ud_datagrams_runs() {
    run("ud_datagrams", ud_datagrams::main, "both answered");
}

/// The text between `begin` and `end` (exclusive) in `s`.
fn between<'a>(s: &'a str, begin: &str, end: &str) -> &'a str {
    let from = s.find(begin).unwrap_or_else(|| panic!("no {begin:?}")) + begin.len();
    let len = s[from..]
        .find(end)
        .unwrap_or_else(|| panic!("no {end:?} after {begin:?}"));
    &s[from..from + len]
}

#[test]
fn the_rust_api_doc_shows_exactly_the_rc_example() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("examples/rc_send.rs")).expect("example");
    let readme =
        std::fs::read_to_string(root.join("../../docs/RUST-API.md")).expect("docs/RUST-API.md");
    let code = between(&example, "// README:begin\n", "// README:end");
    let shown = between(
        &readme,
        "<!-- rc_send.rs begin -->\n```rust\n",
        "```\n<!-- rc_send.rs end -->",
    );
    assert!(code.len() > 500, "the example's marked part is too short");
    assert!(
        shown == code,
        "docs/RUST-API.md's RC program differs from crates/net/examples/rc_send.rs (between the \
         README markers); copy the example into docs/RUST-API.md"
    );
}
