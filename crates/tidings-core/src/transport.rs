//! What a transport (a broker, or the database log) must do.
//!
//! A transport has two halves. The [`Publisher`] is driven by the relay: it
//! takes a batch of outbox records and returns only once the transport has
//! *confirmed* every one (JetStream PubAck, RabbitMQ publisher confirm, a
//! committed log insert). The [`Subscriber`] hands the consumer runtime a
//! stream of [`Delivery`] values, each acknowledged with an [`AckKind`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::envelope::{Envelope, Headers};
use crate::error::{DecodeError, Result};
use crate::partition::Partition;

/// One message for a publisher: where it goes and what it is.
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    /// The topic (events) or queue (commands).
    pub topic: String,
    /// The message.
    pub envelope: Envelope,
}

impl OutgoingMessage {
    /// `message` from `source`, to its type's [`Message::TOPIC`](crate::Message::TOPIC).
    pub fn new<M: crate::Message>(
        source: impl Into<String>,
        message: &M,
    ) -> Result<OutgoingMessage, DecodeError> {
        Ok(OutgoingMessage {
            topic: M::TOPIC.to_owned(),
            envelope: Envelope::new(source, message)?,
        })
    }
}

/// Sends messages to a transport and waits until it has them.
#[async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `batch` and returns once the transport confirmed every message.
    ///
    /// Messages of one aggregate key must reach the transport in slice order.
    /// On error, any prefix of each key's messages may have been published,
    /// never a key's later message without its earlier ones (a client that
    /// pipelines and reconnects on its own breaks that unless it sends in
    /// [`key_waves`](crate::waves::key_waves)): the relay publishes the whole
    /// batch again, so consumers may see duplicates (they deduplicate on the
    /// envelope id), never a gap.
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()>;

    /// Why the transport would refuse `message` whatever its state (larger
    /// than it accepts), said before anything is sent; `None` if it would
    /// take it. The relay sets such a record aside instead of publishing
    /// it. Cheap: it runs for every record the relay publishes.
    fn refuses(&self, message: &OutgoingMessage) -> Option<String> {
        let _ = message;
        None
    }
}

#[async_trait]
impl<P: Publisher + ?Sized> Publisher for std::sync::Arc<P> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        (**self).publish(batch).await
    }

    fn refuses(&self, message: &OutgoingMessage) -> Option<String> {
        (**self).refuses(message)
    }
}

/// A message as it came off a transport, before decoding.
#[derive(Clone)]
pub struct RawMessage {
    /// The topic it was read from.
    pub topic: String,
    /// The partitioning key, when the transport has one.
    pub key: Option<String>,
    /// Transport headers.
    pub headers: Headers,
    /// The body: a CloudEvents JSON document (structured mode), or the bare
    /// payload when the headers carry the attributes (binary mode).
    pub body: Vec<u8>,
    /// Why the transport could not read the message as it came, naming
    /// the header (a value of a type it cannot represent as text):
    /// decoding then fails with it, and the message is dead-lettered.
    pub refused: Option<String>,
}

