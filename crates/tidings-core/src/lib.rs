//! The shapes every Tidings crate shares.
//!
//! - [`Envelope`]: the one message shape, convertible losslessly to and from
//!   CloudEvents 1.0 JSON ([`cloudevents`]).
//! - [`Message`]: typed events and commands declared in Rust.
//! - [`transport`]: the [`Publisher`] the relay drives and the [`Subscriber`]
//!   the consumer runtime reads, with explicit acknowledgement ([`AckKind`]).
//! - [`store`]: the small traits a database store implements: [`Outbox`],
//!   [`RelayStore`], [`ConsumerStore`], [`FailureStore`], [`LagSource`], and
//!   [`log`]: what a database provides to serve as a log.
//! - [`audit`]: the trail of who did what to a deployment ([`AuditStore`]).
//! - [`Error`] and [`ErrorClass`]: every error says whether to retry.
//! - [`Partition`]: how keys spread over the members of a group, and
//!   [`lease`]: the leases by which the members share the partitions.
//! - [`Backoff`]: capped exponential backoff with jitter.
//! - [`duplicating`]: a subscriber that redelivers some messages twice, as
//!   brokers do.
//!
//! The loops built on these contracts are crates of their own: the
//! database-log transport is `tidings-log`, the membership loop over the
//! leases is `tidings-lease`.
//!
//! Users normally depend on the `tidings` facade crate, which re-exports
//! what a service names from this one.
//!
//! ```
//! use tidings_core::{cloudevents, Envelope, Message};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Message)]
//! #[message(event, topic = "orders", aggregate = "order")]
//! struct OrderPlaced { #[message(key)] order_id: String, total_cents: u64 }
//!
//! let env = Envelope::new("checkout", &OrderPlaced { order_id: "o-1".into(), total_cents: 4200 })?;
//! let wire = cloudevents::to_json(&env);
//! assert_eq!(cloudevents::from_json(&wire)?, env);
//! # Ok::<(), tidings_core::DecodeError>(())
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod addresses;
pub mod audit;
pub mod backoff;
pub mod clamp;
pub mod cloudevents;
pub mod duplicating;
pub mod duration;
pub mod envelope;
pub mod error;
pub mod field;
pub mod guard;
pub mod inbox;
pub mod inspect;
pub mod lease;
pub mod log;
pub mod message;
pub mod metrics;
pub mod names;
pub mod partition;
pub mod plain;
pub mod replay;
pub mod retry;
pub mod secret;
pub mod set_aside;
pub mod store;
pub mod topology;
pub mod trace;
pub mod transition;
pub mod transport;
pub mod waves;

pub use audit::{AuditEntry, AuditStore};
pub use backoff::Backoff;
pub use envelope::{Envelope, Headers};
pub use error::{DecodeError, Error, ErrorClass, Report, Result};
pub use guard::PublishGuard;
pub use inbox::InboxStore;
pub use inspect::Inspect;
pub use lease::{Lease, LeaseStore};
pub use message::{Kind, Message};
pub use partition::Partition;
pub use replay::ReplayStore;
pub use set_aside::{OutboxRecord, RELAY_LETTERS, SetAside, Settlement, Undecodable};
pub use store::{
    ClaimedBatch, ConsumerLag, ConsumerStore, DeadLetter, DeadLetterEdit, DeadLetterFilter, DeadLetterLag,
    EDIT_HEADER, Edit, Failure, FailureStore, Fence, Handling, HeldKey, LagReport, LagSource, Outbox,
    OutboxPartitions, ParkedLag, ParkedMessage, ParkingStore, REDRIVE_HEADER, Redrive, RelayStore, Skip,
    dead_letter_state, redrive_envelope,
};
/// `#[derive(Message)]`: implements [`Message`](trait@Message) from `#[message(...)]`
/// attributes (see the `tidings-macros` crate).
pub use tidings_macros::Message;
pub use topology::Topology;
pub use transport::{
    AckKind, Acker, Delivery, OutgoingMessage, Publisher, RawMessage, Subscriber, Subscription,
};

/// Every ability of a database store, in one bound: what the consumer
/// runtime, the daemon and the reference systems ask of a store. Each
/// ability stays its own small trait, for callers that need only one; a
/// store that has them all (`tidings-sql`'s `SqlStore` over any dialect) is
/// a `Store` without saying so.
pub trait Store:
    Outbox
    + RelayStore
    + ConsumerStore
    + FailureStore
    + ParkingStore
    + LeaseStore
    + LagSource
    + Inspect
    + ReplayStore
    + log::LogBackend
    + Clone
{
}

impl<S> Store for S where
    S: Outbox
        + RelayStore
        + ConsumerStore
        + FailureStore
        + ParkingStore
        + LeaseStore
        + LagSource
        + Inspect
        + ReplayStore
        + log::LogBackend
        + Clone
{
}

/// What `#[derive(Message)]` expands to refers to; not an API.
#[doc(hidden)]
pub mod __private {
    pub use serde;
    pub use serde_json;
}
