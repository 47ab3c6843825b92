//! The databases the benches measure: a scratch schema or database of the
//! bench's own, and what the scenarios write there by hand, each in the
//! database's own SQL (its own parameter marks, no rewriting), so that the
//! raw limits are what a service would write by hand.

use std::future::Future;

use anyhow::Context as _;
use futures::future::BoxFuture;
use sqlx::pool::PoolOptions;
use sqlx::{Executor, Pool};
use tidings_sql::db::{Bind, SqlDb, Stmt};
use tidings_sql::{Dialect, SqlStore};
use tidings_store_mysql::My;
use tidings_store_postgres::Pg;

/// A database the benches measure.
pub(crate) trait BenchDialect: Dialect {
    /// How producers wake relays on this database, for the latency figures.
    const WAKEUPS: &'static str;
    /// Creates `bench_orders (id, customer, total_cents, created_at)`.
    const ORDERS_TABLE: &'static str;
    /// (id, customer, total cents): one business row.
    const BUSINESS: &'static str;
    /// (id, topic, key, type, body): an outbox row as a hand-rolled outbox writes it.
    const RAW_OUTBOX: &'static str;
    /// Creates `bench_applied (key, seq)`, what the consumer bench's handler writes.
    const APPLIED_TABLE: &'static str;
    /// (key, seq): one applied event.
    const APPLY: &'static str;
    /// The statement creating the scratch namespace `name`.
    fn create_scratch(name: &str) -> String;
    /// The statement dropping it, with everything in it.
    fn drop_scratch(name: &str) -> String;
    /// Connections to the scratch namespace `name` on the server at `url`.
    fn scratch_options(
        url: &str,
        name: &str,
    ) -> anyhow::Result<<<Self::Db as sqlx::Database>::Connection as sqlx::Connection>::Options>;
    /// One transaction of a hand-written relay that publishes nothing: the
    /// oldest `batch` unsent rows claimed (skipping locked ones), read and
    /// deleted. How many rows it took.
    fn drain_batch(pool: &Pool<Self::Db>, batch: usize) -> BoxFuture<'_, anyhow::Result<usize>>;
}

impl BenchDialect for Pg {
    const WAKEUPS: &'static str = "LISTEN/NOTIFY and in-process";
    const ORDERS_TABLE: &'static str =
        "CREATE TABLE bench_orders (id UUID PRIMARY KEY, customer TEXT NOT NULL,
        total_cents BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
    const BUSINESS: &'static str = "INSERT INTO bench_orders (id, customer, total_cents) VALUES ($1, $2, $3)";
    const RAW_OUTBOX: &'static str = "INSERT INTO tidings_outbox (id, topic, aggregate_key, message_type, body) VALUES ($1, $2, $3, $4, $5)";
    const APPLIED_TABLE: &'static str = "CREATE TABLE bench_applied (key TEXT NOT NULL, seq BIGINT NOT NULL)";
    const APPLY: &'static str = "INSERT INTO bench_applied (key, seq) VALUES ($1, $2)";

    fn create_scratch(name: &str) -> String {
        format!("CREATE SCHEMA {name}")
    }

    fn drop_scratch(name: &str) -> String {
        format!("DROP SCHEMA {name} CASCADE")
    }

    fn scratch_options(url: &str, name: &str) -> anyhow::Result<sqlx::postgres::PgConnectOptions> {
        let options: sqlx::postgres::PgConnectOptions = url.parse()?;
        Ok(options.options([("search_path", name)]))
    }

    fn drain_batch(pool: &sqlx::PgPool, batch: usize) -> BoxFuture<'_, anyhow::Result<usize>> {
        Box::pin(async move {
            // The relay's planner settings (see the PostgreSQL store's claim), so
            // that this limit is not measured on a worse plan than the relay gets.
            let mut tx = pool
                .begin_with("BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off")
                .await?;
            let rows: Vec<(Vec<u8>,)> = sqlx::query_as(
                "DELETE FROM tidings_outbox WHERE seq IN (
                     SELECT seq FROM tidings_outbox WHERE published_at IS NULL
                     ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING body",
            )
            .bind(batch as i64)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(rows.len())
        })
    }
}

