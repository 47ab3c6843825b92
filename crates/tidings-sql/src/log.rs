//! The database-log transport's backend: entries, offsets, retention.
//! (The publisher and the subscriber over it: `tidings-log`.)

use std::time::Duration;

use async_trait::async_trait;
use tidings_core::log::{LogBackend, LogEntry, LogPosition};
use tidings_core::{OutgoingMessage, Partition, RawMessage, Result};
use tokio::sync::watch;

use crate::db::Stmt;
use crate::store::millis;
use crate::{Dialect, SqlStore, Wakeups};

#[async_trait]
impl<D: Dialect> LogBackend for SqlStore<D> {
    fn name(&self) -> &'static str {
        D::LOG_TRANSPORT
    }

    async fn append(&self, batch: &[OutgoingMessage]) -> Result<()> {
        D::append(self, batch).await?;
        self.inner.wake.log_appended();
        Ok(())
    }

    async fn read(
        &self,
        topic: &str,
        partition: Partition,
        after: LogPosition,
        limit: usize,
    ) -> Result<Vec<LogEntry>> {
        let mut conn = self.conn("reading the log").await?;
        let rows = Stmt::<D>::new(D::SQL.log_read, "reading the log")
            .bind(topic)
            .bind(after.txid)
            .bind(after.seq)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind(i64::from(partition.count))
            .bind(i64::from(partition.index))
            .fetch_all(&mut conn)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(LogEntry {
                    at: LogPosition {
                        txid: r.get(0)?,
                        seq: r.get(1)?,
                    },
                    message: RawMessage {
                        topic: topic.to_owned(),
                        key: r.get(2)?,
                        headers: Default::default(),
                        body: r.get(3)?,
                        refused: None,
                    },
                })
            })
            .collect()
    }

    async fn load_offset(&self, group: &str, topic: &str, partition: Partition) -> Result<LogPosition> {
        let mut conn = self.conn("loading a log offset").await?;
        let row = Stmt::<D>::new(D::SQL.log_offset, "loading a log offset")
            .bind(group)
            .bind(topic)
            .bind(partition.count as i32)
            .bind(partition.index as i32)
            .fetch_optional(&mut conn)
            .await?;
        Ok(match row {
            Some(r) => LogPosition {
                txid: r.get(0)?,
                seq: r.get(1)?,
            },
            None => LogPosition::default(),
        })
    }

    async fn commit_offset(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
        at: LogPosition,
    ) -> Result<()> {
        let mut conn = self.conn("storing a log offset").await?;
        Stmt::<D>::new(D::SQL.log_commit, "storing a log offset")
            .bind(group)
            .bind(topic)
            .bind(at.txid)
            .bind(at.seq)
            .bind(partition.count as i32)
            .bind(partition.index as i32)
            .execute(&mut conn)
            .await?;
        Ok(())
    }

    async fn trim(&self, older_than: Duration, limit: usize) -> Result<u64> {
        let mut conn = self.conn("deleting log entries past retention").await?;
        let deleted = Stmt::<D>::new(D::SQL.log_trim, "deleting log entries past retention")
            .bind(millis(older_than))
            .bind(limit.min(i64::MAX as usize) as i64)
            .execute(&mut conn)
            .await?;
        Ok(D::rows_affected(&deleted))
    }

    fn append_signal(&self) -> watch::Receiver<u64> {
        self.inner.wake.log_signal()
    }
}
