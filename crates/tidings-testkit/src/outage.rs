//! Losing the broker only delays side effects: one scenario every broker
//! transport runs against a private server of its own.
//!
//! Producers commit events to the PostgreSQL outbox, key by key, while a
//! relay publishes them and two members of one consumer group handle them.
//! The broker is killed for a while and started again. Afterwards the
//! database must show every committed event applied exactly once, in order
//! per key, producers having committed throughout.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Postgres;
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{Backoff, Kind, LagSource, Message, Outbox, Publisher, Subscriber};
use tidings_relay::{Relay, RelayConfig};
use tokio_util::sync::CancellationToken;

use crate::services::PgTestDb;

/// A broker server a test owns, which it may kill and start again.
pub trait PrivateBroker {
    /// Takes the server away: kills it (SIGKILL), so that clients see their
    /// connections drop, or freezes it (SIGSTOP) when its storage would not
    /// survive a restart.
    fn stop(&mut self);
    /// Brings it back on the same port and storage, and waits until it accepts connections.
    fn resume(&mut self);
}

#[derive(Serialize, Deserialize)]
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

#[derive(Clone, Default)]
struct Apply {
    /// The group's handling order, across members.
    order: Arc<Mutex<Vec<(String, i64)>>>,
}

#[async_trait]
impl Handler<Postgres> for Apply {
    async fn handle(&self, ctx: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        let step: Step = ctx.decode()?;
        sqlx::query("INSERT INTO applied (k, seq) VALUES ($1, $2)")
            .bind(&step.key)
            .bind(step.seq)
            .execute(ctx.tx())
            .await?;
        self.order.lock().expect("order lock").push((step.key, step.seq));
        Ok(())
    }
}

/// What one outage run measured.
#[derive(Debug)]
pub struct OutageReport {
    /// Events committed while the broker was down.
    pub committed_during_outage: u64,
    /// Outbox rows waiting when the broker came back.
    pub backlog_at_restart: u64,
    /// Time from the restart to the last event handled.
    pub drained_in: Duration,
    /// Publishes the relay saw fail.
    pub publish_failures: u64,
    /// Redeliveries the consumers recognised and skipped.
    pub duplicates_suppressed: u64,
}

