//! What operators' tools read of a running deployment: who is alive, which
//! partitions each holds, where the outbox backlog is, whether Tidings'
//! tables are current, and where one message stands ([`MessageTrace`]).
//! `tidings outbox status` and `tidings doctor` read it.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{LagSource, Partition, Result};

/// A live member of a scope (a relay, or a member of a consumer group on a topic).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
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

    /// Whether it is a relay (not a member of a consumer group).
    pub fn is_relay(&self) -> bool {
        self.group_and_topic().is_none()
    }
}

/// The outbox's partition count as the live relays among `members` hold
/// them (one past the highest partition held), or 1 when none holds any.
pub fn held_partitions(members: &[MemberStatus]) -> u32 {
    members
        .iter()
        .filter(|m| m.is_relay())
        .flat_map(|m| m.leases.iter().map(|(p, _)| p + 1))
        .max()
        .unwrap_or(1)
}

/// The relay holding each partition, among `members`, with its fencing token.
pub fn relay_holders(members: &[MemberStatus]) -> std::collections::BTreeMap<u32, (&str, i64)> {
    members
        .iter()
        .filter(|m| m.is_relay())
        .flat_map(|r| {
            r.leases
                .iter()
                .map(|(p, fence)| (*p, (r.member.as_str(), *fence)))
        })
        .collect()
}

/// Outbox records waiting in one partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PartitionBacklog {
    /// The partition's index.
    pub partition: u32,
    /// Records committed and not yet published.
    pub pending: u64,
    /// Age of the oldest of them.
    pub oldest_age: Option<Duration>,
}

/// A key the relay holds behind a record it set aside ([`crate::set_aside`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
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

    /// How many messages each consumer handled in the last `window`: its
    /// processed markers written since, read through their age's index.
    /// Markers the dedupe retention already deleted are not counted: keep
    /// `window` well below it.
    async fn handled_recently(&self, window: std::time::Duration) -> Result<Vec<(String, u64)>>;

    /// The migrations applied here.
    async fn schema_version(&self) -> Result<SchemaVersion>;

    /// The database's replication slots (PostgreSQL's change data capture);
    /// none where the database has no such thing.
    async fn replication_slots(&self) -> Result<Vec<ReplicationSlot>>;

    /// The story of message `id`; `None` when the database knows nothing of it.
    async fn trace_message(&self, id: Uuid) -> Result<Option<MessageTrace>>;

    /// The stories of the messages of aggregate key `key` the database knows
    /// of (from the outbox, dead letters and parked messages), oldest first,
    /// at most `limit`.
    async fn trace_key(&self, key: &str, limit: u32) -> Result<Vec<MessageTrace>>;
}

/// A replication slot, and the write-ahead log it keeps from being recycled.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ReplicationSlot {
    /// The slot's name.
    pub name: String,
    /// Whether a reader is connected to it now.
    pub active: bool,
    /// Bytes of write-ahead log kept for it.
    pub retained_bytes: u64,
    /// Bytes written since the position its reader last confirmed.
    pub unconfirmed_bytes: u64,
}

/// Where one message stands, as far as the database knows.
///
/// A sent message's outbox record is deleted unless the outbox keeps sent
/// records for a retention: its processed markers, effects and dead
/// letters still tell its story. Processed markers and effects are kept
/// for the dedupe retention only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct MessageTrace {
    /// The message's id (its envelope's).
    pub message_id: Uuid,
    /// Its type, from its outbox record or a dead letter, when one says.
    pub message_type: Option<String>,
    /// Its topic, from its outbox record, a dead letter or a parked copy.
    pub topic: Option<String>,
    /// Its aggregate key, from the same records.
    pub aggregate_key: Option<String>,
    /// Its outbox row, while it is there (pending, or sent and kept for the outbox retention).
    /// Of a message enqueued again (a redrive), the latest.
    pub outbox: Option<OutboxEntry>,
    /// The consumers that handled it (their processed markers), oldest first.
    pub handled: Vec<Handled>,
    /// Effects recorded for it (`ctx.once`), with their idempotency keys.
    pub effects: Vec<EffectRecord>,
    /// Its dead letters, one per consumer that gave up on it.
    pub dead_letters: Vec<DeadLetterRef>,
    /// Where it waits parked behind a held key, per consumer.
    pub parked: Vec<ParkedRef>,
    /// Whether the relay set its outbox record aside (a relay hold: the
    /// record and its key wait for a redrive or a skip of its `@relay` dead letter).
    pub held_by_relay: bool,
}

/// A message's outbox record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct OutboxEntry {
    /// Its sequence number: the outbox's order.
    pub seq: i64,
    /// The hash of its key that places it in a partition
    /// ([`crate::partition::key_hash`]); 0 for records written before
    /// the outbox kept it, which all belong to partition 0.
    pub key_hash: u32,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When the relay sent it, kept with an outbox retention; `None` while pending.
    pub published_at: Option<DateTime<Utc>>,
}

impl OutboxEntry {
    /// The relay partition it belongs to when the relays share `count` partitions.
    pub fn partition(&self, count: u32) -> Partition {
        let count = count.max(1);
        Partition::new(self.key_hash % count, count)
    }
}

/// A consumer's processed marker of a message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Handled {
    /// The consumer.
    pub consumer: String,
    /// When its handling committed.
    pub at: DateTime<Utc>,
}

/// A side effect recorded as done for a message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct EffectRecord {
    /// The consumer that did it.
    pub consumer: String,
    /// The effect's name.
    pub effect: String,
    /// The idempotency key it was done with.
    pub idempotency_key: String,
    /// When it was recorded.
    pub at: DateTime<Utc>,
}

/// A consumer's dead letter of a message, in short.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct DeadLetterRef {
    /// The dead letter's own id.
    pub id: Uuid,
    /// The consumer that gave up (`@relay` for the relay).
    pub consumer: String,
    /// `pending`, `redriven` or `skipped` (the later of the two decisions).
    pub state: String,
    /// Attempts made.
    pub attempts: u32,
    /// The last failure's error.
    pub last_error: Option<String>,
    /// When it was first dead-lettered.
    pub created_at: DateTime<Utc>,
}

/// A message parked behind a key a consumer holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ParkedRef {
    /// The consumer that parked it.
    pub consumer: String,
    /// The topic it was read from.
    pub topic: String,
    /// The held key.
    pub key: String,
    /// When it was parked.
    pub since: DateTime<Utc>,
    /// The dead-lettered message holding the key; `None` if the hold is gone.
    pub held_by_message: Option<Uuid>,
    /// That message's dead letter of the consumer, while there is one.
    pub held_by_dead_letter: Option<Uuid>,
    /// The hold was released by a skip: the parked messages go on.
    pub released: bool,
}
