//! The foundation's promises, each tested on the real PostgreSQL and on a
//! real SQLite file: atomicity of the outbox, relay retries, per-key order,
//! idempotency under redelivery, dead-lettering without blocking, the log
//! gap, bad input and the effects ledger.

#[macro_use]
mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Recorder, TOPIC, TestStore, eventually, message};
use futures::StreamExt;
use tidings::consumer::{Consumer, ConsumerConfig, Handler, IdempotencyKey};
use tidings::log::{LogPublisher, LogReaderConfig, LogSubscriber};
use tidings::relay::{Relay, RelayConfig};
use tidings::{
    AckKind, Backoff, DeadLetterFilter, Envelope, Kind, Partition, Publisher, Subscriber, cloudevents,
};
use tidings_testkit::faults::{Duplicating, Switchable};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

fn quick() -> ConsumerConfig {
    ConsumerConfig::default()
        .lanes(4)
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(5)))
}

fn subscriber<S: TestStore>(store: &S) -> LogSubscriber<S> {
    LogSubscriber::new(
        Arc::new(store.clone()),
        LogReaderConfig::default().poll_interval(Duration::from_millis(20)),
    )
}

fn relay<S: TestStore>(store: &S) -> Relay<S, LogPublisher<S>> {
    Relay::new(store.clone(), LogPublisher::new(Arc::new(store.clone())))
        .config(RelayConfig::default().poll_interval(Duration::from_millis(20)))
}

/// The relay and one consumer, running in the background over the store.
struct Pipeline {
    stop: CancellationToken,
    relay: tokio::task::JoinHandle<tidings::Result<()>>,
    consumer: tokio::task::JoinHandle<()>,
}

impl Pipeline {
    /// Starts the store's relay to its log, and `consumer` reading `subscriber`.
    fn start<S: TestStore, Sub: Subscriber>(store: &S, consumer: Consumer<S>, subscriber: Sub) -> Pipeline {
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
    async fn stop(self) {
        self.stop.cancel();
        self.consumer.await.unwrap();
        self.relay.await.unwrap().unwrap();
    }
}

on_both_databases!(
    outbox_is_atomic_with_the_business_transaction,
    relay_retries_until_the_transport_confirms,
    per_key_order_holds_with_parallel_lanes,
    redelivered_duplicates_change_nothing,
    poison_is_dead_lettered_without_blocking_other_keys,
    log_readers_never_skip_late_commits,
    bad_input_reaches_the_failure_store_with_a_clear_error,
    effects_ledger_reuses_one_key_and_skips_recorded_effects,
    a_handler_past_its_timeout_is_rolled_back_and_retried,
    retention_keeps_sent_rows_until_cleanup,
    log_retention_keeps_what_a_group_has_not_read,
    an_older_version_is_upcast_and_an_unreadable_one_dead_lettered,
    dual_publishing_feeds_each_version_once,
);

async fn outbox_is_atomic_with_the_business_transaction<S: TestStore>(store: S) {
    store.enqueue_in_tx(&message("a", 1), false).await;
    assert_eq!(
        store.lag().await.unwrap().outbox_pending,
        0,
        "a rolled-back transaction left an event"
    );
    store.enqueue_in_tx(&message("a", 2), true).await;
    let lag = store.lag().await.unwrap();
    assert_eq!(lag.outbox_pending, 1);
    assert!(lag.oldest_unsent_age.is_some());
}

async fn relay_retries_until_the_transport_confirms<S: TestStore>(store: S) {
    for seq in 1..=20 {
        store
            .enqueue_in_tx(&message(if seq % 2 == 0 { "a" } else { "b" }, seq), true)
            .await;
    }
    let publisher = Switchable::new(LogPublisher::new(Arc::new(store.clone())));
    publisher.set_up(false);
    let relay = Relay::new(store.clone(), publisher.clone()).config(
        RelayConfig::default()
            .poll_interval(Duration::from_millis(20))
            .backoff(Backoff::new(Duration::from_millis(10), Duration::from_millis(40))),
    );
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    eventually(WAIT, "several refused publishes", || async {
        publisher.refused() >= 3
    })
    .await;
    assert_eq!(
        store.lag().await.unwrap().outbox_pending,
        20,
        "nothing may be marked sent while the transport is down"
    );
    assert_eq!(stats.published(), 0);
    publisher.set_up(true);
    eventually(WAIT, "the backlog to drain", || async {
        store.lag().await.unwrap().outbox_pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(stats.published(), 20);
    assert!(stats.publish_failures() >= 3);

    // The log holds every event once, in commit order.
    let mut stream = subscriber(&store).subscribe("check", TOPIC).await.unwrap();
    let mut seqs = Vec::new();
    while seqs.len() < 20 {
        let d = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seqs.push(
            d.message
                .decode()
                .unwrap()
                .decode::<common::TestEvent>()
                .unwrap()
                .seq,
        );
        d.ack(AckKind::Ack).await.unwrap();
    }
    assert_eq!(seqs, (1..=20).collect::<Vec<_>>());
}

async fn per_key_order_holds_with_parallel_lanes<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    const KEYS: usize = 6;
    const PER_KEY: i64 = 40;
    let recorder = Recorder {
        max_sleep_ms: 3,
        ..Recorder::default()
    };
    let consumer = Consumer::new("ordered", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick());
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));

