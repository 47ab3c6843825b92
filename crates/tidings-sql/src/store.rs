//! The store: a pool, its options and its wake-ups, over one dialect.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::Pool;
use sqlx::pool::PoolConnection;
use tidings_core::guard::Guard;
use tidings_core::{Error, PublishGuard, Publisher, Result};
use tidings_log::{LogPublisher, LogReaderConfig, LogSubscriber};

use crate::Dialect;
use crate::errors::db_error;

/// Options of a [`SqlStore`].
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct StoreOptions {
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::optional_duration")
    )]
    pub(crate) retention: Option<Duration>,
    pub(crate) cross_process_wakeups: bool,
    #[cfg_attr(feature = "serde", serde(skip))]
    pub(crate) guard: Guard,
    pub(crate) source: String,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::optional_at_least_one")
    )]
    pub(crate) max_connections: Option<u32>,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::optional_duration")
    )]
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) max_event_bytes: Option<usize>,
}

impl Default for StoreOptions {
    /// Sent outbox records are deleted at once (no retention), and wake-ups
    /// reach other processes where the database can carry them
    /// (PostgreSQL's `NOTIFY`, sent after commit). The envelopes'
    /// `source` is the program's name.
    fn default() -> Self {
        StoreOptions {
            retention: None,
            cross_process_wakeups: true,
            guard: None,
            source: program_name(),
            max_connections: None,
            connect_timeout: None,
            max_event_bytes: None,
        }
    }
}

/// The running program's file name, without extension (`checkout`).
fn program_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "tidings".to_owned())
}

impl StoreOptions {
    /// The `source` of the envelopes [`Outbox::enqueue`] builds: the
    /// service that produces them (`checkout`, or a URI such as
    /// `/services/checkout`). Default: the program's name.
    ///
    /// [`Outbox::enqueue`]: tidings_core::Outbox::enqueue
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Keep sent outbox records for `retention` (marked with `published_at`)
    /// instead of deleting them when sent. [`RelayStore::cleanup`] deletes
    /// them once older.
    ///
    /// [`RelayStore::cleanup`]: tidings_core::RelayStore::cleanup
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Whether to wake relays and log readers in other processes, where the
    /// database can (PostgreSQL: `LISTEN`/`NOTIFY`). They poll anyway.
    pub fn cross_process_wakeups(mut self, on: bool) -> Self {
        self.cross_process_wakeups = on;
        self
    }

    /// Checks every message before the outbox accepts it (schema
    /// validation and the secrets lint, with `tidings-schema`'s
    /// `SchemaGuard`). A refused message is not written and `enqueue`
    /// returns [`Error::Refused`](tidings_core::Error::Refused).
    pub fn guard(mut self, guard: Arc<dyn PublishGuard>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// The size of the pool [`SqlStore::connect_with`] opens (each
    /// dialect has its default: 32 on PostgreSQL, 8 on SQLite).
    ///
    /// Size it for the handlers that run at once (one connection per
    /// consumer lane in a handler), plus the relay (two while it publishes
    /// to the database log) and one per log subscription.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = Some(n.max(1));
        self
    }

    /// How long opening the store keeps trying a server that is not up
    /// yet (refused, or starting), and waits for an answer, before it
    /// reports the cause: 10 s by default, for a service and its database
    /// starting together; a command run by hand wants less.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = Some(d);
        self
    }

    /// The largest event `enqueue` accepts, in bytes of its CloudEvents
    /// JSON: set it to the smallest limit of the transports the relay
    /// publishes to (NATS's `max_payload`, 1 MiB by default; Kafka's
    /// `message.max.bytes`; 256 KiB on SQS), so that an event the broker
    /// would refuse is refused inside the producer's transaction, where its
    /// caller can act, rather than by the broker after the commit.
    pub fn max_event_bytes(mut self, n: usize) -> Self {
        self.max_event_bytes = Some(n);
        self
    }

    /// [`StoreOptions::connect_timeout`], 10 s unless set.
    pub fn connect_window(&self) -> Duration {
        self.connect_timeout.unwrap_or(Duration::from_secs(10))
    }

    /// The pool size asked for, if any ([`StoreOptions::max_connections`]).
    pub fn pool_size(&self) -> Option<u32> {
        self.max_connections
    }

    /// Whether wake-ups reach other processes.
    pub fn cross_process_wakeups_enabled(&self) -> bool {
        self.cross_process_wakeups
    }

    /// How long sent records are kept, if they are.
    pub fn retention_period(&self) -> Option<Duration> {
        self.retention
    }
}

