//! The tuning of a consumer: [`ConsumerConfig`] and its options.

use std::time::Duration;

use tidings_core::Backoff;

#[cfg(doc)]
use super::Consumer;

/// Tuning of a [`Consumer`].
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct ConsumerConfig {
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(super) max_attempts: u32,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(super) max_crashes: u32,
    pub(super) backoff: Backoff,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(super) handler_timeout: Duration,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::poll_interval")
    )]
    pub(super) progress_every: Duration,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(super) lanes: usize,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(super) lane_capacity: usize,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(super) batch: usize,
    pub(super) source: Option<String>,
    #[cfg_attr(feature = "serde", serde(deserialize_with = "tidings_core::clamp::lease_ttl"))]
    pub(super) lease_ttl: Duration,
    pub(super) member: Option<String>,
    pub(super) on_dead_letter: OnDeadLetter,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::poll_interval")
    )]
    pub(super) replay_poll: Duration,
}

/// What happens to a key's later messages when one of its messages is dead-lettered.
///
/// Deserialized from `"hold_key"` or `"continue"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum OnDeadLetter {
    /// The key is held: its later messages are parked, unhandled, until the
    /// dead letter is redriven and handled, or skipped
    /// ([`tidings_core::FailureStore::skip`]); then they are handled in the
    /// order they came. The key's order holds even around a failure.
    ///
    /// Not on a topic whose messages another partitioner placed
    /// ([`Subscriber::places_keys`](tidings_core::Subscriber::places_keys)
    /// is false: another team's Kafka topic of several partitions), where a
    /// held key could not be found again: there a dead letter holds
    /// nothing, as with [`OnDeadLetter::Continue`].
    #[default]
    HoldKey,
    /// The key's later messages are handled as if nothing happened: for
    /// consumers whose messages do not depend on each other.
    Continue,
}

impl Default for ConsumerConfig {
    /// 5 attempts, at most 10 deliveries, backoff from 100 ms to 10 s, a
    /// 30 s handler timeout, the transport told every 2 s that a message
    /// is still at work, 16 key lanes of 32 queued messages each, one
    /// message per transaction, partition leases of 10 s, keys held after a
    /// dead letter, replays looked for every second.
    fn default() -> Self {
        ConsumerConfig {
            max_attempts: 5,
            max_crashes: 10,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            handler_timeout: Duration::from_secs(30),
            progress_every: Duration::from_secs(2),
            lanes: 16,
            lane_capacity: 32,
            batch: 1,
            source: None,
            lease_ttl: Duration::from_secs(10),
            member: None,
            on_dead_letter: OnDeadLetter::HoldKey,
            replay_poll: Duration::from_secs(1),
        }
    }
}

impl ConsumerConfig {
    /// Attempts before a transiently failing message is dead-lettered (at least 1).
    ///
    /// ```
    /// let c = tidings_consumer::ConsumerConfig::default().max_attempts(3);
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Handlings of one message that may crash before it is dead-lettered
    /// unhandled (at least 1). Retries happen in process, so a handling
    /// that never ended killed its member (or froze it past the broker's
    /// deadline). Without this bound such a message would be redelivered,
    /// and crash a consumer, forever.
    ///
    /// The count is kept in the store, from the transport's first
    /// redelivery of the message on: a redelivery that never reached a
    /// handler (its member was frozen or gone before) does not count, and
    /// nothing a message carries can raise it. The handler runs at most
    /// `n + 1` times (the first delivery is not counted, to keep the store
    /// out of the common path). On the database log and Kafka, whose
    /// re-reads after a restart carry no delivery count, only redeliveries
    /// within a process are counted.
    ///
    /// ```
    /// let c = tidings_consumer::ConsumerConfig::default().max_crashes(3);
    /// ```
    pub fn max_crashes(mut self, n: u32) -> Self {
        self.max_crashes = n.max(1);
        self
    }

    /// Backoff between attempts.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// Time allowed for one attempt; past it the attempt is rolled back and counts as a transient failure.
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.handler_timeout = d;
        self
    }

    /// How often the transport is told that a message is still at work
    /// (`AckKind::Progress`) while its handler runs or waits to retry it:
    /// a JetStream ack wait then does not run out under a slow handler, and
    /// the message is not sent again, to this member or another, while it
    /// is handled. Keep it well under the transport's deadline (NATS's
    /// `ack_wait`). Transports without such a deadline ignore it.
    pub fn progress_every(mut self, d: Duration) -> Self {
        self.progress_every = d.max(Duration::from_millis(10));
        self
    }

    /// Messages handled at once: one per lane. A lane holds a key while it
    /// handles it, so one key is handled in order while other keys run in
    /// parallel, on any free lane.
    pub fn lanes(mut self, n: usize) -> Self {
        self.lanes = n.max(1);
        self
    }

    /// Messages queued per lane before reading pauses (backpressure): the
    /// queue holds `lanes × lane_capacity` messages, of any keys.
    pub fn lane_capacity(mut self, n: usize) -> Self {
        self.lane_capacity = n.max(1);
        self
    }

    /// Messages a lane may handle in one transaction (default 1: a
    /// transaction per message). A lane takes what is already queued, of
    /// the waiting keys no other lane holds, up to `n`, and never waits for more, so batching adds no latency:
    /// it saves commits (an fsync each) when messages come faster than a
    /// transaction per message can take them.
    ///
    /// A batch's processed markers, fence check and handlers share one
    /// transaction, and its messages are acknowledged once it commits. If
    /// one of its handlers fails, the whole batch rolls back and its
    /// messages are handled again one at a time, each in its own
    /// transaction, with the usual retries and dead letters: a handler may
    /// then run twice for a message before its work commits once, as after
    /// any rolled-back attempt. Messages of a held key, undecodable ones
    /// and ones delivered too often always go one at a time.
    ///
    /// ```
    /// let c = tidings_consumer::ConsumerConfig::default().batch(64);
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long a member's partition leases last without renewal (renewed
    /// three times as often). A member that dies is replaced after about
    /// this long; a shorter lease fails over faster and writes more often.
    pub fn lease_ttl(mut self, d: Duration) -> Self {
        self.lease_ttl = d.max(Duration::from_millis(300));
        self
    }

    /// This member's id in its group (default: unique per process and run).
    /// Two running members must never share one.
    pub fn member(mut self, id: impl Into<String>) -> Self {
        self.member = Some(id.into());
        self
    }

    /// What happens to a key's later messages after a dead letter (default: [`OnDeadLetter::HoldKey`]).
    ///
    /// ```
    /// use tidings_consumer::{ConsumerConfig, OnDeadLetter};
    /// let independent = ConsumerConfig::default().on_dead_letter(OnDeadLetter::Continue);
    /// ```
    pub fn on_dead_letter(mut self, policy: OnDeadLetter) -> Self {
        self.on_dead_letter = policy;
        self
    }

    /// How often a running member looks for replays asked of its consumer
    /// (`tidings replay`, [`tidings_core::ReplayStore::request_replay`]).
    pub fn replay_poll(mut self, every: Duration) -> Self {
        self.replay_poll = every.max(Duration::from_millis(10));
        self
    }

    /// The `source` of messages the handler emits (default: the consumer's name).
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }
}
