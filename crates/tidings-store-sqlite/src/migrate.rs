//! SQLite's migration plan for the shared runner.

use tidings_sql::migrate::{Migration, MigrationPlan};

pub(crate) const PLAN: MigrationPlan = MigrationPlan {
    // The first statement writes, so the transaction holds SQLite's write
    // lock from there: concurrent migrators wait, then find the work done.
    lock: None,
    create_table: "CREATE TABLE IF NOT EXISTS tidings_migrations (
        version INTEGER PRIMARY KEY, name TEXT NOT NULL,
        applied_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)))",
    applied: "SELECT version FROM tidings_migrations WHERE version = $1",
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
