//! RabbitMQ passes the transport conformance suite, against the real
//! broker (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), with three partitions
//! per topic, told that the broker takes messages of 1 MiB at most.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_broker_rabbitmq::{RabbitOptions, RabbitTransport};
use tidings_core::cloudevents::ContentMode;
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::{ForeignAddress, TransportUnderTest};
use tidings_testkit::rabbitmq::amqp_url;

#[derive(Default)]
struct Rabbit {
    opened: Mutex<Vec<RabbitTransport>>,
}

impl Rabbit {
    async fn open(&self) -> RabbitTransport {
        self.open_in(ContentMode::Binary).await
    }

    async fn open_in(&self, mode: ContentMode) -> RabbitTransport {
        let url = amqp_url();
        let options = RabbitOptions::default()
            .partitions(3)
            .max_message_bytes(1 << 20)
            .content_mode(mode);
        let t = RabbitTransport::connect_with(&url, options)
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ is not reachable (set AMQP_URL): {e}"));
        self.opened.lock().unwrap().push(t.clone());
        t
    }
}

#[async_trait]
impl TransportUnderTest for Rabbit {
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
            broker: "rabbitmq",
            url: amqp_url(),
            address: t.exchange(topic),
        })
    }

    async fn foreign_subscriber(&self, topic: &str, name: &str) -> Option<Arc<dyn Subscriber>> {
        let url = amqp_url();
        let options = RabbitOptions::default().partitions(3).foreign(topic, name, "0.#");
        let t = RabbitTransport::connect_with(&url, options)
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ is not reachable (set AMQP_URL): {e}"));
        self.opened.lock().unwrap().push(t.clone());
        Some(Arc::new(t))
    }

    fn redelivery_wait(&self) -> Duration {
        // A closed channel's unacknowledged messages are requeued at once.
        Duration::ZERO
    }

    async fn teardown(&self) {
        let opened = self.opened.lock().unwrap().clone();
        let Some(t) = opened.first() else { return };
        let mut queues: Vec<String> = opened.iter().flat_map(|t| t.queues()).collect();
        let mut exchanges: Vec<String> = opened.iter().flat_map(|t| t.exchanges()).collect();
        queues.sort();
        queues.dedup();
        exchanges.sort();
        exchanges.dedup();
        for q in queues {
            let _ = t.delete_queue(&q).await;
        }
        for x in exchanges {
            let _ = t.delete_exchange(&x).await;
        }
    }
}

tidings_testkit::transport_conformance!(
    async { Rabbit::default() },
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
