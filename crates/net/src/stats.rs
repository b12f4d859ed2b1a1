//! What a running device shows its users: its counters, device-wide and per QP.
//!
//! A program that runs on uroce through the C library has no other way to learn that its
//! datagrams are dropped, or why. So every open device publishes a snapshot of its
//! counters ([`DeviceStat`]) as a text file, `<dir>/<pid>-<device>-<address>.stat`, which
//! `uroce stat` reads and prints:
//! * `<dir>` is `UROCE_STAT_DIR` when set, else `stat/` in the user's host directory
//!   (`uroce_socket::host::host_dir`: `/dev/shm/uroce-<uid>`, without `/dev/shm`
//!   `/tmp/uroce-<uid>`), which depends on nothing of a process's environment, so `uroce
//!   stat` run from any shell, service or cron job of the user sees every program's
//!   devices ([`stat_dir`]); made with mode 0700;
//! * the device's progress thread writes the file at most every [`PUBLISH_EVERY`] and only
//!   when a counter changed, atomically (a temporary file renamed over it), and once more
//!   when the device closes, which then removes it; a reader skips (and removes, when it
//!   may) the files of processes that are gone (a killed program leaves its file);
//! * the format is a header of `key value` lines, then sections: `[device]` with every
//!   device counter (the socket's, the context's look-ups, the CM's, and the transport
//!   counters summed over the QPs alive and gone), and `[qp 0x<qpn> <type> <state>]` with
//!   each live QP's transport counters, one `name value` line each ([`DeviceStat::parse`]
//!   reads it back).
//!
//! Inside `uroce run`'s presentation the device also keeps the presented
//! `/sys/class/infiniband/<device>/ports/1/hw_counters/` files current, as the kernel's
//! rxe does: one file per counter, under rxe's names where rxe has the counter
//! ([`RXE_NAMES`]) and under uroce's names for all of them.
//!
//! A coming change makes one device shared by every process of a host; this module then
//! moves with the device runtime.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use uroce_proto::time::Instant;

/// Environment variable that chooses the directory of the published counters.
pub const STAT_DIR_ENV: &str = "UROCE_STAT_DIR";

/// A device publishes its counters at most this often.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// rxe's `hw_counters` names of the counters uroce has too: (rxe's name, uroce's name).
pub const RXE_NAMES: &[(&str, &str)] = &[
    ("sent_pkts", "tx_packets"),
    ("rcvd_pkts", "rx_packets"),
    ("duplicate_request", "duplicates_received"),
    ("out_of_seq_request", "dropped_out_of_sequence"),
    ("rcvd_rnr_err", "rnr_naks_received"),
    ("send_rnr_err", "rnr_naks_sent"),
    ("rcvd_seq_err", "seq_naks_received"),
    ("retry_exceeded_err", "retry_exceeded"),
    ("retry_rnr_exceeded_err", "rnr_retry_exceeded"),
    ("completer_retry_err", "retries"),
    ("send_err", "send_errors"),
];

/// Where devices publish their counters (see the module documentation).
pub fn stat_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(STAT_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    uroce_socket::host::host_dir().join("stat")
}

/// One QP's published counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpStat {
    /// QP number.
    pub qpn: u32,
    /// Transport type (`RC`, `UC`, `UD`, `GSI`, `XRC_SEND`, `XRC_RECV`).
    pub qp_type: String,
    /// State (`RTS`, `ERR`, …).
    pub state: String,
    /// `(name, value)` of each transport counter.
    pub counters: Vec<(String, u64)>,
}

/// A device's published counters (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceStat {
    /// The process the device lives in.
    pub pid: u32,
    /// Device name.
    pub name: String,
    /// The device's address.
    pub addr: IpAddr,
    /// `(name, value)` of each device counter.
    pub counters: Vec<(String, u64)>,
    /// The live QPs with a transport engine.
    pub qps: Vec<QpStat>,
}

/// The first line of a published file.
const MAGIC: &str = "uroce-stat 1";

