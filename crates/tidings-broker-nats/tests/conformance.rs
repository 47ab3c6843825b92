//! NATS JetStream passes the transport conformance suite, against the real
//! server (`NATS_URL`, default `nats://127.0.0.1:4222`), with three partitions per topic.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_broker_nats::{NatsOptions, NatsTransport};
use tidings_core::cloudevents::ContentMode;
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::{ForeignAddress, TransportUnderTest};
use tidings_testkit::nats::nats_url;

const ACK_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Nats {
    opened: Mutex<Vec<NatsTransport>>,
}

impl Nats {
    async fn open(&self) -> NatsTransport {
        self.open_in(ContentMode::Binary).await
    }

    async fn open_in(&self, mode: ContentMode) -> NatsTransport {
        let url = nats_url();
        let t = NatsTransport::connect_with(
            &url,
            NatsOptions::default()
                .ack_wait(ACK_WAIT)
                .partitions(3)
                .content_mode(mode),
        )
        .await
        .unwrap_or_else(|e| panic!("NATS JetStream is not reachable at {url} (set NATS_URL): {e}"));
        self.opened.lock().unwrap().push(t.clone());
        t
    }
}

#[async_trait]
impl TransportUnderTest for Nats {
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
            broker: "nats",
            url: nats_url(),
            address: t.subject(topic),
        })
    }

    async fn foreign_subscriber(&self, topic: &str, name: &str) -> Option<Arc<dyn Subscriber>> {
        let url = nats_url();
        let options = NatsOptions::default()
            .ack_wait(ACK_WAIT)
            .partitions(3)
            .foreign(topic, format!("{name}.0.*"));
        let t = NatsTransport::connect_with(&url, options)
            .await
            .unwrap_or_else(|e| panic!("NATS JetStream is not reachable at {url} (set NATS_URL): {e}"));
        self.opened.lock().unwrap().push(t.clone());
        Some(Arc::new(t))
    }

    fn redelivery_wait(&self) -> Duration {
        ACK_WAIT
    }

    async fn teardown(&self) {
        let opened = self.opened.lock().unwrap().clone();
        let mut streams: Vec<String> = opened.iter().flat_map(|t| t.streams()).collect();
        streams.sort();
        streams.dedup();
        if let Some(t) = opened.first() {
            for stream in streams {
                let _ = t.delete_stream(&stream).await;
            }
        }
    }
}

tidings_testkit::transport_conformance!(
    async { Nats::default() },
    features: [
        cloudevents_attributes_travel_as_headers,
        foreign_readers_recognise_what_tidings_publishes,
        foreign_producers_are_read_once,
        foreign_names_are_read,
        foreign_plain_json_is_read_once,
        broker_counts_pending,
        a_corrupt_record_waits_alone_with_its_key,
        an_oversized_record_waits_alone_with_its_key,
    ]
);
