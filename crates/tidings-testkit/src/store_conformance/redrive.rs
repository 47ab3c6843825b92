//! Redriving one dead letter: read by its id whatever its state, sent back
//! once however many ask at once, and sent back with edited data, the
//! original kept beside the edit.

use chrono::Utc;
use serde_json::json;
use tidings_core::{
    DeadLetter, EDIT_HEADER, Edit, Failure, FailureStore, REDRIVE_HEADER, RELAY_LETTERS, Redrive, Skip,
    cloudevents,
};
use uuid::Uuid;

use super::fixtures::{StoreExt, TOPIC, message};
use crate::services::TestDb;

/// A dead letter of `consumer` whose body is a test event of `key`, as a
/// consumer stores it.
fn letter(consumer: &str, key: &str) -> DeadLetter {
    let envelope = message(key, 1).envelope;
    DeadLetter {
        id: Uuid::now_v7(),
        consumer: consumer.into(),
        topic: TOPIC.into(),
        message_id: Some(envelope.id),
        message_type: Some(envelope.message_type.clone()),
        aggregate_key: Some(key.into()),
        headers: Default::default(),
        body: cloudevents::to_json(&envelope),
        attempts: 3,
        errors: vec![Failure {
            attempt: 3,
            at: Utc::now(),
            class: "transient".into(),
            error: format!("warehouse rejected {key}"),
        }],
        created_at: Utc::now(),
        redrives: 0,
        redriven_at: None,
        skipped_at: None,
    }
}

/// The outbox's copies of `message_id`, as envelopes, in the order enqueued.
async fn copies<S: StoreExt>(store: &S, message_id: Option<Uuid>) -> Vec<tidings_core::Envelope> {
    store
        .outbox_bodies()
        .await
        .iter()
        .map(|body| cloudevents::from_json(body).expect("the outbox holds envelopes"))
        .filter(|e| Some(e.id) == message_id)
        .collect()
}

/// A dead letter is read by its id in every state; redriven, it is settled,
/// and a second redrive, one after the other or both at once, enqueues
/// nothing more; a skipped one is not redriven; failing again makes a
/// redriven one pending, and redrivable, again.
pub async fn a_settled_dead_letter_is_redriven_once<T: TestDb>(db: &T) {
    let store = db.store();
    assert_eq!(store.letter(Uuid::now_v7()).await.unwrap(), None, "unknown");

    let first = letter("inventory", "order-1");
    store.dead_letter(&first).await.unwrap();
    let read = store.letter(first.id).await.unwrap().expect("read by its id");
    assert_eq!(
        (
            read.id,
            read.consumer.as_str(),
            read.body.as_slice(),
            read.is_pending()
        ),
        (first.id, "inventory", first.body.as_slice(), true)
    );

    let done = store.redrive(first.id).await.unwrap();
    assert_eq!(
        done,
        Redrive::Enqueued {
            message_id: first.message_id.unwrap(),
            redrive: 1
        }
    );
    let read = store
        .letter(first.id)
        .await
        .unwrap()
        .expect("still read by its id");
    assert!(!read.is_pending() && read.redriven_at.is_some() && read.redrives == 1);
    assert_eq!(store.redrive(first.id).await.unwrap(), Redrive::Settled);
    assert_eq!(
        copies(store, first.message_id).await.len(),
        1,
        "one copy in the outbox"
    );
    assert_eq!(store.letter(first.id).await.unwrap().unwrap().redrives, 1);

    // Two at once: one enqueues, the other finds it settled.
    let second = letter("inventory", "order-2");
    store.dead_letter(&second).await.unwrap();
    let (a, b) = tokio::join!(store.redrive(second.id), store.redrive(second.id));
    let mut outcomes = [a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| matches!(o, Redrive::Settled));
    assert!(
        matches!(outcomes, [Redrive::Enqueued { redrive: 1, .. }, Redrive::Settled]),
        "{outcomes:?}"
    );
    assert_eq!(
        copies(store, second.message_id).await.len(),
        1,
        "one copy in the outbox"
    );

    // A skipped one is settled too.
    let skipped = letter("email", "order-3");
    store.dead_letter(&skipped).await.unwrap();
    assert_eq!(
        store.skip(skipped.id).await.unwrap(),
        Skip::Skipped { released_key: false }
    );
    assert_eq!(store.redrive(skipped.id).await.unwrap(), Redrive::Settled);
    assert!(copies(store, skipped.message_id).await.is_empty());
    // And neither a skipped nor a redriven one is skipped again: skipping
    // a redriven letter would let its key's parked messages go before it.
    assert_eq!(store.skip(skipped.id).await.unwrap(), Skip::Settled);
    assert_eq!(store.skip(first.id).await.unwrap(), Skip::Settled);
    assert!(
        store
            .letter(first.id)
            .await
            .unwrap()
            .unwrap()
            .skipped_at
            .is_none()
    );
    let read = store
        .letter(skipped.id)
        .await
        .unwrap()
        .expect("a skipped one is read too");
    assert!(read.skipped_at.is_some());

    // Failing again after its redrive, the first is pending again.
    store
        .dead_letter(&DeadLetter {
            id: Uuid::now_v7(),
            attempts: 1,
            ..first.clone()
        })
        .await
        .unwrap();
    let again = store.letter(first.id).await.unwrap().unwrap();
    assert!(again.is_pending(), "{again:?}");
    assert!(
        matches!(
            store.redrive(first.id).await.unwrap(),
            Redrive::Enqueued { redrive: 2, .. }
        ),
        "redriven again"
    );
    assert_eq!(copies(store, first.message_id).await.len(), 2);
}

