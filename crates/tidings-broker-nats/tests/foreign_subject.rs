//! A subject another team's producer publishes with plain NATS (no
//! JetStream, no stream of its own) is read by its real name: Tidings
//! creates a stream to capture it, and a group reads the producer's plain
//! JSON once each. What Tidings publishes to that topic (a redrive) goes on
//! the producer's subject, and the group reads it there.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tidings_broker_nats::{NatsOptions, NatsTransport};
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::{fresh_group, fresh_topic, probe, read_plain_json, run_client};
use tidings_testkit::nats::nats_url;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_nats_subject_is_captured_and_read_by_its_name() {
    let url = nats_url();
    let topic = fresh_topic();
    let group = fresh_group("legacy");
    let prefix = format!("legacy-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let options = NatsOptions::default()
        .partitions(3)
        .foreign(&topic, format!("{prefix}.>"));
    let nats = NatsTransport::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("NATS JetStream is not reachable at {url} (set NATS_URL): {e}"));
    assert_eq!(nats.partitions(&topic), 1, "a foreign subject is one partition");
    nats.ensure_group(&group, &topic).await.unwrap();
    assert_eq!(
        nats.streams(),
        [nats.stream_name(&topic)],
        "no stream held the subject: one was made to capture it"
    );

    let what = format!("a plain NATS producer writing {prefix}.0.plain");
    run_client(&what, &["write-core", "nats", &url, &prefix]).await;
    read_plain_json(Arc::new(nats.clone()), group.clone(), topic.clone()).await;

    // A message Tidings publishes to the topic goes on the producer's subject.
    let mut subscription = nats.subscribe(&group, &topic).await.unwrap();
    let sent = probe(&topic, "k", 1);
    nats.publish(std::slice::from_ref(&sent)).await.unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.next())
        .await
        .expect("the published message is read within 10 s")
        .expect("a delivery")
        .unwrap();
    assert_eq!(delivery.message.decode().unwrap().id, sent.envelope.id);
    delivery.ack(tidings_core::AckKind::Ack).await.unwrap();
    subscription.close().await.unwrap();

    let client = async_nats::connect(&url).await.unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream(nats.stream_name(&topic))
        .await
        .unwrap();
    let last = stream
        .get_last_raw_message_by_subject(&format!("{prefix}.Probe"))
        .await
        .expect("the message is on the producer's subject, its type filling the wildcard");
    assert!(!last.payload.is_empty());
    nats.delete_stream(&nats.stream_name(&topic)).await.unwrap();
}
