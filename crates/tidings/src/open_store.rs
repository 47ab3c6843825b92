//! Opening a store from its URL: each dialect declares the schemes it
//! opens ([`Dialect::SCHEMES`]), and this is the one place that chooses.

use tidings_core::{Error, Result, secret::redact_url};
use tidings_sql::{Dialect, SqlStore, StoreOptions};

/// A store opened from its URL by [`open_store`]: one variant per database
/// this build includes. Run code generic over [`Store`](crate::Store) on
/// whichever it is with [`with_store!`](crate::with_store).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyStore {
    /// PostgreSQL (`postgres://`).
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::PgStore),
    /// MySQL or MariaDB (`mysql://`, `mariadb://`).
    #[cfg(feature = "mysql")]
    MySql(crate::mysql::MySqlStore),
    /// SQLite (`sqlite:`).
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sqlite::SqliteStore),
}

/// Opens the store at `url` with default options: `postgres://user@host/db`,
/// `mysql://user@host/db`, `sqlite://path.db` (or a plain path: the embedded default), as the
/// build's features allow ([`store_schemes`]).
pub async fn open_store(url: &str) -> Result<AnyStore> {
    open_store_with(url, StoreOptions::default()).await
}

/// Opens the store at `url` with `options`.
///
/// A URL no database of this build opens is refused, naming the schemes
/// that are: each database is a feature of this crate.
pub async fn open_store_with(url: &str, options: StoreOptions) -> Result<AnyStore> {
    match backend(url) {
        #[cfg(feature = "postgres")]
        Some(Backend::Postgres) => Ok(AnyStore::Postgres(SqlStore::connect_with(url, options).await?)),
        #[cfg(feature = "mysql")]
        Some(Backend::MySql) => Ok(AnyStore::MySql(SqlStore::connect_with(url, options).await?)),
        #[cfg(feature = "sqlite")]
        Some(Backend::Sqlite) => Ok(AnyStore::Sqlite(SqlStore::connect_with(url, options).await?)),
        None => {
            drop(options);
            Err(refused(url))
        }
    }
}

/// Why no database of this build opens `url`.
fn refused(url: &str) -> Error {
    Error::Config {
        key: "database URL".into(),
        reason: format!(
            "no database of this build opens {:?}; it opens {} (each database is a feature of the \
             tidings crate: sqlite, postgres, mysql)",
            redact_url(url),
            store_schemes().join(", ")
        ),
    }
}

/// The URL schemes [`open_store`] opens in this build.
pub fn store_schemes() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut schemes = Vec::new();
    #[cfg(feature = "postgres")]
    schemes.extend(crate::postgres::Pg::SCHEMES);
    #[cfg(feature = "mysql")]
    schemes.extend(crate::mysql::My::SCHEMES);
    #[cfg(feature = "sqlite")]
    schemes.extend(crate::sqlite::Lite::SCHEMES);
    schemes
}

/// The name of the database `url` names (`PostgreSQL`), if this build
/// opens it: for messages such as `connecting to PostgreSQL at ...`.
pub fn database_named(url: &str) -> Option<&'static str> {
    backend(url).map(|backend| match backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres => crate::postgres::Pg::NAME,
        #[cfg(feature = "mysql")]
        Backend::MySql => crate::mysql::My::NAME,
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => crate::sqlite::Lite::NAME,
    })
}

/// The databases of this build.
#[derive(Debug, Clone, Copy)]
enum Backend {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    MySql,
    #[cfg(feature = "sqlite")]
    Sqlite,
}

/// Which database of this build opens `url`: the one whose scheme it
/// starts with, or SQLite (the embedded default) for a plain path. The one
/// place that chooses.
fn backend(url: &str) -> Option<Backend> {
    #[cfg(feature = "postgres")]
    if opens::<crate::postgres::Pg>(url) {
        return Some(Backend::Postgres);
    }
    #[cfg(feature = "mysql")]
    if opens::<crate::mysql::My>(url) {
        return Some(Backend::MySql);
    }
    #[cfg(feature = "sqlite")]
    if opens::<crate::sqlite::Lite>(url) || !has_scheme(url) {
        return Some(Backend::Sqlite);
    }
    let _ = url;
    None
}

