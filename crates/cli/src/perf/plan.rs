//! What `uroce perf` runs: the tests, their parameters and the defaults.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Largest message a test may use: the device's maximum message size (8 MiB).
pub const MAX_SIZE: u32 = 8 << 20;

/// The operation a test exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// ATOMIC FETCH_AND_ADD.
    Atomic,
}

impl Op {
    /// The lower-case name used in test names and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
            Op::Atomic => "atomic",
        }
    }
}

/// Latency (ping-pong / round trip) or bandwidth (a window of outstanding WRs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Latency.
    Lat,
    /// Bandwidth and message rate.
    Bw,
}

impl Kind {
    /// `lat` or `bw`.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Lat => "lat",
            Kind::Bw => "bw",
        }
    }
}

/// One of the eight tests (`send_lat` … `atomic_bw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TestKind {
    /// The operation.
    pub op: Op,
    /// Latency or bandwidth.
    pub kind: Kind,
}

impl TestKind {
    /// A test.
    pub const fn new(op: Op, kind: Kind) -> TestKind {
        TestKind { op, kind }
    }

    /// The test name, e.g. `write_bw`.
    pub const fn name(self) -> &'static str {
        match (self.op, self.kind) {
            (Op::Send, Kind::Lat) => "send_lat",
            (Op::Write, Kind::Lat) => "write_lat",
            (Op::Read, Kind::Lat) => "read_lat",
            (Op::Atomic, Kind::Lat) => "atomic_lat",
            (Op::Send, Kind::Bw) => "send_bw",
            (Op::Write, Kind::Bw) => "write_bw",
            (Op::Read, Kind::Bw) => "read_bw",
            (Op::Atomic, Kind::Bw) => "atomic_bw",
        }
    }
}

/// The standard set, in the order `uroce perf` runs it.
pub const STANDARD: [TestKind; 8] = [
    TestKind::new(Op::Send, Kind::Lat),
    TestKind::new(Op::Write, Kind::Lat),
    TestKind::new(Op::Read, Kind::Lat),
    TestKind::new(Op::Atomic, Kind::Lat),
    TestKind::new(Op::Send, Kind::Bw),
    TestKind::new(Op::Write, Kind::Bw),
    TestKind::new(Op::Read, Kind::Bw),
    TestKind::new(Op::Atomic, Kind::Bw),
];

impl fmt::Display for TestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A test name that is not one of the eight.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown test {0:?} (expected send_lat, write_lat, read_lat, atomic_lat, send_bw, write_bw, read_bw or atomic_bw)")]
pub struct UnknownTest(pub String);

impl FromStr for TestKind {
    type Err = UnknownTest;
    fn from_str(s: &str) -> Result<TestKind, UnknownTest> {
        STANDARD
            .iter()
            .copied()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| UnknownTest(s.to_string()))
    }
}

impl TryFrom<String> for TestKind {
    type Error = UnknownTest;
    fn try_from(s: String) -> Result<TestKind, UnknownTest> {
        s.parse()
    }
}

impl From<TestKind> for String {
    fn from(t: TestKind) -> String {
        t.name().to_string()
    }
}

/// How completions are waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Poll the CQ in a loop, driving the network from the polling thread.
    Busy,
    /// Arm the CQ, sleep on its completion channel, then poll; a background thread drives
    /// the network.
    Event,
}

impl Mode {
    /// `busy` or `event`.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Busy => "busy",
            Mode::Event => "event",
        }
    }
}

/// Everything both sides need to know about one test run; the client sends it to the
/// server, and both derive their buffer layout from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestSpec {
    /// Which test.
    pub test: TestKind,
    /// Message size in bytes.
    pub size: u32,
    /// Measured iterations (messages per QP for bandwidth tests).
    pub iters: u64,
    /// Unmeasured iterations run first (latency tests).
    pub warmup: u64,
    /// Number of QPs used in parallel.
    pub qps: u32,
    /// Outstanding send WRs per QP in bandwidth tests.
    pub tx_depth: u32,
    /// Receive WRs kept posted per QP in `send_bw`.
    pub rx_depth: u32,
    /// Fill and check data patterns.
    pub verify: bool,
    /// How completions are waited for.
    pub mode: Mode,
}

impl TestSpec {
    /// Checks the parameters; the server runs this on what the client sent.
    pub fn validate(&self) -> Result<(), String> {
        let t = self.test;
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(format!("{t}: size {} is outside 1..={MAX_SIZE}", self.size));
        }
        if t.op == Op::Atomic && self.size != 8 {
            return Err(format!("{t}: atomics are 8 bytes, not {}", self.size));
        }
        if t == TestKind::new(Op::Write, Kind::Lat) && self.size < 8 {
            return Err(format!(
                "write_lat needs at least 8 bytes (the iteration counter), not {}",
                self.size
            ));
        }
        if self.iters == 0 || self.iters > 1 << 40 {
            return Err(format!("{t}: iterations {} out of range", self.iters));
        }
        if self.warmup > 1 << 20 {
            return Err(format!("{t}: warm-up {} out of range", self.warmup));
        }
        if !(1..=64).contains(&self.qps) {
            return Err(format!("{t}: {} QPs (1..=64 supported)", self.qps));
        }
        if !(1..=4096).contains(&self.tx_depth) || !(1..=4096).contains(&self.rx_depth) {
            return Err(format!(
                "{t}: tx depth {} / rx depth {} outside 1..=4096",
                self.tx_depth, self.rx_depth
            ));
        }
        Ok(())
    }

    /// Iterations including warm-up.
    pub fn total(&self) -> u64 {
        self.iters + self.warmup
    }
}

