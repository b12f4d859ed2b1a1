//! The progress display of long `uroce perf` runs: a bar on stderr that appears only when
//! stderr is a terminal and a test has been running for [`SHOW_AFTER`].

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a test runs before its bar appears.
pub const SHOW_AFTER: Duration = Duration::from_millis(700);

/// Progress of one test (iterations or messages done out of a total).
pub struct Progress {
    bar: Option<ProgressBar>,
    enabled: bool,
    start: Instant,
    total: u64,
    label: String,
}

impl Progress {
    /// A display for `total` steps labelled `label`; shown only if `enabled`.
    pub fn new(enabled: bool, label: String, total: u64) -> Progress {
        Progress {
            bar: None,
            enabled,
            start: Instant::now(),
            total,
            label,
        }
    }

    /// A display that never shows.
    pub fn hidden() -> Progress {
        Progress::new(false, String::new(), 0)
    }

    /// Records that `pos` steps are done.
    pub fn set(&mut self, pos: u64) {
        if !self.enabled {
            return;
        }
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
            return;
        }
        if self.start.elapsed() >= SHOW_AFTER {
            let bar = ProgressBar::with_draw_target(Some(self.total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix:>12} [{bar:40}] {human_pos}/{human_len} (eta {eta})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(self.label.clone());
            bar.set_position(pos);
            self.bar = Some(bar);
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
