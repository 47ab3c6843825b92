//! The checkout system's own SQL, a table per database, as Tidings' store
//! keeps its own: the front door, the figures and the five services are
//! written once over [`CheckoutSql`], and each database supplies only the
//! statements that read differently there (its tables' types, its upserts,
//! its casts). Parameters are numbered (`$1`...) everywhere; on MySQL the
//! store's [`Stmt`](tidings_sql::db::Stmt) binds them by position.

use tidings_demo_kit::{KitDialect, SidePool, ThirdParty};
use tidings_store_mysql::My;
use tidings_store_postgres::Pg;
use tidings_store_sqlite::Lite;

/// The checkout system's statements on one database.
#[derive(Debug, Clone, Copy)]
pub struct CheckoutSql {
    /// Creates the checkout tables if missing.
    pub schema: &'static [&'static str],
    /// ($1 order, $2 step, $3 command): the front door's record.
    pub request: &'static str,
    /// ($1 process, $2 duplicates, $3 retries): replaces a process's counters.
    pub record_process: &'static str,
    /// Starts one snapshot for every figure of the tally.
    pub snapshot: &'static str,
    /// () -> the eleven figures of [`Tally`](crate::system::Tally), in its order.
    pub tally: &'static str,
    /// ($1 consumer, $2 order, $3 step): the last step, never moved backwards.
    pub progress: &'static str,
    /// ($1 message type): counts one more event.
    pub count_event: &'static str,
    /// ($1 customer, $2 points): credits points.
    pub credit: &'static str,
}

/// A database the checkout system runs on.
pub trait CheckoutDialect: KitDialect {
    /// Its statements.
    const CHECKOUT: CheckoutSql;

    /// The email provider kept in this database, on `pool`.
    fn email_provider(pool: sqlx::Pool<Self::Db>) -> ThirdParty;
}

/// The statements that read the same on every database.
pub mod shared {
    /// ($1 consumer, $2 order) -> the last step this consumer saw.
    pub const LAST_STEP: &str = "SELECT last_step FROM order_progress WHERE consumer = $1 AND order_id = $2";
    /// ($1 consumer, $2 order, $3 step, $4 last step).
    pub const VIOLATION: &str =
        "INSERT INTO order_violations (consumer, order_id, step, last_step) VALUES ($1, $2, $3, $4)";
    /// ($1 order, $2 customer, $3 sku, $4 quantity, $5 total).
    pub const PLACE: &str =
        "INSERT INTO checkout_orders (order_id, customer_id, sku, quantity, total_cents, status, events)
         VALUES ($1, $2, $3, $4, $5, 'placed', 1)";
    /// ($1 order, $2 status): moves the order on, one event more.
    pub const ADVANCE: &str =
        "UPDATE checkout_orders SET status = $2, events = events + 1 WHERE order_id = $1";
    /// ($1 order) -> (events, total): read after [`ADVANCE`], in its transaction.
    pub const ORDER_FIGURES: &str = "SELECT events, total_cents FROM checkout_orders WHERE order_id = $1";
    /// ($1 order, $2 sku, $3 quantity).
    pub const RESERVE: &str = "INSERT INTO inventory_reservations (order_id, sku, quantity, status) VALUES ($1, $2, $3, 'reserved')";
    /// ($1 order, $2 status).
    pub const RESERVATION_STATUS: &str = "UPDATE inventory_reservations SET status = $2 WHERE order_id = $1";
    /// ($1 order, $2 customer, $3 points).
    pub const PEND_POINTS: &str =
        "INSERT INTO loyalty_pending (order_id, customer_id, points) VALUES ($1, $2, $3)";
    /// ($1 order) -> (customer, points) pending.
    pub const PENDING_POINTS: &str = "SELECT customer_id, points FROM loyalty_pending WHERE order_id = $1";
    /// ($1 order).
    pub const DROP_PENDING: &str = "DELETE FROM loyalty_pending WHERE order_id = $1";
}

