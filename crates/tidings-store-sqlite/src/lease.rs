//! Partition leases on SQLite, in Unix milliseconds of this host's clock
//! (every member of a SQLite database runs on the host that holds the file).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqliteConnection;
use tidings_core::{Error, Lease, LeaseStore, Result};

use crate::{SqliteStore, now_millis};

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn heartbeat(&self, scope: &str, member: &str, ttl: Duration) -> Result<Vec<String>> {
        let now = now_millis();
        let mut tx = self
            .inner
            .pool
            .begin()
            .await
            .map_err(Error::db("renewing membership"))?;
        sqlx::query(
            "INSERT INTO tidings_members (scope, member, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT (scope, member) DO UPDATE SET expires_at = excluded.expires_at",
        )
        .bind(scope)
        .bind(member)
        .bind(now.saturating_add(millis(ttl)))
        .execute(&mut *tx)
        .await
        .map_err(Error::db("renewing membership"))?;
        sqlx::query("DELETE FROM tidings_members WHERE scope = $1 AND expires_at < $2")
            .bind(scope)
            .bind(now)
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
        // The same rule as on PostgreSQL: ours or lapsed is taken, and the
        // fence grows unless it was ours and live.
        let now = now_millis();
        let mut tx = self
            .inner
            .pool
            .begin()
            .await
            .map_err(Error::db("acquiring leases"))?;
        let mut leases = Vec::with_capacity(wanted.len());
        for &p in wanted {
            let row: Option<i64> = sqlx::query_scalar(
                "INSERT INTO tidings_leases AS l (scope, partition_index, owner, fence, expires_at)
                 VALUES ($1, $2, $3, 1, $5)
                 ON CONFLICT (scope, partition_index) DO UPDATE
                   SET owner = excluded.owner,
                       expires_at = excluded.expires_at,
                       fence = CASE WHEN l.owner = excluded.owner AND l.expires_at >= $4
                                    THEN l.fence ELSE l.fence + 1 END
                   WHERE l.owner = excluded.owner OR l.expires_at < $4
                 RETURNING fence",
            )
            .bind(scope)
            .bind(i64::from(p))
            .bind(member)
            .bind(now)
            .bind(now.saturating_add(millis(ttl)))
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("acquiring leases"))?;
            if let Some(fence) = row {
                leases.push(Lease { partition: p, fence });
            }
        }
        tx.commit().await.map_err(Error::db("acquiring leases"))?;
        leases.sort();
        Ok(leases)
    }

    async fn release(&self, scope: &str, member: &str, wanted: &[u32]) -> Result<()> {
        let mut tx = self
            .inner
            .pool
            .begin()
            .await
            .map_err(Error::db("releasing leases"))?;
        for &p in wanted {
            sqlx::query(
                "UPDATE tidings_leases SET expires_at = 0
                 WHERE scope = $1 AND owner = $2 AND partition_index = $3",
            )
            .bind(scope)
            .bind(member)
            .bind(i64::from(p))
            .execute(&mut *tx)
            .await
            .map_err(Error::db("releasing leases"))?;
        }
        tx.commit().await.map_err(Error::db("releasing leases"))?;
        Ok(())
    }

    async fn leave(&self, scope: &str, member: &str) -> Result<()> {
        let mut tx = self.inner.pool.begin().await.map_err(Error::db("leaving"))?;
        sqlx::query("UPDATE tidings_leases SET expires_at = 0 WHERE scope = $1 AND owner = $2")
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

/// The fence check of a handler's transaction. The runtime writes the
/// processed marker first, so the transaction already holds SQLite's only
/// write lock: the lease cannot change hands until it ends.
pub(crate) async fn holds_lease(
    conn: &mut SqliteConnection,
    scope: &str,
    member: &str,
    lease: Lease,
) -> Result<bool> {
    let row: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM tidings_leases
         WHERE scope = $1 AND partition_index = $2 AND owner = $3 AND fence = $4 AND expires_at > $5",
    )
    .bind(scope)
    .bind(i64::from(lease.partition))
    .bind(member)
    .bind(lease.fence)
    .bind(now_millis())
    .fetch_optional(conn)
    .await
    .map_err(Error::db("checking a lease"))?;
    Ok(row.is_some())
}
