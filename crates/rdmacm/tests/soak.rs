//! The soak (`uroce-soak`, see its documentation) for two minutes: mixed RC, XRC, UC and
//! UD traffic, RDMA-CM and QP churn between two loopback devices under 1 % loss, 0.5 %
//! duplication and 1 % reordering, every message checked; it fails when a check fails, a
//! stream stalls, or memory, descriptors or live QPs grow. `UROCE_SOAK_SECONDS` changes
//! the duration (`scripts/soak` runs the hour).

use std::process::Command;
use std::time::Duration;

use uroce_testkit::run;

#[test]
fn two_minutes_of_mixed_traffic_under_faults_without_growth() {
    let secs: u64 = std::env::var("UROCE_SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let mut c = Command::new(env!("CARGO_BIN_EXE_uroce-soak"));
    c.args([
        "--seconds",
        &secs.to_string(),
        "--report",
        &(secs / 6).max(5).to_string(),
    ])
    .args(["--addrs", "127.0.62.1,127.0.62.2"])
    .env_remove("UROCE_FAULTS");
    let o = run(c, Duration::from_secs(secs + 120)).expect("uroce-soak");
    eprintln!("{}", o.stdout);
    assert!(
        o.status.success() && o.stdout.contains("uroce-soak: ok"),
        "{:?}\n{}\n{}",
        o.status,
        o.stdout,
        o.stderr
    );
}
