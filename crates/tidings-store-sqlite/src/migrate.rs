//! SQLite's migration plan for the shared runner.

use tidings_sql::migrate::MigrationPlan;

pub(crate) const PLAN: MigrationPlan = MigrationPlan {
    // The first statement writes, so the transaction holds SQLite's write
    // lock from there: concurrent migrators wait, then find the work done.
    lock: None,
    session_lock: false,
    create_table: "CREATE TABLE IF NOT EXISTS tidings_migrations (
        version INTEGER PRIMARY KEY, name TEXT NOT NULL,
        applied_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)))",
    applied: "SELECT version FROM tidings_migrations WHERE version = $1",
    record: "INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)",
    migrations: tidings_sql::migrations!(),
};
