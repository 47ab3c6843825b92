//! Partition leases: which member of a group holds which partition.
//!
//! Members of one *scope* (a consumer group on a topic) share its
//! partitions through the database they already use, so no coordinator is
//! needed:
//!
//! 1. each member renews its row in the scope's membership
//!    ([`LeaseStore::heartbeat`]), learning who else is alive;
//! 2. the live members, sorted, split the partitions round robin
//!    ([`assignment`]): every member computes the same answer;
//! 3. a member takes the leases of its share ([`LeaseStore::acquire`]),
//!    which succeeds only for partitions free, expired or already its own,
//!    and gives back, once it stopped reading them, those no longer its
//!    share ([`LeaseStore::release`]).
//!
//! [`Membership`] runs these steps for one member of one or more scopes;
//! the consumer runtime and the relay both use it.
//!
//! Each lease carries a *fencing token* that grows every time the partition
//! changes hands (or its lease lapsed). A member's writes check it
//! ([`ConsumerStore::holds_lease`](crate::ConsumerStore::holds_lease)) in
//! the same transaction, so a member that stalled past its lease and was
//! replaced cannot commit work for a partition it no longer holds.
//!
//! ```
//! use tidings_core::lease::assignment;
//! let members = ["a".to_string(), "b".to_string()];
//! assert_eq!(assignment(&members, "a", 5), vec![0, 2, 4]);
//! assert_eq!(assignment(&members, "b", 5), vec![1, 3]);
//! assert!(assignment(&members, "c", 5).is_empty(), "not a live member yet");
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The partitions of `count` that are `member`'s share among `members`
/// (sorted, as [`LeaseStore::heartbeat`] returns them): round robin, so
/// shares differ by at most one partition.
pub fn assignment(members: &[String], member: &str, count: u32) -> Vec<u32> {
    let Some(me) = members.iter().position(|m| m == member) else {
        return Vec::new();
    };
    let n = members.len() as u32;
    (0..count).filter(|p| p % n == me as u32).collect()
}

/// A member id unique to this process and run: `<kind>-pid<pid>-<random>`.
pub fn unique_member(kind: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{kind}-pid{}-{}", std::process::id(), &random[..8])
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

/// A scope a member belongs to, and how many partitions it has.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The scope's name ([`scope`] for a consumer group on a topic).
    pub name: Arc<str>,
    /// Its partition count.
    pub partitions: u32,
}

/// The leases held, per scope (same order as the scopes).
pub type Held = Vec<Vec<Lease>>;

/// One member of one or more scopes: it heartbeats, takes its share of
/// each scope's partitions, renews its leases while it works, and notices
/// when the shares move (the steps in the module documentation).
#[derive(Debug)]
pub struct Membership<S> {
    store: S,
    member: String,
    ttl: Duration,
    scopes: Vec<Scope>,
}

fn partitions_of(leases: &[Lease]) -> Vec<u32> {
    leases.iter().map(|l| l.partition).collect()
}

impl<S: LeaseStore> Membership<S> {
    /// `member` of `scopes`, with leases lasting `ttl`.
    pub fn new(store: S, member: String, ttl: Duration, scopes: Vec<Scope>) -> Self {
        Membership {
            store,
            member,
            ttl,
            scopes,
        }
    }

    /// This member's id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The scopes, in the order of [`Held`].
    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }

    /// How often leases are renewed: three times per lease.
    pub fn tick(&self) -> Duration {
        self.ttl / 3
    }

    /// This member's share of `scope`, from a fresh heartbeat.
    async fn share(&self, scope: &Scope) -> Result<Vec<u32>> {
        let members = self.store.heartbeat(&scope.name, &self.member, self.ttl).await?;
        Ok(assignment(&members, &self.member, scope.partitions))
    }

    /// Between sessions: gives back what is no longer this member's share
    /// (nothing reads it now) and takes what of its share is free.
    pub async fn sync(&self, held: &Held) -> Result<Held> {
        let mut now = Vec::with_capacity(self.scopes.len());
        for (i, scope) in self.scopes.iter().enumerate() {
            let share = self.share(scope).await?;
            let before = held.get(i).map(Vec::as_slice).unwrap_or_default();
            let give_up: Vec<u32> = partitions_of(before)
                .into_iter()
                .filter(|p| !share.contains(p))
                .collect();
            if !give_up.is_empty() {
                self.store.release(&scope.name, &self.member, &give_up).await?;
                tracing::info!(member = %self.member, scope = %scope.name, partitions = ?give_up, "partitions handed over");
            }
            let leases = self
                .store
                .acquire(&scope.name, &self.member, &share, self.ttl)
                .await?;
            let gained: Vec<u32> = partitions_of(&leases)
                .into_iter()
                .filter(|p| !partitions_of(before).contains(p))
                .collect();
            if !gained.is_empty() {
                tracing::info!(member = %self.member, scope = %scope.name, partitions = ?gained, "partitions taken");
            }
            now.push(leases);
        }
        Ok(now)
    }

    /// During a session: renews `held` every tick, and cancels `stop` as
    /// soon as the session must end: a lease was lost, part of it is no
    /// longer this member's share, more of its share became free, or
    /// renewing failed for so long that the leases may lapse.
    pub async fn watch(&self, held: &Held, stop: CancellationToken) {
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.tick()) => {}
            }
            match self.renew(held).await {
                Ok(None) => renewed = Instant::now(),
                Ok(Some(why)) => {
                    tracing::info!(member = %self.member, reason = why, "rebalancing partitions");
                    stop.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(member = %self.member, error = %e.report(), "renewing partition leases failed");
                    // Stop reading before the leases can lapse and pass to another member.
                    if renewed.elapsed() >= self.ttl.mul_f32(0.66) {
                        tracing::warn!(member = %self.member, "leases may lapse: stopping until they are renewed");
                        stop.cancel();
                        return;
                    }
                }
            }
        }
    }

    /// One renewal; `Some(reason)` when the session must end.
    async fn renew(&self, held: &Held) -> Result<Option<&'static str>> {
        for (i, scope) in self.scopes.iter().enumerate() {
            let share = self.share(scope).await?;
            let mine = &held[i];
            if mine.iter().any(|l| !share.contains(&l.partition)) {
                return Ok(Some("a partition is another member's share now"));
            }
            let leases = self
                .store
                .acquire(&scope.name, &self.member, &share, self.ttl)
                .await?;
            if mine.iter().any(|l| !leases.contains(l)) {
                return Ok(Some("a lease was lost"));
            }
            if leases.len() > mine.len() {
                return Ok(Some("more partitions are free to take"));
            }
        }
        Ok(None)
    }

    /// Leaves every scope (on shutdown), so others take over at once.
    pub async fn leave(&self) {
        for scope in &self.scopes {
            if let Err(e) = self.store.leave(&scope.name, &self.member).await {
                tracing::warn!(member = %self.member, scope = %scope.name, error = %e.report(), "leaving the group failed; its leases will lapse");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_partition_has_exactly_one_member() {
        let members: Vec<String> = ["m1", "m2", "m3"].iter().map(|s| s.to_string()).collect();
        let mut owners = vec![0; 16];
        for m in &members {
            for p in assignment(&members, m, 16) {
                owners[p as usize] += 1;
            }
        }
        assert!(owners.iter().all(|&n| n == 1), "{owners:?}");
        let shares: Vec<usize> = members
            .iter()
            .map(|m| assignment(&members, m, 16).len())
            .collect();
        assert_eq!(shares, vec![6, 5, 5]);
    }
}
