//! An envelope carrying `Nats-*` headers (kept from a message read
//! elsewhere, say) is published as any other: JetStream never reads them as
//! instructions to this publish (a rollup purging the stream, an expected
//! sequence refusing the message).

use std::time::Duration;

use futures::StreamExt;
use tidings_broker_nats::{NatsOptions, NatsTransport};
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::probe;
use tidings_testkit::nats::nats_url;

#[tokio::test]
async fn nats_control_headers_of_an_envelope_are_not_obeyed() {
    let url = nats_url();
    let topic = tidings_testkit::conformance::fresh_topic();
    let nats = NatsTransport::connect_with(&url, NatsOptions::default())
        .await
        .unwrap_or_else(|e| panic!("NATS JetStream is not reachable at {url} (set NATS_URL): {e}"));
    nats.ensure_group("readers", &topic).await.unwrap();

    let first = probe(&topic, "k", 1);
    let mut second = probe(&topic, "k", 2);
    for (name, value) in [
        ("Nats-Rollup", "all"),
        ("Nats-Expected-Last-Sequence", "999"),
        ("Nats-Expected-Stream", "ANOTHER"),
    ] {
        second.envelope.headers.insert(name.into(), value.into());
    }
    nats.publish(&[first.clone(), second.clone()])
        .await
        .expect("published as any other message");

    let mut subscription = nats.subscribe("readers", &topic).await.unwrap();
    let mut read = Vec::new();
    while read.len() < 2 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.next())
            .await
            .expect("both messages within 10 s: the first was not rolled up")
            .expect("the subscription is open")
            .expect("a delivery");
        read.push(delivery.message.decode().unwrap().id);
    }
    assert_eq!(read, [first.envelope.id, second.envelope.id]);
    subscription.close().await.unwrap();
    nats.delete_topic(&topic).await.unwrap();
}
