//! `uroce perf --server` and `uroce perf --client` as separate processes on their own
//! loopback addresses: every operation with `--verify`, in busy and event mode, with two
//! QPs and multi-packet sizes, over both kinds of memory (`--memory raw` and `owned`, each
//! on either side); the JSON output; that damaged data makes the run fail; and
//! the idle-QP memory report.

mod support;

use std::time::Duration;

use support::{check_plausible, exclusive, parse_table, run_uroce, Background, TempFile};

const CLIENT_LIMIT: Duration = Duration::from_secs(150);
const SERVER_LIMIT: Duration = Duration::from_secs(30);

/// Every test of the standard set: (name, has a size other than 8).
const TESTS: [(&str, bool); 8] = [
    ("send_lat", true),
    ("write_lat", true),
    ("read_lat", true),
    ("atomic_lat", false),
    ("send_bw", true),
    ("write_bw", true),
    ("read_bw", true),
    ("atomic_bw", false),
];

fn server(addr: &str, port: &str, extra: &[&str]) -> Background {
    let mut args = vec![
        "perf",
        "--server",
        "--addr",
        addr,
        "--oob-port",
        port,
        "--timeout",
        "20",
        "--accept-timeout",
        "60",
    ];
    args.extend_from_slice(extra);
    Background::start(&args)
}

/// `memory`: the client's `--memory`; the server uses the other kind.
fn verified_pair(mode: &str, memory: &str, server_addr: &str, client_addr: &str, port: &str) {
    let _one_at_a_time = exclusive();
    let json = TempFile::new("perf", "json");
    let json_path = json.path().to_str().expect("utf-8 path").to_string();
    let server_memory = if memory == "raw" { "owned" } else { "raw" };
    let srv = server(server_addr, port, &["--memory", server_memory]);
    // 5000 bytes: two packets at the 4096-byte path MTU, not a multiple of 8; 70000
    // bytes: many packets, and READs answered by several response packets.
    let out = run_uroce(
        &[
            "perf",
            "--client",
            server_addr,
            "--addr",
            client_addr,
            "--oob-port",
            port,
            "--verify",
            "--memory",
            memory,
            "--mode",
            mode,
            "--qps",
            "2",
            "--size",
            "8,5000,70000",
            "--iters",
            "100",
            "--tx-depth",
            "16",
            "--timeout",
            "20",
            "--no-progress",
            "--json",
            &json_path,
        ],
        CLIENT_LIMIT,
    );
    assert!(
        out.status.success(),
        "client failed ({}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert!(srv.wait(SERVER_LIMIT), "the server failed");

    let rows = parse_table(&out.stdout);
    let mut want = Vec::new();
    for (t, sized) in TESTS {
        want.push((t.to_string(), "8".to_string()));
        if sized {
            want.push((t.to_string(), "5000".to_string()));
            want.push((t.to_string(), "70000".to_string()));
        }
    }
    let got: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r["test"].clone(), r["bytes"].clone()))
        .collect();
    assert_eq!(got, want, "{}", out.stdout);
    for r in &rows {
        check_plausible(r, 1_000_000.0);
        assert_eq!(r["verified"], "yes", "{r:?}");
        assert_eq!(r["mode"], mode);
        assert_eq!(r["qps"], "2");
        assert_eq!(r["iters"], "100");
    }

    // The JSON file: one object per row, in the pinned schema.
    let text = std::fs::read_to_string(json.path()).expect("json file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let arr = v.as_array().expect("an array");
    assert_eq!(arr.len(), rows.len());
    for (o, r) in arr.iter().zip(&rows) {
        let test = o["test"].as_str().expect("test");
        assert_eq!(test, r["test"]);
        let (op, kind) = test.split_once('_').expect("op_kind");
        assert_eq!(o["op"], op);
        assert_eq!(o["kind"], kind);
        assert_eq!(o["size"].to_string(), r["bytes"]);
        assert_eq!(o["iters"], 100);
        assert_eq!(o["qps"], 2);
        assert_eq!(o["mode"], mode);
        assert_eq!(o["verified"], true);
        if kind == "lat" {
            let l = &o["lat_us"];
            let f = |k: &str| l[k].as_f64().unwrap_or_else(|| panic!("lat_us.{k}"));
            assert!(f("min") > 0.0 && f("min") <= f("median"));
            assert!(f("median") <= f("p99") && f("p99") <= f("max"));
            assert!(f("min") <= f("avg") && f("avg") <= f("max"));
            assert!(o.get("bw_gbps").is_none());
        } else {
            assert!(o["bw_gbps"].as_f64().expect("bw_gbps") > 0.0);
            assert!(o["msg_rate_mps"].as_f64().expect("msg_rate_mps") > 0.0);
            assert!(o.get("lat_us").is_none());
        }
    }
}

#[test]
fn every_op_verified_in_busy_mode() {
    verified_pair("busy", "raw", "127.0.1.1", "127.0.1.2", "18531");
}

#[test]
fn every_op_verified_in_event_mode() {
    verified_pair("event", "owned", "127.0.1.3", "127.0.1.4", "18532");
}

/// A server that damages its data: the client's `--verify` must fail the run with a
/// message naming the mismatch.
fn damaged(test: &str, server_addr: &str, client_addr: &str, port: &str, message: &str) {
    let _one_at_a_time = exclusive();
    let srv = server(server_addr, port, &["--inject-corruption"]);
    let out = run_uroce(
        &[
            "perf",
            "--client",
            server_addr,
            "--addr",
            client_addr,
            "--oob-port",
            port,
            "--verify",
            "--test",
            test,
            "--size",
            "4096",
            "--iters",
            "20",
            "--timeout",
            "20",
            "--no-progress",
        ],
        CLIENT_LIMIT,
    );
    assert!(
        !out.status.success(),
        "{test}: damaged data went unnoticed:\n{}",
        out.stdout
    );
    assert!(
        out.stderr.contains("data mismatch") && out.stderr.contains(message),
        "{test}: stderr lacks the mismatch message:\n{}",
        out.stderr
    );
    // The server reports the failure too (or the client's abort), and exits.
    assert!(
        !srv.wait(SERVER_LIMIT),
        "{test}: the server claimed success"
    );
}

#[test]
fn a_damaged_read_source_fails_the_client() {
    damaged(
        "read_lat",
        "127.0.1.5",
        "127.0.1.6",
        "18533",
        "read_lat QP #0 read 0",
    );
}

#[test]
fn a_damaged_write_target_fails_the_server_check() {
    damaged(
        "write_bw",
        "127.0.1.7",
        "127.0.1.8",
        "18534",
        "the server's checks failed",
    );
}

#[test]
fn idle_qp_memory_is_reported() {
    let json = TempFile::new("idle", "json");
    let out = run_uroce(
        &[
            "perf",
            "--idle-qps",
            "300",
            "--addr",
            "127.0.1.9",
            "--json",
            json.path().to_str().expect("utf-8 path"),
        ],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("bytes per QP"), "{}", out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).expect("json")).expect("JSON");
    let o = &v[0];
    assert_eq!(o["test"], "idle_qp_memory");
    assert_eq!(o["qps"], 300);
    let bytes = o["bytes_per_qp"].as_u64().expect("bytes_per_qp");
    // A QP is a few hundred bytes at least and certainly less than 1 MiB when idle.
    assert!((100..1 << 20).contains(&bytes), "{bytes} bytes per QP");
}
