//! The checkout system's own tables, the front door that accepts commands,
//! and the figures read back from the database.

use async_trait::async_trait;
use tidings_core::{Outbox, OutgoingMessage};
use tidings_store_postgres::PgStore;
use tidings_store_sqlite::SqliteStore;

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
    "CREATE TABLE IF NOT EXISTS checkout_system (id TEXT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS order_violations (
        consumer TEXT NOT NULL, order_id TEXT NOT NULL, step BIGINT NOT NULL, last_step BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS checkout_processes (
        process TEXT PRIMARY KEY, duplicates BIGINT NOT NULL, retries BIGINT NOT NULL)",
];

const TALLY: &str = "SELECT
    (SELECT CAST(count(*) AS BIGINT) FROM checkout_orders),
    (SELECT CAST(count(*) AS BIGINT) FROM checkout_orders WHERE sku LIKE 'POISON%'),
    (SELECT CAST(count(*) AS BIGINT) FROM checkout_requests),
    (SELECT CAST(COALESCE(sum(events), 0) AS BIGINT) FROM checkout_orders),
    (SELECT CAST(count(*) AS BIGINT) FROM tidings_outbox WHERE published_at IS NULL),
    (SELECT CAST(count(*) AS BIGINT) FROM order_violations),
    (SELECT CAST(COALESCE(sum(total_cents / 100), 0) AS BIGINT) FROM checkout_orders WHERE status = 'shipped'),
    (SELECT CAST(COALESCE(sum(points), 0) AS BIGINT) FROM loyalty_points),
    (SELECT CAST(COALESCE(sum(n), 0) AS BIGINT) FROM analytics_counts),
    (SELECT CAST(COALESCE(sum(duplicates), 0) AS BIGINT) FROM checkout_processes),
    (SELECT CAST(COALESCE(sum(retries), 0) AS BIGINT) FROM checkout_processes)";

const PER_CONSUMER: &str =
    "SELECT consumer, CAST(count(*) AS BIGINT) FROM tidings_processed GROUP BY consumer";
/// Redriven dead letters are not counted: their messages are on their way
/// again, and count once handled (or once dead-lettered anew).
const DEAD_PER_CONSUMER: &str = "SELECT consumer, CAST(count(*) AS BIGINT) FROM tidings_dead_letters
     WHERE redriven_at IS NULL GROUP BY consumer";
/// Only messages still blocked by a live hold count: behind a key whose hold
/// is released, or whose held message was handled, they are on their way
/// (being drained) and count once handled.
const PARKED_PER_CONSUMER: &str = "SELECT p.consumer, CAST(count(*) AS BIGINT) FROM tidings_parked p
     WHERE EXISTS (SELECT 1 FROM tidings_held_keys h
                   WHERE h.consumer = p.consumer AND h.topic = p.topic AND h.aggregate_key = p.aggregate_key
                     AND NOT h.released
                     AND NOT EXISTS (SELECT 1 FROM tidings_processed m
                                     WHERE m.consumer = h.consumer AND m.message_id = h.message_id))
     GROUP BY p.consumer";

/// Figures read from the database: the truth, whatever happened to the processes.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Orders in the checkout table.
    pub orders: i64,
    /// Of which poisoned.
    pub poisoned_orders: i64,
    /// Commands accepted by the front door.
    pub commands: i64,
    /// Events committed by the checkout service.
    pub events: i64,
    /// Outbox records not yet sent.
    pub outbox_pending: i64,
    /// Out-of-order events seen by consumers.
    pub violations: i64,
    /// Loyalty points owed for shipped orders.
    pub points_expected: i64,
    /// Loyalty points credited.
    pub points_credited: i64,
    /// Events counted by analytics.
    pub analytics_counted: i64,
    /// Duplicates suppressed, as consumer processes reported them ([`CheckoutStore::record_process`]).
    pub duplicates_reported: i64,
    /// Retries, as consumer processes reported them.
    pub retries_reported: i64,
    /// Processed markers per consumer.
    pub processed: Vec<(String, i64)>,
    /// Dead letters per consumer (redriven ones not counted until they fail again).
    pub dead_letters: Vec<(String, i64)>,
    /// Messages parked behind a dead letter of their key, per consumer (those
    /// being drained after a skip or a handled redrive not counted).
    pub parked: Vec<(String, i64)>,
}

impl Tally {
    /// Processed markers of `consumer`.
    pub fn processed_by(&self, consumer: &str) -> i64 {
        count_of(&self.processed, consumer)
    }

