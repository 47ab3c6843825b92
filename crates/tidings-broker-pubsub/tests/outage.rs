//! Losing Pub/Sub only delays side effects: a private emulator (never the
//! shared one) is frozen while producers commit, and thawed; every event
//! is then applied once, in order per key, by the two members of the
//! group. (The emulator keeps its state in memory, so it is frozen rather
//! than killed: to its clients, a network outage.)

use std::sync::Arc;
use std::time::Duration;

use tidings_broker_pubsub::{PubSubOptions, PubSubTransport};
use tidings_testkit::outage::producers_keep_committing_while_the_broker_is_down;
use tidings_testkit::pubsub::PrivateEmulator;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_keep_committing_while_pubsub_is_unreachable_and_nothing_is_lost() {
    let mut emulator = tokio::task::spawn_blocking(PrivateEmulator::start).await.unwrap();
    let options = PubSubOptions::default()
        .partitions(2)
        // Longer than the outage: a member's lease on its messages outlasts it.
        .ack_deadline(Duration::from_secs(20));
    let pubsub = PubSubTransport::connect_with(&emulator.url(), options)
        .await
        .unwrap_or_else(|e| panic!("the private Pub/Sub emulator is not reachable at its port: {e}"));
    producers_keep_committing_while_the_broker_is_down(
        &mut emulator,
        Arc::new(pubsub.clone()),
        Arc::new(pubsub),
    )
    .await;
}
