//! MySQL's migration plan for the shared runner.

use tidings_sql::migrate::MigrationPlan;

pub(crate) const PLAN: MigrationPlan = MigrationPlan {
    // A named lock, the session's: MySQL commits at every DDL statement, so
    // a lock the transaction held would be gone after the first one. The
    // runner closes the connection afterwards, which releases it whatever
    // happened. Several processes may start at once: one migrates, the
    // others wait (up to an hour) and find it done.
    lock: Some("SELECT GET_LOCK('tidings_migrations', 3600)"),
    session_lock: true,
    create_table: "CREATE TABLE IF NOT EXISTS tidings_migrations (
        version BIGINT PRIMARY KEY, name VARCHAR(255) NOT NULL,
        applied_at BIGINT NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))))
        ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    applied: "SELECT version FROM tidings_migrations WHERE version = $1",
    record: "INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)",
    migrations: tidings_sql::migrations!(),
};
