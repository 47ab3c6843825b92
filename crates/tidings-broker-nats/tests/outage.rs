//! NATS failures: a private server (never the shared one) is killed while
//! producers commit and started again, losing nothing; and a message that
//! keeps killing its consumer is dead-lettered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::Postgres;
use tidings_broker_nats::{NatsOptions, NatsTransport};
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{Envelope, OutgoingMessage};
use tidings_testkit::conformance::{Probe, probe};
use tidings_testkit::nats::PrivateNats;
use tidings_testkit::outage::producers_keep_committing_while_the_broker_is_down;
use tidings_testkit::services::PgTestDb;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_keep_committing_while_nats_is_down_and_nothing_is_lost() {
    let mut server = PrivateNats::start();
    let options = NatsOptions::default()
        .ack_wait(Duration::from_secs(3))
        .partitions(2);
    let nats = NatsTransport::connect_with(&server.url(), options)
        .await
        .unwrap_or_else(|e| panic!("the private nats-server is not reachable: {e}"));
    producers_keep_committing_while_the_broker_is_down(&mut server, Arc::new(nats.clone()), Arc::new(nats))
        .await;
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

/// A handler that never returns: its member is killed while it runs.
#[derive(Clone, Default)]
struct Hang(Arc<AtomicU64>);

#[async_trait]
impl Handler<Postgres> for Hang {
    async fn handle(&self, _: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

const GROUP: &str = "fragile";
const TOPIC: &str = "steps";

/// A private server with short deadlines, the group's stream created, and
/// one message published.
async fn one_message() -> (PrivateNats, NatsTransport, Envelope) {
    use tidings_core::{Publisher, Subscriber};
    let server = PrivateNats::start();
    let options = NatsOptions::default().ack_wait(Duration::from_millis(500));
    let nats = NatsTransport::connect_with(&server.url(), options).await.unwrap();
    nats.subscribe(GROUP, TOPIC).await.unwrap().close().await.unwrap();
    let probe = Probe {
        key: "k".into(),
        seq: 1,
    };
    let envelope = Envelope::new("crash-test", &probe).unwrap();
    nats.publish(&[OutgoingMessage {
        topic: TOPIC.into(),
        envelope: envelope.clone(),
    }])
    .await
    .unwrap();
    (server, nats, envelope)
}

fn config() -> ConsumerConfig {
    ConsumerConfig::default()
        .max_crashes(3)
        .lease_ttl(Duration::from_millis(500))
}

/// Runs a consumer with `handler` until `done` says so, or fails after 20 s.
async fn run_until<H: Handler<Postgres> + Clone>(
    nats: &NatsTransport,
    db: &PgTestDb,
    handler: H,
    done: impl Fn(&tidings_consumer::ConsumerStats) -> bool,
    what: &str,
) {
    let consumer = Consumer::new(GROUP, db.store.clone(), handler)
        .topic(TOPIC)
        .config(config());
    let stats = consumer.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (nats, stop) = (nats.clone(), stop.clone());
        async move { consumer.run(&nats, stop).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(&stats) {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// A message whose handling kills its consumer every time is redelivered
/// by JetStream; once its handling began and never ended more than
/// `max_crashes` times, counted in the store, it is dead-lettered without
/// running the handler again, and the line moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_killing_its_consumer_is_dead_lettered() {
    use tidings_core::FailureStore;
    let (_server, nats, envelope) = one_message().await;
    let db = PgTestDb::new().await;
    // Four members die while handling it: the first handling is not
    // counted, the next three are.
    let started = Hang::default();
    for round in 1..=4u64 {
        let consumer = Consumer::new(GROUP, db.store.clone(), started.clone())
            .topic(TOPIC)
            .config(config());
        let task = tokio::spawn({
            let nats = nats.clone();
            async move { consumer.run(&nats, CancellationToken::new()).await }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while started.0.load(Ordering::SeqCst) < round {
            assert!(Instant::now() < deadline, "handling {round} never began");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Killed mid-handling: nothing settles, nothing cleans up.
        task.abort();
        let _ = task.await;
    }
    let handled = Count::default();
    run_until(
        &nats,
        &db,
        handled.clone(),
        |s| s.dead_lettered() > 0,
        "the message was not dead-lettered",
    )
    .await;
    assert_eq!(handled.0.load(Ordering::SeqCst), 0, "the handler ran again");
    let letters = db.store.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message_id, Some(envelope.id));
    assert!(
        letters[0].errors[0]
            .error
            .contains("its handling began 3 times and never ended (the limit is 3)"),
        "{:?}",
        letters[0].errors
    );
    db.drop_schema().await;
}

/// Redeliveries that never reached a handler (a member frozen or gone with
/// the message in its buffer) are not crashes: far past `max_crashes`
/// deliveries, the message is handled once and nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_that_never_reached_a_handler_are_not_crashes() {
    use futures::StreamExt;
    use tidings_core::{FailureStore, Subscriber};
    let (_server, nats, envelope) = one_message().await;
    let db = PgTestDb::new().await;
    // Seven readers in turn take it and go without handling it (each
    // finds it unacknowledged and reads the partition again).
    for _ in 0..7 {
        let mut sub = nats.subscribe(GROUP, TOPIC).await.unwrap();
        let d = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("JetStream did not deliver the message again")
            .unwrap()
            .unwrap();
        drop(d);
        sub.close().await.unwrap();
    }
    let handled = Count::default();
    run_until(
        &nats,
        &db,
        handled.clone(),
        |s| s.handled() > 0,
        "the message was not handled",
    )
    .await;
    assert_eq!(handled.0.load(Ordering::SeqCst), 1);
    let letters = db.store.dead_letters(&Default::default()).await.unwrap();
    assert!(letters.is_empty(), "{letters:?}");
    let left = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tidings_handlings WHERE message_id = $1")
        .bind(envelope.id)
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "a handling that ended is still counted");
    db.drop_schema().await;
}

/// A handler that takes its duration to handle a message, counting its runs.
#[derive(Clone)]
struct Slow(Arc<AtomicU64>, Duration);

#[async_trait]
impl Handler<Postgres> for Slow {
    async fn handle(&self, _: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.1).await;
        Ok(())
    }
}

/// A handler four ack waits long keeps its message: the runtime tells
/// JetStream it is still at work, so JetStream does not send it again
/// while it runs (to this member, or to another one that would handle it
/// at the same time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_ack_wait_keeps_its_message() {
    let (_server, nats, _) = one_message().await;
    let db = PgTestDb::new().await;
    let slow = Slow(Arc::default(), Duration::from_secs(2));
    let consumer = Consumer::new(GROUP, db.store.clone(), slow.clone())
        .topic(TOPIC)
        .config(config().progress_every(Duration::from_millis(150)));
    let stats = consumer.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (nats, stop) = (nats.clone(), stop.clone());
        async move { consumer.run(&nats, stop).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.handled() == 0 {
        assert!(Instant::now() < deadline, "the message was not handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A redelivery sent during the handling would arrive by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(slow.0.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(
        (stats.received(), stats.duplicates()),
        (1, 0),
        "JetStream sent the message again while it was handled"
    );
    db.drop_schema().await;
}

/// The server's payload limit, read from the server, for the store's
/// `max_event_bytes`: a private server runs with nats-server's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_says_how_large_a_message_it_accepts() {
    let server = PrivateNats::start();
    let nats = NatsTransport::connect(&server.url()).await.unwrap();
    assert_eq!(nats.max_payload(), 1024 * 1024);
}

/// The client reconnects on its own and would send what it still had
/// queued on the new connection after losing what it wrote to the old one:
/// the publisher's waves keep a key's later message from overtaking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_keeps_its_order_through_nats_restarts() {
    let mut server = PrivateNats::start();
    let options = NatsOptions::default()
        .ack_wait(Duration::from_secs(3))
        .partitions(2);
    let nats = NatsTransport::connect_with(&server.url(), options).await.unwrap();
    tidings_testkit::outage::each_key_keeps_its_order_through_broker_restarts(
        &mut server,
        Arc::new(nats.clone()),
        Arc::new(nats),
    )
    .await;
}

/// A member frozen past its lease wakes up and pulls once more before it
/// learns the lease moved on: JetStream hands it a key's earlier message
/// and the new reader the later one. The new reader sees the skipped
/// delivery number and reads the partition again from its first
/// unacknowledged message, handing everything over in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_pulls_after_its_lease_moved_on_cannot_put_a_key_out_of_order() {
    use async_nats::jetstream;
    use futures::StreamExt;
    use tidings_core::{Publisher, Subscriber};
    let server = PrivateNats::start();
    let options = NatsOptions::default()
        .ack_wait(Duration::from_secs(2))
        .partitions(1);
    let nats = NatsTransport::connect_with(&server.url(), options).await.unwrap();
    nats.ensure_group(GROUP, TOPIC).await.unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    let mut stream = js.get_stream(nats.stream_name(TOPIC)).await.unwrap();
    let durable: String = stream.consumer_names().next().await.unwrap().unwrap();
    let stream_name = stream.info().await.unwrap().config.name.clone();

    // The woken member's pull request, waiting before the new reader's
    // (which, seeing a pull waiting, waits for it to expire, and gives up).
    let inbox = client.new_inbox();
    let mut woken = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(
            format!("$JS.API.CONSUMER.MSG.NEXT.{stream_name}.{durable}"),
            inbox,
            r#"{"batch":1,"expires":30000000000}"#.into(),
        )
        .await
        .unwrap();
    client.flush().await.unwrap();
    let mut reader = nats.subscribe(GROUP, TOPIC).await.unwrap();
    // The key's first step, five other keys, then the key's second step
    // (two waves: k/1 with the others, then k/2).
    let mut steps = vec![probe(TOPIC, "k", 1)];
    steps.extend((1..=5).map(|i| probe(TOPIC, &format!("other-{i}"), 1)));
    steps.push(probe(TOPIC, "k", 2));
    nats.publish(&steps).await.unwrap();

    let earlier = tokio::time::timeout(Duration::from_secs(20), woken.next())
        .await
        .expect("the woken member's pull got nothing")
        .unwrap();
    assert!(
        earlier
            .reply
            .as_ref()
            .is_some_and(|r| r.ends_with(".1.1.1") || r.contains(".1.1.1.")),
        "the woken member took the earlier message as the first delivery: {:?} {:?} {:?}",
        earlier.reply,
        earlier.status,
        earlier.description
    );
    // The new reader sees the skipped delivery number and reads the
    // partition again from its first unacknowledged message: k/1 first,
    // without waiting for the woken member, whose late give-back goes to a
    // consumer that is no more.
    // The woken member's late give-back names a message of a consumer
    // that was made anew under the same name: at most a copy comes, which
    // the processed markers take out. What counts is that k/2 never comes
    // before k/1.
    client
        .publish(earlier.reply.clone().unwrap(), "-NAK".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let mut order: Vec<String> = Vec::new();
    let mut distinct = std::collections::HashSet::new();
    while distinct.len() < steps.len() {
        let d = tokio::time::timeout(Duration::from_secs(15), reader.next())
            .await
            .expect("the reader handed nothing over")
            .unwrap()
            .unwrap();
        let got = d.message.decode().unwrap().decode::<Probe>().unwrap();
        let step = format!("{}/{}", got.key, got.seq);
        distinct.insert(step.clone());
        order.push(step);
        d.ack(tidings_core::AckKind::Ack).await.unwrap();
    }
    let first = |step: &str| order.iter().position(|s| s == step).unwrap();
    assert_eq!(order.first().map(String::as_str), Some("k/1"), "{order:?}");
    assert!(first("k/1") < first("k/2"), "{order:?}");
    reader.close().await.unwrap();
}

/// A stream set up with a smaller `max_msg_size` than the server's
/// `max_payload` refuses a larger message in its PubAck: that is a
/// permanent failure, for the relay to set the record aside, not a reason
/// to try again forever; a message that fits still goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_too_small_for_a_message_refuses_it_for_good() {
    use async_nats::jetstream;
    use tidings_core::{ErrorClass, Publisher};
    let server = PrivateNats::start();
    let nats = NatsTransport::connect(&server.url()).await.unwrap();
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    // An operator made the stream first, with a limit of its own.
    js.create_stream(jetstream::stream::Config {
        name: nats.stream_name(TOPIC),
        subjects: vec![format!("TIDINGS.{TOPIC}.>")],
        max_message_size: 2048,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut large = probe(TOPIC, &"k".repeat(4096), 1);
    large.envelope.aggregate_key = "large".into();
    nats.publish(&[probe(TOPIC, "small", 1)])
        .await
        .expect("a message that fits goes");
    let e = nats
        .publish(&[large])
        .await
        .expect_err("the stream took a message over its limit");
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("max_msg_size"), "{e}");
}