/// Default message size of latency tests.
pub const DEFAULT_LAT_SIZE: u32 = 8;
/// Default message size of bandwidth tests.
pub const DEFAULT_BW_SIZE: u32 = 1 << 20;
/// The extra small-message `write_bw` row of the standard set (message rate).
pub const MSG_RATE_SIZE: u32 = 64;
/// Default iterations of latency tests.
pub const DEFAULT_LAT_ITERS: u64 = 1000;
/// Default bytes moved per QP by a bandwidth test (iterations = this / size, clamped).
pub const DEFAULT_BW_BYTES: u64 = 64 << 20;
/// Bounds of the default bandwidth iterations.
pub const DEFAULT_BW_ITERS: (u64, u64) = (64, 5000);

/// Default iterations of a test of `size` bytes.
pub fn default_iters(test: TestKind, size: u32) -> u64 {
    match test.kind {
        Kind::Lat => DEFAULT_LAT_ITERS,
        Kind::Bw => (DEFAULT_BW_BYTES / u64::from(size.max(1)))
            .clamp(DEFAULT_BW_ITERS.0, DEFAULT_BW_ITERS.1),
    }
}

/// Unmeasured iterations before a latency test of `iters` iterations.
pub fn default_warmup(test: TestKind, iters: u64) -> u64 {
    match test.kind {
        Kind::Lat => (iters / 10).min(100),
        Kind::Bw => 0,
    }
}

/// The (test, size) rows of a run: every test of `tests` at every size of `sizes`, or at
/// its default sizes (8 B latency, 1 MiB bandwidth, plus 64 B `write_bw`); atomics are
/// always 8 bytes.
pub fn rows(tests: &[TestKind], sizes: Option<&[u32]>) -> Vec<(TestKind, u32)> {
    let mut out = Vec::new();
    for &t in tests {
        if t.op == Op::Atomic {
            out.push((t, 8));
            continue;
        }
        match sizes {
            Some(list) => out.extend(list.iter().map(|&s| (t, s))),
            None => match t.kind {
                Kind::Lat => out.push((t, DEFAULT_LAT_SIZE)),
                Kind::Bw => {
                    out.push((t, DEFAULT_BW_SIZE));
                    if t.op == Op::Write {
                        out.push((t, MSG_RATE_SIZE));
                    }
                }
            },
        }
    }
    out
}

/// Parses a size: a number with an optional `K`/`k`/`KiB`, `M`/`MiB` suffix (binary units)
/// or `B`.
pub fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("size {s:?}: expected a number like 64, 4K or 1M"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        other => return Err(format!("size {s:?}: unknown unit {other:?}")),
    };
    let v = n
        .checked_mul(mult)
        .filter(|v| (1..=u64::from(MAX_SIZE)).contains(v))
        .ok_or_else(|| format!("size {s:?}: must be between 1 B and 8 MiB"))?;
    u32::try_from(v).map_err(|_| format!("size {s:?} too large"))
}

/// Parses a comma-separated list of sizes.
pub fn parse_sizes(s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(parse_size)
        .collect()
}

/// Parses a comma-separated list of test names.
pub fn parse_tests(s: &str) -> Result<Vec<TestKind>, String> {
    let v: Result<Vec<TestKind>, _> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect();
    let v = v.map_err(|e| e.to_string())?;
    if v.is_empty() {
        return Err("empty test list".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in STANDARD {
            assert_eq!(t.name().parse::<TestKind>().unwrap(), t);
            assert_eq!(format!("{}_{}", t.op.name(), t.kind.name()), t.name());
        }
        assert!("send".parse::<TestKind>().is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1MiB").unwrap(), 1_048_576);
        assert_eq!(parse_size("8M").unwrap(), 8 * 1_048_576);
        assert!(parse_size("9M").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("12q").is_err());
        assert_eq!(parse_sizes("64,1k").unwrap(), vec![64, 1024]);
    }

    #[test]
    fn standard_rows() {
        let r = rows(&STANDARD, None);
        let names: Vec<String> = r.iter().map(|(t, s)| format!("{t}/{s}")).collect();
        assert_eq!(
            names,
            [
                "send_lat/8",
                "write_lat/8",
                "read_lat/8",
                "atomic_lat/8",
                "send_bw/1048576",
                "write_bw/1048576",
                "write_bw/64",
                "read_bw/1048576",
                "atomic_bw/8"
            ]
        );
        let r = rows(&STANDARD[..2], Some(&[16, 32]));
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn spec_json_round_trips() {
        let spec = TestSpec {
            test: "read_bw".parse().unwrap(),
            size: 4096,
            iters: 10,
            warmup: 0,
            qps: 2,
            tx_depth: 128,
            rx_depth: 256,
            verify: true,
            mode: Mode::Event,
        };
        let j = serde_json::to_string(&spec).unwrap();
        assert!(j.contains("\"test\":\"read_bw\""), "{j}");
        assert!(j.contains("\"mode\":\"event\""), "{j}");
        let back: TestSpec = serde_json::from_str(&j).unwrap();
        assert_eq!(back, spec);
        assert!(spec.validate().is_ok());
        let bad = TestSpec { size: 0, ..spec };
        assert!(bad.validate().is_err());
    }
}