impl fmt::Debug for RawMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawMessage")
            .field("topic", &self.topic)
            .field("key", &self.key)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl RawMessage {
    /// A message whose headers a transport read as text: its key is the
    /// `ce-partitionkey` header, else `ce-subject` (what Tidings writes, and
    /// what another team's CloudEvents producer most likely sets).
    /// `refused` names a header the transport could not read as text.
    pub fn from_headers(topic: &str, headers: Headers, body: Vec<u8>, refused: Option<String>) -> RawMessage {
        let key = headers
            .get("ce-partitionkey")
            .or_else(|| headers.get("ce-subject"))
            .cloned();
        RawMessage {
            topic: topic.to_owned(),
            key,
            headers,
            body,
            refused,
        }
    }

    /// A record whose headers are names and byte values, any of them
    /// repeated or without a value (Kafka's), read as text headers.
    ///
    /// A name's first value counts (an attribute's, whatever the case of its
    /// name); a header without a value is left out.
    /// A CloudEvents attribute (`ce-…`, `content-type`) that is not UTF-8
    /// is never patched into text, which could turn two ids into one: the
    /// message is refused naming it, and decoding fails with that reason.
    /// Other headers, and the key, are read as UTF-8, each byte sequence
    /// that is not UTF-8 replaced by the replacement character (U+FFFD).
    /// An attribute given both as `ce_<name>` (Kafka's binding) and as
    /// `ce-<name>` is read from `ce_`; the other is left out.
    pub fn from_record<'a>(
        topic: &str,
        key: Option<&[u8]>,
        headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
        body: &[u8],
    ) -> RawMessage {
        let headers: Vec<(&str, Option<&[u8]>)> = headers.into_iter().collect();
        // Kafka's binding names attributes `ce_`: where a record carries an
        // attribute under both prefixes, `ce_` counts and `ce-` goes, before
        // anything is read of it.
        let underscored: std::collections::BTreeSet<String> = headers
            .iter()
            .filter(|(k, v)| v.is_some() && k.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("ce_")))
            .map(|(k, _)| k[3..].to_ascii_lowercase())
            .collect();
        let shadowed = |k: &str| {
            k.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("ce-"))
                && underscored.contains(&k[3..].to_ascii_lowercase())
        };
        let mut out = Headers::new();
        let mut refused = None;
        let mut seen = std::collections::BTreeSet::new();
        for (name, value) in headers {
            let Some(value) = value else { continue };
            if shadowed(name) {
                continue;
            }
            // Attributes are read without regard to case: `CE-ID` then
            // `ce-id` is one attribute given twice.
            let seen_as = if crate::cloudevents::is_attribute_header(name) {
                name.to_ascii_lowercase()
            } else {
                name.to_owned()
            };
            if !seen.insert(seen_as) {
                continue;
            }
            let value = match std::str::from_utf8(value) {
                Ok(text) => text.to_owned(),
                Err(_) if crate::cloudevents::is_attribute_header(name) => {
                    refused.get_or_insert_with(|| {
                        format!("header {name} is not UTF-8 text: a CloudEvents attribute must be a string")
                    });
                    continue;
                }
                Err(_) => String::from_utf8_lossy(value).into_owned(),
            };
            out.insert(name.to_owned(), value);
        }
        RawMessage {
            topic: topic.to_owned(),
            key: key.map(|k| String::from_utf8_lossy(k).into_owned()),
            headers: out,
            body: body.to_vec(),
            refused,
        }
    }

    /// Decodes the message into an envelope, in binary mode when the
    /// headers carry `ce-specversion` (or Kafka's `ce_specversion`), else as a
    /// structured JSON document; the record's key is the event's key when it
    /// names none (no `partitionkey`, no `subject`).
    pub fn decode(&self) -> Result<Envelope, DecodeError> {
        use crate::cloudevents;
        if let Some(reason) = &self.refused {
            return Err(DecodeError::Malformed {
                reason: reason.clone(),
            });
        }
        let key = self.key.as_deref();
        if cloudevents::is_binary(self.headers.keys().map(String::as_str)) {
            cloudevents::decode_binary(
                self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                &self.body,
                key,
            )
        } else {
            cloudevents::decode_json(&self.body, key)
        }
    }
}

/// How a delivery is settled, after async-nats' `AckKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    /// Done: never deliver it again.
    Ack,
    /// Not done: deliver it again, after the delay if one is given.
    Nak(Option<Duration>),
    /// Still working on it: extend the deadline before redelivery.
    Progress,
    /// Never deliver it again, and do not count it as done (it was dead-lettered elsewhere).
    Term,
}

/// Settles one delivery with its transport.
#[async_trait]
pub trait Acker: Send + Sync + 'static {
    /// Settles the delivery. `Progress` may be sent any number of times before a final kind.
    async fn ack(&self, kind: AckKind) -> Result<()>;
}

/// A message delivered to a consumer, with the handle to settle it.
pub struct Delivery {
    /// The message.
    pub message: RawMessage,
    /// How many times the transport has delivered it, 1 for the first time (0 if unknown).
    pub delivery_count: u32,
    acker: Box<dyn Acker>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("message", &self.message)
            .field("delivery_count", &self.delivery_count)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// A delivery settled through `acker`.
    pub fn new(message: RawMessage, delivery_count: u32, acker: impl Acker) -> Self {
        Delivery {
            message,
            delivery_count,
            acker: Box::new(acker),
        }
    }

    /// Whether the transport may have delivered it before: any count but 1.
    /// A count is only ever a hint that decides what the runtime watches;
    /// what a redelivery costs (the crash-loop guard) is counted in
    /// Tidings' own store.
    pub fn may_be_redelivered(&self) -> bool {
        self.delivery_count != 1
    }

    /// Settles the delivery.
    pub async fn ack(&self, kind: AckKind) -> Result<()> {
        self.acker.ack(kind).await
    }
}

type Closer = Box<dyn FnOnce() -> BoxFuture<'static, Result<()>> + Send>;

/// A stream of deliveries for one consumer group on one topic.
///
/// Read it as a [`Stream`]; when done, [`close`](Subscription::close) it so
/// that the transport stores what was acknowledged (a log offset, a final
/// batch of acks) before the process moves on. Dropping it without closing
/// loses nothing, but may redeliver what was settled last.
pub struct Subscription {
    stream: BoxStream<'static, Result<Delivery>>,
    closer: Option<Closer>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    /// A subscription over `stream`, with nothing to do on close.
    pub fn new(stream: impl Stream<Item = Result<Delivery>> + Send + 'static) -> Self {
        Subscription {
            stream: Box::pin(stream),
            closer: None,
        }
    }

