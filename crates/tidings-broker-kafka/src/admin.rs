//! Creating and deleting topics, reading a group's committed offsets, and
//! reading a dead-letter topic.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tidings_core::{Error, RawMessage, Result};

use crate::connection::client_config;
use crate::marshal::raw_message;
use crate::reading::{Reader, unread};
use crate::{ADMIN_TIMEOUT, KafkaTransport, TRANSPORT};

impl KafkaTransport {
    /// Creates the Kafka topic `topic` with `partitions` partitions if it
    /// does not exist, and returns how many it has.
    pub(crate) async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32> {
        if let Some(n) = self.inner.topics.lock().expect("topics lock").get(topic) {
            return Ok(*n);
        }
        let options = &self.inner.options;
        let new = NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(options.replication),
        );
        let results = self
            .inner
            .admin
            .create_topics(
                [&new],
                &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
            )
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("creating topic {topic}"), e, true))?;
        let mut found = partitions;
        for result in results {
            match result {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    found = self.broker_partitions(topic).await?.ok_or_else(|| {
                        Error::transport_reason(
                            TRANSPORT,
                            format!("topic {topic} exists but the broker names no partition of it yet"),
                            true,
                        )
                    })?;
                }
                Err((name, code)) => {
                    return Err(Error::transport(
                        TRANSPORT,
                        format!("creating topic {name}"),
                        code,
                        true,
                    ));
                }
            }
        }
        self.inner
            .topics
            .lock()
            .expect("topics lock")
            .insert(topic.to_owned(), found);
        Ok(found)
    }

    /// How many partitions the Kafka topic `topic` has on the broker, or
    /// `None` if it does not exist. Asks for that topic's metadata alone,
    /// from a client that never has a topic created by asking.
    pub async fn broker_partitions(&self, topic: &str) -> Result<Option<u32>> {
        let mut config = client_config(&self.inner.brokers, &self.inner.options);
        config.set("allow.auto.create.topics", "false");
        let client: BaseConsumer = config
            .create()
            .map_err(|e| Error::transport(TRANSPORT, "creating a metadata client", e, false))?;
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let what = format!("reading the metadata of topic {topic}");
            let metadata = client
                .fetch_metadata(Some(&topic), ADMIN_TIMEOUT)
                .map_err(|e| Error::transport(TRANSPORT, what.clone(), e, true))?;
            let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
                return Ok(None);
            };
            match found.error() {
                None if !found.partitions().is_empty() => Ok(Some(found.partitions().len() as u32)),
                None => Ok(None),
                Some(code) if RDKafkaErrorCode::from(code) == RDKafkaErrorCode::UnknownTopicOrPartition => {
                    Ok(None)
                }
                // Leader not available yet, say: ask again.
                Some(code) => Err(Error::transport(
                    TRANSPORT,
                    what,
                    RDKafkaErrorCode::from(code),
                    true,
                )),
            }
        })
        .await
        .map_err(|e| Error::transport(TRANSPORT, "reading a topic's metadata", e, true))?
    }

    /// The Kafka topics this transport created or found, dead-letter topics
    /// included (not other teams' topics it reads).
    pub fn topics(&self) -> Vec<String> {
        let foreign: Vec<&String> = self.inner.options.foreign.values().collect();
        let mut topics: Vec<String> = self
            .inner
            .topics
            .lock()
            .expect("topics lock")
            .keys()
            .filter(|name| !foreign.contains(name))
            .cloned()
            .collect();
        topics.sort();
        topics
    }

    /// Deletes the Kafka topic of `topic` and its dead-letter topic (tests
    /// and benches clean up with it); of another team's topic
    /// ([`KafkaOptions::foreign`](crate::KafkaOptions::foreign)), only the
    /// dead-letter topic, which is Tidings' own.
    ///
    /// It first waits (up to 10 s) for the subscriptions of this process
    /// reading either topic to be closed or dropped and their consumers
    /// destroyed, and fails if one still reads: a consumer fetching from a
    /// topic deleted under it crashes the process over Tansu (librdkafka
    /// mishandles Tansu's answer for an unknown topic). Consumers in other
    /// processes are theirs to stop first.
    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        let mut names = vec![self.dead_letter_topic(topic)];
        if !self.inner.options.is_foreign(topic) {
            names.insert(0, self.kafka_topic(topic));
        }
        let listed = names.join(" and ");
        let reading: Vec<&str> = names.iter().map(String::as_str).collect();
        if let Err(read) = unread(&self.inner.brokers, &reading, ADMIN_TIMEOUT).await {
            return Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "deleting topic {listed}: a subscription of this process still reads {read}: close it first"
                ),
                true,
            ));
        }
        self.inner
            .admin
            .delete_topics(
                &reading,
                &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
            )
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("deleting topic {listed}"), e, true))?;
        let mut topics = self.inner.topics.lock().expect("topics lock");
        for name in &names {
            topics.remove(name);
        }
        Ok(())
    }

    /// The offsets `group` has committed on each partition of `topic`
    /// (`None` where it has none): where a member taking the partition
    /// starts reading.
    pub async fn committed(&self, group: &str, topic: &str) -> Result<Vec<Option<i64>>> {
        let consumer = self.group_client(group)?;
        let partitions = self.partitions_of(topic).await?;
        let topic = self.kafka_topic(topic);
        tokio::task::spawn_blocking(move || {
            let committed = committed_offsets(&consumer, &topic, partitions)?;
            Ok(committed
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .collect())
        })
        .await
        .map_err(|e| Error::transport(TRANSPORT, "reading committed offsets", e, true))?
    }

    /// Every record in `topic`'s dead-letter topic, partition by partition
    /// (the dead-letter API of the failure store lists the same messages,
    /// with their error history).
    pub async fn dead_letter_records(&self, topic: &str) -> Result<Vec<RawMessage>> {
        let dead = self.dead_letter_topic(topic);
        let partitions = self.ensure_topic(&dead, self.partitions_of(topic).await?).await?;
        let mut config = client_config(&self.inner.brokers, &self.inner.options);
        config
            .set("group.id", format!("{dead}.reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        let consumer: BaseConsumer = config
            .create()
            .map_err(|e| Error::transport(TRANSPORT, "creating a consumer", e, false))?;
        let consumer = Reader::new(&self.inner.brokers, &dead, consumer);
        let tidings_topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut assignment = TopicPartitionList::new();
            let mut remaining = BTreeMap::new();
            for p in 0..partitions as i32 {
                let (low, high) = consumer
                    .fetch_watermarks(&dead, p, ADMIN_TIMEOUT)
                    .map_err(|e| Error::transport(TRANSPORT, "reading watermarks", e, true))?;
                if high > low {
                    remaining.insert(p, high);
                }
                assignment
                    .add_partition_offset(&dead, p, Offset::Beginning)
                    .map_err(|e| Error::transport(TRANSPORT, "assigning a partition", e, false))?;
            }
            consumer
                .assign(&assignment)
                .map_err(|e| Error::transport(TRANSPORT, "assigning the dead-letter topic", e, true))?;
            let deadline = std::time::Instant::now() + ADMIN_TIMEOUT;
            let mut records = Vec::new();
            while !remaining.is_empty() && std::time::Instant::now() < deadline {
                let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
                    continue;
                };
                let m = polled
                    .map_err(|e| Error::transport(TRANSPORT, "reading the dead-letter topic", e, true))?;
                records.push(raw_message(&tidings_topic, &m));
                if remaining
                    .get(&m.partition())
                    .is_some_and(|high| m.offset() + 1 >= *high)
                {
                    remaining.remove(&m.partition());
                }
            }
            Ok(records)
        })
        .await
        .map_err(|e| Error::transport(TRANSPORT, "reading the dead-letter topic", e, true))?
    }
}

/// The group's committed offsets on every partition of `topic` (invalid
/// where it has none).
pub(crate) fn committed_offsets(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: u32,
) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition(topic, p);
    }
    consumer
        .committed_offsets(tpl, ADMIN_TIMEOUT)
        .map_err(|e| Error::transport(TRANSPORT, "reading committed offsets", e, true))
}
