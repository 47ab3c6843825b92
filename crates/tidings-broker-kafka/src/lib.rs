//! Kafka for Tidings (Apache Kafka, Redpanda, Tansu: anything speaking the
//! Kafka protocol): a [`Publisher`] that returns only once every message's
//! delivery report came back from an idempotent `acks=all` producer, and a
//! [`Subscriber`] that commits a group's offsets by hand, never past an
//! event that is not finished.
//!
//! # Topology
//!
//! | Tidings | Kafka |
//! |---|---|
//! | topic `orders` | topic `orders`, [`KafkaOptions::partitions`] partitions (created when first used) |
//! | message with key `o-1` | record with key `o-1`, in partition [`Partition::of`]`("o-1")`: a key stays on one partition, in order |
//! | envelope | CloudEvents binary mode: `ce-*` record headers, the payload as the value |
//! | consumer group `email` | consumer group `email`: its committed offsets are the group's position |
//! | partition `p` of the group | partition `p`, assigned to the member holding the group's lease on it |
//! | a dead-lettered message | a copy in `orders.dlq` (same key and partition), then settled |
//!
//! # Who reads which partition
//!
//! Tidings' consumer runtime leases each partition of a group to one
//! member through the database (fenced, like every other transport), and
//! the member reads it with a manual assignment. Kafka's own group
//! rebalancing is not used: a hand-over is the lease moving, and the
//! member losing it finishes or abandons its in-flight work before the new
//! one starts from the committed offset. Offsets are still committed to the
//! Kafka group, so Kafka's tools show its position and lag.
//!
//! # Offsets
//!
//! Within a partition the runtime handles different keys at once (its
//! lanes), one key at a time in order, so messages finish out of order.
//! The subscriber commits the offset of the lowest message not yet settled
//! (every message below it is done), every [`KafkaOptions::commit_interval`]
//! and when the subscription closes: a crash re-delivers at most what was
//! in flight, which the idempotent consumers absorb, and never skips one.
//! At most [`KafkaOptions::max_in_flight`] messages of a partition are
//! unsettled at once; reading waits beyond that, so one slow key holds
//! back its partition's commits, not its memory.
//!
//! [`Subscriber::pending`] is the distance from the group's committed
//! offsets to the partitions' high watermarks. Tansu reports a high
//! watermark as its last batch's base offset + 1, so there it undercounts
//! when the producer batches several records (Kafka and Redpanda count
//! records).
//!
//! # Settling
//!
//! `Ack` settles. `Nak(delay)` re-delivers the message from memory after
//! the delay, without stalling the partition (its offset stays uncommitted
//! until it is settled, so a crash meanwhile re-delivers it from Kafka).
//! `Term` (the runtime dead-lettered it) copies the record to the
//! partition's dead-letter topic, then settles. `Progress` does nothing:
//! Kafka has no delivery deadline.
//!
//! ```no_run
//! # async fn run() -> tidings_core::Result<()> {
//! use tidings_broker_kafka::KafkaTransport;
//! let kafka = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
//! // `kafka` is both the relay's publisher and the consumers' subscriber.
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tidings_core::{
    AckKind, Acker, Delivery, Error, Headers, OutgoingMessage, Partition, Publisher, RawMessage, Result,
    Subscriber, Subscription, cloudevents,
};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

const TRANSPORT: &str = "kafka";
/// How long a call to the cluster's metadata or group coordinator may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of a [`KafkaTransport`].
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    prefix: String,
    partitions: u32,
    replication: i32,
    dead_letter_suffix: String,
    max_in_flight: usize,
    commit_interval: Duration,
    client: Vec<(String, String)>,
}

impl Default for KafkaOptions {
    /// One partition per topic, replication factor 1 (set 3 on a real
    /// cluster), dead letters in `<topic>.dlq`, at most 1000 unsettled
    /// messages per partition, offsets committed every 200 ms.
    fn default() -> Self {
        KafkaOptions {
            prefix: String::new(),
            partitions: 1,
            replication: 1,
            dead_letter_suffix: ".dlq".to_owned(),
            max_in_flight: 1000,
            commit_interval: Duration::from_millis(200),
            client: Vec::new(),
        }
    }
}

