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
    /// The exchange of `topic`: Tidings' topic exchange `<prefix>.<topic>`,
    /// or the exchange another team writes it on.
    pub fn exchange(&self, topic: &str) -> String {
        match self.foreign_exchange(topic) {
            Some(foreign) => foreign.exchange.clone(),
            None => format!("{}.{topic}", self.prefix),
        }
    }

    /// The routing key of a message of `topic`: `<partition>.<type>`, or
    /// on a foreign topic its binding key, each wildcard word the type.
    pub(crate) fn routing_key(&self, topic: &str, partition: &str, message_type: &str) -> String {
        match self.foreign_exchange(topic) {
            Some(foreign) => foreign
                .routing_key
                .split('.')
                .map(|w| if w == "*" || w == "#" { message_type } else { w })
                .collect::<Vec<_>>()
                .join("."),
            None => format!("{partition}.{message_type}"),
        }
    }

    /// The binding key of `partition` of `topic`.
    pub(crate) fn binding_key(&self, topic: &str, partition: Partition) -> String {
        match self.foreign_exchange(topic) {
            Some(foreign) => foreign.routing_key.clone(),
            None if partition.is_whole() => "#".to_owned(),
            None => format!("{}.#", partition.index),
        }
    }
}

impl Addresses for RabbitOptions {
    fn protocol(&self) -> &'static str {
        "amqp"
    }

    fn protocol_version(&self) -> Option<&'static str> {
        Some("0.9.1")
    }

    fn content_mode(&self) -> tidings_core::cloudevents::ContentMode {
        self.content_mode
    }

    /// The routing key, on the topic's exchange.
    fn address(&self, topic: &str) -> Address {
        let mut exchange = json!({"name": self.exchange(topic)});
        if self.foreign_exchange(topic).is_none() {
            // Tidings declares its own; another team's is as they made it.
            exchange =
                json!({"name": self.exchange(topic), "type": "topic", "durable": true, "autoDelete": false});
        }
        Address {
            address: self.routing_key(topic, "{partition}", "{type}"),
            partitions: self.partitions_of(topic),
            type_token: type_as_is,
            channel_binding: Some(json!({"amqp": {
                "is": "routingKey",
                "exchange": exchange,
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

    #[test]
    fn a_foreign_topic_is_read_and_written_on_its_own_exchange() {
        let options = RabbitOptions::default()
            .partitions(4)
            .foreign("payments", "billing", "payment.*.eu.#");
        assert_eq!(options.exchange("payments"), "billing");
        assert_eq!(options.exchange("orders"), "tidings.orders");
        assert_eq!(options.partitions_of("payments"), 1);
        assert_eq!(
            options.routing_key("payments", "0", "PaymentSettled"),
            "payment.PaymentSettled.eu.PaymentSettled"
        );
        assert_eq!(options.routing_key("orders", "3", "OrderPlaced"), "3.OrderPlaced");
        assert_eq!(
            options.binding_key("payments", Partition::new(0, 1)),
            "payment.*.eu.#"
        );
        assert_eq!(options.binding_key("orders", Partition::new(2, 4)), "2.#");
    }
}
