//! Tidings' own migration runner, shared by the store crates.
//!
//! Migrations are tracked in `tidings_migrations`, apart from the
//! application's own (`_sqlx_migrations`), so the two never collide. Each
//! store crate lists its SQL files; this module applies the missing ones in
//! one transaction.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

use crate::error::{Error, Result};

/// One migration: never edit a shipped one, add another.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Increasing from 1.
    pub version: i64,
    /// A short name.
    pub name: &'static str,
    /// The SQL, possibly several statements.
    pub sql: &'static str,
}

/// How one database runs migrations.
#[derive(Debug, Clone, Copy)]
pub struct MigrationPlan {
    /// A statement that serializes concurrent migrators, run first in the
    /// transaction (PostgreSQL: an advisory lock; SQLite: none needed, its
    /// first write takes the database lock).
    pub lock: Option<&'static str>,
    /// Creates `tidings_migrations (version, name, applied_at)` if missing.
    pub create_table: &'static str,
    /// Records a version: binds `version` and `name`.
    pub record: &'static str,
    /// The migrations, in order.
    pub migrations: &'static [Migration],
}

/// Applies the migrations of `plan` that `pool`'s database lacks, in one transaction.
pub async fn run<DB>(pool: &Pool<DB>, plan: &MigrationPlan) -> Result<()>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let mut tx = pool
        .begin()
        .await
        .map_err(Error::db("starting Tidings migrations"))?;
    if let Some(lock) = plan.lock {
        sqlx::query(lock)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("locking Tidings migrations"))?;
    }
    sqlx::query(plan.create_table)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("creating tidings_migrations"))?;
    for m in plan.migrations {
        let done: Option<i64> =
            sqlx::query_scalar("SELECT version FROM tidings_migrations WHERE version = $1")
                .bind(m.version)
                .fetch_optional(&mut *tx)
                .await
                .map_err(Error::db("reading tidings_migrations"))?;
        if done.is_some() {
            continue;
        }
        sqlx::raw_sql(m.sql)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("applying a Tidings migration"))?;
        sqlx::query(plan.record)
            .bind(m.version)
            .bind(m.name)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("recording a Tidings migration"))?;
        tracing::info!(version = m.version, name = m.name, "applied Tidings migration");
    }
    tx.commit()
        .await
        .map_err(Error::db("committing Tidings migrations"))
}
