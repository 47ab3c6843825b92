//! Names of Kafka topics and consumer groups (the table in the crate
//! documentation).

use crate::KafkaTransport;

impl KafkaTransport {
    /// The Kafka topic of a Tidings topic: the prefix, then the topic.
    pub fn kafka_topic(&self, topic: &str) -> String {
        format!("{}{topic}", self.inner.options.prefix)
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
