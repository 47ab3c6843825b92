//! The database-log transport, written once for every database.
//!
//! A store crate provides a [`LogBackend`]: append to a table, read it
//! after a position, keep per-group offsets. [`LogPublisher`] and
//! [`LogSubscriber`] turn that into a [`Publisher`] and a [`Subscriber`]
//! with the same semantics as a broker:
//!
//! - a group's offset only moves past a message once it and every message
//!   before it were settled, so a crash redelivers, never skips;
//! - a `Nak(delay)` redelivers the message after the delay (in this process),
//!   keeping the offset behind it;
//! - a bounded window of unsettled messages gives backpressure.
//!
//! The backend decides what a position is. On PostgreSQL it is the pair
//! (transaction id, sequence), read only below the oldest transaction still
//! running, so a row that commits late with a low sequence number is never
//! passed over (the gap that loses messages in naive log tables).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::error::Result;
use crate::partition::Partition;
use crate::transport::{
    AckKind, Acker, Delivery, OutgoingMessage, Publisher, RawMessage, Subscriber, Subscription,
};

/// A position in the log. Positions sort in reading order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    /// The writing transaction's id where the database needs it (PostgreSQL), else 0.
    pub txid: i64,
    /// The row's sequence number.
    pub seq: i64,
}

/// One entry read from the log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// Where it is.
    pub at: LogPosition,
    /// The message.
    pub message: RawMessage,
}

/// What a database provides to serve as a log.
#[async_trait]
pub trait LogBackend: Send + Sync + 'static {
    /// The transport's name in errors (`pg-log`, `sqlite-log`).
    fn name(&self) -> &'static str;

    /// Appends `batch` in order, in one transaction; returns once committed.
    async fn append(&self, batch: &[OutgoingMessage]) -> Result<()>;

    /// Reads up to `limit` entries of `topic` in `partition` after `after`,
    /// in order, only from transactions that can no longer be overtaken by an
    /// earlier one. An entry's partition is [`Partition::of`] its key.
    async fn read(
        &self,
        topic: &str,
        partition: Partition,
        after: LogPosition,
        limit: usize,
    ) -> Result<Vec<LogEntry>>;

    /// The committed offset of `group` in `partition` of `topic` (the
    /// default position for a new group).
    async fn load_offset(&self, group: &str, topic: &str, partition: Partition) -> Result<LogPosition>;

    /// Stores the offset of `group` in `partition` of `topic`; never moves it backwards.
    async fn commit_offset(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
        at: LogPosition,
    ) -> Result<()>;

    /// Housekeeping: deletes up to `limit` entries older than `older_than`
    /// that every group reading their topic and partition has committed
    /// past (an entry a group has not read yet stays, however old); returns
    /// how many. Groups that never read a topic do not hold its entries.
    async fn trim(&self, older_than: Duration, limit: usize) -> Result<u64>;

    /// A signal that changes whenever something may have been appended
    /// (in this process, or in another one where the database can tell).
    /// Readers keep their receiver, so an append between a read and the
    /// wait is not missed.
    fn append_signal(&self) -> watch::Receiver<u64>;
}

/// The publishing half of the database log.
#[derive(Debug, Clone)]
pub struct LogPublisher<B> {
    backend: Arc<B>,
}

impl<B: LogBackend> LogPublisher<B> {
    /// A publisher appending to `backend`.
    pub fn new(backend: Arc<B>) -> Self {
        LogPublisher { backend }
    }
}

#[async_trait]
impl<B: LogBackend> Publisher for LogPublisher<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.backend.append(batch).await
    }
}

/// Tuning of a [`LogSubscriber`].
#[derive(Debug, Clone)]
pub struct LogReaderConfig {
    batch_size: usize,
    max_in_flight: usize,
    poll_interval: Duration,
    commit_interval: Duration,
    partitions: u32,
}

impl Default for LogReaderConfig {
    /// Batches of 500, at most 5000 unsettled messages per subscription,
    /// polling every 250 ms when no wake-up arrives, offsets stored at most
    /// every 100 ms, one partition per topic.
    fn default() -> Self {
        LogReaderConfig {
            batch_size: 500,
            max_in_flight: 5000,
            poll_interval: Duration::from_millis(250),
            commit_interval: Duration::from_millis(100),
            partitions: 1,
        }
    }
}

impl LogReaderConfig {
    /// Entries read per query.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// Unsettled deliveries allowed before reading pauses (backpressure).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// How often to look for new entries when no wake-up arrives.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// Partitions of every topic: members of one group can share the
    /// topic's work up to this many ways. A group's offsets are kept per
    /// partition, so changing the count starts the group's partitions anew
    /// from the beginning of the log (idempotent consumers skip what they
    /// already handled, at the cost of reading it again).
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// How often the settled offset is written back.
    pub fn commit_interval(mut self, d: Duration) -> Self {
        self.commit_interval = d;
        self
    }
}