    // Each key's producer commits its events one by one; keys interleave.
    let producers: Vec<_> = (0..KEYS)
        .map(|k| {
            let store = store.clone();
            tokio::spawn(async move {
                for seq in 1..=PER_KEY {
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
    let total = KEYS as u64 * PER_KEY as u64;
    eventually(WAIT, "every event handled", || async { stats.handled() == total }).await;
    pipeline.stop().await;

    let lag = store.lag().await.unwrap();
    let ordered = lag
        .consumers
        .iter()
        .find(|c| c.consumer == "ordered")
        .expect("the group's offset is stored");
    assert_eq!(
        (ordered.topic.as_str(), ordered.pending),
        (TOPIC, 0),
        "settled offsets are committed on shutdown"
    );

    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, seq) in recorder.seen() {
        per_key.entry(key).or_default().push(seq);
    }
    assert_eq!(per_key.len(), KEYS);
    for (key, seqs) in per_key {
        assert_eq!(
            seqs,
            (1..=PER_KEY).collect::<Vec<_>>(),
            "key {key} handled out of order"
        );
    }
}

async fn redelivered_duplicates_change_nothing<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    for seq in 1..=30 {
        store
            .enqueue_in_tx(&message(&format!("k{}", seq % 5), seq), true)
            .await;
    }
    let recorder = Recorder::default();
    let consumer = Consumer::new("dedupe", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick());
    let stats = consumer.stats();
    let duplicating = Duplicating::new(subscriber(&store), 1.0);
    let injected = duplicating.injected();
    let pipeline = Pipeline::start(&store, consumer, duplicating);
    eventually(WAIT, "every original and every duplicate settled", || async {
        stats.handled() == 30
            && stats.duplicates() == injected.load(Ordering::SeqCst)
            && stats.duplicates() == 30
    })
    .await;
    pipeline.stop().await;
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM test_applied")
            .await,
        30,
        "a duplicate was applied"
    );
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM tidings_processed WHERE consumer = 'dedupe'")
            .await,
        30
    );
}

async fn poison_is_dead_lettered_without_blocking_other_keys<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    store.enqueue_in_tx(&message("bad", 1), true).await;
    for seq in 1..=30 {
        store
            .enqueue_in_tx(&message(&format!("good-{}", seq % 3), seq), true)
            .await;
    }
    let recorder = Recorder {
        poison_key: Some("bad".into()),
        ..Recorder::default()
    };
    let consumer = Consumer::new("poisoned", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick().max_attempts(3));
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(
        WAIT,
        "good events handled and the poison dead-lettered",
        || async { stats.handled() == 30 && stats.dead_lettered() == 1 },
    )
    .await;
    pipeline.stop().await;

    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer("poisoned"))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.aggregate_key.as_deref(), Some("bad"));
    assert_eq!(letter.message_type.as_deref(), Some("TestEvent"));
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.errors.len(), 3, "the whole error history is kept");
    assert!(
        letter
            .errors
            .iter()
            .all(|f| f.class == "transient" && f.error.contains("poisoned key"))
    );
    assert_eq!(
        letter.errors.iter().map(|f| f.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let envelope = cloudevents::from_json(&letter.body).expect("the dead letter keeps the original body");
    assert_eq!(Some(envelope.id), letter.message_id);
    assert_eq!(store.lag().await.unwrap().dead_letters_pending(), 1);
}

async fn log_readers_never_skip_late_commits<S: TestStore>(store: S) {
    // Many writers whose transactions overlap: rows get their sequence
    // numbers at insert and become visible at commit, in another order.
    let is_pg = LogBackendName::of(&store) == "pg-log";
    let (writers, per_writer) = if is_pg { (16, 25) } else { (4, 10) };
    let total = (writers * per_writer) as usize;
    let mut stream = subscriber(&store).subscribe("gap", "gap").await.unwrap();
    let expected: Arc<std::sync::Mutex<HashSet<uuid::Uuid>>> = Arc::default();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            let expected = expected.clone();
            tokio::spawn(async move {
                for i in 0..per_writer {
                    let m = message(&format!("w{w}"), i);
                    expected.lock().unwrap().insert(m.envelope.id);
                    let hold = Duration::from_millis(rand::random::<u64>() % if is_pg { 40 } else { 5 });
                    store
                        .append_raw(
                            "gap",
                            &m.envelope.aggregate_key,
                            cloudevents::to_json(&m.envelope),
                            hold,
                        )
                        .await;
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    while seen.len() < total {
        let d = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "reader stalled after {} of {total}: a late commit was skipped",
                    seen.len()
                )
            })
            .unwrap()
            .unwrap();
        assert!(seen.insert(d.message.decode().unwrap().id), "delivered twice");
        d.ack(AckKind::Ack).await.unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(seen, *expected.lock().unwrap());
}

/// Which log backend a store is (the gap test sizes itself by it).
struct LogBackendName;
impl LogBackendName {
    fn of<S: TestStore>(store: &S) -> &'static str {
        tidings::log::LogBackend::name(store)
    }
}

async fn bad_input_reaches_the_failure_store_with_a_clear_error<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    // One key each: a dead letter holds its key, and this is about what each one says.
    let good = message("k-good", 1);
    let mut unknown = message("k-type", 2).envelope;
    unknown.message_type = "SomethingElse".into();
    let mut future = message("k-version", 3).envelope;
    future.version = 2;
    let mut not_an_event = message("k-payload", 4).envelope;
    not_an_event.payload = br#"{"key": 42}"#.to_vec();
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("malformed envelope", b"{not json".to_vec()),
        (
            "unexpected message type \"SomethingElse\"",
            cloudevents::to_json(&unknown),
        ),
        (
            "TestEvent version 2 is not supported",
            cloudevents::to_json(&future),
        ),
        (
            "invalid TestEvent v1 payload",
            cloudevents::to_json(&not_an_event),
        ),
        ("", cloudevents::to_json(&good.envelope)),
    ];
    for (_, body) in &bodies {
        store.append_raw(TOPIC, "k", body.clone(), Duration::ZERO).await;
    }
    let recorder = Recorder::default();
    let consumer = Consumer::new("strict", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick());
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(
        WAIT,
        "bad input dead-lettered and the good event handled",
        || async { stats.dead_lettered() == 4 && stats.handled() == 1 },
    )
    .await;
    pipeline.stop().await;
    assert_eq!(stats.retries(), 0, "bad input is permanent: no retries");

    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer("strict"))
        .await
        .unwrap();
    assert_eq!(letters.len(), 4);
    for (needle, body) in &bodies[..4] {
        let letter = letters
            .iter()
            .find(|l| &l.body == body)
            .expect("each bad body is stored as received");
        assert_eq!(letter.errors.len(), 1);
        assert_eq!(letter.errors[0].class, "permanent");
        assert!(
            letter.errors[0].error.contains(needle),
            "{:?} should say {needle:?}",
            letter.errors[0].error
        );
    }
    let malformed = letters.iter().find(|l| l.body == bodies[0].1).unwrap();
    assert_eq!(malformed.message_id, None);
}

