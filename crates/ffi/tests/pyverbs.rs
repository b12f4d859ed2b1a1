//! rdma-core's own conformance suite (the `tests/` directory that Debian ships, some files
//! gzipped, in `python3-pyverbs`: `/usr/share/doc/rdma-core/tests`) run unmodified with
//! the distribution's `/usr/bin/python3` against the library presented as
//! `libibverbs.so.1`. The suite is unpacked into a temporary directory (nothing of it lives
//! in this repository), `run_tests.py -v` runs within a time limit, and the unittest
//! report is parsed: the pass / fail / error / skip counts and the skip reasons, grouped,
//! are printed; the test asserts that no test fails or errs outside [`KNOWN_FAILURES`]
//! (which may only shrink), that the suite really ran, and that at least [`MIN_SETTLED`]
//! tests passed (so that a regression turning passes into skips is caught).
//!
//! Some tests draw at random whether they create their QPs with extended attributes; both
//! paths work for every QP type uroce has, and only the raw packet tests (a type uroce
//! lacks) skip with a reason that names the draw ("… with/without extended attrs is not
//! supported"). Those skips ([`is_random_skip`]) are counted with the passes for the floor.
//!
//! Without the suite or pyverbs the test is skipped, or fails under
//! `UROCE_REQUIRE_TOOLS=1` (`scripts/test` installs `python3-pyverbs`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use support::LibDir;
use uroce_testkit::{run, skip};

/// The first of the loopback addresses this test may use (127.0.31.1 …= 127.0.31.32): the
/// first whose RoCEv2 port is free (a suite run leaves nothing behind, but a concurrent
/// run of this test in another checkout may hold one).
const FIRST_ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 31, 1);
/// The RoCEv2 UDP port (IBA Annex A17).
const ROCE_PORT: u16 = 4791;
/// Where Debian's `python3-pyverbs` installs the suite.
const SUITE: &str = "/usr/share/doc/rdma-core/tests";
/// The distribution's interpreter (pyverbs is built for it, not for other pythons on PATH).
const PYTHON: &str = "/usr/bin/python3";
/// The whole suite runs in about a second; this bounds a hang.
const LIMIT: Duration = Duration::from_secs(300);
/// Tests that fail or err today, by unittest id, with the reason: the only failures the
/// test tolerates. Empty: every test that runs passes. (Listed in README, "How the C
/// library is checked".)
const KNOWN_FAILURES: &[(&str, &str)] = &[];
/// The suite's size in rdma-core 44 (273); fewer means it did not load completely.
const MIN_RAN: usize = 273;
/// Passing tests plus random skips ([`is_random_skip`]) as measured (constant over 3 runs:
/// 96 + 2 with the `ibv_wr_*` API and extended CQs); a drop means something regressed into
/// a skip or failure.
const MIN_SETTLED: usize = 98;

/// A skip whose wording depends on the suite's random choice of QP creation attributes.
fn is_random_skip(reason: &str) -> bool {
    reason.starts_with("Create ") && reason.ends_with(" extended attrs is not supported")
}

/// The counts and names parsed from unittest's verbose report.
#[derive(Debug, Default)]
struct Report {
    ran: usize,
    failed: Vec<String>,
    errored: Vec<String>,
    skipped: usize,
    expected_failures: usize,
    unexpected_successes: usize,
    /// Skip reason → how many tests gave it.
    skip_reasons: BTreeMap<String, usize>,
}

impl Report {
    fn passed(&self) -> usize {
        self.ran
            .saturating_sub(self.failed.len())
            .saturating_sub(self.errored.len())
            .saturating_sub(self.skipped)
            .saturating_sub(self.expected_failures)
            .saturating_sub(self.unexpected_successes)
    }
}

