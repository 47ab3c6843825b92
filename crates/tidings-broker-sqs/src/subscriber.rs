//! Receiving from a group's partition queue: long polling, the messages
//! held kept hidden, and made visible again when the subscription closes.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use futures::StreamExt;
use tidings_core::{Backoff, Delivery, Partition, Result, Subscriber, Subscription};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::SqsTransport;
use crate::acker::{Held, Holding, MAX_HIDDEN, SqsAcker};
use crate::marshal::raw_message;

/// SQS's largest receive and batch.
const BATCH: usize = 10;
/// Visibility changes of ten messages each sent at once by a renewal.
const CHANGES_IN_FLIGHT: usize = 32;
/// The pauses between receives that do not wait, while a member holds
/// messages and none come: from the first to the longest, doubling.
const IDLE_FIRST: Duration = Duration::from_millis(50);
const IDLE_MAX: Duration = Duration::from_secs(1);

#[async_trait]
impl Subscriber for SqsTransport {
    fn partitions(&self, topic: &str) -> u32 {
        self.options.partitions_of(topic)
    }

    /// Refuses a topic whose SNS topic spreads its messages over another
    /// partition count (its `tidings-partitions` tag).
    async fn check_partitions(&self, topic: &str) -> Result<()> {
        self.check_topic_partitions(topic).await
    }

    /// Messages waiting, in flight and delayed over the group's partition
    /// queues, as SQS counts them (approximately); declares nothing.
    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        let mut total = None;
        for partition in Partition::all(self.options.partitions_of(topic)) {
            let name = self.options.queue_name(topic, group, partition);
            let Some(url) = self.existing_queue(&name).await? else {
                continue;
            };
            let out = self
                .sqs
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
                .send()
                .await
                .map_err(|e| self.error(&format!("counting the messages of SQS queue {name}"), e))?;
            let counted: u64 = out
                .attributes
                .unwrap_or_default()
                .values()
                .filter_map(|v| v.parse::<u64>().ok())
                .sum();
            *total.get_or_insert(0) += counted;
        }
        Ok(total)
    }

    /// Makes the group's queues and subscriptions, receiving nothing.
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        self.declare_group(topic, group).await
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        self.declare_group(topic, group).await?;
        let name = self.options.queue_name(topic, group, partition);
        let queue_url = self.queue(&name, &[]).await?;
        let (tx, rx) = mpsc::channel(usize::from(self.options.prefetch));
        let (stop, stopped) = watch::channel(false);
        let held = Held::default();
        let reader = Reader {
            transport: self.clone(),
            topic: topic.to_owned(),
            group: group.to_owned(),
            queue_url: queue_url.clone(),
            dead_queue: self.options.dead_queue_name(topic, group),
            held: held.clone(),
        };
        let reading = tokio::spawn(reader.clone().read(tx, stopped.clone()));
        let keeping = tokio::spawn(reader.clone().keep_hidden(stopped));
        Ok(
            Subscription::new(ReceiverStream::new(rx)).on_close(move || async move {
                let _ = stop.send(true);
                // The receive under way ends within the receive wait; what it
                // brings is held, and made visible again below.
                let _ = reading.await;
                let _ = keeping.await;
                reader.release().await;
                Ok(())
            }),
        )
    }
}

#[derive(Clone)]
struct Reader {
    transport: SqsTransport,
    topic: String,
    group: String,
    queue_url: String,
    dead_queue: String,
    held: Held,
}

