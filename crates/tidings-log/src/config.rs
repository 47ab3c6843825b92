//! How a subscription reads the log: batch size, window, polling, commits,
//! partitions.

use std::time::Duration;

use tidings_core::Topology;

/// Tuning of a [`LogSubscriber`](crate::LogSubscriber).
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct LogReaderConfig {
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) batch_size: usize,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) max_in_flight: usize,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) poll_interval: Duration,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) commit_interval: Duration,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) partitions: u32,
}

impl Default for LogReaderConfig {
    /// Batches of 500, at most 5000 unsettled messages per subscription,
    /// polling every 250 ms when no wake-up arrives, offsets stored at most
    /// every 100 ms, one partition per topic.
    fn default() -> Self {
        LogReaderConfig {
            batch_size: 500,
            max_in_flight: 5000,
            poll_interval: Duration::from_millis(250),
            commit_interval: Duration::from_millis(100),
            partitions: 1,
        }
    }
}

impl LogReaderConfig {
    /// Entries read per query.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// Unsettled deliveries allowed before reading pauses (backpressure).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// How often to look for new entries when no wake-up arrives.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// Partitions of every topic: members of one group can share the
    /// topic's work up to this many ways. A group's offsets are kept per
    /// partition, so changing the count starts the group's partitions anew
    /// from the beginning of the log (idempotent consumers skip what they
    /// already handled, at the cost of reading it again).
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The partitions every publisher and subscriber of the system shares
    /// ([`Topology`]; the database log has no resources to prefix).
    pub fn topology(mut self, topology: &Topology) -> Self {
        self.partitions = topology.partition_count();
        self
    }

    /// How often the settled offset is written back.
    pub fn commit_interval(mut self, d: Duration) -> Self {
        self.commit_interval = d;
        self
    }
}
