//! Names of exchanges and queues (the table in the crate documentation).

use std::time::Duration;

use tidings_core::Partition;

use crate::RabbitTransport;

/// Rounds a delay up to a power of two of milliseconds (at least 1 ms).
pub(crate) fn delay_bucket(d: Duration) -> u64 {
    let ms = d.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
    ms.next_power_of_two()
}

impl RabbitTransport {
    /// The exchange of `topic`.
    pub fn exchange(&self, topic: &str) -> String {
        format!("{}.{topic}", self.options.prefix)
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
