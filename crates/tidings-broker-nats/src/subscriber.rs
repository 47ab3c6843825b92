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
use crate::takeover::Takeover;
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
        let patience = self.options.ack_wait * 4;
        let mut takeover = Takeover::new(&info, patience);
        // Deliveries are numbered, redeliveries included: a number skipped
        // went to another reader.
        let mut next_delivery = info.delivered.consumer_sequence + 1;
        let first = self.messages(&consumer).await?;
        let (tx, rx) = mpsc::channel(self.options.prefetch.max(1));
        let this = self.clone();
        let (group, topic) = (group.to_owned(), topic.to_owned());
        let every = (self.options.ack_wait / 2).max(Duration::from_millis(100));
        let task = tokio::spawn(async move {
            let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    let give_up = takeover.as_ref().map(|t| t.give_up_at);
                    let next = tokio::select! {
                        _ = tx.closed() => return,
                        next = current.next() => next,
                        _ = progress.tick(), if takeover.is_some() => {
                            // Held past an ack wait, a message would be sent
                            // again, maybe to the other reader: keep it ours.
                            for m in takeover.iter().flat_map(|t| &t.held) {
                                let _ = m.ack_with(jetstream::AckKind::Progress).await;
                            }
                            continue;
                        }
                        _ = sleep_until(give_up), if give_up.is_some() => {
                            let mut t = takeover.take().expect("a takeover in progress");
                            tracing::warn!(%group, %topic, missing = t.waiting_for(), "messages an earlier reader left unacknowledged, or that went to another reader, did not come back; going on without them");
                            for m in t.release() {
                                if tx.send(Ok(delivery(&topic, m, true))).await.is_err() {
                                    return;
                                }
                            }
                            continue;
                        }
                    };
                    match next {
                        Some(Ok(m)) => {
                            failures = 0;
                            let mut missing = 0;
                            let mut went_back = false;
                            if let Ok(info) = m.info() {
                                missing = info.consumer_sequence.saturating_sub(next_delivery);
                                went_back = info.consumer_sequence < next_delivery;
                                next_delivery = info.consumer_sequence + 1;
                            }
                            if went_back {
                                // The numbers went back: the server restarted with an older
                                // state of the consumer than what it delivered. What it holds
                                // as unacknowledged from before comes back only after its ack
                                // wait, and newer messages are handed out meanwhile: hold
                                // those as after a gap, until the older ones are back.
                                missing = match this
                                    .unacknowledged_before(&group, &topic, partition, &m)
                                    .await
                                {
                                    Ok(n) => n as u64,
                                    Err(e) => {
                                        tracing::warn!(%group, %topic, error = &e as &dyn std::error::Error, "reading the consumer's state after the server restarted failed; holding newer messages for a while");
                                        1
                                    }
                                };
                                if missing > 0 {
                                    tracing::info!(%group, %topic, unacknowledged = missing, "the server came back with an older state of the consumer; holding newer messages back until the unacknowledged ones return");
                                }
                            }
                            let taking_over = takeover.is_some() || missing > 0;
                            let ready = match takeover.as_mut() {
                                _ if missing > 0 => {
                                    let _ = m.ack_with(jetstream::AckKind::Progress).await;
                                    if !went_back {
                                        tracing::info!(%group, %topic, missing, "deliveries went to another reader; holding newer messages back until they return");
                                    }
                                    let (t, ready) =
                                        Takeover::after_gap(takeover.take(), missing as usize, m, patience);
                                    takeover = Some(t);
                                    ready
                                }
                                Some(t) => {
                                    // Held for a while: restart its ack wait, so that
                                    // holding it does not make JetStream send it again.
                                    let _ = m.ack_with(jetstream::AckKind::Progress).await;
                                    t.admit(m)
                                }
                                None => vec![m],
                            };
                            if takeover.as_ref().is_some_and(Takeover::complete) {
                                tracing::debug!(%group, %topic, "the earlier reader's unacknowledged messages are back");
                                takeover = None;
                            }
                            for m in ready {
                                if tx.send(Ok(delivery(&topic, m, taking_over))).await.is_err() {
                                    return;
                                }
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
    /// After the server came back with an older state of the consumer
    /// (its deliveries numbered from `first` again): how many messages it
    /// holds as delivered and unacknowledged from before `first`, to be
    /// redelivered once their ack wait runs out. Every delivery since
    /// `first` is in this reader's hands and unacknowledged too: counted
    /// out, except `first` itself when it is such a redelivery.
    async fn unacknowledged_before(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
        first: &jetstream::Message,
    ) -> Result<usize> {
        let (number, redelivered) = first
            .info()
            .map(|i| (i.consumer_sequence, i.delivered > 1))
            .map_err(|e| {
                Error::transport_reason(TRANSPORT, format!("reading a delivery's numbers: {e}"), true)
            })?;
        let mut consumer = self.durable(group, topic, partition).await?;
        let info = consumer
            .info()
            .await
            .map_err(|e| Error::transport(TRANSPORT, "reading consumer info", e, true))?;
        let since = info.delivered.consumer_sequence.saturating_sub(number) + 1 - u64::from(redelivered);
        Ok(info.num_ack_pending.saturating_sub(since as usize))
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

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A delivery of `m`; a redelivery, whatever count JetStream gives it,
/// when `taken_over` from a reader that left messages unacknowledged: it
/// may have died in their handlers, and JetStream 2.9 numbers a message it
/// offered to a reader that was gone as a first delivery again.
fn delivery(topic: &str, m: jetstream::Message, taken_over: bool) -> Delivery {
    let delivery_count = match m.info() {
        Ok(i) if taken_over => (i.delivered as u32).max(2),
        Ok(i) => i.delivered as u32,
        Err(_) => 0,
    };
    let (message, acker) = m.split();
    let raw = raw_message(topic, message.headers.as_ref(), &message.payload);
    Delivery::new(raw, delivery_count, NatsAcker(acker))
}
