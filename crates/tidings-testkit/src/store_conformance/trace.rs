//! Message traces: a message's story read back by its id and by its key,
//! from its outbox record, processed markers, effects, dead letters and
//! parked copies, each field as it was written.

use std::time::Duration;

use chrono::Utc;
use tidings_core::inspect::{Inspect, MessageTrace};
use tidings_core::partition::key_hash;
use tidings_core::{ConsumerStore, DeadLetter, Failure, FailureStore, ParkedMessage, ParkingStore, Skip};
use uuid::Uuid;

use super::fixtures::{StoreExt, TOPIC, message};
use crate::services::TestDb;

/// A dead letter of `message_id` (of key `key`) for `consumer`.
fn letter(consumer: &str, message_id: Uuid, key: &str, attempts: u32, errors: Vec<Failure>) -> DeadLetter {
    DeadLetter {
        id: Uuid::now_v7(),
        consumer: consumer.into(),
        topic: TOPIC.into(),
        message_id: Some(message_id),
        message_type: Some("TestEvent".into()),
        aggregate_key: Some(key.into()),
        headers: Default::default(),
        body: b"{}".to_vec(),
        attempts,
        errors,
        created_at: Utc::now(),
        redrives: 0,
        redriven_at: None,
        skipped_at: None,
    }
}

/// The ids of `traces`, in order.
fn ids(traces: &[MessageTrace]) -> Vec<Uuid> {
    traces.iter().map(|t| t.message_id).collect()
}

