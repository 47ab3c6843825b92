//! PostgreSQL for Tidings: the dialect of [`tidings_sql`]'s store, so that
//! [`PgStore`] holds the transactional outbox, the relay's claims, the
//! database-log transport, the consumers' idempotency records, the effects
//! ledger and the failure store.
//!
//! ```no_run
//! use tidings_core::Outbox;
//! use tidings_store_postgres::PgStore;
//! # async fn run(order: impl tidings_core::Message) -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://root@127.0.0.1/test").await?;
//! store.migrate().await?;
//!
//! let mut tx = store.pool().begin().await?;
//! // ... the business write, on the same transaction ...
//! let id = store.enqueue(&mut tx, &order).await?; // the envelope's id
//! tx.commit().await?;
//! store.wake(); // after commit: relays pick it up now rather than at their next poll
//! # Ok(()) }
//! ```
//!
//! What is PostgreSQL's own: its statements (`sql`), the relay's claim
//! under `FOR UPDATE SKIP LOCKED` and the lease locks ([`PgBatch`]), the
//! log's transaction-id positions, `LISTEN`/`NOTIFY` wake-ups (`wake`), and
//! its migrations.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod claim;
mod log;
mod migrate;
mod sql;
mod wake;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgQueryResult};
use sqlx::{PgPool, Postgres};
use tidings_core::{Error, OutboxPartitions, OutgoingMessage, Result};
use tidings_sql::connect::probe;
use tidings_sql::{Dialect, SqlStore, Statements, StoreOptions, db_error};
use uuid::Uuid;

pub use claim::{Listed, PgBatch, claim_listed, claim_oldest};

/// A server not up yet: refused or reset, or `57P03` ("the database
/// system is starting up").
fn starting(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db.code().as_deref() == Some("57P03"),
        _ => false,
    }
}
pub use wake::PgWakeups;

/// The PostgreSQL dialect.
#[derive(Debug, Clone, Copy)]
pub struct Pg;

/// Tidings' PostgreSQL store. Cheap to clone.
pub type PgStore = SqlStore<Pg>;

/// Options of a [`PgStore`].
pub type PgStoreOptions = StoreOptions;

#[async_trait]
impl Dialect for Pg {
    type Db = Postgres;
    type IntList = Vec<i64>;
    type TextList = Vec<String>;
    type UuidList = Vec<Uuid>;
    type Batch = PgBatch;
    type Wakeups = wake::PgWakeups;

    const NAME: &'static str = "PostgreSQL";
    const SCHEMES: &'static [&'static str] = &["postgres://", "postgresql://"];
    const LOG_TRANSPORT: &'static str = "pg-log";
    const SQL: Statements = sql::SQL;
    const MIGRATIONS: tidings_sql::migrate::MigrationPlan = migrate::PLAN;

    fn int_list(values: &[i64]) -> Vec<i64> {
        values.to_vec()
    }

    fn text_list(values: &[String]) -> Vec<String> {
        values.to_vec()
    }

    fn uuid_list(values: &[Uuid]) -> Vec<Uuid> {
        values.to_vec()
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    /// Serialization failures and deadlocks (`40001`, `40P01`), a lock
    /// not available (`55P03`), too many connections (`53300`), the server
    /// shutting down or starting up (`57P01`..`57P03`) and lost connections
    /// (`08000`, `08003`, `08006`).
    fn transient(error: &dyn DatabaseError) -> bool {
        matches!(
            error.code().as_deref(),
            Some(
                "40001"
                    | "40P01"
                    | "55P03"
                    | "53300"
                    | "57P01"
                    | "57P02"
                    | "57P03"
                    | "08000"
                    | "08003"
                    | "08006"
            )
        )
    }

    /// A pool on `url` (`postgres://user@host/db`), of 32 connections
    /// unless the options say otherwise.
    ///
    /// One connection is made first: a server still starting, or not yet
    /// listening, is tried again for up to the options' connect timeout
    /// (10 s: a service and its database often start together); then its
    /// last error is reported as what it is (refused, the login refused, no
    /// answer), rather than as a pool timing out. A refused login or a
    /// missing database is reported at once.
    async fn open(url: &str, options: &StoreOptions) -> Result<PgPool> {
        let connect: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| Error::Config {
            key: "database".into(),
            reason: format!("not a PostgreSQL URL ({e})"),
        })?;
        probe::<Pg, _>(
            &connect,
            options.connect_window(),
            starting,
            "connecting to PostgreSQL",
        )
        .await?;
        PgPoolOptions::new()
            .max_connections(options.pool_size().unwrap_or(32))
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(connect)
            .await
            .map_err(db_error::<Pg>("connecting to PostgreSQL"))
    }

    fn wakeups(pool: &PgPool, options: &StoreOptions) -> wake::PgWakeups {
        wake::PgWakeups::new(pool.clone(), options.cross_process_wakeups_enabled())
    }

    async fn claim(store: &PgStore, limit: usize, held: &OutboxPartitions) -> Result<PgBatch> {
        claim::claim(store, limit, held).await
    }

    async fn append(store: &PgStore, batch: &[OutgoingMessage]) -> Result<()> {
        log::append(store, batch).await
    }
}
