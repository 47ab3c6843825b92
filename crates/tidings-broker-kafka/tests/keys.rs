//! Kafka through the consumer runtime on PostgreSQL: one slow key does not
//! hold back the other keys of its partition, and the group's committed
//! offset never passes the slow event; a consumer killed mid-stream and
//! started again loses nothing and applies nothing twice; a group rewound
//! to a timestamp reads the retained events again and changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Postgres;
use tidings_broker_kafka::{KafkaOptions, KafkaTransport};
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{Kind, Message, OutgoingMessage, Publisher};
use tidings_store_postgres::PgStore;
use tidings_testkit::kafka::kafka_url;
use tidings_testkit::services::PgTestDb;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
struct Step {
    key: String,
    seq: i64,
}

impl Message for Step {
    const TYPE: &'static str = "Step";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "thing";
    const TOPIC: &'static str = "steps";
    fn key(&self) -> String {
        self.key.clone()
    }
}

fn steps(keys: &[&str], per_key: i64) -> Vec<OutgoingMessage> {
    (1..=per_key)
        .flat_map(|seq| {
            keys.iter().map(move |k| {
                OutgoingMessage::new(
                    "keys-test",
                    &Step {
                        key: (*k).to_owned(),
                        seq,
                    },
                )
                .unwrap()
            })
        })
        .collect()
}

/// Applies each step in the handler's transaction; the `slow` key's first
/// step waits until the test opens the gate.
#[derive(Clone, Default)]
struct Apply {
    gate_open: Arc<AtomicBool>,
    pause_ms: u64,
}

#[async_trait]
impl Handler<Postgres> for Apply {
    async fn handle(&self, ctx: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        let step: Step = ctx.decode()?;
        if step.key == "slow" {
            let started = Instant::now();
            while !self.gate_open.load(Ordering::SeqCst) && started.elapsed() < WAIT {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if self.pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.pause_ms)).await;
        }
        sqlx::query("INSERT INTO applied (k, seq) VALUES ($1, $2)")
            .bind(&step.key)
            .bind(step.seq)
            .execute(ctx.tx())
            .await?;
        Ok(())
    }
}

async fn kafka(partitions: u32) -> KafkaTransport {
    let url = kafka_url();
    // A system of its own on the shared broker; one record per producer
    // batch keeps Tansu's high watermarks exact (see the conformance test).
    let options = KafkaOptions::default()
        .prefix(format!("keys-{}.", uuid::Uuid::new_v4().simple()))
        .partitions(partitions)
        .commit_interval(Duration::from_millis(50))
        .client_setting("batch.num.messages", "1");
    KafkaTransport::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("Kafka is not reachable at {url} (set KAFKA_URL): {e}"))
}

