//! Processed markers, the effects ledger and the handler's fence.

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::{Database, Transaction};
use tidings_core::{ConsumerStore, Fence, Handling, Lease, Result};
use uuid::Uuid;

use crate::db::Stmt;
use crate::store::{from_micros, millis};
use crate::{Dialect, SqlStore};

type Conn<D> = <<D as Dialect>::Db as Database>::Connection;

#[async_trait]
impl<D: Dialect> ConsumerStore for SqlStore<D> {
    async fn begin(&self) -> Result<Transaction<'static, D::Db>> {
        self.begin_tx("starting a handler transaction").await
    }

    async fn mark_processed(&self, conn: &mut Conn<D>, consumer: &str, message_id: Uuid) -> Result<bool> {
        // On PostgreSQL a concurrent duplicate blocks on the first one's
        // uncommitted row, then sees the conflict once it commits (or takes
        // over if it rolls back); SQLite runs one writer at a time.
        let inserted = Stmt::<D>::new(D::SQL.mark_processed, "recording a processed marker")
            .bind(consumer)
            .bind(message_id)
            .execute(conn)
            .await?;
        Ok(D::rows_affected(&inserted) == 1)
    }

    async fn mark_processed_all(
        &self,
        conn: &mut Conn<D>,
        consumer: &str,
        message_ids: &[Uuid],
    ) -> Result<HashSet<Uuid>> {
        let Some(sql) = D::SQL.mark_processed_all else {
            let mut fresh = HashSet::with_capacity(message_ids.len());
            for &id in message_ids {
                if self.mark_processed(&mut *conn, consumer, id).await? {
                    fresh.insert(id);
                }
            }
            return Ok(fresh);
        };
        let rows = Stmt::<D>::new(sql, "recording processed markers")
            .bind(consumer)
            .bind(D::uuid_list(message_ids))
            .fetch_all(conn)
            .await?;
        rows.iter().map(|r| r.get::<Uuid>(0)).collect()
    }

    async fn effect_recorded(
        &self,
        conn: &mut Conn<D>,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
    ) -> Result<bool> {
        let found = Stmt::<D>::new(D::SQL.effect_recorded, "reading the effects ledger")
            .bind(consumer)
            .bind(message_id)
            .bind(effect)
            .fetch_optional(conn)
            .await?;
        Ok(found.is_some())
    }

    async fn record_effect(
        &self,
        conn: &mut Conn<D>,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
        idempotency_key: &str,
    ) -> Result<()> {
        Stmt::<D>::new(D::SQL.record_effect, "recording an effect")
            .bind(consumer)
            .bind(message_id)
            .bind(effect)
            .bind(idempotency_key)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn holds_lease(&self, conn: &mut Conn<D>, scope: &str, member: &str, lease: Lease) -> Result<bool> {
        let row = Stmt::<D>::new(D::SQL.holds_lease, "checking a lease")
            .bind(scope)
            .bind(lease.partition as i32)
            .bind(member)
            .bind(lease.fence)
            .fetch_optional(conn)
            .await?;
        Ok(row.is_some())
    }

    async fn begin_handling(
        &self,
        conn: &mut Conn<D>,
        consumer: &str,
        message_id: Uuid,
        fence: Option<Fence<'_>>,
    ) -> Result<Handling> {
        let (Some(fence), Some(sql)) = (fence, D::SQL.begin_handling) else {
            // The marker first: on SQLite it takes the database's one write
            // lock, so the lease cannot change hands until the transaction ends.
            if !self.mark_processed(&mut *conn, consumer, message_id).await? {
                return Ok(Handling::Duplicate);
            }
            if let Some(f) = fence
                && !self.holds_lease(conn, f.scope, f.member, f.lease).await?
            {
                return Ok(Handling::LeaseLost);
            }
            return Ok(Handling::Fresh);
        };
        // The fence check and the marker in one round trip: no marker without the lease.
        let row = Stmt::<D>::new(sql, "recording a processed marker under the lease")
            .bind(consumer)
            .bind(message_id)
            .bind(fence.scope)
            .bind(fence.lease.partition as i32)
            .bind(fence.member)
            .bind(fence.lease.fence)
            .fetch_one(conn)
            .await?;
        Ok(match (row.get::<bool>(0)?, row.get::<bool>(1)?) {
            (false, _) => Handling::LeaseLost,
            (true, false) => Handling::Duplicate,
            (true, true) => Handling::Fresh,
        })
    }

    async fn handling_started(&self, consumer: &str, message_id: Uuid) -> Result<u32> {
        let what = "counting a handling begun";
        let mut conn = self.conn(what).await?;
        Stmt::<D>::new(D::SQL.handling_started, what)
            .bind(consumer)
            .bind(message_id)
            .execute(&mut *conn)
            .await?;
        let row = Stmt::<D>::new(D::SQL.handlings_begun, what)
            .bind(consumer)
            .bind(message_id)
            .fetch_optional(&mut *conn)
            .await?;
        let begun = match row {
            Some(row) => row.get::<i32>(0)?,
            None => 1,
        };
        Ok((begun.max(1) - 1) as u32)
    }

    async fn handling_ended(&self, consumer: &str, message_id: Uuid) -> Result<()> {
        let what = "forgetting the handlings begun";
        let mut conn = self.conn(what).await?;
        Stmt::<D>::new(D::SQL.handling_ended, what)
            .bind(consumer)
            .bind(message_id)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    async fn forget_processed(&self, retention: std::time::Duration, limit: usize) -> Result<u64> {
        let what = "deleting processed markers past the dedupe retention";
        let mut conn = self.conn(what).await?;
        // The horizon first: a replay checking it never meets markers
        // already gone behind a horizon not yet moved.
        Stmt::<D>::new(D::SQL.set_horizon, what)
            .bind(DEDUPE)
            .bind(millis(retention))
            .execute(&mut *conn)
            .await?;
        let mut deleted = 0;
        for sql in [
            D::SQL.forget_processed,
            D::SQL.forget_effects,
            D::SQL.forget_handlings,
        ] {
            let done = Stmt::<D>::new(sql, what)
                .bind(millis(retention))
                .bind(limit.min(i64::MAX as usize) as i64)
                .execute(&mut *conn)
                .await?;
            deleted += D::rows_affected(&done);
        }
        Ok(deleted)
    }

    async fn dedupe_horizon(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        let what = "reading the dedupe horizon";
        let mut conn = self.conn(what).await?;
        let row = Stmt::<D>::new(D::SQL.horizon, what)
            .bind(DEDUPE)
            .fetch_optional(&mut *conn)
            .await?;
        row.map(|r| r.get::<i64>(0).map(from_micros)).transpose()
    }
}

/// The horizon of processed markers and effects records.
const DEDUPE: &str = "dedupe";
