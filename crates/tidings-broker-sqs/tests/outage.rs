//! Losing SNS and SQS only delays side effects: a private moto server
//! (never the shared one) is frozen while producers commit, and thawed;
//! every event is then applied once, in order per key, by the two members
//! of the group. (moto keeps its state in memory, so it is frozen rather
//! than killed: to its clients, a network outage.)

use std::sync::Arc;
use std::time::Duration;

use tidings_broker_sqs::{SqsOptions, SqsTransport};
use tidings_testkit::outage::producers_keep_committing_while_the_broker_is_down;
use tidings_testkit::sqs::PrivateMoto;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_keep_committing_while_sqs_is_unreachable_and_nothing_is_lost() {
    let mut moto = tokio::task::spawn_blocking(PrivateMoto::start).await.unwrap();
    let options = SqsOptions::default()
        .partitions(2)
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        // Longer than the outage: a member's hold on its messages outlasts
        // it. (A hold that runs out lets another member take a message
        // whose old receipt the first still has; SQS refuses a stale
        // receipt, moto takes it, and a change of visibility made with
        // one can let the message's group past it.)
        .visibility_timeout(Duration::from_secs(20));
    let sqs = SqsTransport::connect_with(&moto.url(), options)
        .await
        .unwrap_or_else(|e| panic!("the private moto server is not reachable at its port: {e}"));
    producers_keep_committing_while_the_broker_is_down(&mut moto, Arc::new(sqs.clone()), Arc::new(sqs)).await;
}
