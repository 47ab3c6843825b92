//! Replay: re-delivering retained events to one consumer, safely.
//!
//! An operator asks (`tidings replay`, or [`ReplayStore::request_replay`]);
//! a running member of the consumer claims the request and feeds the
//! retained events of the range through its own stack, in the order they
//! were written, at the requested rate: an event the consumer has processed
//! is suppressed by its processed marker, one it has not is handled. So a
//! replay never repeats a recorded side effect, and backfills what was
//! missed. Progress is kept on the request, for the operator to follow and
//! for another member to resume from if the first one stops.
//!
//! Events are retained in the database log (entries are kept for the log's
//! retention) or, for a consumer on a broker, in the outbox when sent
//! records are kept (`retention` on the store).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{RawMessage, Result};

/// Where retained events are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplaySource {
    /// The database log's entries.
    Log,
    /// Sent outbox records kept for retention.
    Outbox,
}

impl ReplaySource {
    /// `log` or `outbox`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplaySource::Log => "log",
            ReplaySource::Outbox => "outbox",
        }
    }

    /// The source named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "log" => Some(ReplaySource::Log),
            "outbox" => Some(ReplaySource::Outbox),
            _ => None,
        }
    }
}

/// What to replay.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ReplayRequest {
    /// The consumer (group) to re-deliver to.
    pub consumer: String,
    /// Its topics to replay.
    pub topics: Vec<String>,
    /// Where the events are read from.
    pub source: ReplaySource,
    /// Events written at or after this...
    pub since: DateTime<Utc>,
    /// ...and before this.
    pub until: DateTime<Utc>,
    /// Events per second at most.
    pub rate: f64,
    /// How many events the range held when asked (for progress).
    pub total: u64,
}

/// Where a replay stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplayState {
    /// Waiting for a member of the consumer to take it up.
    Pending,
    /// A member is re-delivering.
    Running,
    /// Every event of the range was re-delivered.
    Done,
    /// Cancelled by the operator.
    Cancelled,
}

impl ReplayState {
    /// The state's name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayState::Pending => "pending",
            ReplayState::Running => "running",
            ReplayState::Done => "done",
            ReplayState::Cancelled => "cancelled",
        }
    }

    /// The state named `name` (unknown names read as cancelled).
    pub fn parse(name: &str) -> Self {
        match name {
            "pending" => ReplayState::Pending,
            "running" => ReplayState::Running,
            "done" => ReplayState::Done,
            _ => ReplayState::Cancelled,
        }
    }

    /// Whether nothing more will happen.
    pub fn is_final(self) -> bool {
        matches!(self, ReplayState::Done | ReplayState::Cancelled)
    }
}

/// Counts of a replay so far.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct ReplayCounts {
    /// Events re-delivered.
    pub delivered: u64,
    /// Of those, already processed: suppressed by the idempotency store.
    pub suppressed: u64,
    /// Of those, handled now (the consumer had not processed them).
    pub handled: u64,
    /// Of those, dead-lettered, parked behind a held key, or not decodable.
    pub failed: u64,
}

/// A replay as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Replay {
    /// Its id.
    pub id: Uuid,
    /// What was asked.
    pub request: ReplayRequest,
    /// Where it stands.
    pub state: ReplayState,
    /// The member carrying it out, if any.
    pub member: Option<String>,
    /// The last retained event's position done.
    pub cursor: i64,
    /// Counts so far.
    pub counts: ReplayCounts,
}

/// One retained event.
#[derive(Debug, Clone)]
pub struct Retained {
    /// Its position in its source (increasing in writing order).
    pub position: i64,
    /// The message as it was written.
    pub message: RawMessage,
}

/// Stores replay requests and reads retained events.
#[async_trait]
pub trait ReplayStore: Send + Sync + 'static {
    /// Up to `limit` retained events of `topics` written in `[since, until)`,
    /// after `position`, in writing order.
    async fn retained(
        &self,
        source: ReplaySource,
        topics: &[String],
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Retained>>;

    /// How many retained events of `topics` were written in `[since, until)`.
    async fn count_retained(
        &self,
        source: ReplaySource,
        topics: &[String],
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<u64>;

    /// How many of `ids` `consumer` has processed.
    async fn count_processed(&self, consumer: &str, ids: &[Uuid]) -> Result<u64>;

    /// Records a request, pending; returns its id.
    async fn request_replay(&self, request: &ReplayRequest) -> Result<Uuid>;

    /// The replay `id`.
    async fn replay(&self, id: Uuid) -> Result<Option<Replay>>;

    /// Takes up, for `ttl`, the oldest replay of `consumer` that is pending
    /// or whose member's claim ran out, as `member`.
    async fn claim_replay(&self, consumer: &str, member: &str, ttl: Duration) -> Result<Option<Replay>>;

    /// Records progress of a replay `member` holds, renewing its claim for
    /// `ttl`, and marks it done if `done`. `false` if it is no longer the
    /// member's to carry out (cancelled, or taken over): stop.
    async fn replay_progress(
        &self,
        id: Uuid,
        member: &str,
        cursor: i64,
        counts: ReplayCounts,
        ttl: Duration,
        done: bool,
    ) -> Result<bool>;

    /// Cancels a replay that is not finished; `false` if it was.
    async fn cancel_replay(&self, id: Uuid) -> Result<bool>;
}