impl KafkaOptions {
    /// Starts every Kafka topic and consumer group id this transport uses
    /// (`shop.` makes topic `orders` Kafka's `shop.orders`, group `email`
    /// `shop.email`), so that systems sharing a cluster stay apart.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Partitions of the topics this transport creates, and the count every
    /// publisher and subscriber of a topic must agree on.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// Replication factor of the topics this transport creates.
    pub fn replication(mut self, n: i32) -> Self {
        self.replication = n.max(1);
        self
    }

    /// The dead-letter topic's name is the topic's plus this suffix.
    pub fn dead_letter_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.dead_letter_suffix = suffix.into();
        self
    }

    /// Unsettled messages per partition before reading waits.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// How often a subscription commits the offset it has reached.
    pub fn commit_interval(mut self, every: Duration) -> Self {
        self.commit_interval = every;
        self
    }

    /// Any other librdkafka setting, for producers and consumers alike
    /// (`security.protocol`, `sasl.mechanisms`, ...).
    pub fn client_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.client.push((key.into(), value.into()));
        self
    }
}

/// A Kafka cluster, as a Tidings transport. Cheap to clone.
#[derive(Clone)]
pub struct KafkaTransport {
    inner: Arc<Inner>,
}

struct Inner {
    brokers: String,
    options: KafkaOptions,
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    topics: Mutex<HashSet<String>>,
}

impl fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("brokers", &self.inner.brokers)
            .field("options", &self.inner.options)
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

/// `kafka://host:port[,host:port]` (or a bare list) as `bootstrap.servers`.
fn bootstrap_servers(url: &str) -> String {
    url.strip_prefix("kafka://")
        .unwrap_or(url)
        .trim_end_matches('/')
        .to_owned()
}