async fn applied(store: &PgStore, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(store.pool())
        .await
        .unwrap()
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn setup() -> PgTestDb {
    let db = PgTestDb::new().await;
    sqlx::query("CREATE TABLE applied (id BIGSERIAL PRIMARY KEY, k TEXT NOT NULL, seq BIGINT NOT NULL)")
        .execute(db.store.pool())
        .await
        .unwrap();
    db
}

fn consumer(store: &PgStore, handler: Apply) -> Consumer<PgStore> {
    Consumer::new("keys", store.clone(), handler)
        .topic(Step::TOPIC)
        .config(
            ConsumerConfig::default()
                .lanes(4)
                .lease_ttl(Duration::from_secs(2)),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_key_holds_back_only_itself_and_the_offset_stays_below_it() {
    let db = setup().await;
    let kafka = kafka(1).await;
    // Everything in one partition: the slow key's event first, at offset 0.
    let mut batch = steps(&["slow"], 1);
    batch.extend(steps(&["a", "b", "c", "d"], 5));
    kafka.publish(&batch).await.unwrap();

    let handler = Apply::default();
    let gate = handler.gate_open.clone();
    let stop = CancellationToken::new();
    let member = tokio::spawn({
        let (consumer, kafka, stop) = (consumer(&db.store, handler), kafka.clone(), stop.clone());
        async move { consumer.run(&kafka, stop).await }
    });

    let others = "SELECT count(*) FROM applied WHERE k <> 'slow'";
    eventually("the other keys of the partition handled", || async {
        applied(&db.store, others).await == 20
    })
    .await;
    // Several commit intervals later the slow event still holds the offset.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let committed = kafka.committed("keys", Step::TOPIC).await.unwrap();
        assert!(
            committed[0].is_none_or(|o| o <= 0),
            "the committed offset passed the unfinished event at 0: {committed:?}"
        );
    }
    assert_eq!(
        applied(&db.store, "SELECT count(*) FROM applied WHERE k = 'slow'").await,
        0
    );

    gate.store(true, Ordering::SeqCst);
    eventually("the slow event handled and everything committed", || async {
        kafka.committed("keys", Step::TOPIC).await.unwrap()[0] == Some(21)
    })
    .await;
    assert_eq!(applied(&db.store, "SELECT count(*) FROM applied").await, 21);
    stop.cancel();
    member.await.unwrap().unwrap();
    kafka.delete_topic(Step::TOPIC).await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumer_resumes_without_losing_or_reapplying_an_effect() {
    let db = setup().await;
    let kafka = kafka(3).await;
    let keys: Vec<String> = (0..10).map(|k| format!("k{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    kafka.publish(&steps(&keys, 30)).await.unwrap();
    let total = 300;
    let handler = Apply {
        gate_open: Arc::new(AtomicBool::new(true)),
        pause_ms: 3,
    };

    // The first member is killed mid-stream: its task is aborted, nothing
    // is closed, its final offsets are never committed, and its database
    // connections die with it (its own pool, closed after the abort, as a
    // process's connections end when it is killed), so its in-flight
    // transactions roll back.
    let doomed_store = PgStore::connect(&db.url)
        .await
        .expect("a second pool on the test schema");
    let doomed = tokio::spawn({
        let (consumer, kafka) = (consumer(&doomed_store, handler.clone()), kafka.clone());
        async move { consumer.run(&kafka, CancellationToken::new()).await }
    });
    eventually("a third handled", || async {
        applied(&db.store, "SELECT count(*) FROM applied").await >= total / 3
    })
    .await;
    doomed.abort();
    let _ = doomed.await;
    doomed_store.pool().close().await;
    let before_restart = applied(&db.store, "SELECT count(*) FROM applied").await;
    assert!(before_restart < total, "killed before the end");

    // A new member takes the partitions once the dead one's leases expire.
    let restarted = consumer(&db.store, handler);
    let stats = restarted.stats();
    let stop = CancellationToken::new();
    let member = tokio::spawn({
        let (kafka, stop) = (kafka.clone(), stop.clone());
        async move { restarted.run(&kafka, stop).await }
    });
    eventually("every event handled after the restart", || async {
        applied(&db.store, "SELECT count(DISTINCT (k, seq)) FROM applied").await == total
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    member.await.unwrap().unwrap();

    assert_eq!(
        applied(&db.store, "SELECT count(*) FROM applied").await,
        total,
        "an effect was applied twice"
    );
    let out_of_order = applied(
        &db.store,
        "SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY k ORDER BY id) AS back FROM applied) s WHERE back",
    )
    .await;
    assert_eq!(out_of_order, 0, "a key's events applied out of order");
    println!(
        "killed after {before_restart} of {total}; the restarted member handled {} and recognised {} redelivered",
        stats.handled(),
        stats.duplicates()
    );
    kafka.delete_topic(Step::TOPIC).await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_rewound_to_a_timestamp_reads_again_and_changes_nothing() {
    let db = setup().await;
    let kafka = kafka(2).await;
    let keys = ["a", "b", "c", "d", "e"];
    kafka.publish(&steps(&keys, 3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let middle = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later: Vec<OutgoingMessage> = steps(&keys, 6).into_iter().skip(15).collect();
    kafka.publish(&later).await.unwrap();
    let total = 30;

    let run_until = |wanted: u64| {
        let (consumer, kafka) = (consumer(&db.store, Apply::default()), kafka.clone());
        let stats = consumer.stats();
        async move {
            let stop = CancellationToken::new();
            let member = tokio::spawn({
                let stop = stop.clone();
                async move { consumer.run(&kafka, stop).await }
            });
            eventually("the group caught up", || async {
                stats.handled() + stats.duplicates() >= wanted
            })
            .await;
            stop.cancel();
            member.await.unwrap().unwrap();
            (stats.handled(), stats.duplicates())
        }
    };
    assert_eq!(run_until(total).await, (total, 0));
    let state = "SELECT CAST(count(*) * 1000 + sum(seq) AS BIGINT) FROM applied";
    let before = applied(&db.store, state).await;
    assert_eq!(
        kafka
            .committed("keys", Step::TOPIC)
            .await
            .unwrap()
            .iter()
            .flatten()
            .sum::<i64>(),
        30
    );

    // Back to the middle: the 15 later events come again, and are suppressed.
    let rewind = kafka.rewind("keys", Step::TOPIC, middle).await.unwrap();
    assert_eq!(rewind.messages, 15, "{rewind:?}");
    assert_eq!(
        run_until(15).await,
        (0, 15),
        "re-delivered, every one a duplicate"
    );
    assert_eq!(
        applied(&db.store, state).await,
        before,
        "business state unchanged"
    );

    // Back past the start: all 30 again, still nothing changes.
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    assert_eq!(
        kafka
            .rewind("keys", Step::TOPIC, long_ago)
            .await
            .unwrap()
            .messages,
        30
    );

    // A rewind never moves a group forward past what it has not read:
    // back at the start, "rewinding" to the middle leaves it there.
    let rewind = kafka.rewind("keys", Step::TOPIC, middle).await.unwrap();
    assert_eq!(rewind.messages, 0);
    assert!(
        rewind.partitions.iter().all(|p| p.from == Some(p.to)),
        "{rewind:?}"
    );
    assert_eq!(run_until(30).await, (0, 30));
    assert_eq!(applied(&db.store, state).await, before);

    // Nor to a time still to come.
    let future = std::time::SystemTime::now() + Duration::from_secs(3600);
    let refused = kafka.rewind("keys", Step::TOPIC, future).await.unwrap_err();
    assert!(refused.to_string().contains("in the future"), "{refused}");
    kafka.delete_topic(Step::TOPIC).await.unwrap();
    db.drop_schema().await;
}
