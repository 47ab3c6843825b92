//! Reading a group's durable pull consumer, pulled again when interrupted.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use async_nats::{HeaderMap, HeaderValue};
use async_trait::async_trait;
use futures::StreamExt;
use tidings_core::{
    Backoff, Delivery, Error, Headers, Partition, RawMessage, Result, Subscriber, Subscription,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::acker::NatsAcker;
use crate::{NatsTransport, TRANSPORT};

const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// How Tidings reads a JetStream message taken from `topic`: its headers
/// (the first value of each, JetStream's own `Nats-` headers left out), its
/// key from `ce-partitionkey` or `ce-subject`, and its payload. Every delivery goes through here;
/// it is public so that tools (and the fuzz targets) read NATS messages
/// exactly as the subscriber does.
pub fn raw_message(topic: &str, headers: Option<&HeaderMap>, payload: &[u8]) -> RawMessage {
    RawMessage::from_headers(topic, headers_of(headers), payload.to_vec(), None)
}

fn headers_of(map: Option<&HeaderMap>) -> Headers {
    let mut out = Headers::new();
    for (name, values) in map.into_iter().flat_map(|m| m.iter()) {
        let name: &str = name.as_ref();
        // JetStream's own headers are the transport's business, not the message's.
        if name.starts_with("Nats-") {
            continue;
        }
        if let Some(v) = values.first() {
            out.insert(name.to_owned(), HeaderValue::as_str(v).to_owned());
        }
    }
    out
}

#[async_trait]
impl Subscriber for NatsTransport {
    fn partitions(&self, topic: &str) -> u32 {
        self.options.partitions_of(topic)
    }

    /// Pending (not yet delivered) plus delivered and unacknowledged, over
    /// the group's durable consumers; creates nothing.
    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        let stream = match self.options.foreign_subject(topic) {
            Some(subject) => match self.js.stream_by_subject(subject).await {
                Ok(name) => self.js.get_stream(name).await,
                Err(_) => return Ok(None),
            },
            None => self.js.get_stream(self.stream_name(topic)).await,
        };
        let Ok(stream) = stream else {
            return Ok(None);
        };
        let mut total = None;
        for partition in Partition::all(self.options.partitions_of(topic)) {
            let durable = self.options.durable(group, topic, partition);
            if let Ok(info) = stream.consumer_info(durable).await {
                *total.get_or_insert(0) += info.num_pending + info.num_ack_pending as u64;
            }
        }
        Ok(total)
    }

    /// Creates the stream and the group's durable consumers, reading nothing.
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        for partition in Partition::all(self.options.partitions_of(topic)) {
            self.durable(group, topic, partition).await?;
        }
        Ok(())
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        // The first pull is set up here, so that a refused configuration is
        // an error of `subscribe`; later failures are retried in the background.
        let mut consumer = self.durable(group, topic, partition).await?;
        // A pull request a closed reader left behind still takes messages
        // until it expires: let it expire first, so that nothing reaches it
        // after the snapshot below.
        let waited = tokio::time::Instant::now();
        let info = loop {
            let info = consumer
                .info()
                .await
                .map_err(|e| Error::transport(TRANSPORT, "reading consumer info", e, true))?;
            if info.num_waiting == 0 || waited.elapsed() > PULL_EXPIRES * 2 {
                break info.clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Up to this stream sequence, a message may have been handled
        // before (a redelivery, whatever count JetStream gives it).
        let mut seen_until = 0;
        // Deliveries are numbered, redeliveries included: a number skipped
        // went to another reader.
        let mut next_delivery = info.delivered.consumer_sequence + 1;
        if info.num_ack_pending > 0 {
            // The earlier reader crashed, or handed over with a pull in
            // flight: what it left unacknowledged would come back only
            // after its ack wait, behind newer messages of its keys.
            tracing::info!(consumer = %info.name, unacknowledged = info.num_ack_pending, "an earlier reader left messages unacknowledged; reading again from the first of them, in order");
            (consumer, seen_until) = self.rewind(group, topic, partition).await?;
            next_delivery = 1;
        }
        let first = self.messages(&consumer).await?;
        let (tx, rx) = mpsc::channel(self.options.prefetch.max(1));
        let this = self.clone();
        let (group, topic) = (group.to_owned(), topic.to_owned());
        let task = tokio::spawn(async move {
            let mut messages = Some(first);
            let mut failures = 0u32;
            loop {
                let mut current = match messages.take() {
                    Some(m) => m,
                    None => match this.pull(&group, &topic, partition).await {
                        Ok(m) => m,
                        Err(e) => {
                            failures += 1;
                            let delay = Backoff::default().delay(failures);
                            tracing::warn!(%group, %topic, error = &e as &dyn std::error::Error, retry_in_ms = delay.as_millis() as u64, "NATS pull failed; retrying");
                            tokio::select! {
                                _ = tx.closed() => return,
                                _ = tokio::time::sleep(delay) => continue,
                            }
                        }
                    },
                };
                loop {
                    let next = tokio::select! {
                        _ = tx.closed() => return,
                        next = current.next() => next,
                    };
                    match next {
                        Some(Ok(m)) => {
                            failures = 0;
                            // JetStream's reply subject, parsed once: numbers and counts.
                            let info = m.info().ok().map(|i| Numbers {
                                consumer_sequence: i.consumer_sequence,
                                stream_sequence: i.stream_sequence,
                                delivered: i.delivered,
                            });
                            let number = info.map_or(next_delivery, |i| i.consumer_sequence);
                            if number != next_delivery {
                                // A delivery went to someone else (a member frozen past its
                                // lease that pulled once more, a pull request abandoned on a
                                // reconnect), or the server came back with an older state of
                                // the consumer: something older than this message may come
                                // back after it. It is not handed on; the partition is read
                                // again from its first unacknowledged message.
                                tracing::info!(%group, %topic, expected = next_delivery, got = number, "deliveries out of sequence; reading again from the first unacknowledged message, in order");
                                match this.rewind(&group, &topic, partition).await {
                                    Ok((consumer, until)) => {
                                        // The consumer is new from here on, whether or not
                                        // the first pull succeeds (the loop pulls again).
                                        seen_until = seen_until.max(until);
                                        next_delivery = 1;
                                        match this.messages(&consumer).await {
                                            Ok(stream) => messages = Some(stream),
                                            Err(e) => {
                                                tracing::warn!(%group, %topic, error = &e as &dyn std::error::Error, "pulling after reading again failed; retrying")
                                            }
                                        }
                                    }
                                    Err(e) => {
                                        tracing::warn!(%group, %topic, error = &e as &dyn std::error::Error, "reading the partition again failed; retrying");
                                        tokio::select! {
                                            _ = tx.closed() => return,
                                            _ = tokio::time::sleep(Backoff::default().delay(1)) => {}
                                        }
                                    }
                                }
                                break;
                            }
                            next_delivery = number + 1;
                            let seen = info.is_some_and(|i| i.stream_sequence <= seen_until);
                            if let Some(i) = info {
                                tracing::debug!(
                                    %group,
                                    %topic,
                                    %partition,
                                    stream_sequence = i.stream_sequence,
                                    consumer_sequence = i.consumer_sequence,
                                    delivered = i.delivered,
                                    message_id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.as_str()).unwrap_or(""),
                                    taken_over = seen,
                                    "handing a message on"
                                );
                            }
                            if tx.send(Ok(delivery(&topic, m, info, seen))).await.is_err() {
                                return;
                            }
                        }
                        Some(Err(e)) => {
                            // Missed heartbeats, a reconnect: the pull is re-established.
                            tracing::debug!(%group, %topic, error = %e, "NATS pull interrupted");
                            break;
                        }
                        None => break,
                    }
                }
            }
        });
        let client = self.client.clone();
        Ok(
            Subscription::new(ReceiverStream::new(rx)).on_close(move || async move {
                let _ = task.await;
                // Acks are fire-and-forget publishes: make sure they left.
                client
                    .flush()
                    .await
                    .map_err(|e| Error::transport(TRANSPORT, "flushing acknowledgements", e, true))
            }),
        )
    }
}

