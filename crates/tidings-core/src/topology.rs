//! How a system's topics lie on a transport, set once.

/// How a system's topics lie on a transport: the partitions of every topic
/// and the prefix of the transport's resources (NATS streams, RabbitMQ
/// exchanges and queues, Kafka topics and group ids).
///
/// The relay's publisher and every consumer's subscriber must agree on
/// both, or a key's messages land in a partition nobody reads in order:
/// build one `Topology` and give it to each transport's options
/// (`NatsOptions::topology`, `RabbitOptions::topology`,
/// `KafkaOptions::topology`, `LogReaderConfig::topology`).
///
/// ```
/// use tidings_core::Topology;
///
/// let shop = Topology::default().partitions(8).prefix("shop");
/// assert_eq!(shop.partition_count(), 8);
/// assert_eq!(shop.resource_prefix(), Some("shop"));
/// assert_eq!(Topology::default().partition_count(), 1);
/// ```
///
/// Deserialized from `{ partitions = 8, prefix = "shop", content_mode =
/// "structured" }`, every key
/// optional (`partitions = 0` reads as 1, as the setter keeps it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Topology {
    #[serde(deserialize_with = "crate::clamp::at_least_one")]
    partitions: u32,
    prefix: Option<String>,
    content_mode: Option<crate::cloudevents::ContentMode>,
}

impl Default for Topology {
    /// One partition per topic; each transport's own default prefix.
    fn default() -> Self {
        Topology {
            partitions: 1,
            prefix: None,
            content_mode: None,
        }
    }
}

impl Topology {
    /// Partitions of every topic: up to this many members of one group
    /// share a topic's work, each key in one of them (at least 1).
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The prefix of the transport's resources, so that systems sharing a
    /// broker stay apart.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How publishers write events: CloudEvents binary mode (the default)
    /// or structured mode, for readers that only take one JSON document.
    /// Consumers read both, whatever this says.
    pub fn content_mode(mut self, mode: crate::cloudevents::ContentMode) -> Self {
        self.content_mode = Some(mode);
        self
    }

    /// The content mode, if one was set (else each transport's own, binary by default).
    pub fn events_content_mode(&self) -> Option<crate::cloudevents::ContentMode> {
        self.content_mode
    }

    /// The partitions of every topic.
    pub fn partition_count(&self) -> u32 {
        self.partitions
    }

    /// The prefix, if one was set (else each transport uses its default).
    pub fn resource_prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }
}
