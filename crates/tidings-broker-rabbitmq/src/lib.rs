//! RabbitMQ for Tidings: a [`Publisher`] that returns only once the broker
//! confirmed every message (publisher confirms), and a [`Subscriber`] with a
//! durable queue per consumer group, manual acknowledgements and a bounded
//! prefetch.
//!
//! # Topology Tidings declares
//!
//! | Tidings | RabbitMQ |
//! |---|---|
//! | topic `orders` | durable topic exchange `tidings.orders` |
//! | message of type `OrderPlaced` with key `o-1` | routing key `<p>.OrderPlaced`, where `<p>` is the key's partition ([`Partition::of`]); persistent (delivery mode 2), `message_id` = envelope id |
//! | consumer group `email` on `orders` (one partition) | durable queue `tidings.orders.email`, bound with `#`, single active consumer, dead-lettering into fanout exchange `tidings.orders.email.dlx` and its queue `tidings.orders.email.dead` |
//! | partition `p` of `n` of group `email` | durable queue `tidings.orders.email.<p>-of-<n>`, bound with `<p>.#`, single active consumer, dead-lettering into the group's `tidings.orders.email.dlx` |
//! | `Nak(delay)` | the message is republished (confirmed) to `tidings.orders.email.delay.<ms>`, a durable queue whose messages expire after `<ms>` into `tidings.orders.email`, then the original is acknowledged; delays are rounded up to a power of two of milliseconds so that few such queues exist |
//! | `Nak(None)` | `basic.nack` with requeue |
//! | `Term` | `basic.reject` without requeue: RabbitMQ moves it to `tidings.orders.email.dead` (and Tidings' failure store holds it with its error history) |
//! | envelope | CloudEvents binary mode: `ce-*` headers, `content-type`, the payload as the body |
//!
//! A queue only receives what is published after it exists: a new consumer
//! group starts with messages published after its first subscription.
//! Messages are published *mandatory*: one that no queue would take is
//! returned and the publish fails, so the relay keeps it in the outbox
//! (and retries) rather than losing it. Subscribe every consumer group once
//! (this declares its queue) before the relay starts on a new topic.
//!
//! Topics have one partition unless [`RabbitOptions::partitions`] says more;
//! publishers and subscribers of a topic must agree on the count. Subscribing
//! to any partition of a group declares the queues of all of them. The
//! consumer runtime leases each partition to one member of the group, and
//! every group queue is a *single active consumer* queue: even while a lease
//! changes hands, the broker delivers a partition to one member at a time,
//! and messages a departing member left unacknowledged go back to the head
//! of its queue, so a key is handled in order across members.
//!
//! `tidings` is the prefix ([`RabbitOptions::prefix`]).
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tidings_core::{
    AckKind, Acker, Backoff, Delivery, Error, Headers, OutgoingMessage, Partition, Publisher, RawMessage,
    Result, Subscriber, Subscription, cloudevents,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const TRANSPORT: &str = "rabbitmq";
const DELIVERY_COUNT: &str = "x-tidings-delivery-count";

fn transport_error(what: &str, e: impl fmt::Display, retryable: bool) -> Error {
    Error::Transport {
        transport: TRANSPORT,
        reason: format!("{what}: {e}"),
        retryable,
    }
}

/// Options of a [`RabbitTransport`].
#[derive(Debug, Clone)]
pub struct RabbitOptions {
    prefix: String,
    prefetch: u16,
    connection_name: Option<String>,
    partitions: u32,
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

    /// Unacknowledged messages one member may hold (backpressure).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }
}

/// A connection to RabbitMQ, usable as publisher and subscriber. Cheap to clone.
///
/// A lost connection is opened again on next use: the relay's next publish
/// reconnects, and each subscription re-establishes its consumer (messages
/// unacknowledged on the lost channel are redelivered by the broker).
#[derive(Clone)]
pub struct RabbitTransport {
    url: Arc<str>,
    link: Arc<tokio::sync::Mutex<Link>>,
    options: RabbitOptions,
    declared: Arc<Mutex<HashSet<String>>>,
}

/// The current connection and its confirm-mode channel, if alive.
#[derive(Default)]
struct Link {
    connection: Option<Arc<Connection>>,
    /// Publisher confirms are on: every publish is acknowledged by the broker.
    confirms: Option<Channel>,
}

impl fmt::Debug for RabbitTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection URI holds the password: never printed.
        f.debug_struct("RabbitTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// `amqp://user:pw@host/vhost` -> `amqp://user@host/vhost`, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = url[scheme + 3..at].split(':').next().unwrap_or("");
            format!("{}{}{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Rounds a delay up to a power of two of milliseconds (at least 1 ms).
fn delay_bucket(d: Duration) -> u64 {
    let ms = d.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
    ms.next_power_of_two()
}

impl RabbitTransport {
    /// Connects to `url` (`amqp://user:pw@host:5672/%2f`).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RabbitOptions::default()).await
    }

    /// Connects with options.
    pub async fn connect_with(url: &str, options: RabbitOptions) -> Result<Self> {
        let transport = RabbitTransport {
            url: url.into(),
            link: Arc::default(),
            options,
            declared: Arc::default(),
        };
        transport.confirms().await?;
        Ok(transport)
    }

    /// The live connection, opened again if it was lost.
    async fn connection(&self) -> Result<Arc<Connection>> {
        let mut link = self.link.lock().await;
        self.live_connection(&mut link).await
    }

    async fn live_connection(&self, link: &mut Link) -> Result<Arc<Connection>> {
        if let Some(c) = link.connection.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        link.confirms = None;
        let mut properties = ConnectionProperties::default();
        if let Some(name) = &self.options.connection_name {
            properties = properties.with_connection_name(name.as_str().into());
        }
        let connection = Arc::new(
            Connection::connect(&self.url, properties)
                .await
                .map_err(|e| transport_error(&format!("connecting to {}", redact(&self.url)), e, true))?,
        );
        link.connection = Some(connection.clone());
        Ok(connection)
    }

    /// The live confirm-mode channel, opened again if it was lost.
    async fn confirms(&self) -> Result<Channel> {
        let mut link = self.link.lock().await;
        if let Some(c) = link.confirms.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        let connection = self.live_connection(&mut link).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| transport_error("opening a channel", e, true))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| transport_error("enabling publisher confirms", e, true))?;
        link.confirms = Some(channel.clone());
        Ok(channel)
    }

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

    /// Queues this transport declared, by name.
    pub fn queues(&self) -> Vec<String> {
        self.declared_with("q:")
    }

    /// Exchanges this transport declared, by name.
    pub fn exchanges(&self) -> Vec<String> {
        self.declared_with("x:")
    }

    fn declared_with(&self, kind: &str) -> Vec<String> {
        let declared = self.declared.lock().expect("declared lock");
        declared
            .iter()
            .filter_map(|n| n.strip_prefix(kind))
            .map(str::to_owned)
            .collect()
    }

    /// Deletes a queue (and its messages).
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        self.confirms()
            .await?
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .map_err(|e| transport_error("deleting a queue", e, true))?;
        Ok(())
    }

    /// Deletes everything Tidings declares for `group` on `topic`, messages
    /// included: the queue of each partition and its delay queues, and the
    /// group's dead-letter exchange and queue. Names that do not exist are skipped.
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        let stem = self.queue(topic, group);
        let mut names = vec![format!("{stem}.dead")];
        for partition in Partition::all(self.options.partitions) {
            let queue = self.partition_queue(topic, group, partition);
            names.extend((0..=32).map(|e| format!("{queue}.delay.{}", 1u64 << e)));
            names.push(queue);
        }
        let connection = self.connection().await?;
        let mut channel = None;
        for name in names {
            let c = match channel.take() {
                Some(c) => c,
                None => connection
                    .create_channel()
                    .await
                    .map_err(|e| transport_error("opening a channel", e, true))?,
            };
            // A name that does not exist closes the channel: the next one opens another.
            if c.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .is_ok()
            {
                channel = Some(c);
            }
        }
        self.delete_exchange(&format!("{stem}.dlx")).await
    }

    /// Deletes an exchange.
    pub async fn delete_exchange(&self, name: &str) -> Result<()> {
        self.confirms()
            .await?
            .exchange_delete(name.into(), Default::default())
            .await
            .map_err(|e| transport_error("deleting an exchange", e, true))?;
        Ok(())
    }

    async fn declare_exchange(&self, channel: &Channel, topic: &str) -> Result<String> {
        let name = self.exchange(topic);
        self.declare_named_exchange(channel, &name, ExchangeKind::Topic)
            .await?;
        Ok(name)
    }

    async fn declare_named_exchange(&self, channel: &Channel, name: &str, kind: ExchangeKind) -> Result<()> {
        let key = format!("x:{name}");
        if !self.declared.lock().expect("declared lock").contains(&key) {
            channel
                .exchange_declare(
                    name.into(),
                    kind,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| transport_error(&format!("declaring exchange {name}"), e, true))?;
            self.declared.lock().expect("declared lock").insert(key);
        }
        Ok(())
    }

    /// Declares the queues of every partition of the group, with the
    /// group's dead-letter exchange and queue.
    async fn declare_group(&self, channel: &Channel, topic: &str, group: &str) -> Result<()> {
        let exchange = self.declare_exchange(channel, topic).await?;
        let stem = self.queue(topic, group);
        let dlx = format!("{stem}.dlx");
        let dead = format!("{stem}.dead");
        self.declare_named_exchange(channel, &dlx, ExchangeKind::Fanout)
            .await?;
        self.declare_queue(channel, &dead, FieldTable::default()).await?;
        self.bind(channel, &dead, &dlx, "#").await?;
        for partition in Partition::all(self.options.partitions) {
            let queue = self.partition_queue(topic, group, partition);
            let mut args = FieldTable::default();
            args.insert("x-dead-letter-exchange".into(), long(&dlx));
            args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
            self.declare_queue(channel, &queue, args).await?;
            let pattern = if partition.is_whole() {
                "#".to_owned()
            } else {
                format!("{}.#", partition.index)
            };
            self.bind(channel, &queue, &exchange, &pattern).await?;
        }
        Ok(())
    }

    async fn bind(&self, channel: &Channel, queue: &str, exchange: &str, pattern: &str) -> Result<()> {
        channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| transport_error(&format!("binding {queue} to {exchange}"), e, true))
    }

    async fn declare_queue(&self, channel: &Channel, name: &str, arguments: FieldTable) -> Result<()> {
        channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .map_err(|e| transport_error(&format!("declaring queue {name}"), e, true))?;
        self.declared
            .lock()
            .expect("declared lock")
            .insert(format!("q:{name}"));
        Ok(())
    }

    /// Publishes one message with confirms on, returning the confirmation to await.
    async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<lapin::PublisherConfirm> {
        self.confirms()
            .await?
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                // Mandatory: a message no queue takes comes back, instead of
                // being dropped while the relay believes it delivered.
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body,
                properties,
            )
            .await
            .map_err(|e| transport_error("publishing", e, true))
    }
}

