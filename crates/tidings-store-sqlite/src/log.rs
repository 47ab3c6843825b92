//! The database-log transport on SQLite.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use tidings_core::log::{LogBackend, LogEntry, LogPosition};
use tidings_core::partition::key_hash;
use tidings_core::{Error, OutgoingMessage, Partition, RawMessage, Result, cloudevents};
use tokio::sync::watch;

use crate::{SqliteStore, now_millis};

#[async_trait]
impl LogBackend for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite-log"
    }

    async fn append(&self, batch: &[OutgoingMessage]) -> Result<()> {
        let transport_error = |e: sqlx::Error| {
            let retryable = tidings_core::classify_sqlx(&e).is_retryable();
            Error::transport(
                "sqlite-log",
                format!("appending {} messages failed", batch.len()),
                e,
                retryable,
            )
        };
        let mut tx = self.inner.pool.begin().await.map_err(transport_error)?;
        let now = now_millis();
        for m in batch {
            sqlx::query(
                "INSERT INTO tidings_log (topic, aggregate_key, key_hash, body, created_at)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&m.topic)
            .bind(&m.envelope.aggregate_key)
            .bind(i64::from(key_hash(&m.envelope.aggregate_key)))
            .bind(cloudevents::to_json(&m.envelope))
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(transport_error)?;
        }
        tx.commit().await.map_err(transport_error)?;
        self.inner.log_signal.send_modify(|n| *n = n.wrapping_add(1));
        Ok(())
    }

    async fn read(
        &self,
        topic: &str,
        partition: Partition,
        after: LogPosition,
        limit: usize,
    ) -> Result<Vec<LogEntry>> {
        let rows = sqlx::query(
            "SELECT seq, aggregate_key, body FROM tidings_log
             WHERE topic = $1 AND seq > $2 AND ($4 = 1 OR COALESCE(key_hash, 0) % $4 = $5)
             ORDER BY seq LIMIT $3",
        )
        .bind(topic)
        .bind(after.seq)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(i64::from(partition.count))
        .bind(i64::from(partition.index))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("reading the log"))?;
        Ok(rows
            .into_iter()
            .map(|r| LogEntry {
                at: LogPosition {
                    txid: 0,
                    seq: r.get(0),
                },
                message: RawMessage {
                    topic: topic.to_owned(),
                    key: r.get(1),
                    headers: Default::default(),
                    body: r.get(2),
                },
            })
            .collect())
    }

    async fn load_offset(&self, group: &str, topic: &str, partition: Partition) -> Result<LogPosition> {
        let seq: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM tidings_log_offsets
             WHERE consumer_group = $1 AND topic = $2 AND partition_count = $3 AND partition_index = $4",
        )
        .bind(group)
        .bind(topic)
        .bind(i64::from(partition.count))
        .bind(i64::from(partition.index))
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(Error::db("loading a log offset"))?;
        Ok(LogPosition {
            txid: 0,
            seq: seq.unwrap_or(0),
        })
    }

    async fn commit_offset(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
        at: LogPosition,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO tidings_log_offsets (consumer_group, topic, seq, updated_at, partition_count, partition_index)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (consumer_group, topic, partition_count, partition_index) DO UPDATE
               SET seq = excluded.seq, updated_at = excluded.updated_at
               WHERE tidings_log_offsets.seq < excluded.seq",
        )
        .bind(group)
        .bind(topic)
        .bind(at.seq)
        .bind(now_millis())
        .bind(i64::from(partition.count))
        .bind(i64::from(partition.index))
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("storing a log offset"))?;
        Ok(())
    }

    async fn trim(&self, older_than: Duration, limit: usize) -> Result<u64> {
        let before = now_millis() - older_than.as_millis().min(i64::MAX as u128) as i64;
        let deleted = sqlx::query(
            "DELETE FROM tidings_log WHERE seq IN (
               SELECT l.seq FROM tidings_log l
               WHERE l.created_at < $1
                 AND NOT EXISTS (
                   SELECT 1 FROM tidings_log_offsets o
                   WHERE o.topic = l.topic AND o.seq < l.seq
                     AND (o.partition_count = 1
                          OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index))
               ORDER BY l.seq LIMIT $2)",
        )
        .bind(before)
        .bind(limit.min(i64::MAX as usize) as i64)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("deleting log entries past retention"))?;
        Ok(deleted.rows_affected())
    }

    fn append_signal(&self) -> watch::Receiver<u64> {
        self.inner.log_signal.subscribe()
    }
}
