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
//! | envelope | CloudEvents binary mode of the Kafka binding: `ce_*` record headers, `content-type`, the payload as the value, the key as the record key (and `ce_partitionkey`); structured mode with [`KafkaOptions::content_mode`]. Records of Tidings 0.1 (`ce-*`) still read |
//! | consumer group `email` | consumer group `email`: its committed offsets are the group's position |
//! | partition `p` of the group | partition `p`, assigned to the member holding the group's lease on it |
//! | a dead-lettered message | a copy in `orders.dlq` (same key and partition), then settled |
//! | topic `payments` declared [`KafkaOptions::foreign`]`("payments", "billing.payments.v1")` | another team's topic `billing.payments.v1`, read with the partitions it has on the broker, never created; dead letters in `payments.tidings.dlq` |
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
//! A topic of Tidings' own that exists already (created with other
//! settings, or by someone else) must have the partitions the transport is
//! configured for: a consumer checks it before reading
//! ([`Subscriber::check_partitions`]) and refuses to start, naming both
//! counts, rather than read some partitions and never the others; a relay
//! keeps its records and says why at each try, rather than write to
//! partitions that do not exist. Another team's topic, declared with
//! [`KafkaOptions::foreign`], has its partitions discovered instead: every
//! one is leased and read. Either way the count is taken when a consumer
//! starts: partitions added to a topic while it runs are seen at its next
//! start. Records another
//! team's client placed by its own partitioner are read all the same, in
//! order per partition. A key held after a dead letter
//! (`OnDeadLetter::HoldKey`) is found by Tidings' own partitioning, so on
//! another team's topic of several partitions
//! ([`Subscriber::places_keys`](tidings_core::Subscriber::places_keys) is
//! false) a dead letter holds no key: the key's later messages go on.
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
//! # Deleting topics
//!
//! Stop every consumer of a topic before deleting it: over Tansu, a
//! librdkafka consumer still fetching from a deleted topic crashes its
//! process (Tansu answers with a leader hint that has no topic id, which
//! librdkafka 2.12 looks up by a null topic name).
//! [`KafkaTransport::delete_topic`] waits for this process's subscriptions
//! of the topic to be closed or dropped first.
//!
//! ```no_run
//! # async fn run() -> tidings_core::Result<()> {
//! use tidings_broker_kafka::KafkaTransport;
//! let kafka = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
//! // `kafka` is both the relay's publisher and the consumers' subscriber.
//! # Ok(()) }
//! ```
//!
//! [`Publisher`]: tidings_core::Publisher
//! [`Subscriber`]: tidings_core::Subscriber
//! [`Partition::of`]: tidings_core::Partition::of
//! [`Subscriber::pending`]: tidings_core::Subscriber::pending
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod acker;
mod admin;
mod connection;
mod marshal;
mod options;
mod partitions;
mod publisher;
mod reading;
mod rewind;
mod subscriber;
mod topology;
mod window;

pub use connection::KafkaTransport;

/// How this transport's URLs begin: where a URL is opened by its scheme, these choose it.
pub const SCHEMES: &[&str] = &["kafka://"];
pub use options::KafkaOptions;
pub use rewind::{Rewind, RewoundPartition};

const TRANSPORT: &str = "kafka";
/// How long a call to the cluster's metadata or group coordinator may take.
const ADMIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