async fn effects_ledger_reuses_one_key_and_skips_recorded_effects<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    let m = message("pay", 1);
    let id = m.envelope.id;
    store.enqueue_in_tx(&m, true).await;
    let recorder = Recorder {
        effect: true,
        ..Recorder::default()
    };
    recorder.fail_after_effect_once.store(true, Ordering::SeqCst);
    let consumer = Consumer::new("payments", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick());
    let stats = consumer.stats();
    // Every delivery comes twice: the second must not reach the provider.
    let pipeline = Pipeline::start(&store, consumer, Duplicating::new(subscriber(&store), 1.0));
    eventually(WAIT, "handled once and the duplicate suppressed", || async {
        stats.handled() == 1 && stats.duplicates() == 1
    })
    .await;
    pipeline.stop().await;

    let expected = IdempotencyKey::derive("payments", id, "charge");
    let keys = recorder.effect_keys.lock().unwrap().clone();
    // Attempt 1 called the provider, then failed before commit: attempt 2
    // calls it again with the same key (the written rule); the duplicate
    // delivery finds the effect recorded and does not call at all.
    assert_eq!(
        keys,
        vec![expected.as_str().to_owned(), expected.as_str().to_owned()]
    );
    assert_eq!(stats.retries(), 1);
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM tidings_effects WHERE consumer = 'payments'")
            .await,
        1
    );
}

async fn a_handler_past_its_timeout_is_rolled_back_and_retried<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    store.enqueue_in_tx(&message("slow", 1), true).await;
    for seq in 1..=10 {
        store.enqueue_in_tx(&message("fast", seq), true).await;
    }
    let recorder = Recorder {
        slow_key: Some("slow".into()),
        ..Recorder::default()
    };
    let config = quick()
        .handler_timeout(Duration::from_millis(100))
        .max_attempts(2);
    let consumer = Consumer::new("impatient", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(config);
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(
        WAIT,
        "the slow message dead-lettered, the others handled",
        || async { stats.handled() == 10 && stats.dead_lettered() == 1 },
    )
    .await;
    pipeline.stop().await;
    assert_eq!(stats.retries(), 1);
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer("impatient"))
        .await
        .unwrap();
    assert_eq!(letters[0].errors.len(), 2);
    assert!(
        letters[0]
            .errors
            .iter()
            .all(|f| f.class == "transient" && f.error.contains("timed out after 100ms"))
    );
    // The timed-out attempts wrote nothing: their transactions were rolled back.
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM test_applied WHERE k = 'slow'")
            .await,
        0
    );
}

async fn retention_keeps_sent_rows_until_cleanup<S: TestStore>(store: S) {
    let store = store.with_retention(Duration::ZERO);
    for seq in 1..=5 {
        store.enqueue_in_tx(&message("r", seq), true).await;
    }
    let relay = relay(&store);
    assert_eq!(relay.round().await.unwrap(), tidings::relay::Round::Published(5));
    assert_eq!(
        relay.round().await.unwrap(),
        tidings::relay::Round::Idle,
        "sent rows are not claimed again"
    );
    assert_eq!(store.lag().await.unwrap().outbox_pending, 0);
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM tidings_outbox")
            .await,
        5,
        "kept for retention"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.cleanup().await.unwrap(), 5);
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM tidings_outbox")
            .await,
        0
    );
}

