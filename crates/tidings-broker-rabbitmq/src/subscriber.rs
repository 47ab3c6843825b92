//! Consuming a group's partition queue, consumed again when the channel
//! or connection is lost.

use async_trait::async_trait;
use futures::StreamExt;
use lapin::Channel;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use tidings_core::{Backoff, Delivery, Error, Partition, Result, Subscriber, Subscription};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::acker::RabbitAcker;
use crate::connection::open_channel;
use crate::connection::within;
use crate::marshal::{delivery_count, raw_message};
use crate::{RabbitTransport, TRANSPORT};

#[async_trait]
impl Subscriber for RabbitTransport {
    fn partitions(&self, topic: &str) -> u32 {
        self.options.partitions_of(topic)
    }

    /// Ready messages over the group's partition queues (delivered and
    /// unacknowledged ones are not counted by AMQP); declares nothing.
    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        let connection = self.connection().await?;
        let mut total = None;
        for partition in Partition::all(self.options.partitions_of(topic)) {
            // A passive declare of a missing queue closes its channel: one each.
            let channel = open_channel(&connection).await?;
            let queue = self.partition_queue(topic, group, partition);
            let declared = channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await;
            if let Ok(q) = declared {
                *total.get_or_insert(0) += u64::from(q.message_count());
                let _ = channel.close(200, "measured".into()).await;
            }
        }
        Ok(total)
    }

    /// Declares the group's queues, bindings and dead-letter exchange, consuming nothing.
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        let channel = self.channel().await?;
        self.declare_group(&channel, topic, group).await?;
        let _ = channel.close(200, "group declared".into()).await;
        Ok(())
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        // The first consumer is set up here, so that a refused declaration
        // is an error of `subscribe`; a lost one is set up again below.
        let first = self.consume(group, topic, partition).await?;
        let (tx, rx) = mpsc::channel(usize::from(self.options.prefetch));
        let transport = self.clone();
        let (group, topic) = (group.to_owned(), topic.to_owned());
        let task = tokio::spawn(async move {
            let mut current = Some(first);
            let mut failures = 0u32;
            loop {
                let (channel, queue, mut consumer) = match current.take() {
                    Some(c) => c,
                    None => match transport.consume(&group, &topic, partition).await {
                        Ok(c) => c,
                        Err(e) => {
                            failures += 1;
                            let delay = Backoff::default().delay(failures);
                            tracing::warn!(%group, %topic, error = &e as &dyn std::error::Error, retry_in_ms = delay.as_millis() as u64, "RabbitMQ consumer lost; reconnecting");
                            tokio::select! {
                                _ = tx.closed() => return None,
                                _ = tokio::time::sleep(delay) => continue,
                            }
                        }
                    },
                };
                loop {
                    let next = tokio::select! {
                        _ = tx.closed() => return Some(channel),
                        next = consumer.next() => next,
                    };
                    let d = match next {
                        Some(Ok(d)) => d,
                        // The channel or connection went away: its unacknowledged
                        // messages go back to the queue; consume again.
                        Some(Err(e)) => {
                            tracing::debug!(%group, %topic, error = %e, "RabbitMQ consumer interrupted");
                            break;
                        }
                        None => break,
                    };
                    failures = 0;
                    let raw = raw_message(&topic, &d.properties, &d.data);
                    let count = delivery_count(&d);
                    let acker = RabbitAcker {
                        count,
                        acker: d.acker.clone(),
                        transport: transport.clone(),
                        queue: queue.clone(),
                        body: d.data,
                        properties: d.properties,
                    };
                    if tx.send(Ok(Delivery::new(raw, count, acker))).await.is_err() {
                        return Some(channel);
                    }
                }
            }
        });
        Ok(
            Subscription::new(ReceiverStream::new(rx)).on_close(move || async move {
                // Closing the channel after the acks sent on it: whatever is
                // still unacknowledged goes back to the queue.
                match task.await {
                    Ok(Some(channel)) => match channel.close(200, "subscription closed".into()).await {
                        Ok(()) => Ok(()),
                        // Already closing (the consumer's cancel got there first) or
                        // gone: either way its unacknowledged messages are requeued.
                        Err(_) if !channel.status().connected() => Ok(()),
                        Err(e) => Err(Error::transport(TRANSPORT, "closing a channel", e, true)),
                    },
                    _ => Ok(()),
                }
            }),
        )
    }
}

impl RabbitTransport {
    /// Opens a channel with the prefetch, declares the group and starts
    /// consuming one partition; fails when the broker does not answer.
    async fn consume(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<(Channel, String, lapin::Consumer)> {
        within(
            "setting up a consumer",
            self.start_consuming(group, topic, partition),
        )
        .await
    }

    async fn start_consuming(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<(Channel, String, lapin::Consumer)> {
        let channel = self.channel().await?;
        channel
            .basic_qos(self.options.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| Error::transport(TRANSPORT, "setting the prefetch", e, true))?;
        self.declare_group(&channel, topic, group).await?;
        let queue = self.partition_queue(topic, group, partition);
        let consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("consuming {queue}"), e, true))?;
        Ok((channel, queue, consumer))
    }
}