impl DeviceStat {
    /// A device counter by name.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(n, _)| n == name).map(|c| c.1)
    }

    /// The text of the published file.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut t = String::new();
        let _ = writeln!(t, "{MAGIC}");
        let _ = writeln!(t, "pid {}", self.pid);
        let _ = writeln!(t, "device {}", self.name);
        let _ = writeln!(t, "address {}", self.addr);
        let _ = writeln!(t, "\n[device]");
        for (n, v) in &self.counters {
            let _ = writeln!(t, "{n} {v}");
        }
        for q in &self.qps {
            let _ = writeln!(t, "\n[qp {:#08x} {} {}]", q.qpn, q.qp_type, q.state);
            for (n, v) in &q.counters {
                let _ = writeln!(t, "{n} {v}");
            }
        }
        t
    }

    /// Reads back [`DeviceStat::to_text`].
    ///
    /// # Errors
    /// A description of the first line that does not fit the format.
    pub fn parse(text: &str) -> Result<DeviceStat, String> {
        let mut lines = text.lines().enumerate();
        if lines.next().map(|(_, l)| l) != Some(MAGIC) {
            return Err(format!("not a uroce counter file (no {MAGIC:?} line)"));
        }
        let (mut pid, mut name, mut addr) = (None, None, None);
        let mut counters = Vec::new();
        let mut qps: Vec<QpStat> = Vec::new();
        let mut in_qp = false;
        for (i, line) in lines {
            let bad = || format!("line {}: {line:?}", i + 1);
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                let w: Vec<&str> = section.split_whitespace().collect();
                match w.as_slice() {
                    ["device"] => in_qp = false,
                    ["qp", qpn, ty, st] => {
                        let qpn = u32::from_str_radix(qpn.trim_start_matches("0x"), 16)
                            .map_err(|_| bad())?;
                        qps.push(QpStat {
                            qpn,
                            qp_type: (*ty).to_owned(),
                            state: (*st).to_owned(),
                            counters: Vec::new(),
                        });
                        in_qp = true;
                    }
                    _ => return Err(bad()),
                }
                continue;
            }
            let (k, v) = line.split_once(' ').ok_or_else(bad)?;
            match k {
                "pid" if counters.is_empty() && !in_qp => {
                    pid = Some(v.parse().map_err(|_| bad())?);
                }
                "device" if counters.is_empty() && !in_qp => name = Some(v.to_owned()),
                "address" if counters.is_empty() && !in_qp => {
                    addr = Some(v.parse().map_err(|_| bad())?);
                }
                _ => {
                    let v: u64 = v.parse().map_err(|_| bad())?;
                    match qps.last_mut() {
                        Some(q) if in_qp => q.counters.push((k.to_owned(), v)),
                        _ => counters.push((k.to_owned(), v)),
                    }
                }
            }
        }
        Ok(DeviceStat {
            pid: pid.ok_or("no pid line")?,
            name: name.ok_or("no device line")?,
            addr: addr.ok_or("no address line")?,
            counters,
            qps,
        })
    }
}

/// Every device published in `dir` by a process that still runs, in file-name order;
/// files of processes that are gone are removed (when this user may) and skipped, and so
/// are files that do not parse.
pub fn read_all(dir: &Path) -> Vec<DeviceStat> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "stat"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let Ok(stat) = DeviceStat::parse(&text) else {
            continue;
        };
        if !Path::new(&format!("/proc/{}", stat.pid)).exists() {
            let _ = std::fs::remove_file(&f);
            continue;
        }
        out.push(stat);
    }
    out
}

/// Publishes one device's counters (see the module documentation).
#[derive(Debug)]
pub(crate) struct Publisher {
    file: PathBuf,
    hw_dir: Option<PathBuf>,
    last: String,
    last_hw: HashMap<String, u64>,
    next: Option<Instant>,
}

impl Publisher {
    /// A publisher for device `name` on `addr`; with `hw_dir`, the presented `hw_counters`
    /// directory to keep current too.
    pub(crate) fn new(name: &str, addr: IpAddr, hw_dir: Option<PathBuf>) -> Publisher {
        let file = stat_dir().join(format!("{}-{name}-{addr}.stat", std::process::id()));
        Publisher {
            file,
            hw_dir,
            last: String::new(),
            last_hw: HashMap::new(),
            next: None,
        }
    }

    /// Whether a periodic publication is due at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|n| now >= n)
    }

    /// Publishes `stat` if it changed since the last time. Failures (no directory, a full
    /// disk) are ignored: counters are a view, never a reason to fail the device.
    pub(crate) fn publish(&mut self, stat: &DeviceStat, now: Instant) {
        self.next = Some(now.saturating_add(PUBLISH_EVERY));
        let text = stat.to_text();
        if text != self.last {
            if let Some(dir) = self.file.parent() {
                use std::os::unix::fs::DirBuilderExt as _;
                let _ = std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir);
            }
            let tmp = self.file.with_extension("stat.tmp");
            if std::fs::write(&tmp, &text).is_ok() && std::fs::rename(&tmp, &self.file).is_ok() {
                self.last = text;
            }
        }
        if let Some(dir) = &self.hw_dir {
            let _ = std::fs::create_dir_all(dir);
            let value = |name: &str| stat.counter(name).unwrap_or(0);
            let rxe = RXE_NAMES.iter().map(|(r, ours)| (*r, value(ours)));
            let ours = stat.counters.iter().map(|(n, v)| (n.as_str(), *v));
            for (name, v) in rxe.chain(ours) {
                if self.last_hw.get(name) != Some(&v)
                    && std::fs::write(dir.join(name), format!("{v}\n")).is_ok()
                {
                    self.last_hw.insert(name.to_owned(), v);
                }
            }
        }
    }

    /// Removes the published file (the `hw_counters` keep their last values).
    pub(crate) fn remove(&mut self) {
        if !self.last.is_empty() {
            let _ = std::fs::remove_file(&self.file);
            self.last.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_reads_back() {
        let s = DeviceStat {
            pid: 42,
            name: "uroce0".into(),
            addr: "::1".parse().expect("addr"),
            counters: vec![("rx_packets".into(), 7), ("bad_icrc".into(), 0)],
            qps: vec![QpStat {
                qpn: 0x11,
                qp_type: "RC".into(),
                state: "RTS".into(),
                counters: vec![("dropped_bad_address".into(), 3)],
            }],
        };
        let t = s.to_text();
        assert!(
            t.contains("[qp 0x000011 RC RTS]\ndropped_bad_address 3\n"),
            "{t}"
        );
        assert_eq!(DeviceStat::parse(&t), Ok(s));
        assert!(DeviceStat::parse("something else").is_err());
        assert!(DeviceStat::parse(&t.replace("rx_packets 7", "rx_packets x")).is_err());
    }
}