impl Reader {
    async fn read(self, tx: mpsc::Sender<Result<Delivery>>, mut stopped: watch::Receiver<bool>) {
        let long_poll = self.transport.options.receive_wait.as_secs() as i32;
        let mut failures = 0u32;
        let mut idle = Duration::ZERO;
        // A FIFO receive that failed on the way back is asked again under
        // its attempt id, and SQS answers with the messages it had already
        // taken (for five minutes), instead of keeping them and their
        // message groups hidden for a visibility timeout.
        let fifo = crate::names::is_fifo(&self.queue_url);
        let mut attempt = uuid::Uuid::new_v4().to_string();
        loop {
            // Room first: what is received is hidden from other members.
            let room = tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                permit = tx.reserve() => match permit {
                    Ok(permit) => { drop(permit); tx.capacity().clamp(1, BATCH) }
                    Err(_) => return,
                },
            };
            // While this member holds messages, a receive does not wait:
            // settling them frees their message groups, which a waiting
            // receive may not see until it ends (moto does not). Nor does
            // one on an emulator (see `short_polls`). When one brought
            // nothing, the next waits for a message to be settled here, or
            // a pause growing while nothing comes.
            let holding = !self.held.receipts.lock().unwrap().is_empty() || self.transport.short_polls;
            if holding && !idle.is_zero() {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = self.held.settled.notified() => {}
                    _ = tokio::time::sleep(idle) => {}
                }
            }
            let wait = if holding { 0 } else { long_poll };
            let asked = Instant::now();
            let received = self
                .transport
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .set_receive_request_attempt_id(fifo.then(|| attempt.clone()))
                .max_number_of_messages(room as i32)
                // The timeout the renewals below are timed for, whatever
                // the queue was made with.
                .visibility_timeout(self.transport.options.visibility_timeout.as_secs() as i32)
                .wait_time_seconds(wait)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
                .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                .message_system_attribute_names(MessageSystemAttributeName::MessageDeduplicationId)
                .send()
                .await;
            let messages = match received {
                Ok(out) => {
                    failures = 0;
                    attempt = uuid::Uuid::new_v4().to_string();
                    out.messages.unwrap_or_default()
                }
                Err(e) => {
                    failures += 1;
                    if e.as_service_error().is_some_and(|s| s.is_queue_does_not_exist()) {
                        self.declare_again().await;
                    }
                    let e = self
                        .transport
                        .error(&format!("receiving from {}", self.queue_url), e);
                    let delay = Backoff::default().delay(failures);
                    tracing::warn!(topic = %self.topic, queue = %self.queue_url, error = %e, retry_in_ms = delay.as_millis() as u64, "SQS receive failed; trying again");
                    tokio::select! {
                        _ = stopped.wait_for(|s| *s) => return,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
            };
            idle = if messages.is_empty() {
                (idle * 2).clamp(IDLE_FIRST, IDLE_MAX)
            } else {
                Duration::ZERO
            };
            // Every message received is held before any is handed on: one
            // the stream no longer takes is made visible again on close.
            let mut deliveries = Vec::with_capacity(messages.len());
            for m in messages {
                let (Some(message_id), Some(receipt)) = (m.message_id, m.receipt_handle) else {
                    continue;
                };
                let holding = Holding {
                    receipt: receipt.clone(),
                    hidden_until: asked + self.transport.options.visibility_timeout,
                    received: asked,
                };
                self.held
                    .receipts
                    .lock()
                    .unwrap()
                    .insert(message_id.clone(), holding);
                let system = m.attributes.unwrap_or_default();
                let count = system
                    .get(&MessageSystemAttributeName::ApproximateReceiveCount)
                    .and_then(|c| c.parse::<u32>().ok())
                    .unwrap_or(0);
                let attributes = m.message_attributes.unwrap_or_default();
                let body = m.body.unwrap_or_default();
                let raw = raw_message(&self.topic, &attributes, &body);
                tracing::debug!(queue = %self.queue_url, %message_id, key = raw.key.as_deref().unwrap_or(""), count, "received");
                let acker = SqsAcker {
                    transport: self.transport.clone(),
                    queue_url: self.queue_url.clone(),
                    dead_queue: self.dead_queue.clone(),
                    held: self.held.clone(),
                    message_id,
                    receipt,
                    group_id: system.get(&MessageSystemAttributeName::MessageGroupId).cloned(),
                    deduplication_id: system
                        .get(&MessageSystemAttributeName::MessageDeduplicationId)
                        .cloned(),
                    body,
                    attributes,
                };
                deliveries.push(Delivery::new(raw, count, acker));
            }
            for delivery in deliveries {
                if tx.send(Ok(delivery)).await.is_err() {
                    return;
                }
            }
            if *stopped.borrow() {
                return;
            }
        }
    }

    /// The group's queue was deleted while this member read it: makes the
    /// group's queues and subscriptions again (a queue made again under its
    /// name has the same URL). What the topic took meanwhile did not reach
    /// the group, and is said so.
    async fn declare_again(&self) {
        let transport = &self.transport;
        let topic_name = transport.options.topic_name(&self.topic);
        let mut queues: Vec<String> = Partition::all(transport.options.partitions_of(&self.topic))
            .map(|p| transport.options.queue_name(&self.topic, &self.group, p))
            .collect();
        queues.push(transport.options.dead_queue_name(&self.topic, &self.group));
        transport
            .declared
            .forget_group(&topic_name, (self.topic.clone(), self.group.clone()), &queues);
        tracing::error!(
            topic = %self.topic,
            group = %self.group,
            queue = %self.queue_url,
            "SQS queue deleted while the group read it; making it again: what was published to the topic while it was gone did not reach this group (`tidings replay --consumer GROUP --since ...` re-delivers it from the outbox records kept for database.outbox_retention)"
        );
        if let Err(e) = transport.declare_group(&self.topic, &self.group).await {
            tracing::warn!(topic = %self.topic, group = %self.group, error = %e, "making the group's SQS queues again failed; trying again");
        }
    }

