//! A progress bar on stderr, shown only once a run has taken more than a second, so fast
//! simulations stay silent and long engine runs are visibly alive.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kbench_core::harness::Progress;

const SHOW_AFTER: Duration = Duration::from_secs(1);

pub struct LevelProgress {
    label: String,
    quiet: bool,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl LevelProgress {
    pub fn new(label: String, quiet: bool) -> LevelProgress {
        LevelProgress {
            label,
            quiet,
            started: Instant::now(),
            bar: None,
        }
    }

    fn bar(&mut self, total: u32) -> Option<&ProgressBar> {
        if self.quiet || self.started.elapsed() < SHOW_AFTER {
            return None;
        }
        if self.bar.is_none() {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} requests {msg} ({elapsed})",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            bar.set_prefix(self.label.clone());
            self.bar = Some(bar);
        }
        self.bar.as_ref()
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Progress for LevelProgress {
    fn level_started(&mut self, concurrency: u32, total: u32) {
        if let Some(bar) = self.bar(total) {
            bar.set_length(total as u64);
            bar.set_position(0);
            bar.set_message(format!("C={concurrency}"));
        }
    }

    fn request_finished(&mut self, concurrency: u32, done: u32, total: u32) {
        if let Some(bar) = self.bar(total) {
            bar.set_length(total as u64);
            bar.set_message(format!("C={concurrency}"));
            bar.set_position(done as u64);
        }
    }
}
