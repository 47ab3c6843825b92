//! PostgreSQL for Tidings: the transactional outbox, the relay's claims, the
//! database-log transport, the consumers' idempotency records, the effects
//! ledger and the failure store, all in one [`PgStore`].
//!
//! ```no_run
//! use tidings_core::{Envelope, Outbox, OutgoingMessage};
//! use tidings_store_postgres::PgStore;
//! # async fn run(order: impl tidings_core::Message) -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://root@127.0.0.1/test").await?;
//! store.migrate().await?;
//!
//! let mut tx = store.pool().begin().await?;
//! // ... the business write, on the same transaction ...
//! let envelope = Envelope::new("checkout", &order)?;
//! store.enqueue(&mut tx, &OutgoingMessage { topic: "orders".into(), envelope }).await?;
//! tx.commit().await?;
//! store.wake(); // after commit: relays pick it up now rather than at their next poll
//! # Ok(()) }
//! ```
//!
//! The SQL lives in one module per concern: [`outbox`](crate::outbox) (enqueue and
//! relay claims), `log` (the log transport), `consumer` (idempotency and effects),
//! `failures` (dead letters), `lease` (partition leases) and `lag`.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod consumer;
mod failures;
mod inspect;
mod lag;
mod lease;
mod log;
mod migrate;
pub mod outbox;
mod replay;
mod wake;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tidings_core::guard::Guard;
use tidings_core::log::{LogPublisher, LogReaderConfig, LogSubscriber};
use tidings_core::{Error, PublishGuard, Result};

pub use outbox::PgBatch;

/// Options of a [`PgStore`].
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    retention: Option<Duration>,
    cross_process_wakeups: bool,
    guard: Guard,
}

impl Default for PgStoreOptions {
    /// Sent outbox rows are deleted at once (no retention), and wake-ups
    /// are sent to other processes with `NOTIFY` after commit.
    fn default() -> Self {
        PgStoreOptions {
            retention: None,
            cross_process_wakeups: true,
            guard: None,
        }
    }
}

impl PgStoreOptions {
    /// Keep sent outbox rows for `retention` (marked with `published_at`)
    /// instead of deleting them when sent. [`RelayStore::cleanup`] deletes
    /// them once older.
    ///
    /// [`RelayStore::cleanup`]: tidings_core::RelayStore::cleanup
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Whether to wake relays and log readers in other processes with
    /// `LISTEN`/`NOTIFY` (sent after commit, coalesced). They poll anyway.
    pub fn cross_process_wakeups(mut self, on: bool) -> Self {
        self.cross_process_wakeups = on;
        self
    }

    /// Checks every message before the outbox accepts it (schema
    /// validation and the secrets lint, with `tidings-schema`'s
    /// `SchemaGuard`). A refused message is not written and `enqueue`
    /// returns [`Error::Refused`].
    pub fn guard(mut self, guard: Arc<dyn PublishGuard>) -> Self {
        self.guard = Some(guard);
        self
    }
}

/// Tidings' PostgreSQL store. Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    options: PgStoreOptions,
    wake: wake::Wakeups,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The pool's options hold the password: never print them.
        f.debug_struct("PgStore")
            .field("pool_size", &self.inner.pool.size())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects a pool of 32 connections to `url` (`postgres://user@host/db`).
    ///
    /// Size the pool for the handlers that run at once (one connection per
    /// consumer lane in a handler), plus the relay (two while it publishes to
    /// the database log) and one per log subscription.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PgStoreOptions::default()).await
    }

    /// [`PgStore::connect`] with options.
    pub async fn connect_with(url: &str, options: PgStoreOptions) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await
            .map_err(Error::db("connecting to PostgreSQL"))?;
        Ok(Self::with_options(pool, options))
    }

    /// A store on an existing pool, with default options.
    pub fn new(pool: PgPool) -> Self {
        Self::with_options(pool, PgStoreOptions::default())
    }

    /// A store on an existing pool.
    pub fn with_options(pool: PgPool, options: PgStoreOptions) -> Self {
        let wake = wake::Wakeups::new(pool.clone(), options.cross_process_wakeups);
        PgStore {
            inner: Arc::new(Inner { pool, options, wake }),
        }
    }

    /// The connection pool, for the application's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Creates or upgrades Tidings' tables (idempotent; safe from several processes at once).
    pub async fn migrate(&self) -> Result<()> {
        migrate::run(&self.inner.pool).await
    }

    /// The database-log transport's publisher on this database.
    pub fn log_publisher(&self) -> LogPublisher<PgStore> {
        LogPublisher::new(Arc::new(self.clone()))
    }

    /// The database-log transport's subscriber on this database.
    pub fn log_subscriber(&self, config: LogReaderConfig) -> LogSubscriber<PgStore> {
        LogSubscriber::new(Arc::new(self.clone()), config)
    }
}
