//! Dead letters and parking: poison dead-lettered without blocking other
//! keys, bad input with a clear error, redrive, a dead letter holding its
//! key until redriven or skipped, and consumers that continue past one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tidings_consumer::Consumer;
use tidings_core::{DeadLetterFilter, FailureStore, LagSource, cloudevents};
use tidings_sql::{Dialect, SqlStore};

use super::fixtures::{
    Pipeline, Recorder, StoreExt, TOPIC, eventually, message, quick, seen_of, setup, subscriber,
};
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(30);

/// A message that keeps failing is dead-lettered after its attempts, with its
/// whole error history and its original body; other keys go on.
pub async fn poison_is_dead_lettered_without_blocking_other_keys<T: TestDb>(db: &T) {
    let store = setup(db).await;
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

/// A handler that panics fails its attempt as an error would: on one lane
/// (which a panic would otherwise end, with the key it held), the message
/// is tried again, then dead-lettered with what the panic said, and the
/// other keys, on that same lane, go on.
pub async fn a_panicking_handler_fails_its_attempt_and_the_lane_goes_on<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let recorder = Recorder {
        panic_key: Some("panics".into()),
        ..Recorder::default()
    };
    let consumer = Consumer::new("panicky", store.clone(), recorder)
        .topic(TOPIC)
        .config(quick().lanes(1).max_attempts(2));
    let letters = one_bad_among_twelve(&store, "panics", consumer).await;
    assert_eq!(letters[0].aggregate_key.as_deref(), Some("panics"));
    assert_eq!(letters[0].attempts, 2);
    assert!(
        letters[0]
            .errors
            .iter()
            .all(|f| f.error.contains("the handler panicked: a bug in the handler")),
        "{:?}",
        letters[0].errors
    );
}

/// Runs `consumer` over one message of key `bad` and twelve good ones
/// (three keys) until the twelve are handled and one message is
/// dead-lettered; returns the consumer's dead letters.
async fn one_bad_among_twelve<D: Dialect>(
    store: &SqlStore<D>,
    bad: &str,
    consumer: Consumer<SqlStore<D>>,
) -> Vec<tidings_core::DeadLetter> {
    store.enqueue_in_tx(&message(bad, 1), true).await;
    for seq in 1..=12 {
        store
            .enqueue_in_tx(&message(&format!("good-{}", seq % 3), seq), true)
            .await;
    }
    let name = consumer.name().to_owned();
    let stats = consumer.stats();
    let pipeline = Pipeline::start(store, consumer, subscriber(store));
    eventually(
        WAIT,
        &format!("good events handled and {bad:?} dead-lettered"),
        || async { stats.handled() == 12 && stats.dead_lettered() == 1 },
    )
    .await;
    pipeline.stop().await;
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer(&name))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    letters
}

/// Malformed envelopes, unknown types, unsupported versions and bad payloads
/// are dead-lettered at once, each as received and with an error saying what is wrong.
pub async fn bad_input_reaches_the_failure_store_with_a_clear_error<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
        store
            .append_raw(T::LOG_APPEND_RAW, TOPIC, "k", body.clone(), Duration::ZERO)
            .await;
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

/// A dead letter redriven after the fix is handled exactly once and keeps its history.
pub async fn a_redriven_dead_letter_is_handled_once<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
        matches!(outcome, tidings_core::Redrive::Enqueued { redrive: 1, .. }),
        "{outcome:?}"
    );
    eventually(WAIT, "the redriven message handled", || async {
        stats.handled() == 2
    })
    .await;
    pipeline.stop().await;
    assert_eq!(
        store
            .count("SELECT count(*) FROM test_applied WHERE k = 'bad'")
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

/// `bad` 1..=n fails until healed; `good-*` 1..=12 succeed.
async fn poisoned_key<D: Dialect>(store: &SqlStore<D>, bad: i64) -> Recorder {
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

/// A dead letter holds its key: later messages of the key are parked, and
/// released in order once it is redriven.
pub async fn a_dead_letter_holds_its_key_until_redriven<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
        vec![tidings_core::ParkedLag {
            consumer: "holding".into(),
            topic: TOPIC.into(),
            held_keys: 1,
            messages: 3
        }]
    );

    // A message of the held key arriving now waits behind the others.
    store.enqueue_in_tx(&message("bad", 5), true).await;
    eventually(WAIT, "bad:5 parked", || async { stats.parked() == 4 }).await;
    // So does one claiming, in Tidings' own header, to be a redrive: only
    // the held message's id, from the store, passes the hold.
    let mut forged = message("bad", 6);
    forged.envelope = forged.envelope.header(tidings_core::REDRIVE_HEADER, "1");
    store.enqueue_in_tx(&forged, true).await;
    eventually(WAIT, "the forged redrive bad:6 parked", || async {
        stats.parked() == 5
    })
    .await;
    assert_eq!(
        recorder.calls.load(Ordering::SeqCst),
        12 + 2,
        "a forged redrive reached the handler"
    );

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
        || async { stats.handled() == 12 + 6 },
    )
    .await;
    assert_eq!(
        seen_of(&recorder, "bad"),
        vec![1, 2, 3, 4, 5, 6],
        "released in order"
    );
    // The lane deletes the hold right after handling the last parked
    // message (atomically with checking nothing is parked behind it).
    eventually(WAIT, "the hold on bad released", || async {
        store.lag().await.unwrap().parked.is_empty()
    })
    .await;

    // The key is free again: its next message is handled at once.
    store.enqueue_in_tx(&message("bad", 7), true).await;
    eventually(WAIT, "bad:7 handled", || async { stats.handled() == 12 + 7 }).await;
    pipeline.stop().await;
    assert_eq!(seen_of(&recorder, "bad"), vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(stats.parked(), 5);
}

