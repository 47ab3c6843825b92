//! The outbox: `enqueue` in the caller's transaction, and the relay's claims.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{PgConnection, Postgres, Row, Transaction};
use tidings_core::{ClaimedBatch, Error, Outbox, OutgoingMessage, RelayStore, Result, cloudevents};

use crate::PgStore;

#[async_trait]
impl Outbox for PgStore {
    type Database = Postgres;

    async fn enqueue(&self, conn: &mut PgConnection, message: &OutgoingMessage) -> Result<()> {
        let e = &message.envelope;
        sqlx::query(
            "INSERT INTO tidings_outbox (id, topic, aggregate_key, message_type, body) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(e.id)
        .bind(&message.topic)
        .bind(&e.aggregate_key)
        .bind(&e.message_type)
        .bind(cloudevents::to_json(e))
        .execute(conn)
        .await
        .map_err(Error::db("inserting into the outbox"))?;
        Ok(())
    }

    fn wake(&self) {
        self.inner.wake.outbox_committed();
    }
}

/// A batch claimed by one relay: its rows stay locked (other relays skip
/// them) until the batch is completed or released, or the relay dies and
/// PostgreSQL rolls its transaction back.
#[derive(Debug)]
pub struct PgBatch {
    tx: Option<Transaction<'static, Postgres>>,
    messages: Vec<OutgoingMessage>,
}

// Claiming deletes (or stamps) the rows inside the claim's transaction: the
// change only becomes visible if the relay commits after the transport's
// confirmation. The inner SELECT orders by seq and skips rows another relay
// holds. RETURNING has no defined order, so rows are sorted afterwards.
const CLAIM_DELETE: &str = "DELETE FROM tidings_outbox WHERE seq IN (
        SELECT seq FROM tidings_outbox WHERE published_at IS NULL
        ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
    RETURNING seq, topic, body";
const CLAIM_MARK: &str = "UPDATE tidings_outbox SET published_at = now() WHERE seq IN (
        SELECT seq FROM tidings_outbox WHERE published_at IS NULL
        ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
    RETURNING seq, topic, body";

#[async_trait]
impl RelayStore for PgStore {
    type Batch = PgBatch;

    async fn claim(&self, limit: usize) -> Result<PgBatch> {
        let mut tx = self
            .inner
            .pool
            .begin()
            .await
            .map_err(Error::db("starting an outbox claim"))?;
        let sql = if self.inner.options.retention.is_some() {
            CLAIM_MARK
        } else {
            CLAIM_DELETE
        };
        let rows = sqlx::query(sql)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db("claiming an outbox batch"))?;
        let mut rows: Vec<(i64, String, Vec<u8>)> =
            rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        rows.sort_unstable_by_key(|r| r.0);
        let messages = rows
            .into_iter()
            .map(|(_, topic, body)| {
                Ok(OutgoingMessage {
                    topic,
                    envelope: cloudevents::from_json(&body)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PgBatch {
            tx: Some(tx),
            messages,
        })
    }

    async fn wait_for_work(&self, timeout: Duration) {
        self.inner.wake.wait_outbox(timeout).await;
    }

    async fn cleanup(&self) -> Result<u64> {
        let Some(retention) = self.inner.options.retention else {
            return Ok(0);
        };
        let done =
            sqlx::query("DELETE FROM tidings_outbox WHERE published_at < now() - make_interval(secs => $1)")
                .bind(retention.as_secs_f64())
                .execute(&self.inner.pool)
                .await
                .map_err(Error::db("deleting sent outbox rows past retention"))?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl ClaimedBatch for PgBatch {
    fn messages(&self) -> &[OutgoingMessage] {
        &self.messages
    }

    async fn complete(mut self) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx.commit().await.map_err(Error::db("completing an outbox batch")),
            None => Ok(()),
        }
    }

    async fn release(mut self) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx
                .rollback()
                .await
                .map_err(Error::db("releasing an outbox batch")),
            None => Ok(()),
        }
    }
}
