//! NATS JetStream for Tidings: a [`Publisher`] that returns only once
//! JetStream acknowledged every message, and a [`Subscriber`] reading
//! durable pull consumers, one per consumer group.
//!
//! # Topology
//!
//! | Tidings | JetStream |
//! |---|---|
//! | topic `orders` | stream `TIDINGS_ORDERS`, subjects `TIDINGS.orders.>` (file storage) |
//! | message of type `OrderPlaced` with key `o-1` on `orders` | subject `TIDINGS.orders.<p>.OrderPlaced`, where `<p>` is the key's partition ([`Partition::of`]) |
//! | consumer group `email` reading the whole topic | durable pull consumer `EMAIL` on that stream, filtered on `TIDINGS.orders.>`, explicit acks, delivering from the start |
//! | partition `p` of `n` of group `email` | durable pull consumer `EMAIL-<p>-OF-<n>`, filtered on `TIDINGS.orders.<p>.>` |
//! | envelope | CloudEvents binary mode: `ce-*` headers, the payload as the body |
//! | envelope id | `Nats-Msg-Id`: JetStream drops a publisher's retry inside the stream's duplicate window (a redrive adds `/redrive/<n>`, so it is not dropped) |
//!
//! `TIDINGS` is the prefix ([`NatsOptions::stream_prefix`]): it starts both
//! stream names and subjects, so that systems with different prefixes share
//! a server without their subjects overlapping.
//!
//! Names are made safe for JetStream (upper case, `_` for anything but
//! letters, digits, `-` and `_`), so two topics differing only there share a
//! stream name and the second is refused: pick distinct names.
//!
//! Topics have one partition unless [`NatsOptions::partitions`] says more;
//! publishers and subscribers of a topic must agree on the count. The
//! consumer runtime leases each partition to one member of the group, so
//! the members share the work and a key stays with one of them.
//!
//! A member that starts reading a partition whose durable consumer still
//! has unacknowledged messages (its previous reader crashed, or handed over
//! with a pull in flight) holds newer messages back until those come back
//! (JetStream redelivers them once their [`NatsOptions::ack_wait`] runs
//! out), so that each key stays in order; if some never return (deleted
//! from the stream), it goes on after four ack waits.
//!
//! Acknowledgements map one to one: `Ack`, `Nak(delay)` (redelivered after
//! the delay), `Progress` (extends the ack wait), `Term` (never again).
//! Retries and dead-lettering are the consumer runtime's: the JetStream
//! consumer redelivers without limit, and the runtime terminates what it
//! dead-lettered.
//!
//! ```no_run
//! # async fn run() -> tidings_core::Result<()> {
//! use tidings_broker_nats::NatsTransport;
//! let nats = NatsTransport::connect("nats://127.0.0.1:4222").await?;
//! // `nats` is both the relay's publisher and the consumers' subscriber.
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use async_nats::{HeaderMap, HeaderValue};
use async_trait::async_trait;
use futures::StreamExt;
use tidings_core::{
    AckKind, Acker, Backoff, Delivery, Error, Headers, OutgoingMessage, Partition, Publisher, RawMessage,
    Result, Subscriber, Subscription, cloudevents,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const TRANSPORT: &str = "nats";
const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// Options of a [`NatsTransport`].
#[derive(Debug, Clone)]
pub struct NatsOptions {
    stream_prefix: String,
    ack_wait: Duration,
    max_ack_pending: i64,
    duplicate_window: Duration,
    prefetch: usize,
    partitions: u32,
}

impl Default for NatsOptions {
    /// Streams named `TIDINGS_<TOPIC>`, a 30 s ack wait, at most 1000
    /// unacknowledged messages per consumer group (backpressure), a
    /// 2-minute duplicate window, pulls of 64 messages, one partition per topic.
    fn default() -> Self {
        NatsOptions {
            stream_prefix: "TIDINGS".into(),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1000,
            duplicate_window: Duration::from_secs(120),
            prefetch: 64,
            partitions: 1,
        }
    }
}

impl NatsOptions {
    /// The prefix of stream names and subjects.
    pub fn stream_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.stream_prefix = prefix.into();
        self
    }

    /// How long JetStream waits for an acknowledgement before redelivering.
    /// Handlers slower than this should send `Progress`.
    pub fn ack_wait(mut self, d: Duration) -> Self {
        self.ack_wait = d;
        self
    }

    /// Unacknowledged messages allowed per consumer group before JetStream stops delivering.
    pub fn max_ack_pending(mut self, n: i64) -> Self {
        self.max_ack_pending = n.max(1);
        self
    }

    /// Messages one member pulls at a time. Smaller spreads work more evenly
    /// across the members of a group; larger saves round trips.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// Partitions of every topic: up to this many members of one group share
    /// a topic's work. Publishers and subscribers must use the same count.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The window in which JetStream drops a message whose `Nats-Msg-Id` it has seen.
    pub fn duplicate_window(mut self, d: Duration) -> Self {
        self.duplicate_window = d;
        self
    }
}