async fn log_retention_keeps_what_a_group_has_not_read<S: TestStore>(store: S) {
    let publisher = LogPublisher::new(std::sync::Arc::new(store.clone()));
    // Two keys in different partitions of two.
    let other = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| Partition::of(k, 2) != Partition::of("a", 2))
        .unwrap();
    let batch: Vec<_> = (1..=6)
        .map(|seq| message(if seq % 2 == 0 { "a" } else { &other }, seq))
        .collect();
    publisher.publish(&batch).await.unwrap();
    let unread = tidings::OutgoingMessage {
        topic: "nobody-reads".into(),
        ..message("c", 7)
    };
    publisher.publish(std::slice::from_ref(&unread)).await.unwrap();
    // Readable once no earlier transaction (of any test) can still commit before them.
    let deadline = std::time::Instant::now() + WAIT;
    let entries = loop {
        let entries = store
            .read(TOPIC, Partition::WHOLE, Default::default(), 100)
            .await
            .unwrap();
        if entries.len() == 6 || std::time::Instant::now() > deadline {
            break entries;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(entries.len(), 6);
    // One group has read the first three (one offset over the whole topic);
    // another reads in two partitions and has read nothing of its partition 1.
    store
        .commit_offset("reader", TOPIC, Partition::WHOLE, entries[2].at)
        .await
        .unwrap();
    let total = || store.count("SELECT CAST(count(*) AS BIGINT) FROM tidings_log");
    assert_eq!(total().await, 7);
    assert_eq!(
        store.trim(Duration::from_secs(3600), 100).await.unwrap(),
        0,
        "nothing is older than the retention"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store.trim(Duration::from_millis(10), 2).await.unwrap(),
        2,
        "at most the limit"
    );
    assert_eq!(store.trim(Duration::from_millis(10), 100).await.unwrap(), 2);
    assert_eq!(total().await, 3, "the entries the group has not read stay");
    let left = store
        .read(TOPIC, Partition::WHOLE, Default::default(), 100)
        .await
        .unwrap();
    assert_eq!(
        left.iter().map(|e| e.at).collect::<Vec<_>>(),
        entries[3..].iter().map(|e| e.at).collect::<Vec<_>>()
    );
    // A group in two partitions holds the entries of the partition it has not read past.
    let p0 = Partition::new(0, 2);
    let mine: Vec<_> = left
        .iter()
        .filter(|e| p0.contains(e.message.key.as_deref().unwrap_or("")))
        .collect();
    store
        .commit_offset("split", TOPIC, p0, mine.last().map_or(entries[2].at, |e| e.at))
        .await
        .unwrap();
    store
        .commit_offset("split", TOPIC, Partition::new(1, 2), entries[0].at)
        .await
        .unwrap();
    store
        .commit_offset("reader", TOPIC, Partition::WHOLE, entries[5].at)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.trim(Duration::from_millis(10), 100).await.unwrap();
    let kept = store
        .read(TOPIC, Partition::WHOLE, Default::default(), 100)
        .await
        .unwrap();
    let expected: Vec<_> = left
        .iter()
        .filter(|e| !p0.contains(e.message.key.as_deref().unwrap_or("")))
        .map(|e| e.at)
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(kept.iter().map(|e| e.at).collect::<Vec<_>>(), expected);
}

#[test]
fn envelope_of_a_command_keeps_its_kind() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct ShipOrder {
        order_id: String,
    }
    impl tidings::Message for ShipOrder {
        const TYPE: &'static str = "ShipOrder";
        const VERSION: u32 = 1;
        const KIND: Kind = Kind::Command;
        const AGGREGATE: &'static str = "order";
        const TOPIC: &'static str = "shipping.commands";
        fn key(&self) -> String {
            self.order_id.clone()
        }
    }
    let e = Envelope::new(
        "checkout",
        &ShipOrder {
            order_id: "o1".into(),
        },
    )
    .unwrap();
    let back = cloudevents::from_json(&cloudevents::to_json(&e)).unwrap();
    assert_eq!(back.kind, Kind::Command);
    assert_eq!(back, e);
}

/// A publisher that takes its time, to catch the relay mid-publish.
#[derive(Debug, Clone)]
struct SlowPublisher<P>(P, Duration);

#[async_trait::async_trait]
impl<P: tidings::Publisher> tidings::Publisher for SlowPublisher<P> {
    async fn publish(&self, batch: &[tidings::OutgoingMessage]) -> tidings::Result<()> {
        tokio::time::sleep(self.1).await;
        self.0.publish(batch).await
    }
}

on_both_databases!(
    shutdown_finishes_the_batch_being_published,
    a_redriven_dead_letter_is_handled_once
);

