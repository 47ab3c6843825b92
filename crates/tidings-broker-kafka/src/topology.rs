//! Names of Kafka topics and consumer groups (the table in the crate
//! documentation).

use serde_json::json;
use tidings_core::addresses::{Address, Addresses, type_as_is};

use crate::{KafkaOptions, KafkaTransport};

impl KafkaOptions {
    /// The Kafka topic of a Tidings topic: the prefix, then the topic; a
    /// [`foreign`](KafkaOptions::foreign) topic's real name.
    pub fn kafka_topic(&self, topic: &str) -> String {
        match self.foreign.get(topic) {
            Some(name) => name.clone(),
            None => format!("{}{topic}", self.prefix),
        }
    }
}

impl Addresses for KafkaOptions {
    /// `kafka-secure` where the client settings ask for TLS
    /// (`security.protocol` `ssl` or `sasl_ssl`).
    fn protocol(&self) -> &'static str {
        let tls = self
            .client
            .iter()
            .rev()
            .find(|(k, _)| k == "security.protocol")
            .is_some_and(|(_, v)| v.eq_ignore_ascii_case("ssl") || v.eq_ignore_ascii_case("sasl_ssl"));
        if tls { "kafka-secure" } else { "kafka" }
    }

    fn content_mode(&self) -> tidings_core::cloudevents::ContentMode {
        self.content_mode
    }

    fn address(&self, topic: &str) -> Address {
        let name = self.kafka_topic(topic);
        // Another team's topic has the partitions it has on the broker.
        let binding = if self.is_foreign(topic) {
            json!({"kafka": {"topic": name, "bindingVersion": "0.5.0"}})
        } else {
            json!({"kafka": {"topic": name, "partitions": self.partitions, "bindingVersion": "0.5.0"}})
        };
        Address {
            channel_binding: Some(binding),
            address: name,
            partitions: self.partitions,
            type_token: type_as_is,
            message_binding: Some(json!({"kafka": {
                "key": {"type": ["string", "null"], "description": "The aggregate key: a key's records are in one partition, in order (null for events without one)."},
                "bindingVersion": "0.5.0",
            }})),
        }
    }
}

impl KafkaTransport {
    /// The Kafka topic of a Tidings topic: the prefix, then the topic.
    pub fn kafka_topic(&self, topic: &str) -> String {
        self.inner.options.kafka_topic(topic)
    }

    /// The Kafka consumer group id of a Tidings consumer group.
    pub fn group_id(&self, group: &str) -> String {
        format!("{}{group}", self.inner.options.prefix)
    }

    /// The Kafka dead-letter topic of a Tidings topic: the prefix, the
    /// topic, the suffix; for another team's topic
    /// `<prefix><topic>.tidings<suffix>`, a name of Tidings' own that
    /// cannot be the other team's `<topic>.dlq`.
    pub fn dead_letter_topic(&self, topic: &str) -> String {
        let options = &self.inner.options;
        let marker = if options.is_foreign(topic) { ".tidings" } else { "" };
        format!("{}{topic}{marker}{}", options.prefix, options.dead_letter_suffix)
    }
}
