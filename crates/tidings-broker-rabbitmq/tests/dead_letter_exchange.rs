//! A terminated delivery goes to the group's dead-letter queue in RabbitMQ.

use futures::StreamExt;
use lapin::options::BasicGetOptions;
use lapin::types::AMQPValue;
use tidings_broker_rabbitmq::RabbitTransport;
use tidings_core::{AckKind, Envelope, OutgoingMessage, Publisher, Subscriber};
use tidings_testkit::conformance::{Probe, fresh_group, fresh_topic};
use tidings_testkit::rabbitmq::amqp_url;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_messages_land_in_the_dead_letter_queue() {
    let url = amqp_url();
    let rabbit = RabbitTransport::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable (set AMQP_URL): {e}"));
    let (topic, group) = (fresh_topic(), fresh_group("dlx"));
    let mut sub = rabbit.subscribe(&group, &topic).await.unwrap();
    let envelope = Envelope::new(
        "dlx-test",
        &Probe {
            key: "k".into(),
            seq: 1,
        },
    )
    .unwrap();
    rabbit
        .publish(&[OutgoingMessage {
            topic: topic.clone(),
            envelope: envelope.clone(),
        }])
        .await
        .unwrap();
    let d = sub.next().await.unwrap().unwrap();
    d.ack(AckKind::Term).await.unwrap();
    sub.close().await.unwrap();

    let dead = format!("{}.dead", rabbit.queue(&topic, &group));
    let connection = lapin::Connection::connect(&url, Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut got = None;
    for _ in 0..50 {
        got = channel
            .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        if got.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let message = got.expect("the terminated message is in the dead-letter queue");
    assert_eq!(message.delivery.data, envelope.payload);
    let id = message
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("ce-id").cloned());
    assert!(
        matches!(id, Some(AMQPValue::LongString(s)) if s.as_bytes() == envelope.id.to_string().as_bytes())
    );

    for q in rabbit.queues() {
        let _ = rabbit.delete_queue(&q).await;
    }
    for x in rabbit.exchanges() {
        let _ = rabbit.delete_exchange(&x).await;
    }
}