async fn a_redriven_dead_letter_is_handled_once<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    store.enqueue_in_tx(&message("bad", 1), true).await;
    store.enqueue_in_tx(&message("good", 1), true).await;
    let recorder = Recorder {
        poison_key: Some("bad".into()),
        ..Recorder::default()
    };
    let consumer = Consumer::new("fixable", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick().max_attempts(2));
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "the poison dead-lettered", || async {
        stats.dead_lettered() == 1 && stats.handled() == 1
    })
    .await;

    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer("fixable"))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    recorder.healed.store(true, Ordering::SeqCst);
    let outcome = store.redrive(letters[0].id).await.unwrap();
    assert!(
        matches!(outcome, tidings::Redrive::Enqueued { redrive: 1, .. }),
        "{outcome:?}"
    );
    eventually(WAIT, "the redriven message handled", || async {
        stats.handled() == 2
    })
    .await;
    pipeline.stop().await;
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM test_applied WHERE k = 'bad'")
            .await,
        1,
        "handled exactly once"
    );
    assert!(
        store
            .dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "no longer pending"
    );
    let history = store
        .dead_letters(&DeadLetterFilter::default().include_redriven())
        .await
        .unwrap();
    assert_eq!(history[0].redrives, 1);
    assert_eq!(
        history[0].errors.len(),
        2,
        "the history of the failed attempts stays"
    );
}

async fn shutdown_finishes_the_batch_being_published<S: TestStore>(store: S) {
    for seq in 1..=3 {
        store.enqueue_in_tx(&message("s", seq), true).await;
    }
    let publisher = SlowPublisher(
        LogPublisher::new(Arc::new(store.clone())),
        Duration::from_millis(300),
    );
    let relay = Relay::new(store.clone(), publisher);
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel(); // while the batch is being published
    task.await.unwrap().unwrap();
    assert_eq!(
        stats.published(),
        3,
        "the batch in flight is finished, not abandoned"
    );
    assert_eq!(store.lag().await.unwrap().outbox_pending, 0);
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM tidings_log")
            .await,
        3
    );
}

/// A producer in one process wakes a relay in another through NOTIFY,
/// sent after commit: the relay publishes long before its polling interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wakes_relays_in_other_processes_after_commit() {
    let db = tidings_testkit::services::PgTestDb::new().await;
    // A second pool on the same schema stands for the producing process.
    let producer = tidings_store_postgres::PgStore::connect(&db.url).await.unwrap();
    let relay = Relay::new(db.store.clone(), db.store.log_publisher())
        .config(RelayConfig::default().poll_interval(Duration::from_secs(60)));
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    // Let the relay go idle (and start listening).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = tokio::time::Instant::now();
    producer.enqueue_in_tx(&message("w", 1), true).await;
    eventually(Duration::from_secs(5), "the woken relay to publish", || async {
        stats.published() == 1
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    stop.cancel();
    task.await.unwrap().unwrap();
    producer.pool().close().await;
    db.drop_schema().await;
}

on_both_databases!(
    a_dead_letter_holds_its_key_until_redriven,
    a_skipped_dead_letter_lets_its_key_go_on,
    a_consumer_may_continue_past_a_dead_letter,
);

/// Handled (key, seq) of `key`, in handling order.
fn seen_of(recorder: &Recorder, key: &str) -> Vec<i64> {
    recorder
        .seen()
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, seq)| seq)
        .collect()
}

/// `bad` 1..=n fails until healed; `good-*` 1..=12 succeed.
async fn poisoned_key<S: TestStore>(store: &S, bad: i64) -> Recorder {
    for seq in 1..=12 {
        if seq <= bad {
            store.enqueue_in_tx(&message("bad", seq), true).await;
        }
        store
            .enqueue_in_tx(&message(&format!("good-{}", seq % 3), seq), true)
            .await;
    }
    Recorder {
        poison_key: Some("bad".into()),
        ..Recorder::default()
    }
}

async fn a_dead_letter_holds_its_key_until_redriven<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    let recorder = poisoned_key(&store, 4).await;
    let consumer = Consumer::new("holding", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick().max_attempts(2));
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(
        WAIT,
        "good keys handled, bad:1 dead-lettered, bad:2..4 parked",
        || async { stats.handled() == 12 && stats.dead_lettered() == 1 && stats.parked() == 3 },
    )
    .await;
    assert_eq!(
        recorder.calls.load(Ordering::SeqCst),
        12 + 2,
        "parked messages never reach the handler"
    );
    let parked = store.lag().await.unwrap().parked;
    assert_eq!(
        parked,
        vec![tidings::ParkedLag {
            consumer: "holding".into(),
            topic: TOPIC.into(),
            held_keys: 1,
            messages: 3
        }]
    );

    // A message of the held key arriving now waits behind the others.
    store.enqueue_in_tx(&message("bad", 5), true).await;
    eventually(WAIT, "bad:5 parked", || async { stats.parked() == 4 }).await;

    recorder.healed.store(true, Ordering::SeqCst);
    let letter = store
        .dead_letters(&DeadLetterFilter::default().consumer("holding"))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(letter.aggregate_key.as_deref(), Some("bad"));
    store.redrive(letter.id).await.unwrap();
    eventually(
        WAIT,
        "the redriven message and the parked ones handled",
        || async { stats.handled() == 12 + 5 },
    )
    .await;
    assert_eq!(
        seen_of(&recorder, "bad"),
        vec![1, 2, 3, 4, 5],
        "released in order"
    );
    // The lane deletes the hold right after handling the last parked
    // message (atomically with checking nothing is parked behind it).
    eventually(WAIT, "the hold on bad released", || async {
        store.lag().await.unwrap().parked.is_empty()
    })
    .await;

    // The key is free again: its next message is handled at once.
    store.enqueue_in_tx(&message("bad", 6), true).await;
    eventually(WAIT, "bad:6 handled", || async { stats.handled() == 12 + 6 }).await;
    pipeline.stop().await;
    assert_eq!(seen_of(&recorder, "bad"), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(stats.parked(), 4);
}