/// The tables, in the types PostgreSQL and SQLite share.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS checkout_requests (
        order_id TEXT NOT NULL, step BIGINT NOT NULL, command TEXT NOT NULL, PRIMARY KEY (order_id, step))",
    "CREATE TABLE IF NOT EXISTS checkout_orders (
        order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, sku TEXT NOT NULL, quantity BIGINT NOT NULL,
        total_cents BIGINT NOT NULL, status TEXT NOT NULL, events BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS inventory_reservations (
        order_id TEXT PRIMARY KEY, sku TEXT NOT NULL, quantity BIGINT NOT NULL, status TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS analytics_counts (message_type TEXT PRIMARY KEY, n BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS loyalty_pending (
        order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, points BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS loyalty_points (customer_id TEXT PRIMARY KEY, points BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS order_progress (
        consumer TEXT NOT NULL, order_id TEXT NOT NULL, last_step BIGINT NOT NULL, PRIMARY KEY (consumer, order_id))",
    "CREATE TABLE IF NOT EXISTS order_violations (
        consumer TEXT NOT NULL, order_id TEXT NOT NULL, step BIGINT NOT NULL, last_step BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS checkout_processes (
        process TEXT PRIMARY KEY, duplicates BIGINT NOT NULL, retries BIGINT NOT NULL)",
];

/// The figures, where a sum is cast to `$int` (the database's name of a
/// 64-bit integer in `CAST`) and whole currency units are `$units`.
macro_rules! tally {
    ($int:literal, $units:literal) => {
        concat!(
            "SELECT
            (SELECT count(*) FROM checkout_orders),
            (SELECT count(*) FROM checkout_orders WHERE sku LIKE 'POISON%'),
            (SELECT count(*) FROM checkout_requests),
            (SELECT CAST(COALESCE(sum(events), 0) AS ",
            $int,
            ") FROM checkout_orders),
            (SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL),
            (SELECT count(*) FROM order_violations),
            (SELECT CAST(COALESCE(sum(",
            $units,
            "), 0) AS ",
            $int,
            ") FROM checkout_orders WHERE status = 'shipped'),
            (SELECT CAST(COALESCE(sum(points), 0) AS ",
            $int,
            ") FROM loyalty_points),
            (SELECT CAST(COALESCE(sum(n), 0) AS ",
            $int,
            ") FROM analytics_counts),
            (SELECT CAST(COALESCE(sum(duplicates), 0) AS ",
            $int,
            ") FROM checkout_processes),
            (SELECT CAST(COALESCE(sum(retries), 0) AS ",
            $int,
            ") FROM checkout_processes)"
        )
    };
}

/// PostgreSQL and SQLite read the checkout's SQL alike, but for the snapshot.
const PORTABLE: CheckoutSql = CheckoutSql {
    schema: SCHEMA,
    request: "INSERT INTO checkout_requests (order_id, step, command) VALUES ($1, $2, $3)",
    record_process: "INSERT INTO checkout_processes (process, duplicates, retries) VALUES ($1, $2, $3)
         ON CONFLICT (process) DO UPDATE SET duplicates = excluded.duplicates, retries = excluded.retries",
    snapshot: "SELECT 1",
    tally: tally!("BIGINT", "total_cents / 100"),
    progress: "INSERT INTO order_progress (consumer, order_id, last_step) VALUES ($1, $2, $3)
         ON CONFLICT (consumer, order_id) DO UPDATE SET last_step = excluded.last_step
         WHERE order_progress.last_step < excluded.last_step",
    count_event: "INSERT INTO analytics_counts (message_type, n) VALUES ($1, 1)
         ON CONFLICT (message_type) DO UPDATE SET n = analytics_counts.n + 1",
    credit: "INSERT INTO loyalty_points (customer_id, points) VALUES ($1, $2)
         ON CONFLICT (customer_id) DO UPDATE SET points = loyalty_points.points + excluded.points",
};

impl CheckoutDialect for Pg {
    const CHECKOUT: CheckoutSql = CheckoutSql {
        // One snapshot for the whole transaction, not one per statement.
        snapshot: "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        ..PORTABLE
    };

    fn email_provider(pool: sqlx::PgPool) -> ThirdParty {
        ThirdParty::new(SidePool::Postgres(pool), "email")
    }
}

impl CheckoutDialect for Lite {
    // A SQLite read transaction sees one snapshot from its first read.
    const CHECKOUT: CheckoutSql = PORTABLE;

    fn email_provider(pool: sqlx::SqlitePool) -> ThirdParty {
        ThirdParty::new(SidePool::Sqlite(pool), "email")
    }
}

/// The tables on MySQL: keys are `VARCHAR` (a `TEXT` column cannot be one),
/// compared byte for byte as on the others.
const MYSQL_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS checkout_requests (
        order_id VARCHAR(255) NOT NULL, step BIGINT NOT NULL, command TEXT NOT NULL, PRIMARY KEY (order_id, step))
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS checkout_orders (
        order_id VARCHAR(255) PRIMARY KEY, customer_id TEXT NOT NULL, sku TEXT NOT NULL, quantity BIGINT NOT NULL,
        total_cents BIGINT NOT NULL, status TEXT NOT NULL, events BIGINT NOT NULL)
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS inventory_reservations (
        order_id VARCHAR(255) PRIMARY KEY, sku TEXT NOT NULL, quantity BIGINT NOT NULL, status TEXT NOT NULL)
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS analytics_counts (message_type VARCHAR(255) PRIMARY KEY, n BIGINT NOT NULL)
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS loyalty_pending (
        order_id VARCHAR(255) PRIMARY KEY, customer_id TEXT NOT NULL, points BIGINT NOT NULL)
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS loyalty_points (customer_id VARCHAR(255) PRIMARY KEY, points BIGINT NOT NULL)
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS order_progress (
        consumer VARCHAR(255) NOT NULL, order_id VARCHAR(255) NOT NULL, last_step BIGINT NOT NULL,
        PRIMARY KEY (consumer, order_id)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS order_violations (
        consumer TEXT NOT NULL, order_id TEXT NOT NULL, step BIGINT NOT NULL, last_step BIGINT NOT NULL)
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS checkout_processes (
        process VARCHAR(255) PRIMARY KEY, duplicates BIGINT NOT NULL, retries BIGINT NOT NULL)
        DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
];

impl CheckoutDialect for My {
    // Upserts are ON DUPLICATE KEY UPDATE; sums are DECIMAL until cast;
    // `/` divides exactly, `DIV` as the others do.
    const CHECKOUT: CheckoutSql = CheckoutSql {
        schema: MYSQL_SCHEMA,
        request: PORTABLE.request,
        record_process: "INSERT INTO checkout_processes (process, duplicates, retries) VALUES ($1, $2, $3)
             ON DUPLICATE KEY UPDATE duplicates = VALUES(duplicates), retries = VALUES(retries)",
        // Repeatable read, the server's default: the snapshot is taken at
        // the first read of a table.
        snapshot: "SELECT count(*) FROM demo_systems",
        tally: tally!("SIGNED", "total_cents DIV 100"),
        progress: "INSERT INTO order_progress (consumer, order_id, last_step) VALUES ($1, $2, $3)
             ON DUPLICATE KEY UPDATE last_step = GREATEST(last_step, VALUES(last_step))",
        count_event: "INSERT INTO analytics_counts (message_type, n) VALUES ($1, 1)
             ON DUPLICATE KEY UPDATE n = n + 1",
        credit: "INSERT INTO loyalty_points (customer_id, points) VALUES ($1, $2)
             ON DUPLICATE KEY UPDATE points = points + VALUES(points)",
    };

    fn email_provider(pool: sqlx::MySqlPool) -> ThirdParty {
        ThirdParty::new(SidePool::MySql(pool), "email")
    }
}
