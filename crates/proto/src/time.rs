//! Time as the caller passes it in.
//!
//! The engines never read a clock. Every input that can depend on time takes an
//! [`Instant`]; every timer the engines want is reported back as an [`Instant`] deadline.
//! The I/O layer feeds a monotonic clock; the simulated network feeds virtual time.

use core::ops::{Add, AddAssign};
use core::time::Duration;

/// A point in time: nanoseconds since an epoch chosen by the caller. Monotonic by contract:
/// callers never pass an `Instant` earlier than one they passed before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Instant = Instant(0);

    /// `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating at the far future.
    pub fn saturating_add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

/// The local ACK timeout of an RC QP: 4.096 µs × 2^`timeout` (IBA Vol 1 §9.7);
/// `None` for `timeout == 0` (never time out). Values above 31 are treated as 31.
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << timeout.min(31)))
    }
}

#[cfg(test)]
#[path = "tests/time.rs"]
mod tests;