impl KafkaTransport {
    /// Connects to the cluster at `url` (`kafka://host:port`, several
    /// brokers separated by commas) with default options.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, KafkaOptions::default()).await
    }

    /// Connects to the cluster at `url` and checks it answers.
    pub async fn connect_with(url: &str, options: KafkaOptions) -> Result<Self> {
        let brokers = bootstrap_servers(url);
        let mut config = client_config(&brokers, &options);
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("message.timeout.ms", "30000");
        let producer: FutureProducer = config
            .create()
            .map_err(|e| transport_error("creating the producer", e, false))?;
        let admin: AdminClient<DefaultClientContext> = client_config(&brokers, &options)
            .create()
            .map_err(|e| transport_error("creating the admin client", e, false))?;
        let transport = KafkaTransport {
            inner: Arc::new(Inner {
                brokers,
                options,
                producer,
                admin,
                topics: Mutex::new(HashSet::new()),
            }),
        };
        let producer = transport.inner.producer.clone();
        tokio::task::spawn_blocking(move || {
            use rdkafka::producer::Producer as _;
            producer.client().fetch_metadata(None, ADMIN_TIMEOUT)
        })
        .await
        .map_err(|e| transport_error("reading the cluster's metadata", e, true))?
        .map_err(|e| transport_error(&format!("reaching Kafka at {}", transport.inner.brokers), e, true))?;
        Ok(transport)
    }

    /// The Kafka topic of a Tidings topic: the prefix, then the topic.
    pub fn kafka_topic(&self, topic: &str) -> String {
        format!("{}{topic}", self.inner.options.prefix)
    }

    /// The Kafka consumer group id of a Tidings consumer group.
    pub fn group_id(&self, group: &str) -> String {
        format!("{}{group}", self.inner.options.prefix)
    }

    /// The Kafka dead-letter topic of a Tidings topic.
    pub fn dead_letter_topic(&self, topic: &str) -> String {
        format!(
            "{}{}",
            self.kafka_topic(topic),
            self.inner.options.dead_letter_suffix
        )
    }

    /// Creates the Kafka topic `topic` with the configured partitions if it
    /// does not exist.
    async fn ensure_topic(&self, topic: &str) -> Result<()> {
        if self.inner.topics.lock().expect("topics lock").contains(topic) {
            return Ok(());
        }
        let options = &self.inner.options;
        let new = NewTopic::new(
            topic,
            options.partitions as i32,
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
            .map_err(|e| transport_error(&format!("creating topic {topic}"), e, true))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(transport_error(&format!("creating topic {name}"), code, true));
                }
            }
        }
        self.inner
            .topics
            .lock()
            .expect("topics lock")
            .insert(topic.to_owned());
        Ok(())
    }

    /// The Kafka topics this transport created or found, dead-letter topics included.
    pub fn topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self
            .inner
            .topics
            .lock()
            .expect("topics lock")
            .iter()
            .cloned()
            .collect();
        topics.sort();
        topics
    }

    /// Deletes the Kafka topic of `topic` and its dead-letter topic (tests
    /// and benches clean up with it).
    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        let dead = self.dead_letter_topic(topic);
        let topic = &self.kafka_topic(topic);
        self.inner
            .admin
            .delete_topics(
                &[topic, dead.as_str()],
                &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
            )
            .await
            .map_err(|e| transport_error(&format!("deleting topic {topic}"), e, true))?;
        let mut topics = self.inner.topics.lock().expect("topics lock");
        topics.remove(topic);
        topics.remove(&dead);
        Ok(())
    }

    /// The offsets `group` has committed on each partition of `topic`
    /// (`None` where it has none): where a member taking the partition
    /// starts reading.
    pub async fn committed(&self, group: &str, topic: &str) -> Result<Vec<Option<i64>>> {
        let consumer = self.group_client(group)?;
        let (topic, partitions) = (self.kafka_topic(topic), self.inner.options.partitions);
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
        .map_err(|e| transport_error("reading committed offsets", e, true))?
    }

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
            return Err(transport_error(
                "rewinding",
                "the time is in the future: a rewind goes back",
                false,
            ));
        }
        let millis = since
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| transport_error("reading the rewind time", e, false))?
            .as_millis() as i64;
        let consumer = self.group_client(group)?;
        let (topic, partitions) = (self.kafka_topic(topic), self.inner.options.partitions);
        tokio::task::spawn_blocking(move || {
            let committed = committed_offsets(&consumer, &topic, partitions)?;
            let mut wanted = TopicPartitionList::new();
            for p in 0..partitions as i32 {
                wanted
                    .add_partition_offset(&topic, p, Offset::Offset(millis))
                    .map_err(|e| transport_error("building an offsets-for-times request", e, false))?;
            }
            let found = consumer
                .offsets_for_times(wanted, ADMIN_TIMEOUT)
                .map_err(|e| transport_error("looking up offsets for the rewind time", e, true))?;
            let mut rewind = Rewind::default();
            let mut commit = TopicPartitionList::new();
            for element in found.elements() {
                let partition = element.partition();
                let (_, high) = consumer
                    .fetch_watermarks(&topic, partition, ADMIN_TIMEOUT)
                    .map_err(|e| transport_error("reading watermarks", e, true))?;
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
                    .map_err(|e| transport_error("building an offset commit", e, false))?;
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
                    .map_err(|e| transport_error("committing the rewound offsets", e, true))?;
            }
            Ok(rewind)
        })
        .await
        .map_err(|e| transport_error("rewinding a group", e, true))?
    }

    /// Every record in `topic`'s dead-letter topic, partition by partition
    /// (the dead-letter API of the failure store lists the same messages,
    /// with their error history).
    pub async fn dead_letter_records(&self, topic: &str) -> Result<Vec<RawMessage>> {
        let dead = self.dead_letter_topic(topic);
        self.ensure_topic(&dead).await?;
        let mut config = client_config(&self.inner.brokers, &self.inner.options);
        config
            .set("group.id", format!("{dead}.reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        let consumer: BaseConsumer = config
            .create()
            .map_err(|e| transport_error("creating a consumer", e, false))?;
        let (partitions, tidings_topic) = (self.inner.options.partitions, topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let mut assignment = TopicPartitionList::new();
            let mut remaining = BTreeMap::new();
            for p in 0..partitions as i32 {
                let (low, high) = consumer
                    .fetch_watermarks(&dead, p, ADMIN_TIMEOUT)
                    .map_err(|e| transport_error("reading watermarks", e, true))?;
                if high > low {
                    remaining.insert(p, high);
                }
                assignment
                    .add_partition_offset(&dead, p, Offset::Beginning)
                    .map_err(|e| transport_error("assigning a partition", e, false))?;
            }
            consumer
                .assign(&assignment)
                .map_err(|e| transport_error("assigning the dead-letter topic", e, true))?;
            let deadline = std::time::Instant::now() + ADMIN_TIMEOUT;
            let mut records = Vec::new();
            while !remaining.is_empty() && std::time::Instant::now() < deadline {
                let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
                    continue;
                };
                let m = polled.map_err(|e| transport_error("reading the dead-letter topic", e, true))?;
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
        .map_err(|e| transport_error("reading the dead-letter topic", e, true))?
    }

    /// A client of `group` for reading and committing its offsets.
    fn group_client(&self, group: &str) -> Result<BaseConsumer> {
        self.consumer_config(group)
            .create()
            .map_err(|e| transport_error("creating a consumer", e, false))
    }

    fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = client_config(&self.inner.brokers, &self.inner.options);
        config
            .set("group.id", self.group_id(group))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "100");
        config
    }
}

