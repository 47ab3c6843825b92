//! Progress on stderr: a bar on a terminal, a line every two seconds in a
//! log, nothing when the summary goes out as JSON.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How a demo shows its progress on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing.
    Off,
    /// A progress bar (for a terminal).
    Bar,
    /// A line every two seconds (for logs).
    Lines,
}

impl Progress {
    /// Nothing when the summary is printed as JSON, else a bar on a
    /// terminal and lines elsewhere.
    pub fn for_stderr(json: bool) -> Progress {
        match (json, std::io::stderr().is_terminal()) {
            (true, _) => Progress::Off,
            (false, true) => Progress::Bar,
            (false, false) => Progress::Lines,
        }
    }
}

/// One run's progress: `done` of an expected total of work, and a status.
#[derive(Debug)]
pub struct Meter {
    progress: Progress,
    bar: ProgressBar,
    unit: &'static str,
    started: Instant,
    last_line: Instant,
}

impl Meter {
    /// Progress towards `total` units of work (`"messages handled"`).
    pub fn new(progress: Progress, total: u64, unit: &'static str) -> Meter {
        let bar = if progress == Progress::Bar {
            ProgressBar::new(total)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "{{spinner}} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {unit} · {{msg}}"
            ))
            .expect("valid template"),
        );
        let now = Instant::now();
        Meter {
            progress,
            bar,
            unit,
            started: now,
            last_line: now,
        }
    }

    /// Shows `done` units and `status` (on the bar, or in a line when one is due).
    pub fn show(&mut self, done: u64, status: &str) {
        self.bar.set_position(done);
        self.bar.set_message(status.to_owned());
        if self.progress == Progress::Lines && self.last_line.elapsed() >= Duration::from_secs(2) {
            self.last_line = Instant::now();
            eprintln!(
                "[{:>5.1} s] {done} {}, {status}",
                self.started.elapsed().as_secs_f64(),
                self.unit
            );
        }
    }

    /// Takes the bar off the terminal.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