async fn a_skipped_dead_letter_lets_its_key_go_on<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    let recorder = poisoned_key(&store, 3).await;
    let consumer = Consumer::new("skipping", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick().max_attempts(2));
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "bad:1 dead-lettered, bad:2..3 parked", || async {
        stats.handled() == 12 && stats.dead_lettered() == 1 && stats.parked() == 2
    })
    .await;
    let letter = store
        .dead_letters(&DeadLetterFilter::default().consumer("skipping"))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        store.purge(&[letter.id]).await.unwrap(),
        0,
        "a pending dead letter is not purged"
    );
    // The fix ships, but bad:1 is given up for good.
    recorder.healed.store(true, Ordering::SeqCst);
    assert_eq!(
        store.skip(letter.id).await.unwrap(),
        tidings::Skip::Skipped { released_key: true }
    );
    assert_eq!(
        store.skip(uuid::Uuid::now_v7()).await.unwrap(),
        tidings::Skip::NotFound
    );
    eventually(WAIT, "the parked messages handled without bad:1", || async {
        stats.handled() == 12 + 2
    })
    .await;
    store.enqueue_in_tx(&message("bad", 4), true).await;
    eventually(WAIT, "bad:4 handled", || async { stats.handled() == 12 + 3 }).await;
    pipeline.stop().await;
    assert_eq!(seen_of(&recorder, "bad"), vec![2, 3, 4]);
    assert!(
        store
            .dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "a skipped dead letter is no longer pending"
    );
    let all = store
        .dead_letters(&DeadLetterFilter::default().include_redriven())
        .await
        .unwrap();
    assert!(all[0].skipped_at.is_some());
    assert!(store.lag().await.unwrap().parked.is_empty());
    assert_eq!(
        store.purge(&[all[0].id, uuid::Uuid::now_v7()]).await.unwrap(),
        1,
        "a settled dead letter is purged, an unknown id ignored"
    );
    assert!(
        store
            .dead_letters(&DeadLetterFilter::default().include_redriven())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_consumer_may_continue_past_a_dead_letter<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    let recorder = poisoned_key(&store, 3).await;
    let consumer = Consumer::new("independent", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(
            quick()
                .max_attempts(2)
                .on_dead_letter(tidings::consumer::OnDeadLetter::Continue),
        );
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "every bad message tried and dead-lettered", || async {
        stats.handled() == 12 && stats.dead_lettered() == 3
    })
    .await;
    pipeline.stop().await;
    assert_eq!(stats.parked(), 0);
    assert!(store.lag().await.unwrap().parked.is_empty());
}

on_both_databases!(
    batches_handle_each_message_once_in_key_order,
    a_failing_batch_falls_back_to_one_message_at_a_time,
);

const BATCH_KEYS: usize = 5;
const BATCH_PER_KEY: i64 = 60;

/// A backlog of `BATCH_KEYS` keys, interleaved, plus `bad` messages at `bad`.
async fn backlog<S: TestStore>(store: &S, bad: &[i64]) {
    for seq in 1..=BATCH_PER_KEY {
        for k in 0..BATCH_KEYS {
            store
                .enqueue_in_tx(&message(&format!("key-{k}"), seq), true)
                .await;
        }
        if bad.contains(&seq) {
            store.enqueue_in_tx(&message("bad", seq), true).await;
        }
    }
}

/// Batches ([`ConsumerConfig::batch`]) over a backlog delivered twice:
/// every message handled once, in key order, with fewer commits than messages.
async fn batches_handle_each_message_once_in_key_order<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    backlog(&store, &[]).await;
    let recorder = Recorder {
        check_order: true,
        ..Recorder::default()
    };
    let consumer = Consumer::new("batched", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick().lanes(2).batch(32));
    let stats = consumer.stats();
    let duplicating = Duplicating::new(subscriber(&store), 1.0);
    let injected = duplicating.injected();
    let pipeline = Pipeline::start(&store, consumer, duplicating);
    let total = BATCH_KEYS as u64 * BATCH_PER_KEY as u64;
    eventually(WAIT, "every event and every duplicate settled", || async {
        stats.handled() == total && stats.duplicates() == injected.load(Ordering::SeqCst)
    })
    .await;
    pipeline.stop().await;
    assert_eq!(stats.duplicates(), total);
    assert!(
        stats.transactions() < total / 4,
        "{} transactions for {total} messages: not batched",
        stats.transactions()
    );
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM test_applied WHERE consumer = 'batched'")
            .await,
        total as i64,
        "a duplicate was applied"
    );
    assert_eq!(
        recorder.calls.load(Ordering::SeqCst),
        total,
        "a duplicate reached the handler"
    );
    for k in 0..BATCH_KEYS {
        assert_eq!(
            seen_of(&recorder, &format!("key-{k}")),
            (1..=BATCH_PER_KEY).collect::<Vec<_>>(),
            "key-{k} handled out of order"
        );
    }
}