    /// Dead letters of `consumer`.
    pub fn dead_by(&self, consumer: &str) -> i64 {
        count_of(&self.dead_letters, consumer)
    }

    /// Messages `consumer` parked.
    pub fn parked_by(&self, consumer: &str) -> i64 {
        count_of(&self.parked, consumer)
    }
}

fn count_of(counts: &[(String, i64)], consumer: &str) -> i64 {
    counts.iter().find(|(c, _)| c == consumer).map_or(0, |(_, n)| *n)
}

/// What the demo needs from a database: Tidings' store abilities, the
/// handlers implemented for it, and the checkout system's own SQL.
#[async_trait]
pub trait CheckoutStore: tidings_core::Store {
    /// Runs Tidings' migrations and creates the checkout tables.
    async fn setup(&self) -> anyhow::Result<()>;

    /// The front door: records the request and enqueues the command, in one transaction.
    async fn submit(&self, step: i64, command: &OutgoingMessage) -> anyhow::Result<()>;

    /// Reads the figures.
    async fn tally(&self) -> anyhow::Result<Tally>;

    /// Records the counters of a consumer process (replacing its last report).
    async fn record_process(&self, process: &str, duplicates: i64, retries: i64) -> anyhow::Result<()>;

    /// This database's system id, made once: it names the system's
    /// resources on a broker, so that a database and its broker topology
    /// belong together.
    async fn system_id(&self) -> anyhow::Result<String>;
}

macro_rules! checkout_store {
    ($store:ty, $snapshot:literal) => {
        #[async_trait]
        impl CheckoutStore for $store {
            async fn setup(&self) -> anyhow::Result<()> {
                self.migrate().await?;
                for statement in SCHEMA {
                    sqlx::query(*statement).execute(self.pool()).await?;
                }
                Ok(())
            }

            async fn submit(&self, step: i64, command: &OutgoingMessage) -> anyhow::Result<()> {
                let mut tx = self.pool().begin().await?;
                sqlx::query("INSERT INTO checkout_requests (order_id, step, command) VALUES ($1, $2, $3)")
                    .bind(&command.envelope.aggregate_key)
                    .bind(step)
                    .bind(&command.envelope.message_type)
                    .execute(&mut *tx)
                    .await?;
                self.enqueue_outgoing(&mut tx, command).await?;
                tx.commit().await?;
                self.wake();
                Ok(())
            }

            async fn system_id(&self) -> anyhow::Result<String> {
                let fresh = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
                sqlx::query("INSERT INTO checkout_system (id) SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM checkout_system)")
                    .bind(fresh)
                    .execute(self.pool())
                    .await?;
                Ok(sqlx::query_scalar("SELECT min(id) FROM checkout_system").fetch_one(self.pool()).await?)
            }

            async fn record_process(&self, process: &str, duplicates: i64, retries: i64) -> anyhow::Result<()> {
                sqlx::query(
                    "INSERT INTO checkout_processes (process, duplicates, retries) VALUES ($1, $2, $3)
                     ON CONFLICT (process) DO UPDATE SET duplicates = excluded.duplicates, retries = excluded.retries",
                )
                .bind(process)
                .bind(duplicates)
                .bind(retries)
                .execute(self.pool())
                .await?;
                Ok(())
            }

            async fn tally(&self) -> anyhow::Result<Tally> {
                // One snapshot for every figure: a handler committing between
                // two reads would make them disagree.
                let mut tx = self.pool().begin().await?;
                sqlx::query($snapshot).execute(&mut *tx).await?;
                let row: (i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64) =
                    sqlx::query_as(TALLY).fetch_one(&mut *tx).await?;
                Ok(Tally {
                    orders: row.0,
                    poisoned_orders: row.1,
                    commands: row.2,
                    events: row.3,
                    outbox_pending: row.4,
                    violations: row.5,
                    points_expected: row.6,
                    points_credited: row.7,
                    analytics_counted: row.8,
                    duplicates_reported: row.9,
                    retries_reported: row.10,
                    processed: sqlx::query_as(PER_CONSUMER).fetch_all(&mut *tx).await?,
                    dead_letters: sqlx::query_as(DEAD_PER_CONSUMER).fetch_all(&mut *tx).await?,
                    parked: sqlx::query_as(PARKED_PER_CONSUMER).fetch_all(&mut *tx).await?,
                })
            }
        }
    };
}

checkout_store!(PgStore, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
// A SQLite read transaction sees one snapshot from its first read.
checkout_store!(SqliteStore, "SELECT 1");
