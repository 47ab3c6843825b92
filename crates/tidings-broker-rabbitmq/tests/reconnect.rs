//! A connection the broker drops is opened again: the publisher's next
//! publish reconnects and the subscription consumes again. The broker
//! itself keeps running (only this test's connections are closed, by name,
//! with `rabbitmqctl`).

use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tidings_broker_rabbitmq::{RabbitOptions, RabbitTransport};
use tidings_core::{AckKind, Envelope, OutgoingMessage, Publisher, Subscriber};
use tidings_testkit::conformance::{Probe, fresh_group, fresh_topic};
use tidings_testkit::rabbitmq::amqp_url;

/// Closes every connection whose client-provided name is `name`.
fn close_connections_named(name: &str) -> usize {
    let out = Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "--no-table-headers",
            "--silent",
            "pid",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl is installed with RabbitMQ");
    let listing = String::from_utf8_lossy(&out.stdout);
    let mut closed = 0;
    for line in listing.lines() {
        // client_properties holds {"connection_name","<name>"}.
        let mut fields = line.split('\t');
        if let (Some(pid), Some(properties)) = (fields.next(), fields.next())
            && properties.contains(&format!("\"{name}\""))
        {
            let status = Command::new("rabbitmqctl")
                .args(["close_connection", pid.trim(), "reconnect test"])
                .status()
                .expect("rabbitmqctl close_connection");
            assert!(status.success());
            closed += 1;
        }
    }
    closed
}

fn message(topic: &str, seq: u32) -> OutgoingMessage {
    let envelope = Envelope::new("reconnect-test", &Probe { key: "k".into(), seq }).unwrap();
    OutgoingMessage {
        topic: topic.to_owned(),
        envelope,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_and_subscriber_recover_from_a_dropped_connection() {
    let name = format!("tidings-reconnect-{}", fresh_group("t"));
    let options = RabbitOptions::default().connection_name(&name);
    let rabbit = RabbitTransport::connect_with(&amqp_url(), options)
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable (set AMQP_URL): {e}"));
    let (topic, group) = (fresh_topic(), fresh_group("r"));
    let mut sub = rabbit.subscribe(&group, &topic).await.unwrap();
    rabbit.publish(&[message(&topic, 1)]).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    d.ack(AckKind::Ack).await.unwrap();

    assert!(
        close_connections_named(&name) >= 1,
        "the test's connection was not found by name"
    );

    // The relay retries a failed publish; so does this loop, briefly.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match rabbit.publish(&[message(&topic, 2)]).await {
            Ok(()) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "publishing never recovered: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let d = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("the subscription did not recover")
        .unwrap()
        .unwrap();
    let seq = d.message.decode().unwrap().decode::<Probe>().unwrap().seq;
    assert_eq!(seq, 2);
    d.ack(AckKind::Ack).await.unwrap();
    sub.close().await.unwrap();
    for q in rabbit.queues() {
        let _ = rabbit.delete_queue(&q).await;
    }
    for x in rabbit.exchanges() {
        let _ = rabbit.delete_exchange(&x).await;
    }
}
