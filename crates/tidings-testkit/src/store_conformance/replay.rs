//! Replay: a running member takes up a replay asked of its consumer and
//! re-delivers the range in order; what the consumer processed is
//! suppressed, what the broker lost is handled, once.

use std::time::Duration;

use chrono::Utc;
use tidings_consumer::{Consumer, ConsumerConfig};
use tidings_core::replay::{ReplayRequest, ReplaySource, ReplayState};
use tidings_core::{OutgoingMessage, Publisher, ReplayStore};
use tidings_log::{LogPublisher, LogReaderConfig, LogSubscriber};
use tidings_relay::{Relay, RelayConfig, Round};
use tokio_util::sync::CancellationToken;

use super::fixtures::{Recorder, StoreExt, TOPIC, eventually, message, setup};
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(30);

/// A broker that confirms and keeps nothing: what it is given is lost.
struct Forgetful;

#[async_trait::async_trait]
impl Publisher for Forgetful {
    async fn publish(&self, _batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        Ok(())
    }
}

/// A replay from the outbox re-delivers a range in order: what the consumer
/// processed is suppressed, what the broker lost is handled, once.
pub async fn a_replay_suppresses_what_was_processed_and_handles_what_was_lost<T: TestDb>(db: &T) {
    let store = setup(db).await;
    // Sent outbox records are kept: the outbox is the replay's source.
    let store = store.with_retention(Duration::from_secs(3600));
    let since = Utc::now() - chrono::Duration::seconds(1);
    // Two keys, each with its own sequence: 1 to 3 published...
    for seq in 1..=3 {
        for key in ["a", "b"] {
            store.enqueue_in_tx(&message(key, seq), true).await;
        }
    }
    let relay = Relay::new(
        store.clone(),
        LogPublisher::new(std::sync::Arc::new(store.clone())),
    )
    .config(RelayConfig::default().batch_size(100).member("one-relay"));
    while relay.round().await.unwrap() != Round::Idle {}
    // ...then 4 and 5 "published" to a broker that loses them (the same relay
    // member, its broker swapped: it still holds the outbox's partition).
    for seq in 4..=5 {
        for key in ["a", "b"] {
            store.enqueue_in_tx(&message(key, seq), true).await;
        }
    }
    let lossy = Relay::new(store.clone(), Forgetful)
        .config(RelayConfig::default().batch_size(100).member("one-relay"));
    while lossy.round().await.unwrap() != Round::Idle {}

    let recorder = Recorder {
        check_order: true,
        ..Recorder::default()
    };
    let consumer = Consumer::new("replayed", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(ConsumerConfig::default().replay_poll(Duration::from_millis(20)));
    let stop = CancellationToken::new();
    let subscriber = LogSubscriber::new(
        std::sync::Arc::new(store.clone()),
        LogReaderConfig::default().poll_interval(Duration::from_millis(20)),
    );
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { consumer.run(&subscriber, stop).await }
    });
    eventually(WAIT, "the six published events handled", || async {
        recorder.seen().len() == 6
    })
    .await;

    let topics = vec![TOPIC.to_owned()];
    let until = Utc::now() + chrono::Duration::seconds(1);
    assert_eq!(
        store
            .count_retained(ReplaySource::Outbox, &topics, since, until)
            .await
            .unwrap(),
        10
    );
    let id = store
        .request_replay(&ReplayRequest {
            consumer: "replayed".into(),
            topics,
            source: ReplaySource::Outbox,
            since,
            until,
            rate: 1000.0,
            total: 10,
        })
        .await
        .unwrap();
    eventually(WAIT, "the replay done", || async {
        store.replay(id).await.unwrap().unwrap().state == ReplayState::Done
    })
    .await;
    let replay = store.replay(id).await.unwrap().unwrap();
    assert_eq!(replay.counts.delivered, 10);
    assert_eq!(replay.counts.suppressed, 6, "the processed ones are suppressed");
    assert_eq!(replay.counts.handled, 4, "the lost ones are handled");
    assert_eq!(replay.counts.failed, 0);
    // Each event handled once, each key in order (the recorder checks it in the handler's transaction).
    for key in ["a", "b"] {
        let seqs: Vec<i64> = recorder
            .seen()
            .into_iter()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| s)
            .collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5], "{key}");
    }
    // Done is final: cancelling it changes nothing.
    assert!(!store.cancel_replay(id).await.unwrap());

    stop.cancel();
    running.await.unwrap().unwrap();
}
