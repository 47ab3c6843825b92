//! MySQL and MariaDB for Tidings: the dialect of [`tidings_sql`]'s store, so
//! that [`MySqlStore`] holds the transactional outbox, the relay's claims,
//! the database-log transport, the consumers' idempotency records, the
//! effects ledger and the failure store.
//!
//! ```no_run
//! use tidings_core::Outbox;
//! use tidings_store_mysql::MySqlStore;
//! # async fn run(order: impl tidings_core::Message) -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://root@127.0.0.1/test").await?;
//! store.migrate().await?;
//!
//! let mut tx = store.pool().begin().await?;
//! // ... the business write, on the same transaction ...
//! let id = store.enqueue(&mut tx, &order).await?; // the envelope's id
//! store.commit(tx).await?; // commits, then wakes the relays of this process
//! # Ok(()) }
//! ```
//!
//! MySQL 8.0.13 and later and MariaDB 10.6 and later (`JSON_TABLE`,
//! expression defaults). What is MySQL's own: its statements (`sql`: `?`
//! parameters, which the store binds from the numbered ones, times as
//! microseconds), the relay's claim, which reads its partitions' rows and
//! then locks exactly those, under the lease locks ([`MySqlBatch`]), the
//! log's append, serialized by a trigger so that positions follow commit
//! order (`log`), its error numbers, and its migrations. There is no
//! `LISTEN`: relays in the producer's process are woken at once, others
//! poll.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

/// The database's clock, in microseconds: the statement's start time,
/// whatever the session's time zone.
macro_rules! now {
    () => {
        "(UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))"
    };
}

/// The database's clock, in microseconds, read when evaluated rather than
/// at the statement's start: an expiry written after waiting for a row
/// lock must not lose the wait. It reads the session's time zone, UTC on
/// the store's connections (sqlx's default).
macro_rules! clock {
    () => {
        "CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)"
    };
}

mod claim;
mod log;
mod migrate;
mod sql;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError, MySqlPoolOptions, MySqlQueryResult};
use sqlx::{MySql, MySqlPool};
use tidings_core::{Error, OutboxPartitions, OutgoingMessage, Result};
use tidings_sql::connect::probe;
use tidings_sql::placeholders::Placeholders;
use tidings_sql::{Dialect, LocalWakeups, SqlStore, Statements, StoreOptions, db_error, json_lists};
use uuid::Uuid;

pub use claim::MySqlBatch;

/// The MySQL and MariaDB dialect.
#[derive(Debug, Clone, Copy)]
pub struct My;

/// Tidings' MySQL and MariaDB store. Cheap to clone.
pub type MySqlStore = SqlStore<My>;

/// Options of a [`MySqlStore`].
pub type MySqlStoreOptions = StoreOptions;

/// The server's error numbers that mean trying again may help.
const TRANSIENT: &[u16] = &[
    1020, // the record changed since it was read (a serialization failure)
    1040, // too many connections
    1053, // the server is shutting down
    1203, // the user has too many connections
    1205, // lock wait timeout exceeded
    1213, // deadlock found when trying to get lock
    1290, // the server runs with --read-only (a fail-over in progress)
    1317, // the query was interrupted
    1836, // the server is in read-only mode
    1927, // the connection was killed (MariaDB)
    1969, // the statement ran past max_statement_time (MariaDB)
    3024, // the statement ran past max_execution_time (MySQL)
    3572, // a NOWAIT lock could not be taken at once (MySQL 8)
];

/// Prepared statements each connection of a pool the store opens keeps.
const STATEMENT_CACHE: usize = 512;

/// A server not up yet: the connection refused or reset.
fn starting(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Io(_))
}

#[async_trait]
impl Dialect for My {
    type Db = MySql;
    type IntList = String;
    type TextList = String;
    type UuidList = String;
    type Batch = MySqlBatch;
    type Wakeups = LocalWakeups;

    const NAME: &'static str = "MySQL";
    const SCHEMES: &'static [&'static str] = &["mysql://", "mariadb://"];
    const LOG_TRANSPORT: &'static str = "mysql-log";
    const PLACEHOLDERS: Placeholders = Placeholders::Positional;
    const SQL: Statements = sql::SQL;
    const MIGRATIONS: tidings_sql::migrate::MigrationPlan = migrate::PLAN;

    fn int_list(values: &[i64]) -> String {
        json_lists::ints(values)
    }

    fn text_list(values: &[String]) -> String {
        json_lists::texts(values)
    }

    /// Ids as hex strings: the statements match them with `UNHEX` against
    /// the `BINARY(16)` columns sqlx writes.
    fn uuid_list(values: &[Uuid]) -> String {
        json_lists::hex_ids(values)
    }

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    /// A lost race (a deadlock, a lock wait that timed out), a server that
    /// is busy, shutting down, read-only during a fail-over, or that cut
    /// the connection ([`TRANSIENT`]), and SQLSTATE `40001`.
    fn transient(error: &dyn DatabaseError) -> bool {
        if error.code().as_deref() == Some("40001") {
            return true;
        }
        error
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| TRANSIENT.contains(&e.number()))
    }

    /// A pool on `url` (`mysql://user@host/db`, or `mariadb://`), of 32
    /// connections unless the options say otherwise, each caching up to
    /// 512 prepared statements. Each connection's session time zone is UTC
    /// (sqlx's default).
    ///
    /// One connection is made first, as on PostgreSQL: a server not
    /// listening yet is tried again for up to the options' connect timeout
    /// (10 s), then reported as what it is rather than as a pool timing out.
    async fn open(url: &str, options: &StoreOptions) -> Result<MySqlPool> {
        let connect = MySqlConnectOptions::from_str(url)
            .map_err(|e| Error::Config {
                key: "database".into(),
                reason: format!("not a MySQL URL ({e})"),
            })?
            // Room for the store's statements and a service's own: a full
            // cache evicts one statement per new one, and the message that
            // closes it leaves the next request waiting out a delayed
            // acknowledgement (about 40 ms).
            .statement_cache_capacity(STATEMENT_CACHE);
        probe::<My, _>(
            &connect,
            options.connect_window(),
            starting,
            "connecting to MySQL",
        )
        .await?;
        MySqlPoolOptions::new()
            .max_connections(options.pool_size().unwrap_or(32))
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(connect)
            .await
            .map_err(db_error::<My>("connecting to MySQL"))
    }

    fn wakeups(_pool: &MySqlPool, _options: &StoreOptions) -> LocalWakeups {
        LocalWakeups::default()
    }

    async fn claim(store: &MySqlStore, limit: usize, held: &OutboxPartitions) -> Result<MySqlBatch> {
        claim::claim(store, limit, held).await
    }

    async fn append(store: &MySqlStore, batch: &[OutgoingMessage]) -> Result<()> {
        log::append(store, batch).await
    }
}
