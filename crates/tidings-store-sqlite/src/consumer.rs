//! Processed markers and the effects ledger.

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteConnection, Transaction};
use tidings_core::{ConsumerStore, Error, Result};
use uuid::Uuid;

use crate::SqliteStore;

#[async_trait]
impl ConsumerStore for SqliteStore {
    async fn begin(&self) -> Result<Transaction<'static, Sqlite>> {
        self.inner
            .pool
            .begin()
            .await
            .map_err(Error::db("starting a handler transaction"))
    }

    async fn mark_processed(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: Uuid,
    ) -> Result<bool> {
        // SQLite runs one writer at a time: a concurrent duplicate waits for
        // the first one's commit, then sees the conflict.
        let done = sqlx::query(
            "INSERT INTO tidings_processed (consumer, message_id, processed_at) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(message_id)
        .bind(crate::now_millis())
        .execute(conn)
        .await
        .map_err(Error::db("recording a processed marker"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn effect_recorded(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
    ) -> Result<bool> {
        let found: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM tidings_effects WHERE consumer = $1 AND message_id = $2 AND effect = $3",
        )
        .bind(consumer)
        .bind(message_id)
        .bind(effect)
        .fetch_optional(conn)
        .await
        .map_err(Error::db("reading the effects ledger"))?;
        Ok(found.is_some())
    }

    async fn record_effect(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
        idempotency_key: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO tidings_effects (consumer, message_id, effect, idempotency_key, recorded_at)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(message_id)
        .bind(effect)
        .bind(idempotency_key)
        .bind(crate::now_millis())
        .execute(conn)
        .await
        .map_err(Error::db("recording an effect"))?;
        Ok(())
    }
}
