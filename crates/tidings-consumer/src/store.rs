//! The part of a store a handler's context uses, object-safe.

use async_trait::async_trait;
use sqlx::Database;
use tidings_core::{ConsumerStore, OutgoingMessage, Result};
use uuid::Uuid;

#[async_trait]
pub(crate) trait ContextStore<DB: Database>: Send + Sync {
    async fn enqueue(&self, conn: &mut DB::Connection, message: &OutgoingMessage) -> Result<()>;
    async fn effect_recorded(
        &self,
        conn: &mut DB::Connection,
        consumer: &str,
        id: Uuid,
        effect: &str,
    ) -> Result<bool>;
    async fn record_effect(
        &self,
        conn: &mut DB::Connection,
        consumer: &str,
        id: Uuid,
        effect: &str,
        key: &str,
    ) -> Result<()>;
}

#[async_trait]
impl<S: ConsumerStore> ContextStore<S::Database> for S {
    async fn enqueue(
        &self,
        conn: &mut <S::Database as Database>::Connection,
        message: &OutgoingMessage,
    ) -> Result<()> {
        tidings_core::Outbox::enqueue_outgoing(self, conn, message).await
    }

    async fn effect_recorded(
        &self,
        conn: &mut <S::Database as Database>::Connection,
        consumer: &str,
        id: Uuid,
        effect: &str,
    ) -> Result<bool> {
        ConsumerStore::effect_recorded(self, conn, consumer, id, effect).await
    }

    async fn record_effect(
        &self,
        conn: &mut <S::Database as Database>::Connection,
        consumer: &str,
        id: Uuid,
        effect: &str,
        key: &str,
    ) -> Result<()> {
        ConsumerStore::record_effect(self, conn, consumer, id, effect, key).await
    }
}