/// Runs the scenario: `publisher` and `subscriber` talk to `broker`, which is
/// already running; the subscriber's topics should have at least two
/// partitions so that both members work. Needs the multi-threaded runtime
/// (the broker is stopped and started on the test's thread). Panics on a
/// broken promise; returns the figures otherwise.
pub async fn producers_keep_committing_while_the_broker_is_down(
    broker: &mut dyn PrivateBroker,
    publisher: Arc<dyn Publisher>,
    subscriber: Arc<dyn Subscriber>,
) -> OutageReport {
    const KEYS: usize = 6;
    const PER_KEY: i64 = 50;
    let db = PgTestDb::new().await;
    let store = db.store.clone();
    sqlx::query("CREATE TABLE applied (k TEXT NOT NULL, seq BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("creating the applied table");
    // Every member's group queue exists before anything is published.
    subscriber
        .subscribe("apply", Step::TOPIC)
        .await
        .expect("subscribing the group")
        .close()
        .await
        .expect("closing the first subscription");

    let stop = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher).config(
        RelayConfig::default()
            .poll_interval(Duration::from_millis(50))
            .publish_timeout(Duration::from_secs(2))
            .backoff(Backoff::new(
                Duration::from_millis(50),
                Duration::from_millis(500),
            )),
    );
    let relay_stats = relay.stats();
    let relay_task = tokio::spawn(relay.run(stop.clone()));
    let handler = Apply::default();
    let mut members = Vec::new();
    let mut stats = Vec::new();
    for _ in 0..2 {
        let consumer = Consumer::new("apply", store.clone(), handler.clone())
            .topic(Step::TOPIC)
            .config(
                ConsumerConfig::default()
                    .lanes(4)
                    .lease_ttl(Duration::from_secs(2)),
            );
        stats.push(consumer.stats());
        let (subscriber, stop) = (subscriber.clone(), stop.clone());
        members.push(tokio::spawn(
            async move { consumer.run(&*subscriber, stop).await },
        ));
    }
    let handled = || stats.iter().map(|s| s.handled()).sum::<u64>();

    // Producers: each key's events committed one by one, keys interleaved.
    let outage = Arc::new(AtomicBool::new(false));
    let during = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..KEYS)
        .map(|k| {
            let (store, outage, during) = (store.clone(), outage.clone(), during.clone());
            tokio::spawn(async move {
                for seq in 1..=PER_KEY {
                    let step = Step {
                        key: format!("k{k}"),
                        seq,
                    };
                    let mut tx = store.pool().begin().await.expect("begin");
                    store.enqueue(&mut tx, &step).await.expect("enqueue");
                    tx.commit().await.expect("commit");
                    store.wake();
                    if outage.load(Ordering::SeqCst) {
                        during.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();

    // Let some flow, then take the broker away for a while.
    tokio::time::sleep(Duration::from_millis(400)).await;
    outage.store(true, Ordering::SeqCst);
    tokio::task::block_in_place(|| broker.stop());
    tokio::time::sleep(Duration::from_secs(3)).await;
    outage.store(false, Ordering::SeqCst);
    let backlog_at_restart = store.lag().await.expect("lag").outbox_pending;
    tokio::task::block_in_place(|| broker.resume());
    let restarted = Instant::now();

    for p in producers {
        p.await.expect("a producer");
    }
    let total = (KEYS as i64 * PER_KEY) as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while handled() < total {
        if Instant::now() >= deadline {
            let per_key: Vec<(String, i64, i64)> =
                sqlx::query_as("SELECT k, count(*), max(seq) FROM applied GROUP BY k ORDER BY k")
                    .fetch_all(store.pool())
                    .await
                    .unwrap_or_default();
            let lag = store.lag().await.expect("lag");
            panic!(
                "only {} of {total} handled two minutes after the broker came back; applied per key \
                 (count, last) {per_key:?}; {} records still in the outbox",
                handled(),
                lag.outbox_pending
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = OutageReport {
        committed_during_outage: during.load(Ordering::SeqCst),
        backlog_at_restart,
        drained_in: restarted.elapsed(),
        publish_failures: relay_stats.publish_failures(),
        duplicates_suppressed: stats.iter().map(|s| s.duplicates()).sum(),
    };
    stop.cancel();
    relay_task.await.expect("relay task").expect("relay");
    for member in members {
        member.await.expect("member task").expect("member");
    }
    println!("{report:?}");

    assert!(
        report.committed_during_outage > 0,
        "producers must keep committing while the broker is down"
    );
    assert!(
        report.backlog_at_restart > 0,
        "the outage held events back in the outbox"
    );
    assert!(
        report.publish_failures > 0,
        "the relay saw the outage and retried"
    );
    let applied: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT k, seq, count(*) FROM applied GROUP BY k, seq ORDER BY k, seq")
            .fetch_all(store.pool())
            .await
            .expect("reading what was applied");
    assert_eq!(applied.len() as u64, total, "every committed event applied");
    assert!(
        applied.iter().all(|(_, _, n)| *n == 1),
        "an event was applied twice"
    );
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, seq) in handler.order.lock().expect("order lock").iter() {
        per_key.entry(k.clone()).or_default().push(*seq);
    }
    for (k, seqs) in per_key {
        assert_eq!(
            seqs,
            (1..=PER_KEY).collect::<Vec<_>>(),
            "key {k} applied out of order"
        );
    }
    db.drop_schema().await;
    report
}

/// What one run of [`each_key_keeps_its_order_through_broker_restarts`] saw.
#[derive(Debug)]
pub struct KeyOrderReport {
    /// Batches published (each whole, in the end).
    pub batches: u64,
    /// Publishes of a batch that failed and were made again.
    pub publish_failures: u64,
    /// Copies read of a message already read.
    pub copies: u64,
}

/// A key's order survives the broker dying under a publisher's batches.
///
/// Batches of a few keys, each key many times in every batch, are
/// published back to back while the broker is killed and started again a
/// few times; a batch that fails is published again whole, as the relay
/// does. A client that pipelines a batch may lose what it had written to
/// the dead connection: it must never then deliver a later message of the
/// same key ahead of the lost one. Read back, each key's messages must
/// first arrive in their order (copies of ones already read may follow),
/// none missing. Needs the multi-threaded runtime.
pub async fn each_key_keeps_its_order_through_broker_restarts(
    broker: &mut dyn PrivateBroker,
    publisher: Arc<dyn Publisher>,
    subscriber: Arc<dyn Subscriber>,
) -> KeyOrderReport {
    use futures::StreamExt;
    const KEYS: usize = 4;
    const PER_KEY: i64 = 50;
    const GROUP: &str = "in-order";
    subscriber
        .ensure_group(GROUP, Step::TOPIC)
        .await
        .expect("creating the group");

    let done = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let done = done.clone();
        async move {
            let (mut batches, mut failures) = (0u64, 0u64);
            while !done.load(Ordering::SeqCst) {
                // Keys interleaved: k0 k1 k2 k3 k0 k1 ...
                let batch: Vec<_> = (0..PER_KEY)
                    .flat_map(|i| {
                        (0..KEYS).map(move |k| Step {
                            key: format!("k{k}"),
                            seq: batches as i64 * PER_KEY + i + 1,
                        })
                    })
                    .map(|step| tidings_core::OutgoingMessage::new("key-order-test", &step).expect("a step"))
                    .collect();
                loop {
                    match tokio::time::timeout(Duration::from_secs(2), publisher.publish(&batch)).await {
                        Ok(Ok(())) => break,
                        _ => {
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                batches += 1;
            }
            (batches, failures)
        }
    });
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        tokio::task::block_in_place(|| {
            broker.stop();
            broker.resume();
        });
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    done.store(true, Ordering::SeqCst);
    let (batches, publish_failures) = producer.await.expect("the producer");

    let total = batches * (KEYS as u64) * PER_KEY as u64;
    let mut read: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let (mut distinct, mut copies) = (0u64, 0u64);
    let mut sub = subscriber
        .subscribe(GROUP, Step::TOPIC)
        .await
        .expect("subscribing to read back");
    while distinct < total {
        let delivery = tokio::time::timeout(Duration::from_secs(30), sub.next())
            .await
            .unwrap_or_else(|_| panic!("only {distinct} of {total} messages arrived; read so far: {read:?}"))
            .expect("the subscription ended")
            .expect("a delivery");
        let step: Step = delivery
            .message
            .decode()
            .expect("an envelope")
            .decode()
            .expect("a step");
        delivery.ack(tidings_core::AckKind::Ack).await.expect("acking");
        let seqs = read.entry(step.key.clone()).or_default();
        match seqs.last() {
            Some(&last) if step.seq <= last => copies += 1,
            last => {
                assert_eq!(
                    step.seq,
                    last.map_or(1, |l| l + 1),
                    "key {} arrived out of order: after {last:?} came {} ({batches} batches, {publish_failures} failed publishes)",
                    step.key,
                    step.seq
                );
                seqs.push(step.seq);
                distinct += 1;
            }
        }
    }
    sub.close().await.expect("closing");
    let report = KeyOrderReport {
        batches,
        publish_failures,
        copies,
    };
    println!("{report:?}");
    report
}