impl BenchDialect for My {
    const WAKEUPS: &'static str = "in-process only";
    const ORDERS_TABLE: &'static str = "CREATE TABLE bench_orders (id BINARY(16) PRIMARY KEY,
        customer VARCHAR(255) NOT NULL, total_cents BIGINT NOT NULL,
        created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))";
    const BUSINESS: &'static str = "INSERT INTO bench_orders (id, customer, total_cents) VALUES (?, ?, ?)";
    const RAW_OUTBOX: &'static str =
        "INSERT INTO tidings_outbox (id, topic, aggregate_key, message_type, body) VALUES (?, ?, ?, ?, ?)";
    const APPLIED_TABLE: &'static str =
        "CREATE TABLE bench_applied (`key` VARCHAR(255) NOT NULL, seq BIGINT NOT NULL)";
    const APPLY: &'static str = "INSERT INTO bench_applied (`key`, seq) VALUES (?, ?)";

    fn create_scratch(name: &str) -> String {
        format!("CREATE DATABASE {name}")
    }

    fn drop_scratch(name: &str) -> String {
        format!("DROP DATABASE {name}")
    }

    fn scratch_options(url: &str, name: &str) -> anyhow::Result<sqlx::mysql::MySqlConnectOptions> {
        let options: sqlx::mysql::MySqlConnectOptions = url.parse()?;
        Ok(options.database(name))
    }

    fn drain_batch(pool: &sqlx::MySqlPool, batch: usize) -> BoxFuture<'_, anyhow::Result<usize>> {
        Box::pin(async move {
            // Read committed, as the relay's claim: no gap locks.
            let mut tx = pool
                .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
                .await?;
            let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT seq, body FROM tidings_outbox WHERE published_at IS NULL
                 ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED",
            )
            .bind(batch as i64)
            .fetch_all(&mut *tx)
            .await?;
            if !rows.is_empty() {
                let seqs = rows.iter().map(|(seq, _)| seq.to_string()).collect::<Vec<_>>();
                let delete = format!("DELETE FROM tidings_outbox WHERE seq IN ({})", seqs.join(", "));
                tx.execute(sqlx::AssertSqlSafe(delete)).await?;
            }
            tx.commit().await?;
            Ok(rows.len())
        })
    }
}

/// Runs `sql`, in the database's own marks, with `bind`'s arguments.
pub(crate) async fn run<D: BenchDialect>(
    conn: &mut <D::Db as sqlx::Database>::Connection,
    sql: &'static str,
    bind: impl FnOnce(&mut <D::Db as sqlx::Database>::Arguments) -> Result<(), sqlx::error::BoxDynError>,
) -> anyhow::Result<()> {
    let mut args = Default::default();
    bind(&mut args).map_err(|e| anyhow::anyhow!("binding the bench's arguments: {e}"))?;
    <D::Db as SqlDb>::run(conn, sqlx::SqlSafeStr::into_sql_str(sql), args).await?;
    Ok(())
}

/// The one integer `sql` returns (a count).
pub(crate) async fn scalar<D: BenchDialect>(store: &SqlStore<D>, sql: &'static str) -> anyhow::Result<i64> {
    let mut conn = store.conn("reading the bench's figures").await?;
    let row = Stmt::<D>::new(sql, "reading the bench's figures")
        .fetch_one(&mut conn)
        .await?;
    Ok(row.get::<i64>(0)?)
}

/// Binds `value` as the next argument.
pub(crate) fn arg<'t, D: BenchDialect, T>(
    args: &mut <D::Db as sqlx::Database>::Arguments,
    value: T,
) -> Result<(), sqlx::error::BoxDynError>
where
    D::Db: Bind<'t, T>,
{
    <D::Db as Bind<'t, T>>::bind(args, value)
}

