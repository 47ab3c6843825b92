//! PostgreSQL's migration plan for the shared runner.

use sqlx::PgPool;
use tidings_core::Result;
use tidings_core::migrate::{Migration, MigrationPlan};

const PLAN: MigrationPlan = MigrationPlan {
    // Several processes may start at once: one migrates, the others wait and find it done.
    lock: Some("SELECT pg_advisory_xact_lock(7311652871102644385)"),
    create_table: "CREATE TABLE IF NOT EXISTS tidings_migrations (
        version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    record: "INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)",
    migrations: &[
        Migration {
            version: 1,
            name: "tidings",
            sql: include_str!("../migrations/0001_tidings.sql"),
        },
        Migration {
            version: 2,
            name: "redrive",
            sql: include_str!("../migrations/0002_redrive.sql"),
        },
        Migration {
            version: 3,
            name: "partitions",
            sql: include_str!("../migrations/0003_partitions.sql"),
        },
        Migration {
            version: 4,
            name: "relay partitions",
            sql: include_str!("../migrations/0004_relay_partitions.sql"),
        },
        Migration {
            version: 5,
            name: "parking",
            sql: include_str!("../migrations/0005_parking.sql"),
        },
        Migration {
            version: 6,
            name: "replays",
            sql: include_str!("../migrations/0006_replays.sql"),
        },
    ],
};

pub(crate) async fn run(pool: &PgPool) -> Result<()> {
    tidings_core::migrate::run(pool, &PLAN).await
}

/// The latest migration this build ships.
pub(crate) fn latest() -> i64 {
    PLAN.migrations.last().map_or(0, |m| m.version)
}
