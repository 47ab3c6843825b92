//! What the store checks share: a test event, a recording handler for any
//! SQL database, helpers over any [`SqlStore`], and the pipeline (relay and
//! consumer) most checks run.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{Backoff, Envelope, Kind, Message, Outbox, OutgoingMessage, Subscriber};
use tidings_log::{LogPublisher, LogReaderConfig, LogSubscriber};
use tidings_relay::{Relay, RelayConfig};
use tidings_sql::db::{SqlDb, Stmt};
use tidings_sql::placeholders::positional;
use tidings_sql::{Dialect, SqlStore, StoreOptions};
use tokio_util::sync::CancellationToken;

use crate::services::TestDb;

/// The topic the checks' events go to.
pub const TOPIC: &str = "test.events";

/// The checks' event: a key and its number within the key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestEvent {
    /// Its key.
    pub key: String,
    /// Its number within the key.
    pub seq: i64,
}

impl Message for TestEvent {
    const TYPE: &'static str = "TestEvent";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "test";
    const TOPIC: &'static str = TOPIC;
    fn key(&self) -> String {
        self.key.clone()
    }
}

/// A [`TestEvent`] of `key` and `seq`, addressed to [`TOPIC`].
pub fn message(key: &str, seq: i64) -> OutgoingMessage {
    let envelope = Envelope::new(
        "tests",
        &TestEvent {
            key: key.to_owned(),
            seq,
        },
    )
    .unwrap();
    OutgoingMessage {
        topic: TOPIC.to_owned(),
        envelope,
    }
}

/// A handler that records what it handled, in memory (order) and in the
/// database (effects, in the table `test_applied` that
/// [`StoreExt::setup`] creates), and misbehaves on request.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    /// Messages of this key fail transiently, until `healed`.
    pub poison_key: Option<String>,
    /// Messages of this key make the handler panic, until `healed`.
    pub panic_key: Option<String>,
    /// The fix for the poison key shipped.
    pub healed: Arc<AtomicBool>,
    /// Sleep up to this long in each run, to shake up timing.
    pub max_sleep_ms: u64,
    /// Messages of this key take a whole second.
    pub slow_key: Option<String>,
    /// The first message (seq 1) of this key fails transiently, until `healed`.
    pub first_fails: Option<String>,
    /// Fail permanently unless the key's previous seq is applied, as the
    /// handler's transaction sees it: an out-of-order commit dead-letters.
    pub check_order: bool,
    /// Perform a `once` effect named `charge`.
    pub effect: bool,
    /// Fail (transiently) right after the effect, once.
    pub fail_after_effect_once: Arc<AtomicBool>,
    /// Handler runs.
    pub calls: Arc<AtomicU64>,
    /// (key, seq) in the order runs reached their end.
    pub seen: Arc<Mutex<Vec<(String, i64)>>>,
    /// Idempotency keys the "provider" received.
    pub effect_keys: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    /// (key, seq) in the order runs reached their end.
    pub fn seen(&self) -> Vec<(String, i64)> {
        self.seen.lock().unwrap().clone()
    }
}