/// A handler failing inside a batch rolls the batch back; its messages are
/// handled one at a time: the poison gets its full attempts and holds its
/// key, the others commit once, in order.
async fn a_failing_batch_falls_back_to_one_message_at_a_time<S: TestStore>(store: S)
where
    Recorder: Handler<S::Database>,
{
    backlog(&store, &[20, 21]).await;
    let recorder = Recorder {
        poison_key: Some("bad".into()),
        check_order: true,
        ..Recorder::default()
    };
    let consumer = Consumer::new("batched-poison", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick().lanes(2).batch(32).max_attempts(2));
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    let total = BATCH_KEYS as u64 * BATCH_PER_KEY as u64;
    eventually(
        WAIT,
        "every event handled, bad:20 dead-lettered, bad:21 parked",
        || async { stats.handled() == total && stats.dead_lettered() == 1 && stats.parked() == 1 },
    )
    .await;
    pipeline.stop().await;
    assert!(
        stats.transactions() < total / 4,
        "{} transactions: not batched",
        stats.transactions()
    );
    assert_eq!(
        store
            .count("SELECT CAST(count(*) AS BIGINT) FROM test_applied WHERE consumer = 'batched-poison'")
            .await,
        total as i64,
        "a rolled-back batch left writes, or a message was applied twice"
    );
    // Each commit was checked in order by the handler (else more dead letters).
    assert!(seen_of(&recorder, "bad").is_empty());
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer("batched-poison"))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        letters[0].message_id.map(|_| letters[0].attempts),
        Some(2),
        "the fallback gives the poison its full attempts"
    );
}

/// Version 1 of a customer event: one `name`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct CustomerRegisteredV1 {
    customer_id: String,
    name: String,
}

impl tidings::Message for CustomerRegisteredV1 {
    const TYPE: &'static str = "CustomerRegistered";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "customer";
    const TOPIC: &'static str = TOPIC;
    fn key(&self) -> String {
        self.customer_id.clone()
    }
}

/// Version 2 split the name; its upcaster reads version 1.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct CustomerRegistered {
    customer_id: String,
    first_name: String,
    last_name: String,
}

impl tidings::Message for CustomerRegistered {
    const TYPE: &'static str = "CustomerRegistered";
    const VERSION: u32 = 2;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "customer";
    // A breaking change gets a topic of its own (see the dual-publishing test).
    const TOPIC: &'static str = "test.events.v2";
    fn key(&self) -> String {
        self.customer_id.clone()
    }

    fn upcast(version: u32, mut payload: serde_json::Value) -> Result<serde_json::Value, String> {
        match version {
            1 => {
                let name = payload["name"]
                    .as_str()
                    .ok_or("a v1 payload without a name")?
                    .to_owned();
                let (first, last) = name.split_once(' ').unwrap_or((&name, ""));
                payload["first_name"] = first.into();
                payload["last_name"] = last.into();
                Ok(payload)
            }
            _ => Err(format!("no upcaster from version {version}")),
        }
    }
}

impl tidings::transition::Transition for CustomerRegistered {
    type Previous = CustomerRegisteredV1;
    fn previous(&self) -> CustomerRegisteredV1 {
        CustomerRegisteredV1 {
            customer_id: self.customer_id.clone(),
            name: format!("{} {}", self.first_name, self.last_name),
        }
    }
}

/// A consumer written against one version, `M`.
#[derive(Debug)]
struct Reads<M> {
    seen: Arc<std::sync::Mutex<Vec<M>>>,
}

impl<M> Clone for Reads<M> {
    fn clone(&self) -> Self {
        Reads {
            seen: self.seen.clone(),
        }
    }
}

impl<M> Default for Reads<M> {
    fn default() -> Self {
        Reads { seen: Arc::default() }
    }
}

#[async_trait::async_trait]
impl<DB: sqlx::Database, M: tidings::Message + std::fmt::Debug> Handler<DB> for Reads<M> {
    async fn handle(
        &self,
        ctx: &mut tidings::consumer::Context<'_, DB>,
    ) -> Result<(), tidings::consumer::HandlerError> {
        let event: M = ctx.decode()?;
        self.seen.lock().unwrap().push(event);
        Ok(())
    }
}

type ReadsV2 = Reads<CustomerRegistered>;

