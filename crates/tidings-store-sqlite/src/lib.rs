//! SQLite for Tidings, the embedded default: the transactional outbox, the
//! relay's claims, the database-log transport, the consumers' idempotency
//! records, the effects ledger and the failure store, in one file.
//!
//! ```no_run
//! use tidings_core::{Envelope, Outbox, OutgoingMessage};
//! use tidings_store_sqlite::SqliteStore;
//! # async fn run(order: impl tidings_core::Message) -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::connect("sqlite://tidings.db").await?;
//! store.migrate().await?;
//!
//! let mut tx = store.pool().begin().await?;
//! // ... the business write, on the same transaction ...
//! let envelope = Envelope::new("checkout", &order)?;
//! store.enqueue(&mut tx, &OutgoingMessage { topic: "orders".into(), envelope }).await?;
//! tx.commit().await?;
//! store.wake();
//! # Ok(()) }
//! ```
//!
//! SQLite serializes writers, so one relay per database file: a second relay
//! on the same file would publish duplicates (never lose anything). Wake-ups
//! travel in memory; other processes poll.
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

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tidings_core::guard::Guard;
use tidings_core::log::{LogPublisher, LogReaderConfig, LogSubscriber};
use tidings_core::{Error, PublishGuard, Result};
use tokio::sync::{Notify, watch};

pub use outbox::SqliteBatch;

/// Options of a [`SqliteStore`].
#[derive(Debug, Clone, Default)]
pub struct SqliteStoreOptions {
    retention: Option<Duration>,
    guard: Guard,
}

impl SqliteStoreOptions {
    /// Keep sent outbox rows for `retention` instead of deleting them when sent.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
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

/// Tidings' SQLite store. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    options: SqliteStoreOptions,
    outbox_signal: Notify,
    log_signal: watch::Sender<u64>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("pool_size", &self.inner.pool.size())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

pub(crate) fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path.db`
    /// or a plain path), in WAL mode with `synchronous = FULL`: a commit
    /// that returned survives a power cut.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SqliteStoreOptions::default()).await
    }

    /// [`SqliteStore::connect`] with options.
    pub async fn connect_with(url: &str, store_options: SqliteStoreOptions) -> Result<Self> {
        let url = if url.starts_with("sqlite:") {
            url.to_owned()
        } else {
            format!("sqlite://{url}")
        };
        let options = SqliteConnectOptions::from_str(&url)
            .map_err(|e| Error::Config {
                key: "database".into(),
                reason: e.to_string(),
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(Error::db("opening the SQLite database"))?;
        Ok(Self::with_options(pool, store_options))
    }

    /// A store on an existing pool, with default options.
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_options(pool, SqliteStoreOptions::default())
    }

    /// A store on an existing pool.
    pub fn with_options(pool: SqlitePool, options: SqliteStoreOptions) -> Self {
        SqliteStore {
            inner: Arc::new(Inner {
                pool,
                options,
                outbox_signal: Notify::new(),
                log_signal: watch::Sender::new(0),
            }),
        }
    }

    /// The connection pool, for the application's own queries.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// Creates or upgrades Tidings' tables (idempotent).
    pub async fn migrate(&self) -> Result<()> {
        migrate::run(&self.inner.pool).await
    }

    /// The database-log transport's publisher on this database.
    pub fn log_publisher(&self) -> LogPublisher<SqliteStore> {
        LogPublisher::new(Arc::new(self.clone()))
    }

    /// The database-log transport's subscriber on this database.
    pub fn log_subscriber(&self, config: LogReaderConfig) -> LogSubscriber<SqliteStore> {
        LogSubscriber::new(Arc::new(self.clone()), config)
    }
}