/// A connection to NATS JetStream, usable as publisher and subscriber. Cheap to clone.
#[derive(Clone)]
pub struct NatsTransport {
    client: async_nats::Client,
    js: jetstream::Context,
    options: NatsOptions,
    streams: Arc<Mutex<HashSet<String>>>,
}

impl fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connect options may hold credentials: never printed.
        f.debug_struct("NatsTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

fn transport_error(what: &str, e: impl fmt::Display, retryable: bool) -> Error {
    Error::Transport {
        transport: TRANSPORT,
        reason: format!("{what}: {e}"),
        retryable,
    }
}

enum Credentials {
    UserPassword(String, String),
    Token(String),
}

/// `nats://user:pw@host:4222` -> (`nats://host:4222`, user and password);
/// `nats://token@host` -> (`nats://host`, the token).
fn split_credentials(url: &str) -> (String, Option<Credentials>) {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return (url.to_owned(), None);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None);
    };
    let userinfo = &rest[..at];
    let address = format!("{}{}", &url[..scheme_end], &rest[at + 1..]);
    let credentials = match userinfo.split_once(':') {
        Some((user, password)) => Credentials::UserPassword(user.to_owned(), password.to_owned()),
        None => Credentials::Token(userinfo.to_owned()),
    };
    (address, Some(credentials))
}

