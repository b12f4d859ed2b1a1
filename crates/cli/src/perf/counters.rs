//! `uroce perf --counters`: the device and per-QP counters of both sides after each test.
//!
//! Each side takes a [`CounterReport`] once a test's traffic is over (after the `Done`
//! barrier): its device's counters — cumulative since the device was opened — and the
//! counters of the test's QPs. The client asks the server for its report over the
//! out-of-band connection ([`super::oob::Msg::GetCounters`]) and prints both, one line
//! per device and per QP, non-zero fields only:
//!
//! ```text
//! counters after write_bw 65536 B:
//! counters client dev: tx_packets=6400 tx_bytes=6630400 rx_packets=… …
//! counters client qp 0x11: packets_sent=6400 …
//! counters server dev: …
//! counters server qp 0x12: …
//! ```

use std::io::Write;

use serde::{Deserialize, Serialize};
use uroce_net::NetDevice;

/// Counters as `(name, value)` pairs, in the device's order.
pub type CounterList = Vec<(String, u64)>;

/// One QP's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCounterReport {
    /// The QP number.
    pub qpn: u32,
    /// Its transport counters.
    pub fields: CounterList,
}

/// One side's counters after a test.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterReport {
    /// The device's counters (cumulative since it was opened).
    pub device: CounterList,
    /// The counters of the test's QPs (those that have a transport engine).
    pub qps: Vec<QpCounterReport>,
}

fn owned(fields: Vec<(&'static str, u64)>) -> CounterList {
    fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

impl CounterReport {
    /// The counters of `dev` now and of its QPs `qpns`.
    pub fn take(dev: &NetDevice, qpns: impl IntoIterator<Item = u32>) -> CounterReport {
        CounterReport {
            device: owned(dev.counters().fields()),
            qps: qpns
                .into_iter()
                .filter_map(|qpn| dev.qp_counters(qpn))
                .map(|c| QpCounterReport {
                    qpn: c.qpn,
                    fields: owned(c.fields()),
                })
                .collect(),
        }
    }

    /// Writes the report's lines for `side` (`client` or `server`).
    pub fn write(&self, out: &mut impl Write, side: &str) -> std::io::Result<()> {
        writeln!(out, "counters {side} dev: {}", nonzero(&self.device))?;
        for q in &self.qps {
            writeln!(
                out,
                "counters {side} qp {:#x}: {}",
                q.qpn,
                nonzero(&q.fields)
            )?;
        }
        Ok(())
    }
}

/// `name=value` for every non-zero counter, space-separated; `all zero` if none is.
pub fn nonzero(fields: &[(String, u64)]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if parts.is_empty() {
        "all zero".to_string()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_fields_are_left_out() {
        let f: CounterList = vec![
            ("tx_packets".into(), 3),
            ("bad_icrc".into(), 0),
            ("rx_packets".into(), 12),
        ];
        assert_eq!(nonzero(&f), "tx_packets=3 rx_packets=12");
        assert_eq!(nonzero(&[("a".into(), 0)]), "all zero");
    }

    #[test]
    fn report_lines() {
        let r = CounterReport {
            device: vec![("tx_packets".into(), 5), ("eagain".into(), 0)],
            qps: vec![
                QpCounterReport {
                    qpn: 0x11,
                    fields: vec![("packets_sent".into(), 4)],
                },
                QpCounterReport {
                    qpn: 0x2a,
                    fields: vec![("timeouts".into(), 0)],
                },
            ],
        };
        let mut out = Vec::new();
        r.write(&mut out, "server").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "counters server dev: tx_packets=5\n\
             counters server qp 0x11: packets_sent=4\n\
             counters server qp 0x2a: all zero\n"
        );
        // The report crosses the out-of-band connection as JSON.
        let back: CounterReport =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