/// The group's committed offsets on every partition of `topic` (invalid
/// where it has none).
fn committed_offsets(consumer: &BaseConsumer, topic: &str, partitions: u32) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition(topic, p);
    }
    consumer
        .committed_offsets(tpl, ADMIN_TIMEOUT)
        .map_err(|e| transport_error("reading committed offsets", e, true))
}

fn client_config(brokers: &str, options: &KafkaOptions) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (k, v) in &options.client {
        config.set(k, v);
    }
    config
}

fn record_headers(headers: &[(String, String)]) -> OwnedHeaders {
    headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k.as_str(),
            value: Some(v.as_bytes()),
        })
    })
}

#[async_trait]
impl Publisher for KafkaTransport {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        // Queue the whole batch, then wait for every delivery report: the
        // idempotent producer keeps each partition's order across its own
        // retries, and a failed report fails the batch (the relay publishes
        // it again; consumers deduplicate on the envelope id).
        let mut reports = Vec::with_capacity(batch.len());
        for m in batch {
            let name = self.kafka_topic(&m.topic);
            self.ensure_topic(&name).await?;
            let (attributes, payload) = cloudevents::to_binary(&m.envelope);
            let key = &m.envelope.aggregate_key;
            let partition = Partition::of(key, self.inner.options.partitions);
            let mut record = FutureRecord::to(&name)
                .key(key.as_bytes())
                .payload(&payload)
                .partition(partition.index as i32)
                .headers(record_headers(&attributes));
            loop {
                match self.inner.producer.send_result(record) {
                    Ok(report) => {
                        reports.push(report);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(transport_error("queueing a record", e, true)),
                }
            }
        }
        for report in reports {
            report
                .await
                .map_err(|e| transport_error("waiting for a delivery report", e, true))?
                .map_err(|(e, _)| transport_error("delivering a record", e, true))?;
        }
        Ok(())
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

/// The messages of one partition a subscription has delivered and not yet
/// settled, and the offset every message below is settled to.
#[derive(Debug, Default)]
struct Window {
    /// Offset -> settled, for every delivered message not yet committed past.
    open: BTreeMap<i64, bool>,
    /// The offset to commit: every message below it is settled.
    floor: Option<i64>,
    /// The offset last committed.
    committed: Option<i64>,
}

impl Window {
    fn delivered(&mut self, offset: i64) {
        self.open.entry(offset).or_insert(false);
        if self.floor.is_none() {
            self.floor = Some(offset);
        }
    }

    fn settle(&mut self, offset: i64) {
        if let Some(done) = self.open.get_mut(&offset) {
            *done = true;
        }
        while let Some(entry) = self.open.first_entry() {
            if !*entry.get() {
                self.floor = Some(*entry.key());
                return;
            }
            let offset = *entry.key();
            entry.remove();
            self.floor = Some(offset + 1);
        }
    }

    /// The offset to commit, if it moved since the last commit.
    fn to_commit(&self) -> Option<i64> {
        self.floor.filter(|f| Some(*f) != self.committed)
    }
}

/// What a subscription's deliveries share.
struct Shared {
    window: Mutex<Window>,
    settled: Notify,
    /// The Tidings topic.
    topic: String,
    /// Its Kafka topic.
    kafka_topic: String,
    partition: i32,
}

impl Shared {
    fn settle(&self, offset: i64) {
        self.window.lock().expect("window lock").settle(offset);
        self.settled.notify_one();
    }
}

type Redelivery = (RawMessage, i64, u32);

struct KafkaAcker {
    shared: Arc<Shared>,
    offset: i64,
    message: RawMessage,
    delivery_count: u32,
    redeliver: mpsc::UnboundedSender<Redelivery>,
    transport: KafkaTransport,
}

#[async_trait]
impl Acker for KafkaAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        match kind {
            AckKind::Ack => self.shared.settle(self.offset),
            AckKind::Progress => {}
            AckKind::Nak(delay) => {
                let again = (self.message.clone(), self.offset, self.delivery_count.max(1) + 1);
                let redeliver = self.redeliver.clone();
                let delay = delay.unwrap_or_default();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    // A closed subscription drops it: the uncommitted
                    // offset brings it back from Kafka.
                    let _ = redeliver.send(again);
                });
            }
            AckKind::Term => {
                self.dead_letter().await?;
                self.shared.settle(self.offset);
            }
        }
        Ok(())
    }
}