/// Runs `sql`, a statement the bench made without arguments, on `pool`.
async fn admin_run<D: BenchDialect>(pool: &Pool<D::Db>, sql: String) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await?;
    let sql = sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(sql));
    <D::Db as SqlDb>::run(&mut conn, sql, Default::default()).await?;
    Ok(())
}

/// A migrated store in a schema (PostgreSQL) or database (MySQL) of the
/// bench's own, dropped at the end.
pub(crate) struct Scratch<D: Dialect> {
    pub(crate) store: SqlStore<D>,
    /// The schema's or database's name.
    pub(crate) name: String,
    admin: Pool<D::Db>,
}

impl<D: BenchDialect> Scratch<D> {
    /// Creates the scratch namespace on the server at `url` and migrates a store there.
    pub(crate) async fn create(url: &str) -> anyhow::Result<Scratch<D>> {
        let admin = PoolOptions::<D::Db>::new()
            .max_connections(1)
            .connect(url)
            .await
            .with_context(|| {
                format!(
                    "connecting to {} at {}",
                    D::NAME,
                    tidings_core::secret::redact_url(url)
                )
            })?;
        let name = format!("tidings_bench_{}", uuid::Uuid::new_v4().simple());
        admin_run::<D>(&admin, D::create_scratch(&name)).await?;
        let store = Self::open(url, &name, 24).await?;
        store.migrate().await?;
        Ok(Scratch { store, name, admin })
    }

    /// A store on the scratch namespace `name` made by [`Scratch::create`]
    /// (in a relay process of the bench, say).
    pub(crate) async fn open(url: &str, name: &str, connections: u32) -> anyhow::Result<SqlStore<D>> {
        let options = D::scratch_options(url, name)?;
        let pool = PoolOptions::<D::Db>::new()
            .max_connections(connections)
            .connect_with(options)
            .await?;
        Ok(SqlStore::new(pool))
    }

    pub(crate) async fn drop(self) {
        self.store.pool().close().await;
        let _ = admin_run::<D>(&self.admin, D::drop_scratch(&self.name)).await;
    }
}

/// A scenario that runs on every database the benches measure.
pub(crate) trait OnDatabase {
    /// What it measures.
    type Figures;
    /// Runs it on `store`, whose scratch namespace is `scratch`.
    fn run_on<D: BenchDialect>(
        &self,
        store: &SqlStore<D>,
        scratch: &str,
    ) -> impl Future<Output = anyhow::Result<Self::Figures>>;
}

/// Runs `scenario` in a scratch namespace on the server at `database`,
/// dropped at the end whatever the outcome.
pub(crate) async fn on_scratch<S: OnDatabase>(database: &str, scenario: &S) -> anyhow::Result<S::Figures> {
    async fn on<D: BenchDialect, S: OnDatabase>(database: &str, scenario: &S) -> anyhow::Result<S::Figures> {
        let scratch = Scratch::<D>::create(database).await?;
        let result = scenario.run_on(&scratch.store, &scratch.name).await;
        scratch.drop().await;
        result
    }
    if opens::<My>(database) {
        on::<My, S>(database, scenario).await
    } else {
        on::<Pg, S>(database, scenario).await
    }
}

/// Whether `database` is a URL of dialect `D`.
pub(crate) fn opens<D: Dialect>(database: &str) -> bool {
    D::SCHEMES.iter().any(|scheme| database.starts_with(scheme))
}

/// Refuses a database the `bench` scenario does not measure, with one line.
pub(crate) fn ensure_measured(database: &str, bench: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        opens::<Pg>(database) || opens::<My>(database),
        "the {bench} bench needs PostgreSQL or MySQL (--database postgres://... or mysql://...)"
    );
    Ok(())
}
