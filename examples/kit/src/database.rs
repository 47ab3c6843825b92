//! The system's database, opened from its URL, and a database beside it
//! for the third parties a system calls.

use anyhow::Context as _;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use tidings::AnyStore;
use tidings::sql::StoreOptions;
use tidings_core::secret::redact_url as redact;
use tidings_store_sqlite::SqliteStore;

/// Opens the store at `url` (`postgres://`, `mysql://`, `sqlite://`), the
/// error naming the database and its address (without credentials).
pub async fn open_store(url: &str, options: StoreOptions) -> anyhow::Result<AnyStore> {
    tidings::open_store_with(url, options).await.with_context(|| {
        let database = tidings::database_named(url).unwrap_or("the database");
        format!("connecting to {database} at {}", redact(url))
    })
}

/// Which database `url` is, without credentials: `postgres (postgres://u@host/db)`, `sqlite (path)`.
pub fn label(url: &str) -> String {
    match tidings::database_named(url) {
        Some("PostgreSQL") => format!("postgres ({})", redact(url)),
        Some("MySQL") => format!("mysql ({})", redact(url)),
        _ => format!("sqlite ({})", sqlite_path(url).unwrap_or(url)),
    }
}

fn sqlite_path(url: &str) -> Option<&str> {
    url.strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
}

/// Connections of a third party's own: it is another system, so it never
/// waits on the pool of the handler calling it (a handler holding a pool
/// connection could wait on the same pool), and on SQLite it has a file of
/// its own (the handler holds the single writer lock).
#[derive(Debug, Clone)]
pub enum SidePool {
    /// Four connections to the same PostgreSQL database.
    Postgres(PgPool),
    /// Four connections to the same MySQL database.
    MySql(MySqlPool),
    /// The SQLite file beside the system's, `<path>.<name>`.
    Sqlite(SqlitePool),
}

impl SidePool {
    /// Connections beside the database at `url`; `name` names the SQLite file.
    pub async fn open(url: &str, name: &str) -> anyhow::Result<SidePool> {
        Self::connect(url, name).await.with_context(|| {
            format!(
                "opening the simulated third party's own connections ({name}) beside {}",
                label(url)
            )
        })
    }

    async fn connect(url: &str, name: &str) -> anyhow::Result<SidePool> {
        let side = match tidings::database_named(url) {
            Some("PostgreSQL") => SidePool::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(4)
                    .connect(url)
                    .await?,
            ),
            Some("MySQL") => SidePool::MySql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(4)
                    .connect(url)
                    .await?,
            ),
            _ => {
                let path = sqlite_path(url).unwrap_or(url);
                let store = SqliteStore::connect(&format!("{path}.{name}")).await?;
                SidePool::Sqlite(store.pool().clone())
            }
        };
        Ok(side)
    }
}