impl KafkaAcker {
    /// Copies the record to the dead-letter topic, same key and partition.
    async fn dead_letter(&self) -> Result<()> {
        let topic = self.transport.dead_letter_topic(&self.shared.topic);
        self.transport.ensure_topic(&topic).await?;
        let mut headers: Vec<(String, String)> = self
            .message
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        headers.push((
            "tidings-dead-letter-of".to_owned(),
            format!(
                "{}/{}/{}",
                self.shared.kafka_topic, self.shared.partition, self.offset
            ),
        ));
        let mut record = FutureRecord::to(&topic)
            .payload(&self.message.body)
            .partition(self.shared.partition)
            .headers(record_headers(&headers));
        if let Some(key) = &self.message.key {
            record = record.key(key.as_bytes());
        }
        self.transport
            .inner
            .producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| transport_error("copying a dead letter to its topic", e, true))?;
        Ok(())
    }
}

fn raw_message(topic: &str, m: &BorrowedMessage<'_>) -> RawMessage {
    let mut headers = Headers::new();
    if let Some(h) = m.headers() {
        for header in h.iter() {
            if let Some(value) = header.value {
                headers.insert(header.key.to_owned(), String::from_utf8_lossy(value).into_owned());
            }
        }
    }
    RawMessage {
        topic: topic.to_owned(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        headers,
        body: m.payload().unwrap_or_default().to_vec(),
    }
}

/// Commits `offset` for the subscription's partition.
fn commit(consumer: &StreamConsumer, shared: &Shared, offset: i64, mode: CommitMode) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&shared.kafka_topic, shared.partition, Offset::Offset(offset))
        .map_err(|e| transport_error("building an offset commit", e, false))?;
    consumer
        .commit(&tpl, mode)
        .map_err(|e| transport_error("committing an offset", e, true))?;
    shared.window.lock().expect("window lock").committed = Some(offset);
    Ok(())
}

