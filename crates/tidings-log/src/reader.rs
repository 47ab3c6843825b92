//! The reader loop of one subscription: reads the log after its cursor into
//! the window, waits when the window is full or the log has nothing new, and
//! stores the settled offset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings_core::log::{LogBackend, LogPosition};
use tidings_core::{Backoff, Delivery, Partition};

use crate::acker::LogAcker;
use crate::config::LogReaderConfig;
use crate::window::{Sender, Shared};

pub(crate) struct Reader<B> {
    pub(crate) backend: Arc<B>,
    pub(crate) config: LogReaderConfig,
    pub(crate) group: String,
    pub(crate) topic: String,
    pub(crate) partition: Partition,
    pub(crate) shared: Arc<Shared>,
    pub(crate) sender: Sender,
    pub(crate) cursor: LogPosition,
    pub(crate) committed: LogPosition,
}

impl<B: LogBackend> Reader<B> {
    pub(crate) async fn run(mut self) {
        let mut last_commit = Instant::now();
        let mut failures = 0u32;
        let mut appended = self.backend.append_signal();
        let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        loop {
            if self.sender.is_closed() {
                break;
            }
            let in_flight = self.shared.window.lock().expect("window lock").entries.len();
            if in_flight >= self.config.max_in_flight {
                // Backpressure: wait for the consumer to settle something.
                let _ =
                    tokio::time::timeout(self.config.poll_interval, self.shared.settled_signal.notified())
                        .await;
                self.commit_if_due(&mut last_commit, false).await;
                continue;
            }
            let limit = self.config.batch_size.min(self.config.max_in_flight - in_flight);
            // Seen-before-read: an append after this line wakes the wait below.
            appended.mark_unchanged();
            let entries = match self
                .backend
                .read(&self.topic, self.partition, self.cursor, limit)
                .await
            {
                Ok(entries) => {
                    failures = 0;
                    entries
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(transport = self.backend.name(), topic = %self.topic, group = %self.group, error = %e.report(), "reading the log failed; retrying");
                    tokio::time::sleep(backoff.delay(failures)).await;
                    continue;
                }
            };
            if entries.is_empty() {
                self.commit_if_due(&mut last_commit, true).await;
                tokio::select! {
                    _ = tokio::time::timeout(self.config.poll_interval, appended.changed()) => {}
                    _ = self.sender.closed() => break,
                }
                continue;
            }
            {
                let mut window = self.shared.window.lock().expect("window lock");
                window.entries.extend(entries.iter().map(|e| (e.at, false)));
            }
            for entry in entries {
                self.cursor = entry.at;
                let acker = LogAcker {
                    shared: self.shared.clone(),
                    at: entry.at,
                    message: entry.message.clone(),
                    count: 1,
                    sender: self.sender.clone(),
                };
                if self
                    .sender
                    .send(Ok(Delivery::new(entry.message, 1, acker)))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            self.commit_if_due(&mut last_commit, false).await;
        }
        self.commit_if_due(&mut last_commit, true).await;
    }

    async fn commit_if_due(&mut self, last: &mut Instant, force: bool) {
        if !force && last.elapsed() < self.config.commit_interval {
            return;
        }
        let settled = self.shared.window.lock().expect("window lock").settled;
        if settled <= self.committed {
            return;
        }
        match self
            .backend
            .commit_offset(&self.group, &self.topic, self.partition, settled)
            .await
        {
            Ok(()) => {
                self.committed = settled;
                *last = Instant::now();
            }
            Err(e) => {
                tracing::warn!(transport = self.backend.name(), topic = %self.topic, group = %self.group, error = %e.report(), "storing the log offset failed; will retry");
            }
        }
    }
}
