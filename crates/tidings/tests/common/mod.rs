//! Shared pieces of the foundation tests: a test event, a recording handler
//! for both databases, and small store helpers written once per database.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tidings::consumer::{Context, Handler, HandlerError};
use tidings::{Envelope, Kind, Message, Outbox, OutgoingMessage};
use tidings_store_postgres::{PgStore, PgStoreOptions};
use tidings_store_sqlite::{SqliteStore, SqliteStoreOptions};

pub const TOPIC: &str = "test.events";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestEvent {
    pub key: String,
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
/// database (effects), and misbehaves on request.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    /// Messages of this key fail transiently, until `healed`.
    pub poison_key: Option<String>,
    /// The fix for the poison key shipped.
    pub healed: Arc<AtomicBool>,
    /// Sleep up to this long in each run, to shake up timing.
    pub max_sleep_ms: u64,
    /// Messages of this key take a whole second.
    pub slow_key: Option<String>,
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
    pub fn seen(&self) -> Vec<(String, i64)> {
        self.seen.lock().unwrap().clone()
    }
}

macro_rules! recorder_for {
    ($db:ty) => {
        #[async_trait]
        impl Handler<$db> for Recorder {
            async fn handle(&self, ctx: &mut Context<'_, $db>) -> Result<(), HandlerError> {
                self.calls.fetch_add(1, Ordering::SeqCst);
                if self.poison_key.as_deref() == Some(ctx.envelope().aggregate_key.as_str())
                    && !self.healed.load(Ordering::SeqCst)
                {
                    return Err(HandlerError::transient("poisoned key"));
                }
                let event: TestEvent = ctx.decode()?;
                if self.slow_key.as_deref() == Some(event.key.as_str()) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                if self.max_sleep_ms > 0 {
                    let ms = rand::rng().random_range(0..=self.max_sleep_ms);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                let consumer = ctx.consumer().to_owned();
                if self.check_order && event.seq > 1 {
                    let previous: i64 = sqlx::query_scalar(
                        "SELECT CAST(count(*) AS BIGINT) FROM test_applied WHERE consumer = $1 AND k = $2 AND seq = $3",
                    )
                    .bind(&consumer)
                    .bind(&event.key)
                    .bind(event.seq - 1)
                    .fetch_one(ctx.tx())
                    .await?;
                    if previous != 1 {
                        return Err(HandlerError::permanent(format!("{}:{} before its predecessor", event.key, event.seq)));
                    }
                }
                sqlx::query("INSERT INTO test_applied (consumer, k, seq) VALUES ($1, $2, $3)")
                    .bind(consumer)
                    .bind(&event.key)
                    .bind(event.seq)
                    .execute(ctx.tx())
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
    };
}
recorder_for!(sqlx::Postgres);
recorder_for!(sqlx::Sqlite);

/// Store abilities the tests use, plus a few statements per database.
#[async_trait]
pub trait TestStore: tidings::Store + Send + Sync {
    async fn setup(&self);
    /// The same database, keeping sent outbox rows for `retention`.
    fn with_retention(&self, retention: Duration) -> Self;
    /// Enqueues `m` in a transaction that commits (true) or rolls back (false).
    async fn enqueue_in_tx(&self, m: &OutgoingMessage, commit: bool);
    /// Enqueues all of `ms` in one transaction that commits.
    async fn enqueue_all(&self, ms: &[OutgoingMessage]);
    async fn count(&self, sql: &'static str) -> i64;
    /// Appends a raw body to the log in a transaction held open for `hold`.
    async fn append_raw(&self, topic: &str, key: &str, body: Vec<u8>, hold: Duration);
}

macro_rules! test_store_for {
    ($store:ident, $options:ident, $append:literal) => {
        #[async_trait]
        impl TestStore for $store {
            fn with_retention(&self, retention: Duration) -> Self {
                $store::with_options(self.pool().clone(), $options::default().retention(retention))
            }

            async fn setup(&self) {
                sqlx::query("CREATE TABLE IF NOT EXISTS test_applied (consumer TEXT NOT NULL, k TEXT NOT NULL, seq BIGINT NOT NULL)")
                    .execute(self.pool())
                    .await
                    .unwrap();
            }

            async fn enqueue_in_tx(&self, m: &OutgoingMessage, commit: bool) {
                let mut tx = self.pool().begin().await.unwrap();
                self.enqueue(&mut tx, m).await.unwrap();
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
                    self.enqueue(&mut tx, m).await.unwrap();
                }
                tx.commit().await.unwrap();
                self.wake();
            }

            async fn count(&self, sql: &'static str) -> i64 {
                sqlx::query_scalar::<_, i64>(sql).fetch_one(self.pool()).await.unwrap()
            }

            async fn append_raw(&self, topic: &str, key: &str, body: Vec<u8>, hold: Duration) {
                let mut tx = self.pool().begin().await.unwrap();
                sqlx::query($append)
                    .bind(topic)
                    .bind(key)
                    .bind(body)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tokio::time::sleep(hold).await;
                tx.commit().await.unwrap();
            }
        }
    };
}
test_store_for!(
    PgStore,
    PgStoreOptions,
    "INSERT INTO tidings_log (topic, aggregate_key, body) VALUES ($1, $2, $3)"
);
test_store_for!(
    SqliteStore,
    SqliteStoreOptions,
    "INSERT INTO tidings_log (topic, aggregate_key, body, created_at) VALUES ($1, $2, $3, 0)"
);

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

/// Runs a generic test body on a fresh PostgreSQL schema and a fresh SQLite file.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    let db = tidings_testkit::services::PgTestDb::new().await;
                    $crate::common::TestStore::setup(&db.store).await;
                    super::$name(db.store.clone()).await;
                    db.drop_schema().await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    let db = tidings_testkit::services::SqliteTestDb::new().await;
                    $crate::common::TestStore::setup(&db.store).await;
                    super::$name(db.store.clone()).await;
                }
            }
        )*
    };
}
