//! Reading one partition by manual assignment, within the in-flight
//! window, and committing the window's floor.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tidings_core::{Delivery, Error, Partition, RawMessage, Result, Subscriber, Subscription};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::acker::KafkaAcker;
use crate::admin::committed_offsets;
use crate::marshal::raw_message;
use crate::partitions::mismatch;
use crate::reading::Reader;
use crate::window::{Redelivery, Shared, Window};
use crate::{ADMIN_TIMEOUT, KafkaTransport, TRANSPORT};

/// Commits `offset` for the subscription's partition.
fn commit(consumer: &StreamConsumer, shared: &Shared, offset: i64, mode: CommitMode) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&shared.kafka_topic, shared.partition, Offset::Offset(offset))
        .map_err(|e| Error::transport(TRANSPORT, "building an offset commit", e, false))?;
    consumer
        .commit(&tpl, mode)
        .map_err(|e| Error::transport(TRANSPORT, "committing an offset", e, true))?;
    shared.window.lock().expect("window lock").committed = Some(offset);
    Ok(())
}

#[async_trait]
impl Subscriber for KafkaTransport {
    /// The configured count; for another team's topic the count found on
    /// the broker by [`check_partitions`](Subscriber::check_partitions),
    /// which the consumer runtime calls first.
    fn partitions(&self, topic: &str) -> u32 {
        let options = &self.inner.options;
        if options.is_foreign(topic)
            && let Some(n) = self.known_partitions(&self.kafka_topic(topic))
        {
            return n;
        }
        options.partitions
    }

    /// A topic of Tidings' own that exists with another partition count
    /// than configured (created with other settings, or by someone else)
    /// is refused: reading the configured count would leave partitions
    /// unread. Another team's topic ([`KafkaOptions::foreign`]) has its
    /// partitions discovered here; a consumer waits for it to exist.
    ///
    /// [`KafkaOptions::foreign`]: crate::KafkaOptions::foreign
    async fn check_partitions(&self, topic: &str) -> Result<()> {
        if self.inner.options.is_foreign(topic) {
            let n = self.discover_partitions(topic).await?;
            tracing::debug!(topic, kafka_topic = %self.kafka_topic(topic), partitions = n, "another team's topic: its partitions found on the broker");
            return Ok(());
        }
        let kafka_topic = self.kafka_topic(topic);
        let configured = self.inner.options.partitions;
        match self.broker_partitions(&kafka_topic).await? {
            Some(found) if found != configured => Err(Error::Config {
                key: format!("Kafka topic {kafka_topic}"),
                reason: mismatch(&kafka_topic, found, configured),
            }),
            _ => Ok(()),
        }
    }

    /// Another team's topic of several partitions is filled by its own
    /// partitioner, not by [`Partition::of`].
    fn places_keys(&self, topic: &str) -> bool {
        !self.inner.options.is_foreign(topic) || self.partitions(topic) == 1
    }

    /// Every partition of `topic`, another team's discovered first.
    async fn subscribe(&self, group: &str, topic: &str) -> Result<Subscription> {
        let mut parts = Vec::new();
        for partition in Partition::all(self.ensure_partitions(topic).await?) {
            parts.push(self.subscribe_partition(group, topic, partition).await?);
        }
        Ok(Subscription::merge(parts))
    }