/// `orders.v2` -> `ORDERS_V2`.
fn stream_token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Topic names keep their dots (they become subject levels), lose wildcards and spaces.
fn subject_token_keep_dots(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '*' || c == '>' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// A subject token: no dots, wildcards or spaces.
fn subject_token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '.' || c == '*' || c == '>' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

impl NatsTransport {
    /// Connects to `url` (`nats://host:4222`, credentials in the URL if any).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, NatsOptions::default()).await
    }

    /// Connects with options.
    ///
    /// Credentials in the URL are taken out and handed to the client
    /// separately: the client logs the server address it dials, and a
    /// password must never reach a log.
    pub async fn connect_with(url: &str, options: NatsOptions) -> Result<Self> {
        let (address, credentials) = split_credentials(url);
        let connect = match credentials {
            Some(Credentials::UserPassword(user, password)) => {
                async_nats::ConnectOptions::with_user_and_password(user, password)
            }
            Some(Credentials::Token(token)) => async_nats::ConnectOptions::with_token(token),
            None => async_nats::ConnectOptions::new(),
        };
        let client = connect
            .connect(address.as_str())
            .await
            .map_err(|e| transport_error(&format!("connecting to NATS at {address}"), e, true))?;
        Ok(Self::new(client, options))
    }

    /// A transport on an existing client.
    pub fn new(client: async_nats::Client, options: NatsOptions) -> Self {
        let js = jetstream::new(client.clone());
        NatsTransport {
            client,
            js,
            options,
            streams: Arc::default(),
        }
    }

    /// The stream that holds `topic`.
    pub fn stream_name(&self, topic: &str) -> String {
        format!(
            "{}_{}",
            stream_token(&self.options.stream_prefix),
            stream_token(topic)
        )
    }

    /// The subject prefix of `topic`: `<prefix>.<topic>`.
    fn subject(&self, topic: &str) -> String {
        format!(
            "{}.{}",
            subject_token(&self.options.stream_prefix),
            subject_token_keep_dots(topic)
        )
    }

    /// Streams this transport created or checked, by name.
    pub fn streams(&self) -> Vec<String> {
        self.streams
            .lock()
            .expect("streams lock")
            .iter()
            .cloned()
            .collect()
    }

    /// Deletes the stream of `topic` with its messages and consumers.
    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        self.delete_stream(&self.stream_name(topic)).await
    }

    /// Deletes a stream by name, with its messages and consumers.
    pub async fn delete_stream(&self, name: &str) -> Result<()> {
        self.streams.lock().expect("streams lock").remove(name);
        self.js
            .delete_stream(name)
            .await
            .map_err(|e| transport_error("deleting a stream", e, true))?;
        Ok(())
    }

    async fn stream(&self, topic: &str) -> Result<stream::Stream> {
        let name = self.stream_name(topic);
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{}.>", self.subject(topic))],
                storage: stream::StorageType::File,
                duplicate_window: self.options.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| transport_error(&format!("creating stream {name}"), e, true))?;
        self.streams.lock().expect("streams lock").insert(name);
        Ok(stream)
    }

    async fn ensure_stream(&self, topic: &str) -> Result<()> {
        if !self
            .streams
            .lock()
            .expect("streams lock")
            .contains(&self.stream_name(topic))
        {
            self.stream(topic).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Publisher for NatsTransport {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        // Send the whole batch, then wait for every PubAck: one round trip
        // per batch rather than per message, in order on one connection.
        let mut acks = Vec::with_capacity(batch.len());
        for m in batch {
            self.ensure_stream(&m.topic).await?;
            let (attributes, payload) = cloudevents::to_binary(&m.envelope);
            let mut headers = HeaderMap::new();
            for (k, v) in attributes {
                headers.insert(k.as_str(), v.as_str());
            }
            // A redrive must not be dropped as a duplicate of the first publish.
            let msg_id = match m.envelope.headers.get(tidings_core::REDRIVE_HEADER) {
                Some(n) => format!("{}/redrive/{n}", m.envelope.id),
                None => m.envelope.id.to_string(),
            };
            headers.insert("Nats-Msg-Id", msg_id.as_str());
            let partition = Partition::of(&m.envelope.aggregate_key, self.options.partitions);
            let subject = format!(
                "{}.{}.{}",
                self.subject(&m.topic),
                partition.index,
                subject_token(&m.envelope.message_type)
            );
            let ack = self
                .js
                .publish_with_headers(subject, headers, payload.into())
                .await
                .map_err(|e| transport_error("publishing", e, true))?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await
                .map_err(|e| transport_error("waiting for a PubAck", e, true))?;
        }
        Ok(())
    }
}

struct NatsAcker(jetstream::message::Acker);

#[async_trait]
impl Acker for NatsAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        let kind = match kind {
            AckKind::Ack => jetstream::AckKind::Ack,
            AckKind::Nak(delay) => jetstream::AckKind::Nak(delay),
            AckKind::Progress => jetstream::AckKind::Progress,
            AckKind::Term => jetstream::AckKind::Term,
        };
        self.0
            .ack_with(kind)
            .await
            .map_err(|e| transport_error("acknowledging", e, true))
    }
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
    fn partitions(&self, _topic: &str) -> u32 {
        self.options.partitions
    }

    /// Pending (not yet delivered) plus delivered and unacknowledged, over
    /// the group's durable consumers; creates nothing.
    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        let Ok(stream) = self.js.get_stream(self.stream_name(topic)).await else {
            return Ok(None);
        };
        let mut total = None;
        for partition in Partition::all(self.options.partitions) {
            if let Ok(info) = stream.consumer_info(durable_name(group, partition)).await {
                *total.get_or_insert(0) += info.num_pending + info.num_ack_pending as u64;
            }
        }
        Ok(total)
    }

    /// Creates the stream and the group's durable consumers, reading nothing.
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        for partition in Partition::all(self.options.partitions) {
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
                .map_err(|e| transport_error("reading consumer info", e, true))?;
            if info.num_waiting == 0 || waited.elapsed() > PULL_EXPIRES * 2 {
                break info.clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut takeover = Takeover::new(&info, self.options.ack_wait * 4);
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
                            tracing::warn!(%group, %topic, error = %e, retry_in_ms = delay.as_millis() as u64, "NATS pull failed; retrying");
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
                        _ = sleep_until(give_up), if give_up.is_some() => {
                            let mut t = takeover.take().expect("a takeover in progress");
                            tracing::warn!(%group, %topic, missing = t.outstanding - t.seen_old.len(), "messages an earlier reader left unacknowledged did not come back; going on without them");
                            for m in t.release() {
                                if tx.send(Ok(delivery(&topic, m))).await.is_err() {
                                    return;
                                }
                            }
                            continue;
                        }
                    };
                    match next {
                        Some(Ok(m)) => {
                            failures = 0;
                            let ready = match takeover.as_mut() {
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
                                if tx.send(Ok(delivery(&topic, m))).await.is_err() {
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
                    .map_err(|e| transport_error("flushing acknowledgements", e, true))
            }),
        )
    }
}

