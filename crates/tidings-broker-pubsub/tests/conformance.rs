//! Pub/Sub passes the transport conformance suite, against the emulator
//! (`PUBSUB_EMULATOR_HOST`, default `127.0.0.1:8085`), with three
//! partitions per topic.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_broker_pubsub::{PubSubOptions, PubSubTransport};
use tidings_core::addresses::Addresses;
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::{ForeignAddress, TransportUnderTest};
use tidings_testkit::pubsub::{PROJECT, emulator_host, pubsub_url};

#[derive(Default)]
struct PubSub {
    opened: Mutex<Vec<PubSubTransport>>,
}

fn options() -> PubSubOptions {
    PubSubOptions::default()
        .partitions(3)
        .ack_deadline(Duration::from_secs(10))
        .max_message_bytes(1 << 20)
}

impl PubSub {
    async fn open(&self) -> PubSubTransport {
        let t = PubSubTransport::connect_with(&pubsub_url(), options())
            .await
            .unwrap_or_else(|e| {
                panic!("the Pub/Sub emulator is not reachable (set PUBSUB_EMULATOR_HOST): {e}")
            });
        self.opened.lock().unwrap().push(t.clone());
        t
    }
}

#[async_trait]
impl TransportUnderTest for PubSub {
    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.open().await)
    }

    async fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(self.open().await)
    }

    /// The Pub/Sub topics of the topic's partitions, as the transport's
    /// addresses name them (`<prefix>-<topic>-{partition}-of-<n>`): a
    /// foreign reader subscribes to each, a foreign producer publishes to
    /// the first (partition 0).
    fn foreign_address(&self, topic: &str) -> Option<ForeignAddress> {
        let address = options().address(topic);
        let topics: Vec<String> = (0..address.partitions)
            .map(|p| {
                let id = address.address.replace("{partition}", &p.to_string());
                format!("projects/{PROJECT}/topics/{id}")
            })
            .collect();
        Some(ForeignAddress {
            broker: "pubsub",
            url: emulator_host(),
            address: topics.join(","),
        })
    }

    fn redelivery_wait(&self) -> Duration {
        // A closed subscription hands back what it held at once; a crashed
        // one's come back after the ack deadline.
        Duration::from_secs(12)
    }

    async fn teardown(&self) {
        let opened = self.opened.lock().unwrap().clone();
        let Some(t) = opened.first() else { return };
        let mut subscriptions: Vec<String> = opened.iter().flat_map(|t| t.subscriptions()).collect();
        let mut topics: Vec<String> = opened.iter().flat_map(|t| t.topics()).collect();
        subscriptions.sort();
        subscriptions.dedup();
        topics.sort();
        topics.dedup();
        for s in subscriptions {
            let _ = t.delete_subscription(&s).await;
        }
        for topic in topics {
            let _ = t.delete_topic(&topic).await;
        }
    }
}

tidings_testkit::transport_conformance!(
    async { PubSub::default() },
    features: [
        foreign_readers_recognise_what_tidings_publishes,
        foreign_producers_are_read_once,
        foreign_plain_json_is_read_once,
        a_corrupt_record_waits_alone_with_its_key,
        an_oversized_record_waits_alone_with_its_key,
    ]
);
