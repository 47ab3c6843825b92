//! Losing the broker only delays side effects: a private NATS server is
//! killed while producers commit, and restarted; every event is then handled
//! once in business effect, in order per key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Postgres;
use tidings_broker_nats::{NatsOptions, NatsTransport};
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{Backoff, Envelope, Kind, Message, Outbox, OutgoingMessage};
use tidings_relay::{Relay, RelayConfig};
use tidings_testkit::nats::PrivateNats;
use tidings_testkit::services::PgTestDb;
use tokio_util::sync::CancellationToken;

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
        self.order.lock().unwrap().push((step.key, step.seq));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_keep_committing_while_nats_is_down_and_nothing_is_lost() {
    const KEYS: usize = 4;
    const PER_KEY: i64 = 60;
    let mut server = PrivateNats::start();
    let db = PgTestDb::new().await;
    let store = db.store.clone();
    sqlx::query("CREATE TABLE applied (k TEXT NOT NULL, seq BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let options = NatsOptions::default().ack_wait(Duration::from_secs(3));
    let nats = NatsTransport::connect_with(&server.url(), options).await.unwrap();

    let stop = CancellationToken::new();
    let relay = Relay::new(store.clone(), nats.clone()).config(
        RelayConfig::default()
            .poll_interval(Duration::from_millis(50))
            .publish_timeout(Duration::from_secs(1))
            .backoff(Backoff::new(
                Duration::from_millis(50),
                Duration::from_millis(500),
            )),
    );
    let relay_stats = relay.stats();
    let relay_task = tokio::spawn(relay.run(stop.clone()));
    let handler = Apply::default();
    let consumer = Consumer::new("apply", store.clone(), handler.clone())
        .topic("steps")
        .config(ConsumerConfig::default().lanes(4));
    let stats = consumer.stats();
    let consumer_task = tokio::spawn({
        let (nats, stop) = (nats.clone(), stop.clone());
        async move { consumer.run(&nats, stop).await }
    });

    // Producers: each key's events committed one by one, keys interleaved.
    let outage = Arc::new(AtomicBool::new(false));
    let committed_during_outage = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..KEYS)
        .map(|k| {
            let (store, outage, during) = (store.clone(), outage.clone(), committed_during_outage.clone());
            tokio::spawn(async move {
                for seq in 1..=PER_KEY {
                    let envelope = Envelope::new(
                        "outage-test",
                        &Step {
                            key: format!("k{k}"),
                            seq,
                        },
                    )
                    .unwrap();
                    let mut tx = store.pool().begin().await.unwrap();
                    store
                        .enqueue(
                            &mut tx,
                            &OutgoingMessage {
                                topic: "steps".into(),
                                envelope,
                            },
                        )
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
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
    server.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    outage.store(false, Ordering::SeqCst);
    let backlog_at_restart = tidings_core::LagSource::lag(&store).await.unwrap().outbox_pending;
    server.resume();
    let restarted = Instant::now();

    for p in producers {
        p.await.unwrap();
    }
    let total = (KEYS as i64 * PER_KEY) as u64;
    let deadline = Instant::now() + Duration::from_secs(90);
    while stats.handled() < total {
        assert!(
            Instant::now() < deadline,
            "only {} of {total} handled after the broker came back",
            stats.handled()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained_in = restarted.elapsed();
    stop.cancel();
    relay_task.await.unwrap().unwrap();
    consumer_task.await.unwrap().unwrap();

    let during = committed_during_outage.load(Ordering::SeqCst);
    println!(
        "committed during the outage: {during}; backlog at restart: {backlog_at_restart}; drained {total} events \
         {drained_in:?} after restart; publish failures: {}; duplicates suppressed: {}",
        relay_stats.publish_failures(),
        stats.duplicates()
    );
    assert!(
        during > 0,
        "producers must keep committing while the broker is down"
    );
    assert!(
        backlog_at_restart > 0,
        "the outage held events back in the outbox"
    );
    assert!(
        relay_stats.publish_failures() > 0,
        "the relay saw the outage and retried"
    );
    let applied: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT k, seq, count(*) FROM applied GROUP BY k, seq ORDER BY k, seq")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(applied.len() as u64, total, "every committed event applied");
    assert!(
        applied.iter().all(|(_, _, n)| *n == 1),
        "an event was applied twice"
    );
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, seq) in handler.order.lock().unwrap().iter() {
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
}

#[derive(Clone, Default)]
struct Count(Arc<AtomicU64>);

#[async_trait]
impl Handler<Postgres> for Count {
    async fn handle(&self, _: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A message whose handling kills the consumer every time is redelivered by
/// JetStream with a rising count; past `max_deliveries` it is dead-lettered
/// without running the handler again, and the line moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_killing_its_consumer_is_dead_lettered() {
    use futures::StreamExt;
    use tidings_core::{FailureStore, Publisher, Subscriber};
    let server = PrivateNats::start();
    let db = PgTestDb::new().await;
    let options = NatsOptions::default().ack_wait(Duration::from_millis(500));
    let nats = NatsTransport::connect_with(&server.url(), options).await.unwrap();
    let group = "fragile";
    nats.subscribe(group, "steps")
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let envelope = Envelope::new(
        "crash-test",
        &Step {
            key: "k".into(),
            seq: 1,
        },
    )
    .unwrap();
    nats.publish(&[OutgoingMessage {
        topic: "steps".into(),
        envelope: envelope.clone(),
    }])
    .await
    .unwrap();
    // Three consumers die while handling it: received, never settled.
    for round in 1..=3u32 {
        let mut sub = nats.subscribe(group, "steps").await.unwrap();
        let d = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        // At least `round`: a pull left over from a closed subscription may
        // also have been handed a delivery.
        assert!(
            d.delivery_count >= round,
            "delivery {} in round {round}",
            d.delivery_count
        );
        drop(d);
        sub.close().await.unwrap();
    }
    let handled = Count::default();
    let consumer = Consumer::new(group, db.store.clone(), handled.clone())
        .topic("steps")
        .config(ConsumerConfig::default().max_deliveries(3));
    let stats = consumer.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (nats, stop) = (nats.clone(), stop.clone());
        async move { consumer.run(&nats, stop).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.dead_lettered() == 0 {
        assert!(Instant::now() < deadline, "the message was not dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(handled.0.load(Ordering::SeqCst), 0, "the handler ran again");
    let letters = db.store.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message_id, Some(envelope.id));
    assert!(
        letters[0].errors[0]
            .error
            .contains("times without being settled (more than 3)"),
        "{:?}",
        letters[0].errors
    );
    db.drop_schema().await;
}