    /// Creates the topic, and commits the earliest retained offset of each
    /// partition the group has no offset for: the group then exists for
    /// Kafka's tools and [`Subscriber::pending`], and keeps everything
    /// published from now on.
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        let partitions = self.ensure_partitions(topic).await?;
        let topic = self.kafka_topic(topic);
        let consumer = self.group_client(group)?;
        tokio::task::spawn_blocking(move || {
            let committed = committed_offsets(&consumer, &topic, partitions)?;
            let mut start = TopicPartitionList::new();
            for element in committed.elements() {
                if !matches!(element.offset(), Offset::Offset(_)) {
                    let (low, _) = consumer
                        .fetch_watermarks(&topic, element.partition(), ADMIN_TIMEOUT)
                        .map_err(|e| Error::transport(TRANSPORT, "reading watermarks", e, true))?;
                    start
                        .add_partition_offset(&topic, element.partition(), Offset::Offset(low))
                        .map_err(|e| Error::transport(TRANSPORT, "building an offset commit", e, false))?;
                }
            }
            if start.count() > 0 {
                consumer.commit(&start, CommitMode::Sync).map_err(|e| {
                    Error::transport(TRANSPORT, "committing the group's starting offsets", e, true)
                })?;
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::transport(TRANSPORT, "ensuring a group", e, true))?
    }

    /// Records behind the group's committed offsets (from the earliest
    /// retained where a partition has none), over every partition; `None`
    /// when the group has committed nothing on the topic.
    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        let consumer = self.group_client(group)?;
        let partitions = self.partitions_of(topic).await?;
        let topic = self.kafka_topic(topic);
        tokio::task::spawn_blocking(move || {
            let committed = committed_offsets(&consumer, &topic, partitions)?;
            if !committed
                .elements()
                .iter()
                .any(|e| matches!(e.offset(), Offset::Offset(_)))
            {
                return Ok(None);
            }
            let (mut total, mut any_committed) = (0u64, false);
            for element in committed.elements() {
                let (low, high) = consumer
                    .fetch_watermarks(&topic, element.partition(), ADMIN_TIMEOUT)
                    .map_err(|e| Error::transport(TRANSPORT, "reading watermarks", e, true))?;
                let behind = match element.offset() {
                    Offset::Offset(o) => {
                        any_committed = true;
                        high - o
                    }
                    _ => high - low,
                };
                total += behind.max(0) as u64;
            }
            Ok(any_committed.then_some(total))
        })
        .await
        .map_err(|e| Error::transport(TRANSPORT, "reading the group's lag", e, true))?
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        let kafka_topic = self.kafka_topic(topic);
        let partitions = self.ensure_partitions(topic).await?;
        if partition.index >= partitions {
            return Err(Error::Config {
                key: format!("Kafka topic {kafka_topic}"),
                reason: format!("it has no partition {} (it has {partitions})", partition.index),
            });
        }
        let consumer: StreamConsumer = self
            .consumer_config(group)
            .create()
            .map_err(|e| Error::transport(TRANSPORT, "creating a consumer", e, false))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&kafka_topic, partition.index as i32, Offset::Stored)
            .map_err(|e| Error::transport(TRANSPORT, "assigning a partition", e, false))?;
        // Counted as reading the topic until the client is destroyed: the
        // last of the task and the closing hook to drop it.
        let consumer = Reader::new(&self.inner.brokers, &kafka_topic, consumer);
        consumer
            .assign(&tpl)
            .map_err(|e| Error::transport(TRANSPORT, "assigning a partition", e, true))?;
        let consumer = Arc::new(consumer);
        let shared = Arc::new(Shared {
            window: Mutex::new(Window::default()),
            settled: Notify::new(),
            topic: topic.to_owned(),
            kafka_topic,
            partition: partition.index as i32,
        });
        let (tx, rx) = mpsc::channel(64);
        let (redeliver_tx, mut redeliver_rx) = mpsc::unbounded_channel::<Redelivery>();
        let (max_in_flight, every) = (
            self.inner.options.max_in_flight,
            self.inner.options.commit_interval,
        );
        let task = tokio::spawn({
            let (consumer, shared, transport) = (consumer.clone(), shared.clone(), self.clone());
            async move {
                let delivery = |message: RawMessage, offset: i64, delivery_count: u32| {
                    let acker = KafkaAcker {
                        shared: shared.clone(),
                        offset,
                        message: message.clone(),
                        delivery_count,
                        redeliver: redeliver_tx.clone(),
                        transport: transport.clone(),
                    };
                    Delivery::new(message, delivery_count, acker)
                };
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    let full = shared.window.lock().expect("window lock").open.len() >= max_in_flight;
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tick.tick() => {
                            let offset = shared.window.lock().expect("window lock").to_commit();
                            if let Some(offset) = offset
                                && let Err(e) = commit(&consumer, &shared, offset, CommitMode::Async)
                            {
                                tracing::warn!(topic = %shared.topic, partition = shared.partition, error = &e as &dyn std::error::Error, "Kafka offset commit failed; retrying");
                            }
                        }
                        again = redeliver_rx.recv() => {
                            let Some((message, offset, count)) = again else { return };
                            if tx.send(Ok(delivery(message, offset, count))).await.is_err() {
                                return;
                            }
                        }
                        _ = shared.settled.notified(), if full => {}
                        received = consumer.recv(), if !full => {
                            match received {
                                Ok(m) => {
                                    let (message, offset) = (raw_message(&shared.topic, &m), m.offset());
                                    drop(m);
                                    shared.window.lock().expect("window lock").delivered(offset);
                                    if tx.send(Ok(delivery(message, offset, 0))).await.is_err() {
                                        return;
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(topic = %shared.topic, partition = shared.partition, error = %e, "Kafka fetch failed; retrying");
                                    tokio::time::sleep(Duration::from_millis(200)).await;
                                }
                            }
                        }
                    }
                }
            }
        });
        Ok(
            Subscription::new(ReceiverStream::new(rx)).on_close(move || async move {
                let _ = task.await;
                let offset = shared.window.lock().expect("window lock").to_commit();
                match offset {
                    Some(offset) => tokio::task::spawn_blocking(move || {
                        commit(&consumer, &shared, offset, CommitMode::Sync)
                    })
                    .await
                    .map_err(|e| Error::transport(TRANSPORT, "committing the final offset", e, true))?,
                    None => Ok(()),
                }
            }),
        )
    }
}
