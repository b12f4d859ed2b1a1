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
//! The suite runs inside `uroce run`'s presentation (`<target>/<profile>/uroce run --`, with
//! the freshly built library and uroce's `librdmacm.so.1`), so that it finds
//! `/sys/class/infiniband/uroce0/device/net/lo` and runs its RDMA-CM tests, in a network
//! namespace of its own (`UROCE_NETNS=1`: the RDMA-CM tests use 127.0.0.1 and port 7471,
//! which must not meet other tests of the host). Where that is
//! not possible (the `uroce` binary or `liburoce_ffi_rdmacm.so` not built, or no
//! unprivileged user namespaces) it runs on the library alone, as a program would without
//! the runner, and says so; under `UROCE_REQUIRE_TOOLS=1` that is a failure.
//!
//! Every skip reason must be known: either [`HARDWARE_ONLY`] (vendor devices, ODP, device
//! memory, dmabuf, CUDA, huge pages, raw packet QPs, mlx5 clock conversion, tag matching:
//! listed in docs/TESTING.md, "How the C
//! library is checked") or [`OWED`] (what uroce should do and does not yet; an entry whose
//! reason no longer appears fails the test, so that the list only shrinks).
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
/// test tolerates. Empty: every test that runs passes. Listed in docs/TESTING.md, "How the C
/// library is checked"; an entry that passes again fails the test, so that the list only
/// shrinks.
const KNOWN_FAILURES: &[(&str, &str)] = &[];
/// Skip reasons only hardware (or the host's setup) can lift, by prefix: uroce is a
/// software RoCE device with no vendor interface, no device memory, no on-demand paging,
/// no raw Ethernet QPs, no tag-matching offload. Listed in docs/TESTING.md, "How the C library is checked".
const HARDWARE_ONLY: &[&str] = &[
    // mlx5 / EFA direct-verbs tests (vendor providers).
    "Can not run the test over non MLX5 device",
    "Could not open mlx5 context",
    "Can not run the test over non EFA device",
    // mlx5 VFIO tests: a PCI device.
    "PCI device must be passed by the user",
    // On-demand paging: page faults served by the HCA.
    "ODP is not supported",
    // Device memory (ibv_alloc_dm): memory on the HCA.
    "Device memory is not supported",
    // dmabuf MRs: a GPU render node's buffers registered with the HCA.
    "Allocating dmabuf is not supported",
    // CUDA memory (GPUDirect).
    "cuda-python 12.0+ must be installed",
    // The host has no 2 MiB huge pages reserved (vm.nr_hugepages).
    "There are no huge pages of size 2M allocated",
    // The mlx5 timestamp tests (run on any device): the free-running completion timestamp
    // and `ibv_query_rt_values_ex`'s raw clock, both of which uroce returns, are then
    // converted with mlx5 direct verbs (`mlx5dv_get_clock_info`), which only an mlx5
    // device answers. (The wall-clock timestamp test passes.)
    "Converting timestamp to nanoseconds is not supported",
    // Tag matching (`IBV_SRQT_TM` SRQs, `IBV_WC_EX_WITH_TM_INFO`): an HCA offload of MPI
    // tag matching with a vendor-defined rendezvous header, outside the IBTA
    // specification; uroce reports `tm_caps` of zero and refuses `WITH_TM_INFO`
    // (`EOPNOTSUPP`), as rdma-core's rxe does. Only the tag-matching tests raise this
    // reason in this suite.
    "Extended CQ is not supported",
    // Raw packet QPs (IBV_QPT_RAW_PACKET = 8): Ethernet frames to the NIC's flow steering.
    "Create QP type 8 is not supported",
    "Create Raw Packet QP ",
];
/// Skip reasons of what uroce should do and does not yet, by prefix, with the work that
/// lifts them. Each must still appear in a presented run (else the test fails: delete the
/// entry), so the list only shrinks.
const OWED: &[(&str, &str)] = &[];
/// Skip reasons that only appear outside the presentation (no net interface to find).
const UNPRESENTED_ONLY: &[&str] = &["Device uroce0 doesn't have net interface"];
/// The suite's size in rdma-core 44 (273); fewer means it did not load completely.
const MIN_RAN: usize = 273;
/// Passing tests plus random skips ([`SkipKind::Random`]) as measured in the presentation
/// (114 passed and no random skips with the `ibv_wr_*` API, `ibv_wr_atomic_write`
/// included, extended CQs with completion timestamps, parent domains, the shared-PD test
/// (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`), the RDMA-CM tests and the 3
/// RDMA-CM multicast tests; 104 without the presentation, where the 10 RDMA-CM traffic
/// tests skip); a drop means something regressed into a skip or failure.
const MIN_SETTLED: usize = 114;
/// The floor without the presentation, where the 10 RDMA-CM traffic tests skip.
const MIN_SETTLED_UNPRESENTED: usize = 104;

