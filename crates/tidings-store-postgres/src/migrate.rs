//! PostgreSQL's migration plan for the shared runner.

use tidings_sql::migrate::MigrationPlan;

pub(crate) const PLAN: MigrationPlan = MigrationPlan {
    // Several processes may start at once: one migrates, the others wait and find it done.
    lock: Some("SELECT pg_advisory_xact_lock(7311652871102644385)"),
    session_lock: false,
    create_table: "CREATE TABLE IF NOT EXISTS tidings_migrations (
        version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    applied: "SELECT version FROM tidings_migrations WHERE version = $1",
    record: "INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)",
    migrations: tidings_sql::migrations!(),
};
