//! The consumer runtime over the store: per-key order with parallel lanes,
//! redelivered duplicates, the effects ledger, handler timeouts, batches.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tidings_consumer::{Consumer, IdempotencyKey};
use tidings_core::{Backoff, DeadLetterFilter, FailureStore, LagSource};
use tidings_sql::{Dialect, SqlStore};

use super::fixtures::{
    Pipeline, Recorder, StoreExt, TOPIC, eventually, message, quick, seen_of, setup, subscriber,
};
use crate::faults::Duplicating;
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(30);

/// Producers commit interleaved keys while four lanes handle them: each key's
/// events are handled in commit order, and the group's offset is stored on shutdown.
pub async fn per_key_order_holds_with_parallel_lanes<T: TestDb>(db: &T) {
    let store = setup(db).await;
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

/// Every delivery comes twice: each duplicate is recognised, none is applied.
pub async fn redelivered_duplicates_change_nothing<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
        store.count("SELECT count(*) FROM test_applied").await,
        30,
        "a duplicate was applied"
    );
    assert_eq!(
        store
            .count("SELECT count(*) FROM tidings_processed WHERE consumer = 'dedupe'")
            .await,
        30
    );
    assert_eq!(
        store.count("SELECT count(*) FROM tidings_handlings").await,
        0,
        "redeliveries are counted while handled, and forgotten once settled"
    );
}

/// The crash-loop guard's count: each handling begun is counted, in a
/// transaction of its own, until one ends; consumers count apart.
pub async fn crashed_handlings_are_counted_until_one_ends<T: TestDb>(db: &T) {
    use tidings_core::ConsumerStore;
    let store = setup(db).await;
    let id = uuid::Uuid::now_v7();
    for crashed in 0..3 {
        assert_eq!(store.handling_started("fragile", id).await.unwrap(), crashed);
    }
    assert_eq!(store.handling_started("other", id).await.unwrap(), 0);
    store.handling_ended("fragile", id).await.unwrap();
    assert_eq!(store.handling_started("fragile", id).await.unwrap(), 0);
    assert_eq!(store.handling_started("other", id).await.unwrap(), 1);
}

/// An effect retried after a failure before commit reuses its idempotency key;
/// a duplicate delivery finds it recorded and does not call the provider.
pub async fn effects_ledger_reuses_one_key_and_skips_recorded_effects<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
            .count("SELECT count(*) FROM tidings_effects WHERE consumer = 'payments'")
            .await,
        1
    );
}

/// A handler past its timeout is rolled back, retried, then dead-lettered,
/// without holding up other keys.
pub async fn a_handler_past_its_timeout_is_rolled_back_and_retried<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
            .count("SELECT count(*) FROM test_applied WHERE k = 'slow'")
            .await,
        0
    );
}

/// A lane stuck where no timeout of the handler reaches it (here a
/// transport whose acknowledgement never returns) does not keep its session
/// from ending: a handler timeout and a lease after the stop it is
/// abandoned, and its message, never acknowledged, is read again by the
/// next session.
pub async fn a_lane_stuck_in_the_transport_does_not_hold_its_session<T: TestDb>(db: &T) {
    let store = setup(db).await;
    store.enqueue_in_tx(&message("stuck", 1), true).await;
    let config = quick()
        .handler_timeout(Duration::from_millis(200))
        .lease_ttl(Duration::from_millis(500));
    let consumer = Consumer::new("stuck", store.clone(), Recorder::default())
        .topic(TOPIC)
        .config(config.clone());
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, NeverAcknowledged(subscriber(&store)));
    eventually(WAIT, "the message handled", || async { stats.handled() == 1 }).await;
    tokio::time::timeout(WAIT, pipeline.stop())
        .await
        .expect("the consumer stopped although a lane was stuck acknowledging");

    // Never acknowledged: the next session reads it again, and its marker
    // keeps it from being handled twice.
    let consumer = Consumer::new("stuck", store.clone(), Recorder::default())
        .topic(TOPIC)
        .config(config);
    let again = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "the message read again and found handled", || async {
        again.duplicates() == 1
    })
    .await;
    pipeline.stop().await;
    assert_eq!(again.handled(), 0);
}

