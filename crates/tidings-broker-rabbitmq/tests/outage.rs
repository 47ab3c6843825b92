//! Losing RabbitMQ only delays side effects: a private RabbitMQ node (never
//! the shared one) is killed while producers commit, and started again;
//! every event is then applied once, in order per key, by the two members
//! of the group.

use std::sync::Arc;

use tidings_broker_rabbitmq::{RabbitOptions, RabbitTransport};
use tidings_testkit::outage::producers_keep_committing_while_the_broker_is_down;
use tidings_testkit::rabbitmq::PrivateRabbit;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_keep_committing_while_rabbitmq_is_down_and_nothing_is_lost() {
    let mut broker = tokio::task::spawn_blocking(PrivateRabbit::start).await.unwrap();
    let options = RabbitOptions::default().partitions(2);
    let rabbit = RabbitTransport::connect_with(&broker.url(), options)
        .await
        .unwrap_or_else(|e| panic!("the private RabbitMQ node is not reachable at its port: {e}"));
    producers_keep_committing_while_the_broker_is_down(
        &mut broker,
        Arc::new(rabbit.clone()),
        Arc::new(rabbit),
    )
    .await;
}
