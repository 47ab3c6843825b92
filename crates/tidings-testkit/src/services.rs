//! Isolated stores on the real services.
//!
//! URLs come from the environment with loopback defaults:
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and
//! `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`, MariaDB or MySQL).

use std::path::PathBuf;
use std::str::FromStr;

use async_trait::async_trait;
use sqlx::Executor;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tidings_sql::{Dialect, SqlStore};
use tidings_store_mysql::{My, MySqlStore};
use tidings_store_postgres::{Pg, PgStore};
use tidings_store_sqlite::{Lite, SqliteStore};
use uuid::Uuid;

/// The PostgreSQL URL tests use.
pub fn postgres_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The MySQL (or MariaDB) URL tests use.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A fresh, migrated store on a real database: what a test written once
/// for every dialect asks for.
#[async_trait]
pub trait TestDb: Send + Sync + Sized + 'static {
    /// The database's dialect.
    type Dialect: Dialect;

    /// ($1 topic, $2 key, $3 body): appends one entry of any body to the
    /// database log, as the dialect's own append would but without its
    /// encoding (the store checks feed readers bad input with it).
    const LOG_APPEND_RAW: &'static str;

    /// Makes this session give up at once on a lock another transaction
    /// holds, rather than wait (the store checks lose a race with it).
    const GIVE_UP_ON_LOCKS: &'static str;

    /// A fresh store, migrated.
    async fn create() -> Self;

    /// The store.
    fn store(&self) -> &SqlStore<Self::Dialect>;

    /// A URL that reaches the same database (for another process or pool).
    fn url(&self) -> String;

    /// Cleans up what [`create`](Self::create) made, where dropping does not.
    async fn teardown(&self) {}
}

#[async_trait]
impl TestDb for PgTestDb {
    type Dialect = Pg;

    const LOG_APPEND_RAW: &'static str =
        "INSERT INTO tidings_log (topic, aggregate_key, body) VALUES ($1, $2, $3)";

    const GIVE_UP_ON_LOCKS: &'static str = "SET lock_timeout = '50ms'";

    async fn create() -> Self {
        PgTestDb::new().await
    }

    fn store(&self) -> &PgStore {
        &self.store
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn teardown(&self) {
        self.drop_schema_ref().await;
    }
}

#[async_trait]
impl TestDb for SqliteTestDb {
    type Dialect = Lite;

    const LOG_APPEND_RAW: &'static str =
        "INSERT INTO tidings_log (topic, aggregate_key, body, created_at) VALUES ($1, $2, $3, 0)";

    const GIVE_UP_ON_LOCKS: &'static str = "PRAGMA busy_timeout = 0";

    async fn create() -> Self {
        SqliteTestDb::new().await
    }

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }
}

#[async_trait]
impl TestDb for MySqlTestDb {
    type Dialect = My;

    const LOG_APPEND_RAW: &'static str =
        "INSERT INTO tidings_log (topic, aggregate_key, body) VALUES ($1, $2, $3)";

    const GIVE_UP_ON_LOCKS: &'static str = "SET SESSION innodb_lock_wait_timeout = 1";

    async fn create() -> Self {
        MySqlTestDb::new().await
    }

    fn store(&self) -> &MySqlStore {
        &self.store
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn teardown(&self) {
        self.drop_database().await;
    }
}

/// A migrated [`PgStore`] in a schema of its own, dropped by [`PgTestDb::drop_schema`].
#[derive(Debug)]
pub struct PgTestDb {
    /// The store, its pool's `search_path` set to the schema.
    pub store: PgStore,
    /// The schema's name.
    pub schema: String,
    /// A URL that reaches the same schema (for a second process or pool).
    pub url: String,
}

impl PgTestDb {
    /// Creates a fresh schema and a migrated store in it.
    ///
    /// # Panics
    ///
    /// If PostgreSQL cannot be reached, with a message naming it and the URL.
    pub async fn new() -> PgTestDb {
        let base = postgres_url();
        let schema = format!("tidings_test_{}", Uuid::new_v4().simple());
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&base)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL is not reachable at {base} (set DATABASE_URL): {e}"));
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .await
            .expect("creating a test schema");
        admin.close().await;
        let options = PgConnectOptions::from_str(&base)
            .expect("DATABASE_URL is a valid PostgreSQL URL")
            .options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(20)
            .connect_with(options)
            .await
            .expect("connecting");
        let store = PgStore::new(pool);
        store.migrate().await.expect("migrating the test schema");
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
        PgTestDb { store, schema, url }
    }

