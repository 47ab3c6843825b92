//! A broker that takes smaller messages than the transport was told: a
//! private RabbitMQ node with `max_message_size = 1048576`, and a transport
//! left at its default limit (128 MiB). The broker refuses the oversized
//! record by closing the channel; the relay must still find that record,
//! set it aside naming the broker's limit, and send every other key's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_broker_rabbitmq::{RabbitOptions, RabbitTransport};
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::{TransportUnderTest, an_oversized_record_waits_alone_with_its_key};
use tidings_testkit::rabbitmq::PrivateRabbit;

struct Small {
    node: Mutex<Option<PrivateRabbit>>,
    url: String,
}

impl Small {
    async fn open(&self) -> RabbitTransport {
        RabbitTransport::connect_with(&self.url, RabbitOptions::default().partitions(3))
            .await
            .unwrap_or_else(|e| panic!("the private RabbitMQ node is not reachable at {}: {e}", self.url))
    }
}

#[async_trait]
impl TransportUnderTest for Small {
    async fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.open().await)
    }

    async fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(self.open().await)
    }

    fn redelivery_wait(&self) -> Duration {
        Duration::ZERO
    }

    async fn teardown(&self) {
        self.node.lock().unwrap().take();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_broker_refuses_for_its_size_waits_alone_with_its_key() {
    let node = tokio::task::spawn_blocking(|| PrivateRabbit::start_with("max_message_size = 1048576\n"))
        .await
        .unwrap();
    let t = Small {
        url: node.url(),
        node: Mutex::new(Some(node)),
    };
    an_oversized_record_waits_alone_with_its_key(&t).await;
    t.teardown().await;
}
