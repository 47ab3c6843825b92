//! A nats-server killed while it hands messages out can come back with a
//! consumer's state older than what it delivered: it saves that state
//! asynchronously. It then numbers its deliveries from the older point
//! again, hands out newer messages at once and the older unacknowledged
//! ones only when their ack wait runs out. The reader must keep each key
//! in order all the same.
//!
//! The test makes that state on purpose: it saves the consumer's state
//! files while the server is stopped, lets the reader go further, kills
//! the server and puts the saved files back before starting it again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use tidings_broker_nats::{NatsOptions, NatsTransport};
use tidings_core::{AckKind, Delivery, Envelope, OutgoingMessage, Publisher, Subscriber, Subscription};
use tidings_testkit::conformance::Probe;
use tidings_testkit::nats::PrivateNats;

const GROUP: &str = "ledger";
const TOPIC: &str = "steps";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_back_with_older_consumer_state_keeps_each_key_in_order() {
    let mut server = PrivateNats::start();
    let options = NatsOptions::default().ack_wait(Duration::from_secs(1));
    let nats = NatsTransport::connect_with(&server.url(), options)
        .await
        .unwrap_or_else(|e| panic!("the private nats-server is not reachable: {e}"));
    nats.ensure_group(GROUP, TOPIC).await.unwrap();
    publish(&nats, 1).await;

    // A reader takes step 1 and closes without settling it: the server
    // holds it as delivered and unacknowledged, and writes that down when
    // stopped.
    let mut first = nats.subscribe(GROUP, TOPIC).await.unwrap();
    let step = next(&mut first).await;
    assert_eq!(seq_of(&step), 1);
    drop(step);
    first.close().await.unwrap();
    server.stop_gracefully();
    let saved = save_consumer_state(server.store_dir());
    server.resume();

    // The reader under test takes step 1 back and then step 2, settling both.
    let mut reader = nats.subscribe(GROUP, TOPIC).await.unwrap();
    let step = next(&mut reader).await;
    assert_eq!(seq_of(&step), 1);
    step.ack(AckKind::Ack).await.unwrap();
    publish(&nats, 2).await;
    let step = next(&mut reader).await;
    assert_eq!(seq_of(&step), 2);
    step.ack(AckKind::Ack).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while nats.pending(GROUP, TOPIC).await.unwrap() != Some(0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the acknowledgements never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Killed, and back with the consumer's state as it was saved: step 1
    // delivered and unacknowledged, step 2 never delivered.
    server.stop();
    restore_consumer_state(server.store_dir(), &saved);
    server.resume();
    let again = [next(&mut reader).await, next(&mut reader).await];
    assert_eq!(
        again.each_ref().map(seq_of),
        [1, 2],
        "after the restart the reader handed step 2 out before step 1"
    );
    for step in again {
        step.ack(AckKind::Ack).await.unwrap();
    }
    reader.close().await.unwrap();
}

async fn publish(nats: &NatsTransport, seq: u32) {
    let probe = Probe { key: "k".into(), seq };
    let envelope = Envelope::new("restart-test", &probe).unwrap();
    nats.publish(&[OutgoingMessage {
        topic: TOPIC.into(),
        envelope,
    }])
    .await
    .unwrap();
}

async fn next(subscription: &mut Subscription) -> Delivery {
    tokio::time::timeout(Duration::from_secs(20), subscription.next())
        .await
        .expect("a delivery within 20 s")
        .expect("the subscription goes on")
        .expect("a delivery, not an error")
}

fn seq_of(d: &Delivery) -> u32 {
    // Binary mode carries the data alone; structured mode, the whole event.
    let body: serde_json::Value = serde_json::from_slice(&d.message.body).unwrap();
    let data = body.get("data").unwrap_or(&body);
    data["seq"].as_u64().unwrap() as u32
}

/// The one consumer's directory of the server's store
/// (`jetstream/$G/streams/<stream>/obs/<consumer>`).
fn consumer_dir(store: &Path) -> PathBuf {
    let streams = store.join("jetstream").join("$G").join("streams");
    let mut found = Vec::new();
    for stream in std::fs::read_dir(&streams).unwrap() {
        let obs = stream.unwrap().path().join("obs");
        for consumer in std::fs::read_dir(&obs).into_iter().flatten() {
            found.push(consumer.unwrap().path());
        }
    }
    assert_eq!(found.len(), 1, "one consumer in {}: {found:?}", streams.display());
    found.pop().unwrap()
}

fn save_consumer_state(store: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = consumer_dir(store);
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|f| {
            let path = f.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect()
}

fn restore_consumer_state(store: &Path, saved: &[(PathBuf, Vec<u8>)]) {
    let dir = consumer_dir(store);
    for f in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    for (path, bytes) in saved {
        std::fs::write(path, bytes).unwrap();
    }
}
