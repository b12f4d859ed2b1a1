//! Helpers shared by the `uroce` CLI tests: running the binary with a time limit, a
//! server child that is killed if the test ends early, and parsing the perf table;
//! [`shared`] has those of the tests on one shared device.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use uroce_testkit::*;

pub mod shared;

/// The `uroce` binary under test.
pub fn uroce() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uroce"))
}

/// Serialises the tests of one binary that run busy-polling pairs: on a 2-core machine two
/// pairs at once would mostly measure each other.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `uroce args…` to completion within `limit` (killed after it); panics if it cannot
/// start or overruns.
pub fn run_uroce(args: &[&str], limit: Duration) -> Output {
    let mut cmd = uroce();
    cmd.args(args);
    let start = Instant::now();
    let out = run(cmd, limit).unwrap_or_else(|e| panic!("uroce {args:?}: {e}"));
    eprintln!(
        "uroce {} took {:.2} s",
        args.join(" "),
        start.elapsed().as_secs_f64()
    );
    out
}

/// A background `uroce` process, killed when dropped.
pub struct Background {
    child: Option<Child>,
    what: String,
}

impl Background {
    /// Starts `uroce args…` with its output discarded.
    pub fn start(args: &[&str]) -> Background {
        let child = uroce()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start uroce");
        Background {
            child: Some(child),
            what: format!("uroce {}", args.join(" ")),
        }
    }

    /// Waits up to `limit` for the process to exit; returns whether it exited with 0.
    /// Panics if it is still running then (it is killed).
    pub fn wait(mut self, limit: Duration) -> bool {
        let mut child = self.child.take().expect("child");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                return s.success();
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} still ran after {limit:?}; killed", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One row of the perf table: the column name → cell.
pub type TableRow = BTreeMap<String, String>;

/// The rows of the table `uroce perf` prints: the line that starts with `test` names the
/// columns, the rows below it until the next rule are split on whitespace.
pub fn parse_table(stdout: &str) -> Vec<TableRow> {
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with("test "));
    let header: Vec<String> = lines
        .next()
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"))
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut rows = Vec::new();
    for line in lines {
        if line.starts_with("---") {
            if rows.is_empty() {
                continue; // the rule under the header
            }
            break;
        }
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells.len(),
            header.len(),
            "row {line:?} has the wrong cell count"
        );
        rows.push(
            header
                .iter()
                .cloned()
                .zip(cells.iter().map(|c| c.to_string()))
                .collect(),
        );
    }
    rows
}

/// A numeric cell.
pub fn cell(row: &TableRow, col: &str) -> f64 {
    let v = row
        .get(col)
        .unwrap_or_else(|| panic!("no column {col} in {row:?}"));
    v.parse()
        .unwrap_or_else(|_| panic!("column {col} of {row:?} is not a number"))
}

/// Checks the plausibility of one row: latency rows have positive, ordered statistics
/// below `max_us`; bandwidth rows have a positive bandwidth whose ratio to the message
/// rate is the message size.
pub fn check_plausible(row: &TableRow, max_us: f64) {
    let test = &row["test"];
    let size = cell(row, "bytes");
    if test.ends_with("_lat") {
        let (min, med, avg, p99, max) = (
            cell(row, "min[us]"),
            cell(row, "median[us]"),
            cell(row, "avg[us]"),
            cell(row, "p99[us]"),
            cell(row, "max[us]"),
        );
        assert!(min > 0.0, "{row:?}");
        assert!(min <= med && med <= p99 && p99 <= max, "{row:?}");
        assert!(min <= avg && avg <= max, "{row:?}");
        assert!(med < max_us, "{test}: median {med} us is implausible");
        assert_eq!(row["BW[GB/s]"], "-");
    } else {
        assert!(test.ends_with("_bw"), "{row:?}");
        let bw = cell(row, "BW[GB/s]");
        let rate = cell(row, "rate[Mmsg/s]");
        assert!(bw > 0.0 && bw < 1000.0, "{row:?}");
        assert!(rate > 0.0, "{row:?}");
        // GB/s = Mmsg/s × bytes / 1000, up to the rounding of the printed cells.
        let expect = rate * size / 1000.0;
        let tol = 0.000_000_5 * (1.0 + size / 1000.0) + bw * 0.001;
        assert!(
            (bw - expect).abs() <= tol,
            "{test}: {bw} GB/s does not match {rate} Mmsg/s of {size} bytes"
        );
        assert_eq!(row["min[us]"], "-");
    }
}

/// Whether the C libraries are built next to the `uroce` binary under test (they are
/// what `uroce run` presents); reports a skip for `test` when they are not.
pub fn libs_built(test: &str) -> bool {
    let dir = std::path::PathBuf::from(env!("CARGO_BIN_EXE_uroce"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let ok = ["liburoce_ffi.so", "liburoce_ffi_rdmacm.so"]
        .iter()
        .all(|l| dir.join(l).is_file());
    if !ok {
        skip(
            test,
            "the C libraries are not built next to uroce (cargo build -p uroce-ffi -p uroce-ffi-rdmacm)",
        );
    }
    ok
}