/// A session stopping (a hand-over, a shutdown) while a key's message waits
/// for its next attempt gives that message back, and the key's later
/// messages this member holds with it: none is handled before it, although
/// the member's lease would still let it commit. The next session handles
/// the key in order.
pub async fn a_stop_during_a_retry_gives_back_the_rest_of_its_key<T: TestDb>(db: &T) {
    let store = setup(db).await;
    for seq in 1..=3 {
        store.enqueue_in_tx(&message("k", seq), true).await;
    }
    let recorder = Recorder {
        first_fails: Some("k".into()),
        check_order: true,
        ..Recorder::default()
    };
    // One lane taking the key's three messages at once; a long pause
    // before the next attempt, cut short by the stop.
    let config = quick()
        .lanes(1)
        .batch(32)
        .max_attempts(100)
        .backoff(Backoff::new(Duration::from_secs(30), Duration::from_secs(30)));
    let consumer = Consumer::new("stopped", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(config);
    let stats = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "k:1 failed and waits for its next attempt", || async {
        stats.failed() >= 1
    })
    .await;
    pipeline.stop().await;
    // An attempt of k:2 before k:1 would have failed the order check and
    // dead-lettered it.
    assert_eq!(
        (seen_of(&recorder, "k"), stats.dead_lettered(), stats.parked()),
        (Vec::<i64>::new(), 0, 0),
        "a later message of the key was attempted while its first was given back"
    );

    recorder.healed.store(true, Ordering::SeqCst);
    let consumer = Consumer::new("stopped", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(quick());
    let again = consumer.stats();
    let pipeline = Pipeline::start(&store, consumer, subscriber(&store));
    eventually(WAIT, "the key handled by the next session", || async {
        again.handled() == 3
    })
    .await;
    pipeline.stop().await;
    assert_eq!(seen_of(&recorder, "k"), vec![1, 2, 3]);
    assert_eq!(again.dead_lettered(), 0);
}

/// `S`, whose deliveries' acknowledgements never return.
struct NeverAcknowledged<S>(S);

struct Hangs;

#[async_trait::async_trait]
impl tidings_core::Acker for Hangs {
    async fn ack(&self, _: tidings_core::AckKind) -> tidings_core::Result<()> {
        std::future::pending().await
    }
}

#[async_trait::async_trait]
impl<S: tidings_core::Subscriber> tidings_core::Subscriber for NeverAcknowledged<S> {
    fn partitions(&self, topic: &str) -> u32 {
        self.0.partitions(topic)
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: tidings_core::Partition,
    ) -> tidings_core::Result<tidings_core::Subscription> {
        use futures::StreamExt;
        let inner = self.0.subscribe_partition(group, topic, partition).await?;
        Ok(tidings_core::Subscription::new(inner.map(|d| {
            d.map(|d| tidings_core::Delivery::new(d.message.clone(), d.delivery_count, Hangs))
        })))
    }
}

const BATCH_KEYS: usize = 5;
const BATCH_PER_KEY: i64 = 60;

/// A backlog of `BATCH_KEYS` keys, interleaved, plus `bad` messages at `bad`.
async fn backlog<D: Dialect>(store: &SqlStore<D>, bad: &[i64]) {
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
pub async fn batches_handle_each_message_once_in_key_order<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
    // Every message comes twice, and a redelivery is handled on its own
    // (its handling is counted for the crash-loop guard), between batches:
    // without batching there would be a commit per message.
    assert!(
        stats.transactions() < total / 2,
        "{} transactions for {total} messages: not batched",
        stats.transactions()
    );
    assert_eq!(
        store
            .count("SELECT count(*) FROM test_applied WHERE consumer = 'batched'")
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
pub async fn a_failing_batch_falls_back_to_one_message_at_a_time<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
            .count("SELECT count(*) FROM test_applied WHERE consumer = 'batched-poison'")
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

/// The dedupe retention: markers older than it are deleted in bounded
/// steps, newer ones stay, and the horizon says from when on a replay
/// would meet no marker.
pub async fn markers_past_the_dedupe_retention_are_forgotten_in_steps<T: TestDb>(db: &T) {
    use tidings_core::ConsumerStore;
    let store = setup(db).await;
    assert_eq!(store.dedupe_horizon().await.unwrap(), None, "nothing deleted yet");
    let mark = |id: uuid::Uuid| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            assert!(store.mark_processed(&mut *tx, "ledger", id).await.unwrap());
            store
                .record_effect(&mut *tx, "ledger", id, "charge", "key")
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    };
    let (old, newer) = ([uuid::Uuid::now_v7(), uuid::Uuid::now_v7()], uuid::Uuid::now_v7());
    for id in old {
        mark(id).await;
    }
    // Wide margins: tests in parallel may hold the machine for a moment.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    mark(newer).await;
    let before = chrono::Utc::now();
    let retention = Duration::from_millis(2000);
    // One marker and one effect per step; then nothing is left to delete.
    assert_eq!(store.forget_processed(retention, 1).await.unwrap(), 2);
    assert_eq!(store.forget_processed(retention, 1).await.unwrap(), 2);
    assert_eq!(store.forget_processed(retention, 1).await.unwrap(), 0);
    assert_eq!(store.count("SELECT count(*) FROM tidings_processed").await, 1);
    assert_eq!(store.count("SELECT count(*) FROM tidings_effects").await, 1);
    let horizon = store
        .dedupe_horizon()
        .await
        .unwrap()
        .expect("a horizon once markers went");
    let (low, high) = (before - retention * 2, chrono::Utc::now());
    assert!(
        low < horizon && horizon <= high,
        "horizon {horizon} not within {low}..{high}"
    );
    // The horizon never moves back.
    store
        .forget_processed(Duration::from_secs(86_400), 1)
        .await
        .unwrap();
    assert_eq!(store.dedupe_horizon().await.unwrap(), Some(horizon));
}