#[async_trait]
impl<DB: SqlDb> Handler<DB> for Recorder {
    async fn handle(&self, ctx: &mut Context<'_, DB>) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.poison_key.as_deref() == Some(ctx.envelope().aggregate_key.as_str())
            && !self.healed.load(Ordering::SeqCst)
        {
            return Err(HandlerError::transient("poisoned key"));
        }
        if self.panic_key.as_deref() == Some(ctx.envelope().aggregate_key.as_str())
            && !self.healed.load(Ordering::SeqCst)
        {
            panic!("a bug in the handler");
        }
        let event: TestEvent = ctx.decode()?;
        if self.first_fails.as_deref() == Some(event.key.as_str())
            && event.seq == 1
            && !self.healed.load(Ordering::SeqCst)
        {
            return Err(HandlerError::transient("the key's first message fails"));
        }
        if self.slow_key.as_deref() == Some(event.key.as_str()) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if self.max_sleep_ms > 0 {
            let ms = rand::rng().random_range(0..=self.max_sleep_ms);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let consumer = ctx.consumer().to_owned();
        if self.check_order && event.seq > 1 {
            let rows = applied::<DB>(
                ctx.tx(),
                "SELECT count(*) FROM test_applied WHERE consumer = $1 AND k = $2 AND seq = $3",
                &consumer,
                &event.key,
                event.seq - 1,
            )
            .await?;
            let previous: i64 = match rows.first() {
                Some(row) => DB::get(row, 0)?,
                None => 0,
            };
            if previous != 1 {
                return Err(HandlerError::permanent(format!(
                    "{}:{} before its predecessor",
                    event.key, event.seq
                )));
            }
        }
        applied::<DB>(
            ctx.tx(),
            "INSERT INTO test_applied (consumer, k, seq) VALUES ($1, $2, $3)",
            &consumer,
            &event.key,
            event.seq,
        )
        .await?;
        if self.effect {
            let keys = self.effect_keys.clone();
            ctx.once("charge", |key| async move {
                keys.lock().unwrap().push(key.as_str().to_owned());
                Ok(())
            })
            .await?;
            if self.fail_after_effect_once.swap(false, Ordering::SeqCst) {
                return Err(HandlerError::transient("crashed after the provider call"));
            }
        }
        self.seen.lock().unwrap().push((event.key, event.seq));
        Ok(())
    }
}

/// Runs `sql` over `test_applied` with (consumer, key, seq) on the
/// handler's transaction, as a service's handler runs its own SQL: a
/// database error goes up through `?`, for the store to classify. MySQL
/// marks parameters with `?`: there the text's `$1`, `$2`, `$3` become `?`
/// (each named once, in order).
async fn applied<DB: SqlDb>(
    conn: &mut DB::Connection,
    sql: &'static str,
    consumer: &str,
    key: &str,
    seq: i64,
) -> Result<Vec<DB::Row>, HandlerError> {
    let mut args = DB::Arguments::default();
    DB::bind(&mut args, consumer)
        .and_then(|()| DB::bind(&mut args, key))
        .and_then(|()| DB::bind(&mut args, seq))
        .map_err(HandlerError::permanent)?;
    let sql = if DB::NAME == "MySQL" {
        sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(positional(sql).0))
    } else {
        sqlx::SqlSafeStr::into_sql_str(sql)
    };
    Ok(DB::rows(conn, sql, args).await?)
}

/// What the checks do to a store besides its own API, written once for
/// every dialect.
#[async_trait]
pub trait StoreExt: Sized {
    /// Creates the table [`Recorder`] writes to.
    async fn setup(&self);
    /// The same database, keeping sent outbox rows for `retention`.
    fn with_retention(&self, retention: Duration) -> Self;
    /// Enqueues `m` in a transaction that commits (true) or rolls back (false).
    async fn enqueue_in_tx(&self, m: &OutgoingMessage, commit: bool);
    /// Enqueues all of `ms` in one transaction that commits.
    async fn enqueue_all(&self, ms: &[OutgoingMessage]);
    /// The one `BIGINT` that `sql` selects.
    async fn count(&self, sql: &'static str) -> i64;
    /// Every outbox row's body, in the order enqueued.
    async fn outbox_bodies(&self) -> Vec<Vec<u8>>;
    /// Appends a raw body to the log with `statement` (a
    /// [`TestDb::LOG_APPEND_RAW`]) in a transaction held open for `hold`.
    async fn append_raw(
        &self,
        statement: &'static str,
        topic: &str,
        key: &str,
        body: Vec<u8>,
        hold: Duration,
    );
}

#[async_trait]
impl<D: Dialect> StoreExt for SqlStore<D> {
    async fn setup(&self) {
        let mut conn = self.conn("creating test_applied").await.unwrap();
        Stmt::<D>::new(
            "CREATE TABLE IF NOT EXISTS test_applied (consumer TEXT NOT NULL, k TEXT NOT NULL, seq BIGINT NOT NULL)",
            "creating test_applied",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
    }

    fn with_retention(&self, retention: Duration) -> Self {
        SqlStore::with_options(self.pool().clone(), StoreOptions::default().retention(retention))
    }

    async fn enqueue_in_tx(&self, m: &OutgoingMessage, commit: bool) {
        let mut tx = self.pool().begin().await.unwrap();
        self.enqueue_outgoing(&mut *tx, m).await.unwrap();
        if commit {
            tx.commit().await.unwrap();
            self.wake();
        } else {
            tx.rollback().await.unwrap();
        }
    }

    async fn enqueue_all(&self, ms: &[OutgoingMessage]) {
        let mut tx = self.pool().begin().await.unwrap();
        for m in ms {
            self.enqueue_outgoing(&mut *tx, m).await.unwrap();
        }
        tx.commit().await.unwrap();
        self.wake();
    }

    async fn count(&self, sql: &'static str) -> i64 {
        let mut conn = self.conn("counting").await.unwrap();
        Stmt::<D>::new(sql, "counting")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
            .get(0)
            .unwrap()
    }

    async fn outbox_bodies(&self) -> Vec<Vec<u8>> {
        let mut conn = self.conn("reading the outbox").await.unwrap();
        Stmt::<D>::new(
            "SELECT body FROM tidings_outbox ORDER BY seq",
            "reading the outbox",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0).unwrap())
        .collect()
    }