/// Tidings' store on one SQL database: the outbox, the relay's claims, the
/// database log, the consumers' records, dead letters, parking, leases,
/// lag and replays. Cheap to clone.
pub struct SqlStore<D: Dialect> {
    pub(crate) inner: Arc<Inner<D>>,
}

pub(crate) struct Inner<D: Dialect> {
    pub(crate) pool: Pool<D::Db>,
    pub(crate) options: StoreOptions,
    pub(crate) wake: D::Wakeups,
    /// The transport whose refusals `enqueue` makes its own
    /// ([`SqlStore::refuse_what_it_refuses`]).
    pub(crate) transport: OnceLock<Arc<dyn Publisher>>,
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        SqlStore {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Dialect> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The pool's options hold the password: never print them.
        f.debug_struct("SqlStore")
            .field("database", &D::NAME)
            .field("pool_size", &self.inner.pool.size())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> SqlStore<D> {
    /// Connects to `url` with default options.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, StoreOptions::default()).await
    }

    /// Connects to `url` with `options`.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self> {
        let pool = D::open(url, &options).await?;
        Ok(Self::with_options(pool, options))
    }

    /// A store on an existing pool, with default options.
    pub fn new(pool: Pool<D::Db>) -> Self {
        Self::with_options(pool, StoreOptions::default())
    }

    /// A store on an existing pool.
    pub fn with_options(pool: Pool<D::Db>, options: StoreOptions) -> Self {
        let wake = D::wakeups(&pool, &options);
        SqlStore {
            inner: Arc::new(Inner {
                pool,
                options,
                wake,
                transport: OnceLock::new(),
            }),
        }
    }

    /// The connection pool, for the application's own queries.
    pub fn pool(&self) -> &Pool<D::Db> {
        &self.inner.pool
    }

    /// The store's options.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// Makes `enqueue` refuse, inside the producer's transaction, every
    /// event `publisher` says it would refuse ([`Publisher::refuses`]: larger
    /// than NATS's `max_payload`, Kafka's `message.max.bytes`, or the
    /// `max_message_bytes` the RabbitMQ transport is given for its broker's
    /// `max_message_size`), with the transport's own reason: the relay
    /// could never publish it, and its caller can act where a dead letter
    /// after the commit would only be seen by an operator. Give it the
    /// broker's publisher the relay uses, never this store's own database
    /// log: that refuses nothing, and holding it would keep the store (its
    /// pool and tasks) alive for good. Set once: a later call is refused.
    pub fn refuse_what_it_refuses(&self, publisher: Arc<dyn Publisher>) -> Result<()> {
        self.inner.transport.set(publisher).map_err(|_| Error::Config {
            key: "store".to_owned(),
            reason: "enqueue already refuses what one transport refuses; a store checks events against one"
                .to_owned(),
        })
    }

    /// The store's wake-ups.
    pub fn wakeups(&self) -> &D::Wakeups {
        &self.inner.wake
    }

    /// Creates or upgrades Tidings' tables (idempotent; safe from several processes at once).
    pub async fn migrate(&self) -> Result<()> {
        crate::migrate::run::<D>(&self.inner.pool).await
    }

    /// The database-log transport's publisher on this database.
    pub fn log_publisher(&self) -> LogPublisher<Self> {
        LogPublisher::new(Arc::new(self.clone()))
    }

    /// The database-log transport's subscriber on this database.
    pub fn log_subscriber(&self, config: LogReaderConfig) -> LogSubscriber<Self> {
        LogSubscriber::new(Arc::new(self.clone()), config)
    }

    /// A connection from the pool, for doing `what`.
    pub async fn conn(&self, what: &'static str) -> Result<PoolConnection<D::Db>> {
        self.inner.pool.acquire().await.map_err(db_error::<D>(what))
    }

    /// A transaction, for doing `what`.
    pub async fn begin_tx(&self, what: &'static str) -> Result<sqlx::Transaction<'static, D::Db>> {
        self.inner.pool.begin().await.map_err(db_error::<D>(what))
    }
}

/// A point in time as the statements bind it: microseconds since the Unix epoch.
pub(crate) fn micros(at: chrono::DateTime<chrono::Utc>) -> i64 {
    at.timestamp_micros()
}

/// A point in time read back from [`micros`].
pub(crate) fn from_micros(us: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_micros(us).unwrap_or_default()
}

/// A duration as the statements bind it: milliseconds.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// An age read back in milliseconds.
pub(crate) fn age(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

/// A count read back.
pub(crate) fn count(n: i64) -> u64 {
    n.max(0) as u64
}