    /// Every third of the visibility timeout, hides the messages held for
    /// another timeout: a live member keeps what it holds, a dead one's
    /// come back one timeout after it died. The passes keep their beat
    /// (a slow one is not followed by a full pause): a message is renewed
    /// within a third of the timeout of its last renewal, however long
    /// the service took to answer.
    async fn keep_hidden(self, mut stopped: watch::Receiver<bool>) {
        let timeout = self.transport.options.visibility_timeout;
        let every = (timeout / 3).max(Duration::from_millis(300));
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        loop {
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                _ = beat.tick() => {}
            }
            if let Err(e) = self.set_visibility(timeout.as_secs() as i32).await {
                tracing::warn!(queue = %self.queue_url, error = %e, "keeping held SQS messages hidden failed; they may be delivered again");
            }
        }
    }

    /// Makes every message still held visible again, at once.
    async fn release(&self) {
        if let Err(e) = self.set_visibility(0).await {
            tracing::debug!(queue = %self.queue_url, error = %e, "releasing held SQS messages failed; they come back after their visibility timeout");
        }
        self.held.receipts.lock().unwrap().clear();
    }

    /// Sets the visibility timeout of every message held; goes on past a
    /// failed request, and returns the first error.
    async fn set_visibility(&self, seconds: i32) -> Result<()> {
        let _changing = self.held.changing.lock().await;
        let now = Instant::now();
        // What is no longer hidden for sure is no longer this member's.
        let held: Vec<(String, String)> = {
            let mut receipts = self.held.receipts.lock().unwrap();
            receipts.retain(|id, h| {
                let ours = h.hidden_until > now;
                if !ours {
                    tracing::debug!(queue = %self.queue_url, message_id = %id, "a held message's hiding ran out before it was renewed: let go");
                }
                // SQS refuses to hide it longer: it comes back when this
                // hiding runs out, to whoever reads the queue then.
                let past_limit = seconds > 0
                    && now + Duration::from_secs(seconds as u64) > h.received + MAX_HIDDEN;
                if ours && past_limit {
                    tracing::warn!(queue = %self.queue_url, message_id = %id, "a message held for 12 hours, the longest SQS hides one, is let go: SQS delivers it again when its visibility timeout runs out");
                }
                ours && !past_limit
            });
            receipts
                .iter()
                .map(|(id, h)| (id.clone(), h.receipt.clone()))
                .collect()
        };
        // Every chunk at once: a renewal that waits on the ones before it
        // lands late when the service is slow, and SQS counts the timeout
        // from the receive.
        let mut changes = Vec::new();
        for chunk in held.chunks(BATCH) {
            changes.push(self.change_visibility(chunk, seconds));
        }
        let mut first_error = None;
        let mut results = futures::stream::iter(changes).buffer_unordered(CHANGES_IN_FLIGHT);
        while let Some(result) = results.next().await {
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sets the visibility timeout of `chunk` (at most ten held messages)
    /// in one request; lets go of those SQS no longer lets this member
    /// change (settled meanwhile, or not in flight any more).
    async fn change_visibility(&self, chunk: &[(String, String)], seconds: i32) -> Result<()> {
        let entries = chunk
            .iter()
            .enumerate()
            .filter_map(|(i, (_, receipt))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(seconds)
                    .build()
                    .ok()
            })
            .collect();
        let sent_at = Instant::now();
        let out = self
            .transport
            .sqs
            .change_message_visibility_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| {
                self.transport
                    .error("changing the visibility of held messages", e)
            })?;
        let mut receipts = self.held.receipts.lock().unwrap();
        // By receipt: a message delivered again meanwhile is held under
        // its newer one, which this change did not touch.
        for ok in out.successful() {
            if let Some((id, receipt)) = ok.id().parse::<usize>().ok().and_then(|i| chunk.get(i))
                && let Some(h) = receipts.get_mut(id)
                && h.receipt == *receipt
            {
                h.hidden_until = sent_at + Duration::from_secs(seconds.max(0) as u64);
            }
        }
        for failed in out.failed() {
            if let Some((id, receipt)) = failed.id().parse::<usize>().ok().and_then(|i| chunk.get(i))
                && receipts.get(id).is_some_and(|h| h.receipt == *receipt)
            {
                receipts.remove(id);
            }
            tracing::debug!(queue = %self.queue_url, code = failed.code(), reason = failed.message().unwrap_or(""), "a held SQS message's visibility was not changed: let go");
        }
        if !out.failed().is_empty() {
            self.held.settled.notify_one();
        }
        Ok(())
    }
}