async fn confirmed(confirm: lapin::PublisherConfirm) -> Result<()> {
    match confirm
        .await
        .map_err(|e| transport_error("waiting for a publisher confirm", e, true))?
    {
        lapin::Confirmation::Ack(None) => Ok(()),
        lapin::Confirmation::Ack(Some(returned)) => Err(transport_error(
            "publishing",
            format!(
                "no queue is bound to exchange {:?} (routing key {:?}): subscribe the consumer groups \
                 (which declares their queues) before publishing; the message stays in the outbox",
                returned.delivery.exchange.as_str(),
                returned.delivery.routing_key.as_str()
            ),
            true,
        )),
        lapin::Confirmation::Nack(_) => Err(transport_error(
            "publishing",
            "the broker refused the message (nack)",
            true,
        )),
        lapin::Confirmation::NotRequested => {
            Err(transport_error("publishing", "publisher confirms are off", false))
        }
    }
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

#[async_trait]
impl Publisher for RabbitTransport {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        // Publish the whole batch, then wait for every confirm.
        let mut confirms = Vec::with_capacity(batch.len());
        for m in batch {
            let exchange = self.declare_exchange(&self.confirms().await?, &m.topic).await?;
            let (attributes, payload) = cloudevents::to_binary(&m.envelope);
            let mut headers = FieldTable::default();
            let mut content_type = None;
            for (k, v) in &attributes {
                if k == cloudevents::CONTENT_TYPE_HEADER {
                    content_type = Some(v.clone());
                } else {
                    headers.insert(ShortString::from(k.as_str()), long(v));
                }
            }
            let mut properties = BasicProperties::default()
                .with_headers(headers)
                .with_delivery_mode(2)
                .with_message_id(m.envelope.id.to_string().as_str().into());
            if let Some(ct) = content_type {
                properties = properties.with_content_type(ct.as_str().into());
            }
            let partition = Partition::of(&m.envelope.aggregate_key, self.options.partitions);
            let routing_key = format!("{}.{}", partition.index, m.envelope.message_type);
            confirms.push(self.send(&exchange, &routing_key, &payload, properties).await?);
        }
        for c in confirms {
            confirmed(c).await?;
        }
        Ok(())
    }
}

