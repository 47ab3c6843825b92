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
//!
//! # Another team's exchange
//!
//! A topic another team's producer writes on an exchange of its own is
//! read by its real name ([`RabbitOptions::foreign`]): each consumer group
//! gets its queue `tidings.<topic>.<group>` (with its dead-letter exchange
//! and delay queues, as above), bound to that exchange with the binding key
//! given (`#`, `payment.*`, or a direct exchange's key). Tidings checks
//! that the exchange exists and never declares or deletes it. Such a topic
//! has one partition. The producer may write CloudEvents in either mode or
//! plain JSON (read with `Consumer::json_topic`).
//!
//! [`Publisher`]: tidings_core::Publisher
//! [`Subscriber`]: tidings_core::Subscriber
//! [`Partition::of`]: tidings_core::Partition::of
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod acker;
mod admin;
mod connection;
mod marshal;
mod options;
mod publisher;
mod subscriber;
mod topology;

pub use connection::RabbitTransport;
pub use marshal::raw_message;

/// How this transport's URLs begin: where a URL is opened by its scheme, these choose it.
pub const SCHEMES: &[&str] = &["amqp://", "amqps://"];
pub use options::{DEFAULT_MAX_MESSAGE_BYTES, ForeignExchange, RabbitOptions};

const TRANSPORT: &str = "rabbitmq";