/// The subscribing half of the database log.
#[derive(Debug, Clone)]
pub struct LogSubscriber<B> {
    backend: Arc<B>,
    config: LogReaderConfig,
}

impl<B: LogBackend> LogSubscriber<B> {
    /// A subscriber reading `backend`.
    pub fn new(backend: Arc<B>, config: LogReaderConfig) -> Self {
        LogSubscriber { backend, config }
    }
}

/// The unsettled deliveries of one subscription, in log order.
#[derive(Debug, Default)]
struct Window {
    entries: VecDeque<(LogPosition, bool)>,
    /// Everything up to here is settled.
    settled: LogPosition,
}

impl Window {
    fn settle(&mut self, at: LogPosition) {
        if let Ok(i) = self.entries.binary_search_by(|(p, _)| p.cmp(&at)) {
            self.entries[i].1 = true;
        }
        while let Some(&(p, true)) = self.entries.front() {
            self.settled = p;
            self.entries.pop_front();
        }
    }
}

#[derive(Debug)]
struct Shared {
    window: Mutex<Window>,
    settled_signal: Notify,
}

type Sender = mpsc::Sender<Result<Delivery>>;

#[derive(Debug)]
struct LogAcker {
    shared: Arc<Shared>,
    at: LogPosition,
    message: RawMessage,
    count: u32,
    sender: Sender,
}

#[async_trait]
impl Acker for LogAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        match kind {
            AckKind::Ack | AckKind::Term => {
                self.shared.window.lock().expect("window lock").settle(self.at);
                self.shared.settled_signal.notify_one();
            }
            AckKind::Progress => {}
            AckKind::Nak(delay) => {
                // Redeliver from memory; the offset stays behind this entry,
                // so a crash before the redelivery settles reads it again.
                let again = LogAcker {
                    shared: self.shared.clone(),
                    at: self.at,
                    message: self.message.clone(),
                    count: self.count + 1,
                    sender: self.sender.clone(),
                };
                let delay = delay.unwrap_or_default();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    // The subscription's own channel: a dropped subscription drops it.
                    let sender = again.sender.clone();
                    let delivery = Delivery::new(again.message.clone(), again.count, again);
                    let _ = sender.send(Ok(delivery)).await;
                });
            }
        }
        Ok(())
    }
}

#[async_trait]
impl<B: LogBackend> Subscriber for LogSubscriber<B> {
    fn partitions(&self, _topic: &str) -> u32 {
        self.config.partitions
    }

    /// Nothing to do: a group without offsets reads the log from its start.
    async fn ensure_group(&self, _group: &str, _topic: &str) -> Result<()> {
        Ok(())
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        let start = self.backend.load_offset(group, topic, partition).await?;
        let (sender, receiver) = mpsc::channel(self.config.batch_size);
        let shared = Arc::new(Shared {
            window: Mutex::new(Window {
                entries: VecDeque::new(),
                settled: start,
            }),
            settled_signal: Notify::new(),
        });
        let reader = Reader {
            backend: self.backend.clone(),
            config: self.config.clone(),
            group: group.to_owned(),
            topic: topic.to_owned(),
            partition,
            shared,
            sender,
            cursor: start,
            committed: start,
        };
        let task = tokio::spawn(reader.run());
        // Closing drops the receiver, which stops the reader; it then stores
        // the settled offset one last time before the task ends.
        Ok(
            Subscription::new(ReceiverStream::new(receiver)).on_close(move || async move {
                task.await
                    .map_err(|e| crate::Error::transport("log", "log reader task failed", e, false))
            }),
        )
    }
}

struct Reader<B> {
    backend: Arc<B>,
    config: LogReaderConfig,
    group: String,
    topic: String,
    partition: Partition,
    shared: Arc<Shared>,
    sender: Sender,
    cursor: LogPosition,
    committed: LogPosition,
}

impl<B: LogBackend> Reader<B> {
    async fn run(mut self) {
        let mut last_commit = Instant::now();
        let mut failures = 0u32;
        let mut appended = self.backend.append_signal();
        let backoff = crate::Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p(seq: i64) -> LogPosition {
        LogPosition { txid: 0, seq }
    }

    #[test]
    fn window_settles_only_contiguous_prefix() {
        let mut w = Window {
            entries: (1..=5).map(|s| (p(s), false)).collect(),
            settled: p(0),
        };
        w.settle(p(2));
        w.settle(p(3));
        assert_eq!(w.settled, p(0), "1 is still open");
        w.settle(p(1));
        assert_eq!(w.settled, p(3));
        w.settle(p(5));
        assert_eq!(w.settled, p(3));
        w.settle(p(4));
        assert_eq!(w.settled, p(5));
        assert!(w.entries.is_empty());
    }
}
