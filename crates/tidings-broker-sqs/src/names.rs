//! The names Tidings gives its SNS topics and SQS queues.
//!
//! SNS and SQS take letters, digits, `-` and `_` (and `.fifo` at the end).
//! `-` separates the parts of a name; a topic or group name with any
//! character but letters, digits and `_` has each such character made `_`
//! and a hash of it appended, so that no two names share a queue. A name
//! longer than SQS's 80 characters is cut, and ends with eight hex
//! digits of a hash of the whole name so that two long names stay apart.

use sha2::{Digest, Sha256};
use tidings_core::Partition;
use tidings_core::addresses::{Address, Addresses, type_as_is};
use tidings_core::names::{self, part};

use crate::SqsOptions;

const FIFO: &str = ".fifo";
/// SQS's longest queue name, `.fifo` included.
const QUEUE_NAME_MAX: usize = 80;
/// SNS's longest topic name, `.fifo` included.
const TOPIC_NAME_MAX: usize = 256;

/// `base` with `.fifo`, cut to `max` characters with a hash where longer.
fn fifo_name(base: &str, max: usize) -> String {
    names::fit(base, FIFO, max)
}

/// Whether queue `name` is a FIFO queue: SQS tells them by the suffix.
pub(crate) fn is_fifo(name: &str) -> bool {
    name.ends_with(FIFO)
}

impl SqsOptions {
    fn base(&self, topic: &str) -> String {
        if self.prefix.is_empty() {
            part(topic)
        } else {
            format!("{}-{}", names::prefix(&self.prefix), part(topic))
        }
    }

    /// The SNS topic of `topic`: `<prefix>-<topic>.fifo`.
    pub(crate) fn topic_name(&self, topic: &str) -> String {
        fifo_name(&self.base(topic), TOPIC_NAME_MAX)
    }

    /// The queue of `group` for `partition` of `topic`:
    /// `<prefix>-<topic>-<group>.fifo` for a topic of one partition,
    /// `<prefix>-<topic>-<group>-<p>-of-<n>.fifo` otherwise; without
    /// `.fifo` for a group that needs no order ([`SqsOptions::unordered`]).
    pub(crate) fn queue_name(&self, topic: &str, group: &str, partition: Partition) -> String {
        let mut base = format!("{}-{}", self.base(topic), part(group));
        if partition.count > 1 {
            base.push_str(&format!("-{}-of-{}", partition.index, partition.count));
        }
        self.group_queue(group, &base)
    }

    /// The dead-letter queue of `group` on `topic`, for every partition:
    /// `<prefix>-<topic>-<group>-dead.fifo` (of the type of the group's
    /// queues, as SQS wants).
    pub(crate) fn dead_queue_name(&self, topic: &str, group: &str) -> String {
        self.group_queue(group, &format!("{}-{}-dead", self.base(topic), part(group)))
    }

    /// Queue `base` of `group`: FIFO unless the group needs no order.
    fn group_queue(&self, group: &str, base: &str) -> String {
        if self.is_unordered(group) {
            names::fit(base, "", QUEUE_NAME_MAX)
        } else {
            fifo_name(base, QUEUE_NAME_MAX)
        }
    }
}

/// A message group id for `key`: the key itself where SQS takes it (up to
/// 128 printable ASCII characters), else `h-` and a hash of it; `fallback`
/// (the message id) for a message without a key, which promises no order.
pub(crate) fn message_group(key: &str, fallback: &str) -> String {
    if key.is_empty() {
        return fallback.to_owned();
    }
    if key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic()) {
        return key.to_owned();
    }
    format!("h-{}", hex::encode(Sha256::digest(key.as_bytes())))
}

impl Addresses for SqsOptions {
    /// SNS, where messages are published; each group reads its own SQS queues.
    fn protocol(&self) -> &'static str {
        "sns"
    }

    fn content_mode(&self) -> tidings_core::cloudevents::ContentMode {
        tidings_core::cloudevents::ContentMode::Structured
    }

    /// The SNS topic (one for every partition: a partition is a filter on
    /// the `tidings-partition` attribute of each group's subscriptions),
    /// FIFO, deduplicated by the id Tidings gives, not by content.
    fn address(&self, topic: &str) -> Address {
        let name = self.topic_name(topic);
        Address {
            channel_binding: Some(serde_json::json!({"sns": {
                "name": name,
                "ordering": {"type": "FIFO", "contentBasedDeduplication": false},
                "bindingVersion": "0.1.0",
            }})),
            address: name,
            partitions: self.partitions_of(topic),
            type_token: type_as_is,
            message_binding: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_to_what_sns_and_sqs_take() {
        let o = SqsOptions::default();
        assert!(o.topic_name("orders.v1").starts_with("tidings-orders_v1_"));
        assert_ne!(o.topic_name("orders.v1"), o.topic_name("orders_v1"));
        assert_eq!(o.topic_name("orders_v1"), "tidings-orders_v1.fifo");
        // `-` only ever separates: topic `a-b` with group `c` is not topic
        // `a` with group `b-c`, and group `email-dead` is not `email`'s dead letters.
        let whole = Partition { index: 0, count: 1 };
        assert_ne!(o.queue_name("a-b", "c", whole), o.queue_name("a", "b-c", whole));
        assert_ne!(
            o.queue_name("orders", "email-dead", whole),
            o.dead_queue_name("orders", "email")
        );
        assert_eq!(
            o.queue_name("orders", "email", Partition { index: 1, count: 3 }),
            "tidings-orders-email-1-of-3.fifo"
        );
        assert_eq!(
            o.queue_name("orders", "email", Partition { index: 0, count: 1 }),
            "tidings-orders-email.fifo"
        );
        let long = "g".repeat(100);
        let a = o.queue_name("orders", &long, Partition { index: 0, count: 1 });
        let b = o.queue_name("orders", &format!("{long}x"), Partition { index: 0, count: 1 });
        assert_eq!(a.len(), 80);
        assert_ne!(a, b);
        assert!(a.ends_with(".fifo"));
    }

    #[test]
    fn a_group_that_needs_no_order_has_standard_queues() {
        let o = SqsOptions::default().unordered("analytics");
        let p = Partition { index: 1, count: 2 };
        assert_eq!(
            o.queue_name("orders", "analytics", p),
            "tidings-orders-analytics-1-of-2"
        );
        assert_eq!(
            o.dead_queue_name("orders", "analytics"),
            "tidings-orders-analytics-dead"
        );
        assert_eq!(
            o.queue_name("orders", "email", p),
            "tidings-orders-email-1-of-2.fifo"
        );
        assert!(!is_fifo(&o.queue_name("orders", "analytics", p)));
        assert!(is_fifo(&o.dead_queue_name("orders", "email")));
        // The topic stays FIFO: the other groups keep their order.
        assert_eq!(o.topic_name("orders"), "tidings-orders.fifo");
    }

    #[test]
    fn a_key_sqs_cannot_take_as_a_group_is_hashed() {
        assert_eq!(message_group("o-1", "id"), "o-1");
        assert_eq!(message_group("", "id"), "id");
        let spaced = message_group("order 1", "id");
        assert!(spaced.starts_with("h-") && spaced.len() == 66, "{spaced}");
        assert_ne!(spaced, message_group("order 2", "id"));
    }
}
