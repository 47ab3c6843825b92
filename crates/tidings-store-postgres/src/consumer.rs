//! Processed markers and the effects ledger (the SQL is shared: `tidings_core::sql`).

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::{PgConnection, Postgres, Transaction};
use tidings_core::{ConsumerStore, Error, Fence, Handling, Lease, Result, sql};
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

    async fn begin_handling(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: Uuid,
        fence: Option<Fence<'_>>,
    ) -> Result<Handling> {
        let Some(fence) = fence else {
            return Ok(
                match sql::mark_processed::<Postgres>(conn, consumer, message_id).await? {
                    true => Handling::Fresh,
                    false => Handling::Duplicate,
                },
            );
        };
        // The fence check of `holds_lease` and the marker in one round trip:
        // no marker without the lease; the lease row stays share-locked
        // until the handler's transaction ends.
        let (held, fresh): (bool, bool) = sqlx::query_as(
            "WITH fence AS (
                 SELECT 1 FROM tidings_leases
                 WHERE scope = $3 AND partition_index = $4 AND owner = $5 AND fence = $6
                   AND expires_at > clock_timestamp()
                 FOR SHARE),
             marker AS (
                 INSERT INTO tidings_processed (consumer, message_id)
                 SELECT $1, $2 WHERE EXISTS (SELECT 1 FROM fence)
                 ON CONFLICT DO NOTHING RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM marker)",
        )
        .bind(consumer)
        .bind(message_id)
        .bind(fence.scope)
        .bind(fence.lease.partition as i32)
        .bind(fence.member)
        .bind(fence.lease.fence)
        .fetch_one(conn)
        .await
        .map_err(Error::db("recording a processed marker under the lease"))?;
        Ok(match (held, fresh) {
            (false, _) => Handling::LeaseLost,
            (true, false) => Handling::Duplicate,
            (true, true) => Handling::Fresh,
        })
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
