//! Which partitions of each topic this member reads: the group's
//! [`Membership`] through the store's leases ([`tidings_core::lease`],
//! [`tidings_lease`]).

use std::sync::Arc;

use tidings_core::Partition;
use tidings_core::lease::{Lease, LeaseStore};
use tidings_lease::{Held, Membership};

/// A partition being read, with the lease that allows it.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub(crate) scope: Arc<str>,
    pub(crate) lease: Lease,
}

/// Every (topic, partition, claim) `held` allows reading; `topics` are in
/// the order of the membership's scopes.
pub(crate) fn claims<'a, S: LeaseStore>(
    membership: &'a Membership<S>,
    topics: &'a [String],
    held: &'a Held,
) -> impl Iterator<Item = (&'a str, Partition, Claim)> + 'a {
    membership
        .scopes()
        .iter()
        .zip(topics)
        .zip(held)
        .flat_map(|((scope, topic), leases)| {
            leases.iter().map(move |lease| {
                (
                    topic.as_str(),
                    Partition::new(lease.partition, scope.partitions),
                    Claim {
                        scope: scope.name.clone(),
                        lease: *lease,
                    },
                )
            })
        })
}