impl NatsTransport {
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
            .map_err(|e| transport_error("pulling messages", e, true))
    }

    /// Creates (or finds) the durable consumer of the group's partition.
    async fn durable(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<consumer::PullConsumer> {
        let stream = self.stream(topic).await?;
        let durable = durable_name(group, partition);
        let filter_subject = if partition.is_whole() {
            format!("{}.>", self.subject(topic))
        } else {
            format!("{}.{}.>", self.subject(topic), partition.index)
        };
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                &durable,
                consumer::pull::Config {
                    durable_name: Some(durable.clone()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    deliver_policy: consumer::DeliverPolicy::All,
                    ack_wait: self.options.ack_wait,
                    max_ack_pending: self.options.max_ack_pending,
                    max_deliver: -1,
                    filter_subject,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| transport_error(&format!("creating consumer {durable}"), e, true))?;
        Ok(consumer)
    }
}

/// The durable consumer of `group` reading `partition`.
fn durable_name(group: &str, partition: Partition) -> String {
    if partition.is_whole() {
        stream_token(group)
    } else {
        format!(
            "{}-{}-OF-{}",
            stream_token(group),
            partition.index,
            partition.count
        )
    }
}

/// A partition taken over from a reader that left messages unacknowledged
/// (it crashed, or handed over with a pull in flight). JetStream redelivers
/// those only once their ack wait runs out, and meanwhile hands out newer
/// messages: delivering those at once would put a key's later message before
/// its earlier one. So newer messages are held back until as many old ones
/// as were unacknowledged came back (or, if some never do, for a while).
struct Takeover {
    /// Unacknowledged when the reader started.
    outstanding: usize,
    /// The last stream sequence delivered before: anything up to it is old.
    last_delivered: u64,
    seen_old: HashSet<u64>,
    held: Vec<jetstream::Message>,
    give_up_at: tokio::time::Instant,
}

impl Takeover {
    fn new(info: &consumer::Info, patience: Duration) -> Option<Self> {
        (info.num_ack_pending > 0).then(|| {
            tracing::info!(
                consumer = %info.name,
                unacknowledged = info.num_ack_pending,
                "an earlier reader left messages unacknowledged; holding newer ones back until they return"
            );
            Takeover {
                outstanding: info.num_ack_pending,
                last_delivered: info.delivered.stream_sequence,
                seen_old: HashSet::new(),
                held: Vec::new(),
                give_up_at: tokio::time::Instant::now() + patience,
            }
        })
    }

    /// Takes a message in; once every old one is in, returns all held, in
    /// stream order (old ones come back in whatever order their ack waits
    /// ran out, so they are held and sorted too).
    fn admit(&mut self, m: jetstream::Message) -> Vec<jetstream::Message> {
        let seq = stream_sequence(&m);
        if seq <= self.last_delivered && !self.seen_old.insert(seq) {
            // Redelivered again while held: the copy in hand will do.
            return Vec::new();
        }
        self.held.push(m);
        if self.complete() {
            self.release()
        } else {
            Vec::new()
        }
    }

    /// Everything held, in stream order.
    fn release(&mut self) -> Vec<jetstream::Message> {
        let mut ready = std::mem::take(&mut self.held);
        ready.sort_by_key(stream_sequence);
        ready
    }

    fn complete(&self) -> bool {
        self.seen_old.len() >= self.outstanding
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn stream_sequence(m: &jetstream::Message) -> u64 {
    m.info().map(|i| i.stream_sequence).unwrap_or(0)
}

fn delivery(topic: &str, m: jetstream::Message) -> Delivery {
    let delivery_count = m.info().map(|i| i.delivered as u32).unwrap_or(0);
    let (message, acker) = m.split();
    let headers = headers_of(message.headers.as_ref());
    let key = headers.get("ce-subject").cloned();
    let raw = RawMessage {
        topic: topic.to_owned(),
        key,
        headers,
        body: message.payload.to_vec(),
    };
    Delivery::new(raw, delivery_count, NatsAcker(acker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_taken_out_of_the_url() {
        let (address, c) = split_credentials("nats://me:pw@127.0.0.1:4222");
        assert_eq!(address, "nats://127.0.0.1:4222");
        assert!(matches!(c, Some(Credentials::UserPassword(u, p)) if u == "me" && p == "pw"));
        let (address, c) = split_credentials("tls://tok@nats.example:4222");
        assert_eq!(address, "tls://nats.example:4222");
        assert!(matches!(c, Some(Credentials::Token(t)) if t == "tok"));
        let (address, c) = split_credentials("nats://127.0.0.1:4222");
        assert_eq!(address, "nats://127.0.0.1:4222");
        assert!(c.is_none());
    }

    #[test]
    fn names_are_safe_for_jetstream() {
        assert_eq!(stream_token("checkout.commands"), "CHECKOUT_COMMANDS");
        assert_eq!(stream_token("a b*c>d"), "A_B_C_D");
        assert_eq!(subject_token("Order.Placed v2"), "Order_Placed_v2");
    }
}
