//! Names of Kafka topics and consumer groups (the table in the crate
//! documentation).

use serde_json::json;
use tidings_core::addresses::{Address, Addresses, type_as_is};

use crate::{KafkaOptions, KafkaTransport};

impl KafkaOptions {
    /// The Kafka topic of a Tidings topic: the prefix, then the topic.
    pub fn kafka_topic(&self, topic: &str) -> String {
        format!("{}{topic}", self.prefix)
    }
}

impl Addresses for KafkaOptions {
    fn protocol(&self) -> &'static str {
        "kafka"
    }

    fn address(&self, topic: &str) -> Address {
        let name = self.kafka_topic(topic);
        Address {
            channel_binding: Some(json!({"kafka": {
                "topic": name,
                "partitions": self.partitions,
                "bindingVersion": "0.5.0",
            }})),
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

    /// The Kafka dead-letter topic of a Tidings topic.
    pub fn dead_letter_topic(&self, topic: &str) -> String {
        format!(
            "{}{}",
            self.kafka_topic(topic),
            self.inner.options.dead_letter_suffix
        )
    }
}