/// An edited redrive enqueues the message with the edit's data, the redrive
/// header and the edit's id; the edit is kept with the original body and
/// the edited envelope, and the letter is settled. A second edit, a letter
/// settled, unknown, undecodable or set aside by the relay are refused,
/// changing nothing.
pub async fn an_edited_redrive_sends_the_edit_and_keeps_the_original<T: TestDb>(db: &T) {
    let store = db.store();
    let dead = letter("inventory", "order-1");
    store.dead_letter(&dead).await.unwrap();
    let data = json!({ "key": "order-1", "seq": 1, "note": "sku fixed by hand: ünïcode ✓" });
    let edit = Edit {
        data: data.clone(),
        by: "alice".into(),
    };
    let before = Utc::now();
    let done = store.redrive_edited(dead.id, &edit).await.unwrap();
    let Redrive::Edited {
        message_id,
        redrive,
        edit: edit_id,
    } = done
    else {
        panic!("not redriven edited: {done:?}");
    };
    assert_eq!((Some(message_id), redrive), (dead.message_id, 1));

    // What the outbox holds is the edit.
    let sent = copies(store, dead.message_id).await;
    assert_eq!(sent.len(), 1, "one copy in the outbox");
    let sent = &sent[0];
    let payload: serde_json::Value = serde_json::from_slice(&sent.payload).unwrap();
    assert_eq!(payload, data, "the edited data");
    assert_eq!(
        sent.headers.get(EDIT_HEADER).map(String::as_str),
        Some(edit_id.to_string().as_str())
    );
    assert_eq!(sent.headers.get(REDRIVE_HEADER).map(String::as_str), Some("1"));
    let original = cloudevents::from_json(&dead.body).unwrap();
    assert_eq!(
        (
            &sent.message_type,
            sent.version,
            &sent.aggregate_key,
            sent.correlation_id
        ),
        (
            &original.message_type,
            original.version,
            &original.aggregate_key,
            original.correlation_id
        ),
        "the rest of the envelope as it was"
    );

    // The edit is kept, with both bodies.
    let edits = store.edits(dead.id).await.unwrap();
    assert_eq!(edits.len(), 1, "{edits:?}");
    let kept = &edits[0];
    assert_eq!(
        (kept.id, kept.dead_letter_id, kept.by.as_str()),
        (edit_id, dead.id, "alice")
    );
    assert_eq!(kept.original, dead.body, "the body as it was stored");
    assert_eq!(
        kept.edited,
        store.outbox_bodies().await[0],
        "the envelope as the outbox holds it"
    );
    assert!(
        (kept.at - before).num_seconds().abs() < 60,
        "edited at {}, asked at {before}",
        kept.at
    );
    assert!(store.edits(Uuid::now_v7()).await.unwrap().is_empty());
    let read = store.letter(dead.id).await.unwrap().unwrap();
    assert!(!read.is_pending() && read.redrives == 1, "{read:?}");

    // A second edit finds it settled.
    let again = Edit {
        data: json!({ "key": "order-1", "seq": 2 }),
        by: "bob".into(),
    };
    assert_eq!(
        store.redrive_edited(dead.id, &again).await.unwrap(),
        Redrive::Settled
    );
    assert_eq!(copies(store, dead.message_id).await.len(), 1);
    assert_eq!(store.edits(dead.id).await.unwrap().len(), 1);

    // The edited message fails again: the letter now holds what failed,
    // the edit, so that a plain redrive sends the edit, not the original.
    store
        .dead_letter(&DeadLetter {
            id: Uuid::now_v7(),
            attempts: 1,
            headers: sent.headers.clone(),
            body: cloudevents::to_json(sent),
            ..dead.clone()
        })
        .await
        .unwrap();
    let failed = store.letter(dead.id).await.unwrap().unwrap();
    assert!(failed.is_pending(), "{failed:?}");
    assert_eq!(
        failed.body,
        cloudevents::to_json(sent),
        "the body that failed last"
    );
    assert_eq!(
        failed.headers.get(EDIT_HEADER).map(String::as_str),
        Some(edit_id.to_string().as_str())
    );
    assert!(matches!(
        store.redrive(dead.id).await.unwrap(),
        Redrive::Enqueued { redrive: 2, .. }
    ));
    let resent = copies(store, dead.message_id).await;
    assert_eq!(resent.len(), 2);
    assert!(
        resent
            .iter()
            .all(|e| serde_json::from_slice::<serde_json::Value>(&e.payload).unwrap() == data),
        "both copies carry the edit"
    );
    assert_eq!(
        store.edits(dead.id).await.unwrap()[0].original,
        dead.body,
        "the original kept"
    );

    // A skipped one too.
    let skipped = letter("email", "order-2");
    store.dead_letter(&skipped).await.unwrap();
    store.skip(skipped.id).await.unwrap();
    assert_eq!(
        store.redrive_edited(skipped.id, &again).await.unwrap(),
        Redrive::Settled
    );

    // Unknown, and undecodable.
    assert_eq!(
        store.redrive_edited(Uuid::now_v7(), &again).await.unwrap(),
        Redrive::NotFound
    );
    let garbled = DeadLetter {
        body: b"{not an envelope".to_vec(),
        message_id: None,
        ..letter("email", "order-3")
    };
    store.dead_letter(&garbled).await.unwrap();
    assert_eq!(
        store.redrive_edited(garbled.id, &again).await.unwrap(),
        Redrive::Undecodable
    );
    assert!(store.letter(garbled.id).await.unwrap().unwrap().is_pending());

    // A record the relay set aside is fixed in the outbox, not edited here.
    let held = letter(RELAY_LETTERS, "order-4");
    store.dead_letter(&held).await.unwrap();
    assert_eq!(
        store.redrive_edited(held.id, &again).await.unwrap(),
        Redrive::NotEditable
    );
    assert!(store.letter(held.id).await.unwrap().unwrap().is_pending());
    assert!(store.edits(held.id).await.unwrap().is_empty());
    assert_eq!(store.outbox_bodies().await.len(), 2, "nothing more was enqueued");

    // Purging the settled letter deletes its edits, the original body
    // with them; a pending letter stays.
    assert_eq!(store.purge(&[dead.id, held.id]).await.unwrap(), 1);
    assert!(store.letter(dead.id).await.unwrap().is_none());
    assert!(
        store.edits(dead.id).await.unwrap().is_empty(),
        "the edits purged too"
    );
    assert!(store.letter(held.id).await.unwrap().is_some());
}
