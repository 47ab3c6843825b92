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
//! # Another team's subject
//!
//! A topic another team's producer writes on subjects of its own is read
//! by its real name ([`NatsOptions::foreign`], `payments.>`): each consumer
//! group gets the durable consumer `TIDINGS_<TOPIC>_<GROUP>_<hash>`, filtered on
//! that subject, on the stream that holds it (the producer's), reading it
//! from its start. Where no stream holds the subject (the producer
//! publishes plain NATS), Tidings creates `TIDINGS_<TOPIC>` to capture it,
//! from then on. Such a topic has one partition. The producer may write
//! CloudEvents in either mode or plain JSON (read with
//! `Consumer::json_topic`).
//!
//! Topics have one partition unless [`NatsOptions::partitions`] says more;
//! publishers and subscribers of a topic must agree on the count. The
//! consumer runtime leases each partition to one member of the group, so
//! the members share the work and a key stays with one of them.
//!
//! A member that starts reading a partition whose durable consumer still
//! has unacknowledged messages (its previous reader crashed, or handed over
//! with a pull in flight) would get them back only after their
//! [`NatsOptions::ack_wait`], behind newer messages of their keys. So it
//! reads the partition again from its first unacknowledged message: the
//! durable consumer is made anew, starting after its ack floor, and
//! everything since comes in stream order; what was handled already is
//! taken out by the consumers' processed markers. JetStream numbers every
//! delivery, so a reader also sees when one went to someone else (a member
//! frozen past its lease that woke up and pulled once more before it learnt
//! the lease moved on, a pull request abandoned on a reconnect) or when a
//! restarted server came back with an older state of the consumer: it
//! reads the partition again the same way before handing anything newer on.
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
//!
//! [`Publisher`]: tidings_core::Publisher
//! [`Subscriber`]: tidings_core::Subscriber
//! [`Partition::of`]: tidings_core::Partition::of
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod acker;
mod admin;
mod connection;
mod options;
mod publisher;
mod subscriber;
mod topology;

pub use connection::NatsTransport;
pub use subscriber::raw_message;

/// How this transport's URLs begin: where a URL is opened by its scheme, these choose it.
pub const SCHEMES: &[&str] = &["nats://", "tls://"];
pub use options::NatsOptions;

const TRANSPORT: &str = "nats";