#[async_trait]
impl Subscriber for KafkaTransport {
    fn partitions(&self, _topic: &str) -> u32 {
        self.inner.options.partitions
    }

    /// Creates the topic, and commits the earliest retained offset of each
    /// partition the group has no offset for: the group then exists for
    /// Kafka's tools and [`Subscriber::pending`], and keeps everything
    /// published from now on.
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        let topic = self.kafka_topic(topic);
        self.ensure_topic(&topic).await?;
        let consumer = self.group_client(group)?;
        let partitions = self.inner.options.partitions;
        tokio::task::spawn_blocking(move || {
            let committed = committed_offsets(&consumer, &topic, partitions)?;
            let mut start = TopicPartitionList::new();
            for element in committed.elements() {
                if !matches!(element.offset(), Offset::Offset(_)) {
                    let (low, _) = consumer
                        .fetch_watermarks(&topic, element.partition(), ADMIN_TIMEOUT)
                        .map_err(|e| transport_error("reading watermarks", e, true))?;
                    start
                        .add_partition_offset(&topic, element.partition(), Offset::Offset(low))
                        .map_err(|e| transport_error("building an offset commit", e, false))?;
                }
            }
            if start.count() > 0 {
                consumer
                    .commit(&start, CommitMode::Sync)
                    .map_err(|e| transport_error("committing the group's starting offsets", e, true))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| transport_error("ensuring a group", e, true))?
    }

    /// Records behind the group's committed offsets (from the earliest
    /// retained where a partition has none), over every partition; `None`
    /// when the group has committed nothing on the topic.
    async fn pending(&self, group: &str, topic: &str) -> Result<Option<u64>> {
        let consumer = self.group_client(group)?;
        let (topic, partitions) = (self.kafka_topic(topic), self.inner.options.partitions);
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
                    .map_err(|e| transport_error("reading watermarks", e, true))?;
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
        .map_err(|e| transport_error("reading the group's lag", e, true))?
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        let kafka_topic = self.kafka_topic(topic);
        self.ensure_topic(&kafka_topic).await?;
        let consumer: StreamConsumer = self
            .consumer_config(group)
            .create()
            .map_err(|e| transport_error("creating a consumer", e, false))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&kafka_topic, partition.index as i32, Offset::Stored)
            .map_err(|e| transport_error("assigning a partition", e, false))?;
        consumer
            .assign(&tpl)
            .map_err(|e| transport_error("assigning a partition", e, true))?;
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
                                tracing::warn!(topic = %shared.topic, partition = shared.partition, error = %e, "Kafka offset commit failed; retrying");
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
                    .map_err(|e| transport_error("committing the final offset", e, true))?,
                    None => Ok(()),
                }
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_lowest_unsettled_offset() {
        let mut w = Window::default();
        for o in 10..15 {
            w.delivered(o);
        }
        assert_eq!(
            w.to_commit(),
            Some(10),
            "nothing settled: commit where reading started"
        );
        w.settle(12);
        w.settle(11);
        assert_eq!(w.to_commit(), Some(10), "10 is still in flight");
        w.settle(10);
        assert_eq!(w.to_commit(), Some(13), "10 to 12 done, 13 is next");
        w.committed = Some(13);
        assert_eq!(w.to_commit(), None, "already committed");
        w.settle(14);
        assert_eq!(w.to_commit(), None, "13 still holds the floor, already committed");
        w.settle(13);
        assert_eq!(w.to_commit(), Some(15));
        assert!(w.open.is_empty());
    }

    #[test]
    fn urls_become_bootstrap_servers() {
        assert_eq!(bootstrap_servers("kafka://127.0.0.1:9092"), "127.0.0.1:9092");
        assert_eq!(bootstrap_servers("kafka://a:9092,b:9092/"), "a:9092,b:9092");
        assert_eq!(bootstrap_servers("a:9092"), "a:9092");
    }
}
