//! The outbox: `enqueue` in the caller's transaction, and the relay's claims.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Row, Sqlite, SqliteConnection};
use tidings_core::{ClaimedBatch, Error, Outbox, OutgoingMessage, RelayStore, Result, cloudevents};

use crate::{SqliteStore, now_millis};

#[async_trait]
impl Outbox for SqliteStore {
    type Database = Sqlite;

    async fn enqueue(&self, conn: &mut SqliteConnection, message: &OutgoingMessage) -> Result<()> {
        let e = &message.envelope;
        sqlx::query(
            "INSERT INTO tidings_outbox (id, topic, aggregate_key, message_type, body, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(e.id)
        .bind(&message.topic)
        .bind(&e.aggregate_key)
        .bind(&e.message_type)
        .bind(cloudevents::to_json(e))
        .bind(now_millis())
        .execute(conn)
        .await
        .map_err(Error::db("inserting into the outbox"))?;
        Ok(())
    }

    fn wake(&self) {
        self.inner.outbox_signal.notify_one();
    }
}

/// A batch read by the (single) relay of a SQLite file. Nothing is locked
/// while it is published: holding SQLite's one write lock across a publish
/// would block every producer. Completing deletes (or stamps) the range.
#[derive(Debug)]
pub struct SqliteBatch {
    store: SqliteStore,
    range: Option<(i64, i64)>,
    messages: Vec<OutgoingMessage>,
}

#[async_trait]
impl RelayStore for SqliteStore {
    type Batch = SqliteBatch;

    async fn claim(&self, limit: usize) -> Result<SqliteBatch> {
        let rows = sqlx::query(
            "SELECT seq, topic, body FROM tidings_outbox WHERE published_at IS NULL ORDER BY seq LIMIT $1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("claiming an outbox batch"))?;
        let range = match (rows.first(), rows.last()) {
            (Some(first), Some(last)) => Some((first.get::<i64, _>(0), last.get::<i64, _>(0))),
            _ => None,
        };
        let messages = rows
            .into_iter()
            .map(|r| {
                let body: Vec<u8> = r.get(2);
                Ok(OutgoingMessage {
                    topic: r.get(1),
                    envelope: cloudevents::from_json(&body)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SqliteBatch {
            store: self.clone(),
            range,
            messages,
        })
    }

    async fn wait_for_work(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.inner.outbox_signal.notified()).await;
    }

    async fn cleanup(&self) -> Result<u64> {
        let Some(retention) = self.inner.options.retention else {
            return Ok(0);
        };
        let cutoff = now_millis() - i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let done = sqlx::query("DELETE FROM tidings_outbox WHERE published_at < $1")
            .bind(cutoff)
            .execute(&self.inner.pool)
            .await
            .map_err(Error::db("deleting sent outbox rows past retention"))?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl ClaimedBatch for SqliteBatch {
    fn messages(&self) -> &[OutgoingMessage] {
        &self.messages
    }

    async fn complete(self) -> Result<()> {
        let Some((first, last)) = self.range else {
            return Ok(());
        };
        // Seqs are assigned in commit order and never reused, so the range
        // holds exactly the rows that were read.
        let query = if self.store.inner.options.retention.is_some() {
            sqlx::query(
                "UPDATE tidings_outbox SET published_at = $3 WHERE seq BETWEEN $1 AND $2 AND published_at IS NULL",
            )
            .bind(first)
            .bind(last)
            .bind(now_millis())
        } else {
            sqlx::query("DELETE FROM tidings_outbox WHERE seq BETWEEN $1 AND $2")
                .bind(first)
                .bind(last)
        };
        query
            .execute(&self.store.inner.pool)
            .await
            .map_err(Error::db("completing an outbox batch"))?;
        Ok(())
    }

    async fn release(self) -> Result<()> {
        Ok(())
    }
}
