//! The database-log transport on PostgreSQL.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use tidings_core::log::{LogBackend, LogEntry, LogPosition};
use tidings_core::partition::key_hash;
use tidings_core::{Error, OutgoingMessage, Partition, RawMessage, Result, cloudevents};
use tokio::sync::watch;

use crate::PgStore;

#[async_trait]
impl LogBackend for PgStore {
    fn name(&self) -> &'static str {
        "pg-log"
    }

    async fn append(&self, batch: &[OutgoingMessage]) -> Result<()> {
        let topics: Vec<&str> = batch.iter().map(|m| m.topic.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|m| m.envelope.aggregate_key.as_str()).collect();
        let hashes: Vec<i64> = keys.iter().map(|k| i64::from(key_hash(k))).collect();
        let bodies: Vec<Vec<u8>> = batch.iter().map(|m| cloudevents::to_json(&m.envelope)).collect();
        // One statement, one transaction: the batch is confirmed when it commits.
        sqlx::query(
            "INSERT INTO tidings_log (topic, aggregate_key, key_hash, body)
             SELECT t, k, h, b FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::bytea[])
                 WITH ORDINALITY AS u(t, k, h, b, n)
             ORDER BY n",
        )
        .bind(&topics)
        .bind(&keys)
        .bind(&hashes)
        .bind(&bodies)
        .execute(&self.inner.pool)
        .await
        .map_err(|e| {
            let retryable = tidings_core::classify_sqlx(&e).is_retryable();
            Error::transport(
                "pg-log",
                format!("appending {} messages failed", batch.len()),
                e,
                retryable,
            )
        })?;
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
        // Only rows of transactions older than the oldest one still running:
        // those can no longer be joined by a row that sorts before them.
        let rows = sqlx::query(
            "SELECT txid, seq, aggregate_key, body FROM tidings_log
             WHERE topic = $1 AND (txid, seq) > ($2, $3)
               AND txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
               AND ($5 = 1 OR COALESCE(key_hash, 0) % $5 = $6)
             ORDER BY txid, seq LIMIT $4",
        )
        .bind(topic)
        .bind(after.txid)
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
                    txid: r.get(0),
                    seq: r.get(1),
                },
                message: RawMessage {
                    topic: topic.to_owned(),
                    key: r.get(2),
                    headers: Default::default(),
                    body: r.get(3),
                },
            })
            .collect())
    }

    async fn load_offset(&self, group: &str, topic: &str, partition: Partition) -> Result<LogPosition> {
        let row: Option<(i64, i64)> = sqlx::query_as(
            "SELECT txid, seq FROM tidings_log_offsets
             WHERE consumer_group = $1 AND topic = $2 AND partition_count = $3 AND partition_index = $4",
        )
        .bind(group)
        .bind(topic)
        .bind(partition.count as i32)
        .bind(partition.index as i32)
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(Error::db("loading a log offset"))?;
        Ok(row
            .map(|(txid, seq)| LogPosition { txid, seq })
            .unwrap_or_default())
    }

    async fn commit_offset(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
        at: LogPosition,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO tidings_log_offsets (consumer_group, topic, txid, seq, partition_count, partition_index)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (consumer_group, topic, partition_count, partition_index) DO UPDATE
               SET txid = EXCLUDED.txid, seq = EXCLUDED.seq, updated_at = now()
               WHERE (tidings_log_offsets.txid, tidings_log_offsets.seq) < (EXCLUDED.txid, EXCLUDED.seq)",
        )
        .bind(group)
        .bind(topic)
        .bind(at.txid)
        .bind(at.seq)
        .bind(partition.count as i32)
        .bind(partition.index as i32)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("storing a log offset"))?;
        Ok(())
    }

    async fn trim(&self, older_than: Duration, limit: usize) -> Result<u64> {
        let deleted = sqlx::query(
            "DELETE FROM tidings_log WHERE seq IN (
               SELECT l.seq FROM tidings_log l
               WHERE l.created_at < now() - make_interval(secs => $1)
                 AND NOT EXISTS (
                   SELECT 1 FROM tidings_log_offsets o
                   WHERE o.topic = l.topic AND (o.txid, o.seq) < (l.txid, l.seq)
                     AND (o.partition_count = 1
                          OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index))
               ORDER BY l.seq LIMIT $2)",
        )
        .bind(older_than.as_secs_f64())
        .bind(limit.min(i64::MAX as usize) as i64)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("deleting log entries past retention"))?;
        Ok(deleted.rows_affected())
    }

    fn append_signal(&self) -> watch::Receiver<u64> {
        self.inner.wake.log_signal()
    }
}
