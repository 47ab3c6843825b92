//! Names of exchanges and queues (the table in the crate documentation).

use std::time::Duration;

use serde_json::json;
use tidings_core::Partition;
use tidings_core::addresses::{Address, Addresses, type_as_is};

use crate::{RabbitOptions, RabbitTransport};

/// Rounds a delay up to a power of two of milliseconds (at least 1 ms).
pub(crate) fn delay_bucket(d: Duration) -> u64 {
    let ms = d.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
    ms.next_power_of_two()
}

impl RabbitOptions {
    /// The exchange of `topic` (a topic exchange).
    pub fn exchange(&self, topic: &str) -> String {
        format!("{}.{topic}", self.prefix)
    }
}

/// The routing key of a message: `<partition>.<type>`.
pub(crate) fn routing_key(partition: &str, message_type: &str) -> String {
    format!("{partition}.{message_type}")
}

impl Addresses for RabbitOptions {
    fn protocol(&self) -> &'static str {
        "amqp"
    }

    /// The routing key, on the topic's exchange.
    fn address(&self, topic: &str) -> Address {
        Address {
            address: routing_key("{partition}", "{type}"),
            partitions: self.partitions,
            type_token: type_as_is,
            channel_binding: Some(json!({"amqp": {
                "is": "routingKey",
                "exchange": {"name": self.exchange(topic), "type": "topic", "durable": true, "autoDelete": false},
                "bindingVersion": "0.3.0",
            }})),
            message_binding: None,
        }
    }
}

impl RabbitTransport {
    /// The exchange of `topic`.
    pub fn exchange(&self, topic: &str) -> String {
        self.options.exchange(topic)
    }

    /// The queue of `group` on `topic` (its only partition), and the stem of
    /// the group's other names (`.dlx`, `.dead`, partition queues).
    pub fn queue(&self, topic: &str, group: &str) -> String {
        format!("{}.{topic}.{group}", self.options.prefix)
    }

    /// The queue of one partition of `group` on `topic`.
    pub fn partition_queue(&self, topic: &str, group: &str, partition: Partition) -> String {
        let stem = self.queue(topic, group);
        if partition.is_whole() {
            stem
        } else {
            format!("{stem}.{}-of-{}", partition.index, partition.count)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_fall_in_few_buckets() {
        assert_eq!(delay_bucket(Duration::ZERO), 1);
        assert_eq!(delay_bucket(Duration::from_millis(500)), 512);
        assert_eq!(delay_bucket(Duration::from_millis(512)), 512);
        assert_eq!(delay_bucket(Duration::from_secs(10)), 16384);
    }
}