/// Three messages of one key and one of another: the first handled by two
/// consumers with an effect, the second dead-lettered by one consumer
/// (holding the key) and skipped by another, the third parked behind it.
/// Each trace says exactly that, by id and by key, oldest first, at most
/// as many as asked; a marker of a message whose outbox record is gone
/// still traces it; an unknown id or key finds nothing.
pub async fn a_message_is_traced_by_id_and_by_key<T: TestDb>(db: &T) {
    let store = db.store();
    let start = Utc::now();
    let ms = [
        message("order-1", 1),
        message("order-1", 2),
        message("order-1", 3),
        message("order-2", 1),
    ];
    for m in &ms {
        store.enqueue_in_tx(m, true).await;
    }
    let [m1, m2, m3, m4] = [0, 1, 2, 3].map(|i| ms[i].envelope.id);

    // The first is handled by two consumers, one of them with an effect.
    for consumer in ["billing", "shipping"] {
        let mut tx = store.begin().await.unwrap();
        assert!(store.mark_processed(&mut *tx, consumer, m1).await.unwrap());
        if consumer == "billing" {
            store
                .record_effect(&mut *tx, consumer, m1, "charge", "charge-m1")
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
    // Counted as handled in the last minute, by consumer.
    assert_eq!(
        store.handled_recently(Duration::from_secs(60)).await.unwrap(),
        vec![("billing".to_owned(), 1), ("shipping".to_owned(), 1)]
    );

    // The second is dead-lettered by billing, holding its key, and by
    // shipping, which skips it.
    let failure = |attempt: u32, error: &str| Failure {
        attempt,
        at: Utc::now(),
        class: "transient".into(),
        error: error.into(),
    };
    let billing = letter(
        "billing",
        m2,
        "order-1",
        3,
        vec![failure(1, "timeout"), failure(3, "card declined")],
    );
    assert!(store.dead_letter_holding_key(&billing, None).await.unwrap());
    let shipping = letter("shipping", m2, "order-1", 1, Vec::new());
    store.dead_letter(&shipping).await.unwrap();
    assert_eq!(
        store.skip(shipping.id).await.unwrap(),
        Skip::Skipped { released_key: false }
    );

    // The third waits parked behind the second, for billing.
    store
        .park(
            "billing",
            &ParkedMessage {
                topic: TOPIC.into(),
                aggregate_key: "order-1".into(),
                message_id: m3,
                headers: Default::default(),
                body: b"{}".to_vec(),
            },
        )
        .await
        .unwrap();

    // By id.
    let t1 = store
        .trace_message(m1)
        .await
        .unwrap()
        .expect("the first is known");
    assert_eq!(t1.message_id, m1);
    assert_eq!(t1.topic.as_deref(), Some(TOPIC));
    assert_eq!(t1.aggregate_key.as_deref(), Some("order-1"));
    assert_eq!(
        t1.message_type.as_deref(),
        Some(ms[0].envelope.message_type.as_str())
    );
    let o1 = t1.outbox.clone().expect("its outbox record is there, unsent");
    assert_eq!(o1.key_hash, key_hash("order-1"));
    assert_eq!(o1.published_at, None, "not sent");
    assert!(
        (o1.created_at - start).num_seconds().abs() < 60,
        "enqueued at {}, test started at {start}",
        o1.created_at
    );
    let handlers: Vec<&str> = t1.handled.iter().map(|h| h.consumer.as_str()).collect();
    assert_eq!(handlers, ["billing", "shipping"], "handled by two, oldest first");
    assert_eq!(t1.effects.len(), 1, "{:?}", t1.effects);
    assert_eq!(
        (
            t1.effects[0].consumer.as_str(),
            t1.effects[0].effect.as_str(),
            t1.effects[0].idempotency_key.as_str()
        ),
        ("billing", "charge", "charge-m1")
    );
    assert!(t1.dead_letters.is_empty() && t1.parked.is_empty() && !t1.held_by_relay);

    let t2 = store
        .trace_message(m2)
        .await
        .unwrap()
        .expect("the second is known");
    let o2 = t2.outbox.clone().expect("its outbox record is there");
    assert!(o2.seq > o1.seq, "the outbox's order");
    assert!(t2.handled.is_empty() && t2.effects.is_empty() && t2.parked.is_empty());
    let letters: Vec<(Uuid, &str, &str, u32, Option<&str>)> = t2
        .dead_letters
        .iter()
        .map(|d| {
            (
                d.id,
                d.consumer.as_str(),
                d.state.as_str(),
                d.attempts,
                d.last_error.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        letters,
        [
            (billing.id, "billing", "pending", 3, Some("card declined")),
            (shipping.id, "shipping", "skipped", 1, None),
        ],
        "its dead letters, oldest first"
    );
    assert_eq!(
        t2.dead_letters[0].created_at.timestamp_millis(),
        billing.created_at.timestamp_millis()
    );

    let t3 = store
        .trace_message(m3)
        .await
        .unwrap()
        .expect("the third is known");
    assert!(t3.outbox.as_ref().expect("its outbox record").seq > o2.seq);
    assert!(t3.handled.is_empty() && t3.dead_letters.is_empty());
    assert_eq!(t3.parked.len(), 1, "{:?}", t3.parked);
    let parked = &t3.parked[0];
    assert_eq!(
        (
            parked.consumer.as_str(),
            parked.topic.as_str(),
            parked.key.as_str()
        ),
        ("billing", TOPIC, "order-1")
    );
    assert_eq!(parked.held_by_message, Some(m2), "behind the second");
    assert_eq!(
        parked.held_by_dead_letter,
        Some(billing.id),
        "behind billing's dead letter"
    );
    assert!(!parked.released);
    assert!((parked.since - start).num_seconds().abs() < 60);

    // A message whose outbox record is gone is still known by its marker.
    let gone = Uuid::now_v7();
    let mut tx = store.begin().await.unwrap();
    assert!(store.mark_processed(&mut *tx, "billing", gone).await.unwrap());
    tx.commit().await.unwrap();
    let t = store
        .trace_message(gone)
        .await
        .unwrap()
        .expect("known by its marker");
    assert_eq!((t.outbox, t.topic, t.handled.len()), (None, None, 1));

    assert_eq!(
        store.trace_message(Uuid::now_v7()).await.unwrap(),
        None,
        "unknown"
    );

    // By key: oldest first, at most as many as asked, each as by id.
    let key = store.trace_key("order-1", 10).await.unwrap();
    assert_eq!(ids(&key), [m1, m2, m3]);
    assert_eq!(key, [t1.clone(), t2, t3], "the same stories as by id");
    assert_eq!(ids(&store.trace_key("order-1", 2).await.unwrap()), [m1, m2]);
    assert!(store.trace_key("order-1", 0).await.unwrap().is_empty());
    let other = store.trace_key("order-2", 10).await.unwrap();
    assert_eq!(ids(&other), [m4]);
    assert!(other[0].handled.is_empty() && other[0].dead_letters.is_empty());
    assert_eq!(other[0].outbox.as_ref().unwrap().key_hash, key_hash("order-2"));
    for unknown in ["order-3", "order", "ORDER-1", ""] {
        assert!(
            store.trace_key(unknown, 10).await.unwrap().is_empty(),
            "{unknown:?} is no message's key"
        );
    }
}
