//! The result table `uroce perf` prints and the JSON it writes with `--json`.

use std::io::Write;

use serde::Serialize;

use super::plan::TestSpec;
use super::stats::{LatStats, Measured};

/// The result of one test run, as the client reports it.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// What ran.
    pub spec: TestSpec,
    /// What it measured.
    pub measured: Measured,
    /// `--verify` was on and every check on both sides ran and passed.
    pub verified: bool,
}

/// One JSON object of `--json` (schema pinned in the project notes).
#[derive(Debug, Serialize)]
struct JsonRow<'a> {
    test: &'a str,
    op: &'a str,
    kind: &'a str,
    size: u32,
    iters: u64,
    qps: u32,
    mode: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lat_us: Option<LatStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bw_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msg_rate_mps: Option<f64>,
    verified: bool,
}

/// The JSON array of `results` (pretty-printed, keys in schema order).
pub fn to_json(results: &[RunResult]) -> String {
    let rows: Vec<JsonRow<'_>> = results
        .iter()
        .map(|r| {
            let s = &r.spec;
            let lat = match &r.measured {
                Measured::Lat(l) => Some(*l),
                Measured::Bw { .. } => None,
            };
            JsonRow {
                test: s.test.name(),
                op: s.test.op.name(),
                kind: s.test.kind.name(),
                size: s.size,
                iters: s.iters,
                qps: s.qps,
                mode: s.mode.name(),
                lat_us: lat,
                bw_gbps: r.measured.gbps(),
                msg_rate_mps: r.measured.mps(),
                verified: r.verified,
            }
        })
        .collect();
    // Serialising plain structs of numbers and strings cannot fail (invariant).
    serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".to_string())
}

/// Column headers of the table.
pub const COLUMNS: [&str; 13] = [
    "test",
    "bytes",
    "iters",
    "qps",
    "mode",
    "min[us]",
    "median[us]",
    "avg[us]",
    "p99[us]",
    "max[us]",
    "BW[GB/s]",
    "rate[Mmsg/s]",
    "verified",
];

const WIDTHS: [usize; 13] = [10, 8, 7, 4, 5, 9, 10, 9, 9, 9, 9, 12, 8];

/// Writes the perftest-like table of `results`.
pub fn write_table(out: &mut impl Write, results: &[RunResult]) -> std::io::Result<()> {
    let rule = "-".repeat(123);
    writeln!(out, "{rule}")?;
    writeln!(out, "{}", row(&COLUMNS.map(str::to_string)))?;
    writeln!(out, "{rule}")?;
    for r in results {
        let s = &r.spec;
        let dash = || "-".to_string();
        let f = |v: f64| format!("{v:.2}");
        let (lat, bw, rate) = match &r.measured {
            Measured::Lat(l) => (
                [f(l.min), f(l.median), f(l.avg), f(l.p99), f(l.max)],
                dash(),
                dash(),
            ),
            m @ Measured::Bw { .. } => (
                [dash(), dash(), dash(), dash(), dash()],
                m.gbps().map_or_else(dash, |v| format!("{v:.6}")),
                m.mps().map_or_else(dash, |v| format!("{v:.6}")),
            ),
        };
        let [a, b, c, d, e] = lat;
        let cells = [
            s.test.name().to_string(),
            s.size.to_string(),
            s.iters.to_string(),
            s.qps.to_string(),
            s.mode.name().to_string(),
            a,
            b,
            c,
            d,
            e,
            bw,
            rate,
            if r.verified { "yes" } else { "no" }.to_string(),
        ];
        writeln!(out, "{}", row(&cells))?;
    }
    writeln!(out, "{rule}")?;
    writeln!(
        out,
        "latency: one-way (half the round trip) for send/write, full round trip for read/atomic; \
         BW in GB/s = 1e9 bytes/s"
    )?;
    Ok(())
}

fn row(cells: &[String; 13]) -> String {
    let mut line = String::new();
    for (i, (c, w)) in cells.iter().zip(WIDTHS).enumerate() {
        if i == 0 {
            line.push_str(&format!("{c:<10}"));
        } else {
            line.push_str(&format!(" {c:>w$}"));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::plan::{Mode, TestKind};

    fn result(test: &str, measured: Measured) -> RunResult {
        RunResult {
            spec: TestSpec {
                test: test.parse::<TestKind>().unwrap(),
                size: 64,
                iters: 10,
                warmup: 1,
                qps: 1,
                tx_depth: 128,
                rx_depth: 512,
                verify: true,
                mode: Mode::Busy,
            },
            measured,
            verified: true,
        }
    }

    fn samples() -> Vec<RunResult> {
        vec![
            result(
                "send_lat",
                Measured::Lat(LatStats {
                    min: 1.0,
                    median: 2.0,
                    avg: 2.5,
                    p99: 9.0,
                    max: 10.0,
                }),
            ),
            result(
                "write_bw",
                Measured::Bw {
                    bytes: 3_000_000_000,
                    msgs: 1_000_000,
                    secs: 2.0,
                },
            ),
        ]
    }

    #[test]
    fn json_follows_the_pinned_schema() {
        let text = to_json(&samples());
        assert!(text.find("\"test\"").unwrap() < text.find("\"op\"").unwrap());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0]["test"], "send_lat");
        assert_eq!(a[0]["op"], "send");
        assert_eq!(a[0]["kind"], "lat");
        assert_eq!(a[0]["size"], 64);
        assert_eq!(a[0]["mode"], "busy");
        assert_eq!(a[0]["lat_us"]["p99"], 9.0);
        assert!(a[0].get("bw_gbps").is_none());
        assert_eq!(a[1]["bw_gbps"], 1.5);
        assert_eq!(a[1]["msg_rate_mps"], 0.5);
        assert!(a[1].get("lat_us").is_none());
        assert_eq!(a[1]["verified"], true);
    }

    #[test]
    fn table_rows_split_into_the_columns() {
        let mut out = Vec::new();
        write_table(&mut out, &samples()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let header = text
            .lines()
            .find(|l| l.starts_with("test"))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>();
        assert_eq!(header, COLUMNS);
        let lat = text.lines().find(|l| l.starts_with("send_lat")).unwrap();
        let cells: Vec<&str> = lat.split_whitespace().collect();
        assert_eq!(cells.len(), COLUMNS.len());
        assert_eq!(cells[6], "2.00");
        let bw = text.lines().find(|l| l.starts_with("write_bw")).unwrap();
        let cells: Vec<&str> = bw.split_whitespace().collect();
        assert_eq!(cells[10], "1.500000");
        assert_eq!(cells[11], "0.500000");
        assert_eq!(cells[12], "yes");
    }
}