    /// Closes the pool and drops the schema.
    pub async fn drop_schema(self) {
        self.drop_schema_ref().await;
    }

    /// Closes the pool and drops the schema, leaving `self` unusable.
    pub async fn drop_schema_ref(&self) {
        self.store.pool().close().await;
        if let Ok(admin) = PgPoolOptions::new()
            .max_connections(1)
            .connect(&postgres_url())
            .await
        {
            let _ = admin
                .execute(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA {} CASCADE",
                    self.schema
                )))
                .await;
            admin.close().await;
        }
    }
}

/// A migrated [`SqliteStore`] in a file of its own, deleted on drop.
#[derive(Debug)]
pub struct SqliteTestDb {
    /// The store.
    pub store: SqliteStore,
    /// The database file.
    pub path: PathBuf,
}

impl SqliteTestDb {
    /// Creates a fresh database file and a migrated store on it.
    pub async fn new() -> SqliteTestDb {
        let path = std::env::temp_dir().join(format!("tidings-test-{}.db", Uuid::new_v4().simple()));
        let store = SqliteStore::connect(path.to_str().expect("temp path is UTF-8"))
            .await
            .unwrap_or_else(|e| panic!("SQLite could not open {}: {e}", path.display()));
        store.migrate().await.expect("migrating the test database");
        SqliteTestDb { store, path }
    }
}

impl Drop for SqliteTestDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A migrated [`MySqlStore`] in a database of its own, dropped by
/// [`MySqlTestDb::drop_database`].
#[derive(Debug)]
pub struct MySqlTestDb {
    /// The store.
    pub store: MySqlStore,
    /// The database's name.
    pub database: String,
    /// A URL that reaches the same database (for a second process or pool).
    pub url: String,
}

impl MySqlTestDb {
    /// Creates a fresh database and a migrated store in it.
    ///
    /// # Panics
    ///
    /// If MySQL cannot be reached, with a message naming it and the URL.
    pub async fn new() -> MySqlTestDb {
        let db = MySqlTestDb::unmigrated().await;
        db.store.migrate().await.expect("migrating the test database");
        db
    }

    /// Creates a fresh, empty database (no Tidings tables) and a store on it.
    ///
    /// # Panics
    ///
    /// If MySQL cannot be reached, with a message naming it and the URL.
    pub async fn unmigrated() -> MySqlTestDb {
        let base = mysql_url();
        let database = format!("tidings_test_{}", Uuid::new_v4().simple());
        let admin = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&base)
            .await
            .unwrap_or_else(|e| panic!("MySQL is not reachable at {base} (set MYSQL_URL): {e}"));
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .await
            .expect("creating a test database");
        admin.close().await;
        let url = with_database(&base, &database);
        let store = MySqlStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("MySQL refused the test database at {url}: {e}"));
        MySqlTestDb { store, database, url }
    }

    /// Closes the pool and drops the database.
    pub async fn drop_database(&self) {
        self.store.pool().close().await;
        if let Ok(admin) = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&mysql_url())
            .await
        {
            let _ = admin
                .execute(sqlx::AssertSqlSafe(format!("DROP DATABASE {}", self.database)))
                .await;
            admin.close().await;
        }
    }
}

/// `url` with its path (the database) replaced by `database`, its query kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_test_database_keeps_the_url_but_its_path() {
        assert_eq!(
            super::with_database("mysql://root@127.0.0.1:3306/test", "t1"),
            "mysql://root@127.0.0.1:3306/t1"
        );
        assert_eq!(
            super::with_database("mariadb://u:p@db/test?ssl-mode=disabled", "t1"),
            "mariadb://u:p@db/t1?ssl-mode=disabled"
        );
        assert_eq!(
            super::with_database("mysql://root@localhost", "t1"),
            "mysql://root@localhost/t1"
        );
    }
}
