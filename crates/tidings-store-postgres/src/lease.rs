//! Partition leases on PostgreSQL, timed by the database's clock so that
//! members on different hosts agree on expiry.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgConnection;
use tidings_core::{Error, Lease, LeaseStore, Result};

use crate::PgStore;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn partitions(p: &[u32]) -> Vec<i32> {
    p.iter().map(|&p| p as i32).collect()
}

#[async_trait]
impl LeaseStore for PgStore {
    async fn heartbeat(&self, scope: &str, member: &str, ttl: Duration) -> Result<Vec<String>> {
        let mut tx = self
            .inner
            .pool
            .begin()
            .await
            .map_err(Error::db("renewing membership"))?;
        sqlx::query(
            "INSERT INTO tidings_members (scope, member, expires_at)
             VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond')
             ON CONFLICT (scope, member) DO UPDATE SET expires_at = EXCLUDED.expires_at",
        )
        .bind(scope)
        .bind(member)
        .bind(millis(ttl))
        .execute(&mut *tx)
        .await
        .map_err(Error::db("renewing membership"))?;
        sqlx::query("DELETE FROM tidings_members WHERE scope = $1 AND expires_at < clock_timestamp()")
            .bind(scope)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("forgetting expired members"))?;
        let members =
            sqlx::query_scalar("SELECT member FROM tidings_members WHERE scope = $1 ORDER BY member")
                .bind(scope)
                .fetch_all(&mut *tx)
                .await
                .map_err(Error::db("listing members"))?;
        tx.commit().await.map_err(Error::db("renewing membership"))?;
        Ok(members)
    }

    async fn acquire(&self, scope: &str, member: &str, wanted: &[u32], ttl: Duration) -> Result<Vec<Lease>> {
        // A row is taken if it is ours or lapsed; the fence grows unless it
        // was ours and still live. Released rows stay (lapsed), keeping the
        // fence growing.
        let rows: Vec<(i32, i64)> = sqlx::query_as(
            "INSERT INTO tidings_leases AS l (scope, partition_index, owner, fence, expires_at)
             SELECT $1, p, $2, 1, clock_timestamp() + $4 * interval '1 millisecond' FROM UNNEST($3::int4[]) AS p
             ON CONFLICT (scope, partition_index) DO UPDATE
               SET owner = EXCLUDED.owner,
                   -- Timed after the row lock: a wait on a batch that
                   -- holds it must not eat into the new lease.
                   expires_at = clock_timestamp() + $4 * interval '1 millisecond',
                   fence = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at >= clock_timestamp()
                                THEN l.fence ELSE l.fence + 1 END
               WHERE l.owner = EXCLUDED.owner OR l.expires_at < clock_timestamp()
             RETURNING partition_index, fence",
        )
        .bind(scope)
        .bind(member)
        .bind(partitions(wanted))
        .bind(millis(ttl))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("acquiring leases"))?;
        let mut leases: Vec<Lease> = rows
            .into_iter()
            .map(|(p, fence)| Lease {
                partition: p as u32,
                fence,
            })
            .collect();
        leases.sort();
        Ok(leases)
    }

    async fn release(&self, scope: &str, member: &str, wanted: &[u32]) -> Result<()> {
        sqlx::query(
            "UPDATE tidings_leases SET expires_at = '-infinity'
             WHERE scope = $1 AND owner = $2 AND partition_index = ANY($3::int4[])",
        )
        .bind(scope)
        .bind(member)
        .bind(partitions(wanted))
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("releasing leases"))?;
        Ok(())
    }

    async fn leave(&self, scope: &str, member: &str) -> Result<()> {
        let mut tx = self.inner.pool.begin().await.map_err(Error::db("leaving"))?;
        sqlx::query("UPDATE tidings_leases SET expires_at = '-infinity' WHERE scope = $1 AND owner = $2")
            .bind(scope)
            .bind(member)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("releasing leases"))?;
        sqlx::query("DELETE FROM tidings_members WHERE scope = $1 AND member = $2")
            .bind(scope)
            .bind(member)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("leaving"))?;
        tx.commit().await.map_err(Error::db("leaving"))?;
        Ok(())
    }
}

/// The fence check of a handler's transaction: `FOR SHARE` keeps the row
/// from changing hands until the transaction ends, while the member's other
/// handlers check it at the same time.
pub(crate) async fn holds_lease(
    conn: &mut PgConnection,
    scope: &str,
    member: &str,
    lease: Lease,
) -> Result<bool> {
    let row: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM tidings_leases
         WHERE scope = $1 AND partition_index = $2 AND owner = $3 AND fence = $4
           AND expires_at > clock_timestamp()
         FOR SHARE",
    )
    .bind(scope)
    .bind(lease.partition as i32)
    .bind(member)
    .bind(lease.fence)
    .fetch_optional(conn)
    .await
    .map_err(Error::db("checking a lease"))?;
    Ok(row.is_some())
}
