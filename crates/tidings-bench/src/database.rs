//! What the producer scenarios write on each database they measure: the
//! business table and the two hand-written inserts, each in the database's
//! own SQL (its own parameter marks, no rewriting), so that the raw limits
//! are what a service would write by hand.

use anyhow::Context as _;
use sqlx::Executor;
use sqlx::mysql::MySqlPoolOptions;
use tidings_sql::Dialect;
use tidings_sql::db::{Bind, SqlDb};
use tidings_store_mysql::{My, MySqlStore};
use tidings_store_postgres::Pg;

/// A database the producer scenarios measure.
pub(crate) trait BenchDialect: Dialect {
    /// Creates `bench_orders (id, customer, total_cents, created_at)`.
    const ORDERS_TABLE: &'static str;
    /// (id, customer, total cents): one business row.
    const BUSINESS: &'static str;
    /// (id, topic, key, type, body): an outbox row as a hand-rolled outbox writes it.
    const RAW_OUTBOX: &'static str;
}

impl BenchDialect for Pg {
    const ORDERS_TABLE: &'static str =
        "CREATE TABLE bench_orders (id UUID PRIMARY KEY, customer TEXT NOT NULL,
        total_cents BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
    const BUSINESS: &'static str = "INSERT INTO bench_orders (id, customer, total_cents) VALUES ($1, $2, $3)";
    const RAW_OUTBOX: &'static str = "INSERT INTO tidings_outbox (id, topic, aggregate_key, message_type, body) VALUES ($1, $2, $3, $4, $5)";
}

impl BenchDialect for My {
    const ORDERS_TABLE: &'static str = "CREATE TABLE bench_orders (id BINARY(16) PRIMARY KEY,
        customer VARCHAR(255) NOT NULL, total_cents BIGINT NOT NULL,
        created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))";
    const BUSINESS: &'static str = "INSERT INTO bench_orders (id, customer, total_cents) VALUES (?, ?, ?)";
    const RAW_OUTBOX: &'static str =
        "INSERT INTO tidings_outbox (id, topic, aggregate_key, message_type, body) VALUES (?, ?, ?, ?, ?)";
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

/// A migrated MySQL store in a database of its own, dropped at the end.
pub(crate) struct MySqlScratch {
    pub(crate) store: MySqlStore,
    name: String,
    admin: sqlx::MySqlPool,
}

impl MySqlScratch {
    pub(crate) async fn create(url: &str) -> anyhow::Result<MySqlScratch> {
        let admin = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .with_context(|| format!("connecting to MySQL at {}", tidings_core::secret::redact_url(url)))?;
        let name = format!("tidings_bench_{}", uuid::Uuid::new_v4().simple());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await?;
        let options: sqlx::mysql::MySqlConnectOptions = url.parse()?;
        let pool = MySqlPoolOptions::new()
            .max_connections(24)
            .connect_with(options.database(&name))
            .await?;
        let store = MySqlStore::new(pool);
        store.migrate().await?;
        Ok(MySqlScratch { store, name, admin })
    }

    pub(crate) async fn drop(self) {
        self.store.pool().close().await;
        let _ = self
            .admin
            .execute(sqlx::AssertSqlSafe(format!("DROP DATABASE {}", self.name)))
            .await;
    }
}
