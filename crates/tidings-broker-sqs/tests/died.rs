//! A reader that dies holding a key's messages: they come back after their
//! visibility timeout, in their order, to the member that reads the queue
//! next. The reader that dies is a plain AWS SDK client (any other team's
//! service reading the same queue); against moto's server (`SQS_ENDPOINT`).

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::Credentials;
use futures::StreamExt;
use tidings_broker_sqs::{SqsOptions, SqsTransport};
use tidings_core::{AckKind, Partition, Publisher, Subscriber};
use tidings_testkit::conformance::{Probe, fresh_group, fresh_topic, probe};
use tidings_testkit::sqs::{sqs_endpoint, sqs_url};

const HIDDEN: Duration = Duration::from_secs(2);

async fn open() -> SqsTransport {
    let options = SqsOptions::default()
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .visibility_timeout(Duration::from_secs(3));
    SqsTransport::connect_with(&sqs_url(), options)
        .await
        .unwrap_or_else(|e| panic!("moto's SNS/SQS is not reachable (set SQS_ENDPOINT): {e}"))
}

async fn plain_client() -> aws_sdk_sqs::Client {
    let config = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(sqs_endpoint())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .load()
        .await;
    aws_sdk_sqs::Client::new(&config)
}

#[tokio::test]
async fn a_key_held_by_a_reader_that_died_comes_back_in_order() {
    let member = open().await;
    let (topic, group) = (fresh_topic(), fresh_group("died"));
    member.ensure_group(&group, &topic).await.unwrap();
    let sent: Vec<_> = (1..=3).map(|seq| probe(&topic, "k", seq)).collect();
    member.publish(&sent).await.unwrap();

    // The other reader takes the key's three messages, hidden for a short
    // while, and dies without settling any.
    let partition = Partition::all(1).next().unwrap();
    let queue = member.partition_queue(&topic, &group, partition);
    let sqs = plain_client().await;
    let url = sqs
        .get_queue_url()
        .queue_name(&queue)
        .send()
        .await
        .unwrap_or_else(|e| panic!("queue {queue} at {}: {e:?}", sqs_endpoint()))
        .queue_url
        .expect("a queue URL");
    let mut taken = 0;
    for _ in 0..20 {
        let out = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .visibility_timeout(HIDDEN.as_secs() as i32)
            .send()
            .await
            .unwrap();
        taken += out.messages().len();
        if taken == sent.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(taken, sent.len(), "the other reader took the key's messages");

    // A Tidings member reading meanwhile gets them once they come back,
    // first to last.
    let mut reading = member
        .subscribe_partition(&group, &topic, partition)
        .await
        .unwrap();
    let mut seqs = Vec::new();
    while seqs.len() < sent.len() {
        let d = tokio::time::timeout(Duration::from_secs(30), reading.next())
            .await
            .expect("the dead reader's messages came back within 30 s")
            .expect("a delivery")
            .expect("not an error");
        let probe = d.message.decode().unwrap().decode::<Probe>().unwrap();
        seqs.push(probe.seq);
        d.ack(AckKind::Ack).await.unwrap();
    }
    assert_eq!(seqs, vec![1, 2, 3], "the key's messages in their order");

    reading.close().await.unwrap();
    let _ = member.delete_group(&topic, &group).await;
    let _ = member.delete_topic(&member.topic(&topic)).await;
}
