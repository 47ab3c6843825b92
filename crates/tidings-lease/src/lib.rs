//! Partition leases shared by the members of a group, with no coordinator.
//!
//! Members of one *scope* (a consumer group on a topic) share its
//! partitions through the database they already use, whose
//! [`LeaseStore`] keeps the membership and the leases:
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
//! the consumer runtime and the relay both use it. The contract it runs
//! over (the [`Lease`] with its fencing token, the [`LeaseStore`], the
//! names of scopes) is `tidings_core::lease`.
//!
//! ```
//! use tidings_lease::assignment;
//! let members = ["a".to_string(), "b".to_string()];
//! assert_eq!(assignment(&members, "a", 5), vec![0, 2, 4]);
//! assert_eq!(assignment(&members, "b", 5), vec![1, 3]);
//! assert!(assignment(&members, "c", 5).is_empty(), "not a live member yet");
//! ```
//!
//! [`Lease`]: tidings_core::lease::Lease
//! [`LeaseStore`]: tidings_core::lease::LeaseStore
//! [`LeaseStore::heartbeat`]: tidings_core::lease::LeaseStore::heartbeat
//! [`LeaseStore::acquire`]: tidings_core::lease::LeaseStore::acquire
//! [`LeaseStore::release`]: tidings_core::lease::LeaseStore::release
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod assignment;
mod membership;

pub use assignment::assignment;
pub use membership::{Held, Membership, Scope, unique_member};