    async fn append_raw(
        &self,
        statement: &'static str,
        topic: &str,
        key: &str,
        body: Vec<u8>,
        hold: Duration,
    ) {
        let mut tx = self.pool().begin().await.unwrap();
        Stmt::<D>::new(statement, "appending a raw log entry")
            .bind(topic)
            .bind(key)
            .bind(body.as_slice())
            .execute(&mut *tx)
            .await
            .unwrap();
        tokio::time::sleep(hold).await;
        tx.commit().await.unwrap();
    }
}

/// Waits until `check` holds, polling; panics with `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The store of `db`, with the table [`Recorder`] writes to.
pub(crate) async fn setup<T: TestDb>(db: &T) -> SqlStore<T::Dialect> {
    let store = db.store().clone();
    store.setup().await;
    store
}

/// Four lanes and a quick backoff.
pub(crate) fn quick() -> ConsumerConfig {
    ConsumerConfig::default()
        .lanes(4)
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(5)))
}

/// The store's log, polled every 20ms.
pub(crate) fn subscriber<D: Dialect>(store: &SqlStore<D>) -> LogSubscriber<SqlStore<D>> {
    LogSubscriber::new(
        Arc::new(store.clone()),
        LogReaderConfig::default().poll_interval(Duration::from_millis(20)),
    )
}

/// A relay from the store's outbox to its log, polling every 20ms.
pub(crate) fn relay<D: Dialect>(store: &SqlStore<D>) -> Relay<SqlStore<D>, LogPublisher<SqlStore<D>>> {
    Relay::new(store.clone(), LogPublisher::new(Arc::new(store.clone())))
        .config(RelayConfig::default().poll_interval(Duration::from_millis(20)))
}

/// The relay and one consumer, running in the background over the store.
pub(crate) struct Pipeline {
    pub(crate) stop: CancellationToken,
    relay: tokio::task::JoinHandle<tidings_core::Result<()>>,
    consumer: tokio::task::JoinHandle<()>,
}

impl Pipeline {
    /// Starts the store's relay to its log, and `consumer` reading `subscriber`.
    pub(crate) fn start<D: Dialect, Sub: Subscriber>(
        store: &SqlStore<D>,
        consumer: Consumer<SqlStore<D>>,
        subscriber: Sub,
    ) -> Pipeline {
        let stop = CancellationToken::new();
        let relay = tokio::spawn(relay(store).run(stop.clone()));
        let consumer = tokio::spawn({
            let stop = stop.clone();
            async move { consumer.run(&subscriber, stop).await.unwrap() }
        });
        Pipeline {
            stop,
            relay,
            consumer,
        }
    }

    /// Stops both and waits for them: offsets are stored, batches finished.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.consumer.await.unwrap();
        self.relay.await.unwrap().unwrap();
    }
}

/// Handled (key, seq) of `key`, in handling order.
pub(crate) fn seen_of(recorder: &Recorder, key: &str) -> Vec<i64> {
    recorder
        .seen()
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, seq)| seq)
        .collect()
}

/// Each of `keys` producing `seqs`, one transaction per event, keys in parallel.
pub(crate) async fn produce<D: Dialect>(
    store: &SqlStore<D>,
    keys: usize,
    seqs: std::ops::RangeInclusive<i64>,
) {
    let producers: Vec<_> = (0..keys)
        .map(|k| {
            let (store, seqs) = (store.clone(), seqs.clone());
            tokio::spawn(async move {
                for seq in seqs {
                    store
                        .enqueue_in_tx(&message(&format!("key-{k}"), seq), true)
                        .await;
                }
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
}
