//! Tidings' SQL store, written once over a small per-database [`Dialect`].
//!
//! [`SqlStore<D>`] implements every store trait of `tidings-core` (the
//! outbox, the relay's claims, the consumers' records, the failure store,
//! parking, leases, lag, inspection, replay, the audit trail and the
//! database log's backend)
//! with one Rust flow. A dialect supplies only what differs between
//! databases: its table of [`Statements`], its list codecs, its claim (how
//! two relays stay off the same rows), its [`Wakeups`], which of its
//! error codes are worth trying again ([`errors`]) and its migrations. `tidings-store-postgres` and `tidings-store-sqlite` are the
//! two dialects; `PgStore` and `SqliteStore` are `SqlStore` over them.
//!
//! ```no_run
//! use tidings_core::Outbox;
//! # async fn run<D: tidings_sql::Dialect>(order: impl tidings_core::Message) -> Result<(), Box<dyn std::error::Error>> {
//! let store = tidings_sql::SqlStore::<D>::connect("sqlite://tidings.db").await?;
//! store.migrate().await?;
//! let mut tx = store.pool().begin().await?;
//! // ... the business write, on the same transaction ...
//! let id = store.enqueue(&mut tx, &order).await?; // the envelope's id
//! tx.commit().await?;
//! store.wake(); // after commit: relays pick it up now rather than at their next poll
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod audit;
mod claimed;
pub mod connect;
mod consumer;
pub mod db;
mod dialect;
pub mod errors;
mod failures;
mod inbox;
mod inspect;
pub mod json_lists;
mod lag;
mod lease;
mod log;
pub mod migrate;
mod outbox;
mod parking;
pub mod placeholders;
mod replay;
pub mod shared;
mod store;
mod trace;
mod tx_batch;

pub use claimed::{ClaimedRows, settle};
pub use dialect::{Dialect, LocalWakeups, Statements, Wakeups};
pub use errors::{classify, db_error, log_error};
pub use failures::DEAD_LETTER_COLUMNS;
pub use replay::REPLAY_COLUMNS;
pub use store::{SqlStore, StoreOptions};
pub use tx_batch::{CLAIM_SAVEPOINT, TxBatch};
