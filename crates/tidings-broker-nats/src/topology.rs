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
    /// `<prefix>.<topic>.<partition>.<type>`, the type a subject token; on
    /// a foreign topic its subject, each wildcard token the type.
    pub(crate) fn message_subject(&self, topic: &str, partition: &str, type_token: &str) -> String {
        match self.foreign_subject(topic) {
            Some(subject) => fill_wildcards(subject, type_token),
            None => format!("{}.{partition}.{type_token}", self.subject(topic)),
        }
    }

    /// What a consumer of `topic` filters on: the subjects of `partition`.
    pub(crate) fn filter_subject(&self, topic: &str, partition: Partition) -> String {
        match self.foreign_subject(topic) {
            Some(subject) => subject.to_owned(),
            None if partition.is_whole() => format!("{}.>", self.subject(topic)),
            None => format!("{}.{}.>", self.subject(topic), partition.index),
        }
    }
}

impl Addresses for NatsOptions {
    fn protocol(&self) -> &'static str {
        "nats"
    }

    fn content_mode(&self) -> tidings_core::cloudevents::ContentMode {
        self.content_mode
    }

    fn address(&self, topic: &str) -> Address {
        Address {
            address: self.message_subject(topic, "{partition}", "{type}"),
            partitions: self.partitions_of(topic),
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

/// `subject` with each wildcard token (`*`, `>`) replaced by `token`.
fn fill_wildcards(subject: &str, token: &str) -> String {
    subject
        .split('.')
        .map(|t| if t == "*" || t == ">" { token } else { t })
        .collect::<Vec<_>>()
        .join(".")
}

impl NatsOptions {
    /// The durable consumer of `group` reading `partition` of `topic`: on a
    /// foreign topic, whose stream other consumers share,
    /// `<PREFIX>_<TOPIC>_<GROUP>_<hash>`, the hash of the exact prefix,
    /// topic and group telling apart names that clean to the same tokens
    /// (`a_b`+`c` and `a`+`b_c`).
    pub(crate) fn durable(&self, group: &str, topic: &str, partition: Partition) -> String {
        if self.foreign.contains_key(topic) {
            let exact =
                tidings_core::partition::key_hash(&format!("{}\0{topic}\0{group}", self.stream_prefix));
            format!(
                "{}_{}_{}_{exact:08x}",
                stream_token(&self.stream_prefix),
                stream_token(topic),
                stream_token(group)
            )
        } else {
            durable_name(group, partition)
        }
    }
}

/// The durable consumer of `group` reading `partition`.
fn durable_name(group: &str, partition: Partition) -> String {
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

    #[test]
    fn a_foreign_topic_is_read_and_written_on_its_own_subject() {
        let options = NatsOptions::default()
            .partitions(4)
            .foreign("payments", "payments.*.events.>");
        assert_eq!(options.partitions_of("payments"), 1);
        assert_eq!(options.partitions_of("orders"), 4);
        assert_eq!(
            options.message_subject("payments", "0", "PaymentSettled"),
            "payments.PaymentSettled.events.PaymentSettled"
        );
        assert_eq!(
            options.filter_subject("payments", Partition::new(0, 1)),
            "payments.*.events.>"
        );
        assert_eq!(
            options.message_subject("orders", "2", "OrderPlaced"),
            "TIDINGS.orders.2.OrderPlaced"
        );
        let durable = options.durable("email", "payments", Partition::new(0, 1));
        assert!(durable.starts_with("TIDINGS_PAYMENTS_EMAIL_"), "{durable}");
        let collide = NatsOptions::default().foreign("a_b", "x.>").foreign("a", "y.>");
        assert_ne!(
            collide.durable("c", "a_b", Partition::new(0, 1)),
            collide.durable("b_c", "a", Partition::new(0, 1)),
            "names that clean alike stay apart"
        );
        assert_eq!(
            options.address("payments").address,
            "payments.{type}.events.{type}"
        );
    }
}
