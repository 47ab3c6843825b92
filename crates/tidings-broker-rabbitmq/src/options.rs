//! [`RabbitOptions`]: prefix, prefetch, connection name, partitions.

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
}

impl Default for RabbitOptions {
    /// Names prefixed `tidings.`, 64 unacknowledged messages per member, one partition per topic.
    fn default() -> Self {
        RabbitOptions {
            prefix: "tidings".into(),
            prefetch: 64,
            connection_name: None,
            partitions: 1,
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

    /// The partitions and prefix every publisher and subscriber of the
    /// system shares ([`Topology`]), set at once.
    pub fn topology(mut self, topology: &Topology) -> Self {
        self.partitions = topology.partition_count();
        if let Some(prefix) = topology.resource_prefix() {
            self.prefix = prefix.to_owned();
        }
        self
    }

    /// Unacknowledged messages one member may hold (backpressure).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }
}
