//! Processed markers and the effects ledger.

use async_trait::async_trait;
use sqlx::{PgConnection, Postgres, Transaction};
use tidings_core::{ConsumerStore, Error, Result};
use uuid::Uuid;

use crate::PgStore;

#[async_trait]
impl ConsumerStore for PgStore {
    async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        self.inner
            .pool
            .begin()
            .await
            .map_err(Error::db("starting a handler transaction"))
    }

    async fn mark_processed(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: Uuid,
    ) -> Result<bool> {
        // A concurrent duplicate blocks on the first one's uncommitted row,
        // then sees the conflict once it commits (or takes over if it rolls back).
        let done = sqlx::query(
            "INSERT INTO tidings_processed (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(message_id)
        .execute(conn)
        .await
        .map_err(Error::db("recording a processed marker"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn effect_recorded(
        &self,
        conn: &mut PgConnection,
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
        conn: &mut PgConnection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
        idempotency_key: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO tidings_effects (consumer, message_id, effect, idempotency_key) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(message_id)
        .bind(effect)
        .bind(idempotency_key)
        .execute(conn)
        .await
        .map_err(Error::db("recording an effect"))?;
        Ok(())
    }
}
