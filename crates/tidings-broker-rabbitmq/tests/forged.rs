//! Messages published by other clients, with headers Tidings does not
//! write: a huge `x-tidings-delivery-count` is not the runtime's
//! bookkeeping (the message is handled like any other, not dead-lettered
//! as a crash loop), and CloudEvents attributes of other AMQP types are
//! read, or refused naming the header.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use sqlx::Postgres;
use tidings_broker_rabbitmq::RabbitTransport;
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{Envelope, FailureStore, OutgoingMessage, Publisher, Subscriber, cloudevents};
use tidings_testkit::conformance::{Probe, fresh_group, fresh_topic};
use tidings_testkit::rabbitmq::amqp_url;
use tidings_testkit::services::PgTestDb;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Default)]
struct Count(Arc<AtomicU64>);

#[async_trait]
impl Handler<Postgres> for Count {
    async fn handle(&self, _: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn envelope(seq: u32) -> Envelope {
    Envelope::new("forged-test", &Probe { key: "k".into(), seq }).unwrap()
}

/// Publishes `envelope` by hand, in binary mode, with `extra` headers.
async fn publish_by_hand(
    url: &str,
    rabbit: &RabbitTransport,
    topic: &str,
    envelope: &Envelope,
    extra: FieldTable,
) {
    let (attributes, payload) = cloudevents::to_binary(envelope, cloudevents::Binding::Standard);
    let mut headers = FieldTable::default();
    for (k, v) in &attributes {
        headers.insert(
            ShortString::from(k.as_str()),
            AMQPValue::LongString(LongString::from(v.as_str())),
        );
    }
    for (k, v) in extra.inner() {
        headers.insert(k.clone(), v.clone());
    }
    let connection = lapin::Connection::connect(url, Default::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_publish(
            rabbit.exchange(topic).as_str().into(),
            format!("0.{}", envelope.message_type).as_str().into(),
            BasicPublishOptions::default(),
            &payload,
            BasicProperties::default()
                .with_headers(headers)
                .with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Runs a consumer of `group` until it settled `n` messages; returns what its handler saw.
async fn settle(rabbit: &RabbitTransport, db: &PgTestDb, group: &str, topic: &str, n: u64) -> u64 {
    let handled = Count::default();
    let consumer = Consumer::new(group, db.store.clone(), handled.clone())
        .topic(topic)
        .config(ConsumerConfig::default().max_crashes(1));
    let stats = consumer.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (rabbit, stop) = (rabbit.clone(), stop.clone());
        async move { consumer.run(&rabbit, stop).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.handled() + stats.dead_lettered() < n {
        assert!(Instant::now() < deadline, "the messages were not settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await.unwrap().unwrap();
    handled.0.load(Ordering::SeqCst)
}

/// A fresh group on a fresh topic, and one message in it as Tidings
/// publishes it (which declares the exchange): (AMQP URL, transport,
/// database, topic, group).
async fn group_with_one_message(prefix: &str) -> (String, RabbitTransport, PgTestDb, String, String) {
    let url = amqp_url();
    let rabbit = RabbitTransport::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable (set AMQP_URL): {e}"));
    let db = PgTestDb::new().await;
    let (topic, group) = (fresh_topic(), fresh_group(prefix));
    rabbit
        .subscribe(&group, &topic)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    rabbit
        .publish(&[OutgoingMessage {
            topic: topic.clone(),
            envelope: envelope(1),
        }])
        .await
        .unwrap();
    (url, rabbit, db, topic, group)
}

async fn clean_up(rabbit: &RabbitTransport, db: PgTestDb) {
    for q in rabbit.queues() {
        let _ = rabbit.delete_queue(&q).await;
    }
    for x in rabbit.exchanges() {
        let _ = rabbit.delete_exchange(&x).await;
    }
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_delivery_count_is_not_a_crash_loop() {
    let (url, rabbit, db, topic, group) = group_with_one_message("forged").await;
    // One more by hand, claiming a million deliveries.
    let mut extra = FieldTable::default();
    extra.insert(
        "x-tidings-delivery-count".into(),
        AMQPValue::LongString(LongString::from("1000000")),
    );
    publish_by_hand(&url, &rabbit, &topic, &envelope(2), extra).await;
    assert_eq!(settle(&rabbit, &db, &group, &topic, 2).await, 2);
    let letters = db.store.dead_letters(&Default::default()).await.unwrap();
    assert!(letters.is_empty(), "dead-lettered: {letters:?}");
    clean_up(&rabbit, db).await;
}

/// A time as an AMQP timestamp and an extension as an integer are read; an
/// extension that is a table is refused, and the dead letter names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_of_other_amqp_types_are_read_or_refused_by_name() {
    let (url, rabbit, db, topic, group) = group_with_one_message("typed").await;
    let mut typed = FieldTable::default();
    typed.insert("ce-time".into(), AMQPValue::Timestamp(1_700_000_000));
    typed.insert("ce-priority".into(), AMQPValue::LongInt(7));
    let read = envelope(2);
    publish_by_hand(&url, &rabbit, &topic, &read, typed).await;
    let mut table = FieldTable::default();
    table.insert("ce-routing".into(), AMQPValue::FieldTable(FieldTable::default()));
    let refused = Envelope::new(
        "forged-test",
        &Probe {
            key: "other".into(),
            seq: 1,
        },
    )
    .unwrap();
    publish_by_hand(&url, &rabbit, &topic, &refused, table).await;

    assert_eq!(
        settle(&rabbit, &db, &group, &topic, 3).await,
        2,
        "the typed message was not handled"
    );
    let letters = db.store.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let error = &letters[0].errors[0].error;
    assert!(error.contains("header ce-routing is a table"), "{error}");
    clean_up(&rabbit, db).await;
}
