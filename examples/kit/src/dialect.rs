//! The kit's own tables (per-key order, system ids) on each database, and
//! their creation.

use sqlx::Database;
use tidings_sql::db::Stmt;
use tidings_sql::{Dialect, SqlStore};

use crate::dialects::{Lite, My, Pg};

/// The kit's statements on one database.
pub trait KitDialect: Dialect {
    /// Creates the kit's tables if missing.
    const KIT_SCHEMA: &'static [&'static str];
    /// ($1 consumer, $2 subject, $3 step): the last step, never moved backwards.
    const RECORD_STEP: &'static str;
    /// ($1 system, $2 id): records the system's id unless one is recorded.
    const RECORD_SYSTEM: &'static str;
}

const PORTABLE_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS demo_steps (
        consumer TEXT NOT NULL, subject TEXT NOT NULL, step BIGINT NOT NULL, PRIMARY KEY (consumer, subject))",
    "CREATE TABLE IF NOT EXISTS demo_step_violations (
        consumer TEXT NOT NULL, subject TEXT NOT NULL, step BIGINT NOT NULL, last_step BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS demo_systems (system TEXT PRIMARY KEY, id TEXT NOT NULL)",
];
const PORTABLE_RECORD_STEP: &str = "INSERT INTO demo_steps (consumer, subject, step) VALUES ($1, $2, $3)
    ON CONFLICT (consumer, subject) DO UPDATE SET step = excluded.step WHERE demo_steps.step < excluded.step";
const PORTABLE_RECORD_SYSTEM: &str =
    "INSERT INTO demo_systems (system, id) VALUES ($1, $2) ON CONFLICT (system) DO NOTHING";

impl KitDialect for Pg {
    const KIT_SCHEMA: &'static [&'static str] = PORTABLE_SCHEMA;
    const RECORD_STEP: &'static str = PORTABLE_RECORD_STEP;
    const RECORD_SYSTEM: &'static str = PORTABLE_RECORD_SYSTEM;
}

impl KitDialect for Lite {
    const KIT_SCHEMA: &'static [&'static str] = PORTABLE_SCHEMA;
    const RECORD_STEP: &'static str = PORTABLE_RECORD_STEP;
    const RECORD_SYSTEM: &'static str = PORTABLE_RECORD_SYSTEM;
}

impl KitDialect for My {
    const KIT_SCHEMA: &'static [&'static str] = &[
        "CREATE TABLE IF NOT EXISTS demo_steps (
            consumer VARCHAR(255) NOT NULL, subject VARCHAR(255) NOT NULL, step BIGINT NOT NULL,
            PRIMARY KEY (consumer, subject)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "CREATE TABLE IF NOT EXISTS demo_step_violations (
            consumer TEXT NOT NULL, subject TEXT NOT NULL, step BIGINT NOT NULL, last_step BIGINT NOT NULL)
            DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        "CREATE TABLE IF NOT EXISTS demo_systems (system VARCHAR(64) PRIMARY KEY, id VARCHAR(64) NOT NULL)
            DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    ];
    const RECORD_STEP: &'static str = "INSERT INTO demo_steps (consumer, subject, step) VALUES ($1, $2, $3)
        ON DUPLICATE KEY UPDATE step = GREATEST(step, VALUES(step))";
    const RECORD_SYSTEM: &'static str =
        "INSERT INTO demo_systems (system, id) VALUES ($1, $2) ON DUPLICATE KEY UPDATE system = system";
}

/// Sets a reference system up in `store`'s database: Tidings' migrations,
/// the kit's tables, then the system's own (`schema`, statements that
/// create what is missing), `doing` naming the work in errors
/// ("creating the upload tables").
pub async fn setup_system<D: KitDialect>(
    store: &SqlStore<D>,
    schema: &'static [&'static str],
    doing: &'static str,
) -> tidings_core::Result<()> {
    store.migrate().await?;
    let mut conn = store.conn(doing).await?;
    for statement in D::KIT_SCHEMA {
        Stmt::<D>::new(statement, "creating the kit's tables")
            .execute(&mut *conn)
            .await?;
    }
    for statement in schema {
        Stmt::<D>::new(statement, doing).execute(&mut *conn).await?;
    }
    Ok(())
}

/// The id of `system` (`checkout`) in this database, made at its first
/// run: it names the system's resources on a broker, so that a database
/// and its broker topology belong together.
pub async fn system_id<D: KitDialect>(
    conn: &mut <D::Db as Database>::Connection,
    system: &str,
) -> tidings_core::Result<String> {
    let fresh = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    Stmt::<D>::new(D::RECORD_SYSTEM, "naming the system")
        .bind(system)
        .bind(fresh.as_str())
        .execute(&mut *conn)
        .await?;
    Stmt::<D>::new(
        "SELECT id FROM demo_systems WHERE system = $1",
        "reading the system's name",
    )
    .bind(system)
    .fetch_one(conn)
    .await?
    .get(0)
}
