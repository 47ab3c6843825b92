//! [`KafkaOptions`], and the cluster's address from a `kafka://` URL.

use std::collections::BTreeMap;
use std::time::Duration;

use tidings_core::Topology;

/// Options of a [`KafkaTransport`](crate::KafkaTransport).
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct KafkaOptions {
    pub(crate) prefix: String,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) partitions: u32,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) replication: i32,
    pub(crate) dead_letter_suffix: String,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) max_in_flight: usize,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) commit_interval: Duration,
    #[cfg_attr(feature = "serde", serde(skip))]
    pub(crate) client: Vec<(String, String)>,
    pub(crate) content_mode: tidings_core::cloudevents::ContentMode,
    pub(crate) foreign: BTreeMap<String, String>,
}

impl Default for KafkaOptions {
    /// One partition per topic, replication factor 1 (set 3 on a real
    /// cluster), dead letters in `<topic>.dlq`, at most 1000 unsettled
    /// messages per partition, offsets committed every 200 ms.
    fn default() -> Self {
        KafkaOptions {
            prefix: String::new(),
            partitions: 1,
            replication: 1,
            dead_letter_suffix: ".dlq".to_owned(),
            max_in_flight: 1000,
            commit_interval: Duration::from_millis(200),
            client: Vec::new(),
            content_mode: tidings_core::cloudevents::ContentMode::Binary,
            foreign: BTreeMap::new(),
        }
    }
}

impl KafkaOptions {
    /// Starts every Kafka topic and consumer group id this transport uses
    /// (`shop.` makes topic `orders` Kafka's `shop.orders`, group `email`
    /// `shop.email`), so that systems sharing a cluster stay apart.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Partitions of the topics this transport creates, and the count every
    /// publisher and subscriber of a topic must agree on.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The partitions, prefix and content mode every publisher and
    /// subscriber of the system shares ([`Topology`]), set at once.
    pub fn topology(mut self, topology: &Topology) -> Self {
        self.partitions = topology.partition_count();
        if let Some(mode) = topology.events_content_mode() {
            self.content_mode = mode;
        }
        if let Some(prefix) = topology.resource_prefix() {
            self.prefix = prefix.to_owned();
        }
        self
    }

    /// How the publisher writes events: CloudEvents binary mode (the
    /// default) or structured mode. Subscribers read both.
    pub fn content_mode(mut self, mode: tidings_core::cloudevents::ContentMode) -> Self {
        self.content_mode = mode;
        self
    }

    /// Replication factor of the topics this transport creates.
    pub fn replication(mut self, n: i32) -> Self {
        self.replication = n.max(1);
        self
    }

    /// The dead-letter topic's name is the topic's plus this suffix.
    pub fn dead_letter_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.dead_letter_suffix = suffix.into();
        self
    }

    /// Unsettled messages per partition before reading waits.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// How often a subscription commits the offset it has reached.
    pub fn commit_interval(mut self, every: Duration) -> Self {
        self.commit_interval = every;
        self
    }

    /// Reads `topic` from `kafka_topic`, a Kafka topic another team
    /// created and writes, by its real name (no prefix), with the
    /// partitions it has on the broker: they are discovered when a
    /// consumer starts, every one read and leased, whatever
    /// [`partitions`](KafkaOptions::partitions) says. Tidings never
    /// creates such a topic: a consumer waits for it to exist, saying so.
    /// Its dead letters go to `<prefix><topic>.tidings<dead_letter_suffix>`,
    /// a topic of Tidings' own with as many partitions (never the other
    /// team's `<topic>.dlq`).
    ///
    /// In a configuration file (`TransportOptions`), under `[kafka]`:
    /// `foreign = { payments = "billing.payments.v1" }`.
    pub fn foreign(mut self, topic: impl Into<String>, kafka_topic: impl Into<String>) -> Self {
        self.foreign.insert(topic.into(), kafka_topic.into());
        self
    }

    /// Whether `topic` was declared [`foreign`](KafkaOptions::foreign).
    pub fn is_foreign(&self, topic: &str) -> bool {
        self.foreign.contains_key(topic)
    }

    /// Any other librdkafka setting, for producers and consumers alike
    /// (`security.protocol`, `sasl.mechanisms`, ...).
    pub fn client_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.client.push((key.into(), value.into()));
        self
    }
}

impl KafkaOptions {
    /// The largest record the producer sends: its `message.max.bytes`
    /// (librdkafka's default, 1 000 000, unless a client setting raises it).
    pub fn message_max_bytes(&self) -> usize {
        self.client
            .iter()
            .rev()
            .find(|(k, _)| k == "message.max.bytes")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(1_000_000)
    }
}

/// `kafka://host:port[,host:port]` (or a bare list) as `bootstrap.servers`.
pub(crate) fn bootstrap_servers(url: &str) -> String {
    url.strip_prefix("kafka://")
        .unwrap_or(url)
        .trim_end_matches('/')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_bootstrap_servers() {
        assert_eq!(bootstrap_servers("kafka://127.0.0.1:9092"), "127.0.0.1:9092");
        assert_eq!(bootstrap_servers("kafka://a:9092,b:9092/"), "a:9092,b:9092");
        assert_eq!(bootstrap_servers("a:9092"), "a:9092");
    }
}
