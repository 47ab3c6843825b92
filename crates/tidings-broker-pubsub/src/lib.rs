//! Google Cloud Pub/Sub for Tidings: a [`Publisher`] that returns only
//! once Pub/Sub confirmed every message, and a [`Subscriber`] with a
//! subscription per consumer group and partition, ordered by the
//! aggregate key.
//!
//! # Topology Tidings declares
//!
//! | Tidings | Pub/Sub |
//! |---|---|
//! | topic `orders` (one partition) | topic `tidings-orders` |
//! | partition `p` of `n` of topic `orders` | topic `tidings-orders-<p>-of-<n>`: the key's partition ([`Partition::of`]) chooses the topic |
//! | message with key `o-1` | ordering key `o-1` (a key longer than Pub/Sub takes, hashed); no ordering key for a message without a key |
//! | consumer group `email` | a subscription per partition topic, `tidings-orders-email` (`-<p>-of-<n>`), message ordering on, a dead-letter policy to topic `tidings-orders-email-dead` after [`PubSubOptions::max_delivery_attempts`] attempts; a subscription of the same name on that topic keeps what reaches it |
//! | a member holding a message | its ack deadline extended every third of [`PubSubOptions::ack_deadline`] until it is settled (up to [`PubSubOptions::max_lease`]); a member that dies lets go one ack deadline later, one that closes its subscription a second later |
//! | `Nak(delay)` | `modifyAckDeadline` to the delay (whole seconds, rounded up; at most 600 s): its ordering key waits behind it |
//! | `Nak(None)` | handed back: its ack deadline set to 1 s (the emulator sends a message handed back with a deadline of 0 after its key's later ones; one whose deadline runs out, before them) |
//! | `Term` | a copy published to the group's dead-letter topic, confirmed, then the message acknowledged (Tidings' failure store holds it with its error history) |
//! | envelope | the CloudEvents Pub/Sub binding: binary mode (`ce-` attributes, the payload as data) where the attributes keep within Pub/Sub's limits (100 attributes, values up to 1024 bytes), else structured mode |
//!
//! Pub/Sub hands out an ordering key's messages in order, one batch at a
//! time, and after one is handed back, that one and the key's later ones
//! again. Every group
//! gets every message through its own subscription; within a group, the
//! consumer runtime leases each partition's subscription to one member.
//! Pub/Sub does not filter messages on the emulator, so partitions are
//! topics, not filters.
//!
//! A subscription only receives what is published after it was made, and
//! Pub/Sub keeps a message published to a topic without subscriptions for
//! no one: the publisher checks that a topic has a subscription before
//! its first publish and fails (retryably: the relay keeps the message in
//! the outbox) until one does. Subscribe every consumer group once (or
//! [`Subscriber::ensure_group`]) before the relay starts on a new topic.
//!
//! Each partition count has topics of its own, so every publisher and
//! group of a topic must use one count: a group does not start, and a
//! publisher keeps its messages in the outbox (retryably), while the
//! project has topics of the same Tidings topic for another count (found
//! by listing the project's topics: grant `pubsub.topics.list`, without
//! which this is warned about and not checked).
//!
//! Publishing sends a batch's messages for each topic in `Publish`
//! requests of up to 1000 messages, each confirmed before the next leaves:
//! Pub/Sub keeps a key's order within a request and between requests sent
//! one after another, and a refused request is never followed by a later
//! one of its topic. A message larger than 10 MB, data and attributes
//! together, is refused before it is sent
//! ([`PubSubOptions::max_message_bytes`]).
//!
//! Members pull (unary `Pull`): on the emulator, which mishandles a pull
//! cancelled while it waits, each pull returns at once and an empty one is
//! followed by a pause growing to a second; elsewhere a pull waits up to
//! 5 s for messages. A subscription's acknowledgements and deadline
//! changes go out together: while one request is on its way, the
//! settlements that come meanwhile wait and leave in the next (up to 1000
//! ack ids each), and each delivery's settlement returns once Pub/Sub
//! answered its request.
//!
//! On Google Cloud, Pub/Sub's service account needs to publish to the
//! dead-letter topics and to subscribe to the groups' subscriptions for
//! the dead-letter policy to move messages; Tidings' own failure store
//! does not depend on it.
//!
//! # Shown so far
//!
//! Against the emulator: the transport conformance suite, a broker outage
//! (a private emulator frozen while producers commit, with hand-overs
//! between two members: nothing lost, once, in order), a hand-back that
//! keeps a key's order, the checkout demo, and the fault suite's scenario
//! (relay and consumer processes killed and frozen, the emulator frozen,
//! two poisoned outbox records).
//!
//! The emulator keeps a backlog, with a thread of its own, for each
//! ordering key of each subscription, and looks through all of them on
//! every pull: its cost grows with the keys it has seen, where Pub/Sub's
//! does not. Runs against it keep to hundreds of orders, not thousands.
//!
//! # Where the service is
//!
//! `pubsub://PROJECT` reaches Google's endpoint with Application Default
//! Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's login, the
//! instance's service account). `PUBSUB_EMULATOR_HOST=127.0.0.1:8085`, as
//! Google's client libraries read it, or `?endpoint=http://127.0.0.1:8085`
//! reach the emulator, without credentials.
//!
//! [`Publisher`]: tidings_core::Publisher
//! [`Subscriber`]: tidings_core::Subscriber
//! [`Subscriber::ensure_group`]: tidings_core::Subscriber::ensure_group
//! [`Partition::of`]: tidings_core::Partition::of
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod acker;
mod admin;
mod connection;
mod marshal;
mod names;
mod options;
mod partitions;
mod publisher;
mod settlements;
mod subscriber;

pub use connection::PubSubTransport;
pub use marshal::raw_message;
pub use options::{DEFAULT_MAX_MESSAGE_BYTES, PubSubOptions};

/// How this transport's URLs begin: where a URL is opened by its scheme, these choose it.
pub const SCHEMES: &[&str] = &["pubsub://"];

const TRANSPORT: &str = "pubsub";
