//! The webhook inbox's records of accepted deliveries.

use async_trait::async_trait;
use sqlx::Database;
use tidings_core::{InboxStore, Result};
use uuid::Uuid;

use crate::db::Stmt;
use crate::store::millis;
use crate::{Dialect, SqlStore};

#[async_trait]
impl<D: Dialect> InboxStore for SqlStore<D> {
    async fn record_delivery(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        provider: &str,
        event_id: &str,
        message_id: Uuid,
    ) -> Result<bool> {
        let inserted = Stmt::<D>::new(
            D::SQL.record_delivery,
            "recording a webhook delivery in the inbox",
        )
        .bind(provider)
        .bind(event_id)
        .bind(message_id)
        .execute(conn)
        .await?;
        Ok(D::rows_affected(&inserted) == 1)
    }

    async fn forget_deliveries(&self, retention: std::time::Duration, limit: usize) -> Result<u64> {
        let what = "deleting inbox deliveries past the inbox retention";
        let mut conn = self.conn(what).await?;
        let done = Stmt::<D>::new(D::SQL.forget_deliveries, what)
            .bind(millis(retention))
            .bind(limit.min(i64::MAX as usize) as i64)
            .execute(&mut *conn)
            .await?;
        Ok(D::rows_affected(&done))
    }
}
