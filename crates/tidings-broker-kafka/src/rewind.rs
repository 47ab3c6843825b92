//! Moving a group's committed offsets back to a point in time.

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tidings_core::{Error, Result};

use crate::admin::committed_offsets;
use crate::{ADMIN_TIMEOUT, KafkaTransport, TRANSPORT};

impl KafkaTransport {
    /// Rewinds `group` on `topic` to the first record written at or after
    /// `since` (Kafka's offsets for times), so that its members re-read
    /// what the topic retains from then: their processed markers suppress
    /// what they already handled, so a rewind changes no business state.
    /// A partition is never moved forward (that would skip records the
    /// group has not handled).
    ///
    /// Stop the group's members first: a running member commits its own
    /// position over the rewind.
    pub async fn rewind(&self, group: &str, topic: &str, since: std::time::SystemTime) -> Result<Rewind> {
        self.rewind_or_plan(group, topic, since, true).await
    }

    /// What [`KafkaTransport::rewind`] would do, changing nothing.
    pub async fn plan_rewind(
        &self,
        group: &str,
        topic: &str,
        since: std::time::SystemTime,
    ) -> Result<Rewind> {
        self.rewind_or_plan(group, topic, since, false).await
    }

    async fn rewind_or_plan(
        &self,
        group: &str,
        topic: &str,
        since: std::time::SystemTime,
        apply: bool,
    ) -> Result<Rewind> {
        if since > std::time::SystemTime::now() {
            return Err(Error::transport_reason(
                TRANSPORT,
                "rewinding: the time is in the future: a rewind goes back",
                false,
            ));
        }
        let millis = since
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| Error::transport(TRANSPORT, "reading the rewind time", e, false))?
            .as_millis() as i64;
        let consumer = self.group_client(group)?;
        let partitions = self.partitions_of(topic).await?;
        let topic = self.kafka_topic(topic);
        tokio::task::spawn_blocking(move || {
            let committed = committed_offsets(&consumer, &topic, partitions)?;
            let mut wanted = TopicPartitionList::new();
            for p in 0..partitions as i32 {
                wanted
                    .add_partition_offset(&topic, p, Offset::Offset(millis))
                    .map_err(|e| {
                        Error::transport(TRANSPORT, "building an offsets-for-times request", e, false)
                    })?;
            }
            let found = consumer.offsets_for_times(wanted, ADMIN_TIMEOUT).map_err(|e| {
                Error::transport(TRANSPORT, "looking up offsets for the rewind time", e, true)
            })?;
            let mut rewind = Rewind::default();
            let mut commit = TopicPartitionList::new();
            for element in found.elements() {
                let partition = element.partition();
                let (_, high) = consumer
                    .fetch_watermarks(&topic, partition, ADMIN_TIMEOUT)
                    .map_err(|e| Error::transport(TRANSPORT, "reading watermarks", e, true))?;
                let target = match element.offset() {
                    Offset::Offset(o) => o,
                    _ => high,
                };
                let from = committed
                    .find_partition(&topic, partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    });
                let to = from.map_or(target, |f| f.min(target));
                commit
                    .add_partition_offset(&topic, partition, Offset::Offset(to))
                    .map_err(|e| Error::transport(TRANSPORT, "building an offset commit", e, false))?;
                rewind.messages += from.map_or(0, |f| (f - to).max(0) as u64);
                rewind.partitions.push(RewoundPartition {
                    partition: partition as u32,
                    from,
                    to,
                });
            }
            if apply {
                consumer
                    .commit(&commit, CommitMode::Sync)
                    .map_err(|e| Error::transport(TRANSPORT, "committing the rewound offsets", e, true))?;
            }
            Ok(rewind)
        })
        .await
        .map_err(|e| Error::transport(TRANSPORT, "rewinding a group", e, true))?
    }
}

/// What [`KafkaTransport::rewind`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rewind {
    /// Each partition's move.
    pub partitions: Vec<RewoundPartition>,
    /// Records the group will read again, over every partition.
    pub messages: u64,
}

/// One partition of a [`Rewind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewoundPartition {
    /// The partition.
    pub partition: u32,
    /// The group's committed offset before (`None`: it had none).
    pub from: Option<i64>,
    /// The committed offset now.
    pub to: i64,
}
