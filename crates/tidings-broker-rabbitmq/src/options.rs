//! [`RabbitOptions`]: prefix, prefetch, connection name, partitions, the
//! broker's largest message.

use std::collections::BTreeMap;

use tidings_core::Topology;

/// Options of a [`RabbitTransport`](crate::RabbitTransport).
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct RabbitOptions {
    pub(crate) prefix: String,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) prefetch: u16,
    pub(crate) connection_name: Option<String>,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) partitions: u32,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) max_message_bytes: usize,
    pub(crate) content_mode: tidings_core::cloudevents::ContentMode,
    pub(crate) foreign: BTreeMap<String, ForeignExchange>,
}

/// Where another team's producer writes a topic on RabbitMQ: an exchange
/// it declared, and the binding key of what to read from it; see
/// [`RabbitOptions::foreign`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize), serde(deny_unknown_fields))]
pub struct ForeignExchange {
    /// The exchange.
    pub exchange: String,
    /// The binding key (`#` unless set): on a topic exchange a pattern
    /// (`payment.*`, `payment.#`), on a direct exchange the routing key,
    /// ignored by a fanout exchange.
    #[cfg_attr(feature = "serde", serde(default = "every_key"))]
    pub routing_key: String,
}

#[cfg(feature = "serde")]
fn every_key() -> String {
    "#".to_owned()
}

/// RabbitMQ's `max_message_size` by default, from 3.8 to 3.13 (134 217 728
/// bytes); RabbitMQ 4 lowered it to 16 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 128 << 20;

impl Default for RabbitOptions {
    /// Names prefixed `tidings.`, 64 unacknowledged messages per member, one
    /// partition per topic, messages up to [`DEFAULT_MAX_MESSAGE_BYTES`].
    fn default() -> Self {
        RabbitOptions {
            prefix: "tidings".into(),
            prefetch: 64,
            connection_name: None,
            partitions: 1,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            content_mode: tidings_core::cloudevents::ContentMode::Binary,
            foreign: BTreeMap::new(),
        }
    }
}

impl RabbitOptions {
    /// The prefix of exchange and queue names.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The name the broker shows for this transport's connections.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// Partitions of every topic: up to this many members of one group share
    /// a topic's work. Publishers and subscribers must use the same count.
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

    /// The largest message the broker takes: its `max_message_size`. The
    /// relay sets a larger record aside before sending it, naming the limit;
    /// a record the broker refuses all the same (its limit is lower than
    /// this says) is found and set aside too, after a failed publish.
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.max_message_bytes = n.max(1);
        self
    }

    /// Reads `topic` from `exchange`, an exchange another team's producer
    /// declared and writes, with the binding key `routing_key` (`#` for
    /// everything on a topic exchange, `payment.*`, or a direct exchange's
    /// key), instead of Tidings' own `<prefix>.<topic>` exchange.
    ///
    /// Each consumer group gets its own queue, `<prefix>.<topic>.<group>`,
    /// bound to the exchange with that key, with its dead-letter exchange
    /// as for any topic. The exchange is not declared: it must exist (until
    /// it does, subscribing fails naming it, and a consumer tries again),
    /// and a queue only receives what is
    /// published after it is bound. Such a topic has one partition: the
    /// consumer runtime handles its keys in parallel, each in order.
    /// Publishing to it (a redrive) writes on the exchange, the routing key
    /// the binding key with each wildcard word (`*`, `#`) the message type.
    ///
    /// In a configuration file (`TransportOptions`), under `[rabbitmq]`:
    /// `foreign = { payments = { exchange = "payments", routing_key = "payment.#" } }`.
    pub fn foreign(
        mut self,
        topic: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.foreign.insert(
            topic.into(),
            ForeignExchange {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
            },
        );
        self
    }

    /// Where another team writes `topic`, if it was declared
    /// [`foreign`](RabbitOptions::foreign).
    pub fn foreign_exchange(&self, topic: &str) -> Option<&ForeignExchange> {
        self.foreign.get(topic)
    }

    /// The partitions of `topic`: one for a foreign exchange.
    pub(crate) fn partitions_of(&self, topic: &str) -> u32 {
        if self.foreign.contains_key(topic) {
            1
        } else {
            self.partitions
        }
    }

    /// Unacknowledged messages one member may hold (backpressure).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }
}