fn value_str(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The message's headers, without RabbitMQ's and Tidings' own bookkeeping.
fn headers_of(properties: &BasicProperties) -> Headers {
    let mut out = Headers::new();
    if let Some(table) = properties.headers() {
        for (k, v) in table.inner() {
            let k = k.as_str();
            if k == "x-death"
                || k.starts_with("x-first-death")
                || k.starts_with("x-last-death")
                || k.starts_with("x-tidings-")
            {
                continue;
            }
            if let Some(v) = value_str(v) {
                out.insert(k.to_owned(), v);
            }
        }
    }
    if let Some(ct) = properties.content_type() {
        out.insert(
            cloudevents::CONTENT_TYPE_HEADER.to_owned(),
            ct.as_str().to_owned(),
        );
    }
    out
}

fn delivery_count(d: &lapin::message::Delivery) -> u32 {
    let carried = d
        .properties
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get(DELIVERY_COUNT))
        .and_then(value_str)
        .and_then(|s| s.parse::<u32>().ok());
    match carried {
        Some(n) => n + u32::from(d.redelivered),
        None if d.redelivered => 2,
        None => 1,
    }
}

struct RabbitAcker {
    acker: lapin::Acker,
    transport: RabbitTransport,
    queue: String,
    body: Vec<u8>,
    properties: BasicProperties,
    count: u32,
}

