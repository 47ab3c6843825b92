//! [`RabbitOptions`]: prefix, prefetch, connection name, partitions, the
//! broker's largest message.

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

    /// Unacknowledged messages one member may hold (backpressure).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }
}
