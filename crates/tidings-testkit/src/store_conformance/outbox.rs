//! The outbox and one relay: atomicity with the business transaction,
//! retries until the transport confirms, retention and cleanup, shutdown
//! mid-publish; and the database log: readers never skip a late commit,
//! trimming keeps what a group has not read.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tidings_core::log::LogBackend;
use tidings_core::{AckKind, Backoff, LagSource, Partition, Publisher, RelayStore, Subscriber, cloudevents};
use tidings_log::LogPublisher;
use tidings_relay::{Relay, RelayConfig};
use tokio_util::sync::CancellationToken;

use super::fixtures::{StoreExt, TOPIC, TestEvent, eventually, message, relay, setup, subscriber};
use crate::faults::Switchable;
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(30);

/// An enqueued message exists if and only if its transaction commits.
pub async fn outbox_is_atomic_with_the_business_transaction<T: TestDb>(db: &T) {
    let store = setup(db).await;
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

/// An event larger than the transports accept is refused by `enqueue`,
/// inside the caller's transaction, with a clear error, and nothing is
/// written; events within the limit go in.
pub async fn an_event_past_the_size_limit_is_refused_inside_the_transaction<T: TestDb>(db: &T) {
    use tidings_core::Outbox;
    let store = setup(db).await;
    let limited = tidings_sql::SqlStore::<T::Dialect>::with_options(
        store.pool().clone(),
        tidings_sql::StoreOptions::default().max_event_bytes(2048),
    );
    let large = message(&"k".repeat(4000), 1);
    let mut tx = limited.pool().begin().await.unwrap();
    let error = limited
        .enqueue_outgoing(&mut *tx, &large)
        .await
        .expect_err("an event past the limit is refused");
    drop(tx);
    assert!(matches!(error, tidings_core::Error::Refused { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("more than the 2048 its transports accept"),
        "{text}"
    );
    assert_eq!(
        store.lag().await.unwrap().outbox_pending,
        0,
        "the refused event was written"
    );
    limited.enqueue_in_tx(&message("small", 1), true).await;
    assert_eq!(store.lag().await.unwrap().outbox_pending, 1);
}

/// While the transport refuses, nothing is marked sent; once it is back, the
/// backlog drains and the log holds every event once, in commit order.
pub async fn relay_retries_until_the_transport_confirms<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
        seqs.push(d.message.decode().unwrap().decode::<TestEvent>().unwrap().seq);
        d.ack(AckKind::Ack).await.unwrap();
    }
    assert_eq!(seqs, (1..=20).collect::<Vec<_>>());
}

/// With retention, sent rows are kept (and never claimed again) until cleanup deletes them.
pub async fn retention_keeps_sent_rows_until_cleanup<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let store = store.with_retention(Duration::ZERO);
    for seq in 1..=5 {
        store.enqueue_in_tx(&message("r", seq), true).await;
    }
    let relay = relay(&store);
    assert_eq!(relay.round().await.unwrap(), tidings_relay::Round::Published(5));
    assert_eq!(
        relay.round().await.unwrap(),
        tidings_relay::Round::Idle,
        "sent rows are not claimed again"
    );
    assert_eq!(store.lag().await.unwrap().outbox_pending, 0);
    assert_eq!(
        store.count("SELECT count(*) FROM tidings_outbox").await,
        5,
        "kept for retention"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.cleanup().await.unwrap(), 5);
    assert_eq!(store.count("SELECT count(*) FROM tidings_outbox").await, 0);
}

/// A publisher that takes its time, to catch the relay mid-publish.
#[derive(Debug, Clone)]
struct SlowPublisher<P>(P, Duration);

#[async_trait::async_trait]
impl<P: tidings_core::Publisher> tidings_core::Publisher for SlowPublisher<P> {
    async fn publish(&self, batch: &[tidings_core::OutgoingMessage]) -> tidings_core::Result<()> {
        tokio::time::sleep(self.1).await;
        self.0.publish(batch).await
    }

    fn refuses(&self, message: &tidings_core::OutgoingMessage) -> Option<String> {
        self.0.refuses(message)
    }
}

/// A relay stopped mid-publish finishes the batch in flight.
pub async fn shutdown_finishes_the_batch_being_published<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
    assert_eq!(store.count("SELECT count(*) FROM tidings_log").await, 3);
}

/// Writers whose transactions overlap and commit out of sequence order: a
/// reader of the log delivers every entry once, skipping none.
pub async fn log_readers_never_skip_late_commits<T: TestDb>(db: &T) {
    let store = setup(db).await;
    // Many writers whose transactions overlap: rows get their sequence
    // numbers at insert and become visible at commit, in another order.
    let is_pg = LogBackend::name(&store) == "pg-log";
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
                            T::LOG_APPEND_RAW,
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

/// Trimming the log deletes only entries older than the retention that every
/// group (and every partition of a group) has read past, at most the limit at a time.
pub async fn log_retention_keeps_what_a_group_has_not_read<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
    let unread = tidings_core::OutgoingMessage {
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
    let total = || store.count("SELECT count(*) FROM tidings_log");
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
