//! SNS + SQS pass the transport conformance suite, against moto's server
//! (`SQS_ENDPOINT`, default `http://127.0.0.1:5000`), with three
//! partitions per topic.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_broker_sqs::{SqsOptions, SqsTransport};
use tidings_core::cloudevents::ContentMode;
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::{ForeignAddress, TransportUnderTest};
use tidings_testkit::sqs::{sqs_endpoint, sqs_url};

#[derive(Default)]
struct Sqs {
    opened: Mutex<Vec<SqsTransport>>,
}

impl Sqs {
    async fn open(&self) -> SqsTransport {
        let options = SqsOptions::default()
            .partitions(3)
            .static_credentials("test", "test")
            .receive_wait(Duration::from_secs(1))
            .visibility_timeout(Duration::from_secs(5))
            .max_message_bytes(1 << 20);
        let t = SqsTransport::connect_with(&sqs_url(), options)
            .await
            .unwrap_or_else(|e| panic!("moto's SNS/SQS is not reachable (set SQS_ENDPOINT): {e}"));
        self.opened.lock().unwrap().push(t.clone());
        t
    }
}

#[async_trait]
impl TransportUnderTest for Sqs {
    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.open().await)
    }

    async fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(self.open().await)
    }

    /// SNS + SQS carry events in structured mode only.
    async fn publisher_in(&self, mode: ContentMode) -> Arc<dyn Publisher> {
        assert_eq!(
            mode,
            ContentMode::Structured,
            "SNS + SQS carry events in structured mode only"
        );
        self.publisher().await
    }

    /// The SNS topic: a foreign reader subscribes a FIFO queue of its own to
    /// it, a foreign producer publishes to it.
    fn foreign_address(&self, topic: &str) -> Option<ForeignAddress> {
        let opened = self.opened.lock().unwrap();
        let t = opened.first()?;
        Some(ForeignAddress {
            broker: "sqs",
            url: sqs_endpoint(),
            address: t.topic(topic),
        })
    }

    fn redelivery_wait(&self) -> Duration {
        // A closed subscription makes what it held visible at once; a
        // crashed one's come back after the visibility timeout.
        Duration::from_secs(6)
    }

    async fn teardown(&self) {
        let opened = self.opened.lock().unwrap().clone();
        let Some(t) = opened.first() else { return };
        let mut queues: Vec<String> = opened.iter().flat_map(|t| t.queues()).collect();
        queues.sort();
        queues.dedup();
        for q in queues {
            let _ = t.delete_queue(&q).await;
        }
        for o in &opened {
            for topic in o.topics() {
                let _ = o.delete_topic(&topic).await;
            }
        }
    }
}

tidings_testkit::transport_conformance!(
    async { Sqs::default() },
    features: [
        foreign_readers_recognise_what_tidings_publishes,
        foreign_producers_are_read_once,
        foreign_plain_json_is_read_once,
        broker_counts_pending,
        a_corrupt_record_waits_alone_with_its_key,
        an_oversized_record_waits_alone_with_its_key,
    ]
);