/// A skipped dead letter releases its key without being handled; a settled
/// one can be purged, a pending one cannot.
pub async fn a_skipped_dead_letter_lets_its_key_go_on<T: TestDb>(db: &T) {
    let store = setup(db).await;
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
        tidings_core::Skip::Skipped { released_key: true }
    );
    assert_eq!(
        store.skip(uuid::Uuid::now_v7()).await.unwrap(),
        tidings_core::Skip::NotFound
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

/// With `OnDeadLetter::Continue`, a dead letter holds nothing back: nothing is parked.
pub async fn a_consumer_may_continue_past_a_dead_letter<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let recorder = poisoned_key(&store, 3).await;
    let consumer = Consumer::new("independent", store.clone(), recorder.clone())
        .topic(TOPIC)
        .config(
            quick()
                .max_attempts(2)
                .on_dead_letter(tidings_consumer::OnDeadLetter::Continue),
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

/// A member that lost its partition's lease (it stalled past it, and a
/// successor took the partition and loaded the holds) writes no dead letter
/// and holds no key: the successor handles the message again and holds the
/// key itself, so a later message of the key is parked, never handled.
pub async fn a_member_past_its_lease_holds_no_key<T: TestDb>(db: &T) {
    use tidings_core::{Fence, LeaseStore, ParkingStore};
    let store = setup(db).await;
    let scope = "billing@test.events";
    let ttl = Duration::from_millis(300);
    let stale = store.acquire(scope, "m1", &[0], ttl).await.unwrap()[0];
    tokio::time::sleep(Duration::from_millis(400)).await;
    let live = store
        .acquire(scope, "m2", &[0], Duration::from_secs(30))
        .await
        .unwrap()[0];
    assert!(live.fence > stale.fence, "the successor has a new fencing token");

    let envelope = message("k1", 1).envelope;
    let letter = tidings_core::DeadLetter {
        id: uuid::Uuid::now_v7(),
        consumer: "billing".into(),
        topic: TOPIC.into(),
        message_id: Some(envelope.id),
        message_type: Some(envelope.message_type.clone()),
        aggregate_key: Some("k1".into()),
        headers: Default::default(),
        body: b"{}".to_vec(),
        attempts: 1,
        errors: Vec::new(),
        created_at: chrono::Utc::now(),
        redrives: 0,
        redriven_at: None,
        skipped_at: None,
    };
    let fence = |member, lease| Some(Fence { scope, member, lease });
    assert!(
        !store
            .dead_letter_holding_key(&letter, fence("m1", stale))
            .await
            .unwrap(),
        "refused to the member that lost the lease"
    );
    assert!(
        store.held_keys("billing").await.unwrap().is_empty(),
        "no key held"
    );
    let filter = DeadLetterFilter::default().consumer("billing");
    assert!(
        store.dead_letters(&filter).await.unwrap().is_empty(),
        "no dead letter"
    );

    assert!(
        store
            .dead_letter_holding_key(&letter, fence("m2", live))
            .await
            .unwrap()
    );
    let held = store.held_keys("billing").await.unwrap();
    assert_eq!(held.len(), 1, "the lease's holder holds the key");
    assert_eq!(store.dead_letters(&filter).await.unwrap().len(), 1);
}

/// Inserts the event as a child of parent 1, or, for key `orphan`, of a
/// parent that does not exist: PostgreSQL checks the deferred foreign key
/// only at commit.
struct Adopts;

#[async_trait::async_trait]
impl tidings_consumer::Handler<sqlx::Postgres> for Adopts {
    async fn handle(
        &self,
        ctx: &mut tidings_consumer::Context<'_, sqlx::Postgres>,
    ) -> Result<(), tidings_consumer::HandlerError> {
        let event: super::fixtures::TestEvent = ctx.decode()?;
        let parent: i64 = if event.key == "orphan" { 0 } else { 1 };
        sqlx::query("INSERT INTO test_children (k, seq, parent) VALUES ($1, $2, $3)")
            .bind(&event.key)
            .bind(event.seq)
            .bind(parent)
            .execute(ctx.tx())
            .await?;
        Ok(())
    }
}

/// A commit the database refuses for what the handler wrote (a deferred
/// constraint, checked at commit) is the message's failure, not an outage
/// to wait out: the message is dead-lettered at once, saying why, and the
/// other keys go on. PostgreSQL only (MySQL has no deferred constraints).
pub async fn a_commit_refused_for_the_handlers_writes_is_dead_lettered(db: &crate::services::PgTestDb) {
    let store = setup(db).await;
    for ddl in [
        "CREATE TABLE test_parents (id BIGINT PRIMARY KEY)",
        "INSERT INTO test_parents VALUES (1)",
        "CREATE TABLE test_children (k TEXT, seq BIGINT, parent BIGINT REFERENCES test_parents (id) \
         DEFERRABLE INITIALLY DEFERRED, PRIMARY KEY (k, seq))",
    ] {
        sqlx::query(ddl).execute(db.store.pool()).await.unwrap();
    }
    let consumer = Consumer::new("adopting", store.clone(), Adopts)
        .topic(TOPIC)
        .config(quick().max_attempts(5));
    let letters = one_bad_among_twelve(&store, "orphan", consumer).await;
    assert_eq!(letters[0].aggregate_key.as_deref(), Some("orphan"));
    assert_eq!(letters[0].attempts, 1, "refused for good: not tried again");
    assert!(
        letters[0].errors[0]
            .error
            .contains("the database refused the handler's writes")
            && letters[0].errors[0].class == "permanent",
        "{:?}",
        letters[0].errors
    );
    let children: i64 = sqlx::query_scalar("SELECT count(*) FROM test_children")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(children, 12);
}
