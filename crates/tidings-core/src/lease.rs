//! Partition leases: which member of a group holds which partition.
//!
//! Members of one *scope* (a consumer group on a topic, [`scope`]) share its
//! partitions through the database they already use, so no coordinator is
//! needed. A [`LeaseStore`] keeps each scope's membership (who is alive,
//! [`LeaseStore::heartbeat`]) and its leases ([`LeaseStore::acquire`],
//! [`LeaseStore::release`]); the membership loop that splits the partitions
//! among the live members and takes, renews and hands over their leases is
//! the `tidings-lease` crate, which the consumer runtime and the relay both
//! run.
//!
//! Each lease carries a *fencing token* that grows every time the partition
//! changes hands (or its lease lapsed). A member's writes check it
//! ([`ConsumerStore::holds_lease`](crate::ConsumerStore::holds_lease)) in
//! the same transaction, so a member that stalled past its lease and was
//! replaced cannot commit work for a partition it no longer holds.

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::error::Result;

/// A partition held by a member, with its fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease {
    /// The partition's index.
    pub partition: u32,
    /// Grows each time the partition changes hands or its lease lapses.
    pub fence: i64,
}

/// Membership and leases of partitioned scopes.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Records `member` as alive in `scope` for `ttl`, forgets members whose
    /// time ran out, and returns the live members, sorted.
    async fn heartbeat(&self, scope: &str, member: &str, ttl: Duration) -> Result<Vec<String>>;

    /// Takes or renews, for `ttl`, each partition of `wanted` that is free,
    /// expired or held by `member`; returns the leases `member` holds among
    /// `wanted` afterwards, sorted by partition. A partition that was not
    /// `member`'s with a live lease gets a new fencing token.
    async fn acquire(&self, scope: &str, member: &str, wanted: &[u32], ttl: Duration) -> Result<Vec<Lease>>;

    /// Gives up the leases `member` holds on `partitions` (others' are left alone).
    async fn release(&self, scope: &str, member: &str, partitions: &[u32]) -> Result<()>;

    /// Removes `member` from `scope`'s membership and gives up all its leases.
    async fn leave(&self, scope: &str, member: &str) -> Result<()>;
}

/// Sleeps for `delay`, or until `token` is cancelled if that comes first.
pub async fn sleep_unless(token: &CancellationToken, delay: Duration) {
    tokio::select! {
        _ = token.cancelled() => {}
        _ = tokio::time::sleep(delay) => {}
    }
}

/// The name of the scope of `group` reading `topic`.
pub fn scope(group: &str, topic: &str) -> String {
    format!("{group}@{topic}")
}

/// The group and topic of a [`scope`]; `None` for a scope of another kind (`relay`).
pub fn group_and_topic(scope: &str) -> Option<(&str, &str)> {
    scope.split_once('@')
}
