//! `uroce perf` with no arguments: the local pair (server 127.0.0.2, client 127.0.0.1, OOB
//! port 18515) runs the standard set and prints one table with every standard row and
//! plausible numbers. It runs in CI, so it must stay well under ~20 s on 2 cores.

mod support;

use std::time::{Duration, Instant};

use support::{check_plausible, parse_table, run_uroce};

#[test]
fn perf_without_arguments_prints_the_standard_table() {
    let start = Instant::now();
    let out = run_uroce(&["perf"], Duration::from_secs(90));
    let secs = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "uroce perf failed ({}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let rows = parse_table(&out.stdout);
    let got: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r["test"].clone(), r["bytes"].clone()))
        .collect();
    // The standard set (the task's list): every test once at its default size, plus a
    // 64-byte write_bw row for the message rate.
    let want: Vec<(String, String)> = [
        ("send_lat", "8"),
        ("write_lat", "8"),
        ("read_lat", "8"),
        ("atomic_lat", "8"),
        ("send_bw", "1048576"),
        ("write_bw", "1048576"),
        ("write_bw", "64"),
        ("read_bw", "1048576"),
        ("atomic_bw", "8"),
    ]
    .iter()
    .map(|(t, s)| (t.to_string(), s.to_string()))
    .collect();
    assert_eq!(got, want, "rows of:\n{}", out.stdout);
    for r in &rows {
        // Loopback latency through a userspace stack: well below 100 ms even on a loaded
        // machine.
        check_plausible(r, 100_000.0);
        assert_eq!(r["mode"], "busy");
        assert_eq!(r["qps"], "1");
        assert_eq!(r["verified"], "no");
    }
    eprintln!("uroce perf (no arguments): {secs:.2} s\n{}", out.stdout);
    assert!(secs < 60.0, "uroce perf took {secs:.1} s");
}