/// A skip that depends on the suite's random choice of QP creation attributes (owed:
/// `create_qp_ex` with create flags).
fn is_random_skip(reason: &str) -> bool {
    reason.starts_with("Create ") && reason.ends_with(" extended attrs is not supported")
}

/// How a skip reason is accounted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SkipKind {
    HardwareOnly,
    Owed,
    Random,
    Unpresented,
    Unknown,
}

/// The category of a skip reason.
fn classify(reason: &str) -> SkipKind {
    if HARDWARE_ONLY.iter().any(|p| reason.starts_with(p)) {
        SkipKind::HardwareOnly
    } else if is_random_skip(reason) {
        SkipKind::Random
    } else if OWED.iter().any(|(p, _)| reason.starts_with(p)) {
        SkipKind::Owed
    } else if UNPRESENTED_ONLY.iter().any(|p| reason.starts_with(p)) {
        SkipKind::Unpresented
    } else {
        SkipKind::Unknown
    }
}

/// How the suite is run: inside `uroce run`'s presentation, or on the library alone.
enum Mode {
    /// `uroce` at this path, libraries in the directory (a [`TempDir`]).
    Presented(PathBuf),
    /// Why not.
    Plain(String),
}

/// `<target>/<profile>/`, where cargo puts the `uroce` binary and `liburoce_ffi_rdmacm.so`.
fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// Whether the suite can run presented: the runner and both libraries (the fresh
/// `libibverbs.so.1` and the built `librdmacm.so.1`, copied into `lib_dir`) exist and the
/// kernel lets the runner present the tree.
fn mode(lib_dir: &Path) -> Mode {
    let Some(profile) = profile_dir() else {
        return Mode::Plain("cannot locate the target directory".into());
    };
    let uroce = profile.join("uroce");
    let rdmacm = profile.join("liburoce_ffi_rdmacm.so");
    if !uroce.is_file() || !rdmacm.is_file() {
        return Mode::Plain(format!(
            "{} or {} is not built (cargo build -p uroce-cli -p uroce-ffi-rdmacm)",
            uroce.display(),
            rdmacm.display()
        ));
    }
    let copies = std::fs::create_dir_all(lib_dir)
        .and_then(|()| std::fs::copy(support::built_library(), lib_dir.join("liburoce_ffi.so")))
        .and_then(|_| std::fs::copy(&rdmacm, lib_dir.join("liburoce_ffi_rdmacm.so")));
    if let Err(e) = copies {
        return Mode::Plain(format!(
            "copying the libraries to {}: {e}",
            lib_dir.display()
        ));
    }
    let mut probe = Command::new(&uroce);
    probe
        .args([
            "run",
            "--",
            "test",
            "-L",
            "/sys/class/infiniband/uroce0/device/net/lo",
        ])
        .env("UROCE_LIB_DIR", lib_dir)
        .env_remove("UROCE_PRESENT");
    match run(probe, Duration::from_secs(30)) {
        Ok(o) if o.status.success() => Mode::Presented(uroce),
        Ok(o) => Mode::Plain(format!(
            "uroce run does not present the tree here: {}",
            o.stderr.trim()
        )),
        Err(e) => Mode::Plain(format!("uroce run: {e}")),
    }
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

    let run_libs = TempDir(work.0.join("libs"));
    let mode = mode(&run_libs.0);
    let (mut cmd, addr) = match &mode {
        Mode::Presented(uroce) => {
            // In a network namespace of its own (`UROCE_NETNS=1`): the suite's RDMA-CM
            // tests use the first address of the device's net interface (127.0.0.1 of
            // `lo`) and the port 7471, which must not meet other tests on this host; every
            // process's device is the shared device on 127.0.0.1 there.
            let mut c = Command::new(uroce);
            c.args(["run", "--", PYTHON])
                .env("UROCE_LIB_DIR", &run_libs.0)
                .env("UROCE_NETNS", "1")
                .env_remove("UROCE_ADDR")
                .env_remove("UROCE_PRESENT");
            (c, "127.0.0.x of a private network namespace".to_string())
        }
        Mode::Plain(why) => {
            skip(
                TEST,
                &format!("running the suite without uroce run's presentation: {why}"),
            );
            let addr = free_address();
            let mut c = Command::new(PYTHON);
            c.env("LD_LIBRARY_PATH", &lib.0)
                .env("UROCE_ADDR", addr.to_string());
            (c, addr.to_string())
        }
    };
    let presented = matches!(mode, Mode::Presented(_));
    cmd.arg("run_tests.py")
        .arg("-v")
        .current_dir(work.0.join("tests"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("UROCE_FAULTS")
        .env_remove("UROCE_DEBUG");
    let start = Instant::now();
    let out = run(cmd, LIMIT).unwrap_or_else(|e| panic!("run_tests.py: {e}"));
    eprintln!(
        "run_tests.py -v on {addr} ({}): {:?}, {:?}",
        if presented {
            "presented"
        } else {
            "library only"
        },
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
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for (reason, n) in &reasons {
        let kind = classify(reason);
        *by_kind.entry(format!("{kind:?}")).or_default() += **n;
        println!("  skipped {n:3} ({kind:?}): {reason}");
    }
    println!("  skips by kind: {by_kind:?}");
    for name in report.failed.iter().chain(&report.errored) {
        println!("  FAILED/ERROR: {name}");
    }

    let unexpected: Vec<_> = report
        .failed
        .iter()
        .chain(&report.errored)
        .filter(|name| !KNOWN_FAILURES.iter().any(|(k, _)| name.starts_with(k)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "tests failed outside the documented list: {unexpected:?}\n{text}"
    );
    let unknown: Vec<_> = report
        .skip_reasons
        .keys()
        .filter(|r| match classify(r) {
            SkipKind::Unknown => true,
            SkipKind::Unpresented => presented,
            _ => false,
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "skip reasons that are neither hardware-only nor in the owed list: {unknown:?}"
    );
    if presented {
        let stale: Vec<_> = OWED
            .iter()
            .filter(|(p, _)| !report.skip_reasons.keys().any(|r| r.starts_with(p)))
            .map(|(p, _)| p)
            .collect();
        assert!(
            stale.is_empty(),
            "owed skip reasons no longer seen (delete them from OWED): {stale:?}"
        );
        let passing: Vec<_> = KNOWN_FAILURES
            .iter()
            .filter(|(k, _)| {
                !report
                    .failed
                    .iter()
                    .chain(&report.errored)
                    .any(|n| n.starts_with(k))
            })
            .map(|(k, _)| k)
            .collect();
        assert!(
            passing.is_empty(),
            "known failures that no longer fail (delete them from KNOWN_FAILURES): {passing:?}"
        );
    }
    assert!(
        report.ran >= MIN_RAN,
        "only {} tests ran (the suite has {MIN_RAN}):\n{text}",
        report.ran
    );
    let random_skips: usize = report
        .skip_reasons
        .iter()
        .filter(|(reason, _)| classify(reason) == SkipKind::Random)
        .map(|(_, n)| n)
        .sum();
    let floor = if presented {
        MIN_SETTLED
    } else {
        MIN_SETTLED_UNPRESENTED
    };
    println!(
        "  passed + random skips: {} (floor {floor})",
        report.passed() + random_skips
    );
    assert!(
        report.passed() + random_skips >= floor,
        "{} tests passed (+ {random_skips} random skips), fewer than the {floor} \
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

#[test]
fn skip_reasons_are_classified() {
    assert_eq!(
        classify("Can not run the test over non MLX5 device"),
        SkipKind::HardwareOnly
    );
    assert_eq!(
        classify("Create Raw Packet QP with extended attrs is not supported"),
        SkipKind::HardwareOnly
    );
    assert_eq!(
        classify("Create UD QP with extended attrs is not supported"),
        SkipKind::Random
    );
    // Lifted (ATOMIC WRITE is implemented): no longer tolerated.
    assert_eq!(
        classify("Extended QP is not supported on this device"),
        SkipKind::Unknown
    );
    assert_eq!(
        classify("Create Extended CQ is not supported"),
        SkipKind::Unknown
    );
    assert_eq!(
        classify("Extended CQ is not supported"),
        SkipKind::HardwareOnly
    );
    assert_eq!(
        classify("Device uroce0 doesn't have net interface"),
        SkipKind::Unpresented
    );
    assert_eq!(
        classify("Something new is not supported"),
        SkipKind::Unknown
    );
}
