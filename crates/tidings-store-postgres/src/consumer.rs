//! Processed markers and the effects ledger (the SQL is shared: `tidings_core::sql`).

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::{PgConnection, Postgres, Transaction};
use tidings_core::{ConsumerStore, Error, Lease, Result, sql};
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
        sql::mark_processed::<Postgres>(conn, consumer, message_id).await
    }

    async fn mark_processed_all(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_ids: &[Uuid],
    ) -> Result<HashSet<Uuid>> {
        // One statement for the batch, in id order so that two batches
        // sharing ids wait on each other instead of deadlocking.
        let fresh: Vec<Uuid> = sqlx::query_scalar(
            "INSERT INTO tidings_processed (consumer, message_id) \
             SELECT $1, id FROM UNNEST($2::uuid[]) AS batch(id) ORDER BY id \
             ON CONFLICT DO NOTHING RETURNING message_id",
        )
        .bind(consumer)
        .bind(message_ids)
        .fetch_all(conn)
        .await
        .map_err(Error::db("recording processed markers"))?;
        Ok(fresh.into_iter().collect())
    }

    async fn effect_recorded(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
    ) -> Result<bool> {
        sql::effect_recorded::<Postgres>(conn, consumer, message_id, effect).await
    }

    async fn record_effect(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
        idempotency_key: &str,
    ) -> Result<()> {
        sql::record_effect::<Postgres>(conn, consumer, message_id, effect, idempotency_key).await
    }

    async fn holds_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        member: &str,
        lease: Lease,
    ) -> Result<bool> {
        crate::lease::holds_lease(conn, scope, member, lease).await
    }
}
