//! Tidings' own migrations, tracked in `tidings_migrations` so that they
//! never collide with the application's migrations in `_sqlx_migrations`.

use sqlx::PgPool;
use tidings_core::{Error, Result};

/// (version, name, SQL), in order. Never edit a shipped entry: add one.
const MIGRATIONS: &[(i64, &str, &str)] = &[(1, "tidings", include_str!("../migrations/0001_tidings.sql"))];

pub(crate) async fn run(pool: &PgPool) -> Result<()> {
    let db = Error::db("running Tidings migrations");
    let mut tx = pool.begin().await.map_err(db)?;
    // Several processes may start at once: one migrates, the others wait and find it done.
    sqlx::query("SELECT pg_advisory_xact_lock(7311652871102644385)")
        .execute(&mut *tx)
        .await
        .map_err(Error::db("locking Tidings migrations"))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS tidings_migrations (
            version BIGINT PRIMARY KEY,
            name TEXT NOT NULL,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
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
        sqlx::query("INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)")
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("recording a Tidings migration"))?;
        tracing::info!(version, name, "applied Tidings migration");
    }
    tx.commit()
        .await
        .map_err(Error::db("committing Tidings migrations"))
}