#[async_trait]
impl Acker for RabbitAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        let settle = |e| transport_error("settling a delivery", e, true);
        match kind {
            AckKind::Ack => self
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map(drop)
                .map_err(settle),
            AckKind::Term => self
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
                .map(drop)
                .map_err(settle),
            AckKind::Progress => Ok(()),
            AckKind::Nak(None) => self
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(settle),
            AckKind::Nak(Some(delay)) => {
                // RabbitMQ cannot requeue with a delay: park a copy in a
                // queue whose messages expire back into this one, then let
                // the original go. A crash in between redelivers the
                // original as well: a duplicate, never a loss.
                let ms = delay_bucket(delay);
                let parking = format!("{}.delay.{ms}", self.queue);
                let mut args = FieldTable::default();
                args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms as i64));
                args.insert("x-dead-letter-exchange".into(), long(""));
                args.insert("x-dead-letter-routing-key".into(), long(&self.queue));
                self.transport
                    .declare_queue(&self.transport.confirms().await?, &parking, args)
                    .await?;
                let mut headers = self.properties.headers().clone().unwrap_or_default();
                headers.insert(DELIVERY_COUNT.into(), long(&(self.count + 1).to_string()));
                let properties = self.properties.clone().with_headers(headers);
                confirmed(self.transport.send("", &parking, &self.body, properties).await?).await?;
                self.acker
                    .ack(BasicAckOptions::default())
                    .await
                    .map(drop)
                    .map_err(settle)
            }
        }
    }
}

#[async_trait]
impl Subscriber for RabbitTransport {
    fn partitions(&self, _topic: &str) -> u32 {
        self.options.partitions
    }

    /// Ready messages over the group's partition queues (delivered and
    /// unacknowledged ones are not counted by AMQP); declares nothing.
    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        let connection = self.connection().await?;
        let mut total = None;
        for partition in Partition::all(self.options.partitions) {
            // A passive declare of a missing queue closes its channel: one each.
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| transport_error("opening a channel", e, true))?;
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
        let channel = self
            .connection()
            .await?
            .create_channel()
            .await
            .map_err(|e| transport_error("opening a channel", e, true))?;
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
                            tracing::warn!(%group, %topic, error = %e, retry_in_ms = delay.as_millis() as u64, "RabbitMQ consumer lost; reconnecting");
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
                    let headers = headers_of(&d.properties);
                    let raw = RawMessage {
                        topic: topic.clone(),
                        key: headers.get("ce-subject").cloned(),
                        headers,
                        body: d.data.clone(),
                    };
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
                        Err(e) => Err(transport_error("closing a channel", e, true)),
                    },
                    _ => Ok(()),
                }
            }),
        )
    }
}

impl RabbitTransport {
    /// Opens a channel with the prefetch, declares the group and starts consuming one partition.
    async fn consume(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<(Channel, String, lapin::Consumer)> {
        let channel = self
            .connection()
            .await?
            .create_channel()
            .await
            .map_err(|e| transport_error("opening a channel", e, true))?;
        channel
            .basic_qos(self.options.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| transport_error("setting the prefetch", e, true))?;
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
            .map_err(|e| transport_error(&format!("consuming {queue}"), e, true))?;
        Ok((channel, queue, consumer))
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

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest@127.0.0.1:5672/%2f"
        );
    }
}