    /// Runs `close` when the subscription is closed, after the stream is dropped.
    pub fn on_close<F, Fut>(mut self, close: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.closer = Some(Box::new(move || Box::pin(close())));
        self
    }

    /// The same subscription, calling `look` on every item as it passes
    /// (to count or time deliveries); closing it closes this one.
    pub fn inspect(self, look: impl FnMut(&Result<Delivery>) + Send + 'static) -> Self {
        use futures::StreamExt;
        Subscription {
            stream: Box::pin(self.stream.inspect(look)),
            closer: self.closer,
        }
    }

    /// One subscription reading all of `parts`, closing each of them when closed.
    pub fn merge(parts: Vec<Subscription>) -> Self {
        if parts.len() == 1 {
            return parts.into_iter().next().expect("one part");
        }
        let mut streams = Vec::with_capacity(parts.len());
        let mut closers = Vec::with_capacity(parts.len());
        for part in parts {
            streams.push(part.stream);
            closers.extend(part.closer);
        }
        Subscription::new(futures::stream::select_all(streams)).on_close(move || async move {
            let mut first_error = None;
            for close in closers {
                if let Err(e) = close().await {
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    /// Stops reading and waits until the transport has stored what was acknowledged.
    pub async fn close(self) -> Result<()> {
        let Subscription { stream, closer } = self;
        drop(stream);
        match closer {
            Some(close) => close().await,
            None => Ok(()),
        }
    }
}

impl Stream for Subscription {
    type Item = Result<Delivery>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// Reads messages from a transport as a member of a consumer group.
///
/// A topic has [`partitions`](Subscriber::partitions) (1 unless the
/// transport is configured with more). Every group gets every message of the
/// topic; within a group, each partition is read by one member at a time
/// (the consumer runtime leases them), so a key's messages reach one member,
/// in order, while the members of the group share the partitions.
#[async_trait]
pub trait Subscriber: Send + Sync + 'static {
    /// How many partitions `topic` has on this transport.
    fn partitions(&self, _topic: &str) -> u32 {
        1
    }

    /// Checks that `topic`, where it exists on the broker already, has the
    /// [`partitions`](Subscriber::partitions) this transport reads: a topic
    /// with more would have partitions no member ever reads. The consumer
    /// runtime calls it before reading; the error names both counts. The
    /// default has nothing to check.
    async fn check_partitions(&self, _topic: &str) -> Result<()> {
        Ok(())
    }

    /// Whether a key's messages of `topic` are in the partition
    /// [`Partition::of`] names, as Tidings' publishers place them (true
    /// unless the transport says otherwise). False for a topic of several
    /// partitions another team's producer fills with its own partitioner:
    /// there a held key ([`OnDeadLetter::HoldKey`]) could not be found
    /// again by the member reading its messages, so the consumer runtime
    /// does not hold keys on it.
    ///
    /// Called after [`check_partitions`](Subscriber::check_partitions).
    ///
    /// [`OnDeadLetter::HoldKey`]: https://docs.rs/tidings-consumer/latest/tidings_consumer/enum.OnDeadLetter.html
    fn places_keys(&self, _topic: &str) -> bool {
        true
    }

    /// Subscribes `group` to one partition of `topic`.
    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription>;

    /// Subscribes `group` to every partition of `topic`: one member reading the whole topic.
    async fn subscribe(&self, group: &str, topic: &str) -> Result<Subscription> {
        let mut parts = Vec::new();
        for partition in Partition::all(self.partitions(topic)) {
            parts.push(self.subscribe_partition(group, topic, partition).await?);
        }
        Ok(Subscription::merge(parts))
    }

    /// Makes sure `group` exists on every partition of `topic`, so that it
    /// keeps everything published from now on, without reading anything.
    /// Call it before the first publish when a group's members start later:
    /// on RabbitMQ a queue only receives what is published after it exists.
    ///
    /// The default subscribes and closes at once; transports override it
    /// to declare without reading (a subscription would take messages away
    /// from the group's running members).
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        self.subscribe(group, topic).await?.close().await
    }

    /// Messages of `topic` that `group` has not settled yet, waiting or in
    /// flight, as the broker counts them over every partition; `None` where
    /// the transport cannot tell, or the group does not exist on it (the
    /// database log's lag is read from the store: [`crate::LagSource`]).
    async fn pending(&self, _group: &str, _topic: &str) -> Result<Option<u64>> {
        Ok(None)
    }
}

#[async_trait]
impl<S: Subscriber + ?Sized> Subscriber for std::sync::Arc<S> {
    fn partitions(&self, topic: &str) -> u32 {
        (**self).partitions(topic)
    }

    async fn check_partitions(&self, topic: &str) -> Result<()> {
        (**self).check_partitions(topic).await
    }

    fn places_keys(&self, topic: &str) -> bool {
        (**self).places_keys(topic)
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        (**self).subscribe_partition(group, topic, partition).await
    }

    async fn subscribe(&self, group: &str, topic: &str) -> Result<Subscription> {
        (**self).subscribe(group, topic).await
    }

    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        (**self).ensure_group(group, topic).await
    }

    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        (**self).pending(group, topic).await
    }
}

#[cfg(test)]
mod tests {
    use super::RawMessage;
    use crate::cloudevents::{Binding, to_binary};
    use crate::{Envelope, Kind};

    fn record<'a>(headers: &'a [(&'a str, Option<&'a [u8]>)], body: &[u8]) -> RawMessage {
        RawMessage::from_record("orders", Some(b"k\xff"), headers.iter().copied(), body)
    }

    fn envelope() -> Envelope {
        Envelope {
            id: uuid::Uuid::from_u128(0x0193_5a7c_0000_7000_8000_0000_0000_0001),
            message_type: "OrderPlaced".into(),
            version: 1,
            kind: Kind::Event,
            source: "checkout".into(),
            aggregate_type: "order".into(),
            aggregate_key: "o-1".into(),
            occurred_at: chrono::Utc::now(),
            correlation_id: uuid::Uuid::now_v7(),
            causation_id: None,
            headers: Default::default(),
            content_type: "application/json".into(),
            payload: br#"{"n":1}"#.to_vec(),
        }
    }

    #[test]
    fn a_record_s_attributes_arrive_byte_for_byte_or_refuse_the_message() {
        let e = envelope();
        let (headers, body) = to_binary(&e, Binding::Standard);
        let mut pairs: Vec<(&str, Option<&[u8]>)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), Some(v.as_bytes())))
            .collect();
        // A second value of a name and a header without one change nothing.
        pairs.push(("ce-type", Some(b"Forged")));
        pairs.push(("ce-source", None));
        pairs.push(("x-trace", Some(b"a\xffb")));
        let raw = record(&pairs, &body);
        assert_eq!(raw.key.as_deref(), Some("k\u{fffd}"));
        assert_eq!(
            raw.headers["x-trace"], "a\u{fffd}b",
            "other headers are read as they can be"
        );
        let mut expected = e.clone();
        expected.headers.insert("x-trace".into(), "a\u{fffd}b".into());
        assert_eq!(raw.decode().unwrap(), expected);

        // An id that is not text is never patched into another id.
        let mut bad = pairs.clone();
        bad.retain(|(k, _)| *k != "ce-id");
        bad.insert(0, ("CE-ID", Some(b"\xff\xfe")));
        let raw = record(&bad, &body);
        assert!(!raw.headers.contains_key("CE-ID"));
        let err = raw.decode().unwrap_err().to_string();
        assert!(err.contains("header CE-ID is not UTF-8 text"), "{err}");

        // Found by the kafka_headers fuzz target: a refused first value let
        // the name's second value in.
        let raw = record(&[("ce-id", Some(b"\xff")), ("ce-id", Some(b"later"))], b"");
        assert!(
            raw.refused.is_some() && !raw.headers.contains_key("ce-id"),
            "{raw:?}"
        );
        let raw = record(&[("CE-ID", Some(b"first")), ("ce-id", Some(b"second"))], b"");
        assert_eq!(
            raw.headers.len(),
            1,
            "one attribute given twice: {:?}",
            raw.headers
        );
    }

    #[test]
    fn on_a_record_kafka_s_ce_underscore_wins_over_ce_dash() {
        let (headers, body) = to_binary(&envelope(), Binding::Kafka);
        let mut pairs: Vec<(&str, Option<&[u8]>)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), Some(v.as_bytes())))
            .collect();
        // Whichever comes first, another prefix's attribute does not count.
        pairs.insert(0, ("ce-type", Some(b"Forged")));
        pairs.push(("CE-ID", Some(b"forged-id")));
        pairs.push(("ce-\u{e9}t\u{e9}", Some(b"not ASCII")));
        // A stale `ce-` value that is not text refuses nothing: it is not read.
        pairs.push(("ce-source", Some(b"\xff")));
        let raw = record(&pairs, &body);
        let decoded = raw.decode().unwrap();
        assert_eq!(decoded.message_type, "OrderPlaced");
        assert_eq!(decoded.id, envelope().id);
        assert!(!raw.headers.contains_key("ce-type") && !raw.headers.contains_key("CE-ID"));
    }
}
