//! Losing the Kafka broker only delays side effects: a private Tansu broker
//! (never the shared one) stops answering while producers commit, and comes
//! back; every event is then applied once, in order per key, by the two
//! members of the group.

use std::sync::Arc;

use tidings_broker_kafka::{KafkaOptions, KafkaTransport};
use tidings_testkit::kafka::PrivateTansu;
use tidings_testkit::outage::producers_keep_committing_while_the_broker_is_down;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_keep_committing_while_kafka_is_frozen_and_nothing_is_lost() {
    let mut broker = tokio::task::spawn_blocking(PrivateTansu::start).await.unwrap();
    let options = KafkaOptions::default().partitions(2);
    let kafka = KafkaTransport::connect_with(&broker.url(), options)
        .await
        .unwrap_or_else(|e| panic!("the private Tansu broker is not reachable at its port: {e}"));
    let report = producers_keep_committing_while_the_broker_is_down(
        &mut broker,
        Arc::new(kafka.clone()),
        Arc::new(kafka),
    )
    .await;
    println!("{report:?}");
}
