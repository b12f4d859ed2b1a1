//! Latency statistics and the results of one test run.

use serde::Serialize;

/// Summary of a latency sample, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatStats {
    /// Smallest sample.
    pub min: f64,
    /// Median (the lower middle sample for an even count).
    pub median: f64,
    /// Arithmetic mean.
    pub avg: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl LatStats {
    /// Summarises `samples` (microseconds); `None` for an empty sample.
    pub fn from_samples(samples: &[f64]) -> Option<LatStats> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        // Nearest-rank percentile: the smallest sample with at least p% at or below it.
        let rank = |p: f64| -> f64 {
            let r = ((p / 100.0) * n as f64).ceil() as usize;
            s[r.clamp(1, n) - 1]
        };
        Some(LatStats {
            min: s[0],
            median: s[(n - 1) / 2],
            avg: s.iter().sum::<f64>() / n as f64,
            p99: rank(99.0),
            max: s[n - 1],
        })
    }

    /// Every value scaled by `f` (e.g. 0.5 for one-way latency from round trips).
    pub fn scaled(self, f: f64) -> LatStats {
        LatStats {
            min: self.min * f,
            median: self.median * f,
            avg: self.avg * f,
            p99: self.p99 * f,
            max: self.max * f,
        }
    }
}

/// What a test measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Measured {
    /// Latency (one-way for send/write, round trip for read/atomic).
    Lat(LatStats),
    /// Bandwidth.
    Bw {
        /// Payload bytes moved (all QPs).
        bytes: u64,
        /// Messages completed (all QPs).
        msgs: u64,
        /// Seconds from the first post to the last completion.
        secs: f64,
    },
}

impl Measured {
    /// GB/s (10^9 bytes per second) of a bandwidth result.
    pub fn gbps(&self) -> Option<f64> {
        match *self {
            Measured::Bw { bytes, secs, .. } if secs > 0.0 => Some(bytes as f64 / secs / 1e9),
            _ => None,
        }
    }

    /// Million messages per second of a bandwidth result.
    pub fn mps(&self) -> Option<f64> {
        match *self {
            Measured::Bw { msgs, secs, .. } if secs > 0.0 => Some(msgs as f64 / secs / 1e6),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_one_to_hundred() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = LatStats::from_samples(&v).unwrap();
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 100.0);
        assert_eq!(s.median, 50.0);
        assert_eq!(s.avg, 50.5);
        assert_eq!(s.p99, 99.0);
        let h = s.scaled(0.5);
        assert_eq!(h.max, 50.0);
        assert!(LatStats::from_samples(&[]).is_none());
        let one = LatStats::from_samples(&[3.0]).unwrap();
        assert_eq!(
            (one.min, one.median, one.p99, one.max),
            (3.0, 3.0, 3.0, 3.0)
        );
    }

    #[test]
    fn bandwidth_units() {
        let m = Measured::Bw {
            bytes: 2_000_000_000,
            msgs: 4_000_000,
            secs: 2.0,
        };
        assert_eq!(m.gbps(), Some(1.0));
        assert_eq!(m.mps(), Some(2.0));
    }
}
