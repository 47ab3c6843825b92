//! Every publisher and consumer group of a topic must spread its messages
//! over one partition count: the SNS topic carries the first one's, and a
//! transport configured for another is refused, naming both. Against
//! moto's server (`SQS_ENDPOINT`).

use tidings_broker_sqs::{SqsOptions, SqsTransport};
use tidings_core::{Error, ErrorClass, Publisher, Subscriber};
use tidings_testkit::conformance::{fresh_group, fresh_topic, probe};
use tidings_testkit::sqs::sqs_url;

async fn open(partitions: u32) -> SqsTransport {
    let options = SqsOptions::default()
        .static_credentials("test", "test")
        .partitions(partitions);
    SqsTransport::connect_with(&sqs_url(), options)
        .await
        .unwrap_or_else(|e| panic!("moto's SNS/SQS is not reachable (set SQS_ENDPOINT): {e}"))
}

#[tokio::test]
async fn a_topic_counted_in_four_partitions_refuses_a_transport_of_two() {
    let (four, two) = (open(4).await, open(2).await);
    let (topic, group) = (fresh_topic(), fresh_group("partitions"));
    four.ensure_group(&group, &topic).await.unwrap();
    four.check_partitions(&topic).await.unwrap();
    four.publish(&[probe(&topic, "k", 1)]).await.unwrap();

    // A consumer of two partitions would read half the keys: it does not
    // start, and says why.
    let refused = two.check_partitions(&topic).await.unwrap_err();
    assert!(matches!(refused, Error::Config { .. }), "{refused}");
    assert_eq!(refused.class(), ErrorClass::Permanent);
    let said = refused.to_string();
    assert!(
        said.contains("tidings-partitions=4") && said.contains("configured for 2"),
        "{said}"
    );

    // A relay of two partitions keeps its messages in the outbox until the
    // counts agree: refused, retryably.
    let refused = two.publish(&[probe(&topic, "k", 2)]).await.unwrap_err();
    assert!(refused.class().is_retryable(), "{refused}");
    assert!(refused.to_string().contains("tidings-partitions=4"), "{refused}");
    // So is a group made by it.
    let other = fresh_group("partitions");
    let refused = two.ensure_group(&other, &topic).await.unwrap_err();
    assert!(refused.to_string().contains("configured for 2"), "{refused}");

    // A transport of the same count goes on.
    let again = open(4).await;
    again.check_partitions(&topic).await.unwrap();
    again.publish(&[probe(&topic, "k", 3)]).await.unwrap();

    four.delete_group(&topic, &group).await.unwrap();
    four.delete_topic_of(&topic).await.unwrap();
}
