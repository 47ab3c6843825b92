//! Amazon SNS and SQS for Tidings: a [`Publisher`] that returns only once
//! SNS confirmed every message, and a [`Subscriber`] with a FIFO queue per
//! consumer group and partition, fanned out from the topic.
//!
//! # Topology Tidings declares
//!
//! | Tidings | SNS and SQS |
//! |---|---|
//! | topic `orders` | FIFO SNS topic `tidings-orders.fifo` (content-based deduplication off) |
//! | message with key `o-1` | message group id `o-1` (a key SQS cannot take, hashed), deduplication id = envelope id, message attribute `tidings-partition` = the key's partition ([`Partition::of`]) where the topic has several |
//! | consumer group `email` on `orders` (one partition) | FIFO SQS queue `tidings-orders-email.fifo`, subscribed to the topic with raw message delivery, a redrive policy to `tidings-orders-email-dead.fifo` after [`SqsOptions::max_receive_count`] receives |
//! | partition `p` of `n` of group `email` | FIFO queue `tidings-orders-email-<p>-of-<n>.fifo`, its subscription filtered on `tidings-partition` = `p`; one dead-letter queue for the group |
//! | a member holding a message | the message hidden (its visibility timeout renewed every third of [`SqsOptions::visibility_timeout`]) for as long as the member holds it; a member that dies lets go of it one timeout later, and one that closes its subscription at once |
//! | a group that needs no order ([`SqsOptions::unordered`]) | standard queues, the same names without `.fifo` (SNS FIFO topics deliver to standard queues too): a key's messages in any order, now and then one twice, none held behind another |
//! | `Nak(delay)` | the message's visibility timeout set to the delay (whole seconds, rounded up; at most 12 h): its message group waits behind it, so its key stays in order |
//! | `Nak(None)` | visibility timeout 0 |
//! | `Term` | a copy sent to the group's dead-letter queue, then the message deleted (Tidings' failure store holds it with its error history) |
//! | envelope | CloudEvents structured mode: the event as one JSON document in the body (`content-type: application/cloudevents+json`); `ce-id`, `ce-type`, `ce-source`, `ce-subject` and `ce-partitionkey` repeated as message attributes for filter policies. CloudEvents has no SNS or SQS binding, and a Tidings event has more attributes than the ten message attributes SNS delivers to SQS |
//!
//! SQS hands out a message group's messages one batch at a time: while a
//! member holds a key's message, no member receives that key's next one.
//! Every group gets every message through its own queue; within a group,
//! the consumer runtime leases each partition's queue to one member.
//!
//! A queue only receives what is published after it subscribed. SNS
//! accepts and drops a message no queue subscribes to, so the publisher
//! checks that a topic has a subscription before its first publish and
//! fails (retryably: the relay keeps the message in the outbox) until
//! one does. Subscribe every consumer group once (or
//! [`Subscriber::ensure_group`]) before the relay starts on a new topic.
//!
//! The topic carries the partition count its messages are spread over,
//! as its tag `tidings-partitions`, set by the first publisher or group
//! to find it missing. A transport configured for another count is
//! refused, naming both: a consumer does not start
//! ([`Subscriber::check_partitions`]), a publisher keeps its messages in
//! the outbox (a retryable error). Its credentials need
//! `sns:ListTagsForResource` and `sns:TagResource` for this; without
//! them Tidings warns and checks nothing.
//!
//! Messages are published in batches of ten, a key's next message only
//! once SNS confirmed the one before; SNS drops a message it has seen
//! within five minutes (the relay sending a batch again after a failure).
//! A message larger than 256 KiB, body and attributes counted together,
//! is refused before it is sent ([`SqsOptions::max_message_bytes`]).
//!
//! Members receive with long polling (up to
//! [`SqsOptions::receive_wait`]) while they hold nothing; while they hold
//! messages, and always on a plain `http://` endpoint (moto, LocalStack),
//! receives return at once, and one that brought nothing is followed by a
//! pause growing to a second, cut short when a message held is settled.
//! A FIFO receive that failed on the way back is asked again under the
//! same `ReceiveRequestAttemptId`: SQS hands back what it had taken,
//! instead of hiding those messages, and their keys, for a visibility
//! timeout.
//! A message held for 12 hours, the longest SQS hides one, is let go with
//! a warning: SQS delivers it again.
//!
//! The test suite runs against moto's server with three corrections to
//! its FIFO queues (`scripts/lib/moto_fifo.py`, installed by the test
//! command): moto can deliver a message group's second expired message
//! before its first, lets a message whose visibility timeout ran out be
//! hidden again without marking its group in flight, and lets two
//! receives at once split a message group. Each breaks the order of a
//! key, which SQS keeps. The same file spares moto two costs that grow
//! with the messages a queue holds, each paid per message received.
//!
//! # Where the services are
//!
//! `sqs://` takes everything from the standard AWS configuration: the
//! region (`AWS_REGION`), credentials (`AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY`, a profile, an instance role) and, for moto or
//! LocalStack, the endpoint (`AWS_ENDPOINT_URL`). `sqs://eu-west-1` names
//! the region, `sqs://?endpoint=http://127.0.0.1:5000` the endpoint.
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
mod publisher;
mod subscriber;
mod topology;

pub use connection::SqsTransport;
pub use marshal::raw_message;
pub use options::{DEFAULT_MAX_MESSAGE_BYTES, SqsOptions};

/// How this transport's URLs begin: where a URL is opened by its scheme, these choose it.
pub const SCHEMES: &[&str] = &["sqs://"];

const TRANSPORT: &str = "sqs";
