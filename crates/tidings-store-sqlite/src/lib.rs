//! SQLite for Tidings, the embedded default: the dialect of
//! [`tidings_sql`]'s store, so that [`SqliteStore`] holds the transactional
//! outbox, the relay's claims, the database-log transport, the consumers'
//! idempotency records, the effects ledger and the failure store, in one file.
//!
//! ```no_run
//! use tidings_core::Outbox;
//! use tidings_store_sqlite::SqliteStore;
//! # async fn run(order: impl tidings_core::Message) -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::connect("sqlite://tidings.db").await?;
//! store.migrate().await?;
//!
//! let mut tx = store.pool().begin().await?;
//! // ... the business write, on the same transaction ...
//! let id = store.enqueue(&mut tx, &order).await?; // the envelope's id
//! tx.commit().await?;
//! store.wake();
//! # Ok(()) }
//! ```
//!
//! SQLite serializes writers, so one relay per database file: a second relay
//! on the same file would publish duplicates (never lose anything). Wake-ups
//! travel in memory; other processes poll. What is SQLite's own: its
//! statements (`sql`), the relay's claim ([`SqliteBatch`]: read, then
//! completed under a fence check), the log's append, and its migrations.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod claim;
mod log;
mod migrate;
mod sql;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult, SqliteSynchronous,
};
use sqlx::{Sqlite, SqlitePool};
use tidings_core::{Error, OutboxPartitions, OutgoingMessage, Result};
use tidings_sql::{Dialect, LocalWakeups, SqlStore, Statements, StoreOptions, db_error, json_lists};
use uuid::Uuid;

pub use claim::SqliteBatch;

/// The SQLite dialect.
#[derive(Debug, Clone, Copy)]
pub struct Lite;

/// Tidings' SQLite store. Cheap to clone.
pub type SqliteStore = SqlStore<Lite>;

/// Options of a [`SqliteStore`].
pub type SqliteStoreOptions = StoreOptions;

pub(crate) fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[async_trait]
impl Dialect for Lite {
    type Db = Sqlite;
    type IntList = String;
    type TextList = String;
    type UuidList = String;
    type Batch = SqliteBatch;
    type Wakeups = LocalWakeups;

    const NAME: &'static str = "SQLite";
    const SCHEMES: &'static [&'static str] = &["sqlite:"];
    const LOG_TRANSPORT: &'static str = "sqlite-log";
    const SQL: Statements = sql::SQL;
    const MIGRATIONS: tidings_sql::migrate::MigrationPlan = migrate::PLAN;

    fn int_list(values: &[i64]) -> String {
        json_lists::ints(values)
    }

    fn text_list(values: &[String]) -> String {
        json_lists::texts(values)
    }

    /// Ids as hex strings: the statements match them with `unhex(value)`
    /// against the 16-byte blobs sqlx stores.
    fn uuid_list(values: &[Uuid]) -> String {
        json_lists::hex_ids(values)
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    /// `SQLITE_BUSY` (5) and `SQLITE_LOCKED` (6), with their extended
    /// codes (the low byte is the primary code): another connection held
    /// the lock past the busy timeout.
    fn transient(error: &dyn DatabaseError) -> bool {
        error
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 5 | 6))
    }

    /// Opens (creating if missing) the database at `url` (`sqlite://path.db`
    /// or a plain path), in WAL mode with `synchronous = FULL`: a commit
    /// that returned survives a power cut.
    async fn open(url: &str, options: &StoreOptions) -> Result<SqlitePool> {
        let url = if url.starts_with("sqlite:") {
            url.to_owned()
        } else {
            format!("sqlite://{url}")
        };
        let connect = SqliteConnectOptions::from_str(&url)
            .map_err(|e| Error::Config {
                key: "database".into(),
                reason: e.to_string(),
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30));
        SqlitePoolOptions::new()
            .max_connections(options.pool_size().unwrap_or(8))
            .connect_with(connect)
            .await
            .map_err(db_error::<Lite>("opening the SQLite database"))
    }

    fn wakeups(_pool: &SqlitePool, _options: &StoreOptions) -> LocalWakeups {
        LocalWakeups::default()
    }

    async fn claim(store: &SqliteStore, limit: usize, held: &OutboxPartitions) -> Result<SqliteBatch> {
        claim::claim(store, limit, held).await
    }

    async fn append(store: &SqliteStore, batch: &[OutgoingMessage]) -> Result<()> {
        log::append(store, batch).await
    }
}
