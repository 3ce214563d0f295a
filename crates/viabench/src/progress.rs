//! The progress bar on stderr: drawn in place on a terminal, one line per
//! finished test otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Progress over all sizes of all tests.
pub struct Progress {
    total: usize,
    done: usize,
    tty: bool,
    enabled: bool,
    last: Option<Instant>,
}

impl Progress {
    /// `total` steps; `enabled` false draws nothing at all.
    pub fn new(total: usize, enabled: bool) -> Progress {
        Progress { total: total.max(1), done: 0, tty: std::io::stderr().is_terminal(), enabled, last: None }
    }

    /// The bar for `done` of `total` steps, `width` characters wide.
    pub fn bar(done: usize, total: usize, width: usize) -> String {
        let filled = (done.min(total) * width) / total.max(1);
        format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
    }

    /// About to measure `bytes` of test `label`.
    pub fn at(&mut self, label: &str, bytes: usize) {
        if !self.enabled || !self.tty {
            return;
        }
        if self.last.is_some_and(|t| t.elapsed() < Duration::from_millis(50)) {
            return;
        }
        self.last = Some(Instant::now());
        let pct = self.done * 100 / self.total;
        eprint!("\r\x1b[K{} {pct:3}% {label} {bytes} B", Progress::bar(self.done, self.total, 30));
        let _ = std::io::stderr().flush();
    }

    /// One step done.
    pub fn step(&mut self) {
        self.done += 1;
    }

    /// Skips the steps a test did not need.
    pub fn skip(&mut self, steps: usize) {
        self.done += steps;
    }

    /// A test finished.
    pub fn test_done(&mut self, label: &str, rows: usize, error: Option<&str>) {
        if !self.enabled {
            return;
        }
        if self.tty {
            eprint!("\r\x1b[K");
        }
        match error {
            Some(e) => eprintln!("viabench: {label}: {rows} sizes, stopped: {e}"),
            None if !self.tty => eprintln!("viabench: {label}: {rows} sizes"),
            None => {}
        }
        self.last = None;
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if self.enabled && self.tty {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_in_proportion() {
        assert_eq!(Progress::bar(0, 10, 10), "[..........]");
        assert_eq!(Progress::bar(5, 10, 10), "[#####.....]");
        assert_eq!(Progress::bar(12, 10, 4), "[####]");
    }
}
