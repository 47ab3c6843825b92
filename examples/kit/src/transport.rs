//! The transport a reference system runs over: the database log, or a
//! broker whose streams, exchanges, queues or topics are named after the
//! system.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tidings::pubsub::PubSubOptions;
use tidings::sqs::SqsOptions;
use tidings::{AnyBroker, Topology, TransportOptions};
use tidings_broker_kafka::KafkaOptions;
use tidings_broker_nats::NatsOptions;
use tidings_broker_rabbitmq::RabbitOptions;
use tidings_core::log::LogBackend;
use tidings_core::secret::redact_url as redact;
use tidings_core::{Publisher, Subscriber};
use tidings_log::LogReaderConfig;

/// A transport opened from a URL: the database log, or a broker.
pub struct Transport {
    /// What the relays publish through.
    pub publisher: Arc<dyn Publisher>,
    /// What the consumers read.
    pub subscriber: Arc<dyn Subscriber>,
    /// Which transport (no credentials).
    pub label: String,
    /// The prefix of the system's resources on the broker, if any.
    pub namespace: Option<String>,
    broker: AnyBroker,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("label", &self.label)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Opens `broker` (`nats://...`, `amqp://...`, `kafka://...`, or `None`
    /// / `log` for the database log of `store`) with `partitions` per
    /// topic, through [`tidings::open_transport_with`]. The broker's
    /// streams, exchanges and queues or topics are named after `system`, so
    /// that one system's resources stay apart from another's.
    pub async fn open<S: LogBackend + Clone>(
        store: &S,
        broker: Option<&str>,
        partitions: u32,
        system: &str,
    ) -> anyhow::Result<Transport> {
        Self::open_reading(store, broker, partitions, system, &[]).await
    }

    /// [`open`](Transport::open), the Tidings topics of `foreign` read from
    /// Kafka topics of another team's, by their real names (`(topic,
    /// kafka_topic)`): taken as they are found, partitions and all. Only
    /// Kafka reads foreign topics here: another broker is refused.
    pub async fn open_reading<S: LogBackend + Clone>(
        store: &S,
        broker: Option<&str>,
        partitions: u32,
        system: &str,
        foreign: &[(&str, &str)],
    ) -> anyhow::Result<Transport> {
        let url = broker.unwrap_or("log");
        let mut options = TransportOptions::new(Topology::default().partitions(partitions));
        options.log = LogReaderConfig::default().poll_interval(Duration::from_millis(100));
        // A short ack wait: a member taking over a partition waits one out
        // when the previous reader left messages unacknowledged.
        let nats = format!("TIDINGS_{}", system.to_uppercase().replace('-', "_"));
        options.nats = NatsOptions::default()
            .stream_prefix(&nats)
            .ack_wait(Duration::from_secs(5));
        options.rabbitmq = RabbitOptions::default().prefix(format!("tidings-{system}"));
        options.kafka = KafkaOptions::default().prefix(format!("tidings-{system}."));
        // A member that dies lets its messages go after 30 s.
        options.sqs = SqsOptions::default()
            .prefix(format!("tidings-{system}"))
            .visibility_timeout(Duration::from_secs(30));
        // A member that dies lets its messages go after 30 s too.
        options.pubsub = PubSubOptions::default()
            .prefix(format!("tidings-{system}"))
            .ack_deadline(Duration::from_secs(30));
        if !foreign.is_empty() && !url.starts_with("kafka://") {
            anyhow::bail!(
                "another team's topic ({}) is read from Kafka: give a kafka:// broker, not {}",
                foreign[0].1,
                redact(url)
            );
        }
        for (topic, kafka_topic) in foreign {
            options.kafka = options.kafka.foreign(*topic, *kafka_topic);
        }
        let opened = tidings::open_transport_with(url, &options, store)
            .await
            .with_context(|| format!("opening the transport at {}", redact(url)))?;
        let namespace = match &opened.broker {
            AnyBroker::Nats(_) => Some(nats),
            AnyBroker::RabbitMq(_) => Some(format!("tidings-{system}")),
            AnyBroker::Kafka(_) => Some(format!("tidings-{system}.")),
            AnyBroker::Sqs(_) => Some(format!("tidings-{system}")),
            AnyBroker::PubSub(_) => Some(format!("tidings-{system}")),
            _ => None,
        };
        Ok(Transport {
            publisher: opened.publisher.clone(),
            subscriber: opened.subscriber.clone(),
            label: opened.label().to_owned(),
            namespace,
            broker: opened.broker,
        })
    }

    /// The Kafka cluster, when the transport is Kafka.
    pub fn kafka(&self) -> Option<&tidings_broker_kafka::KafkaTransport> {
        match &self.broker {
            AnyBroker::Kafka(kafka) => Some(kafka),
            _ => None,
        }
    }

    /// Removes what this system created on the broker for `topic` and its
    /// `groups`: the NATS stream, Kafka topic, SNS topic or Pub/Sub
    /// topics, and the groups' queues or subscriptions (the database log
    /// keeps its rows).
    pub async fn remove(&self, topic: &str, groups: &[&str]) -> anyhow::Result<()> {
        for group in groups {
            self.remove_group(topic, group).await?;
        }
        match &self.broker {
            AnyBroker::Nats(nats) => nats.delete_topic(topic).await?,
            AnyBroker::Kafka(kafka) => kafka.delete_topic(topic).await?,
            AnyBroker::Sqs(sqs) => sqs.delete_topic_of(topic).await?,
            AnyBroker::PubSub(pubsub) => pubsub.delete_topic_of(topic).await?,
            _ => {}
        }
        Ok(())
    }

    /// Removes `group`'s queues or subscriptions on `topic` where the
    /// broker keeps some per group (RabbitMQ, SQS, Pub/Sub), with what they
    /// hold; elsewhere a group holds nothing, and this does nothing.
    pub async fn remove_group(&self, topic: &str, group: &str) -> anyhow::Result<()> {
        match &self.broker {
            AnyBroker::RabbitMq(rabbit) => rabbit.delete_group(topic, group).await?,
            AnyBroker::Sqs(sqs) => sqs.delete_group(topic, group).await?,
            AnyBroker::PubSub(pubsub) => pubsub.delete_group(topic, group).await?,
            _ => {}
        }
        Ok(())
    }
}
