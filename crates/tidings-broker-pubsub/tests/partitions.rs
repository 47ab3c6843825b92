//! Every publisher and consumer group of a topic must use one partition
//! count: each count has Pub/Sub topics of its own, and a transport
//! configured for another count than the project's topics already have is
//! refused, naming both. Against the emulator (`PUBSUB_EMULATOR_HOST`).

use tidings_broker_pubsub::{PubSubOptions, PubSubTransport};
use tidings_core::{Error, ErrorClass, Publisher, Subscriber};
use tidings_testkit::conformance::{fresh_group, fresh_topic, probe};
use tidings_testkit::pubsub::pubsub_url;

async fn open(partitions: u32) -> PubSubTransport {
    let options = PubSubOptions::default().partitions(partitions);
    PubSubTransport::connect_with(&pubsub_url(), options)
        .await
        .unwrap_or_else(|e| panic!("the Pub/Sub emulator is not reachable (set PUBSUB_EMULATOR_HOST): {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_in_four_partitions_refuses_a_transport_of_two() {
    let (four, two) = (open(4).await, open(2).await);
    let (topic, group) = (fresh_topic(), fresh_group("partitions"));
    four.ensure_group(&group, &topic).await.unwrap();
    four.check_partitions(&topic).await.unwrap();
    four.publish(&[probe(&topic, "k", 1)]).await.unwrap();

    // A group of two partitions would read topics nobody publishes to: it
    // does not start, and says why.
    let refused = two.check_partitions(&topic).await.unwrap_err();
    assert!(matches!(refused, Error::Config { .. }), "{refused}");
    assert_eq!(refused.class(), ErrorClass::Permanent);
    let said = refused.to_string();
    assert!(
        said.contains("for 4 partitions") && said.contains("configured for 2"),
        "{said}"
    );
    // Nor are its subscriptions made.
    let other = fresh_group("partitions");
    let refused = two.ensure_group(&other, &topic).await.unwrap_err();
    assert!(refused.to_string().contains("configured for 2"), "{refused}");

    // A relay of two partitions keeps its messages in the outbox until the
    // counts agree: refused, retryably.
    let refused = two.publish(&[probe(&topic, "k", 2)]).await.unwrap_err();
    assert!(refused.class().is_retryable(), "{refused}");
    assert!(refused.to_string().contains("for 4 partitions"), "{refused}");

    // A transport of the same count goes on.
    let again = open(4).await;
    again.check_partitions(&topic).await.unwrap();
    again.publish(&[probe(&topic, "k", 3)]).await.unwrap();

    for id in four.subscriptions() {
        four.delete_subscription(&id).await.unwrap();
    }
    for id in four.topics() {
        four.delete_topic(&id).await.unwrap();
    }
}
