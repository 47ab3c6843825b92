//! A group's queue deleted while a member reads it (by an operator, a
//! clean-up script) is made again by the member, subscribed again, and
//! reads what is published after; against moto's server (`SQS_ENDPOINT`).

use std::time::{Duration, Instant};

use futures::StreamExt;
use tidings_broker_sqs::{SqsOptions, SqsTransport};
use tidings_core::{AckKind, Partition, Publisher, Subscriber};
use tidings_testkit::conformance::{fresh_group, fresh_topic, probe};
use tidings_testkit::sqs::sqs_url;

async fn open() -> SqsTransport {
    let options = SqsOptions::default()
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .visibility_timeout(Duration::from_secs(5));
    SqsTransport::connect_with(&sqs_url(), options)
        .await
        .unwrap_or_else(|e| panic!("moto's SNS/SQS is not reachable (set SQS_ENDPOINT): {e}"))
}

#[tokio::test]
async fn a_queue_deleted_while_read_is_made_again_and_reads_what_is_published_after() {
    let (member, operator) = (open().await, open().await);
    let (topic, group) = (fresh_topic(), fresh_group("deleted"));
    member.ensure_group(&group, &topic).await.unwrap();
    let partition = Partition::all(1).next().unwrap();
    let mut reading = member
        .subscribe_partition(&group, &topic, partition)
        .await
        .unwrap();

    member.publish(&[probe(&topic, "k", 1)]).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(20), reading.next())
        .await
        .expect("the first probe within 20 s")
        .expect("a delivery")
        .expect("not an error");
    first.ack(AckKind::Ack).await.unwrap();

    let queue = member.partition_queue(&topic, &group, partition);
    operator.delete_queue(&queue).await.unwrap();

    // What is published while the queue is gone does not reach the group
    // (SNS has nowhere to put it): probes go on until one arrives.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seq = 1;
    let arrived = loop {
        assert!(
            Instant::now() < deadline,
            "no probe reached the group within 60 s of its queue being deleted"
        );
        seq += 1;
        if let Err(e) = operator.publish(&[probe(&topic, "k", seq)]).await {
            // moto refuses what SNS would take and drop; the relay retries.
            assert!(e.class().is_retryable(), "{e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        if let Ok(next) = tokio::time::timeout(Duration::from_secs(2), reading.next()).await {
            break next.expect("a delivery").expect("not an error");
        }
    };
    assert_eq!(arrived.message.key.as_deref(), Some("k"));
    arrived.ack(AckKind::Ack).await.unwrap();
    assert!(
        operator.queue_depth(&queue).await.unwrap().is_some(),
        "the queue exists again"
    );

    reading.close().await.unwrap();
    let _ = operator.delete_queue(&queue).await;
    let _ = operator
        .delete_queue(&operator.dead_letter_queue(&topic, &group))
        .await;
    let _ = operator.delete_topic(&operator.topic(&topic)).await;
}