/// The number after `key=` in unittest's final `OK (...)` / `FAILED (...)` line.
fn summary_count(line: &str, key: &str) -> usize {
    line.split(['(', ')', ','])
        .filter_map(|part| part.trim().strip_prefix(key)?.strip_prefix('='))
        .find_map(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Parses unittest's `-v` output (it writes to stderr).
fn parse(text: &str) -> Result<Report, String> {
    let mut r = Report::default();
    let mut summary = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Ran ") {
            if let Some(n) = rest.split_whitespace().next().and_then(|n| n.parse().ok()) {
                r.ran = n;
            }
        } else if line.starts_with("OK") || line.starts_with("FAILED") {
            summary = Some(line.to_string());
        } else if let Some(name) = line.strip_prefix("FAIL: ") {
            r.failed.push(name.trim().to_string());
        } else if let Some(name) = line.strip_prefix("ERROR: ") {
            r.errored.push(name.trim().to_string());
        }
        if let Some(i) = line.find(" ... skipped ") {
            let reason = line[i + " ... skipped ".len()..].trim();
            let reason = reason
                .strip_prefix('\'')
                .and_then(|s| s.strip_suffix('\''))
                .or_else(|| reason.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                .unwrap_or(reason);
            *r.skip_reasons.entry(reason.to_string()).or_default() += 1;
        }
    }
    let summary = summary.ok_or("no OK/FAILED summary line: the suite did not finish")?;
    r.skipped = summary_count(&summary, "skipped");
    r.expected_failures = summary_count(&summary, "expected failures");
    r.unexpected_successes = summary_count(&summary, "unexpected successes");
    if summary_count(&summary, "failures") != r.failed.len()
        || summary_count(&summary, "errors") != r.errored.len()
    {
        return Err(format!(
            "summary {summary:?} disagrees with the FAIL/ERROR headers ({} / {})",
            r.failed.len(),
            r.errored.len()
        ));
    }
    Ok(r)
}

/// Copies the suite into `dst` and decompresses its `.gz` files.
fn unpack(dst: &Path) -> Result<(), String> {
    let tests = dst.join("tests");
    std::fs::create_dir_all(&tests).map_err(|e| e.to_string())?;
    let entries = std::fs::read_dir(SUITE).map_err(|e| format!("{SUITE}: {e}"))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        match name.strip_suffix(".gz") {
            Some(plain) => {
                let mut cmd = Command::new("gzip");
                cmd.arg("-dc").arg(&path);
                let out = run(cmd, Duration::from_secs(30))?;
                if !out.status.success() {
                    return Err(format!("gzip -dc {}: {}", path.display(), out.stderr));
                }
                std::fs::write(tests.join(plain), out.stdout).map_err(|e| e.to_string())?;
            }
            None => {
                std::fs::copy(&path, tests.join(&name)).map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// The first address from [`FIRST_ADDR`] on whose RoCEv2 port a socket can bind.
fn free_address() -> Ipv4Addr {
    let [a, b, c, first] = FIRST_ADDR.octets();
    (first..first + 32)
        .map(|d| Ipv4Addr::new(a, b, c, d))
        .find(|ip| std::net::UdpSocket::bind((*ip, ROCE_PORT)).is_ok())
        .expect("a free RoCEv2 port on 127.0.31.1-32")
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn rdma_core_pyverbs_suite_passes() {
    const TEST: &str = "rdma_core_pyverbs_suite_passes";
    if !Path::new(PYTHON).exists() || !Path::new(SUITE).join("run_tests.py").exists() {
        skip(
            TEST,
            &format!(
                "{PYTHON} or {SUITE}/run_tests.py is missing (install the Debian package \
                 python3-pyverbs)"
            ),
        );
        return;
    }
    let lib = LibDir::new("pyverbs");
    let work =
        TempDir(std::env::temp_dir().join(format!("uroce-pyverbs-suite-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&work.0);
    unpack(&work.0).unwrap_or_else(|e| panic!("unpacking the suite: {e}"));

    let addr = free_address();
    let mut cmd = Command::new(PYTHON);
    cmd.arg("run_tests.py")
        .arg("-v")
        .current_dir(work.0.join("tests"))
        .env("LD_LIBRARY_PATH", &lib.0)
        .env("UROCE_ADDR", addr.to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("UROCE_FAULTS")
        .env_remove("UROCE_DEBUG");
    let start = Instant::now();
    let out = run(cmd, LIMIT).unwrap_or_else(|e| panic!("run_tests.py: {e}"));
    eprintln!(
        "run_tests.py -v on {addr}: {:?}, {:?}",
        start.elapsed(),
        out.status
    );
    let text = format!("{}\n{}", out.stdout, out.stderr);
    let report = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

    println!(
        "pyverbs suite: {} tests, {} passed, {} failed, {} errors, {} skipped \
         ({} expected failures, {} unexpected successes)",
        report.ran,
        report.passed(),
        report.failed.len(),
        report.errored.len(),
        report.skipped,
        report.expected_failures,
        report.unexpected_successes
    );
    let mut reasons: Vec<_> = report.skip_reasons.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (reason, n) in reasons {
        println!("  skipped {n:3}: {reason}");
    }
    for name in report.failed.iter().chain(&report.errored) {
        println!("  FAILED/ERROR: {name}");
    }

    let unexpected: Vec<_> = report
        .failed
        .iter()
        .chain(&report.errored)
        .filter(|name| !KNOWN_FAILURES.iter().any(|(k, _)| name.contains(k)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "tests failed outside the documented list: {unexpected:?}\n{text}"
    );
    assert!(
        report.ran >= MIN_RAN,
        "only {} tests ran (the suite has {MIN_RAN}):\n{text}",
        report.ran
    );
    let random_skips: usize = report
        .skip_reasons
        .iter()
        .filter(|(reason, _)| is_random_skip(reason))
        .map(|(_, n)| n)
        .sum();
    println!(
        "  passed + random skips: {} (floor {MIN_SETTLED})",
        report.passed() + random_skips
    );
    assert!(
        report.passed() + random_skips >= MIN_SETTLED,
        "{} tests passed (+ {random_skips} random skips), fewer than the {MIN_SETTLED} \
         measured before:\n{text}",
        report.passed()
    );
    assert_eq!(
        report.skip_reasons.values().sum::<usize>(),
        report.skipped,
        "every skip has a reason line"
    );
}

#[test]
fn parser_reads_unittest_reports() {
    let text = "test_a (tests.t.A.test_a)\nDoc ... ok\n\
        test_b (tests.t.A.test_b) ... skipped 'No ODP caps'\n\
        test_c (tests.t.A.test_c) ... skipped \"It's not\"\n\
        test_d (tests.t.A.test_d) ... FAIL\n\
        ======\nFAIL: test_d (tests.t.A.test_d)\n------\n\
        Ran 4 tests in 0.1s\n\nFAILED (failures=1, skipped=2)\n";
    let r = parse(text).expect("parses");
    assert_eq!(r.ran, 4);
    assert_eq!(r.skipped, 2);
    assert_eq!(r.failed, vec!["test_d (tests.t.A.test_d)".to_string()]);
    assert_eq!(r.passed(), 1);
    assert_eq!(r.skip_reasons.get("No ODP caps"), Some(&1));
    assert_eq!(r.skip_reasons.get("It's not"), Some(&1));
    assert!(parse("Ran 1 tests\n").is_err(), "no summary line");
    assert!(is_random_skip(
        "Create UD QP without extended attrs is not supported"
    ));
    assert!(!is_random_skip(
        "Create UD QP without attrs is not supported"
    ));
    assert!(
        parse("Ran 1 tests\nFAILED (failures=1)\n").is_err(),
        "summary without a FAIL header"
    );
}
