//! What operators' tools read.

use std::collections::BTreeMap;

use async_trait::async_trait;
use tidings_core::Result;
use tidings_core::inspect::{
    Inspect, MemberStatus, MessageTrace, PartitionBacklog, RelayHold, ReplicationSlot, SchemaVersion,
};
use uuid::Uuid;

use crate::db::Stmt;
use crate::store::{age, count};
use crate::{Dialect, SqlStore};

#[async_trait]
impl<D: Dialect> Inspect for SqlStore<D> {
    async fn members(&self) -> Result<Vec<MemberStatus>> {
        let mut conn = self.conn("listing members").await?;
        let members = Stmt::<D>::new(D::SQL.live_members, "listing members")
            .fetch_all(&mut conn)
            .await?;
        let leases = Stmt::<D>::new(D::SQL.live_leases, "listing leases")
            .fetch_all(&mut conn)
            .await?;
        let mut held: BTreeMap<(String, String), Vec<(u32, i64)>> = BTreeMap::new();
        for r in &leases {
            held.entry((r.get(0)?, r.get(1)?))
                .or_default()
                .push((r.get::<i32>(2)?.max(0) as u32, r.get(3)?));
        }
        members
            .iter()
            .map(|r| {
                let (scope, member): (String, String) = (r.get(0)?, r.get(1)?);
                Ok(MemberStatus {
                    leases: held.remove(&(scope.clone(), member.clone())).unwrap_or_default(),
                    scope,
                    member,
                    expires_in: age(r.get(2)?),
                })
            })
            .collect()
    }

    async fn outbox_backlog(&self, partitions: u32) -> Result<Vec<PartitionBacklog>> {
        let mut conn = self.conn("measuring the outbox by partition").await?;
        let rows = Stmt::<D>::new(D::SQL.outbox_backlog, "measuring the outbox by partition")
            .bind(i64::from(partitions.max(1)))
            .fetch_all(&mut conn)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(PartitionBacklog {
                    partition: r.get::<i64>(0)?.max(0) as u32,
                    pending: count(r.get(1)?),
                    oldest_age: r.get::<Option<i64>>(2)?.map(age),
                })
            })
            .collect()
    }

    async fn outbox_high_water(&self) -> Result<i64> {
        let mut conn = self.conn("reading the outbox's sequence").await?;
        Stmt::<D>::new(D::SQL.outbox_high_water, "reading the outbox's sequence")
            .fetch_one(&mut conn)
            .await?
            .get(0)
    }

    async fn relay_holds(&self) -> Result<Vec<RelayHold>> {
        let mut conn = self.conn("reading the relay's holds").await?;
        let rows = Stmt::<D>::new(D::SQL.relay_holds, "reading the relay's holds")
            .fetch_all(&mut conn)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(RelayHold {
                    seq: r.get(0)?,
                    message_id: r.get(1)?,
                    topic: r.get(2)?,
                    aggregate_key: r.get(3)?,
                    waiting: u64::try_from(r.get::<i64>(4)?).unwrap_or(0),
                })
            })
            .collect()
    }

    async fn has_processed(&self, consumer: &str) -> Result<bool> {
        let mut conn = self.conn("looking for processed markers").await?;
        Stmt::<D>::new(D::SQL.has_processed, "looking for processed markers")
            .bind(consumer)
            .fetch_one(&mut conn)
            .await?
            .get(0)
    }

    async fn handled_recently(&self, window: std::time::Duration) -> Result<Vec<(String, u64)>> {
        let what = "counting recent processed markers";
        let mut conn = self.conn(what).await?;
        let rows = Stmt::<D>::new(D::SQL.handled_recently, what)
            .bind(i64::try_from(window.as_millis()).unwrap_or(i64::MAX))
            .fetch_all(&mut conn)
            .await?;
        rows.iter()
            .map(|r| Ok((r.get::<String>(0)?, u64::try_from(r.get::<i64>(1)?).unwrap_or(0))))
            .collect()
    }

    async fn schema_version(&self) -> Result<SchemaVersion> {
        let mut conn = self.conn("looking for tidings_migrations").await?;
        let exists: bool = Stmt::<D>::new(D::SQL.migrations_table_exists, "looking for tidings_migrations")
            .fetch_one(&mut conn)
            .await?
            .get(0)?;
        let applied = if exists {
            Stmt::<D>::new(D::SQL.applied_migration, "reading tidings_migrations")
                .fetch_one(&mut conn)
                .await?
                .get::<Option<i64>>(0)?
                .unwrap_or(0)
        } else {
            0
        };
        Ok(SchemaVersion {
            applied,
            latest: D::MIGRATIONS.latest(),
        })
    }

    async fn replication_slots(&self) -> Result<Vec<ReplicationSlot>> {
        let Some(sql) = D::SQL.replication_slots else {
            return Ok(Vec::new());
        };
        let mut conn = self.conn("listing replication slots").await?;
        let rows = Stmt::<D>::new(sql, "listing replication slots")
            .fetch_all(&mut conn)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ReplicationSlot {
                    name: r.get(0)?,
                    active: r.get(1)?,
                    retained_bytes: count(r.get::<Option<i64>>(2)?.unwrap_or(0)),
                    unconfirmed_bytes: count(r.get::<Option<i64>>(3)?.unwrap_or(0)),
                })
            })
            .collect()
    }

    async fn trace_message(&self, id: Uuid) -> Result<Option<MessageTrace>> {
        Ok(self.traces(&[id]).await?.pop())
    }

    async fn trace_key(&self, key: &str, limit: u32) -> Result<Vec<MessageTrace>> {
        let ids = self.key_messages(key, limit).await?;
        self.traces(&ids).await
    }
}
