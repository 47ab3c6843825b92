//! What operators' tools read of a running deployment: who is alive, which
//! partitions each holds, where the outbox backlog is, whether Tidings'
//! tables are current. `tidings outbox status` and `tidings doctor` read it.

use std::time::Duration;

use async_trait::async_trait;

use crate::{LagSource, Result};

/// A live member of a scope (a relay, or a member of a consumer group on a topic).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberStatus {
    /// `relay`, or `group@topic` ([`crate::lease::scope`]).
    pub scope: String,
    /// The member's id.
    pub member: String,
    /// How long its membership lasts without renewal.
    pub expires_in: Duration,
    /// The partitions whose live lease it holds, with their fencing tokens, sorted.
    pub leases: Vec<(u32, i64)>,
}

impl MemberStatus {
    /// The consumer group and topic it is a member for; `None` for a relay.
    pub fn group_and_topic(&self) -> Option<(&str, &str)> {
        crate::lease::group_and_topic(&self.scope)
    }

    /// Whether it is a member of consumer group `group`.
    pub fn is_in_group(&self, group: &str) -> bool {
        self.group_and_topic().is_some_and(|(g, _)| g == group)
    }
}

/// Outbox records waiting in one partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionBacklog {
    /// The partition's index.
    pub partition: u32,
    /// Records committed and not yet published.
    pub pending: u64,
    /// Age of the oldest of them.
    pub oldest_age: Option<Duration>,
}

/// A key the relay holds behind a record it set aside ([`crate::set_aside`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelayHold {
    /// The record's outbox sequence number.
    pub seq: i64,
    /// Its message id (its dead letter's, of `@relay`).
    pub message_id: uuid::Uuid,
    /// Its topic.
    pub topic: String,
    /// Its key (empty: it holds only itself).
    pub aggregate_key: String,
    /// Records of the key waiting behind it.
    pub waiting: u64,
}

/// Tidings' tables in a database, against what this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SchemaVersion {
    /// The latest migration applied (0: none, the tables are missing).
    pub applied: i64,
    /// The latest migration this build ships.
    pub latest: i64,
}

/// Reads a deployment's state for operators' tools.
#[async_trait]
pub trait Inspect: LagSource {
    /// Live members of every scope, with the live leases each holds.
    async fn members(&self) -> Result<Vec<MemberStatus>>;

    /// Outbox records waiting, per partition of `count` (partitions with none left out).
    async fn outbox_backlog(&self, count: u32) -> Result<Vec<PartitionBacklog>>;

    /// The highest sequence number given to an outbox record so far (0 for
    /// none), even if that record is sent and gone: two readings apart give
    /// the rate records are written at (counting those of rolled-back
    /// transactions, which also take a number).
    async fn outbox_high_water(&self) -> Result<i64>;

    /// The keys the relay holds behind records it set aside, oldest first.
    async fn relay_holds(&self) -> Result<Vec<RelayHold>>;

    /// Whether `consumer` has ever recorded a processed marker.
    async fn has_processed(&self, consumer: &str) -> Result<bool>;

    /// The migrations applied here.
    async fn schema_version(&self) -> Result<SchemaVersion>;

    /// The database's replication slots (PostgreSQL's change data capture);
    /// none where the database has no such thing.
    async fn replication_slots(&self) -> Result<Vec<ReplicationSlot>>;
}

/// A replication slot, and the write-ahead log it keeps from being recycled.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicationSlot {
    /// The slot's name.
    pub name: String,
    /// Whether a reader is connected to it now.
    pub active: bool,
    /// Bytes of write-ahead log kept for it.
    pub retained_bytes: u64,
}