impl NatsTransport {
    /// Reads the group's partition again from its first unacknowledged
    /// message: the durable consumer is made anew, starting after its ack
    /// floor (every message up to it was acknowledged). What was handed on
    /// and not yet acknowledged comes again, in stream order, and the
    /// processed markers take the copies out; nothing older can come after
    /// something newer. Returns the new consumer and the stream's last
    /// sequence, up to which a message may have been handled already.
    async fn rewind(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<(consumer::PullConsumer, u64)> {
        // One lookup of the stream serves its last sequence and both consumers.
        let mut stream = self.stream(topic).await?;
        let mut consumer = self.durable_on(&stream, group, topic, partition).await?;
        let info = consumer
            .info()
            .await
            .map_err(|e| Error::transport(TRANSPORT, "reading consumer info", e, true))?
            .clone();
        // Anything in the stream now may have been delivered before.
        let last = stream
            .info()
            .await
            .map_err(|e| Error::transport(TRANSPORT, "reading stream info", e, true))?
            .state
            .last_sequence
            .max(info.delivered.stream_sequence);
        let from = info.ack_floor.stream_sequence + 1;
        let consumer = self
            .recreate_durable(&stream, group, topic, partition, from)
            .await?;
        tracing::info!(consumer = %info.name, from_stream_sequence = from, seen_until = last, "reading the partition again from its first unacknowledged message");
        Ok((consumer, last))
    }

    /// Creates (or finds) the durable consumer of the group's partition and starts pulling.
    async fn pull(&self, group: &str, topic: &str, partition: Partition) -> Result<consumer::pull::Stream> {
        let consumer = self.durable(group, topic, partition).await?;
        self.messages(&consumer).await
    }

    /// Starts pulling. Pull requests expire after a few seconds and are
    /// renewed: the server keeps a closed reader's last request until it
    /// expires, handing it messages nobody reads (they come back after the
    /// ack wait), so a short life cuts that waste at hand-overs.
    async fn messages(&self, consumer: &consumer::PullConsumer) -> Result<consumer::pull::Stream> {
        consumer
            .stream()
            .max_messages_per_batch(self.options.prefetch)
            .expires(PULL_EXPIRES)
            .messages()
            .await
            .map_err(|e| Error::transport(TRANSPORT, "pulling messages", e, true))
    }
}

/// What JetStream's reply subject numbers a delivery with.
#[derive(Debug, Clone, Copy)]
struct Numbers {
    consumer_sequence: u64,
    stream_sequence: u64,
    delivered: i64,
}

/// A delivery of `m` (numbered `info`, when its reply subject parsed); a
/// redelivery, whatever count JetStream gives it, when `taken_over` from a
/// reader that left messages unacknowledged: it may have died in their
/// handlers, and JetStream 2.9 numbers a message it offered to a reader
/// that was gone as a first delivery again.
fn delivery(topic: &str, m: jetstream::Message, info: Option<Numbers>, taken_over: bool) -> Delivery {
    let delivery_count = match info {
        Some(i) if taken_over => (i.delivered as u32).max(2),
        Some(i) => i.delivered as u32,
        None => 0,
    };
    let (message, acker) = m.split();
    let raw = raw_message(topic, message.headers.as_ref(), &message.payload);
    Delivery::new(raw, delivery_count, NatsAcker(acker))
}
