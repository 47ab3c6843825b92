//! Tidings: reliable events for Rust backends.
//!
//! Add this one crate to a service and pick the backends with features:
//! `sqlite` (the default, embedded, no server), `postgres` and `mysql`
//! (MySQL and MariaDB) for the store; `nats`, `rabbitmq`, `kafka`, `sqs` and `pubsub` for brokers; `prometheus`, `otel`
//! and `schema` (on by default) for operations; `inbox` for the webhook inbox. Then:
//!
//! 1. write events to the outbox in the same transaction as the business
//!    write ([`Outbox::enqueue`]), and wake the relay after commit;
//! 2. run a [`relay::Relay`] that moves them to a transport (the database
//!    log built in, [`log`], or a broker), confirmed before they are marked
//!    sent;
//! 3. run [`consumer::Consumer`]s whose handlers are made idempotent,
//!    retried, dead-lettered and ordered per key by the runtime.
//!
//! [`prelude`] holds what a service names; `examples/quickstart` is the
//! whole path in one file, on SQLite:
//!
//! ```no_run
#![doc = include_str!("../../../examples/quickstart/src/main.rs")]
//! ```
//!
//! The crates behind it: `tidings-core` (envelope, traits), `tidings-relay`,
//! `tidings-consumer`, `tidings-schema` (event contracts), `tidings-sql` (the
//! SQL store written once) with one `tidings-store-*` dialect per database,
//! and one `tidings-broker-*` crate per broker.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod open_store;
mod open_transport;
pub mod prelude;
mod signal;

pub use open_store::{AnyStore, database_named, open_store, open_store_with, store_schemes};
pub use open_transport::{
    AnyBroker, Transport, TransportOptions, open_transport, open_transport_with, opens_transport,
    transport_addresses, transport_schemes,
};
pub use signal::shutdown_on_signal;

// The vocabulary: messages, envelopes, errors.
pub use tidings_core::{
    Backoff, DecodeError, Envelope, Error, ErrorClass, Headers, Kind, Message, Partition, Result, Topology,
};
// What a store does, one small trait per ability, and all of them at once.
pub use tidings_core::{
    AuditEntry, AuditStore, ConsumerLag, ConsumerStore, DeadLetter, DeadLetterEdit, DeadLetterFilter,
    DeadLetterLag, Edit, Failure, FailureStore, HeldKey, InboxStore, Inspect, LagReport, LagSource, Lease,
    LeaseStore, Outbox, ParkedLag, ParkedMessage, ParkingStore, Redrive, RelayStore, ReplayStore, Skip,
    Store,
};
// What a transport does.
pub use tidings_core::{
    AckKind, Acker, Delivery, OutgoingMessage, PublishGuard, Publisher, RawMessage, Subscriber, Subscription,
};
// The contracts and helpers by area.
pub use tidings_core::{
    addresses, audit, backoff, clamp, cloudevents, duration, envelope, field, guard, inspect, metrics,
    partition, plain, replay, secret, store, topology, trace, transition, transport,
};

/// What `#[derive(Message)]` expands to refers to; not an API.
#[doc(hidden)]
pub use tidings_core::__private;

/// Handlers are `#[async_trait]` impls.
pub use async_trait::async_trait;
/// The database driver Tidings runs on: the pool, the transaction and the
/// queries of the service's own tables are sqlx's.
pub use sqlx;
/// Stops relays and consumers: cancel it and they finish what they hold.
pub use tokio_util::sync::CancellationToken;
/// Envelope ids.
pub use uuid::{self, Uuid};

/// The database log: the contract a database implements (`LogBackend`) and
/// the transport over it (`LogPublisher`, `LogSubscriber`).
pub mod log {
    pub use tidings_core::log::*;
    pub use tidings_log::*;
}

/// Partition leases: the contract a store implements (`LeaseStore`) and the
/// membership loop over it (`Membership`).
pub mod lease {
    pub use tidings_core::lease::*;
    pub use tidings_lease::*;
}

/// The consumer runtime.
pub mod consumer {
    pub use tidings_consumer::*;
}

/// The relay.
pub mod relay {
    pub use tidings_relay::*;
}

/// The SQL store written once ([`sql::SqlStore`]) and the [`sql::Dialect`]
/// each database supplies.
pub mod sql {
    pub use tidings_sql::*;
}

/// The webhook inbox (feature `inbox`): signed deliveries from a provider
/// (Stripe, GitHub, any HMAC signer), each recorded once and enqueued as an
/// event in one transaction, answered after the commit.
#[cfg(feature = "inbox")]
pub mod inbox {
    pub use tidings_inbox::*;
}

/// PostgreSQL store (feature `postgres`).
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use tidings_store_postgres::*;
}

/// MySQL and MariaDB store (feature `mysql`).
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use tidings_store_mysql::*;
}

/// SQLite store, the embedded default (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use tidings_store_sqlite::*;
}

/// NATS JetStream transport (feature `nats`).
#[cfg(feature = "nats")]
pub mod nats {
    pub use tidings_broker_nats::*;
}

/// RabbitMQ transport (feature `rabbitmq`).
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq {
    pub use tidings_broker_rabbitmq::*;
}

/// Kafka transport (feature `kafka`).
#[cfg(feature = "kafka")]
pub mod kafka {
    pub use tidings_broker_kafka::*;
}

/// Google Cloud Pub/Sub transport (feature `pubsub`).
#[cfg(feature = "pubsub")]
pub mod pubsub {
    pub use tidings_broker_pubsub::*;
}

/// Amazon SNS + SQS transport (feature `sqs`).
#[cfg(feature = "sqs")]
pub mod sqs {
    pub use tidings_broker_sqs::*;
}

/// A Prometheus endpoint for Tidings' metrics (feature `prometheus`).
#[cfg(feature = "prometheus")]
pub mod prometheus {
    pub use tidings_prometheus::*;
}

/// Tidings' spans exported to OpenTelemetry (feature `otel`).
#[cfg(feature = "otel")]
pub mod otel {
    pub use tidings_otel::*;
}

/// Event contracts: schemas from the types, the registry, the compatibility
/// check, validation at publish, the secrets lint, AsyncAPI (feature `schema`).
#[cfg(feature = "schema")]
pub mod schema {
    pub use tidings_schema::*;
}