async fn dual_publishing_feeds_each_version_once<S: TestStore>(store: S) {
    use tidings::transition::{DUAL_OF_HEADER, DualPublish, outgoing};
    let registration = |n: u32| CustomerRegistered {
        customer_id: format!("c-{n}"),
        first_name: "Ada".into(),
        last_name: format!("Lovelace {n}"),
    };
    // During the transition: both versions, in one transaction.
    let dual = DualPublish::new().during::<CustomerRegistered>();
    for n in 1..=3 {
        let out = outgoing("crm", &registration(n), &dual).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[1].envelope.headers[DUAL_OF_HEADER],
            out[0].envelope.id.to_string()
        );
        assert_eq!(out[1].envelope.correlation_id, out[0].envelope.correlation_id);
        store.enqueue_all(&out).await;
    }
    // Transition over: the new version only.
    let out = outgoing("crm", &registration(4), &DualPublish::parse("").unwrap()).unwrap();
    assert_eq!(out.len(), 1);
    store.enqueue_in_tx(&out[0], true).await;

    let (legacy, modern) = (Reads::<CustomerRegisteredV1>::default(), ReadsV2::default());
    let old_consumer = Consumer::new("crm-legacy", store.clone(), legacy.clone())
        .topic(<CustomerRegisteredV1 as tidings::Message>::TOPIC)
        .config(quick());
    let new_consumer = Consumer::new("crm-modern", store.clone(), modern.clone())
        .topic(<CustomerRegistered as tidings::Message>::TOPIC)
        .config(quick());
    let (old_stats, new_stats) = (old_consumer.stats(), new_consumer.stats());
    let pipeline = Pipeline::start(&store, new_consumer, subscriber(&store));
    let old_task = tokio::spawn({
        let (stop, subscriber) = (pipeline.stop.clone(), subscriber(&store));
        async move { old_consumer.run(&subscriber, stop).await.unwrap() }
    });
    eventually(WAIT, "each version's consumer handled its copies", || async {
        old_stats.handled() == 3 && new_stats.handled() == 4
    })
    .await;
    // Nothing more arrives for either.
    tokio::time::sleep(Duration::from_millis(300)).await;
    pipeline.stop().await;
    old_task.await.unwrap();

    let mut old_seen: Vec<String> = legacy
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    old_seen.sort();
    assert_eq!(old_seen, ["Ada Lovelace 1", "Ada Lovelace 2", "Ada Lovelace 3"]);
    let mut new_seen: Vec<String> = modern
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.customer_id.clone())
        .collect();
    new_seen.sort();
    assert_eq!(new_seen, ["c-1", "c-2", "c-3", "c-4"]);
    assert_eq!((old_stats.dead_lettered(), new_stats.dead_lettered()), (0, 0));
    assert_eq!(
        (old_stats.handled(), new_stats.handled()),
        (3, 4),
        "each copy handled once"
    );
}

async fn an_older_version_is_upcast_and_an_unreadable_one_dead_lettered<S: TestStore>(store: S) {
    let out = |envelope: Envelope| tidings::OutgoingMessage {
        topic: TOPIC.to_owned(),
        envelope,
    };
    let v1 = Envelope::new(
        "crm",
        &CustomerRegisteredV1 {
            customer_id: "c-1".into(),
            name: "Ada Lovelace".into(),
        },
    )
    .unwrap();
    // Version 2 from a newer producer that already added a field: tolerated.
    let mut v2 = Envelope::new(
        "crm",
        &CustomerRegistered {
            customer_id: "c-2".into(),
            first_name: "Grace".into(),
            last_name: "Hopper".into(),
        },
    )
    .unwrap();
    v2.payload = br#"{"customer_id":"c-2","first_name":"Grace","last_name":"Hopper","tier":"gold"}"#.to_vec();
    // A version this consumer cannot read yet, and a v1 its upcaster refuses.
    let mut v3 = Envelope::new(
        "crm",
        &CustomerRegistered {
            customer_id: "c-3".into(),
            first_name: "Edsger".into(),
            last_name: "Dijkstra".into(),
        },
    )
    .unwrap();
    v3.version = 3;
    let mut nameless = Envelope::new(
        "crm",
        &CustomerRegisteredV1 {
            customer_id: "c-4".into(),
            name: String::new(),
        },
    )
    .unwrap();
    nameless.payload = br#"{"customer_id":"c-4"}"#.to_vec();
    for envelope in [v1, v2, v3.clone(), nameless.clone()] {
        store.enqueue_in_tx(&out(envelope), true).await;
    }

    let reader = ReadsV2::default();
    let consumer = Consumer::new("crm-v2", store.clone(), reader.clone())
        .topic(TOPIC)
        .config(quick());
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "two handled and two dead-lettered", || async {
        stats.handled() == 2 && stats.dead_lettered() == 2
    })
    .await;
    pipeline.stop().await;

    let mut seen = reader.seen.lock().unwrap().clone();
    seen.sort_by(|a, b| a.customer_id.cmp(&b.customer_id));
    assert_eq!(
        seen,
        vec![
            CustomerRegistered {
                customer_id: "c-1".into(),
                first_name: "Ada".into(),
                last_name: "Lovelace".into(),
            },
            CustomerRegistered {
                customer_id: "c-2".into(),
                first_name: "Grace".into(),
                last_name: "Hopper".into(),
            },
        ],
        "v1 upcast to v2, v2 with an unknown field read as is"
    );
    assert_eq!(stats.retries(), 0, "an unreadable version is permanent");
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer("crm-v2"))
        .await
        .unwrap();
    let error_of = |id| {
        letters
            .iter()
            .find(|l| l.message_id == Some(id))
            .map(|l| l.errors[0].error.clone())
            .expect("dead-lettered")
    };
    assert!(
        error_of(v3.id).contains("CustomerRegistered version 3 is not supported (this code reads version 2)"),
        "{}",
        error_of(v3.id)
    );
    assert!(
        error_of(nameless.id).contains(
            "CustomerRegistered version 1 could not be upcast to version 2: a v1 payload without a name"
        ),
        "{}",
        error_of(nameless.id)
    );
}
