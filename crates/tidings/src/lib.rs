//! Tidings: reliable events for Rust backends.
//!
//! Add this crate to a service and pick the database with a feature
//! (`sqlite`, the default, and `postgres`). Then:
//!
//! 1. write events to the outbox in the same transaction as the business
//!    write ([`Outbox::enqueue`]), and wake the relay after commit;
//! 2. run a [`relay::Relay`] that moves them to a transport (the database
//!    log built in, [`log`]), confirmed before they are marked sent;
//! 3. run [`consumer::Consumer`]s whose handlers are made idempotent,
//!    retried, dead-lettered and ordered per key by the runtime.
//!
//! The crates behind it: `tidings-core` (envelope, traits), `tidings-relay`,
//! `tidings-consumer`, `tidings-schema` (event contracts), `tidings-sql` (the
//! SQL store written once) and one `tidings-store-*` dialect per database.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub use tidings_core::*;

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

/// Event contracts: schemas from the types, the registry, the compatibility
/// check, validation at publish, the secrets lint, AsyncAPI (feature `schema`).
#[cfg(feature = "schema")]
pub mod schema {
    pub use tidings_schema::*;
}

/// The SQL store written once ([`sql::SqlStore`]) and the [`sql::Dialect`]
/// each database supplies.
pub mod sql {
    pub use tidings_sql::*;
}

/// PostgreSQL store.
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use tidings_store_postgres::*;
}

/// SQLite store (the embedded default).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use tidings_store_sqlite::*;
}
