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

use std::time::Duration;

use async_trait::async_trait;

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

/// The name of the scope of `group` reading `topic`.
pub fn scope(group: &str, topic: &str) -> String {
    format!("{group}@{topic}")
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
