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
use tidings_testkit::conformance::Probe;
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
    let probe = Probe {
        key: "k".into(),
        seq: 1,
    };
    let envelope = Envelope::new("crash-test", &probe).unwrap();
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
