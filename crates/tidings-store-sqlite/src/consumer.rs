//! Processed markers and the effects ledger (the SQL is shared: `tidings_core::sql`).

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteConnection, Transaction};
use tidings_core::{ConsumerStore, Error, Lease, Result, sql};
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
        sql::mark_processed::<Sqlite>(conn, consumer, message_id).await
    }

    async fn effect_recorded(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
    ) -> Result<bool> {
        sql::effect_recorded::<Sqlite>(conn, consumer, message_id, effect).await
    }

    async fn record_effect(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
        idempotency_key: &str,
    ) -> Result<()> {
        sql::record_effect::<Sqlite>(conn, consumer, message_id, effect, idempotency_key).await
    }

    async fn holds_lease(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        member: &str,
        lease: Lease,
    ) -> Result<bool> {
        crate::lease::holds_lease(conn, scope, member, lease).await
    }
}
