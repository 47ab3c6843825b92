//! Kafka passes the transport conformance suite, against a real broker
//! speaking the Kafka protocol (`KAFKA_URL`, default
//! `kafka://127.0.0.1:9092`: the Tansu broker `scripts/test` starts), with
//! three partitions per topic.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tidings_broker_kafka::{KafkaOptions, KafkaTransport};
use tidings_core::cloudevents::ContentMode;
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::{ForeignAddress, TransportUnderTest};
use tidings_testkit::kafka::kafka_url;

#[derive(Default)]
struct Kafka {
    opened: Mutex<Vec<KafkaTransport>>,
}

impl Kafka {
    async fn open(&self) -> KafkaTransport {
        self.open_in(ContentMode::Binary).await
    }

    async fn open_in(&self, mode: ContentMode) -> KafkaTransport {
        let url = kafka_url();
        // One record per producer batch: Tansu reports a partition's high
        // watermark as the last batch's base offset + 1, which undercounts
        // `pending` when batches hold several records (Kafka counts records).
        let options = KafkaOptions::default()
            .partitions(3)
            .client_setting("batch.num.messages", "1")
            .content_mode(mode);
        let t = KafkaTransport::connect_with(&url, options)
            .await
            .unwrap_or_else(|e| panic!("Kafka is not reachable at {url} (set KAFKA_URL): {e}"));
        self.opened.lock().unwrap().push(t.clone());
        t
    }
}

#[async_trait]
impl TransportUnderTest for Kafka {
    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.open().await)
    }

    async fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(self.open().await)
    }

    async fn publisher_in(&self, mode: ContentMode) -> Arc<dyn Publisher> {
        Arc::new(self.open_in(mode).await)
    }

    fn foreign_address(&self, topic: &str) -> Option<ForeignAddress> {
        let opened = self.opened.lock().unwrap();
        let t = opened.first()?;
        Some(ForeignAddress {
            broker: "kafka",
            url: kafka_url(),
            address: t.kafka_topic(topic),
        })
    }

    fn binding(&self) -> tidings_core::cloudevents::Binding {
        tidings_core::cloudevents::Binding::Kafka
    }

    async fn teardown(&self) {
        let opened = self.opened.lock().unwrap().clone();
        let mut topics: Vec<String> = opened.iter().flat_map(|t| t.topics()).collect();
        topics.sort();
        topics.dedup();
        // `delete_topic` waits for the subscriptions a check dropped without
        // closing them to let their consumers go (destroyed in the
        // background): deleting a topic under a consumer crashes it over Tansu.
        if let Some(t) = opened.first() {
            for topic in topics.iter().filter(|t| !t.ends_with(".dlq")) {
                let _ = t.delete_topic(topic).await;
            }
        }
    }
}

tidings_testkit::transport_conformance!(
    async { Kafka::default() },
    features: [
        cloudevents_attributes_travel_as_headers,
        foreign_readers_recognise_what_tidings_publishes,
        the_rust_sdk_reads_what_tidings_publishes,
        foreign_producers_are_read_once,
        foreign_plain_json_is_read_once,
        broker_counts_pending,
        a_corrupt_record_waits_alone_with_its_key,
        an_oversized_record_waits_alone_with_its_key,
    ]
);
