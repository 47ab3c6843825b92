//! What operators' tools read.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use tidings_core::inspect::{Inspect, MemberStatus, PartitionBacklog, ReplicationSlot, SchemaVersion};
use tidings_core::{Error, Result};

use crate::{SqliteStore, now_millis};

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

#[async_trait]
impl Inspect for SqliteStore {
    async fn members(&self) -> Result<Vec<MemberStatus>> {
        let pool = &self.inner.pool;
        let now = now_millis();
        let members: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT scope, member, expires_at FROM tidings_members WHERE expires_at > $1 ORDER BY scope, member",
        )
        .bind(now)
        .fetch_all(pool)
        .await
        .map_err(Error::db("listing members"))?;
        let leases: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT scope, owner, partition_index, fence FROM tidings_leases
             WHERE expires_at > $1 ORDER BY scope, owner, partition_index",
        )
        .bind(now)
        .fetch_all(pool)
        .await
        .map_err(Error::db("listing leases"))?;
        let mut held: BTreeMap<(String, String), Vec<(u32, i64)>> = BTreeMap::new();
        for (scope, owner, partition, fence) in leases {
            held.entry((scope, owner))
                .or_default()
                .push((partition.max(0) as u32, fence));
        }
        Ok(members
            .into_iter()
            .map(|(scope, member, expires_at)| MemberStatus {
                leases: held.remove(&(scope.clone(), member.clone())).unwrap_or_default(),
                scope,
                member,
                expires_in: millis(expires_at - now),
            })
            .collect())
    }

    async fn outbox_backlog(&self, count: u32) -> Result<Vec<PartitionBacklog>> {
        let rows: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
            "SELECT COALESCE(key_hash, 0) % $1, count(*), min(created_at)
             FROM tidings_outbox WHERE published_at IS NULL GROUP BY 1 ORDER BY 1",
        )
        .bind(i64::from(count.max(1)))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("measuring the outbox by partition"))?;
        let now = now_millis();
        Ok(rows
            .into_iter()
            .map(|(partition, pending, oldest)| PartitionBacklog {
                partition: partition.max(0) as u32,
                pending: pending.max(0) as u64,
                oldest_age: oldest.map(|t| millis(now - t)),
            })
            .collect())
    }

    async fn outbox_high_water(&self) -> Result<i64> {
        // AUTOINCREMENT keeps the highest sequence number even once every record is deleted.
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT max(COALESCE((SELECT max(seq) FROM tidings_outbox), 0),
                        COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'tidings_outbox'), 0))",
        )
        .fetch_one(&self.inner.pool)
        .await
        .map(|h| h.unwrap_or(0))
        .map_err(Error::db("reading the outbox's sequence"))
    }

    async fn has_processed(&self, consumer: &str) -> Result<bool> {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tidings_processed WHERE consumer = $1)")
            .bind(consumer)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(Error::db("looking for processed markers"))
    }

    async fn schema_version(&self) -> Result<SchemaVersion> {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tidings_migrations')",
        )
        .fetch_one(&self.inner.pool)
        .await
        .map_err(Error::db("looking for tidings_migrations"))?;
        let applied = if exists {
            sqlx::query_scalar::<_, Option<i64>>("SELECT max(version) FROM tidings_migrations")
                .fetch_one(&self.inner.pool)
                .await
                .map_err(Error::db("reading tidings_migrations"))?
                .unwrap_or(0)
        } else {
            0
        };
        Ok(SchemaVersion {
            applied,
            latest: crate::migrate::latest(),
        })
    }

    async fn replication_slots(&self) -> Result<Vec<ReplicationSlot>> {
        Ok(Vec::new())
    }
}
