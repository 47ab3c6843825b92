//! The database log's contract: what a database provides to serve as a
//! log ([`LogBackend`]), where an entry is ([`LogPosition`]) and what is read
//! ([`LogEntry`]). The SQL dialects implement it; the transport over it (a
//! publisher and a subscriber with a broker's semantics) is the
//! `tidings-log` crate.
//!
//! The backend decides what a position is. On PostgreSQL it is the pair
//! (transaction id, sequence), read only below the oldest transaction still
//! running, so a row that commits late with a low sequence number is never
//! passed over (the gap that loses messages in naive log tables).

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::error::Result;
use crate::partition::Partition;
use crate::transport::{OutgoingMessage, RawMessage};

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
