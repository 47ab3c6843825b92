//! Tidings' own migrations, tracked in `tidings_migrations`.

use sqlx::SqlitePool;
use tidings_core::{Error, Result};

/// (version, name, SQL), in order. Never edit a shipped entry: add one.
const MIGRATIONS: &[(i64, &str, &str)] = &[(1, "tidings", include_str!("../migrations/0001_tidings.sql"))];

pub(crate) async fn run(pool: &SqlitePool) -> Result<()> {
    let mut tx = pool
        .begin()
        .await
        .map_err(Error::db("running Tidings migrations"))?;
    // The first statement writes, so this transaction holds the write lock:
    // concurrent migrators wait for it and then find the work done.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS tidings_migrations (
            version INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            applied_at INTEGER NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(Error::db("creating tidings_migrations"))?;
    for &(version, name, sql) in MIGRATIONS {
        let done: Option<i64> =
            sqlx::query_scalar("SELECT version FROM tidings_migrations WHERE version = $1")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await
                .map_err(Error::db("reading tidings_migrations"))?;
        if done.is_some() {
            continue;
        }
        sqlx::raw_sql(sql)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("applying a Tidings migration"))?;
        sqlx::query("INSERT INTO tidings_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
            .bind(version)
            .bind(name)
            .bind(crate::now_millis())
            .execute(&mut *tx)
            .await
            .map_err(Error::db("recording a Tidings migration"))?;
        tracing::info!(version, name, "applied Tidings migration");
    }
    tx.commit()
        .await
        .map_err(Error::db("committing Tidings migrations"))
}
