//! The library exports what rdma-core 44's `libibverbs.so.1` exports, and its
//! device-independent helpers answer as rdma-core's do.
//!
//! * The dynamic symbol table of the built library is compared with that of the installed
//!   rdma-core library (Debian package libibverbs1, pulled in by libibverbs-dev): the
//!   same `name@VERSION` (compatibility) and `name@@VERSION` (default) entries, no more,
//!   no fewer.
//! * A C program (`tests/c/utility_oracle.c`) prints the results of the enum-to-text and
//!   rate-conversion helpers over and beyond their ranges; its output under rdma-core's
//!   library is the expectation for its output under uroce's.
//! * The same program, under uroce, calls unsupported functions — current ones and
//!   IBVERBS_1.0 compatibility versions looked up with `dlvsym` — which must fail cleanly
//!   with `EOPNOTSUPP` or `ENOSYS`, and `verbs_register_driver_34`, which must return.
//!
//! Needs `readelf`, a C compiler and the installed rdma-core library and header; without
//! them the tests are skipped, or fail under `UROCE_REQUIRE_TOOLS=1`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod support;

use support::{built_library, compile_c, LibDir};
use uroce_testkit::{run, skip, TempFile};

/// rdma-core's library as Debian installs it.
const RDMA_CORE: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
const LIMIT: Duration = Duration::from_secs(60);

/// The `IBVERBS_*`-versioned symbols `lib` defines, as readelf prints them
/// (`name@@VERSION` for a default version, `name@VERSION` for a compatibility one),
/// without the version-definition entries (`IBVERBS_1.0@@IBVERBS_1.0`, which GNU ld
/// emits and lld does not). `None` when readelf cannot run.
fn versioned_exports(test: &str, lib: &Path) -> Option<BTreeSet<String>> {
    let mut cmd = Command::new("readelf");
    cmd.args(["--dyn-syms", "-W"]).arg(lib);
    let out = match run(cmd, LIMIT) {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!("readelf {} failed: {}", lib.display(), o.stderr),
        Err(e) => {
            skip(test, &format!("readelf (binutils) cannot run: {e}"));
            return None;
        }
    };
    Some(
        out.lines()
            .filter(|l| !l.contains(" UND "))
            .filter_map(|l| l.split_whitespace().nth(7))
            .filter(|n| n.contains("@IBVERBS_") || n.contains("@@IBVERBS_"))
            .filter(|n| !n.starts_with("IBVERBS_"))
            .map(str::to_owned)
            .collect(),
    )
}

fn have_rdma_core(test: &str) -> bool {
    if !Path::new(RDMA_CORE).exists() {
        skip(
            test,
            &format!("{RDMA_CORE} is missing (install libibverbs-dev)"),
        );
        return false;
    }
    true
}

#[test]
fn export_table_matches_rdma_core() {
    let test = "export_table_matches_rdma_core";
    if !have_rdma_core(test) {
        return;
    }
    let Some(want) = versioned_exports(test, Path::new(RDMA_CORE)) else {
        return;
    };
    let Some(have) = versioned_exports(test, &built_library()) else {
        return;
    };
    // rdma-core 44 exports 180 versioned functions and one data symbol.
    assert!(want.len() > 150, "rdma-core's table looks wrong: {want:?}");
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing from uroce: {missing:?}\nnot in rdma-core: {extra:?}"
    );
}

/// Compiles `tests/c/utility_oracle.c`.
fn build_oracle(test: &str) -> Option<TempFile> {
    compile_c(test, "utility_oracle.c", &["-ldl"])
}

/// Runs the oracle with `LD_LIBRARY_PATH` = `lib_dir` (None: the system's library).
fn run_oracle(exe: &Path, lib_dir: Option<&Path>, args: &[&str]) -> String {
    let mut cmd = Command::new(exe);
    cmd.args(args).env_remove("LD_LIBRARY_PATH");
    if let Some(d) = lib_dir {
        cmd.env("LD_LIBRARY_PATH", d).env("UROCE_ADDR", "127.0.9.1");
    }
    let out = run(cmd, LIMIT).expect("run the oracle");
    assert!(
        out.status.success(),
        "oracle failed ({:?}):\n{}{}",
        lib_dir,
        out.stdout,
        out.stderr
    );
    out.stdout
}

#[test]
fn helpers_answer_as_rdma_core_does() {
    let test = "helpers_answer_as_rdma_core_does";
    if !have_rdma_core(test) {
        return;
    }
    let Some(exe) = build_oracle(test) else {
        return;
    };
    let expected = run_oracle(exe.path(), None, &[]);
    let dir = LibDir::new("utility-oracle");
    let got = run_oracle(exe.path(), Some(&dir.0), &[]);
    assert!(expected.lines().count() > 500, "oracle printed too little");
    for (e, g) in expected.lines().zip(got.lines()) {
        assert_eq!(g, e, "uroce differs from rdma-core");
    }
    assert_eq!(got.lines().count(), expected.lines().count());
}

#[test]
fn unsupported_functions_fail_cleanly() {
    let test = "unsupported_functions_fail_cleanly";
    let Some(exe) = build_oracle(test) else {
        return;
    };
    let dir = LibDir::new("utility-unsupported");
    let out = run_oracle(exe.path(), Some(&dir.0), &["unsupported"]);
    let eopnotsupp = std::io::Error::from_raw_os_error(libc::EOPNOTSUPP).to_string();
    let enosys = std::io::Error::from_raw_os_error(libc::ENOSYS).to_string();
    // strerror's text and Rust's differ in the " (os error N)" suffix only.
    let text = |s: &str| s.split(" (os error").next().unwrap_or(s).to_owned();
    let (eopnotsupp, enosys) = (text(&eopnotsupp), text(&enosys));
    let einval = text(&std::io::Error::from_raw_os_error(libc::EINVAL).to_string());
    for want in [
        // Implemented: a NULL PD is refused like any unknown handle.
        format!("create_ah_from_wc NULL {einval}"),
        // Implemented: a NULL CQ is refused like any unknown handle.
        format!("resize_cq {} {einval}", libc::EINVAL),
        format!("query_ece {} {eopnotsupp}", libc::EOPNOTSUPP),
        // IBV_FORK_UNNEEDED: uroce needs no fork protection.
        "fork_init 0".to_owned(),
        "is_fork_initialized 2".to_owned(),
        "versions 1.0 1.1 cmd reg34".to_owned(),
        format!("get_device_list_1_0 NULL -1 {enosys}"),
        format!("cmd_alloc_pd {} {eopnotsupp}", libc::EOPNOTSUPP),
        "register_driver_34 returned".to_owned(),
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "no line {want:?} in:\n{out}"
        );
    }
}
