//! What operators' tools read.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use tidings_core::inspect::{Inspect, MemberStatus, PartitionBacklog, ReplicationSlot, SchemaVersion};
use tidings_core::{Error, Result};

use crate::PgStore;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

#[async_trait]
impl Inspect for PgStore {
    async fn members(&self) -> Result<Vec<MemberStatus>> {
        let pool = &self.inner.pool;
        let members: Vec<(String, String, f64)> = sqlx::query_as(
            "SELECT scope, member, EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8
             FROM tidings_members WHERE expires_at > clock_timestamp() ORDER BY scope, member",
        )
        .fetch_all(pool)
        .await
        .map_err(Error::db("listing members"))?;
        let leases: Vec<(String, String, i32, i64)> = sqlx::query_as(
            "SELECT scope, owner, partition_index, fence FROM tidings_leases
             WHERE expires_at > clock_timestamp() ORDER BY scope, owner, partition_index",
        )
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
            .map(|(scope, member, left)| MemberStatus {
                leases: held.remove(&(scope.clone(), member.clone())).unwrap_or_default(),
                scope,
                member,
                expires_in: secs(left),
            })
            .collect())
    }

    async fn outbox_backlog(&self, count: u32) -> Result<Vec<PartitionBacklog>> {
        let rows: Vec<(i64, i64, Option<f64>)> = sqlx::query_as(
            "SELECT COALESCE(key_hash, 0) % $1, count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8
             FROM tidings_outbox WHERE published_at IS NULL GROUP BY 1 ORDER BY 1",
        )
        .bind(i64::from(count.max(1)))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("measuring the outbox by partition"))?;
        Ok(rows
            .into_iter()
            .map(|(partition, pending, oldest)| PartitionBacklog {
                partition: partition.max(0) as u32,
                pending: pending.max(0) as u64,
                oldest_age: oldest.map(secs),
            })
            .collect())
    }

    async fn outbox_high_water(&self) -> Result<i64> {
        // The sequence, not max(seq): sent records may be deleted.
        sqlx::query_scalar(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM tidings_outbox_seq_seq",
        )
        .fetch_one(&self.inner.pool)
        .await
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
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('tidings_migrations') IS NOT NULL")
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
        let rows: Vec<(String, bool, Option<i64>)> = sqlx::query_as(
            "SELECT slot_name::text, active,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
             FROM pg_replication_slots ORDER BY slot_name",
        )
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("listing replication slots"))?;
        Ok(rows
            .into_iter()
            .map(|(name, active, retained)| ReplicationSlot {
                name,
                active,
                retained_bytes: retained.unwrap_or(0).max(0) as u64,
            })
            .collect())
    }
}