/// Whether `url` starts with a scheme (`name:`), rather than being a path.
#[allow(dead_code)]
fn has_scheme(url: &str) -> bool {
    url.split_once(':').is_some_and(|(scheme, _)| {
        scheme.len() > 1
            && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

#[allow(dead_code)]
fn opens<D: Dialect>(url: &str) -> bool {
    D::SCHEMES.iter().any(|scheme| url.starts_with(scheme))
}

impl AnyStore {
    /// The database's name (`PostgreSQL`, `SQLite`).
    pub fn database(&self) -> &'static str {
        crate::with_store!(self, |s| database_of(s))
    }

    /// Creates or upgrades Tidings' tables.
    pub async fn migrate(&self) -> Result<()> {
        crate::with_store!(self, |s| s.migrate().await)
    }

    /// Makes `enqueue` refuse, inside the producer's transaction, every
    /// event `transport`'s broker would refuse (too large for it), naming
    /// why; nothing for the database log, which takes any event. See
    /// [`SqlStore::refuse_what_it_refuses`](tidings_sql::SqlStore::refuse_what_it_refuses).
    pub fn refuse_what_it_refuses(&self, transport: &crate::Transport) -> Result<()> {
        if !transport.broker.is_broker() {
            return Ok(());
        }
        crate::with_store!(self, |s| s.refuse_what_it_refuses(transport.publisher.clone()))
    }
}

/// Used by [`AnyStore::database`] when a database is built in.
#[allow(dead_code)]
fn database_of<D: Dialect>(_: &SqlStore<D>) -> &'static str {
    D::NAME
}

/// Runs `body` with `s` bound to the concrete store inside an
/// [`AnyStore`] (by value, or by reference when given `&AnyStore`), so that
/// code generic over [`Store`](crate::Store) runs on whichever database the
/// URL named:
///
/// ```no_run
/// # async fn run() -> tidings::Result<()> {
/// use tidings::LagSource;
///
/// let store = tidings::open_store("sqlite://tidings.db").await?;
/// let lag = tidings::with_store!(&store, |s| s.lag().await)?;
/// println!("{} consumers", lag.consumers.len());
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! with_store {
    ($store:expr, |$s:ident| $body:expr) => {
        match $store {
            #[allow(unreachable_code, unused_labels)]
            __tidings_store => 'tidings_store: {
                $crate::__with_postgres!(__tidings_store, $s, $body, 'tidings_store);
                $crate::__with_mysql!(__tidings_store, $s, $body, 'tidings_store);
                $crate::__with_sqlite!(__tidings_store, $s, $body, 'tidings_store);
                ::core::unreachable!("a store of a database this build does not include")
            }
        }
    };
}

#[cfg(feature = "postgres")]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_postgres {
    ($store:ident, $s:ident, $body:expr, $done:lifetime) => {
        #[allow(irrefutable_let_patterns)]
        if let $crate::AnyStore::Postgres($s) = $store {
            break $done $body;
        }
    };
}

#[cfg(not(feature = "postgres"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_postgres {
    ($($t:tt)*) => {};
}

#[cfg(feature = "sqlite")]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_sqlite {
    ($store:ident, $s:ident, $body:expr, $done:lifetime) => {
        #[allow(irrefutable_let_patterns)]
        if let $crate::AnyStore::Sqlite($s) = $store {
            break $done $body;
        }
    };
}

#[cfg(not(feature = "sqlite"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_sqlite {
    ($($t:tt)*) => {};
}

#[cfg(feature = "mysql")]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_mysql {
    ($store:ident, $s:ident, $body:expr, $done:lifetime) => {
        #[allow(irrefutable_let_patterns)]
        if let $crate::AnyStore::MySql($s) = $store {
            break $done $body;
        }
    };
}

#[cfg(not(feature = "mysql"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_mysql {
    ($($t:tt)*) => {};
}
