//! What a member hands back comes back before its keys' later messages:
//! a subscription closed while it holds a key's first messages, with more
//! of the key published meanwhile, leaves the next member the whole key in
//! order. (The emulator sends a message handed back with an ack deadline
//! of 0 after the key's later ones; one whose deadline runs out, before.)

use std::time::Duration;

use futures::StreamExt;
use tidings_broker_pubsub::{PubSubOptions, PubSubTransport};
use tidings_core::{AckKind, Publisher, Subscriber};
use tidings_testkit::conformance::probe;
use tidings_testkit::pubsub::pubsub_url;

async fn seq_of(sub: &mut tidings_core::Subscription) -> (u32, tidings_core::Delivery) {
    let d = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("a delivery within 30 s")
        .expect("the subscription open")
        .expect("a delivery");
    let body: serde_json::Value = serde_json::from_slice(&d.message.decode().unwrap().payload).unwrap();
    (body["seq"].as_u64().unwrap() as u32, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_subscription_hands_back_before_the_keys_later_messages() {
    let options = PubSubOptions::default().ack_deadline(Duration::from_secs(60));
    let pubsub = PubSubTransport::connect_with(&pubsub_url(), options)
        .await
        .unwrap_or_else(|e| panic!("the Pub/Sub emulator is not reachable (set PUBSUB_EMULATOR_HOST): {e}"));
    let topic = format!("handback{}", uuid::Uuid::new_v4().simple());
    pubsub.ensure_group("g", &topic).await.unwrap();
    let first: Vec<_> = (1..=3).map(|seq| probe(&topic, "k", seq)).collect();
    pubsub.publish(&first).await.unwrap();

    let mut sub = pubsub.subscribe("g", &topic).await.unwrap();
    let (seq, held) = seq_of(&mut sub).await;
    assert_eq!(seq, 1);
    // More of the key, while the first ones are held.
    let later: Vec<_> = (4..=5).map(|seq| probe(&topic, "k", seq)).collect();
    pubsub.publish(&later).await.unwrap();
    drop(held);
    sub.close().await.unwrap();

    let mut again = pubsub.subscribe("g", &topic).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let (seq, d) = seq_of(&mut again).await;
        seen.push(seq);
        d.ack(AckKind::Ack).await.unwrap();
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5], "the key in order after the hand-back");
    again.close().await.unwrap();
    for id in pubsub.subscriptions() {
        pubsub.delete_subscription(&id).await.unwrap();
    }
    for id in pubsub.topics() {
        pubsub.delete_topic(&id).await.unwrap();
    }
}
