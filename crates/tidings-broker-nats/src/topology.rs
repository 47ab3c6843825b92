//! Names of streams, subjects and durable consumers (the table in the
//! crate documentation), made safe for JetStream.

use tidings_core::Partition;
use tidings_core::addresses::{Address, Addresses};

use crate::{NatsOptions, NatsTransport};

/// `orders.v2` -> `ORDERS_V2`.
pub(crate) fn stream_token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Topic names keep their dots (they become subject levels), lose wildcards and spaces.
fn subject_token_keep_dots(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '*' || c == '>' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// A subject token: no dots, wildcards or spaces.
pub(crate) fn subject_token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '.' || c == '*' || c == '>' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

impl NatsOptions {
    /// The subject prefix of `topic`: `<prefix>.<topic>`.
    pub fn subject(&self, topic: &str) -> String {
        format!(
            "{}.{}",
            subject_token(&self.stream_prefix),
            subject_token_keep_dots(topic)
        )
    }

    /// The subject a message of `topic` is published on:
    /// `<prefix>.<topic>.<partition>.<type>`, the type a subject token.
    pub(crate) fn message_subject(&self, topic: &str, partition: &str, type_token: &str) -> String {
        format!("{}.{partition}.{type_token}", self.subject(topic))
    }
}

impl Addresses for NatsOptions {
    fn protocol(&self) -> &'static str {
        "nats"
    }

    fn address(&self, topic: &str) -> Address {
        Address {
            address: self.message_subject(topic, "{partition}", "{type}"),
            partitions: self.partitions,
            type_token: subject_token,
            channel_binding: None,
            message_binding: None,
        }
    }
}

impl NatsTransport {
    /// The stream that holds `topic`.
    pub fn stream_name(&self, topic: &str) -> String {
        format!(
            "{}_{}",
            stream_token(&self.options.stream_prefix),
            stream_token(topic)
        )
    }

    /// The subject prefix of `topic`: `<prefix>.<topic>`. Its messages
    /// are published on `<prefix>.<topic>.<partition>.<type>`, so a plain
    /// NATS client reads them all on `<prefix>.<topic>.>`.
    pub fn subject(&self, topic: &str) -> String {
        self.options.subject(topic)
    }
}

/// The durable consumer of `group` reading `partition`.
pub(crate) fn durable_name(group: &str, partition: Partition) -> String {
    if partition.is_whole() {
        stream_token(group)
    } else {
        format!(
            "{}-{}-OF-{}",
            stream_token(group),
            partition.index,
            partition.count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_for_jetstream() {
        assert_eq!(stream_token("checkout.commands"), "CHECKOUT_COMMANDS");
        assert_eq!(stream_token("a b*c>d"), "A_B_C_D");
        assert_eq!(subject_token("Order.Placed v2"), "Order_Placed_v2");
    }
}
